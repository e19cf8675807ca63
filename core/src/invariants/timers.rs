//! The timer table: every deadline a record keeps is live in it, nothing else is, and its next
//! deadline is a live one (`timers`, `lease`).

use super::{Tally, Violation};
use crate::close::CloseState;
use crate::lifecycle::Lifecycle;

impl Lifecycle {
    /// The timer table against `expected_timers`, the deadlines the other tables' records keep (the
    /// close's and the lease's are counted here).
    pub(super) fn check_timers(&self, mut expected_timers: usize) -> Result<(), Violation> {
        if matches!(
            self.close,
            CloseState::Draining { .. } | CloseState::Revoked { .. }
        ) {
            expected_timers += 1;
        }
        if let Some(live) = &self.liveness {
            // Fleet: the renewal timer is always set while open; the lapse timer exactly while
            // the lease is valid, at its end.
            ensure!(
                live.renew.is_some() && live.lapse.map(|at| at.at) == live.valid_until,
                "lease",
                "renewal timer {:?}, lapse timer {:?}, valid until {:?}",
                live.renew,
                live.lapse,
                live.valid_until
            );
            expected_timers +=
                usize::from(live.renew.is_some()) + usize::from(live.lapse.is_some());
        }
        // Every deadline a record keeps is in the table: each live entry of the table is one
        // record's deadline (its owner keeps that very entry, and entries are told apart by
        // their sequence number, checked distinct), so as many live entries as deadlines known
        // means every deadline has its entry.
        let mut live = Tally::default();
        for (at, timer) in self.timers.iter() {
            if self.timer_is_live(at, timer) {
                live.add(at);
            }
        }
        live.sort();
        ensure!(
            expected_timers == live.len(),
            "timers",
            "{} live timers in the table, {expected_timers} deadlines known",
            live.len()
        );
        ensure!(
            live.distinct(),
            "timers",
            "a deadline is in the table twice"
        );
        if let Some(next) = self.timers.next() {
            // The tally is sorted by deadline: its first entry is the earliest live one.
            let earliest_live = live.first().map(|at| at.at);
            ensure!(
                earliest_live == Some(next),
                "timers",
                "the next deadline {next:?} is not the earliest live one {earliest_live:?}"
            );
        }
        Ok(())
    }
}
