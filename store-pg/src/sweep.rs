//! The sweep, as a composition: the PostgreSQL store keeps the fleet's leases and records, and
//! the sandboxes live in each host's backend. A store shared by processes on many hosts cannot
//! list what a host holds, and a host's backend cannot tell alone who is live; so a keeper gives
//! its store the [`Inventory`] of its own host's backend ([`PgStore::with_inventory`]), and
//! [`PgStore::sweep`] judges each object the inventory lists by [`sandkeeper::sweep_verdict`]
//! (the decision the local root's sweep, the Kubernetes sweep and the simulator share) on the
//! leases and records in PostgreSQL. Each host sweeps its own objects; no host removes
//! another's. A store with no inventory sweeps nothing (it holds no sandboxes). A host's local
//! root is listed and swept by [`LocalRootInventory`](crate::LocalRootInventory).
//!
//! As the local root's sweep (`io-tokio/src/local/store/sweep.rs`), it judges leases and
//! retention a lease before `now`; it decides on one read of the entries and leases, and for
//! each object it would remove, reads its key's entry and the leases again and decides again,
//! just before acting. A record's snapshot whose retention ended is dropped from the record
//! *first*, by a compare-and-set on the row as the second read saw it (same token, owner and
//! record: `store.rs`'s `unrecord`), and the snapshot is removed only if that update changed the
//! row. A claim racing it either took the record first (the update then changes nothing, and
//! the snapshot stays for the next sweep) or takes it without the snapshot: a claim never gets a
//! record naming what the sweep removed.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use sandkeeper::{
    sweep_verdict, sweep_verdict_of, Instant, Key, SweepKey, SweepObject, SweepVerdict, Sweeper,
};
use sandkeeper_tokio::store::{unix_ms, KeyEntry, OwnSnapshots, Swept};

use crate::error::PgError;
use crate::PgStore;

/// What an inventory's operation returns.
pub type InventoryFuture<'a, T> = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send + 'a>>;

/// What one host's backend holds, as a sweep sees it: its sandboxes and kept snapshots, and the
/// removal of one. It owns the objects; the store only judges them.
pub trait Inventory: Send + Sync + 'static {
    /// The objects the backend holds now.
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>>;

    /// Removes `object`: whether it was there to remove (`false`: gone already, another sweep
    /// took it).
    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool>;

    /// This host's copies of the snapshots its processes persisted to a shelf, for the sweeping
    /// process's own rule ([`PgStore::sweep_own`]). None by default: an inventory without a
    /// shelf, whose snapshots are the only copies.
    fn copies(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Removes this host's copy of the snapshot `object` only, leaving it where else it is
    /// kept: whether there was a copy to remove.
    fn remove_copy<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        let _ = object;
        Box::pin(async { Ok(false) })
    }
}

impl PgStore {
    /// Sweeps what this store's [`Inventory`] holds at `now` (the caller's wall clock), judging
    /// leases and retention as of `now - lease` (see the module docs). Nothing without an
    /// inventory.
    pub async fn sweep(&self, now: SystemTime) -> Result<Swept, PgError> {
        let Some(inventory) = self.inventory().cloned() else {
            return Ok(Swept::default());
        };
        let (judged_ms, at) = self.judged(now);
        let entries = self.entries().await?;
        let processes = self.processes().await?;
        let keys = sweep_keys(&entries, &processes, judged_ms)?;
        let objects = inventory.objects().await.map_err(inventory_failed)?;
        let mut swept = Swept::default();
        for object in objects {
            let live = |inc: u32| maker_live(&processes, inc, judged_ms);
            if sweep_verdict(&object, &keys, live, at) == SweepVerdict::Keep {
                continue;
            }
            // Decided again on the key and the leases as they are now, just before acting.
            let fresh_processes = self.processes().await?;
            let fresh_entry = match object_key(&object) {
                Some(key) => self.entry(key).await?,
                None => None,
            };
            let fresh = sweep_keys(fresh_entry.as_slice(), &fresh_processes, judged_ms)?;
            let live = |inc: u32| maker_live(&fresh_processes, inc, judged_ms);
            let verdict = sweep_verdict(&object, &fresh, live, at);
            match (verdict, &fresh_entry) {
                (SweepVerdict::Keep, _) => continue,
                (SweepVerdict::SweepAndUnrecord, Some(entry)) => {
                    // Unrecorded first: once this lands, no claim takes a record naming it.
                    if !self.unrecord(entry).await? {
                        continue; // the key changed since: the next sweep decides again
                    }
                }
                // A verdict to unrecord comes only from a record read.
                (SweepVerdict::SweepAndUnrecord, None) => continue,
                (SweepVerdict::Sweep, _) => {}
            }
            if !inventory.remove(&object).await.map_err(inventory_failed)? {
                continue;
            }
            tracing::info!(?object, ?verdict, "swept");
            swept.count(&object, verdict);
        }
        Ok(swept)
    }
}

impl PgStore {
    /// [`sweep`](Self::sweep), then this process's own rule for this host's copies of its
    /// snapshots ([`Inventory::copies`], [`sandkeeper::sweep_verdict_of`]): a copy of a
    /// snapshot `own` made that its core no longer holds, and that its key's record names
    /// neither as the snapshot nor by its maker, goes from this host (the shelf's copy, if any,
    /// is the shelf's: a start that took it discards it). The core is asked before the record
    /// is read (the rule's module docs say why).
    pub async fn sweep_own(&self, now: SystemTime, own: &OwnSnapshots) -> Result<Swept, PgError> {
        let mut swept = self.sweep(now).await?;
        let Some(inventory) = self.inventory().cloned() else {
            return Ok(swept);
        };
        let (judged_ms, at) = self.judged(now);
        for object in inventory.copies().await.map_err(inventory_failed)? {
            let SweepObject::Snapshot { snapshot, .. } = &object else {
                continue;
            };
            let holds = (own.holds)(snapshot);
            let processes = self.processes().await?;
            let entry = match object_key(&object) {
                Some(key) => self.entry(key).await?,
                None => None,
            };
            let keys = sweep_keys(entry.as_slice(), &processes, judged_ms)?;
            let live = |inc: u32| maker_live(&processes, inc, judged_ms);
            let sweeper = Sweeper {
                incarnation: own.incarnation,
                holds,
            };
            let plain = sweep_verdict(&object, &keys, live, at);
            let verdict = sweep_verdict_of(&object, &keys, live, at, Some(sweeper));
            if plain != SweepVerdict::Keep || verdict != SweepVerdict::Sweep {
                continue;
            }
            if !inventory
                .remove_copy(&object)
                .await
                .map_err(inventory_failed)?
            {
                continue;
            }
            tracing::info!(?object, "swept this host's copy");
            swept.count(&object, verdict);
        }
        Ok(swept)
    }
}

impl PgStore {
    /// When a sweep at `now` judges leases and retention: a lease before, in milliseconds
    /// since the Unix epoch and as the core's instant.
    fn judged(&self, now: SystemTime) -> (u64, Instant) {
        let judged = now.checked_sub(self.lease()).unwrap_or(UNIX_EPOCH);
        let judged_ms = unix_ms(judged);
        (
            judged_ms,
            Instant::from_nanos(judged_ms.saturating_mul(1_000_000)),
        )
    }
}

/// What the sweep decides on of each entry: its owner's liveness at `judged_ms` and its record.
fn sweep_keys(
    entries: &[KeyEntry],
    processes: &BTreeMap<u32, (u64, u64)>,
    judged_ms: u64,
) -> Result<BTreeMap<Key, SweepKey>, PgError> {
    let mut keys = BTreeMap::new();
    for entry in entries {
        let key = Key::try_from(entry.key.clone()).map_err(|e| PgError::Malformed {
            what: format!("key {:?}", entry.key),
            why: e.to_string(),
        })?;
        let owner_live = entry.owner.is_some_and(|(inc, epoch)| {
            processes
                .get(&inc)
                .is_some_and(|(e, expires)| *e == epoch && judged_ms < *expires)
        });
        keys.insert(
            key,
            SweepKey {
                owner_live,
                record: entry.record.on_unix_clock(),
            },
        );
    }
    Ok(keys)
}

/// Whether the incarnation's lease is live at `judged_ms`, whatever its epoch.
fn maker_live(processes: &BTreeMap<u32, (u64, u64)>, inc: u32, judged_ms: u64) -> bool {
    processes
        .get(&inc)
        .is_some_and(|(_, expires)| judged_ms < *expires)
}

fn object_key(object: &SweepObject) -> Option<&Key> {
    match object {
        SweepObject::Sandbox { key, .. } | SweepObject::Snapshot { key, .. } => key.as_ref(),
    }
}

fn inventory_failed(e: std::io::Error) -> PgError {
    PgError::Inventory(e)
}
