//! The sandboxes table: a sandbox's calls, its way down and what it awaits, its uploads
//! (`sandbox-index`, `bound-calls`, `shutdown-once`, `uploads`).

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
        for (ix, x) in self.sandboxes.iter() {
            let id = &x.id;
            // With the calls' side above: the sandbox lists exactly the calls bound to it.
            for call in x.bound.iter() {
                ensure!(
                    self.calls.get(*call).and_then(|c| c.sandbox()) == Some(ix),
                    "bound-calls",
                    "sandbox {id} lists {call:?}, which is not bound to it"
                );
            }
            if !x.bound.is_empty() {
                ensure!(
                    matches!(
                        x.state,
                        SandboxState::Starting | SandboxState::Running | SandboxState::Dead
                    ),
                    "bound-calls",
                    "sandbox {id} has calls in state {:?}",
                    x.state
                );
            }
            for call in x.bound.iter() {
                let state = &self.calls[*call].state;
                let call = &self.calls[*call].id;
                let fits = match x.state {
                    SandboxState::Starting => matches!(state, CallState::Starting(_)),
                    SandboxState::Running => matches!(state, CallState::Ready(_)),
                    _ => true,
                };
                ensure!(
                    fits,
                    "bound-calls",
                    "call {call} is {state:?} on {id} which is {:?}",
                    x.state
                );
            }
            if x.shutdown_ordered {
                ensure!(
                    matches!(x.state, SandboxState::ShuttingDown | SandboxState::Dead),
                    "shutdown-once",
                    "sandbox {id} was ordered to shut down and is {:?}",
                    x.state
                );
                ensure!(x.is_managed(), "shutdown-once", "external {id} shut down");
            }
            if x.state == SandboxState::ShuttingDown {
                ensure!(
                    x.shutdown_ordered,
                    "shutdown-once",
                    "sandbox {id} shuts down unordered"
                );
            }
            let awaits_ok = match x.awaiting {
                Awaiting::Nothing => true,
                Awaiting::Start => x.state == SandboxState::Starting,
                Awaiting::Stop => x.state == SandboxState::Stopping,
                Awaiting::Persist => x.state == SandboxState::Persisting,
                Awaiting::Record => {
                    x.deadline.is_none()
                        && self.keys.get(x.key).is_some_and(|slot| {
                            matches!(slot.own, Own::Owned(_))
                                && match x.state {
                                    SandboxState::Persisted => slot.retiring == Some(ix),
                                    SandboxState::Starting => slot.current == Some(ix),
                                    _ => false,
                                }
                        })
                }
                Awaiting::Hook => match x.hook {
                    Some(h) if h.is_after() => x.state == SandboxState::Starting,
                    Some(_) => x.state == SandboxState::Stopping,
                    None => false,
                },
                Awaiting::Shutdown => x.shutdown_ordered,
            };
            ensure!(
                awaits_ok,
                "shutdown-once",
                "sandbox {id} in {:?} awaits {:?}",
                x.state,
                x.awaiting
            );
            if x.deadline.is_some() {
                seen.timers += 1;
            }
            if !x.accepts_uploads() {
                ensure!(
                    x.uploads.is_empty() && x.targeting.is_empty() && x.busy_sessions == 0,
                    "uploads",
                    "sandbox {id} in {:?} has {} uploads in flight and {} sessions targeting it",
                    x.state,
                    x.uploads.len(),
                    x.targeting.len()
                );
            }
            for upload in x.uploads.iter() {
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
