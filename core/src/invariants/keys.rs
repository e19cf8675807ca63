//! The keys table: a key's counts, ownership, retention and its current and retiring
//! sandboxes (`key-index`, `key-forgotten`, `key-counts`, `serialize`, `ownership`, `retention`).

use super::{Seen, Violation};
use crate::call::CallState;
use crate::config::SameKey;
use crate::ids::Key;
use crate::key::Own;
use crate::lifecycle::Lifecycle;
use crate::sandbox::SandboxState;

impl Lifecycle {
    /// Keys: each key's bound count against the calls, its ownership and store timer, its retention,
    /// the states of its current and retiring sandboxes, and that its queue holds waiting calls.
    pub(super) fn check_keys(&self, seen: &mut Seen) -> Result<(), Violation> {
        ensure!(
            self.keys.index_agrees(),
            "key-index",
            "the key index and the key slots disagree"
        );
        for (ix, slot) in self.keys.iter() {
            let key = &slot.key;
            ensure!(
                !slot.is_empty(),
                "key-forgotten",
                "key {key} is kept with nothing to remember (no sandbox, call, waiter or snapshot)"
            );
            let bound = seen.bound_by_key.count(ix);
            ensure!(
                slot.bound as usize == bound,
                "key-counts",
                "key {key} counts {} bound calls, {bound} are bound",
                slot.bound
            );
            if self.config.same_key == SameKey::Serialize && !matches!(key, Key::External(_)) {
                ensure!(
                    bound <= 1,
                    "serialize",
                    "key {key} has {bound} live calls under Serialize"
                );
            }
            // Fleet: a key is owned only in fleet mode, and only a fleet key; its store work has
            // its one timer; its live sandboxes carry the token it is owned under.
            let fleet_key = self.is_fleet_key(key);
            ensure!(
                fleet_key || slot.own == Own::Local,
                "ownership",
                "key {key} is not a fleet key and is {:?}",
                slot.own
            );
            ensure!(
                slot.store_at.is_some()
                    == matches!(slot.own, Own::Claiming(..) | Own::Busy | Own::Releasing(..))
                    || matches!(slot.own, Own::Owned(_)),
                "ownership",
                "key {key} is {:?} with store timer {:?}",
                slot.own,
                slot.store_at
            );
            if slot.store_at.is_some() {
                seen.timers += 1;
            }
            if fleet_key
                && slot
                    .current
                    .is_some_and(|current| self.sandboxes[current].state() != SandboxState::Dead)
            {
                ensure!(
                    matches!(slot.own, Own::Owned(_) | Own::Releasing(..)),
                    "ownership",
                    "key {key} has a live sandbox and is {:?}",
                    slot.own
                );
            }
            if let (Some(token), Some(current)) = (slot.token(), slot.current) {
                let sandbox = &self.sandboxes[current];
                ensure!(
                    sandbox.state() == SandboxState::Dead || sandbox.token == Some(token),
                    "ownership",
                    "key {key} is owned under {token} and its sandbox {} carries {:?}",
                    sandbox.id,
                    sandbox.token
                );
            }
            // Retention: a key keeps a snapshot for the policy's retention, on its own timer.
            let retains = self.config.release.tiers().retain.is_some();
            ensure!(
                slot.retain.is_some() == (retains && slot.snapshot.is_some()),
                "retention",
                "key {key} keeps a snapshot {:?} with retention timer {:?}",
                slot.snapshot,
                slot.retain
            );
            if slot.retain.is_some() {
                seen.timers += 1;
            }
            ensure!(
                slot.snapshot.is_none() || slot.current.is_none() || {
                    // A key's snapshot waits for its next start; a current sandbox that is
                    // starting has taken it.
                    !matches!(
                        self.sandboxes
                            .get(slot.current.expect("checked"))
                            .map(|sandbox| sandbox.state()),
                        Some(SandboxState::Starting)
                    )
                },
                "retention",
                "key {key} keeps a snapshot while its sandbox starts (the start takes it)"
            );
            if let Some(current) = slot.current {
                let state = self.sandboxes.get(current).map(|sandbox| sandbox.state());
                ensure!(
                    matches!(
                        state,
                        Some(
                            SandboxState::Starting
                                | SandboxState::Running
                                | SandboxState::Idle
                                | SandboxState::Draining
                                | SandboxState::HandingOver
                        )
                    ) || (state == Some(SandboxState::Dead)
                        && self.sandboxes[current].shutdown_ordered()
                        && slot.own != Own::Local),
                    "key-counts",
                    "key {key}'s current sandbox {current:?} is {state:?}"
                );
            }
            if let Some(retiring) = slot.retiring {
                let state = self.sandboxes.get(retiring).map(|sandbox| sandbox.state());
                ensure!(
                    matches!(
                        state,
                        Some(
                            SandboxState::Stopping
                                | SandboxState::Persisting
                                | SandboxState::Persisted
                        )
                    ) || (state == Some(SandboxState::Running)
                        && self.sandboxes[retiring].instance_lost),
                    "key-counts",
                    "key {key}'s retiring sandbox {retiring:?} is {state:?}"
                );
            }
            for w in &slot.waiters {
                ensure!(
                    matches!(
                        self.calls.get(*w).map(|c| &c.state),
                        Some(CallState::Waiting { .. })
                    ),
                    "key-counts",
                    "key {key} queues {w:?}, which is not waiting"
                );
            }
        }
        Ok(())
    }
}
