//! Deaths: the backend reports a sandbox gone, or only its running instance; what the core does
//! with the calls, uploads and outstanding answers of a dead sandbox.

use crate::call::CallIx;
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::Event;
use crate::ids::SandboxId;
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxIx, SandboxState};
use crate::small_set::Few;
use crate::time::Instant;

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The backend reports the sandbox gone (pod evicted, claim expired, connection closed,
    /// directory removed). It is Dead: bound calls get `SandboxLost`, calls starting on it fail
    /// with `sandbox-gone`, uploads in flight into it are cancelled and their versions dropped
    /// (`sandbox-gone`), answers still outstanding become stale, and Shutdown is ordered once
    /// (managed sandboxes) to clean up whatever is left. A second report is ignored.
    ///
    /// Errors: `UnknownSandbox` for an id never handed out, `Closed` after close finished.
    pub fn handle_died(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("died")?;
        self.check_sandbox_id(sandbox)?;
        let Some(sandbox) = self.sandboxes.find(sandbox) else {
            self.out.stats.stale_answers += 1;
            return Ok(());
        };
        if self.sandboxes[sandbox].state() == SandboxState::Dead {
            return Ok(());
        }
        self.advance(now);
        self.died(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The backend reports that the sandbox's running instance is gone (its processes; on
    /// Kubernetes its pod: evicted, drained off its node, killed, or suspended by the
    /// controller) while its workspace remains (a claim and its volumes; a directory). For a
    /// managed sandbox that is never a death: the workspace is kept.
    ///
    /// - Being suspended (its `Stop { suspend: true }` or `Persist { suspend: true }`
    ///   outstanding): the suspension's own doing, counted (`instance_losses_suspending`).
    /// - Up and awaiting nothing (running, warm, draining): its bound calls are told
    ///   ([`Event::SandboxLost`]: what they ran is gone), its uploads in flight are dropped
    ///   (`sandbox-gone`; the mirror sends their versions again), no call binds to it again,
    ///   and it goes down as a suspension (Stop and Persist with `suspend`, no drain, no
    ///   before-hook) at once, or at its last call's release, whatever the policy. The key's
    ///   next Start resumes the snapshot that Stop names: the same workspace.
    /// - Starting (its Start or after-hook outstanding): its start failed
    ///   ([`handle_start_failed`](Self::handle_start_failed): a resumed one gives its key's
    ///   snapshot back). Fleet: one being adopted holds its key's history: it is left for the
    ///   key's next adoption (relinquished, its calls failed, never shut down), as when its
    ///   Adopts go unanswered.
    /// - On its way down otherwise (a before-hook, Stop, Persist or Shutdown outstanding, or
    ///   handed over): the outstanding command acts on the workspace and its answer decides.
    ///
    /// The last three count as `instance_losses_kept`. An external sandbox's instance lost is
    /// its death, as [`handle_died`](Self::handle_died). A report about a sandbox the core no
    /// longer tracks (a suspended one, an earlier incarnation of a resumed one) is stale; one
    /// about a sandbox already dead or already lost changes nothing.
    ///
    /// Errors: as [`handle_died`](Self::handle_died).
    pub fn handle_instance_gone(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("instance-gone")?;
        self.check_sandbox_id(sandbox)?;
        let Some(sandbox) = self.sandboxes.find(sandbox) else {
            self.out.stats.stale_answers += 1;
            return Ok(());
        };
        let record = &self.sandboxes[sandbox];
        if record.state() == SandboxState::Dead || record.instance_lost {
            return Ok(());
        }
        let loss = InstanceLoss::of(record);
        self.advance(now);
        match loss {
            InstanceLoss::Suspending => {
                tracing::debug!(sandbox = %self.sid(sandbox), "instance gone while suspending");
                self.out.stats.instance_losses_suspending += 1;
            }
            InstanceLoss::Up => self.instance_lost(sandbox),
            InstanceLoss::Starting => {
                tracing::warn!(sandbox = %self.sid(sandbox), "instance gone while starting");
                self.out.stats.instance_losses_kept += 1;
                if self.sandboxes[sandbox].is_adopted() {
                    self.lose_adoption(sandbox);
                } else {
                    self.fail_start(sandbox, ErrorKind::StartFailed);
                }
            }
            InstanceLoss::OnTheWayDown => {
                tracing::debug!(sandbox = %self.sid(sandbox), "instance gone on the way down");
                self.out.stats.instance_losses_kept += 1;
            }
            InstanceLoss::Death => self.died(sandbox),
        }
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// The backend reported the sandbox gone.
    pub(crate) fn died(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        let previous = record.state();
        if record.shutdown_ordered() {
            // Its Shutdown was ordered: the backend's death watch saw it go (a pod deleted).
            tracing::debug!(sandbox = %record.id, state = ?previous, "sandbox gone while shutting down");
        } else {
            tracing::warn!(sandbox = %record.id, state = ?previous, "sandbox died");
        }
        self.out.stats.deaths += 1;
        let holds_work = previous != SandboxState::Starting || record.resumed().is_some();
        if record.is_managed() && !record.shutdown_ordered() && holds_work {
            let (id, key) = (record.id, record.key);
            if let Some(slot) = self.keys.get(key) {
                self.out.events.push_back(Event::WorkspaceLost {
                    sandbox: id,
                    key: slot.key.clone(),
                });
            }
        }
        if previous == SandboxState::Starting {
            self.fail_start(sandbox, ErrorKind::SandboxGone);
            return;
        }
        // A Stop or Persist still outstanding is abandoned: its answer is stale now (Abandon is
        // ordered right before the Shutdown). An idle or drain deadline goes too; a Shutdown's
        // stays (its answer is still awaited).
        let abandoned = self.way_down().stop_awaiting(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        record.died();
        let key = record.key;
        // Calls told of its lost instance were told already.
        let lost: Few<CallIx> = if record.instance_lost {
            Few::new()
        } else {
            record.bound.to_few()
        };
        if self.sandboxes[sandbox].awaiting() != Awaiting::Shutdown {
            self.way_down().cancel_sandbox_timer(sandbox);
        }
        for call in self.calls.by_name_order(lost) {
            self.out.events.push_back(Event::SandboxLost {
                call: self.calls[call].id.clone(),
                sandbox: self.sid(sandbox),
            });
        }
        self.mirror()
            .leave_uploads(sandbox, DropReason::SandboxGone);
        let record = &self.sandboxes[sandbox];
        if record.is_managed() && !record.shutdown_ordered() {
            if abandoned {
                self.way_down().order_abandon(sandbox);
            }
            self.shutdown(sandbox);
        } else {
            self.key_lets_go(key, sandbox);
        }
        self.reconcile.sandbox(sandbox);
    }

    /// The sandbox's instance is gone, its workspace kept (see
    /// [`handle_instance_gone`](Self::handle_instance_gone)): its calls are told, and the key
    /// waits on it as on a retiring sandbox, which it now is.
    fn instance_lost(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        tracing::warn!(sandbox = %record.id, state = ?record.state(), "instance lost, workspace kept");
        self.out.stats.instance_losses_kept += 1;
        record.instance_lost = true;
        let key = record.key;
        let told: Few<CallIx> = record.bound.to_few();
        for call in self.calls.by_name_order(told) {
            self.out.events.push_back(Event::SandboxLost {
                call: self.calls[call].id.clone(),
                sandbox: self.sid(sandbox),
            });
        }
        // It takes no more uploads (its flag says so now): those in flight are dropped and
        // the sessions move on.
        self.mirror()
            .leave_uploads(sandbox, DropReason::SandboxGone);
        let slot = &mut self.keys[key];
        if slot.current == Some(sandbox) {
            slot.current = None;
        }
        slot.retiring = Some(sandbox);
        if self.sandboxes[sandbox].bound.is_empty() {
            self.way_down().cancel_sandbox_timer(sandbox);
            self.suspend_lost_instance(sandbox);
        }
        self.reconcile.sandbox(sandbox);
    }

    /// A sandbox whose instance was lost, with no calls left, goes down as a suspension:
    /// Stop and Persist keep its workspace as its key's snapshot. No drain (nothing runs to
    /// finish; its uploads were left when the instance was lost) and no before-hook (nothing
    /// runs it).
    pub(crate) fn suspend_lost_instance(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        debug_assert!(record.instance_lost && record.bound.is_empty());
        debug_assert!(record.uploads.is_empty() && record.targeting.is_empty());
        record.stop(true);
        self.order_stop(sandbox);
    }
}

/// What the loss of a sandbox's running instance means, by where the sandbox is (see
/// [`Lifecycle::handle_instance_gone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InstanceLoss {
    Suspending,
    Up,
    Starting,
    OnTheWayDown,
    Death,
}

impl InstanceLoss {
    fn of(record: &crate::sandbox::Sandbox) -> InstanceLoss {
        if !record.is_managed() {
            InstanceLoss::Death
        } else if matches!(record.awaiting(), Awaiting::Stop | Awaiting::Persist)
            && record.suspends()
        {
            InstanceLoss::Suspending
        } else if record.state() == SandboxState::Starting {
            InstanceLoss::Starting
        } else if record.awaiting() == Awaiting::Nothing
            && matches!(
                record.state(),
                SandboxState::Running | SandboxState::Idle | SandboxState::Draining
            )
        {
            InstanceLoss::Up
        } else {
            InstanceLoss::OnTheWayDown
        }
    }
}
