//! Uploads in flight: at most one per path, none into a sandbox being stopped, and an
//! `Uploaded` settlement only for the upload just acknowledged.
//!
//! | check | what must hold |
//! |---|---|
//! | `one-upload-per-path` | per (session, path), at most one upload is awaited at a time |
//! | `no-upload-after-stop` | no Stop and no Shutdown of a sandbox while an upload into it is awaited (the core cancels them first) |
//! | `uploaded-is-acknowledged` | a version settles `Uploaded { into }` only in the input that acknowledged that very upload (same session, path, version and sandbox) |
//!
//! An upload is awaited from its Upload command until the core is handed its answer (fed with
//! [`Uploads::answered`] before the core sees it), its CancelUpload, or `Closed`.

use rustc_hash::FxHashMap;
use sandkeeper::{Command, PathName, SandboxId, SessionId, Settlement, UploadId};

use crate::violation::Violation;

/// One upload attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flight {
    /// Whose file.
    pub session: SessionId,
    /// Which file.
    pub path: PathName,
    /// Which version.
    pub version: u64,
    /// Into which sandbox.
    pub sandbox: SandboxId,
}

/// The upload checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Uploads {
    /// Awaited uploads.
    awaited: FxHashMap<UploadId, Flight>,
    /// Per path, its awaited upload.
    paths: FxHashMap<(SessionId, PathName), UploadId>,
    /// Per sandbox, how many uploads into it are awaited.
    sandboxes: FxHashMap<SandboxId, u32>,
    /// The upload whose ok is the current input.
    acked: Option<Flight>,
}

impl Uploads {
    /// An empty checker.
    pub fn new() -> Self {
        Uploads::default()
    }

    /// One command.
    pub fn command(&mut self, cmd: &Command) -> Result<(), Violation> {
        match cmd {
            Command::Upload {
                upload,
                sandbox,
                session,
                path,
                version,
                ..
            } => {
                let before = self.paths.insert((session.clone(), path.clone()), *upload);
                self.awaited.insert(
                    *upload,
                    Flight {
                        session: session.clone(),
                        path: path.clone(),
                        version: version.0,
                        sandbox: *sandbox,
                    },
                );
                *self.sandboxes.entry(*sandbox).or_default() += 1;
                match before {
                    Some(other) if other != *upload => Err(Violation::new(
                        "one-upload-per-path",
                        format!("Upload {upload} of {session}/{path} while {other} is in flight"),
                    )),
                    _ => Ok(()),
                }
            }
            Command::CancelUpload { upload, .. } => {
                self.stop_awaiting(*upload);
                Ok(())
            }
            Command::Stop { sandbox, .. } | Command::Shutdown { sandbox, .. } => {
                match self.awaited_in(*sandbox) {
                    0 => Ok(()),
                    n => Err(Violation::new(
                        "no-upload-after-stop",
                        format!("{cmd:?} with {n} uploads into {sandbox} still in flight"),
                    )),
                }
            }
            Command::Start { .. }
            | Command::Drain { .. }
            | Command::Persist { .. }
            | Command::Abandon { .. } => Ok(()),
        }
    }

    fn stop_awaiting(&mut self, upload: UploadId) -> Option<Flight> {
        let f = self.awaited.remove(&upload)?;
        let key = (f.session.clone(), f.path.clone());
        if self.paths.get(&key) == Some(&upload) {
            self.paths.remove(&key);
        }
        if let Some(n) = self.sandboxes.get_mut(&f.sandbox) {
            *n -= 1;
            if *n == 0 {
                self.sandboxes.remove(&f.sandbox);
            }
        }
        Some(f)
    }

    /// The core is about to be handed `upload`'s answer (`ok` or not). The attempt, if it was
    /// awaited; an `ok` makes it the one an `Uploaded` settlement of this input may name.
    pub fn answered(&mut self, upload: UploadId, ok: bool) -> Option<Flight> {
        self.acked = None;
        let f = self.stop_awaiting(upload)?;
        if ok {
            self.acked = Some(f.clone());
        }
        Some(f)
    }

    /// A version settled with `outcome`.
    pub fn settled(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        outcome: &Settlement,
    ) -> Result<(), Violation> {
        let Settlement::Uploaded { sandbox } = outcome else {
            return Ok(());
        };
        let acked = self.acked.take();
        let matches = acked.as_ref().is_some_and(|f| {
            &f.session == session
                && &f.path == path
                && f.version == version
                && f.sandbox == *sandbox
        });
        if matches {
            Ok(())
        } else {
            Err(Violation::new(
                "uploaded-is-acknowledged",
                format!("{session}/{path} v{version} settled uploaded into {sandbox} without that upload's ok"),
            ))
        }
    }

    /// `Closed`: nothing is awaited any more.
    pub fn closed(&mut self) {
        self.awaited.clear();
        self.paths.clear();
        self.sandboxes.clear();
    }

    /// Whether `upload` is awaited.
    pub fn is_awaited(&self, upload: UploadId) -> bool {
        self.awaited.contains_key(&upload)
    }

    /// How many uploads into `x` are awaited.
    pub fn awaited_in(&self, x: SandboxId) -> u32 {
        self.sandboxes.get(&x).copied().unwrap_or(0)
    }

    /// Whether an upload of `session`'s `path` is awaited.
    pub fn in_flight(&self, session: &SessionId, path: &PathName) -> bool {
        self.paths.contains_key(&(session.clone(), path.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkeeper::{Instant, Payload, Version};

    fn check(r: Result<(), Violation>) -> &'static str {
        r.err().map_or("ok", |v| v.check)
    }

    fn names() -> (SessionId, PathName) {
        (SessionId::new("s").unwrap(), PathName::new("log").unwrap())
    }

    fn upload(id: u64, version: u64, x: u64) -> Command {
        let (session, path) = names();
        Command::Upload {
            upload: UploadId(id),
            sandbox: SandboxId(x),
            session,
            path,
            version: Version(version),
            payload: Payload::new(&b""[..]),
            deadline: Instant::ZERO,
        }
    }

    #[test]
    fn one_upload_per_path_and_none_awaited_at_stop() {
        let mut u = Uploads::new();
        let (s, p) = names();
        assert_eq!(check(u.command(&upload(1, 1, 7))), "ok");
        assert!(u.in_flight(&s, &p));
        assert_eq!(check(u.command(&upload(2, 2, 7))), "one-upload-per-path");
        let stop = Command::Stop {
            sandbox: SandboxId(7),
            deadline: Instant::ZERO,
            suspend: false,
        };
        assert_eq!(check(u.command(&stop)), "no-upload-after-stop");
        u.command(&Command::CancelUpload {
            upload: UploadId(1),
            sandbox: SandboxId(7),
        })
        .unwrap();
        assert!(u.answered(UploadId(2), false).is_some());
        assert!(u.answered(UploadId(2), false).is_none(), "answered once");
        assert!(!u.in_flight(&s, &p));
        assert_eq!(u.awaited_in(SandboxId(7)), 0);
        assert_eq!(check(u.command(&stop)), "ok");
    }

    #[test]
    fn uploaded_names_the_upload_just_acknowledged() {
        let mut u = Uploads::new();
        let (s, p) = names();
        let into = |x| Settlement::Uploaded {
            sandbox: SandboxId(x),
        };
        u.command(&upload(1, 1, 7)).unwrap();
        assert_eq!(
            check(u.settled(&s, &p, 1, &into(7))),
            "uploaded-is-acknowledged"
        );
        u.answered(UploadId(1), true).unwrap();
        assert_eq!(
            check(u.settled(&s, &p, 1, &into(8))),
            "uploaded-is-acknowledged"
        );
        u.command(&upload(2, 2, 7)).unwrap();
        u.answered(UploadId(2), true).unwrap();
        assert_eq!(check(u.settled(&s, &p, 2, &into(7))), "ok");
        assert_eq!(
            check(u.settled(&s, &p, 2, &into(7))),
            "uploaded-is-acknowledged",
            "one ok, one settlement"
        );
        u.command(&upload(3, 3, 7)).unwrap();
        u.closed();
        assert!(!u.is_awaited(UploadId(3)));
    }
}
