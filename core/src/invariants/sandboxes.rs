//! The sandboxes table: a sandbox's calls, its way down and what it awaits, its uploads
//! (`sandbox-index`, `bound-calls`, `shutdown-once`, `uploads`).
//!
//! What a sandbox awaits, its hook point, its suspension and its one Shutdown live in its
//! state's variants (`sandbox.rs`), so their agreement with the state is not checked here: it
//! cannot be written otherwise.

use super::{Seen, Violation};
use crate::call::CallState;
use crate::key::Own;
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxState};

impl Lifecycle {
    /// Sandboxes: the calls each lists, the state it may be in for them, the one Shutdown, what it
    /// awaits, and that one accepting no uploads has none in flight.
    pub(super) fn check_sandboxes(&self, seen: &mut Seen) -> Result<(), Violation> {
        ensure!(
            self.sandboxes.index_agrees(),
            "sandbox-index",
            "the sandbox id index and the sandbox records disagree"
        );
        for (ix, sandbox) in self.sandboxes.iter() {
            let id = &sandbox.id;
            let state = sandbox.state();
            // With the calls' side above: the sandbox lists exactly the calls bound to it.
            for call in sandbox.bound.iter() {
                ensure!(
                    self.calls.get(*call).and_then(|c| c.sandbox()) == Some(ix),
                    "bound-calls",
                    "sandbox {id} lists {call:?}, which is not bound to it"
                );
            }
            if !sandbox.bound.is_empty() {
                ensure!(
                    matches!(
                        state,
                        SandboxState::Starting | SandboxState::Running | SandboxState::Dead
                    ),
                    "bound-calls",
                    "sandbox {id} has calls in state {state:?}"
                );
            }
            for call in sandbox.bound.iter() {
                let call_state = &self.calls[*call].state;
                let call = &self.calls[*call].id;
                let fits = match state {
                    SandboxState::Starting => matches!(call_state, CallState::Starting(_)),
                    SandboxState::Running => matches!(call_state, CallState::Ready(_)),
                    _ => true,
                };
                ensure!(
                    fits,
                    "bound-calls",
                    "call {call} is {call_state:?} on {id} which is {state:?}"
                );
            }
            // Transitions leave no sandbox starting or stopping with nothing awaited, and only a
            // managed sandbox is shut down.
            ensure!(
                sandbox.awaits_agree(),
                "shutdown-once",
                "sandbox {id} ({}) in {state:?} awaits {:?}",
                if sandbox.is_managed() {
                    "managed"
                } else {
                    "external"
                },
                sandbox.awaiting()
            );
            if sandbox.awaiting() == Awaiting::Record {
                // Held for its key's record: no timer of its own, its key owned here, and it is
                // the key's starting sandbox or its persisted one.
                let held = sandbox.deadline.is_none()
                    && self.keys.get(sandbox.key).is_some_and(|slot| {
                        matches!(slot.own, Own::Owned(_))
                            && match state {
                                SandboxState::Persisted => slot.retiring == Some(ix),
                                SandboxState::Starting => slot.current == Some(ix),
                                _ => false,
                            }
                    });
                ensure!(
                    held,
                    "shutdown-once",
                    "sandbox {id} in {state:?} awaits its key's record out of place"
                );
            }
            if sandbox.deadline.is_some() {
                seen.timers += 1;
            }
            if !sandbox.accepts_uploads() {
                ensure!(
                    sandbox.uploads.is_empty() && sandbox.targeting.is_empty() && sandbox.busy_sessions == 0,
                    "uploads",
                    "sandbox {id} in {state:?} has {} uploads in flight and {} sessions targeting it",
                    sandbox.uploads.len(),
                    sandbox.targeting.len()
                );
            }
            for upload in sandbox.uploads.iter() {
                let up = self.uploads.get(*upload);
                ensure!(
                    up.is_some_and(|u| u.sandbox == ix),
                    "uploads",
                    "sandbox {id} lists upload {upload:?} which is not in flight into it"
                );
            }
        }
        Ok(())
    }
}
