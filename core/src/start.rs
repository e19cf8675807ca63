//! Starting a sandbox: the Start command, its answers, and a start that failed, timed out or
//! died.

use crate::call::{CallIx, CallState, EndHow};
use crate::command::{Command, DiscardReason, HookPoint};
use crate::error::{Error, ErrorKind};
use crate::ids::SandboxId;
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxIx};
use crate::small_set::Few;
use crate::time::Instant;

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The sandbox's Start succeeded: it is up, its calls are ready. A Start that is no longer
    /// awaited (the sandbox timed out, died, or was shut down by close) is stale and ignored.
    ///
    /// Errors: `UnknownSandbox` for an id never handed out, `Closed` after close finished.
    pub fn handle_start_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Start)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "start ok");
        self.out.stats.starts_ok += 1;
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        record.answered();
        let point = record.after_hook();
        let timeout = match point {
            HookPoint::AfterResume => self.config.hooks.after_resume,
            _ => self.config.hooks.after_start,
        };
        // An adopted sandbox was started, and hooked, by its first owner.
        let timeout = timeout.filter(|_| !record.is_adopted());
        match timeout {
            // Its calls wait for the hook (the sandbox stays starting); one whose calls all
            // ended meanwhile goes down at once, hook or not.
            Some(timeout) if !record.bound.is_empty() => self.order_hook(sandbox, point, timeout),
            _ => self.up(sandbox),
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox is up (its Start succeeded, and its hook, if any): its starting calls are
    /// ready.
    #[inline(always)]
    pub(crate) fn up(&mut self, sandbox: SandboxIx) {
        if self.liveness.is_some() && self.waits_for_record(sandbox) {
            return;
        }
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        record.run();
        self.discard_taken(sandbox);
        let record = &self.sandboxes[sandbox];
        let starters = self.calls.by_name_order(record.bound.to_few());
        for call in starters {
            if matches!(self.calls[call].state, CallState::Starting(s) if s == sandbox) {
                self.make_ready(call, sandbox);
            }
        }
        let key = self.sandboxes[sandbox].key;
        self.admit(key);
        self.record_if_changed(key);
        if self.sandboxes[sandbox].bound.is_empty() {
            if self.sandboxes[sandbox].is_adopted() {
                // Adopted for calls that ended meanwhile: it is the key's warm sandbox, as it
                // was its last owner's.
                self.last_call_released(sandbox);
                return;
            }
            if self.holds_history(sandbox) {
                // Resumed for calls that ended meanwhile: it holds the key's history, so it
                // goes down through Stop and Persist, which keep it, never straight to a
                // Shutdown (and never warm: its after-resume hook did not run).
                self.begin_drain(sandbox);
                return;
            }
            // Every call it was started for ended while it started.
            self.out.stats.orphan_starts += 1;
            self.shutdown(sandbox);
        }
    }

    /// The sandbox, up, resumed a snapshot: no start takes that snapshot again (a start gives it
    /// back to its key only while it is not up), so what is left of it goes
    /// ([`DiscardReason::Taken`]: the copy a start on another host downloaded, for one).
    fn discard_taken(&mut self, sandbox: SandboxIx) {
        let record = &self.sandboxes[sandbox];
        let Some((snapshot, by)) = record.resumed() else {
            return;
        };
        let (snapshot, key) = (snapshot.clone(), record.key);
        tracing::debug!(sandbox = %self.sid(sandbox), ?snapshot, "discard the snapshot it took");
        self.discard(key, snapshot, by, DiscardReason::Taken);
    }

    /// The sandbox's Start failed: the calls waiting on it fail with `start-failed`, and it is
    /// shut down (to clean up whatever the start left). Others' bindings are untouched.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_start_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Start)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "start failed");
        self.out.stats.starts_failed += 1;
        self.sandboxes.get_mut(sandbox).expect("awaited").answered();
        self.fail_start(sandbox, ErrorKind::StartFailed);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// Orders a Start for `call`'s key.
    pub(crate) fn start_sandbox(&mut self, call: CallIx) -> SandboxIx {
        let c = &mut self.calls[call];
        let key = c.key;
        let spec = c.spec.take().expect("a call orders at most one Start");
        let slot = &mut self.keys[key];
        // The start takes the key's snapshot: from now on it is the new sandbox's workspace
        // (a rename on the local backend, the same claim on Kubernetes), never discarded by the
        // key; the sandbox's own way down persists the next one.
        if let Some(at) = slot.retain.take() {
            self.timers.cancel(at);
        }
        let taken = slot.snapshot.take();
        let (resume_from, resumes) = match &taken {
            Some((snapshot, by)) => (Some(snapshot.clone()), Some(*by)),
            None => (None, None),
        };
        let started = self.sandboxes.start(key, taken);
        self.sandboxes[started].token = self.keys[key].token();
        let slot = &mut self.keys[key];
        slot.current = Some(started);
        let key = slot.key.clone();
        self.out.stats.resumes_ordered += u64::from(resume_from.is_some());
        let deadline = self.set_sandbox_timer(started, self.config.start_timeout);
        self.out.stats.starts_ordered += 1;
        let id = self.sid(started);
        tracing::debug!(sandbox = %id, key = %key, resume_from = ?resume_from, "start");
        self.out.commands.push_back(Command::Start {
            sandbox: id,
            key,
            spec,
            resume_from,
            resumes,
            deadline,
            token: self.sandboxes[started].token,
        });
        started
    }

    /// Fleet: an adopted sandbox that did not come up but keeps the key's history (its Adopts
    /// went unanswered, or its instance was lost while it was taken over, the workspace
    /// intact). Its `starters` fail with `error`; it is relinquished, never shut down, and the
    /// key's record keeps naming it for whoever continues the key next (an Adopt brings it up
    /// again).
    pub(crate) fn leave_adopted(
        &mut self,
        sandbox: SandboxIx,
        starters: Few<CallIx>,
        error: ErrorKind,
    ) {
        let record = &self.sandboxes[sandbox];
        debug_assert!(record.is_adopted());
        let (id, key) = (record.id, record.key);
        // Named first: the calls' ends may release the key, whose record must name it.
        if self
            .keys
            .get(key)
            .is_some_and(|slot| slot.token().is_some())
        {
            self.keys[key].left = Some(id);
        }
        for call in self.calls.by_name_order(starters) {
            self.end_call(call, EndHow::Failed(error));
        }
        self.relinquish(sandbox, crate::error::DropReason::SandboxGone);
        if self.keys.get(key).is_some() {
            self.admit(key);
            self.key_settles(key);
        }
    }

    /// A start that failed, timed out or died: its calls fail, it is cleaned up.
    pub(crate) fn fail_start(&mut self, sandbox: SandboxIx, error: ErrorKind) {
        self.start_failed(sandbox, error, false);
    }

    /// Fleet: the instance of a sandbox being adopted was lost, its workspace (the key's
    /// history) intact: it is left to the key's next adoption, never shut down
    /// ([`leave_adopted`](Self::leave_adopted)); its calls fail `start-failed`.
    pub(crate) fn lose_adoption(&mut self, sandbox: SandboxIx) {
        self.start_failed(sandbox, ErrorKind::StartFailed, true);
    }

    /// [`fail_start`](Self::fail_start); `keeps_history`: an adopted sandbox is left, not
    /// shut down, whatever the error.
    fn start_failed(&mut self, sandbox: SandboxIx, error: ErrorKind, keeps_history: bool) {
        // A start that failed was answered; one that timed out or died is abandoned (ordered
        // right before its Shutdown, after the calls' ends, which may start other sandboxes).
        let abandoned = self.way_down().stop_awaiting(sandbox);
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        let key = record.key;
        if let Some(slot) = self.keys.get_mut(key) {
            if slot.current == Some(sandbox) {
                slot.current = None;
            }
        }
        let starters: Few<CallIx> = record.bound.to_few();
        let adopted = record.is_adopted();
        // A start that took its key's snapshot and did not come up (but did not die): the
        // workspace is still the key's history (the snapshot, or this sandbox if the backend
        // began to resume it). The key keeps the snapshot again, before its calls end (the
        // key's slot may go with them), and the sandbox is left to the backend below.
        let give_back = match record.resumed() {
            Some((snapshot, by)) if error != ErrorKind::SandboxGone => Some((snapshot.clone(), by)),
            _ => None,
        };
        if let Some((snapshot, by)) = give_back.clone() {
            self.give_back_snapshot(key, snapshot, by);
        }
        if adopted && (error == ErrorKind::StartTimeout || keeps_history) {
            // Fleet: every Adopt went unanswered: the sandbox may well hold the key's history
            // still.
            return self.leave_adopted(sandbox, starters, error);
        }
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        if adopted {
            // Fleet: the handed-over sandbox could not be taken over. Its calls are not failed:
            // they queue first for the key again, and bind to a new start of it once the
            // adopted sandbox's Shutdown is ordered (queued, they also keep the key from being
            // released meanwhile).
            record.bound = crate::small_set::SmallSet::Empty;
            self.requeue_after_failed_adoption(key, starters);
        } else {
            for call in self.calls.by_name_order(starters.clone()) {
                self.end_call(call, EndHow::Failed(error));
            }
        }
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        // Only a managed sandbox starts, and one still starting has no Shutdown ordered yet.
        debug_assert!(record.is_managed() && !record.shutdown_ordered());
        if error == ErrorKind::SandboxGone {
            record.died();
        } else if let Some((snapshot, _)) = give_back {
            // Never shut down; no Abandon (a Shutdown must follow one): an answer that comes
            // later is stale.
            tracing::warn!(sandbox = %self.sid(sandbox), ?error, "resumed start failed: the key keeps its snapshot");
            self.left_as_it_is(sandbox, Some(snapshot));
            self.admit(key);
            self.key_settles(key);
            return;
        }
        // Dead or not, one Shutdown frees whatever the backend still holds of it.
        if abandoned {
            self.way_down().order_abandon(sandbox);
        }
        self.shutdown(sandbox);
        self.admit(key);
        self.key_settles(key);
    }
}
