//! This process's lease in fleet mode: ordering its renewals on a timer of their own, counting
//! it valid by the core's clock, and noticing when it lapsed.
//!
//! ```text
//!   Timer::Renew (every renew_every, whatever else happens)
//!        │ StoreCommand::Renew { renewal, epoch, deadline = sent + lease - margin }
//!        ▼
//!   handle_renewed(renewal) ── valid until max(valid, sent + lease - margin) ──▶ Timer::Lapse
//!                                                                                   │ passed
//!                                                                                   ▼
//!                               lapsed: epoch + 1, nothing of the old epoch is this process's
//! ```

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::fleet::{Fleet, RenewalId, StoreCommand};
use crate::ids::Key;
use crate::lifecycle::Lifecycle;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef};

/// The process lease as the core counts it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Liveness {
    /// The fleet timing.
    pub(crate) fleet: Fleet,
    /// The lease epoch renewals carry; it grows at every lapse.
    pub(crate) epoch: u64,
    /// Until when the lease is valid by the core's clock; `None` before the first confirmation
    /// of the epoch.
    pub(crate) valid_until: Option<Instant>,
    /// The lapse timer, at `valid_until`.
    pub(crate) lapse: Option<TimerRef>,
    /// The next renewal's timer. Always set while the core is open.
    pub(crate) renew: Option<TimerRef>,
    /// Renewals ordered and not answered, oldest first, with the instant each was ordered.
    /// Bounded: one whose confirmation could no longer extend the lease is dropped, so there
    /// are at most `(lease - margin) / renew_every + 1`.
    pub(crate) in_flight: VecDeque<(RenewalId, Instant)>,
    /// The next renewal's number.
    pub(crate) next_renewal: u64,
    /// The next claim's number.
    pub(crate) next_claim: u64,
    /// The next release's number.
    pub(crate) next_release: u64,
    /// The next record write's number.
    pub(crate) next_recording: u64,
}

impl Liveness {
    /// The lease of a process that has not renewed yet: its first renewal is due at once.
    pub(crate) fn new(fleet: Fleet) -> Self {
        Liveness {
            fleet,
            epoch: 1,
            valid_until: None,
            lapse: None,
            renew: None,
            in_flight: VecDeque::new(),
            next_renewal: 0,
            next_claim: 0,
            next_release: 0,
            next_recording: 0,
        }
    }

    /// Whether the lease is valid at `now` by the core's clock (the margin already taken off).
    pub(crate) fn is_valid(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|until| now < until)
    }
}

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Store inputs

    /// The store confirmed the renewal: the lease is valid until the renewal's ordering instant
    /// plus `lease - margin`, unless a later confirmation says longer. A renewal the core no
    /// longer awaits (past its deadline, of an epoch that lapsed, superseded by a later one's
    /// confirmation) is stale and ignored.
    ///
    /// Errors: `UnknownStoreWork` for a renewal never ordered, `Closed` after close finished.
    /// `wanted` are the keys this process owns in the store's eyes that other processes want:
    /// each is handed over once this process's calls on it end.
    pub fn handle_renewed(
        &mut self,
        now: Instant,
        renewal: RenewalId,
        wanted: &[Key],
    ) -> Result<(), Error> {
        self.time_passes(now);
        self.check_renewal(renewal)?;
        // A lease that ran out lapses first; then this renewal, of the old epoch, is stale.
        self.advance(now);
        let Some(sent) = self.renewal_answered(renewal) else {
            self.finish_input();
            return Ok(());
        };
        let live = self.liveness.as_mut().expect("a renewal was ordered");
        let was_valid = live.is_valid(self.now);
        let until = sent + live.fleet.valid_for();
        if until <= self.now {
            tracing::debug!(%renewal, "renewal confirmed too late to count");
            self.out.stats.stale_answers += 1;
        } else {
            self.out.stats.renewals_ok += 1;
            // Renewals are answered in the order they were sent (an older one answered after a
            // newer is stale), so a confirmed one extends the lease unless both were sent at
            // the same instant.
            if live.valid_until.is_none_or(|valid| valid < until) {
                live.valid_until = Some(until);
                if let Some(old) = live.lapse.take() {
                    self.timers.cancel(old);
                }
                let at = self.timers.set(until, Timer::Lapse);
                self.liveness.as_mut().expect("fleet").lapse = Some(at);
                tracing::trace!(%renewal, until = %until, "lease renewed");
            }
        }
        if self.liveness.as_ref().expect("fleet").is_valid(self.now) {
            if !was_valid {
                self.claim_waiting_keys();
            }
            self.note_wanted(wanted);
        }
        self.finish_input();
        Ok(())
    }

    /// The store refused or failed the renewal. The lease stays valid as long as an earlier
    /// confirmation says; the next renewal comes on its own timer.
    ///
    /// Errors: as [`handle_renewed`](Self::handle_renewed).
    pub fn handle_renew_failed(&mut self, now: Instant, renewal: RenewalId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_renewal(renewal)?;
        self.advance(now);
        if self.renewal_answered(renewal).is_some() {
            tracing::warn!(%renewal, "lease renewal failed");
            self.out.stats.renewals_failed += 1;
        }
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Getters

    /// Until when this process's lease is valid by the core's clock, in fleet mode, once a
    /// renewal of the current epoch was confirmed.
    pub fn lease_valid_until(&self) -> Option<Instant> {
        self.liveness.as_ref().and_then(|l| l.valid_until)
    }

    /// The current lease epoch in fleet mode (1 until the first lapse).
    pub fn lease_epoch(&self) -> Option<u64> {
        self.liveness.as_ref().map(|l| l.epoch)
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// Sets the first renewal's timer, due at once (at construction).
    pub(crate) fn begin_liveness(&mut self) {
        if let Some(live) = self.liveness.as_mut() {
            debug_assert!(live.renew.is_none());
            live.renew = Some(self.timers.set(Instant::ZERO, Timer::Renew));
        }
    }

    /// `Timer::Renew`: orders a renewal and sets the next one's timer.
    pub(crate) fn renew_due(&mut self) {
        let now = self.now;
        let live = self.liveness.as_mut().expect("renew timer in fleet mode");
        let valid_for = live.fleet.valid_for();
        // A renewal ordered so long ago that its confirmation could not extend the lease is
        // no longer awaited (it is past its deadline).
        while live
            .in_flight
            .front()
            .is_some_and(|(_, sent)| *sent + valid_for <= now)
        {
            live.in_flight.pop_front();
        }
        let renewal = RenewalId(live.next_renewal);
        live.next_renewal += 1;
        live.in_flight.push_back((renewal, now));
        assert!(
            live.in_flight.len() as u128
                <= valid_for.as_nanos() / live.fleet.renew_every.as_nanos().max(1) + 1,
            "renewals in flight are bounded by the lease over the renewal period"
        );
        let epoch = live.epoch;
        let next = now + live.fleet.renew_every;
        self.out.stats.renewals_ordered += 1;
        self.out.store.push_back(StoreCommand::Renew {
            renewal,
            epoch,
            deadline: now + valid_for,
        });
        let at = self.timers.set(next, Timer::Renew);
        self.liveness.as_mut().expect("fleet").renew = Some(at);
    }

    /// `Timer::Lapse`: no renewal was confirmed in time. Whatever the old epoch held is no
    /// longer this process's; a renewal of the new epoch is ordered at once.
    pub(crate) fn lapsed(&mut self) {
        let live = self.liveness.as_mut().expect("lapse timer in fleet mode");
        tracing::warn!(epoch = live.epoch, "process lease lapsed");
        live.lapse = None;
        live.valid_until = None;
        live.epoch += 1;
        live.in_flight.clear();
        self.out.stats.lease_lapses += 1;
        if let Some(old) = live.renew.take() {
            self.timers.cancel(old);
        }
        // Fail closed: nothing more is ordered under a token of the old epoch.
        self.fence_all();
        self.renew_due();
    }

    /// Refuses an answer for a renewal never ordered, or after close.
    fn check_renewal(&self, renewal: RenewalId) -> Result<(), Error> {
        self.check_not_closed("renewal answer")?;
        let unknown = Error::UnknownStoreWork {
            what: "renewal",
            id: renewal.0,
        };
        let live = self.liveness.as_ref().ok_or(unknown.clone())?;
        if renewal.0 >= live.next_renewal {
            return Err(unknown);
        }
        Ok(())
    }

    /// The instant the answered renewal was ordered, when it is still awaited (and is no longer
    /// afterwards, nor any renewal ordered before it).
    fn renewal_answered(&mut self, renewal: RenewalId) -> Option<Instant> {
        let live = self.liveness.as_mut().expect("checked");
        let Some(at) = live.in_flight.iter().position(|(r, _)| *r == renewal) else {
            tracing::debug!(%renewal, "stale renewal answer ignored");
            self.out.stats.stale_answers += 1;
            return None;
        };
        let sent = live.in_flight[at].1;
        live.in_flight.drain(..=at);
        Some(sent)
    }
}
