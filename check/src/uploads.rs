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
//! [`UploadChecker::answered`] before the core sees it), its CancelUpload, or `Closed`.

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
///
/// The awaited uploads are a short vector: a run has a few uploads in flight at once, so a scan
/// comparing ids (and, for a path, names that compare inline) costs less than keeping maps by
/// path and by sandbox in step.
#[derive(Clone, Debug, Default)]
pub struct UploadChecker {
    /// Awaited uploads, oldest first.
    awaited: Vec<(UploadId, Flight)>,
    /// The upload whose ok is the current input.
    acked: Option<Flight>,
}

impl UploadChecker {
    /// An empty checker.
    pub fn new() -> Self {
        UploadChecker::default()
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
                let other = self
                    .awaited
                    .iter()
                    .find(|(u, f)| u != upload && &f.session == session && &f.path == path)
                    .map(|(u, _)| *u);
                self.stop_awaiting(*upload);
                self.awaited.push((
                    *upload,
                    Flight {
                        session: session.clone(),
                        path: path.clone(),
                        version: version.0,
                        sandbox: *sandbox,
                    },
                ));
                match other {
                    Some(other) => Err(Violation::new(
                        "one-upload-per-path",
                        format!("Upload {upload} of {session}/{path} while {other} is in flight"),
                    )),
                    None => Ok(()),
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
            Command::Hook { sandbox, .. } => match self.awaited_in(*sandbox) {
                0 => Ok(()),
                n => Err(Violation::new(
                    "hook-alone",
                    format!("{cmd:?} with {n} uploads into {sandbox} still in flight"),
                )),
            },
            Command::Relinquish { sandbox } => match self.awaited_in(*sandbox) {
                0 => Ok(()),
                n => Err(Violation::new(
                    "no-upload-after-stop",
                    format!("{cmd:?} with {n} uploads into {sandbox} still in flight"),
                )),
            },
            Command::Start { .. }
            | Command::Adopt { .. }
            | Command::Drain { .. }
            | Command::Persist { .. }
            | Command::Discard { .. }
            | Command::Abandon { .. } => Ok(()),
        }
    }

    fn stop_awaiting(&mut self, upload: UploadId) -> Option<Flight> {
        let i = self.awaited.iter().position(|(u, _)| *u == upload)?;
        Some(self.awaited.remove(i).1)
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
    }

    /// Whether `upload` is awaited.
    pub fn is_awaited(&self, upload: UploadId) -> bool {
        self.awaited.iter().any(|(u, _)| *u == upload)
    }

    /// How many uploads into `x` are awaited.
    pub fn awaited_in(&self, x: SandboxId) -> u32 {
        self.awaited.iter().filter(|(_, f)| f.sandbox == x).count() as u32
    }

    /// Whether an upload of `session`'s `path` is awaited.
    pub fn in_flight(&self, session: &SessionId, path: &PathName) -> bool {
        self.awaited
            .iter()
            .any(|(_, f)| &f.session == session && &f.path == path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{check, names, upload};
    use sandkeeper::Instant;

    #[test]
    fn one_upload_per_path_and_none_awaited_at_stop() {
        let mut u = UploadChecker::new();
        let (s, p) = names();
        assert_eq!(check(u.command(&upload(1, 1, 7))), "ok");
        assert!(u.in_flight(&s, &p));
        assert_eq!(check(u.command(&upload(2, 2, 7))), "one-upload-per-path");
        let stop = Command::Stop {
            sandbox: SandboxId(7),
            deadline: Instant::ZERO,
            suspend: false,
            token: None,
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
        let mut u = UploadChecker::new();
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
