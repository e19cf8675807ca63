//! The mirror: where and when a session's versions are written.
//!
//! | check | what must hold |
//! |---|---|
//! | `upload-routing` | an Upload for session S goes into a sandbox a call of S was ready on (checked once the input's events are in: a `CallReady` may follow the Upload it caused) |
//! | `mirror-independent` | a version flushed while its path is free (no upload in flight, no version waiting for a retry) and its session has a call ready on an up sandbox is ordered uploaded in the same input: no session waits on another (R13) |
//! | `release-drains-mirror` | the release of a call ready on an up sandbox never drops its session's versions as `no-sandbox` (R5) |
//! | `mirror-settled-true` | `MirrorSettled` for a session comes only when none of its versions is unsettled |
//!
//! What the caller knows and this checker does not: whether a path has an upload in flight
//! ([`UploadChecker`](crate::UploadChecker)), whether a session has a call ready on an up sandbox
//! ([`CallChecker`](crate::CallChecker) and the lanes), and which versions are unsettled
//! ([`Versions`](crate::Versions)); it hands them in.

use rustc_hash::{FxHashMap, FxHashSet};
use sandkeeper::{Command, DropReason, PathName, SandboxId, SessionId, Settlement, UploadId};

use crate::versions::Versions;
use crate::violation::Violation;

/// The mirror checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct MirrorChecker {
    /// Per session, the sandboxes a call of it was ready on.
    ready_on: FxHashMap<SessionId, Vec<SandboxId>>,
    /// Paths whose version waits for a retry after a transient failure.
    retry_waiting: FxHashSet<(SessionId, PathName)>,
    /// A version whose upload failed transiently in this input.
    failing: Option<(SessionId, PathName, u64)>,
    /// A flush that must be uploaded in this input.
    expect_upload: Option<(SessionId, PathName, u64)>,
    /// Uploads of this input, checked for routing once its events are in.
    routing: Vec<(UploadId, SessionId, SandboxId)>,
    /// A session whose ready call on an up sandbox is released in this input.
    releasing: Option<SessionId>,
}

impl MirrorChecker {
    /// An empty checker.
    pub fn new() -> Self {
        MirrorChecker::default()
    }

    /// Whether `session`'s `path` waits for a retry (a transient failure left its version).
    pub fn retry_waiting(&self, session: &SessionId, path: &PathName) -> bool {
        !self.retry_waiting.is_empty()
            && self
                .retry_waiting
                .contains(&(session.clone(), path.clone()))
    }

    /// A flush returned `version`; `in_flight`: an upload of the path is awaited; `up`: whether
    /// the session has a call ready on an up sandbox (asked only when the path is free).
    pub fn flushed(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        in_flight: bool,
        up: impl FnOnce() -> bool,
    ) {
        if !in_flight && !self.retry_waiting(session, path) && up() {
            self.expect_upload = Some((session.clone(), path.clone(), version));
        }
    }

    /// An upload of `version` is answered with a transient failure (before the core sees it).
    pub fn upload_failed(&mut self, session: SessionId, path: PathName, version: u64) {
        self.failing = Some((session, path, version));
    }

    /// A call of `session`, ready on a sandbox the core was not told is dead, is released.
    pub fn released_up(&mut self, session: &SessionId) {
        self.releasing = Some(session.clone());
    }

    /// A call of `session` became ready on `x`.
    pub fn ready(&mut self, session: &SessionId, x: SandboxId) {
        let on = self.ready_on.entry(session.clone()).or_default();
        if !on.contains(&x) {
            on.push(x);
        }
    }

    /// One command.
    pub fn command(&mut self, cmd: &Command) {
        if let Command::Upload {
            upload,
            sandbox,
            session,
            path,
            ..
        } = cmd
        {
            if self
                .expect_upload
                .as_ref()
                .is_some_and(|(s, p, _)| s == session && p == path)
            {
                self.expect_upload = None;
            }
            self.routing.push((*upload, session.clone(), *sandbox));
            if !self.retry_waiting.is_empty() {
                self.retry_waiting.remove(&(session.clone(), path.clone()));
            }
        }
    }

    /// A version settled with `outcome`.
    pub fn settled(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        outcome: &Settlement,
    ) -> Result<(), Violation> {
        let Settlement::Dropped { reason } = outcome else {
            return Ok(());
        };
        if !self.retry_waiting.is_empty() {
            self.retry_waiting.remove(&(session.clone(), path.clone()));
        }
        if *reason == DropReason::NoSandbox && self.releasing.as_ref() == Some(session) {
            return Err(Violation::new(
                "release-drains-mirror",
                format!("{session}/{path} v{version} dropped (no-sandbox) by the release of a call whose sandbox is up"),
            ));
        }
        Ok(())
    }

    /// `MirrorSettled { session }`.
    pub fn mirror_settled(
        &self,
        session: &SessionId,
        versions: &Versions,
    ) -> Result<(), Violation> {
        match versions.first_unsettled_of(session) {
            None => Ok(()),
            Some((path, n)) => Err(Violation::new(
                "mirror-settled-true",
                format!("MirrorSettled for {session} with {n} unsettled versions of {path}"),
            )),
        }
    }

    /// The input's outputs are all in.
    pub fn input_done(&mut self, versions: &Versions) -> Result<(), Violation> {
        self.releasing = None;
        let unsettled = |s: &SessionId, p: &PathName, v: u64| {
            versions.get(s, p).is_some_and(|pv| pv.is_unsettled(v))
        };
        if let Some((session, path, version)) = self.failing.take() {
            if unsettled(&session, &path, version) {
                self.retry_waiting.insert((session, path));
            }
        }
        let mut broken = None;
        if let Some((session, path, version)) = self.expect_upload.take() {
            if unsettled(&session, &path, version) {
                broken = Some(Violation::new(
                    "mirror-independent",
                    format!("{session}/{path} v{version} was flushed with its path free and an up sandbox, yet not uploaded at once"),
                ));
            }
        }
        // Read, then cleared (an empty `drain` still costs its set-up, and this runs every input).
        for (upload, session, x) in &self.routing {
            let routed = self.ready_on.get(session).is_some_and(|v| v.contains(x));
            if !routed && broken.is_none() {
                broken = Some(Violation::new(
                    "upload-routing",
                    format!("Upload {upload} of session {session} into {x}, where no call of {session} was ever ready"),
                ));
            }
        }
        self.routing.clear();
        broken.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{check, names, upload};

    #[test]
    fn uploads_go_where_a_call_of_the_session_was_ready() {
        let mut m = MirrorChecker::new();
        let v = Versions::new();
        let (s, _) = names();
        m.command(&upload(1, 1, 7));
        m.ready(&s, SandboxId(7));
        assert_eq!(check(m.input_done(&v)), "ok", "CallReady after its Upload");
        m.command(&upload(2, 2, 8));
        assert_eq!(check(m.input_done(&v)), "upload-routing");
    }

    #[test]
    fn a_free_path_with_an_up_sandbox_is_uploaded_at_once() {
        let mut m = MirrorChecker::new();
        let mut v = Versions::new();
        let (s, p) = names();
        v.flushed(&s, &p, 1).unwrap();
        m.ready(&s, SandboxId(7));
        m.flushed(&s, &p, 1, false, || true);
        assert_eq!(check(m.input_done(&v)), "mirror-independent");
        m.flushed(&s, &p, 1, false, || true);
        m.command(&upload(1, 1, 7));
        assert_eq!(check(m.input_done(&v)), "ok");
        // A transient failure leaves the version waiting for its retry: the path is not free.
        m.upload_failed(s.clone(), p.clone(), 1);
        assert_eq!(check(m.input_done(&v)), "ok");
        assert!(m.retry_waiting(&s, &p));
        v.flushed(&s, &p, 2).unwrap();
        m.flushed(&s, &p, 2, false, || true);
        assert_eq!(check(m.input_done(&v)), "ok", "waits for the retry");
        m.command(&upload(2, 2, 7));
        assert!(!m.retry_waiting(&s, &p));
        m.flushed(&s, &p, 2, true, || true);
        assert_eq!(check(m.input_done(&v)), "ok", "in flight");
        m.flushed(&s, &p, 2, false, || false);
        assert_eq!(check(m.input_done(&v)), "ok", "no up sandbox");
    }

    #[test]
    fn a_release_on_an_up_sandbox_drains_and_settled_means_settled() {
        let mut m = MirrorChecker::new();
        let mut v = Versions::new();
        let (s, p) = names();
        let dropped = Settlement::Dropped {
            reason: DropReason::NoSandbox,
        };
        m.released_up(&s);
        assert_eq!(
            check(m.settled(&s, &p, 1, &dropped)),
            "release-drains-mirror"
        );
        m.input_done(&v).unwrap();
        assert_eq!(check(m.settled(&s, &p, 1, &dropped)), "ok", "a later input");
        v.flushed(&s, &p, 1).unwrap();
        assert_eq!(check(m.mirror_settled(&s, &v)), "mirror-settled-true");
        v.settled(&s, &p, 1, &dropped).unwrap();
        assert_eq!(check(m.mirror_settled(&s, &v)), "ok");
    }
}
