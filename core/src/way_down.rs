//! The way down: the release policy, then drain → Stop → Persist → Shutdown (or suspended), the
//! answers to those commands, abandoning what is no longer awaited, and the sandbox's one timer.
//!
//! A sandbox's own transitions (its state, its timer, the commands about it) run on [`WayDown`], a
//! view that cannot reach calls, keys, sessions or uploads; what a transition means for those
//! (a key letting go, uploads leaving, waiters admitted) is done on the lifecycle, here.

use crate::close::CloseState;
use crate::command::{Command, DiscardReason, HookPoint};
use crate::config::Config;
use crate::error::{DropReason, Error};
use crate::event::Event;
use crate::fleet::Handover;
use crate::ids::{Key, SandboxId, Snapshot};
use crate::key::KeyIx;
use crate::lifecycle::{Lifecycle, Reconcile};
use crate::output::Outputs;
use crate::sandbox::{Awaiting, Ownership, SandboxIx, Sandboxes, Then};
use crate::time::Instant;
use crate::timer::{Timer, Timers};
use std::time::Duration;

/// How many times a sandbox's Stop, and then its Persist, is ordered (each) before the way
/// down is taken as failed: a backend's transient failure (an API error, a full disk freed
/// meanwhile) gets two more tries, a lasting one ends the way down without deleting anything
/// the key needs (see [`Lifecycle::handle_stop_failed`]). A limit, so a broken backend cannot
/// keep a sandbox (and close) waiting forever.
pub const WAY_DOWN_ATTEMPTS: u8 = 3;

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The sandbox's Stop succeeded, with the snapshot it took, if any. Persist follows when
    /// there is a snapshot (or the policy is `Suspend`), else Shutdown.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_stop_ok(
        &mut self,
        now: Instant,
        sandbox: SandboxId,
        snapshot: Option<Snapshot>,
    ) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Stop)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), snapshot = ?snapshot, "stop ok");
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        record.answered();
        // The Persist gets its own attempts.
        if record.stopped(snapshot) {
            self.way_down().persist(sandbox);
        } else {
            self.shutdown(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Stop failed: it is not running for the core (whatever a backend flag
    /// says). The Stop is ordered again, up to [`WAY_DOWN_ATTEMPTS`] in all; when every one
    /// failed, a sandbox that holds its key's history (it resumed the key's snapshot, was
    /// adopted, or is being suspended), or in fleet mode any sandbox of an owned key, is left
    /// to the backend as it is (never shut down: that would delete the only copy) and the
    /// application is told ([`Event::WayDownFailed`], nothing kept); any other sandbox is shut
    /// down, as its policy would have done.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_stop_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Stop)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "stop failed");
        self.out.stats.stops_failed += 1;
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        if record.way_down_failed() < WAY_DOWN_ATTEMPTS {
            tracing::warn!(sandbox = %self.sid(sandbox), "stop failed: ordered again");
            self.order_stop(sandbox);
        } else {
            self.way_down_gave_up(sandbox, None);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Persist succeeded: its snapshot becomes its key's `resume_from`. Under
    /// `Suspend` the sandbox is done (kept by the backend); otherwise Shutdown follows.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_persist_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Persist)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "persist ok");
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        record.answered();
        let (key, id) = (record.key, record.id);
        if let Some(snapshot) = record.snapshot().cloned() {
            self.keep_snapshot(key, sandbox, snapshot, id);
        }
        if self.record_may_name(key, id) {
            // Fleet: shut down, or suspended for the key's next start to take its workspace,
            // only once the record names the snapshot instead.
            self.hold_for_record(sandbox, false);
        } else {
            self.persisted(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Persist failed. It is ordered again, up to [`WAY_DOWN_ATTEMPTS`] in all;
    /// when every one failed, the snapshot its Stop took is salvaged: the key keeps it as if
    /// the Persist had succeeded (its next Start resumes it), the sandbox is left to the backend
    /// (no Shutdown, which would delete a snapshot no Persist kept) and the application is told
    /// ([`Event::WayDownFailed`] naming it). Without a snapshot, as a failed Stop.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_persist_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Persist)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "persist failed");
        self.out.stats.persists_failed += 1;
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        if record.way_down_failed() < WAY_DOWN_ATTEMPTS {
            tracing::warn!(sandbox = %self.sid(sandbox), "persist failed: ordered again");
            self.way_down().persist(sandbox);
        } else {
            let snapshot = record.snapshot().cloned();
            self.way_down_gave_up(sandbox, snapshot);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Shutdown succeeded: the core forgets it (once no live call is bound to it).
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_shutdown_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Shutdown)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "shutdown ok");
        self.out.stats.shutdowns_ok += 1;
        self.way_down().note_shut_down();
        self.way_down().shutdown_answered(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Shutdown failed: `ShutdownUnconfirmed` tells the application the backend
    /// may still hold it. Shutdown is never ordered twice.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_shutdown_failed(
        &mut self,
        now: Instant,
        sandbox: SandboxId,
    ) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Shutdown)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::warn!(sandbox = %self.sid(sandbox), "shutdown failed");
        self.way_down().unconfirmed(sandbox);
        self.way_down().shutdown_answered(sandbox);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// The application lets go of what `key` keeps for its next start (its snapshot: a paused
    /// sandbox it kills without resuming it): the core orders it discarded
    /// ([`DiscardReason::Dropped`](crate::DiscardReason::Dropped)) at once, and the key's next
    /// call starts fresh. `Ok(false)` when the key keeps nothing (or is not tracked here: in
    /// fleet mode, another process's, or released to the store). O(log n).
    ///
    /// Errors: `KeyInUse` while the key has a sandbox (running, starting, on its way down, or
    /// left to the backend) or a call: its history is in use; `Closed` once close began.
    pub fn drop_snapshot(&mut self, now: Instant, key: &Key) -> Result<bool, Error> {
        self.time_passes(now);
        if self.is_closing() {
            return Err(Error::Closed {
                what: "drop_snapshot",
            });
        }
        let Some(k) = self.keys.find(key) else {
            return Ok(false);
        };
        let slot = &self.keys[k];
        let in_use = slot.current.is_some()
            || slot.retiring.is_some()
            || slot.bound > 0
            || !slot.waiters.is_empty()
            || slot.left.is_some()
            || slot.store_at.is_some();
        if in_use {
            return Err(Error::KeyInUse { key: key.clone() });
        }
        self.advance(now);
        let dropped = self.drop_kept_snapshot(k);
        self.finish_input();
        Ok(dropped)
    }

    // ------------------------------------------------------------------------------------------
    // Internals: the way down (drain → Stop → Persist → Shutdown)

    /// The release policy, applied when a running sandbox's last call has gone: its warm tier
    /// (when the policy has one and close has not begun), else the way down.
    #[inline(always)]
    pub(crate) fn last_call_released(&mut self, sandbox: SandboxIx) {
        let idle = self.config.release.tiers().idle;
        let record = &self.sandboxes[sandbox];
        if record.instance_lost {
            self.suspend_lost_instance(sandbox);
            return;
        }
        // A release that asked a way down skips the warm tier.
        let warm = record.asked.is_none() && !idle.is_zero();
        if record.owner == Ownership::Managed && warm && !self.is_closing() {
            tracing::debug!(sandbox = %self.sid(sandbox), "kept warm");
            self.sandboxes.get_mut(sandbox).expect("live").idle();
            self.set_sandbox_timer(sandbox, idle);
        } else {
            self.begin_drain(sandbox);
        }
    }

    /// The key's newest snapshot, persisted by `sandbox` (`id`): the key keeps it for its next
    /// Start, for the policy's retention. A snapshot it kept before is superseded and
    /// discarded (no Start took it, or it would be gone from the key).
    pub(crate) fn keep_snapshot(
        &mut self,
        key: KeyIx,
        sandbox: SandboxIx,
        snapshot: Snapshot,
        id: SandboxId,
    ) {
        let retain = self.config.release.tiers().retain;
        // The key's slot is kept by this sandbox, its retiring one.
        let slot = self
            .keys
            .get_mut(key)
            .expect("the key of a retiring sandbox");
        debug_assert_eq!(slot.retiring, Some(sandbox));
        if matches!(slot.key, Key::Call(_)) {
            // No later call has this key: nothing would ever resume it, so it goes now.
            self.discard(key, snapshot, id, DiscardReason::Unused);
            return;
        }
        if let Some(at) = slot.retain.take() {
            self.timers.cancel(at);
        }
        let old = slot.snapshot.replace((snapshot, id));
        if let Some(retain) = retain {
            let at = self.timers.set(self.now + retain, Timer::Retain(key));
            self.keys[key].retain = Some(at);
        }
        if let Some((old, by)) = old {
            self.discard(key, old, by, DiscardReason::Superseded);
        }
        self.record_if_changed(key);
    }

    /// A Start that took the key's snapshot `snapshot` (persisted by `by`) failed: the key
    /// keeps it again, for the policy's retention from now, for its next Start.
    pub(crate) fn give_back_snapshot(&mut self, key: KeyIx, snapshot: Snapshot, by: SandboxId) {
        let retain = self.config.release.tiers().retain;
        let slot = self
            .keys
            .get_mut(key)
            .expect("the key of a starting sandbox");
        debug_assert!(slot.snapshot.is_none() && slot.retain.is_none());
        slot.snapshot = Some((snapshot, by));
        if let Some(retain) = retain {
            let at = self.timers.set(self.now + retain, Timer::Retain(key));
            self.keys[key].retain = Some(at);
        }
        self.record_if_changed(key);
    }

    /// The key's retention passed: its snapshot is discarded and the key forgotten if nothing
    /// else keeps it.
    pub(crate) fn retention_over(&mut self, key: KeyIx) {
        let slot = self.keys.get_mut(key).expect("timer of a tracked key");
        slot.retain = None;
        let (snapshot, by) = slot
            .snapshot
            .take()
            .expect("a key's retention runs while it keeps a snapshot");
        tracing::debug!(key = %slot.key, snapshot = ?snapshot, "retention over");
        self.discard(key, snapshot, by, DiscardReason::Retention);
        self.key_settles(key);
    }

    /// The application's drop of what the key keeps ([`drop_snapshot`](Self::drop_snapshot)):
    /// its snapshot discarded as `Dropped`, its retention timer cancelled, the key settled.
    /// `false` when it keeps nothing.
    pub(crate) fn drop_kept_snapshot(&mut self, key: KeyIx) -> bool {
        let slot = self.keys.get_mut(key).expect("a tracked key");
        let Some((snapshot, by)) = slot.snapshot.take() else {
            return false;
        };
        if let Some(at) = slot.retain.take() {
            self.timers.cancel(at);
        }
        tracing::debug!(key = %slot.key, snapshot = ?snapshot, "snapshot dropped");
        self.discard(key, snapshot, by, DiscardReason::Dropped);
        self.key_settles(key);
        true
    }

    /// Orders a snapshot the key no longer references deleted.
    pub(crate) fn discard(
        &mut self,
        key: KeyIx,
        snapshot: Snapshot,
        by: SandboxId,
        reason: DiscardReason,
    ) {
        self.out.stats.discards += 1;
        self.out.commands.push_back(Command::Discard {
            sandbox: by,
            key: self.keys[key].key.clone(),
            snapshot,
            reason,
            token: self.keys[key].token(),
        });
    }

    /// The sandbox drains: its sessions' mirror work and holds finish before Stop, up to the
    /// drain deadline.
    #[inline(always)]
    pub(crate) fn begin_drain(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        debug_assert!(record.bound.is_empty());
        record.drain();
        let sessions = self.sessions.names(&record.targeting.to_few());
        tracing::debug!(sandbox = %self.sid(sandbox), sessions = sessions.len(), "drain");
        self.set_sandbox_timer(sandbox, self.config.drain_deadline);
        self.out.commands.push_back(Command::Drain {
            sandbox: self.sid(sandbox),
            sessions,
        });
        self.reconcile.sandbox(sandbox);
    }

    /// Ends a drain, cleanly or at a deadline: what is still in flight or pending for it is
    /// dropped with `reason`, then a managed sandbox stops and an external one is unbound.
    pub(crate) fn end_drain(&mut self, sandbox: SandboxIx, reason: DropReason) {
        self.way_down().cancel_sandbox_timer(sandbox);
        let handover = self.handing_over(sandbox);
        let hand_over = handover == Some(Handover::Warm);
        // Handed over by suspension: its snapshot is what the key's next owner resumes.
        let suspend = self.suspends(sandbox) || handover == Some(Handover::Suspended);
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        let managed = record.is_managed();
        if hand_over {
            record.hand_over();
        } else if managed {
            record.stop(suspend);
        } else {
            record.kept_by_the_backend();
        }
        self.mirror().leave_uploads(sandbox, reason);
        let key = self.sandboxes[sandbox].key;
        if hand_over {
            // Fleet: another process wants the key; the drained sandbox goes to it, warm.
            self.out.stats.handovers += 1;
            self.release_key(key, Some(sandbox));
            return;
        }
        let slot = &mut self.keys[key];
        if slot.current == Some(sandbox) {
            slot.current = None;
        }
        if managed {
            slot.retiring = Some(sandbox);
            let hooks = self.config.hooks;
            let (point, timeout) = if suspend {
                (HookPoint::BeforeSuspend, hooks.before_suspend)
            } else {
                (HookPoint::BeforeStop, hooks.before_stop)
            };
            match timeout {
                Some(timeout) => self.order_hook(sandbox, point, timeout),
                None => self.order_stop(sandbox),
            }
        } else {
            tracing::debug!(sandbox = %self.sid(sandbox), "external sandbox unbound");
            self.reconcile.sandbox(sandbox);
        }
        self.admit(key);
    }

    /// Orders the sandbox's Stop (its drain and its before-hook, if any, ended).
    #[inline(always)]
    pub(crate) fn order_stop(&mut self, sandbox: SandboxIx) {
        let suspend = self.sandboxes.get_mut(sandbox).expect("live").await_stop();
        let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
        tracing::debug!(sandbox = %self.sid(sandbox), "stop");
        self.out.commands.push_back(Command::Stop {
            sandbox: self.sid(sandbox),
            suspend,
            deadline,
            token: self.sandboxes[sandbox].token,
        });
    }

    /// Fleet mode: the sandbox, its snapshot the key's now (persisted, or salvaged when its way
    /// down was `given_up`), is held `Persisted` until a record no longer naming it is
    /// confirmed (`Awaiting::Record`; then [`persisted`](Self::persisted)), and that record is
    /// written.
    fn hold_for_record(&mut self, sandbox: SandboxIx, given_up: bool) {
        let record = &mut self.sandboxes[sandbox];
        record.hold_for_record(given_up);
        let key = record.key;
        self.record_if_changed(key);
    }

    /// The sandbox's Persist is done, or its snapshot salvaged (its way down given up), and its
    /// key's record does not name it: suspended, shut down, or left as it is, as its way down
    /// says.
    pub(crate) fn persisted(&mut self, sandbox: SandboxIx) {
        match self.sandboxes[sandbox].after_persist(false) {
            Then::LeaveAsItIs(kept) => self.left_as_it_is(sandbox, Some(kept)),
            Then::Suspend => self.suspended(sandbox),
            Then::Shutdown => self.shutdown(sandbox),
        }
    }

    /// Orders the sandbox's one Shutdown.
    pub(crate) fn shutdown(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        debug_assert!(
            matches!(record.awaiting(), Awaiting::Nothing | Awaiting::Record),
            "shutdown of {sandbox:?} while awaiting {:?}",
            record.awaiting()
        );
        debug_assert!(record.is_managed());
        debug_assert!(record.uploads.is_empty());
        record.await_shutdown();
        let key = record.key;
        self.mirror()
            .leave_uploads(sandbox, DropReason::SandboxGone);
        let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
        self.out.stats.shutdowns_ordered += 1;
        tracing::debug!(sandbox = %self.sid(sandbox), "shutdown");
        self.out.commands.push_back(Command::Shutdown {
            sandbox: self.sid(sandbox),
            deadline,
            token: self.sandboxes[sandbox].token,
        });
        self.key_lets_go(key, sandbox);
    }

    /// The sandbox's way down cannot go on: every Stop (`snapshot` none) or every Persist of
    /// `snapshot` failed, or one went unanswered. A snapshot its Stop took is salvaged (its
    /// key keeps it, as a Persist would have made it) and the sandbox left as it is; without
    /// one, a sandbox kept on failure ([`keeps_on_failure`](Self::keeps_on_failure)) is left as
    /// it is; any other is shut down, as its policy would have done. Nothing is awaited of it
    /// any more.
    pub(crate) fn way_down_gave_up(&mut self, sandbox: SandboxIx, snapshot: Option<Snapshot>) {
        let record = &self.sandboxes[sandbox];
        debug_assert_eq!(record.awaiting(), Awaiting::Nothing);
        let (key, id) = (record.key, record.id);
        if let Some(snapshot) = snapshot {
            self.keep_snapshot(key, sandbox, snapshot.clone(), id);
            if self.record_may_name(key, id) {
                // Fleet: left as it is, and the key's next start free to take the snapshot,
                // only once the record names the snapshot instead (`persisted`).
                self.hold_for_record(sandbox, true);
                return;
            }
            self.left_as_it_is(sandbox, Some(snapshot));
        } else if self.keeps_on_failure(sandbox) {
            self.left_as_it_is(sandbox, None);
        } else {
            self.shutdown(sandbox);
        }
    }

    /// Whether the way down of `sandbox`, given up now, would keep its workspace (see
    /// [`way_down_gave_up`](Self::way_down_gave_up)).
    pub(crate) fn keeps_when_given_up(&self, sandbox: SandboxIx) -> bool {
        let record = &self.sandboxes[sandbox];
        (record.awaiting() == Awaiting::Persist && record.snapshot().is_some())
            || self.keeps_on_failure(sandbox)
    }

    /// Whether a failed or unanswered way down leaves the sandbox as it is rather than shutting
    /// it down: it holds its key's history ([`holds_history`](Self::holds_history)), or, in
    /// fleet mode, its key is owned here. A fleet key's record then keeps naming it and the
    /// key's next call adopts it: a Stop whose answer never came may have moved the workspace
    /// into a snapshot the core never learned of, and a Shutdown would lose work the calls were
    /// told is safe (the backend takes the workspace back on adoption).
    pub(crate) fn keeps_on_failure(&self, sandbox: SandboxIx) -> bool {
        self.holds_history(sandbox) || self.keys[self.sandboxes[sandbox].key].token().is_some()
    }

    /// Whether the sandbox's workspace is its key's history, not just its own calls' work: it
    /// resumed the key's snapshot or was adopted from the key's last owner, or its way down
    /// is to keep it (a suspension). Its way down never ends in a Shutdown after a failure.
    pub(crate) fn holds_history(&self, sandbox: SandboxIx) -> bool {
        let record = &self.sandboxes[sandbox];
        record.resumed().is_some() || record.is_adopted() || record.suspends()
    }

    /// Every Stop or Persist of the sandbox failed: it is left to the backend as it is, never
    /// shut down, and forgotten; `kept` is the snapshot its key keeps of it (salvaged), if any.
    /// The application is told either way.
    pub(crate) fn left_as_it_is(&mut self, sandbox: SandboxIx, kept: Option<Snapshot>) {
        let id = self.sid(sandbox);
        let key = self.sandboxes[sandbox].key;
        tracing::warn!(sandbox = %id, ?kept, "way down failed: the workspace is left as it is");
        self.out.stats.left_as_is += 1;
        if kept.is_none() && self.keys[key].token().is_some() {
            self.keys[key].left = Some(id);
        }
        self.out.events.push_back(Event::WayDownFailed {
            sandbox: id,
            key: self.keys[key].key.clone(),
            kept,
        });
        self.kept_by_the_backend(sandbox);
    }

    /// The sandbox's way down ended with the backend keeping it (suspended, or left as it
    /// was): the core forgets it, without a Shutdown, and its key lets go of it.
    fn kept_by_the_backend(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        record.kept_by_the_backend();
        let key = record.key;
        self.key_lets_go(key, sandbox);
        self.reconcile.sandbox(sandbox);
    }

    /// `Suspend` is done for the sandbox: persisted, kept by the backend, forgotten by the core.
    pub(crate) fn suspended(&mut self, sandbox: SandboxIx) {
        tracing::debug!(sandbox = %self.sid(sandbox), "suspended");
        self.out.stats.suspended += 1;
        self.way_down().note_suspended(sandbox);
        self.kept_by_the_backend(sandbox);
    }

    /// Sets the sandbox's one timer `after` from now (see [`WayDown::set_sandbox_timer`]).
    #[inline(always)]
    pub(crate) fn set_sandbox_timer(&mut self, sandbox: SandboxIx, after: Duration) -> Instant {
        self.way_down().set_sandbox_timer(sandbox, after)
    }

    /// The way down's view of the lifecycle: what a sandbox's own transitions may change (its
    /// record, its timer, the commands and events about it, the counters and the close
    /// report). Calls, keys, sessions and uploads are out of its reach: what a transition means
    /// for them is done by the caller, on the lifecycle.
    pub(crate) fn way_down(&mut self) -> WayDown<'_> {
        WayDown {
            config: &self.config,
            now: self.now,
            sandboxes: &mut self.sandboxes,
            timers: &mut self.timers,
            out: &mut self.out,
            close: &mut self.close,
            reconcile: &mut self.reconcile,
        }
    }
}

/// A sandbox's own transitions on the way down, borrowed for one step of an input
/// ([`Lifecycle::way`]).
pub(crate) struct WayDown<'a> {
    pub(crate) config: &'a Config,
    pub(crate) now: Instant,
    pub(crate) sandboxes: &'a mut Sandboxes,
    pub(crate) timers: &'a mut Timers,
    pub(crate) out: &'a mut Outputs,
    pub(crate) close: &'a mut CloseState,
    pub(crate) reconcile: &'a mut Reconcile,
}

impl WayDown<'_> {
    /// The id of a tracked sandbox, as outputs and logs name it.
    pub(crate) fn sid(&self, sandbox: SandboxIx) -> SandboxId {
        self.sandboxes[sandbox].id
    }

    /// Counts an answered Shutdown in the close report, while close is under way.
    pub(crate) fn note_shut_down(&mut self) {
        if let Some(report) = self.close.report_mut() {
            report.shut_down += 1;
        }
    }

    /// Counts a suspended sandbox in the close report, while close is under way.
    pub(crate) fn note_suspended(&mut self, sandbox: SandboxIx) {
        let id = self.sid(sandbox);
        if let Some(report) = self.close.report_mut() {
            report.suspended.push(id);
        }
    }

    pub(crate) fn persist(&mut self, sandbox: SandboxIx) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        let (snapshot, suspend) = record.await_persist();
        let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
        // The retention counts from the Persist's answer; the backend's own expiry from the
        // Persist's deadline, the latest instant the answer can come: never earlier than the
        // core's, so a keeper that restarts finds nothing deleted before its time.
        let retain_until = self.config.release.tiers().retain.map(|r| deadline + r);
        tracing::debug!(sandbox = %self.sid(sandbox), snapshot = ?snapshot, "persist");
        self.out.commands.push_back(Command::Persist {
            sandbox: self.sid(sandbox),
            snapshot,
            suspend,
            retain_until,
            deadline,
            token: self.sandboxes[sandbox].token,
        });
    }

    /// Stops awaiting the sandbox's outstanding Start, Stop or Persist, if any: cancels its
    /// timer and orders `Abandon`. Its Shutdown follows at once (every caller orders it).
    pub(crate) fn abandon(&mut self, sandbox: SandboxIx) {
        if self.stop_awaiting(sandbox) {
            self.order_abandon(sandbox);
        }
    }

    /// Stops awaiting the sandbox's outstanding Start, Stop or Persist, without ordering
    /// `Abandon` yet; whether there was one. The caller orders it right before the Shutdown.
    /// A sandbox held back for its key's record (`Awaiting::Record`) has nothing outstanding
    /// at the backend: it stops waiting, and the answer is no.
    pub(crate) fn stop_awaiting(&mut self, sandbox: SandboxIx) -> bool {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        if !matches!(
            record.awaiting(),
            Awaiting::Start
                | Awaiting::Stop
                | Awaiting::Persist
                | Awaiting::Hook
                | Awaiting::Record
        ) {
            return false;
        }
        if record.answered() == Awaiting::Record {
            return false;
        }
        self.cancel_sandbox_timer(sandbox);
        true
    }

    pub(crate) fn order_abandon(&mut self, sandbox: SandboxIx) {
        self.out.stats.abandoned += 1;
        tracing::debug!(sandbox = %self.sid(sandbox), "abandon");
        self.out.commands.push_back(Command::Abandon {
            sandbox: self.sid(sandbox),
        });
    }

    #[inline(always)]
    pub(crate) fn shutdown_answered(&mut self, sandbox: SandboxIx) {
        self.cancel_sandbox_timer(sandbox);
        self.sandboxes.get_mut(sandbox).expect("awaited").answered();
        self.reconcile.sandbox(sandbox);
    }

    pub(crate) fn unconfirmed(&mut self, sandbox: SandboxIx) {
        self.out.stats.shutdowns_unconfirmed += 1;
        if let Some(report) = self.close.report_mut() {
            report.unconfirmed.push(self.sandboxes[sandbox].id);
        }
        self.out.events.push_back(Event::ShutdownUnconfirmed {
            sandbox: self.sid(sandbox),
        });
    }

    /// Sets the sandbox's one timer `after` from now, replacing the one it had; returns its
    /// instant.
    #[inline(always)]
    pub(crate) fn set_sandbox_timer(&mut self, sandbox: SandboxIx, after: Duration) -> Instant {
        self.cancel_sandbox_timer(sandbox);
        let at = self.timers.set(self.now + after, Timer::Sandbox(sandbox));
        self.sandboxes.get_mut(sandbox).expect("live").deadline = Some(at);
        at.at
    }

    #[inline(always)]
    pub(crate) fn cancel_sandbox_timer(&mut self, sandbox: SandboxIx) {
        if let Some(record) = self.sandboxes.get_mut(sandbox) {
            if let Some(at) = record.deadline.take() {
                self.timers.cancel(at);
            }
        }
    }
}
