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
//! is renamed only if that write won (else it is left for the next sweep). What it reads of
//! each object is the keeper's record of it under `<root>/.meta/` (`local/meta.rs`): its key,
//! the snapshot a sandbox's start took, a snapshot's recorded retention; never anything in its
//! workspace, which a command may have forged. An object without a record (an older keeper's, or
//! made by hand) is kept, never judged on a guess; a record that is not one stops the sweep with
//! an error naming it. A swept object's record goes once the object is in the trash, and records
//! a crash left without their directory go once an hour old.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{
    sweep_verdict, Instant, SandboxId, Snapshot, SweepKey, SweepObject, SweepVerdict,
};

use super::{cell, parse_key, LocalStore, StoreError};
use crate::local::meta::{self, MetaError, StartedFor};
use crate::store::{unix_ms, Swept};

/// How old a staged file must be before a sweep takes it for a dead writer's.
const STAGED_LEFT: Duration = Duration::from_secs(3_600);

impl LocalStore {
    /// Sweeps the root this store is under, at `now` (the caller's wall clock, as every store
    /// operation's), judging leases and retention as of `now - lease`. See the module docs.
    pub fn sweep(&self, now: SystemTime) -> Result<Swept, StoreError> {
        let root = self.root();
        let trash = self.dir.join("trash");
        fs::create_dir_all(&trash).map_err(|e| self.io(e))?;
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
        for (path, object) in self.objects(&root)? {
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
            if !self.to_trash(&path, &trash)? {
                continue; // another sweep took it
            }
            // Its record once it is gone from its place (a crash between the two leaves an
            // orphan record, which `clear_orphans` below takes once it is old).
            self.forget(&root, &object)?;
            tracing::info!(object = %path.display(), ?verdict, "swept");
            match object {
                SweepObject::Sandbox { .. } => swept.sandboxes += 1,
                SweepObject::Snapshot { .. } => {
                    swept.snapshots += 1;
                    if verdict == SweepVerdict::SweepAndUnrecord {
                        swept.unrecorded += 1;
                    }
                }
            }
        }
        // Once every decision is acted on: a removal takes as long as the workspace is large.
        // Whatever is in the trash goes (another sweep's, or a crashed one's, too).
        for item in fs::read_dir(&trash).map_err(|e| self.io(e))? {
            let path = item.map_err(|e| self.io(e))?.path();
            match fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        self.clear_staged(wall)?;
        meta::clear_orphans(&root, wall).map_err(|e| self.record_failed(&root, e))?;
        Ok(swept)
    }

    /// Renames `path` into `trash` under a name of its own (two sweeps, even of processes
    /// with one process id in different namespaces, never rename onto each other's): whether it
    /// was there to move.
    fn to_trash(&self, path: &Path, trash: &Path) -> Result<bool, StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = path.file_name().expect("a listed directory");
        let mut last = None;
        for _ in 0..100 {
            let mut unique = name.to_owned();
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            unique.push(format!(".{}-{n}", std::process::id()));
            match fs::rename(path, trash.join(unique)) {
                Ok(()) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                // The name is taken: another one.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
                    ) =>
                {
                    last = Some(e)
                }
                Err(e) => return Err(self.io(e)),
            }
        }
        Err(self.io(last.expect("a hundred tries")))
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

    /// The sweep's view of the sandbox directory or snapshot `name` under `root` (by `id`), from
    /// the keeper's record of it (`local/meta.rs`), never from its workspace; `None` without a
    /// record.
    fn object(
        &self,
        root: &Path,
        name: &str,
        id: SandboxId,
        snapshot: bool,
    ) -> Result<Option<SweepObject>, StoreError> {
        let malformed = |e| self.record_failed(root, e);
        if snapshot {
            let snapshot = Snapshot::new(name);
            let Some(record) = meta::snapshot_record(root, &snapshot).map_err(malformed)? else {
                return Ok(None);
            };
            let key = recorded_key(&record.taken_from).map_err(|why| {
                self.malformed(
                    &root.join(meta::META_ROOT).join("snapshots").join(name),
                    why,
                )
            })?;
            return Ok(Some(SweepObject::Snapshot {
                snapshot,
                by: id,
                key: Some(key),
                expires: record.expires.map(expiry_instant),
            }));
        }
        let Some(record) = meta::sandbox_record(root, id).map_err(malformed)? else {
            return Ok(None);
        };
        let key = recorded_key(&record).map_err(|why| {
            self.malformed(
                &root.join(meta::META_ROOT).join("sandboxes").join(name),
                why,
            )
        })?;
        Ok(Some(SweepObject::Sandbox {
            id,
            key: Some(key),
            resumed_from: record.resumed_from.map(Snapshot::new),
        }))
    }

    /// Removes the record of a swept object (after it is gone from its place).
    fn forget(&self, root: &Path, object: &SweepObject) -> Result<(), StoreError> {
        let forgotten = match object {
            SweepObject::Sandbox { id, .. } => meta::forget_sandbox(root, *id),
            SweepObject::Snapshot { snapshot, .. } => meta::forget_snapshot(root, snapshot),
        };
        forgotten.map_err(|e| self.record_failed(root, e))
    }

    /// A keeper record under `root` that failed, as the store's error.
    fn record_failed(&self, root: &Path, e: MetaError) -> StoreError {
        match e {
            MetaError::Io { source, .. } => self.io(source),
            MetaError::Malformed { path, why } => self.malformed(&path, why),
            e => self.malformed(&root.join(meta::META_ROOT), e),
        }
    }

    /// The sandbox directories and snapshots under `root`, as the sweep sees them.
    fn objects(&self, root: &Path) -> Result<Vec<(PathBuf, SweepObject)>, StoreError> {
        let mut out = vec![];
        let mut unrecorded = 0usize;
        for (dir, snapshots) in [(root.to_path_buf(), false), (root.join(".snapshots"), true)] {
            let items = match fs::read_dir(&dir) {
                Ok(items) => items,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.io(e)),
            };
            for item in items {
                let item = item.map_err(|e| self.io(e))?;
                let name = item.file_name().to_string_lossy().into_owned();
                // `sbx-<id>` for a sandbox, `sbx-<id>-<instance>` for a snapshot.
                let Some(rest) = name.strip_prefix("sbx-") else {
                    continue;
                };
                let (id, instance) = match rest.split_once('-') {
                    Some((id, instance)) => (id, Some(instance)),
                    None => (rest, None),
                };
                let (Ok(id), true) = (id.parse::<u64>(), instance.is_some() == snapshots) else {
                    continue;
                };
                if !item.file_type().map_err(|e| self.io(e))?.is_dir() {
                    continue;
                }
                let path = item.path();
                let Some(object) = self.object(root, &name, SandboxId(id), snapshots)? else {
                    // No keeper record: an older keeper's (which kept it in the workspace), or
                    // made by hand. Never judged from its workspace, so never removed.
                    tracing::debug!(object = %path.display(), "no keeper record: kept");
                    unrecorded += 1;
                    continue;
                };
                out.push((path, object));
            }
        }
        if unrecorded > 0 {
            tracing::warn!(
                unrecorded,
                "objects without a keeper record (an older keeper's?) are kept: remove by hand \
                 those no key continues (docs/operations-errors.md)"
            );
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// The key a record says its sandbox was started for.
fn recorded_key(record: &StartedFor) -> Result<sandkeeper::Key, String> {
    parse_key(&record.key)
}

/// A retention's end in seconds since the Unix epoch, as the sweep's instant.
fn expiry_instant(secs: u64) -> Instant {
    Instant::from_nanos(secs.saturating_mul(1_000_000_000))
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
        let (claims_naming, swept) = std::thread::scope(|s| {
            let sweeper = s.spawn(|| {
                let mut swept = Swept::default();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    swept += store.sweep(at(1)).unwrap();
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
            for n in 0..200 {
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
