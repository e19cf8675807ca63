//! Fleet mode's configuration and the values of its protocol: this process's incarnation and
//! lease timing ([`Fleet`]), the work the core orders from the store every process shares
//! ([`StoreCommand`], drained with [`Lifecycle::poll_store`](crate::Lifecycle::poll_store)),
//! and the numbers that name that work's answers.
//!
//! Several sandkeeper processes may share one backend. The store (Kubernetes Leases, or lock and
//! record files under a local root) holds one lease per process: the process renews it, and the
//! store counts it live until `lease` after the last renewal it received. The core orders the
//! renewals on a timer of their own, independent of every other activity, and counts its lease
//! valid, by its own clock, until `margin` before the earliest instant the store could count it
//! expired: `sent + lease - margin`, where `sent` is when the confirmed renewal was ordered (the
//! store received it no earlier). When that instant passes without a newer confirmation, the
//! lease has *lapsed*: the core starts a new lease epoch, and whatever it held under the old
//! one is no longer its own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::time::Instant;

/// Fleet mode: this process is one of several sharing one backend and one store.
///
/// Clocks: the core assumes that over one `lease` the clocks of this process and of the store
/// drift apart by less than `margin` minus the time a renewal takes to be written. Where that
/// assumption breaks (a pause longer than a lease, a clock that jumps), the backend's fencing
/// still refuses the stale process's changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fleet {
    /// This run of this process, as the store numbered it when the process registered: no other
    /// process, and no earlier run of this one, had it. At least 1. The core numbers its
    /// sandboxes `incarnation << 32 | n`, so that sandbox ids never collide across the fleet
    /// or across restarts.
    pub incarnation: u32,
    /// How long the store counts a process lease live after the last renewal it received.
    pub lease: Duration,
    /// How often the core orders a renewal; well under `lease - margin`, so that a renewal or
    /// two may fail without the lease lapsing.
    pub renew_every: Duration,
    /// The safety margin: the bound on clock drift between this process and the store over one
    /// lease, plus the time a renewal may take from being ordered to being written.
    pub margin: Duration,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            incarnation: 1,
            lease: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            margin: Duration::from_secs(2),
        }
    }
}

impl Fleet {
    /// How long, from the moment a renewal was ordered, its confirmation keeps the lease valid
    /// by this process's clock.
    pub fn valid_for(&self) -> Duration {
        self.lease.saturating_sub(self.margin)
    }

    /// The first sandbox id of this incarnation.
    pub fn first_sandbox(&self) -> u64 {
        u64::from(self.incarnation) << 32
    }

    /// Checks the timing: a renewal comes before the lease could lapse, the margin leaves a
    /// lease to hold, the incarnation is set.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field, why| Err(Error::InvalidConfig { field, why });
        if self.incarnation == 0 {
            return bad(
                "fleet.incarnation",
                "must be at least 1 (0 is the single process)",
            );
        }
        if self.renew_every.is_zero() {
            return bad("fleet.renew_every", "must be longer than zero");
        }
        if self.margin >= self.lease {
            return bad("fleet.margin", "must be shorter than the lease");
        }
        if self.renew_every >= self.valid_for() {
            return bad(
                "fleet.renew_every",
                "must be shorter than the lease minus the margin, or the lease lapses between renewals",
            );
        }
        Ok(())
    }
}

/// A renewal of this process's lease, as the core numbers them: its answer names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RenewalId(pub u64);

impl std::fmt::Display for RenewalId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "renewal-{}", self.0)
    }
}

/// Work the core orders from the store all processes share. Drained with
/// [`Lifecycle::poll_store`](crate::Lifecycle::poll_store), beside the sandbox commands; never
/// queued behind a sandbox's work, nor sandbox work behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "store")]
pub enum StoreCommand {
    /// Renew this process's lease: write its renew time now, under `epoch`. The store keeps one
    /// lease per incarnation with the epoch it was last renewed under: a renewal under the same
    /// epoch of a lease the store still counts live extends it; a renewal under a newer epoch, or
    /// of a lease the store counts expired, starts it afresh (whatever the store recorded under
    /// the older epoch is no longer this process's); a renewal under an older epoch is refused.
    /// Answer with [`handle_renewed`](crate::Lifecycle::handle_renewed) or
    /// [`handle_renew_failed`](crate::Lifecycle::handle_renew_failed); at the deadline drop it
    /// and answer nothing.
    Renew {
        /// This renewal, for its answer.
        renewal: RenewalId,
        /// The lease epoch: it grows each time the lease lapsed by the core's clock.
        epoch: u64,
        /// When the core stops waiting: a confirmation later than this could not keep the lease
        /// valid.
        deadline: Instant,
    },
}

impl StoreCommand {
    /// The instant at which the core stops waiting for the answer.
    pub fn deadline(&self) -> Instant {
        match self {
            StoreCommand::Renew { deadline, .. } => *deadline,
        }
    }
}
