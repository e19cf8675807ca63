//! The fleet-safe sweep of a local root: what a crashed or departed process left under the root
//! (sandbox directories, kept snapshots) goes once nothing may need it, by
//! [`sandkeeper::sweep_verdict`], the decision every fleet sweep and the simulator share.
//!
//! It holds no lock (the store has none: `mod.rs`). It decides on one read of the store's
//! entries and leases; then, for each object it would remove, it reads the object's key entry
//! and the leases again and decides again, just before it acts. A doomed directory is
//! *renamed* into `<root>/.fleet/trash/` (O(1)) and deleted once every decision is acted on; a
//! record's reference to a snapshot whose retention ended is dropped *first*, by a
//! compare-and-set of the key's entry on the version the second decision read, and the snapshot
//! is renamed only if that write won (else it is left for the next sweep). What it lists, and
//! how it removes, is the root's inventory (`local/inventory.rs`, the same functions any other
//! fleet store uses on a local root): each object as the keeper's record of it under
//! `<root>/.meta/` (`local/meta.rs`) says (its key, the snapshot a sandbox's start took, a
//! snapshot's recorded retention), never anything in its workspace, which a command may have
//! forged. An object without a record (an older keeper's, or made by hand) is kept, never judged
//! on a guess; a record that is not one stops the sweep with an error naming it. A swept object's
//! record goes once the object is in the trash, and records a crash left without their directory
//! go once an hour old.
//!
//! It judges leases and retention one lease later than a claim would (`now - lease`): a claim
//! made on a clock that runs ahead is fenced at the backend, but a removal cannot be taken back,
//! so the sweep leaves a process whose clock drifts that much room.
//!
//! **Why a claim racing the sweep never adopts what it removes.** An object is doomed only when
//! the process that made it and its key's owner hold no lease live a lease ago, and its key's
//! record does not name it (as the second decision read them). A claim adopts or resumes only
//! what the record it takes names. After the second read, the record changes only by
//! - a claim, which takes the record as it is (not naming the object), or
//! - a record write or release of the key's owner, which needs the owner's lease live at the
//!   owner's `now`: that owner's lease had ended a lease before the sweeper's `now`, so its
//!   clock would be more than a lease behind, past the protocol's clock assumption (as with the
//!   former lock, which only ordered such a write after the removal), or
//! - the sweep's own unrecord (of a snapshot), which it makes before the rename: a claim then
//!   either took the record first (the unrecord loses, nothing is removed) or reads it without
//!   the snapshot.
//!
//! A claimant that takes the key after the decision becomes a live owner (the next sweep keeps
//! the key's objects), but the objects this one removes were named by nothing it took. Two
//! sweeps at once decide alike; the second rename of one object finds it gone, and the trash
//! names are made unique so that neither ever renames onto the other's.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{sweep_verdict, Instant, SweepKey, SweepObject, SweepVerdict};

use super::{cell, parse_key, LocalStore, StoreError};
use crate::local::inventory;
use crate::local::meta::{self, MetaError};
use crate::store::{unix_ms, Swept};

/// How old a staged file must be before a sweep takes it for a dead writer's.
const STAGED_LEFT: Duration = Duration::from_secs(3_600);

impl LocalStore {
    /// Sweeps the root this store is under, at `now` (the caller's wall clock, as every store
    /// operation's), judging leases and retention as of `now - lease`. See the module docs.
    pub fn sweep(&self, now: SystemTime) -> Result<Swept, StoreError> {
        let root = self.root();
        let mut swept = Swept::default();
        let wall = now;
        let now = now.checked_sub(self.lease).unwrap_or(UNIX_EPOCH);
        let now_core = core_instant(now);
        let mut keys = BTreeMap::new();
        for (_, entry, path) in self.versioned_entries()? {
            let key = parse_key(&entry.key).map_err(|why| self.malformed(&path, why))?;
            keys.insert(key, self.sweep_key(&entry, now)?);
        }
        let live = |incarnation| self.lease_live(incarnation, now).unwrap_or(true);
        let record_failed = |e| self.record_failed(&root, e);
        for object in inventory::sweep_objects(&root).map_err(record_failed)? {
            if sweep_verdict(&object, &keys, live, now_core) == SweepVerdict::Keep {
                continue;
            }
            // Decided again on the key as it is now, just before acting (module docs).
            let key = match &object {
                SweepObject::Sandbox { key, .. } | SweepObject::Snapshot { key, .. } => key,
            };
            let mut fresh = BTreeMap::new();
            let mut read = None;
            if let Some(key) = key {
                let cell = self.key_cell(key);
                if let Some(v) = self.read_cell(&cell)? {
                    let entry = self.parse_entry(&v.bytes, &v.path)?;
                    fresh.insert(key.clone(), self.sweep_key(&entry, now)?);
                    read = Some((cell, v.number, entry));
                } else if self.old_entry_named(&key.to_string(), &cell)? != (0, None) {
                    // Written just now, or an older root's entry not yet converted: left to
                    // the next sweep (whose decision reads it).
                    continue;
                }
            }
            let verdict = sweep_verdict(&object, &fresh, live, now_core);
            if verdict == SweepVerdict::Keep {
                continue;
            }
            if verdict == SweepVerdict::SweepAndUnrecord {
                // Unrecorded first: once the write wins, no claim takes a record naming it.
                let Some((cell, number, mut entry)) = read else {
                    continue; // a verdict to unrecord comes only from a record read
                };
                entry.record.snapshot = None;
                if cell
                    .write(number, &self.entry_bytes(&entry))
                    .map_err(|e| self.io(e))?
                    != cell::Written::Won
                {
                    continue; // the key changed since: the next sweep decides again
                }
            }
            // To the trash, then its record (a crash between the two leaves an orphan record,
            // which `clear_leftovers` below takes once it is old).
            if inventory::trash_swept(&root, &object)
                .map_err(record_failed)?
                .is_none()
            {
                continue; // another sweep took it
            }
            tracing::info!(?object, ?verdict, "swept");
            swept.count(&object, verdict);
        }
        // Once every decision is acted on: a removal takes as long as the workspace is large.
        // Whatever is in the trash goes (another sweep's, or a crashed one's, too).
        self.clear_staged(wall)?;
        inventory::clear_leftovers(&root, wall).map_err(record_failed)?;
        Ok(swept)
    }

    /// What the sweep decides on of one entry: its owner's liveness at `now` and its record.
    fn sweep_key(&self, entry: &super::KeyEntry, now: SystemTime) -> Result<SweepKey, StoreError> {
        let owner_live = match entry.owner {
            Some(owner) => self.is_live(owner, now)?,
            None => false,
        };
        Ok(SweepKey {
            owner_live,
            record: entry.record.on_unix_clock(),
        })
    }

    /// Removes staged files (`tmp/`) older than [`STAGED_LEFT`] at `now`: a writer stages a
    /// file for the moment of a write, so an older one was left by a process that died
    /// mid-write. A writer stopped that long finds its file gone, and its write fails.
    fn clear_staged(&self, now: SystemTime) -> Result<(), StoreError> {
        let Some(before) = now.checked_sub(STAGED_LEFT) else {
            return Ok(());
        };
        let items = match fs::read_dir(self.dir.join("tmp")) {
            Ok(items) => items,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io(e)),
        };
        for item in items {
            let item = item.map_err(|e| self.io(e))?;
            let old = item
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at < before);
            if old {
                let _ = fs::remove_file(item.path());
            }
        }
        Ok(())
    }

    /// The root the store is under (`<root>/.fleet`).
    fn root(&self) -> PathBuf {
        self.dir
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
    }

    /// Whether the incarnation's lease is live at `now`, whatever its epoch.
    fn lease_live(&self, incarnation: u32, now: SystemTime) -> Result<bool, StoreError> {
        Ok(self
            .read_lease(incarnation)?
            .is_some_and(|(_, expires)| unix_ms(now) < expires))
    }

    /// A keeper record under `root` that failed, as the store's error.
    fn record_failed(&self, root: &Path, e: MetaError) -> StoreError {
        match e {
            MetaError::Io { source, .. } => self.io(source),
            MetaError::Malformed { path, why } => self.malformed(&path, why),
            e => self.malformed(&root.join(meta::META_ROOT), e),
        }
    }
}

/// A wall-clock time as the sweep's instant: nanoseconds since the Unix epoch.
fn core_instant(t: SystemTime) -> Instant {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sandkeeper::{SandboxId, SessionId, Snapshot};

    use super::*;
    use crate::local::meta::StartedFor;
    use crate::store::{Claim, StoredRecord, StoredSnapshot};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    /// A snapshot of key `session:s`, made by a sandbox of incarnation 99 (never live): its
    /// record first, then its directory, made whole beside the root and renamed into place, as
    /// the backend's Stop does (a sweep never sees it without its record).
    fn make_snapshot(root: &Path, name: &str) {
        let record = meta::SnapshotRecord {
            taken_from: StartedFor {
                sandbox: 425201762304,
                key: "session:s".into(),
                spec: None,
                resumed_from: None,
            },
            persisted: true,
            expires: None,
        };
        meta::record_snapshot(root, &Snapshot::new(name), &record).unwrap();
        let staging = root.join(format!("staging-{name}"));
        fs::create_dir_all(&staging).unwrap();
        fs::create_dir_all(root.join(".snapshots")).unwrap();
        fs::rename(&staging, root.join(".snapshots").join(name)).unwrap();
    }

    /// Sweeps race claims and releases of a key whose record names a snapshot whose retention
    /// ended: the sweep removes it and drops it from the record, the claims take the record.
    /// A claim handed a record naming the snapshot must find it there (and it stays while the
    /// key is owned): the sweep unrecords by a compare-and-set *before* it renames, so a claim
    /// that took the record first makes the sweep leave the snapshot.
    #[test]
    fn a_claim_racing_the_sweep_never_gets_a_record_naming_a_removed_snapshot() {
        let root = std::env::temp_dir().join(format!("sk-sweep-race-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let store = LocalStore::open(&root, Duration::from_secs(10)).unwrap();
        let key = sandkeeper::Key::Session(SessionId::new("s").unwrap());
        let by = SandboxId(99 << 32);
        store.renew(1, 1, at(0)).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let unrecorded = std::sync::atomic::AtomicU64::new(0);
        let (claims_naming, swept) = std::thread::scope(|s| {
            let sweeper = s.spawn(|| {
                let mut swept = Swept::default();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    swept += store.sweep(at(1)).unwrap();
                    unrecorded.store(swept.unrecorded, std::sync::atomic::Ordering::Relaxed);
                }
                swept
            });
            // Stops the sweeper however this thread ends (a failed assertion must not leave
            // the scope waiting for it).
            struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let _stop = Stop(&stop);
            let mut claims_naming = 0;
            // At least 200 rounds, and on until each side won once: which side wins a round is
            // the machine's scheduling, so a loaded machine may need more (bounded: 20 000).
            for n in 0..20_000 {
                let both_won =
                    claims_naming > 0 && unrecorded.load(std::sync::atomic::Ordering::Relaxed) > 0;
                if n >= 200 && both_won {
                    break;
                }
                let Claim::Claimed(token, taken) = store.claim(&key, 1, 1, at(1)).unwrap() else {
                    panic!("the key is free")
                };
                if let Some(named) = taken.snapshot {
                    claims_naming += 1;
                    let named = root.join(".snapshots").join(named.snapshot.as_str());
                    assert!(named.is_dir(), "handed {named:?}, which a sweep removed");
                }
                // A snapshot made while the key is owned (its owner's lease keeps it), then
                // released with the key, its retention long over.
                let name = format!("sbx-{}-{n}", by.0);
                make_snapshot(&root, &name);
                let record = StoredRecord {
                    snapshot: Some(StoredSnapshot {
                        snapshot: Snapshot::new(name),
                        by,
                        retain_until_ms: Some(0),
                    }),
                    warm: None,
                };
                assert!(store.release(&key, 1, token, record, at(1)).unwrap());
            }
            drop(_stop);
            (claims_naming, sweeper.join().unwrap())
        });
        // Both sides won sometimes (else the race was not run).
        assert!(swept.unrecorded > 0, "{swept:?}");
        assert!(claims_naming > 0);
        fs::remove_dir_all(&root).unwrap();
    }
}
