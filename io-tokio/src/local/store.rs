//! The fleet store on a local root: what [`StoreCommand`](sandkeeper::StoreCommand)'s docs
//! promise, kept in files every process on the machine reaches, under `<root>/.fleet/`:
//!
//! | file | holds |
//! |---|---|
//! | `lock` | the store's lock: every operation holds it exclusively (`flock`), so each one is atomic across processes |
//! | `incarnations` | the last incarnation handed out ([`LocalStore::register`]) |
//! | `leases/<incarnation>` | a process lease: `<epoch> <expires, unix ms>` |
//! | `keys/<key>.json` | a key's entry: owner (incarnation, epoch), newest token, the durable record, who wants it |
//! | `trash/` | what a sweep removes, renamed here under the lock and deleted after it (`store/sweep.rs`) |
//!
//! Every file is written whole to a temporary name and renamed over the old one, so a process
//! killed mid-write leaves the old version or the new one, never half of either. Time is the
//! wall clock ([`SystemTime`]), the one clock the processes share; the protocol assumes their
//! clocks agree within the fleet's margin (see [`sandkeeper::Fleet`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{Key, Token};
use serde::{Deserialize, Serialize};

use crate::store::{Claim, FleetStore, StoreFailure, StoreFuture, StoredRecord};

mod sweep;
pub use sweep::Swept;

/// One key's entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// The key, as it displays.
    pub key: String,
    /// Its owner: (incarnation, lease epoch), while one holds it.
    pub owner: Option<(u32, u64)>,
    /// The newest token handed out for it.
    pub token: u64,
    /// What its last owner left.
    pub record: StoredRecord,
    /// Incarnations that asked for it while another held it.
    pub wants: BTreeSet<u32>,
    /// The newest record write of its current owner applied (none since the key was claimed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<u64>,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file system refused.
    #[error("fleet store at {root}: {source}")]
    Io {
        /// The store's root.
        root: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// A file in the store could not be read as what it should hold.
    #[error("fleet store at {root}: {file} is malformed: {why}")]
    Malformed {
        /// The store's root.
        root: PathBuf,
        /// The file.
        file: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The store on a local root. Cheap to clone; every operation opens what it needs.
#[derive(Clone, Debug)]
pub struct LocalStore {
    dir: PathBuf,
    lease: Duration,
}

impl LocalStore {
    /// The store under `root/.fleet`, made if missing, whose process leases last `lease` after
    /// each renewal.
    pub fn open(root: &Path, lease: Duration) -> Result<Self, StoreError> {
        let dir = root.join(".fleet");
        let store = LocalStore { dir, lease };
        for sub in ["leases", "keys"] {
            fs::create_dir_all(store.dir.join(sub)).map_err(|e| store.io(e))?;
        }
        Ok(store)
    }

    /// Hands this process a new incarnation: a number no process, and no earlier run of this
    /// one, had (at least 1).
    pub fn register(&self) -> Result<u32, StoreError> {
        let _lock = self.lock()?;
        let path = self.dir.join("incarnations");
        let last: u32 = match fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|e| self.malformed(&path, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(self.io(e)),
        };
        let next = last + 1;
        self.write(&path, format!("{next}\n").as_bytes())?;
        Ok(next)
    }

    /// Renews the lease of `incarnation` under `epoch` at `now`. `Some(keys)`: written; the keys
    /// this process holds that others want. `None`: refused (the store has a newer epoch).
    pub fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Option<Vec<Key>>, StoreError> {
        let _lock = self.lock()?;
        if let Some((stored, _)) = self.read_lease(incarnation)? {
            if stored > epoch {
                return Ok(None);
            }
        }
        let expires = unix_ms(now) + self.lease.as_millis() as u64;
        let path = self.lease_path(incarnation);
        self.write(&path, format!("{epoch} {expires}\n").as_bytes())?;
        let mut wanted = vec![];
        for entry in self.entries()? {
            if entry.owner == Some((incarnation, epoch)) && !entry.wants.is_empty() {
                wanted.push(parse_key(&entry.key).map_err(|why| self.malformed(&path, why))?);
            }
        }
        Ok(Some(wanted))
    }

    /// Claims `key` for `(incarnation, epoch)` at `now`.
    pub fn claim(
        &self,
        key: &Key,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        let _lock = self.lock()?;
        if self
            .read_lease(incarnation)?
            .is_some_and(|(current, _)| current > epoch)
        {
            // Made under a lease epoch the process has left (a claim that arrives late): it
            // must not take the key, nor its record, from under the process's newer epoch.
            return Ok(Claim::Busy);
        }
        let mut entry = self.read_entry(key)?;
        if let Some(owner) = entry.owner.filter(|o| o.0 != incarnation) {
            if self.is_live(owner, now)? {
                if entry.wants.insert(incarnation) {
                    self.write_entry(&entry)?;
                }
                return Ok(Claim::Busy);
            }
        }
        entry.owner = Some((incarnation, epoch));
        entry.token += 1;
        entry.wants.remove(&incarnation);
        entry.recording = None;
        // The record stays until the new owner writes a newer one (see `FleetStore::claim`).
        let record = entry.record.clone();
        self.write_entry(&entry)?;
        Ok(Claim::Claimed(Token(entry.token), record))
    }

    /// Writes the record of `key`, which `incarnation` keeps owning under `token`: whether the
    /// key is still its own under that token, with a live lease at `now`. A write numbered at or below one applied since the
    /// key was claimed changes nothing (and counts as written: a newer one is there).
    pub fn record(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let _lock = self.lock()?;
        let mut entry = self.read_entry(key)?;
        if !self.still_owned(&entry, incarnation, token, now)? {
            return Ok(false);
        }
        if entry.recording.is_some_and(|newest| newest >= recording) {
            return Ok(true);
        }
        entry.recording = Some(recording);
        entry.record = record;
        self.write_entry(&entry)?;
        Ok(true)
    }

    /// Releases `key` from `incarnation` under `token`, leaving `record`: whether it was written
    /// (false: the key is no longer this process's under that token with a live lease at
    /// `now`).
    pub fn release(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let _lock = self.lock()?;
        let mut entry = self.read_entry(key)?;
        if !self.still_owned(&entry, incarnation, token, now)? {
            return Ok(false);
        }
        entry.owner = None;
        entry.record = record;
        self.write_entry(&entry)?;
        Ok(true)
    }

    /// Every key's entry, in key order (for the sweep, reports and tests).
    pub fn entries(&self) -> Result<Vec<KeyEntry>, StoreError> {
        let mut out = vec![];
        let dir = self.dir.join("keys");
        for item in fs::read_dir(&dir).map_err(|e| self.io(e))? {
            let path = item.map_err(|e| self.io(e))?.path();
            if path.extension().is_some_and(|x| x == "json") {
                let text = fs::read_to_string(&path).map_err(|e| self.io(e))?;
                out.push(serde_json::from_str(&text).map_err(|e| self.malformed(&path, e))?);
            }
        }
        out.sort_by(|a: &KeyEntry, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Whether `(incarnation, epoch)` holds a live lease at `now`.
    pub fn is_live(&self, owner: (u32, u64), now: SystemTime) -> Result<bool, StoreError> {
        Ok(self
            .read_lease(owner.0)?
            .is_some_and(|(epoch, expires)| epoch == owner.1 && unix_ms(now) < expires))
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// Whether `incarnation` still owns the entry under `token` with a live lease at `now`: a
    /// write of an owner whose lease expired is refused, even before another claims the key
    /// (a sweep may have removed what it would name).
    fn still_owned(
        &self,
        entry: &KeyEntry,
        incarnation: u32,
        token: Token,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        match entry.owner {
            Some(owner) if owner.0 == incarnation && entry.token == token.0 => {
                self.is_live(owner, now)
            }
            _ => Ok(false),
        }
    }

    fn lock(&self) -> Result<File, StoreError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("lock"))
            .map_err(|e| self.io(e))?;
        file.lock().map_err(|e| self.io(e))?;
        Ok(file) // unlocked when dropped
    }

    fn lease_path(&self, incarnation: u32) -> PathBuf {
        self.dir.join("leases").join(incarnation.to_string())
    }

    fn read_lease(&self, incarnation: u32) -> Result<Option<(u64, u64)>, StoreError> {
        let path = self.lease_path(incarnation);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io(e)),
        };
        let mut parts = text.split_whitespace().map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(epoch)), Some(Ok(expires)), None) => Ok(Some((epoch, expires))),
            _ => Err(self.malformed(&path, "expected `<epoch> <expires ms>`")),
        }
    }

    fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join("keys").join(format!("{key}.json"))
    }

    fn read_entry(&self, key: &Key) -> Result<KeyEntry, StoreError> {
        let name = key.to_string();
        let path = self.entry_path(&name);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| self.malformed(&path, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(KeyEntry {
                key: name,
                ..KeyEntry::default()
            }),
            Err(e) => Err(self.io(e)),
        }
    }

    fn write_entry(&self, entry: &KeyEntry) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(entry).expect("an entry serialises");
        self.write(&self.entry_path(&entry.key), &bytes)
    }

    /// Writes `bytes` as `path`, whole (under the store's lock, so one temporary name is
    /// enough).
    fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        super::layout::write_atomically(path, sandkeeper::UploadId(u64::MAX), bytes)
            .map_err(|e| self.io(e))
    }

    fn io(&self, source: io::Error) -> StoreError {
        StoreError::Io {
            root: self.dir.clone(),
            source,
        }
    }

    fn malformed(&self, file: &Path, why: impl ToString) -> StoreError {
        StoreError::Malformed {
            root: self.dir.clone(),
            file: file.to_path_buf(),
            why: why.to_string(),
        }
    }
}

impl FleetStore for LocalStore {
    fn register(&self) -> StoreFuture<u32> {
        let store = self.clone();
        blocking(move || store.register())
    }

    fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> StoreFuture<Option<Vec<Key>>> {
        let store = self.clone();
        blocking(move || LocalStore::renew(&store, incarnation, epoch, now))
    }

    fn claim(&self, key: Key, incarnation: u32, epoch: u64, now: SystemTime) -> StoreFuture<Claim> {
        let store = self.clone();
        blocking(move || LocalStore::claim(&store, &key, incarnation, epoch, now))
    }

    fn record(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        blocking(move || {
            LocalStore::record(&store, &key, incarnation, token, recording, record, now)
        })
    }

    fn sweep(&self, now: SystemTime) -> StoreFuture<Swept> {
        let store = self.clone();
        blocking(move || LocalStore::sweep(&store, now))
    }

    fn release(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        blocking(move || LocalStore::release(&store, &key, incarnation, token, record, now))
    }
}

/// Runs one store operation on a blocking thread (it takes the store's file lock). Dropping
/// the future leaves the operation to finish there: each is atomic under the lock.
fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> StoreFuture<T> {
    Box::pin(async move {
        match tokio::task::spawn_blocking(op).await {
            Ok(result) => result.map_err(|e| StoreFailure(e.to_string())),
            Err(e) => Err(StoreFailure(format!("store task failed: {e}"))),
        }
    })
}

/// Milliseconds since the unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A key from its display form (`session:s1`, `user:u`, `agent`, `global`).
fn parse_key(text: &str) -> Result<Key, String> {
    Key::try_from(text.to_string()).map_err(|e| format!("key {text:?}: {e}"))
}

/// The keys `incarnation` owns among `entries` (a store's [`LocalStore::entries`], or the
/// Kubernetes store's), with the token each is held under.
pub fn held_by(entries: &[KeyEntry], incarnation: u32) -> BTreeMap<String, u64> {
    entries
        .iter()
        .filter(|e| e.owner.is_some_and(|(i, _)| i == incarnation))
        .map(|e| (e.key.clone(), e.token))
        .collect()
}

/// Of the keys `incarnation` held (`held`, as [`held_by`] gave them), those `entries` show not
/// taken over: still its own, or under no newer token.
pub fn not_taken_over(
    held: &BTreeMap<String, u64>,
    entries: &[KeyEntry],
    incarnation: u32,
) -> Vec<String> {
    held.iter()
        .filter(|(key, token)| {
            !entries.iter().any(|e| {
                &e.key == *key && e.token > **token && e.owner.is_none_or(|(i, _)| i != incarnation)
            })
        })
        .map(|(key, _)| key.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::Session(sandkeeper::SessionId::new(s).unwrap())
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn store() -> (tempdir::Dir, LocalStore) {
        let dir = tempdir::Dir::new();
        let store = LocalStore::open(dir.path(), Duration::from_secs(10)).unwrap();
        (dir, store)
    }

    /// A scratch directory removed when dropped (the crate has no tempfile dependency).
    mod tempdir {
        use std::path::{Path, PathBuf};
        use std::sync::atomic::{AtomicU64, Ordering};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Self {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let path = std::env::temp_dir().join(format!(
                    "sandkeeper-store-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }

            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn incarnations_are_never_handed_out_twice() {
        let (_dir, store) = store();
        let a = store.register().unwrap();
        let b = store.register().unwrap();
        assert_eq!((a, b), (1, 2));
    }

    #[test]
    fn a_key_held_under_a_live_lease_is_busy_and_the_want_reaches_its_owner() {
        let (_dir, store) = store();
        assert_eq!(store.renew(1, 1, at(0)).unwrap(), Some(vec![]));
        assert_eq!(store.renew(2, 1, at(0)).unwrap(), Some(vec![]));
        let Claim::Claimed(t1, record) = store.claim(&key("s"), 1, 1, at(1)).unwrap() else {
            panic!()
        };
        assert_eq!((t1, record), (Token(1), StoredRecord::default()));
        assert_eq!(store.claim(&key("s"), 2, 1, at(2)).unwrap(), Claim::Busy);
        assert_eq!(store.renew(1, 1, at(3)).unwrap(), Some(vec![key("s")]));
        // Released with a record: the next claim takes it, under the next token.
        let record = StoredRecord {
            snapshot: None,
            warm: Some(sandkeeper::SandboxId(1 << 32)),
        };
        assert!(store
            .release(&key("s"), 1, t1, record.clone(), at(3))
            .unwrap());
        assert_eq!(
            store.claim(&key("s"), 2, 1, at(4)).unwrap(),
            Claim::Claimed(Token(2), record)
        );
        // A stale release (old token) is refused and writes nothing.
        assert!(!store
            .release(&key("s"), 1, t1, StoredRecord::default(), at(4))
            .unwrap());
        assert_eq!(store.entries().unwrap()[0].owner, Some((2, 1)));
    }

    /// Found by the fleet simulator: a claim that arrived after its process had renewed under a
    /// newer epoch and claimed the key again took the key (and its record) back to the old
    /// epoch, so the store counted the key free while the process drove its sandbox.
    #[test]
    fn a_claim_under_an_epoch_the_process_has_left_takes_nothing() {
        let (_dir, store) = store();
        store.renew(1, 2, at(0)).unwrap();
        let Claim::Claimed(token, _) = store.claim(&key("s"), 1, 2, at(0)).unwrap() else {
            panic!()
        };
        let record = StoredRecord {
            snapshot: None,
            warm: Some(sandkeeper::SandboxId(1 << 32)),
        };
        assert!(store
            .record(&key("s"), 1, token, 0, record.clone(), at(1))
            .unwrap());
        assert_eq!(store.claim(&key("s"), 1, 1, at(2)).unwrap(), Claim::Busy);
        let entry = &store.entries().unwrap()[0];
        assert_eq!(
            (entry.owner, entry.token, &entry.record),
            (Some((1, 2)), token.0, &record)
        );
    }

    #[test]
    fn an_owner_whose_lease_expired_writes_nothing_even_before_another_claims() {
        let (_dir, store) = store();
        store.renew(1, 1, at(0)).unwrap();
        let Claim::Claimed(token, _) = store.claim(&key("s"), 1, 1, at(0)).unwrap() else {
            panic!()
        };
        let record = StoredRecord {
            snapshot: None,
            warm: Some(sandkeeper::SandboxId(1 << 32)),
        };
        assert!(store
            .record(&key("s"), 1, token, 0, record.clone(), at(9))
            .unwrap());
        // The lease (10 s) ran out: neither a record write nor a release lands.
        assert!(!store
            .record(&key("s"), 1, token, 1, StoredRecord::default(), at(10))
            .unwrap());
        assert!(!store
            .release(&key("s"), 1, token, StoredRecord::default(), at(10))
            .unwrap());
        let entry = &store.entries().unwrap()[0];
        assert_eq!((entry.owner, &entry.record), (Some((1, 1)), &record));
        // A late write numbered below the newest applied changes nothing.
        store.renew(1, 1, at(11)).unwrap();
        assert!(store
            .record(&key("s"), 1, token, 0, StoredRecord::default(), at(12))
            .unwrap());
        assert_eq!(store.entries().unwrap()[0].record, record);
    }

    #[test]
    fn a_key_whose_owner_lease_expired_or_moved_to_a_new_epoch_is_taken_over() {
        let (_dir, store) = store();
        store.renew(1, 1, at(0)).unwrap();
        store.renew(2, 1, at(0)).unwrap();
        store.claim(&key("s"), 1, 1, at(0)).unwrap();
        assert_eq!(store.claim(&key("s"), 2, 1, at(9)).unwrap(), Claim::Busy);
        assert!(matches!(
            store.claim(&key("s"), 2, 1, at(10)).unwrap(),
            Claim::Claimed(Token(2), _)
        ));
        // Process 1 comes back under a new epoch: what it held under the old one is gone.
        store.renew(1, 2, at(11)).unwrap();
        store.renew(2, 1, at(11)).unwrap();
        store.claim(&key("t"), 1, 2, at(11)).unwrap();
        store.renew(1, 3, at(12)).unwrap();
        assert!(matches!(
            store.claim(&key("t"), 2, 1, at(12)).unwrap(),
            Claim::Claimed(Token(2), _)
        ));
        // A renewal under an older epoch is refused.
        assert_eq!(store.renew(1, 2, at(13)).unwrap(), None);
    }

    #[test]
    fn the_store_lock_makes_each_operation_atomic_across_handles() {
        let (_dir, store) = store();
        // Each thread opens the lock file itself, as another process would.
        let handed: Vec<u32> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let store = store.clone();
                    s.spawn(move || {
                        (0..25)
                            .map(|_| store.register().unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let distinct: BTreeSet<u32> = handed.iter().copied().collect();
        assert_eq!(distinct.len(), 200, "an incarnation handed out twice");
        assert_eq!(distinct.last(), Some(&200));
    }

    #[test]
    fn a_malformed_file_is_a_typed_error_naming_it() {
        let (dir, store) = store();
        std::fs::write(dir.path().join(".fleet/leases/4"), "nonsense").unwrap();
        let e = store.is_live((4, 1), at(0)).unwrap_err();
        assert!(
            matches!(&e, StoreError::Malformed { file, .. } if file.ends_with("leases/4")),
            "{e}"
        );
    }
}
