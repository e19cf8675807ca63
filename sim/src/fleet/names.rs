//! What `@<call>` names in a fleet: the sandbox each call is, or was last, bound to, whichever
//! replica bound it. Learned from each replica's core after every input (its live calls'
//! status), the same way whether a scenario drives the world or a seed's run is written out as
//! one, so that a transcript's `@call` names on replay the sandbox it named in the seed.

use std::collections::BTreeMap;

use sandkeeper::{CallId, CallStatus, Lifecycle, SandboxId};

/// Every call acquired so far: its replica and its latest sandbox.
#[derive(Clone, Debug, Default)]
pub(super) struct Names {
    calls: BTreeMap<CallId, (usize, Option<SandboxId>)>,
}

impl Names {
    /// Replica `r` acquired `call`.
    pub(super) fn acquired(&mut self, call: &CallId, r: usize) {
        self.calls.entry(call.clone()).or_insert((r, None));
    }

    /// Learns the bindings of replica `r`'s `live` calls from its core.
    pub(super) fn learn<'a>(
        &mut self,
        r: usize,
        core: &Lifecycle,
        live: impl Iterator<Item = &'a CallId>,
    ) {
        for call in live {
            if let Some(CallStatus::Starting(x) | CallStatus::Ready(x) | CallStatus::Lost(x)) =
                core.call_status(call)
            {
                self.calls.insert(call.clone(), (r, Some(x)));
            }
        }
    }

    /// The replica that acquired `call`, and the sandbox it is or was last bound to.
    pub(super) fn get(&self, call: &CallId) -> Option<(usize, Option<SandboxId>)> {
        self.calls.get(call).copied()
    }

    /// A call whose latest sandbox is `x` (the first by name), to name `x` as `@call`.
    pub(super) fn call_for(&self, x: SandboxId) -> Option<CallId> {
        self.calls
            .iter()
            .find(|(_, (_, bound))| *bound == Some(x))
            .map(|(c, _)| c.clone())
    }
}
