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
use crate::ids::{Key, SandboxId, Snapshot};
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
    /// How long a call waiting for a key another process owns waits before the claim is made
    /// again (the owner hands the key over once its own calls on it end), and how long a failed
    /// release waits before it is tried again.
    pub claim_retry: Duration,
    /// How a key wanted by another process leaves this one when its calls here ended and its
    /// sandbox is idle: handed over warm, or suspended first.
    #[serde(default)]
    pub handover: Handover,
}

/// How an owned key that another process wants is handed over (see [`Fleet::handover`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Handover {
    /// The idle sandbox is drained and released in the key's record, warm: the next owner
    /// adopts it as it is. For backends every process reaches alike (one local root, one
    /// cluster).
    #[default]
    Warm,
    /// The idle sandbox is drained and suspended (Stop, Persist: its snapshot kept whatever the
    /// release policy), and the key released with the snapshot in its record: the next owner
    /// resumes it. For processes that cannot reach each other's sandboxes, only a shared place
    /// for snapshots (hosts with a local root each, and a shelf in object storage): a sandbox
    /// handed over warm there would be on a host its next owner cannot reach.
    Suspended,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            incarnation: 1,
            lease: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            margin: Duration::from_secs(2),
            claim_retry: Duration::from_millis(500),
            handover: Handover::Warm,
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
        if self.claim_retry.is_zero() {
            return bad("fleet.claim_retry", "must be longer than zero");
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

/// A fencing token: the store hands a key's new owner the next one, so tokens grow with every
/// change of a key's owner. Every command that changes a fleet key's sandbox carries its owner's
/// token, and a backend refuses a token older than the newest it has seen for that sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(pub u64);

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "token-{}", self.0)
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

/// A claim of a key, as the core numbers them: its answer names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimId(pub u64);

impl std::fmt::Display for ClaimId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "claim-{}", self.0)
    }
}

/// A release of a key, as the core numbers them: its answer names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReleaseId(pub u64);

impl std::fmt::Display for ReleaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "release-{}", self.0)
    }
}

/// A write of an owned key's durable record, as the core numbers them: its answer names it,
/// and the store keeps the newest it applied, so that a late write never undoes a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RecordingId(pub u64);

impl std::fmt::Display for RecordingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "recording-{}", self.0)
    }
}

/// A key's durable record: what the store keeps for the key's next owner, written when an owner
/// releases the key and read when the next one claims it. Everything a process, or the same one
/// after a restart, needs to continue the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key's last persisted snapshot (a suspended sandbox, or the snapshot a Stop took):
    /// the next owner's Start resumes from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<RecordedSnapshot>,
    /// A sandbox of the key that may be up: in a released key's record, one the last owner
    /// handed over warm (up, drained, no call); in the record of a key still owned, the
    /// sandbox its owner runs, for the next owner should the owner crash (it may be gone by
    /// then). Either way the next owner adopts it ([`Command::Adopt`](crate::Command::Adopt))
    /// rather than starting one, and starts afresh if the adoption fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<SandboxId>,
}

impl KeyRecord {
    /// Whether it keeps nothing (the store may delete it).
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.warm.is_none()
    }
}

/// A snapshot in a key's durable record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedSnapshot {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The sandbox that persisted it.
    pub by: SandboxId,
    /// The end of its retention, when the policy has one (in the core's time; the driver maps
    /// it to and from the wall clock it records): the sweep deletes it then, and an owner that
    /// claims the key later discards it at this instant, no earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_until: Option<Instant>,
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
    /// Claim `key` for this process under its lease `epoch`, atomically in the store: when no
    /// process holds the key (no owner, the owner released it, or the owner's lease is expired or
    /// of an older epoch), make this process its owner with the next fencing token and answer
    /// [`handle_claimed`](crate::Lifecycle::handle_claimed) with the token and the key's
    /// record, which the store **keeps** until the new owner writes a newer one (a claimant that
    /// ends before its first write leaves the next one what it found); when another process holds it, record this process's want beside the key (the
    /// owner sees it at its next renewal) and answer
    /// [`handle_claim_busy`](crate::Lifecycle::handle_claim_busy). A store error is
    /// [`handle_claim_failed`](crate::Lifecycle::handle_claim_failed). Dropped unanswered at the
    /// deadline.
    Claim {
        /// This claim, for its answer.
        claim: ClaimId,
        /// The key.
        key: Key,
        /// The lease epoch the key's ownership is attached to.
        epoch: u64,
        /// When the core stops waiting.
        deadline: Instant,
    },
    /// Write the durable `record` of `key`, which this process keeps owning, if the key is still
    /// this process's under `token` and no write numbered after `recording` was applied (a
    /// write that lands late never undoes a newer one; it is then answered as written). The
    /// core orders one whenever what the record should say changes (the key's snapshot, the
    /// sandbox it runs), at most one per key at a time, so that a process that crashes leaves
    /// its keys' records to their next owners. Answer
    /// [`handle_recorded`](crate::Lifecycle::handle_recorded),
    /// [`handle_record_failed`](crate::Lifecycle::handle_record_failed) (a store error: written
    /// again later) or [`handle_record_fenced`](crate::Lifecycle::handle_record_fenced) (a
    /// newer token owns the key). Dropped unanswered at the deadline.
    Record {
        /// This write, for its answer; numbers grow with every write of this process.
        recording: RecordingId,
        /// The key.
        key: Key,
        /// The token this process owns the key under.
        token: Token,
        /// What the key's next owner would continue from.
        record: KeyRecord,
        /// When the core stops waiting.
        deadline: Instant,
    },
    /// Release `key`: write its durable `record` and let it go, atomically, if the key is still
    /// this process's under `token`. Answer [`handle_key_released`](crate::Lifecycle::handle_key_released),
    /// or [`handle_release_failed`](crate::Lifecycle::handle_release_failed) (a store error:
    /// the key stays this process's, the release is tried again) or
    /// [`handle_release_fenced`](crate::Lifecycle::handle_release_fenced) (a newer token owns
    /// the key: nothing was written). Dropped unanswered at the deadline.
    Release {
        /// This release, for its answer.
        release: ReleaseId,
        /// The key.
        key: Key,
        /// The token this process owns the key under.
        token: Token,
        /// What the next owner continues from.
        record: KeyRecord,
        /// When the core stops waiting.
        deadline: Instant,
    },
}

impl StoreCommand {
    /// The instant at which the core stops waiting for the answer.
    pub fn deadline(&self) -> Instant {
        match self {
            StoreCommand::Renew { deadline, .. }
            | StoreCommand::Claim { deadline, .. }
            | StoreCommand::Record { deadline, .. }
            | StoreCommand::Release { deadline, .. } => *deadline,
        }
    }
}
