//! The sessions table and the mirror: a session's calls, where its mirror goes, what keeps a
//! sandbox busy, and the uploads in flight (`session-index`, `session-calls`, `session-target`,
//! `busy-count`, `uploads`, `upload-index`, `idle-count`).

use super::{Seen, Tally, Violation};
use crate::call::CallState;
use crate::lifecycle::Lifecycle;

impl Lifecycle {
    /// Sessions and the mirror: coming and ready calls, the mirror's target, busy counts, the
    /// uploads each path has in flight and the idle count; then the uploads table itself.
    pub(super) fn check_sessions(&self, seen: &mut Seen) -> Result<(), Violation> {
        let mut idle = 0usize;
        let mut uploads_seen = 0usize;
        ensure!(
            self.sessions.index_agrees(),
            "session-index",
            "the session name index and the session records disagree"
        );
        let mut busy_by_sandbox = Tally::default();
        for (ix, s) in self.sessions.iter() {
            let id = &s.id;
            let coming = seen.coming_by_session.count(ix);
            ensure!(
                s.coming as usize == coming,
                "session-calls",
                "session {id} counts {} coming calls, {coming} are waiting or starting",
                s.coming
            );
            for call in &s.ready {
                ensure!(
                    self.calls
                        .get(*call)
                        .is_some_and(|c| c.session == ix && matches!(c.state, CallState::Ready(_))),
                    "session-calls",
                    "session {id} lists {call:?} as ready"
                );
            }
            let first_up = s
                .ready
                .iter()
                .filter_map(|c| self.calls[*c].sandbox())
                .find(|sandbox| self.sandboxes[*sandbox].accepts_uploads());
            let expected = first_up.or(s.linger.filter(|sandbox| {
                self.sandboxes
                    .get(*sandbox)
                    .is_some_and(|record| record.accepts_uploads())
            }));
            ensure!(
                s.target == expected,
                "session-target",
                "session {id} targets {:?}, expected {expected:?}",
                s.target
            );
            if let Some(t) = s.target {
                ensure!(
                    self.sandboxes[t].targeting.contains(&ix),
                    "session-target",
                    "sandbox {t:?} does not list session {id} that targets it"
                );
            }
            let busy_on = if s.is_busy() { s.target } else { None };
            ensure!(
                s.busy_on == busy_on,
                "busy-count",
                "session {id} is busy on {:?}, expected {busy_on:?}",
                s.busy_on
            );
            if let Some(b) = busy_on {
                ensure!(
                    self.sandboxes.get(b).is_some(),
                    "busy-count",
                    "session {id} is busy on untracked {b:?}"
                );
                busy_by_sandbox.add(b);
            }
            for slot in s.paths.iter() {
                if let Some(u) = slot.inflight {
                    uploads_seen += 1;
                    let up = self.uploads.get(u);
                    ensure!(
                        up.is_some_and(|up| up.session == ix && s.paths[up.slot].path == slot.path),
                        "uploads",
                        "session {id} path {} has upload {u:?} in flight that is not its own",
                        slot.path
                    );
                    let up = up.expect("checked");
                    ensure!(
                        up.version.0 <= slot.last
                            && slot.pending.as_ref().is_none_or(|(v, _)| *v > up.version),
                        "uploads",
                        "session {id} path {}: in flight {} out of order",
                        slot.path,
                        up.version
                    );
                    seen.timers += 1;
                }
                if slot.retry_at.is_some() {
                    seen.timers += 1;
                    ensure!(
                        slot.pending.is_some(),
                        "timers",
                        "session {id} path {} has a retry without a version",
                        slot.path
                    );
                }
            }
            if s.idle_stamp.is_some() {
                idle += 1;
                ensure!(
                    s.is_idle(),
                    "idle-count",
                    "session {id} counted idle while live"
                );
            }
        }
        ensure!(
            uploads_seen == self.uploads.len(),
            "uploads",
            "{} uploads in flight, {uploads_seen} referenced by sessions",
            self.uploads.len()
        );
        busy_by_sandbox.sort();
        for (ix, sandbox) in self.sandboxes.iter() {
            let id = &sandbox.id;
            let busy = busy_by_sandbox.count(ix);
            ensure!(
                sandbox.busy_sessions as usize == busy,
                "busy-count",
                "sandbox {id} counts {} busy sessions, {busy} are busy on it",
                sandbox.busy_sessions
            );
            for s in sandbox.targeting.iter() {
                ensure!(
                    self.sessions.get(*s).is_some_and(|r| r.target == Some(ix)),
                    "session-target",
                    "sandbox {id} lists session {s:?} which targets elsewhere"
                );
            }
        }
        ensure!(
            idle == self.sessions.idle.count,
            "idle-count",
            "{} sessions counted idle, {idle} are",
            self.sessions.idle.count
        );
        ensure!(
            self.uploads.index_agrees(),
            "upload-index",
            "the upload id index and the upload records disagree"
        );
        for (ix, up) in self.uploads.iter() {
            let u = &up.id;
            ensure!(
                self.sandboxes.get(up.sandbox).is_some_and(
                    |sandbox| sandbox.accepts_uploads() && sandbox.uploads.contains(&ix)
                ),
                "uploads",
                "upload {u} in flight into {:?} which does not accept uploads",
                up.sandbox
            );
        }
        Ok(())
    }
}
