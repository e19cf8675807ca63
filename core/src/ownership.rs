//! Fleet mode: who drives a key's sandboxes. Claiming a key before its first start or adoption,
//! the answers of the store, adopting a sandbox handed over warm, handing a key over to a process
//! that wants it, and releasing it with its durable record when this process is done with it.
//!
//! The rules, each kept here and nowhere else:
//!
//! - A call of a fleet key binds only while this process owns the key ([`Own::Owned`]); before,
//!   it queues like any waiter (bounded by `wait_timeout`) and the core claims the key, under a
//!   valid lease only. A busy or failed claim is made again every `claim_retry` while a call
//!   waits.
//! - A claimed key continues from its record: a warm sandbox is adopted (`Command::Adopt`); a
//!   snapshot becomes the key's, for the next Start to resume, with its recorded retention.
//! - An owned key whose calls have all ended is released, with its record, when nothing of it
//!   is left (its way down ended and no snapshot is kept), when another process wants it (a warm
//!   sandbox is drained and handed over in the record; a snapshot goes in the record), and at
//!   close. A key that keeps a snapshot and is not wanted stays owned: owning costs nothing but
//!   the process's one lease.
//! - While it owns a key, the process keeps the key's durable record in the store up to date
//!   (`StoreCommand::Record`: its snapshot, and the sandbox it runs), one write at a time, so
//!   that if it crashes the key's next owner adopts that sandbox or resumes that snapshot.
//! - Every command that changes a fleet key's sandbox carries the token it is owned under.

use crate::call::CallIx;
use crate::command::Command;
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::{Event, FenceReason};
use crate::fleet::{
    ClaimId, Handover, KeyRecord, RecordedSnapshot, RecordingId, ReleaseId, StoreCommand, Token,
};
use crate::ids::Key;
use crate::ids::SandboxId;
use crate::key::{Held, KeyIx, Own};
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxIx, SandboxState};
use crate::session::SessionIx;
use crate::small_set::Few;
use crate::time::Instant;
use crate::timer::Timer;

/// How the store answered a write of a key's entry (a release, or a record write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    /// Written (a release: the key is no longer this process's).
    Done,
    /// A store error or no answer in time: the key is still this process's; try again later.
    Failed,
    /// Refused: a newer token owns the key. It was not this process's any more.
    Fenced,
}

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Store inputs

    /// The store made this process the owner of `key` under `token`; `record` is what the key's
    /// last owner left. Calls of the key bind now: to the warm sandbox the record hands over
    /// (adopted first), else to a new one, which resumes the record's snapshot. A claim the core
    /// no longer awaits (past its deadline, of a lease epoch that lapsed) is stale: the core does
    /// not count the key its own, and the store gives it to the next claimant once this
    /// process's lease of that epoch ends.
    ///
    /// Errors: `UnknownStoreWork` for a claim never ordered, `Closed` after close finished.
    pub fn handle_claimed(
        &mut self,
        now: Instant,
        claim: ClaimId,
        key: &Key,
        token: Token,
        record: KeyRecord,
    ) -> Result<(), Error> {
        self.time_passes(now);
        let Some(k) = self.claim_answered(claim, key)? else {
            return Ok(());
        };
        self.advance(now);
        let live = self.liveness.as_ref().expect("fleet");
        let Own::Claiming(_, epoch) = self.keys[k].own else {
            unreachable!("an awaited claim")
        };
        if epoch != live.epoch || !live.is_valid(self.now) {
            // The lease it was made under is no longer valid: owning the key now would break
            // the rule that nothing is ordered for a key without a valid lease.
            tracing::debug!(%claim, key = %key, "claim confirmed after its lease lapsed");
            self.out.stats.stale_answers += 1;
            self.claim_again_later(k);
            self.finish_input();
            return Ok(());
        }
        tracing::debug!(%claim, key = %key, %token, ?record, "key claimed");
        self.out.stats.claims_ok += 1;
        self.cancel_key_store_timer(k);
        let slot = &mut self.keys[k];
        slot.own = Own::Owned(Held::claimed(token));
        // The store keeps the record it handed out until this process writes a newer one: a
        // process that ends before its first write leaves the key's next owner what it found.
        slot.record.claimed(&record);
        if let Some(recorded) = record.snapshot {
            self.take_recorded_snapshot(k, recorded);
        }
        match record.warm {
            Some(id) => self.adopt(k, id, token),
            None => self.admit(k),
        }
        self.key_settles(k);
        self.finish_input();
        Ok(())
    }

    /// Another process owns `key`; the store recorded this process's want. The claim is made
    /// again after `claim_retry` while a call of the key waits.
    ///
    /// Errors: as [`handle_claimed`](Self::handle_claimed).
    pub fn handle_claim_busy(
        &mut self,
        now: Instant,
        claim: ClaimId,
        key: &Key,
    ) -> Result<(), Error> {
        self.claim_not_granted(now, claim, key, false)
    }

    /// The store could not decide the claim (an error, a conflict it gave up on). As busy:
    /// made again after `claim_retry` while a call of the key waits. Never fails open.
    ///
    /// Errors: as [`handle_claimed`](Self::handle_claimed).
    pub fn handle_claim_failed(
        &mut self,
        now: Instant,
        claim: ClaimId,
        key: &Key,
    ) -> Result<(), Error> {
        self.claim_not_granted(now, claim, key, true)
    }

    /// The store wrote the key's record and let the key go: it is no longer this process's. A
    /// sandbox handed over with it is relinquished (`Command::Relinquish`). Calls of the key
    /// that came meanwhile claim it again.
    ///
    /// Errors: `UnknownStoreWork` for a release never ordered, `Closed` after close finished.
    pub fn handle_key_released(
        &mut self,
        now: Instant,
        release: ReleaseId,
        key: &Key,
    ) -> Result<(), Error> {
        self.release_answered(now, release, key, Written::Done)
    }

    /// The store could not write the release. The key is still this process's (under the same
    /// token); a sandbox being handed over goes back to warm, and the release is tried again
    /// after `claim_retry`.
    ///
    /// Errors: as [`handle_key_released`](Self::handle_key_released).
    pub fn handle_release_failed(
        &mut self,
        now: Instant,
        release: ReleaseId,
        key: &Key,
    ) -> Result<(), Error> {
        self.release_answered(now, release, key, Written::Failed)
    }

    /// The store refused the release: a newer token owns the key (this process's lease expired
    /// in the store's eyes). Nothing was written; the key, and a sandbox being handed over with
    /// it, are the new owner's.
    ///
    /// Errors: as [`handle_key_released`](Self::handle_key_released).
    pub fn handle_release_fenced(
        &mut self,
        now: Instant,
        release: ReleaseId,
        key: &Key,
    ) -> Result<(), Error> {
        self.release_answered(now, release, key, Written::Fenced)
    }

    /// The store wrote the owned key's durable record (or a newer write had landed first).
    ///
    /// Errors: `UnknownStoreWork` for a write never ordered, `Closed` after close finished.
    pub fn handle_recorded(
        &mut self,
        now: Instant,
        recording: RecordingId,
        key: &Key,
    ) -> Result<(), Error> {
        self.record_answered(now, recording, key, Written::Done)
    }

    /// The store could not write the record: the key is still this process's, and the record
    /// is written again after `claim_retry`.
    ///
    /// Errors: as [`handle_recorded`](Self::handle_recorded).
    pub fn handle_record_failed(
        &mut self,
        now: Instant,
        recording: RecordingId,
        key: &Key,
    ) -> Result<(), Error> {
        self.record_answered(now, recording, key, Written::Failed)
    }

    /// The store refused the record: a newer token owns the key. The key is fenced
    /// ([`Event::KeyFenced`], reason `Refused`).
    ///
    /// Errors: as [`handle_recorded`](Self::handle_recorded).
    pub fn handle_record_fenced(
        &mut self,
        now: Instant,
        recording: RecordingId,
        key: &Key,
    ) -> Result<(), Error> {
        self.record_answered(now, recording, key, Written::Fenced)
    }

    /// The backend refused a command on `sandbox`: it has seen a newer fencing token for it, so
    /// another process owns its key now. The key is fenced ([`Event::KeyFenced`]). A refusal
    /// about a sandbox this process no longer drives, or under an older token than the key's
    /// current one, is stale.
    ///
    /// Errors: `UnknownSandbox` for an id never handed out, `Closed` after close finished.
    pub fn handle_fenced(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("fenced")?;
        self.check_sandbox_id(sandbox)?;
        let driven = self.sandboxes.find(sandbox).filter(|&driven| {
            let entry = &self.sandboxes[driven];
            entry.token.is_some() && self.keys.get(entry.key).and_then(|k| k.token()) == entry.token
        });
        let Some(driven) = driven else {
            tracing::debug!(%sandbox, "stale refusal ignored");
            self.out.stats.stale_answers += 1;
            return Ok(());
        };
        self.advance(now);
        let k = self.sandboxes[driven].key;
        self.fence_key(k, FenceReason::Refused);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Getters

    /// The token this process owns `key` under, in fleet mode.
    pub fn key_token(&self, key: &Key) -> Option<Token> {
        self.keys.get(self.keys.find(key)?)?.token()
    }

    // ------------------------------------------------------------------------------------------
    // Internals: claiming

    /// Whether `key` is a fleet key: fleet mode is on and the key spans calls (not one call's,
    /// not an external sandbox the application supplies).
    pub(crate) fn is_fleet_key(&self, key: &Key) -> bool {
        self.liveness.is_some() && !matches!(key, Key::Call(_) | Key::External(_))
    }

    /// Whether calls of the fleet key may bind now: only when this process owns it, is not in
    /// doubt about a release, its sandbox is not being handed over, and the sandbox its record
    /// names for adoption is not one this process still tracks (relinquished when it lost the
    /// key, its lost calls not released yet: adopted once it is forgotten, never replaced by a
    /// fresh start), and no record write in flight or in doubt names as warm a sandbox that is
    /// not the key's current one (a start that failed after its record write was ordered: a new
    /// start would take the workspace from under what that write, if it lands, names; the calls
    /// wait until a write is confirmed after it, which the store keeps instead). A fleet key's
    /// slot is `Local` only within the input that made it, before its first claim: not
    /// bindable (fail closed; a non-fleet key never asks).
    pub(crate) fn may_bind(&self, k: KeyIx) -> bool {
        let slot = &self.keys[k];
        match slot.own {
            Own::Owned(held) => {
                !held.doubtful
                    && !slot.current.is_some_and(|sandbox| {
                        self.sandboxes[sandbox].state() == SandboxState::HandingOver
                    })
                    && slot.left.is_none_or(|id| self.sandboxes.find(id).is_none())
                    && !self.record_names_another(k)
            }
            _ => false,
        }
    }

    /// Whether the record write of `k` in flight, or one in doubt (unanswered in time, not
    /// superseded by a confirmed one), names as warm a sandbox other than the key's current
    /// one.
    fn record_names_another(&self, k: KeyIx) -> bool {
        let slot = &self.keys[k];
        let current = slot.current.map(|sandbox| self.sandboxes[sandbox].id);
        slot.record.names_another(current)
    }

    /// A call of `k` queued: claim the key if nobody is claiming it yet and the lease is valid
    /// (else the claim waits for the lease, [`claim_waiting_keys`](Self::claim_waiting_keys)).
    pub(crate) fn claim_for_waiter(&mut self, k: KeyIx) {
        if self.keys[k].own == Own::Local && self.is_fleet_key(&self.keys[k].key) {
            self.keys[k].own = Own::Unclaimed;
        }
        if self.keys[k].own == Own::Unclaimed {
            self.claim(k);
        }
    }

    /// Orders the claim of `k`, if the lease is valid.
    fn claim(&mut self, k: KeyIx) {
        let now = self.now;
        let timeout = self.config.command_timeout;
        let live = self.liveness.as_mut().expect("fleet");
        if !live.is_valid(now) {
            return;
        }
        let claim = ClaimId(live.next_claim);
        live.next_claim += 1;
        let epoch = live.epoch;
        // The claim's answer is no use once the lease it is made under could have lapsed.
        let deadline = (now + timeout).min(live.valid_until.expect("valid"));
        self.out.stats.claims_ordered += 1;
        let slot = &mut self.keys[k];
        slot.own = Own::Claiming(claim, epoch);
        tracing::debug!(%claim, key = %slot.key, "claim");
        self.out.store.push_back(StoreCommand::Claim {
            claim,
            key: slot.key.clone(),
            epoch,
            deadline,
        });
        self.set_key_store_timer(k, deadline);
    }

    /// The lease became valid: claim every key a call waits for, in key order.
    pub(crate) fn claim_waiting_keys(&mut self) {
        if self.calls.waiting == 0 {
            return;
        }
        let mut keys: Vec<(Key, KeyIx)> = self
            .keys
            .iter()
            .filter(|(_, slot)| slot.own == Own::Unclaimed && !slot.waiters.is_empty())
            .map(|(k, slot)| (slot.key.clone(), k))
            .collect();
        keys.sort_unstable();
        for (_, k) in keys {
            self.claim(k);
        }
    }

    /// A claim answered busy, or failed: counted, then tried again later.
    fn claim_not_granted(
        &mut self,
        now: Instant,
        claim: ClaimId,
        key: &Key,
        failed: bool,
    ) -> Result<(), Error> {
        self.time_passes(now);
        let Some(k) = self.claim_answered(claim, key)? else {
            return Ok(());
        };
        self.advance(now);
        if failed {
            tracing::warn!(%claim, key = %key, "claim failed");
            self.out.stats.claims_failed += 1;
        } else {
            tracing::debug!(%claim, key = %key, "key busy");
            self.out.stats.claims_busy += 1;
        }
        self.claim_again_later(k);
        self.finish_input();
        Ok(())
    }

    /// A claim was busy, failed or late: wait `claim_retry`, then claim again if a call still
    /// waits.
    fn claim_again_later(&mut self, k: KeyIx) {
        self.keys[k].own = Own::Busy;
        self.retry_later(k);
    }

    /// Sets the key's store timer `claim_retry` from now: its busy claim or failed release is
    /// tried again then.
    fn retry_later(&mut self, k: KeyIx) {
        let retry = self.liveness.as_ref().expect("fleet").fleet.claim_retry;
        self.set_key_store_timer(k, self.now + retry);
    }

    /// The place of `key` when its claim `claim` is awaited.
    fn claim_answered(&mut self, claim: ClaimId, key: &Key) -> Result<Option<KeyIx>, Error> {
        self.check_not_closed("claim answer")?;
        let unknown = Error::UnknownStoreWork {
            what: "claim",
            id: claim.0,
        };
        let live = self.liveness.as_ref().ok_or(unknown.clone())?;
        if claim.0 >= live.next_claim {
            return Err(unknown);
        }
        let awaited = self
            .keys
            .find(key)
            .filter(|k| matches!(self.keys[*k].own, Own::Claiming(c, _) if c == claim));
        if awaited.is_none() {
            tracing::debug!(%claim, key = %key, "stale claim answer ignored");
            self.out.stats.stale_answers += 1;
        }
        Ok(awaited)
    }

    // ------------------------------------------------------------------------------------------
    // Internals: what a claimed key continues from

    /// The record's snapshot becomes the key's, with the retention the record carries.
    fn take_recorded_snapshot(&mut self, k: KeyIx, recorded: RecordedSnapshot) {
        let retain = self.config.release.tiers().retain;
        let slot = &mut self.keys[k];
        debug_assert!(slot.snapshot.is_none() && slot.retain.is_none());
        slot.snapshot = Some((recorded.snapshot, recorded.by));
        if let Some(retain) = retain {
            let at = recorded.retain_until.unwrap_or(self.now + retain);
            // A retention that already passed ends at the next timer check, in order.
            let at = self.timers.set(at.max(self.now), Timer::Retain(k));
            self.keys[k].retain = Some(at);
        }
    }

    /// Adopts the warm sandbox `id` the key's last owner handed over: tracked as starting, its
    /// Adopt ordered; the key's calls bind to it as to a start.
    fn adopt(&mut self, k: KeyIx, id: SandboxId, token: Token) {
        if self.adopt_sandbox(k, id, token).is_none() {
            // Still tracked here: adopted once forgotten (`may_bind`, `adopt_left`). Its
            // record counts as this key slot's from now on (the slot it had may have gone with
            // the key's last calls): forgetting it admits this slot's calls.
            self.keys[k].left = Some(id);
            if let Some(sandbox) = self.sandboxes.find(id) {
                self.sandboxes[sandbox].key = k;
            }
        }
        self.admit(k);
    }

    /// Fleet mode: the owned key's sandbox left as it is (`KeySlot::left`) is adopted for the
    /// call binding now, as its next owner would adopt it: the sandbox it binds to, if it could
    /// be tracked again.
    pub(crate) fn adopt_left(&mut self, k: KeyIx) -> Option<SandboxIx> {
        let Own::Owned(Held { token, .. }) = self.keys[k].own else {
            return None;
        };
        let id = self.keys[k].left.take()?;
        tracing::debug!(sandbox = %id, "adopting the key's sandbox left as it was");
        // Left in this very input, its record is still here, done with (the input's end would
        // forget it): forgotten now, so that it can be tracked anew.
        if let Some(sandbox) = self.sandboxes.find(id) {
            let old = &self.sandboxes[sandbox];
            if old.state() == SandboxState::Dead
                && old.bound.is_empty()
                && old.awaiting() == Awaiting::Nothing
            {
                self.sandboxes.remove(sandbox);
            }
        }
        self.adopt_sandbox(k, id, token)
    }

    /// An Adopt went unanswered in time: the sandbox still holds its key's history (the answer
    /// may only be late: this process paused, or the backend is slow), so the Adopt is ordered
    /// again, its calls still bound, up to [`WAY_DOWN_ATTEMPTS`](crate::WAY_DOWN_ATTEMPTS) in
    /// all. Whether it was (the driver dropped the first at its deadline).
    pub(crate) fn adopt_again(&mut self, sandbox: SandboxIx) -> bool {
        let entry = &mut self.sandboxes[sandbox];
        let Some(token) = entry.token.filter(|_| entry.is_adopted()) else {
            return false;
        };
        if !entry.adopt_again(crate::WAY_DOWN_ATTEMPTS) {
            return false;
        }
        let (id, k) = (entry.id, entry.key);
        let deadline = self.set_sandbox_timer(sandbox, self.config.start_timeout);
        tracing::debug!(sandbox = %id, %token, "adopt unanswered: ordered again");
        self.out.commands.push_back(Command::Adopt {
            sandbox: id,
            key: self.keys[k].key.clone(),
            token,
            deadline,
        });
        true
    }

    /// [`adopt`](Self::adopt)'s work, without admitting the key's waiters: the sandbox, or
    /// none when this process still tracks that id (it handed the sandbox over and still has
    /// it on its way out, or relinquished it when it lost the key and its lost calls are not
    /// released yet: not adoptable twice).
    fn adopt_sandbox(&mut self, k: KeyIx, id: SandboxId, token: Token) -> Option<SandboxIx> {
        let Some(sandbox) = self.sandboxes.adopt(id, k) else {
            tracing::warn!(sandbox = %id, "handed-over sandbox still tracked here: not adopted");
            return None;
        };
        self.out.stats.adoptions_ordered += 1;
        self.sandboxes[sandbox].token = Some(token);
        self.keys[k].current = Some(sandbox);
        let deadline = self.set_sandbox_timer(sandbox, self.config.start_timeout);
        tracing::debug!(sandbox = %id, %token, "adopt");
        self.out.commands.push_back(Command::Adopt {
            sandbox: id,
            key: self.keys[k].key.clone(),
            token,
            deadline,
        });
        Some(sandbox)
    }

    /// An adopted sandbox could not be taken over (gone, failed, late): its calls, taken off
    /// it, queue first for the key again (in name order, each with its wait timeout), to bind
    /// to a new start of the key instead of failing.
    pub(crate) fn requeue_after_failed_adoption(&mut self, k: KeyIx, calls: Few<CallIx>) {
        let calls = self.calls.by_name_order(calls);
        self.keys[k].bound -= calls.len() as u32;
        for &call in calls.iter().rev() {
            let at = self.now + self.config.wait_timeout;
            let deadline = self.timers.set(at, Timer::Wait(call));
            self.calls[call].state = crate::call::CallState::Waiting { deadline };
            self.calls.waiting += 1;
            self.keys[k].waiters.push_front(call);
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals: letting go

    /// The key's state changed: forget it when nothing is left of it; release it when this
    /// process owns it and is done with it (see the module's rules).
    ///
    /// Outside fleet mode this is a test or two, kept inline: a key owned here is settled out
    /// of line in `owned_key_settles`.
    #[inline(always)]
    pub(crate) fn key_settles(&mut self, k: KeyIx) {
        let Some(slot) = self.keys.get(k) else {
            return;
        };
        if let Own::Owned(_) = slot.own {
            self.owned_key_settles(k);
        } else if slot.is_empty() {
            self.keys.forget(k);
        }
    }

    /// [`key_settles`](Self::key_settles) for a key this process owns.
    fn owned_key_settles(&mut self, k: KeyIx) {
        let slot = &self.keys[k];
        let quiet = slot.bound == 0 && slot.waiters.is_empty() && slot.retiring.is_none();
        if slot.store_at.is_some() {
            return;
        }
        if !quiet {
            self.record_if_changed(k);
            return;
        }
        let closing = self.is_closing();
        let wanted = matches!(slot.own, Own::Owned(Held { wanted: true, .. }));
        match slot.current {
            None if wanted || slot.snapshot.is_none() || closing => self.release_key(k, None),
            Some(sandbox) if wanted && self.sandboxes[sandbox].state() == SandboxState::Idle => {
                // Handed over: drained first, like any way down; `end_drain` hands it over
                // warm rather than stopping it, or suspends it for the key's record
                // ([`Handover`](crate::fleet::Handover)).
                tracing::debug!(sandbox = %self.sid(sandbox), "wanted elsewhere: draining to hand over");
                self.begin_drain(sandbox);
            }
            _ => self.record_if_changed(k),
        }
    }

    /// How the drained `sandbox` goes to another process, if it does: its key is owned here,
    /// wanted elsewhere, and none of this process's calls wants it. Warm, it is released in
    /// the key's record as it is; suspended, it goes down suspended whatever the policy, and
    /// the key is released with its snapshot (`Fleet::handover`).
    pub(crate) fn handing_over(&self, sandbox: SandboxIx) -> Option<Handover> {
        let entry = &self.sandboxes[sandbox];
        let slot = &self.keys[entry.key];
        let handing = matches!(slot.own, Own::Owned(Held { wanted: true, .. }))
            && slot.store_at.is_none()
            && slot.bound == 0
            && slot.waiters.is_empty()
            && slot.retiring.is_none()
            && entry.state() == SandboxState::Draining;
        let fleet = self.config.fleet.as_ref()?;
        handing.then_some(fleet.handover)
    }

    /// Orders the release of the owned key `k` with its record: its snapshot, and the drained
    /// sandbox `warm` when it is handed over.
    pub(crate) fn release_key(&mut self, k: KeyIx, warm: Option<SandboxIx>) {
        let Own::Owned(held) = self.keys[k].own else {
            unreachable!("release of a key this process does not own")
        };
        let token = held.token;
        let live = self.liveness.as_mut().expect("fleet");
        let release = ReleaseId(live.next_release);
        live.next_release += 1;
        let deadline = self.now + self.config.command_timeout;
        if let Some(sandbox) = warm {
            debug_assert_eq!(self.sandboxes[sandbox].state(), SandboxState::HandingOver);
            self.way_down().cancel_sandbox_timer(sandbox);
        }
        let slot = &mut self.keys[k];
        let record = KeyRecord {
            snapshot: slot
                .snapshot
                .as_ref()
                .map(|(snapshot, by)| RecordedSnapshot {
                    snapshot: snapshot.clone(),
                    by: *by,
                    retain_until: slot.retain.map(|at| at.at),
                }),
            warm: warm.map(|sandbox| self.sandboxes[sandbox].id).or(slot.left),
        };
        slot.own = Own::Releasing(release, held);
        tracing::debug!(%release, key = %slot.key, ?record, "release key");
        if let (Some(recorded), Some(report)) = (&record.snapshot, self.close.report_mut()) {
            // Close lets the key go with its snapshot: reported, with its retention.
            report.retained.retain(|r| r.key != slot.key);
            report.retained.push(crate::event::Retained {
                key: slot.key.clone(),
                snapshot: recorded.snapshot.clone(),
                until: recorded.retain_until,
            });
        }
        self.out.stats.releases_ordered += 1;
        self.out.store.push_back(StoreCommand::Release {
            release,
            key: slot.key.clone(),
            token,
            record,
            deadline,
        });
        self.set_key_store_timer(k, deadline);
    }

    /// A release was answered (or its deadline passed: `Failed`).
    fn release_answered(
        &mut self,
        now: Instant,
        release: ReleaseId,
        key: &Key,
        how: Written,
    ) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("release answer")?;
        let unknown = Error::UnknownStoreWork {
            what: "release",
            id: release.0,
        };
        let live = self.liveness.as_ref().ok_or(unknown.clone())?;
        if release.0 >= live.next_release {
            return Err(unknown);
        }
        let Some(k) = self
            .keys
            .find(key)
            .filter(|k| matches!(self.keys[*k].own, Own::Releasing(r, _) if r == release))
        else {
            tracing::debug!(%release, key = %key, "stale release answer ignored");
            self.out.stats.stale_answers += 1;
            return Ok(());
        };
        self.advance(now);
        self.cancel_key_store_timer(k);
        self.release_ended(k, how);
        self.finish_input();
        Ok(())
    }

    fn release_ended(&mut self, k: KeyIx, how: Written) {
        let Own::Releasing(release, held) = self.keys[k].own else {
            unreachable!("an awaited release")
        };
        let handed = self.keys[k]
            .current
            .filter(|sandbox| self.sandboxes[*sandbox].state() == SandboxState::HandingOver);
        tracing::debug!(%release, key = %self.keys[k].key, ?how, "release answered");
        match how {
            Written::Failed => {
                self.out.stats.releases_failed += 1;
                self.keys[k].own = Own::Owned(held);
                self.retry_later(k);
                // In doubt (an earlier attempt may have landed), nothing is taken back.
                if !held.doubtful {
                    if let Some(sandbox) = handed {
                        // Warm again: bound at once by a call of the key that came meanwhile.
                        self.sandboxes[sandbox].idle();
                        let idle = self.config.release.tiers().idle;
                        self.set_sandbox_timer(
                            sandbox,
                            idle.max(std::time::Duration::from_nanos(1)),
                        );
                    }
                    self.admit(k);
                }
            }
            Written::Done | Written::Fenced => {
                if how == Written::Done {
                    self.out.stats.keys_released += 1;
                } else {
                    self.out.stats.releases_fenced += 1;
                }
                let slot = &mut self.keys[k];
                slot.own = Own::Unclaimed;
                slot.record.forgotten();
                // The record holds the snapshot now (or the new owner's record does): the key
                // here no longer references it, and never discards it. So with a sandbox left.
                slot.snapshot = None;
                slot.left = None;
                if let Some(at) = slot.retain.take() {
                    self.timers.cancel(at);
                }
                if let Some(sandbox) = handed {
                    self.relinquish(sandbox, DropReason::SandboxGone);
                }
                if !self.keys[k].waiters.is_empty() && !self.is_closing() {
                    self.claim(k);
                }
            }
        }
        self.key_settles(k);
    }

    /// The sandbox is no longer this process's to drive: `Relinquish` is its last command (it
    /// drops whatever is outstanding); uploads still in flight into it are dropped with
    /// `reason`. Its record goes once no call is bound to it.
    pub(crate) fn relinquish(&mut self, sandbox: SandboxIx, reason: DropReason) {
        let entry = &mut self.sandboxes[sandbox];
        entry.relinquished();
        let id = entry.id;
        self.way_down().cancel_sandbox_timer(sandbox);
        self.mirror().leave_uploads(sandbox, reason);
        tracing::debug!(sandbox = %id, "relinquish");
        self.out
            .commands
            .push_back(Command::Relinquish { sandbox: id });
        self.reconcile.sandbox(sandbox);
    }

    // ------------------------------------------------------------------------------------------
    // Internals: fencing

    /// This process lost `k` (see [`Event::KeyFenced`]): fail closed. Nothing more is ordered
    /// under the key's token: its sandboxes are relinquished, not shut down (the key's next owner
    /// adopts or sweeps them), its starting calls fail with `fenced`, its ready calls lose their
    /// sandbox, its uploads are dropped with `fenced`. Calls of the key still waiting claim it
    /// again when the lease allows.
    pub(crate) fn fence_key(&mut self, k: KeyIx, reason: FenceReason) {
        let Some(token) = self.keys[k].token() else {
            return;
        };
        tracing::warn!(key = %self.keys[k].key, %token, ?reason, "key fenced");
        self.out.stats.fences += 1;
        self.cancel_key_store_timer(k);
        let slot = &mut self.keys[k];
        slot.own = Own::Unclaimed;
        slot.record.forgotten();
        slot.current = None;
        slot.retiring = None;
        slot.snapshot = None;
        slot.left = None;
        if let Some(at) = slot.retain.take() {
            self.timers.cancel(at);
        }
        let key = slot.key.clone();
        self.out
            .events
            .push_back(Event::KeyFenced { key, token, reason });
        // Every sandbox of the key driven under this token whose last command is not ordered
        // yet, in id order (rare: a scan). One whose Shutdown is out already keeps it.
        let fenced = self.sandboxes.in_id_order(|sandbox| {
            sandbox.key == k && sandbox.token == Some(token) && !sandbox.shutdown_ordered()
        });
        for sandbox in fenced {
            let starting = self.sandboxes[sandbox].state() == SandboxState::Starting;
            let bound: Few<CallIx> = self.sandboxes[sandbox].bound.to_few();
            for call in bound.iter() {
                let session = self.calls[*call].session;
                self.sessions[session].stale = true;
            }
            if starting {
                // Its calls fail: the sandbox is no longer this process's to start.
                for call in self.calls.by_name_order(bound) {
                    self.end_call(call, crate::call::EndHow::Failed(ErrorKind::Fenced));
                }
            } else {
                for call in self.calls.by_name_order(bound) {
                    self.out.events.push_back(Event::SandboxLost {
                        call: self.calls[call].id.clone(),
                        sandbox: self.sid(sandbox),
                    });
                }
            }
            self.relinquish(sandbox, DropReason::Fenced);
        }
        if let Some(slot) = self.keys.get(k) {
            let mut waiting = Few::<SessionIx>::new();
            for call in &slot.waiters {
                let session = self.calls[*call].session;
                if !waiting.contains(&session) {
                    waiting.push(session);
                }
            }
            for session in self.sessions.by_name_order(waiting) {
                self.mirror().fenced_waiting(session);
            }
        }
        if self
            .keys
            .get(k)
            .is_some_and(|slot| !slot.waiters.is_empty())
            && !self.is_closing()
        {
            // Its queued calls claim it again: at once when the lease is still valid (a
            // refusal; the store records the want, and the new owner hands the key back once
            // its own calls end), else once it is (a lapse: `claim_waiting_keys`).
            self.claim(k);
        }
        self.admit(k);
        self.key_settles(k);
    }

    /// The lease lapsed: every key owned under it is fenced, in key order.
    pub(crate) fn fence_all(&mut self) {
        let mut keys: Vec<(Key, KeyIx)> = self
            .keys
            .iter()
            .filter(|(_, slot)| slot.token().is_some())
            .map(|(k, slot)| (slot.key.clone(), k))
            .collect();
        keys.sort_unstable();
        for (_, k) in keys {
            self.fence_key(k, FenceReason::LeaseLapsed);
        }
    }

    /// Close, once every sandbox is gone: releases every key this process owns, with its
    /// record (its snapshot), so that the next owner need not wait for this process's lease to
    /// expire; drops claims made again later. Whether no store work is left.
    pub(crate) fn keys_let_go_for_close(&mut self) -> bool {
        if self.liveness.is_none() {
            return true;
        }
        let mut keys: Vec<(Key, KeyIx)> = self
            .keys
            .iter()
            .filter(|(_, slot)| slot.own != Own::Local)
            .map(|(k, slot)| (slot.key.clone(), k))
            .collect();
        if keys.is_empty() {
            return true;
        }
        keys.sort_unstable();
        let mut settled = true;
        for (_, k) in keys {
            match self.keys[k].own {
                Own::Busy => {
                    self.cancel_key_store_timer(k);
                    self.keys[k].own = Own::Unclaimed;
                    self.keys.forget_if_empty(k);
                }
                Own::Owned(_) if self.keys[k].store_at.is_none() => {
                    self.release_key(k, None);
                    settled = false;
                }
                Own::Unclaimed | Own::Local => {}
                Own::Owned(_) | Own::Claiming(..) | Own::Releasing(..) => settled = false,
            }
        }
        settled
    }

    /// Other processes want these keys. One this process owns is handed over once its calls
    /// end; one it does not know it owns (a claim confirmed after the core stopped waiting for
    /// it) is claimed, and so released at once: never stranded while this process lives.
    pub(crate) fn note_wanted(&mut self, wanted: &[Key]) {
        for key in wanted {
            if !self.is_fleet_key(key) || self.is_closing() {
                continue;
            }
            let k = self.keys.find_or_insert(key.clone());
            let slot = &mut self.keys[k];
            match &mut slot.own {
                Own::Owned(held) => {
                    if !held.wanted {
                        tracing::debug!(key = %key, "wanted by another process");
                        held.wanted = true;
                        self.key_settles(k);
                    }
                }
                Own::Local | Own::Unclaimed => {
                    slot.own = Own::Unclaimed;
                    self.claim(k);
                    self.key_settles(k);
                }
                Own::Busy | Own::Claiming(..) | Own::Releasing(..) => {}
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals: the durable record of an owned key

    /// What the store's record of the owned key `k` should say now: its snapshot, and its
    /// sandbox once that sandbox is up (and until it goes down).
    fn durable_record(&self, k: KeyIx) -> KeyRecord {
        let slot = &self.keys[k];
        // A resume under way continues from the snapshot it took: the record names it (the
        // backends find it where the start put it), so a process that ends meanwhile leaves
        // the next owner the key's history, not a sandbox it suspended since.
        let resuming = slot
            .current
            .filter(|sandbox| {
                let entry = &self.sandboxes[*sandbox];
                entry.state() == SandboxState::Starting && entry.awaiting() != Awaiting::Record
            })
            .and_then(|sandbox| self.sandboxes[sandbox].resumed());
        if let Some((snapshot, by)) = resuming {
            return KeyRecord {
                snapshot: Some(RecordedSnapshot {
                    snapshot: snapshot.clone(),
                    by,
                    retain_until: None,
                }),
                warm: None,
            };
        }
        KeyRecord {
            snapshot: slot
                .snapshot
                .as_ref()
                .map(|(snapshot, by)| RecordedSnapshot {
                    snapshot: snapshot.clone(),
                    by: *by,
                    retain_until: slot.retain.map(|at| at.at),
                }),
            // Up, or up and waiting for this record before its calls are ready.
            warm: slot
                .current
                .filter(|sandbox| {
                    let entry = &self.sandboxes[*sandbox];
                    entry.accepts_uploads() || entry.awaiting() == Awaiting::Record
                })
                .map(|sandbox| self.sandboxes[sandbox].id)
                .or(slot.left),
        }
    }

    /// Orders a write of the owned key's durable record when what it should say changed, the
    /// lease is valid and no store work for the key is under way or due (its end settles the
    /// key again, which comes back here). Not while a sandbox of the key is on its way down: its
    /// end settles the key, which then releases it (the record goes with the release) or writes
    /// the record once, with the snapshot the way down kept.
    ///
    /// Outside fleet mode no key is owned: one test, kept inline; the work is out of line in
    /// `record_owned_if_changed`.
    #[inline]
    pub(crate) fn record_if_changed(&mut self, k: KeyIx) {
        if self.liveness.is_some() {
            self.record_owned_if_changed(k);
        }
    }

    /// [`record_if_changed`](Self::record_if_changed)'s work, in fleet mode.
    fn record_owned_if_changed(&mut self, k: KeyIx) {
        let Some(slot) = self.keys.get(k) else {
            return;
        };
        let Own::Owned(Held {
            token, doubtful, ..
        }) = slot.own
        else {
            return;
        };
        if slot.store_at.is_some()
            || doubtful
            || slot.record.is_writing()
            || slot
                .retiring
                .is_some_and(|sandbox| self.sandboxes[sandbox].awaiting() != Awaiting::Record)
            || slot.current.is_some_and(|sandbox| {
                let entry = &self.sandboxes[sandbox];
                entry.state() == SandboxState::Starting
                    && entry.resumed().is_none()
                    && entry.awaiting() != Awaiting::Record
            })
        {
            // Not while its sandbox is on its way up either, unless it resumes: an adoption (or
            // a fresh start) continues from what the record names, which must stay there until
            // the sandbox is up (and then names it), should this process end meanwhile. A
            // resume names the snapshot it took (`durable_record`).
            return;
        }
        let record = self.durable_record(k);
        if self.keys[k].record.says(&record) {
            return;
        }
        let now = self.now;
        let timeout = self.config.command_timeout;
        let live = self.liveness.as_mut().expect("fleet");
        if !live.is_valid(now) {
            return; // the lapse fences the key
        }
        let recording = RecordingId(live.next_recording);
        live.next_recording += 1;
        let deadline = (now + timeout).min(live.valid_until.expect("valid"));
        self.out.stats.records_ordered += 1;
        let slot = &mut self.keys[k];
        tracing::debug!(%recording, key = %slot.key, ?record, "record key");
        slot.record.write(recording, record.clone());
        self.out.store.push_back(StoreCommand::Record {
            recording,
            key: slot.key.clone(),
            token,
            record,
            deadline,
        });
        self.set_key_store_timer(k, deadline);
    }

    /// Whether the store's record of the owned key `k` may name `sandbox` warm: the record it
    /// confirmed does, or a write of it under way does. A sandbox so named is not shut down
    /// before a write that no longer names it is confirmed (`Awaiting::Record`).
    pub(crate) fn record_may_name(&self, k: KeyIx, sandbox: SandboxId) -> bool {
        let slot = &self.keys[k];
        matches!(slot.own, Own::Owned(_)) && slot.record.may_name(sandbox)
    }

    /// Fleet mode: whether the sandbox, up for calls of an owned key whose confirmed record
    /// does not name it, waits for the record write that does (`Awaiting::Record`, still
    /// starting) before its calls are ready. What those calls do is acknowledged only once the
    /// key's next owner, should this process end, would continue from this sandbox: before,
    /// a process that ended left a record naming the key's last sandbox or snapshot, and the
    /// next owner started from there without the acknowledged work.
    pub(crate) fn waits_for_record(&mut self, sandbox: SandboxIx) -> bool {
        let entry = &self.sandboxes[sandbox];
        let (k, id) = (entry.key, entry.id);
        if entry.bound.is_empty()
            || !matches!(self.keys[k].own, Own::Owned(_))
            || self.keys[k].record.confirmed().warm == Some(id)
        {
            return false;
        }
        tracing::debug!(sandbox = %id, "up: its calls wait for the key's record to name it");
        self.sandboxes[sandbox].await_record();
        self.record_if_changed(k);
        true
    }

    /// A record write of `k` was confirmed. The key's sandbox waiting for it on the way up
    /// comes up once the record names it; its retiring sandbox, persisted and held back while
    /// the record named it, is shut down (or left suspended, for the key's next start to take)
    /// once no record may name it any more.
    fn record_confirmed(&mut self, k: KeyIx) {
        let slot = &self.keys[k];
        if let Some(sandbox) = slot.current.filter(|sandbox| {
            self.sandboxes[*sandbox].awaiting() == Awaiting::Record
                && slot.record.confirmed().warm == Some(self.sandboxes[*sandbox].id)
        }) {
            self.sandboxes[sandbox].answered();
            self.up(sandbox);
        }
        let Some(sandbox) = self.keys.get(k).and_then(|slot| slot.retiring) else {
            return;
        };
        if self.sandboxes[sandbox].awaiting() == Awaiting::Record
            && !self.record_may_name(k, self.sandboxes[sandbox].id)
        {
            self.persisted(sandbox);
        }
    }

    /// A record write was answered.
    fn record_answered(
        &mut self,
        now: Instant,
        recording: RecordingId,
        key: &Key,
        how: Written,
    ) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("record answer")?;
        let unknown = Error::UnknownStoreWork {
            what: "record",
            id: recording.0,
        };
        let live = self.liveness.as_ref().ok_or(unknown.clone())?;
        if recording.0 >= live.next_recording {
            return Err(unknown);
        }
        let Some(k) = self.keys.find(key).filter(|k| {
            self.keys[*k].record.writes(recording) && matches!(self.keys[*k].own, Own::Owned(_))
        }) else {
            tracing::debug!(%recording, key = %key, "stale record answer ignored");
            self.out.stats.stale_answers += 1;
            return Ok(());
        };
        self.advance(now);
        self.cancel_key_store_timer(k);
        match how {
            Written::Done => {
                self.out.stats.records_ok += 1;
                self.keys[k].record.written();
                self.record_confirmed(k);
                self.key_settles(k);
                self.admit(k);
            }
            Written::Failed => {
                tracing::warn!(%recording, key = %key, "record failed");
                self.keys[k].record.failed();
                self.out.stats.records_failed += 1;
                self.retry_later(k);
                self.admit(k);
            }
            Written::Fenced => {
                self.out.stats.records_fenced += 1;
                self.fence_key(k, FenceReason::Refused);
            }
        }
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Internals: the key's store timer

    /// `Timer::KeyStore`: a claim or release deadline passed, or a retry is due.
    pub(crate) fn key_store_due(&mut self, k: KeyIx) {
        self.keys[k].store_at = None;
        match self.keys[k].own {
            Own::Claiming(claim, _) => {
                tracing::debug!(%claim, "claim unanswered in time");
                self.out.stats.claims_failed += 1;
                self.claim_again_later(k);
            }
            Own::Busy => {
                self.keys[k].own = Own::Unclaimed;
                if self
                    .keys
                    .get(k)
                    .is_some_and(|slot| !slot.waiters.is_empty())
                {
                    self.claim(k);
                }
                self.key_settles(k);
            }
            Own::Releasing(release, held) => {
                // No answer in time: the release may have landed or not. Ask again, with the same
                // token and record: if the first landed, the store refuses this one (the key is
                // no longer this process's) and the answer says fenced; a sandbox being handed
                // over stays so meanwhile, and nothing binds to the key.
                tracing::debug!(%release, "release unanswered in time: asked again");
                self.out.stats.releases_failed += 1;
                self.keys[k].own = Own::Owned(Held {
                    doubtful: true,
                    ..held
                });
                self.release_again(k);
            }
            Own::Owned(Held { doubtful: true, .. }) => self.release_again(k),
            Own::Owned(_) => {
                if let Some(recording) = self.keys[k].record.unanswered() {
                    // No answer in time. Written again with a newer number: if this one lands
                    // late, the store keeps the newer.
                    tracing::debug!(%recording, "record unanswered in time");
                    self.out.stats.records_failed += 1;
                }
                self.key_settles(k);
                self.admit(k);
            }
            Own::Local | Own::Unclaimed => unreachable!("no store timer without store work"),
        }
    }

    /// Asks again for a release whose outcome is in doubt, with the sandbox being handed over.
    fn release_again(&mut self, k: KeyIx) {
        let handed = self.keys[k]
            .current
            .filter(|sandbox| self.sandboxes[*sandbox].state() == SandboxState::HandingOver);
        self.release_key(k, handed);
    }

    fn set_key_store_timer(&mut self, k: KeyIx, at: Instant) {
        self.cancel_key_store_timer(k);
        let at = self.timers.set(at, Timer::KeyStore(k));
        self.keys[k].store_at = Some(at);
    }

    fn cancel_key_store_timer(&mut self, k: KeyIx) {
        if let Some(at) = self.keys[k].store_at.take() {
            self.timers.cancel(at);
        }
    }
}
