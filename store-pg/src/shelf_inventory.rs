//! The [`Inventory`] of a fleet's shelf: the snapshots its hosts put in object storage
//! ([`ObjectSnapshots`], the local backend's shelf), as the fleet sweep judges them. Each is a
//! snapshot as its manifest describes it: its name says the sandbox that took it (so its
//! maker's incarnation), the manifest the key it was put for and its own retention. A start
//! that took a snapshot discards it once its sandbox is up; this removes what no record names
//! and no Discard reached (a process that crashed first): once its maker's lease ended and its
//! retention passed (or it has none), by [`sweep_verdict`](sandkeeper::sweep_verdict)'s rules.
//! Any host may sweep the shelf: every host sees all of it.
//!
//! [`Inventories`] joins a host's inventories (its local root and the shelf) into the one its
//! store sweeps; [`HostInventory`] does too, and tells this host's copies of its snapshots
//! apart, for the sweeping process's own rule ([`PgStore::sweep_own`]): a host's copy of a
//! snapshot another host resumed from the shelf goes from this host once its core let go of it
//! and the record moved on, while its maker (this host's process) lives.
//!
//! [`PgStore::sweep_own`]: crate::PgStore::sweep_own

use std::sync::Arc;

use sandkeeper::{Instant, Key, SweepObject};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotError, SnapshotName};

use crate::sweep::{Inventory, InventoryFuture};

/// The sweep's view of a shelf in object storage.
#[derive(Clone, Debug)]
pub struct ShelfInventory {
    shelf: Arc<ObjectSnapshots>,
}

impl ShelfInventory {
    /// The inventory of `shelf`.
    pub fn new(shelf: Arc<ObjectSnapshots>) -> Self {
        ShelfInventory { shelf }
    }
}

impl Inventory for ShelfInventory {
    /// Every complete snapshot on the shelf (a GET of each manifest). One whose manifest names
    /// a key that does not parse is listed without a key (no record keeps it).
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        Box::pin(async move {
            let listed = self.shelf.list().await.map_err(io_error)?;
            Ok(listed
                .into_iter()
                .map(|(name, manifest)| SweepObject::Snapshot {
                    snapshot: name.to_snapshot(),
                    by: name.sandbox(),
                    key: manifest.key.and_then(|key| Key::try_from(key).ok()),
                    expires: manifest
                        .retain_until
                        .map(|secs| Instant::from_nanos(secs.saturating_mul(1_000_000_000))),
                })
                .collect())
        })
    }

    /// Discards the snapshot's objects; `false` when it was gone already (or is not one of
    /// the shelf's: a sandbox, or a name the shelf does not write).
    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        Box::pin(async move {
            let SweepObject::Snapshot { snapshot, .. } = object else {
                return Ok(false);
            };
            let Ok(name) = SnapshotName::from_snapshot(snapshot) else {
                return Ok(false);
            };
            match self.shelf.discard(&name).await {
                Ok(()) => Ok(true),
                Err(SnapshotError::NotFound { .. }) => Ok(false),
                Err(e) => Err(io_error(e)),
            }
        })
    }
}

/// A host's inventories as one: everything each lists; a removal asked of each (a snapshot on
/// the shelf and on this host's disk is the same snapshot, judged alike, removed from both).
#[derive(Clone)]
pub struct Inventories(pub Vec<Arc<dyn Inventory>>);

impl Inventory for Inventories {
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for inventory in &self.0 {
                all.extend(inventory.objects().await?);
            }
            Ok(all)
        })
    }

    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        Box::pin(async move {
            let mut removed = false;
            for inventory in &self.0 {
                removed |= inventory.remove(object).await?;
            }
            Ok(removed)
        })
    }
}

/// A host's inventory: its local roots and the shelf. It lists and removes as [`Inventories`]
/// does, and its [`copies`](Inventory::copies) are the roots' snapshots.
#[derive(Clone)]
pub struct HostInventory {
    roots: Vec<Arc<dyn Inventory>>,
    shelf: ShelfInventory,
}

impl HostInventory {
    /// The inventory of a host with `roots` (usually one) over `shelf`.
    pub fn new(roots: Vec<Arc<dyn Inventory>>, shelf: ShelfInventory) -> Self {
        HostInventory { roots, shelf }
    }
}

impl Inventory for HostInventory {
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for root in &self.roots {
                all.extend(root.objects().await?);
            }
            all.extend(self.shelf.objects().await?);
            Ok(all)
        })
    }

    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        Box::pin(async move {
            let here = self.remove_copy(object).await?;
            Ok(self.shelf.remove(object).await? | here)
        })
    }

    /// The roots' snapshots: this host's copies of what it persisted. Each was put on the
    /// shelf before it was kept, but for a snapshot whose every put failed (salvaged), which
    /// is then the only copy; the rule keeps that one as long as a record names it, and only
    /// a record brings a snapshot its core let go of back to a start.
    fn copies(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        Box::pin(async move {
            let mut copies = Vec::new();
            for root in &self.roots {
                let objects = root.objects().await?.into_iter();
                copies.extend(objects.filter(|o| matches!(o, SweepObject::Snapshot { .. })));
            }
            Ok(copies)
        })
    }

    /// Removes the object from the roots only.
    fn remove_copy<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        Box::pin(async move {
            let mut removed = false;
            for root in &self.roots {
                removed |= root.remove(object).await?;
            }
            Ok(removed)
        })
    }
}

fn io_error(e: SnapshotError) -> std::io::Error {
    std::io::Error::other(e)
}
