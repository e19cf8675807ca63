//! The calls table: every call's state agrees with its sandbox, its key's queue and its
//! session's ready list (`call-index`, `bound-calls`, `key-counts`, `session-calls`).

use super::{Seen, Violation};
use crate::call::CallState;
use crate::lifecycle::Lifecycle;

impl Lifecycle {
    /// Calls, seen from the calls. Counts that records keep of other records (a key's bound calls, a
    /// session's coming calls) are tallied in `seen` and compared by those records' checks.
    pub(super) fn check_calls(&self, seen: &mut Seen) -> Result<(), Violation> {
        ensure!(
            self.calls.index_agrees(),
            "call-index",
            "the call name index and the call records disagree"
        );
        let mut waiting = 0usize;
        for (ix, call) in self.calls.iter() {
            let id = &call.id;
            let session = self.sessions.get(call.session);
            ensure!(
                session.is_some(),
                "session-calls",
                "call {id} has no session record"
            );
            let session = session.expect("checked");
            match call.state {
                CallState::Waiting { .. } => {
                    // Its deadline is checked against the table with the others, below.
                    waiting += 1;
                    seen.timers += 1;
                    seen.coming_by_session.add(call.session);
                    let queued = self
                        .keys
                        .get(call.key)
                        .is_some_and(|k| k.waiters.contains(&ix));
                    ensure!(queued, "key-counts", "waiting call {id} is not queued");
                }
                CallState::Starting(sandbox) | CallState::Ready(sandbox) => {
                    ensure!(
                        self.sandboxes
                            .get(sandbox)
                            .is_some_and(|record| record.bound.contains(&ix)),
                        "bound-calls",
                        "call {id} is bound to {sandbox:?}, which does not list it"
                    );
                    ensure!(
                        self.keys.get(call.key).is_some(),
                        "key-counts",
                        "call {id} is bound under an untracked key"
                    );
                    seen.bound_by_key.add(call.key);
                    if matches!(call.state, CallState::Starting(_)) {
                        seen.coming_by_session.add(call.session);
                    }
                    let ready = session.ready.contains(&ix);
                    ensure!(
                        ready == matches!(call.state, CallState::Ready(_)),
                        "session-calls",
                        "call {id} is {:?} but its session's ready list says {ready}",
                        call.state
                    );
                }
            }
        }
        seen.bound_by_key.sort();
        seen.coming_by_session.sort();
        ensure!(
            waiting == self.calls.waiting,
            "key-counts",
            "{} calls counted waiting, {waiting} are",
            self.calls.waiting
        );
        Ok(())
    }
}
