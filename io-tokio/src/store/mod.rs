//! The fleet store, as the driver runs it: the [`FleetStore`] trait (what a store every process
//! of a fleet reaches must do for the core's [`StoreCommand`]s), the records it keeps, and how
//! the executor turns its answers into the core's inputs.
//!
//! [`LocalStore`](crate::local::store::LocalStore) is the store on a local root (compare-and-set
//! cells of versioned files, no lock). The protocol is the core's ([`sandkeeper::Fleet`], [`StoreCommand`]); a store only
//! keeps what the core asked, atomically, on the wall clock every process shares.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandkeeper::{
    Input, Key, KeyRecord, RecordedSnapshot, SandboxId, Snapshot, StoreCommand, Token,
};
use serde::{Deserialize, Serialize};

use crate::clock::WallClock;

pub mod contract;
mod kept;

pub use kept::{held_by, not_taken_over, unix_ms, KeyEntry, Swept};

/// A snapshot in a key's durable record, as the store keeps it (wall-clock retention).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSnapshot {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The sandbox that persisted it.
    pub by: SandboxId,
    /// The end of its retention, in unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_until_ms: Option<u64>,
}

/// A key's durable record as the store keeps it: what the key's next owner continues from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// The key's last snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<StoredSnapshot>,
    /// A sandbox handed over warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<SandboxId>,
}

impl StoredRecord {
    /// The record as the core's, on the clock a sweep takes (an [`Instant`](sandkeeper::Instant)
    /// of nanoseconds since the Unix epoch).
    pub fn on_unix_clock(&self) -> KeyRecord {
        KeyRecord {
            snapshot: self.snapshot.as_ref().map(|s| RecordedSnapshot {
                snapshot: s.snapshot.clone(),
                by: s.by,
                retain_until: s
                    .retain_until_ms
                    .map(|ms| sandkeeper::Instant::from_nanos(ms.saturating_mul(1_000_000))),
            }),
            warm: self.warm,
        }
    }
}

/// How the store answered a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This process owns the key under the token, and continues from the record (which the
    /// store keeps until this process writes a newer one: ending before that loses nothing).
    Claimed(Token, StoredRecord),
    /// Another process with a live lease holds it; the want is recorded.
    Busy,
}

/// A store operation's failure: the core treats it as "not confirmed" (a renewal or claim that
/// failed is tried again; a release stays this process's and is tried again).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fleet store: {0}")]
pub struct StoreFailure(pub String);

/// What a store operation returns: a future the executor runs on its own task, dropped at the
/// core's deadline.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreFailure>> + Send + 'static>>;

/// A store every process of a fleet reaches: process leases, key entries with fencing tokens,
/// durable key records. Each operation is atomic across processes. `now` is the caller's wall
/// clock (the one clock processes share; the protocol assumes they agree within the fleet's
/// margin); a store judges liveness by it, never by a clock of its own, so that tests can run
/// it on virtual time.
///
/// The futures own what they need (`'static`): the executor drops one at its deadline, and a
/// store's work may go on elsewhere (a blocking thread) as long as it stays atomic.
pub trait FleetStore: Send + Sync + 'static {
    /// Hands this process a new incarnation: a number no process, and no earlier run of this
    /// one, had (at least 1).
    fn register(&self) -> StoreFuture<u32>;

    /// Renews the lease of `incarnation` under `epoch` at `now` (see [`StoreCommand::Renew`]).
    /// `Some(keys)`: written, and the keys this process holds that others want; `None`: refused
    /// (the store has a newer epoch for it).
    fn renew(&self, incarnation: u32, epoch: u64, now: SystemTime)
        -> StoreFuture<Option<Vec<Key>>>;

    /// Claims `key` for `(incarnation, epoch)` at `now` (see [`StoreCommand::Claim`]).
    fn claim(&self, key: Key, incarnation: u32, epoch: u64, now: SystemTime) -> StoreFuture<Claim>;

    /// Writes the record of `key`, which `incarnation` keeps owning under `token` (see
    /// [`StoreCommand::Record`]): whether the key is still its own under that token with a
    /// live lease at `now`. A write numbered at or below one applied since the key was claimed
    /// changes nothing (and answers `true`).
    fn record(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool>;

    /// Sweeps what the backend behind this store holds at `now`: removes what no live process
    /// holds and no key's record names, by [`sandkeeper::sweep_verdict`] (see
    /// [`LocalStore::sweep`](crate::local::store::LocalStore::sweep)). What it removed.
    fn sweep(&self, now: SystemTime) -> StoreFuture<Swept>;

    /// [`sweep`](Self::sweep), and where the backend keeps copies of snapshots on this host
    /// besides a shelf, this process's own rule for them ([`sandkeeper::sweep_verdict_of`]): a
    /// copy of a snapshot it made that its core no longer holds ([`OwnSnapshots`]) and no
    /// record names goes, while its maker (this process) lives. The keeper sweeps with this.
    /// By default the plain sweep (a store whose backend keeps one copy of each snapshot).
    fn sweep_own(&self, now: SystemTime, own: OwnSnapshots) -> StoreFuture<Swept> {
        let _ = own;
        self.sweep(now)
    }

    /// Releases `key` from `incarnation` under `token`, leaving `record` (see
    /// [`StoreCommand::Release`]): whether it was written (`false`: a newer token owns the key,
    /// or this process's lease expired by `now`).
    fn release(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool>;
}

/// The sweeping process's view of its own snapshots ([`FleetStore::sweep_own`]): its
/// incarnation, and whether its core holds a snapshot now (a key keeps it, a sandbox made or
/// took it: [`sandkeeper::Lifecycle::holds_snapshot`]). A sweep asks `holds` before it reads
/// the key's record it decides on.
#[derive(Clone)]
pub struct OwnSnapshots {
    /// This process's incarnation.
    pub incarnation: u32,
    /// Whether its core holds the snapshot now.
    pub holds: Arc<dyn Fn(&sandkeeper::Snapshot) -> bool + Send + Sync>,
}

impl std::fmt::Debug for OwnSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnSnapshots")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

/// Fleet mode's store, as the executor holds it: the store and this process's incarnation.
#[derive(Clone)]
pub(crate) struct FleetRun {
    pub(crate) store: Arc<dyn FleetStore>,
    pub(crate) incarnation: u32,
}

impl FleetRun {
    /// Runs one of the core's store commands and gives the core's answer. Time for the store is
    /// the wall clock mapped from the core's `now` (see [`WallClock`]).
    pub(crate) async fn run(&self, command: StoreCommand, clock: WallClock) -> Input {
        let now = clock.wall(clock.now());
        match command {
            StoreCommand::Renew { renewal, epoch, .. } => {
                match self.store.renew(self.incarnation, epoch, now).await {
                    Ok(Some(wanted)) => Input::Renewed { renewal, wanted },
                    Ok(None) => {
                        tracing::warn!(epoch, "renewal refused: the store has a newer epoch");
                        Input::RenewFailed { renewal }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "renewal failed");
                        Input::RenewFailed { renewal }
                    }
                }
            }
            StoreCommand::Claim {
                claim, key, epoch, ..
            } => match self
                .store
                .claim(key.clone(), self.incarnation, epoch, now)
                .await
            {
                Ok(Claim::Claimed(token, record)) => Input::Claimed {
                    claim,
                    key,
                    token,
                    record: from_stored(record, clock),
                },
                Ok(Claim::Busy) => Input::ClaimBusy { claim, key },
                Err(e) => {
                    tracing::warn!(error = %e, %key, "claim failed");
                    Input::ClaimFailed { claim, key }
                }
            },
            StoreCommand::Record {
                recording,
                key,
                token,
                record,
                ..
            } => match self
                .store
                .record(
                    key.clone(),
                    self.incarnation,
                    token,
                    recording.0,
                    to_stored(record, clock),
                    now,
                )
                .await
            {
                Ok(true) => Input::Recorded { recording, key },
                Ok(false) => Input::RecordFenced { recording, key },
                Err(e) => {
                    tracing::warn!(error = %e, %key, "record failed");
                    Input::RecordFailed { recording, key }
                }
            },
            StoreCommand::Release {
                release,
                key,
                token,
                record,
                ..
            } => match self
                .store
                .release(
                    key.clone(),
                    self.incarnation,
                    token,
                    to_stored(record, clock),
                    now,
                )
                .await
            {
                Ok(true) => Input::KeyReleased { release, key },
                Ok(false) => Input::ReleaseFenced { release, key },
                Err(e) => {
                    tracing::warn!(error = %e, %key, "release failed");
                    Input::ReleaseFailed { release, key }
                }
            },
        }
    }
}

/// The core's record as the store keeps it: retention on the wall clock, rounded up (a
/// snapshot never goes before its retention ends).
fn to_stored(record: KeyRecord, clock: WallClock) -> StoredRecord {
    StoredRecord {
        snapshot: record.snapshot.map(|s| StoredSnapshot {
            snapshot: s.snapshot,
            by: s.by,
            retain_until_ms: s.retain_until.map(|at| {
                let wall = clock
                    .wall(at)
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
                let ms = u64::try_from(wall.as_millis()).unwrap_or(u64::MAX);
                ms + u64::from(!wall.subsec_nanos().is_multiple_of(1_000_000))
            }),
        }),
        warm: record.warm,
    }
}

/// A stored record as the core's (retention back on the core's clock).
fn from_stored(record: StoredRecord, clock: WallClock) -> KeyRecord {
    KeyRecord {
        snapshot: record.snapshot.map(|s| RecordedSnapshot {
            snapshot: s.snapshot,
            by: s.by,
            retain_until: s
                .retain_until_ms
                .map(|ms| clock.core(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))),
        }),
        warm: record.warm,
    }
}
