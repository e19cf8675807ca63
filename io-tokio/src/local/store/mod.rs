//! The fleet store on a local root: what [`StoreCommand`](sandkeeper::StoreCommand)'s docs
//! promise, kept in files every process on the machine reaches, under `<root>/.fleet/`:
//!
//! | file | holds |
//! |---|---|
//! | `incarnation/<n>` | the incarnation counter, a cell (`store/cell.rs`): its newest version's number is the last incarnation handed out ([`LocalStore::register`]) |
//! | `lease/<incarnation>/<n>` | a process lease, a cell: `<epoch> <expires, unix ms>` |
//! | `key/<key>/<n>` | a key's entry, a cell: owner (incarnation, epoch), newest token, the durable record, who wants it (JSON) |
//! | `tmp/` | what a writer stages before it links it into a cell; what a crashed writer left goes at a sweep |
//! | `trash/` | what a sweep removes, renamed here and deleted after (`store/sweep.rs`) |
//!
//! **No lock.** Every mutable value is a compare-and-set cell (`store/cell.rs`): an operation
//! reads what it decides on, decides, and writes the next version of the one cell it changes;
//! if another write got that version first, it reads again and decides again (a bounded number
//! of times, then [`StoreError::Contended`]; a write whose outcome its writer cannot tell is
//! [`StoreError::InDoubt`], see the cell's docs). A process stopped at any instant (SIGSTOP, a
//! long GC or VM pause) thus holds nothing another process waits for: an operation waits only
//! for its own file system calls, and for its retries when another write to the same cell came
//! first (each one another operation's success). Issue 30 measured 20-40 s stalls of every
//! process behind one stopped holder of the store's former lock (`lock`); `tests/store_pause.rs`
//! stops a process hammering the store and times everything else meanwhile.
//!
//! Each operation changes one cell. A claim, a record write and a release read process leases
//! besides, after the entry they change, which they write only if it is still the version
//! read: the outcome is the one the lock gave had the operation run whole at the instant it
//! read the leases. What that read cannot see is a renewal landing after it (a process renewing
//! a lease the claimant judged expired): that is the protocol's clock assumption (`docs/fleet.md`,
//! "Clocks"), which the lock did not remove either; the backend's token check covers a process
//! past it. A renewal writes its lease, then reads the entries for the wants.
//!
//! Time is the wall clock ([`SystemTime`]), the one clock the processes share; the protocol
//! assumes their clocks agree within the fleet's margin (see [`sandkeeper::Fleet`]).
//!
//! **An older root** (the store under its lock: `incarnations`, `leases/<incarnation>`,
//! `keys/<key>.json`) is read: the counter and a lease continue from the old file while their
//! cell was never written, and [`LocalStore::open`] moves each key's entry into its cell (a
//! read of a key whose cell is still empty reads the old file, so a process reading while
//! another converts sees the one entry). Every process of a fleet must run this layout: one
//! still taking the old lock would not see the cells.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandkeeper::{Key, Token};

use crate::store::{
    unix_ms, Claim, FleetStore, KeyEntry, StoreFailure, StoreFuture, StoredRecord, Swept,
};

mod cell;
mod sweep;
use cell::{Cell, CellError, Written};

/// How many times an operation decides again after another write to its cell came first.
/// Each conflict is another operation's success, so this only runs out under a storm of
/// writes to one cell.
const ATTEMPTS: u32 = 64;

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
    /// Other processes' writes to one cell kept overtaking this operation (it decided again
    /// each time, up to a bound): nothing was written.
    #[error("fleet store at {root}: {cell} kept changing under this operation")]
    Contended {
        /// The store's root.
        root: PathBuf,
        /// The cell (directory) it meant to change.
        cell: PathBuf,
    },
    /// The operation's write may have landed or not (its writer was held up between writing
    /// and looking, and the cell moved on by several versions meanwhile; see `store/cell.rs`).
    /// As for a store answer lost at its deadline, the core takes it as not confirmed.
    #[error("fleet store at {root}: the write to {cell} may or may not have landed")]
    InDoubt {
        /// The store's root.
        root: PathBuf,
        /// The cell (directory) it wrote.
        cell: PathBuf,
    },
}

/// The store on a local root. Cheap to clone; every operation opens what it needs.
#[derive(Clone, Debug)]
pub struct LocalStore {
    dir: PathBuf,
    lease: Duration,
}

/// What an attempt decided: write the version after the one read and answer, answer without
/// writing, or read again (what it read changed while it read it).
enum Step<T> {
    Write(Vec<u8>, T),
    Answer(T),
    Again,
}

impl LocalStore {
    /// The store under `root/.fleet`, made if missing, whose process leases last `lease` after
    /// each renewal. An older root's key entries are moved into their cells (module docs).
    pub fn open(root: &Path, lease: Duration) -> Result<Self, StoreError> {
        let dir = root.join(".fleet");
        let store = LocalStore { dir, lease };
        for sub in ["incarnation", "lease", "key", "tmp"] {
            fs::create_dir_all(store.dir.join(sub)).map_err(|e| store.io(e))?;
        }
        store.convert_old_entries()?;
        Ok(store)
    }

    /// Hands this process a new incarnation: a number no process, and no earlier run of this
    /// one, had (at least 1).
    pub fn register(&self) -> Result<u32, StoreError> {
        let cell = self.cell("incarnation");
        for attempt in 0..ATTEMPTS {
            let newest = cell.newest().map_err(|e| self.io(e))?;
            let base = match newest {
                0 => self.old_incarnations()?,
                n => n,
            };
            let next = u32::try_from(base + 1)
                .map_err(|_| self.malformed(cell.dir(), "the incarnations ran out"))?;
            // A doubtful write is given up: the number may be another's, and the next is tried.
            if cell.write(base, b"").map_err(|e| self.io(e))? == Written::Won {
                return Ok(next);
            }
            back_off(attempt);
        }
        Err(self.contended(&cell))
    }

    /// Renews the lease of `incarnation` under `epoch` at `now`. `Some(keys)`: written; the keys
    /// this process holds that others want. `None`: refused (the store has a newer epoch).
    pub fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Option<Vec<Key>>, StoreError> {
        let expires = unix_ms(now) + self.lease.as_millis() as u64;
        let cell = self.lease_cell(incarnation);
        // Two renewals of one process may race (one abandoned at its deadline goes on): the
        // cell orders them, and neither undoes a newer epoch. Writing the lease again is
        // harmless, so a doubtful write is simply made again.
        let written = self.change(&cell, true, |version| {
            let stored = match version {
                Some(v) => Some(self.lease_of(&v.bytes, &v.path)?),
                None => self.old_lease(incarnation)?,
            };
            if stored.is_some_and(|(stored, _)| stored > epoch) {
                return Ok(Step::Answer(false));
            }
            Ok(Step::Write(
                format!("{epoch} {expires}\n").into_bytes(),
                true,
            ))
        })?;
        if !written {
            return Ok(None);
        }
        // The wants, read after the lease was written: a want recorded in between is shown now
        // rather than at the next renewal (it only hastens a handover).
        let mut wanted = vec![];
        for (_, entry, path) in self.versioned_entries()? {
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
        let cell = self.key_cell(key);
        self.change_entry(key, &cell, |mut entry| {
            // No lock: the entry is read, then the leases, and the entry is written only if it
            // is still the version read. The outcome is the one the lock gave had the claim run
            // whole when it read the leases. This process's renewal under a newer epoch before
            // that read makes the claim busy (below); one after it is ordered after the claim,
            // as the lock could have ordered it. If the process also claimed the key under the
            // newer epoch (it renews first, then claims), the entry changed: this write loses,
            // and the claim decides again, reading the newer lease.
            if self
                .read_lease(incarnation)?
                .is_some_and(|(current, _)| current > epoch)
            {
                // Made under a lease epoch the process has left (a claim that arrives late): it
                // must not take the key, nor its record, from under the process's newer epoch.
                return Ok(Step::Answer(Claim::Busy));
            }
            if let Some(owner) = entry.owner.filter(|o| o.0 != incarnation) {
                // The owner's lease as read now. Its renewal landing after this read, of a lease
                // expired by this `now`, is a clock past the margin (module docs).
                if self.is_live(owner, now)? {
                    if entry.wants.insert(incarnation) {
                        return Ok(Step::Write(self.entry_bytes(&entry), Claim::Busy));
                    }
                    return Ok(Step::Answer(Claim::Busy));
                }
            }
            entry.owner = Some((incarnation, epoch));
            entry.token += 1;
            entry.wants.remove(&incarnation);
            entry.recording = None;
            // The record stays until the new owner writes a newer one (see `FleetStore::claim`).
            let record = entry.record.clone();
            Ok(Step::Write(
                self.entry_bytes(&entry),
                Claim::Claimed(Token(entry.token), record),
            ))
        })
    }

    /// Writes the record of `key`, which `incarnation` keeps owning under `token`: whether the
    /// key is still its own under that token, with a live lease at `now`. A write numbered at
    /// or below one applied since the key was claimed changes nothing (and counts as written: a
    /// newer one is there).
    pub fn record(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let cell = self.key_cell(key);
        self.change_entry(key, &cell, |mut entry| {
            if !self.still_owned(&entry, incarnation, token, now)? {
                return Ok(Step::Answer(false));
            }
            if entry.recording.is_some_and(|newest| newest >= recording) {
                return Ok(Step::Answer(true));
            }
            entry.recording = Some(recording);
            entry.record = record.clone();
            Ok(Step::Write(self.entry_bytes(&entry), true))
        })
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
        let cell = self.key_cell(key);
        self.change_entry(key, &cell, |mut entry| {
            if !self.still_owned(&entry, incarnation, token, now)? {
                return Ok(Step::Answer(false));
            }
            entry.owner = None;
            entry.record = record.clone();
            Ok(Step::Write(self.entry_bytes(&entry), true))
        })
    }

    /// Every key's entry, in key order (for the sweep, reports and tests).
    pub fn entries(&self) -> Result<Vec<KeyEntry>, StoreError> {
        Ok(self
            .versioned_entries()?
            .into_iter()
            .map(|(_, entry, _)| entry)
            .collect())
    }

    /// Whether `(incarnation, epoch)` holds a live lease at `now`.
    pub fn is_live(&self, owner: (u32, u64), now: SystemTime) -> Result<bool, StoreError> {
        Ok(self
            .read_lease(owner.0)?
            .is_some_and(|(epoch, expires)| epoch == owner.1 && unix_ms(now) < expires))
    }

    /// Whether `incarnation` holds an unexpired lease at `now`, under any epoch: as far as the
    /// store can tell, its process lives (a server's replicas ask it of each other).
    pub fn holds_lease(&self, incarnation: u32, now: SystemTime) -> Result<bool, StoreError> {
        Ok(self
            .read_lease(incarnation)?
            .is_some_and(|(_, expires)| unix_ms(now) < expires))
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// Whether `incarnation` still owns the entry under `token` with a live lease at `now`: a
    /// write of an owner whose lease expired is refused, even before another claims the key
    /// (a sweep may have removed what it would name). The lease is read after the entry, which
    /// is written only if still as read (see [`claim`](Self::claim)).
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

    /// Reads `cell`, decides with `decide` on its newest version (`None`: never written), and
    /// writes what it decided as the next version; decides again
    /// when another write came first. A doubtful write is made again when `idempotent` (the
    /// operation may land twice), else it is [`StoreError::InDoubt`].
    fn change<T>(
        &self,
        cell: &Cell,
        idempotent: bool,
        mut decide: impl FnMut(Option<&cell::Version>) -> Result<Step<T>, StoreError>,
    ) -> Result<T, StoreError> {
        for attempt in 0..ATTEMPTS {
            let current = self.read_cell(cell)?;
            let number = current.as_ref().map_or(0, |v| v.number);
            let (bytes, answer) = match decide(current.as_ref())? {
                Step::Answer(answer) => return Ok(answer),
                Step::Write(bytes, answer) => (bytes, answer),
                Step::Again => continue,
            };
            match cell.write(number, &bytes).map_err(|e| self.io(e))? {
                Written::Won => return Ok(answer),
                Written::InDoubt if !idempotent => {
                    return Err(StoreError::InDoubt {
                        root: self.dir.clone(),
                        cell: cell.dir().to_path_buf(),
                    })
                }
                Written::Lost | Written::InDoubt => back_off(attempt),
            }
        }
        Err(self.contended(cell))
    }

    /// [`change`](Self::change) of a key's entry, decided on the entry as read (the old file's,
    /// or an empty one, while its cell was never written). Not idempotent: a claim takes the
    /// record and a release lets the key go, so a doubtful write is an error.
    fn change_entry<T>(
        &self,
        key: &Key,
        cell: &Cell,
        mut decide: impl FnMut(KeyEntry) -> Result<Step<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let name = key.to_string();
        self.change(cell, false, |version| {
            let entry = match version {
                Some(v) => self.parse_entry(&v.bytes, &v.path)?,
                None => match self.old_entry_named(&name, cell)? {
                    (0, old) => old.unwrap_or_else(|| KeyEntry {
                        key: name.clone(),
                        ..KeyEntry::default()
                    }),
                    // Converted meanwhile: read the cell.
                    _ => return Ok(Step::Again),
                },
            };
            if entry.key != name {
                let file = version.map_or_else(|| self.old_entry_path(&name), |v| v.path.clone());
                return Err(self.malformed(&file, format!("holds the entry of {}", entry.key)));
            }
            decide(entry)
        })
    }

    /// The newest version of `cell`.
    fn read_cell(&self, cell: &Cell) -> Result<Option<cell::Version>, StoreError> {
        cell.read().map_err(|e| match e {
            CellError::Io(e) => self.io(e),
            CellError::Overtaken => self.contended(cell),
        })
    }

    fn cell(&self, name: &str) -> Cell {
        Cell::new(self.dir.join(name), self.dir.join("tmp"))
    }

    fn lease_cell(&self, incarnation: u32) -> Cell {
        Cell::new(
            self.dir.join("lease").join(incarnation.to_string()),
            self.dir.join("tmp"),
        )
    }

    fn key_cell(&self, key: &Key) -> Cell {
        self.key_cell_named(&key.to_string())
    }

    fn key_cell_named(&self, key: &str) -> Cell {
        Cell::new(self.dir.join("key").join(key), self.dir.join("tmp"))
    }

    /// A process lease: `(epoch, expires ms)`.
    fn read_lease(&self, incarnation: u32) -> Result<Option<(u64, u64)>, StoreError> {
        let cell = self.lease_cell(incarnation);
        match self.read_cell(&cell)? {
            Some(v) => self.lease_of(&v.bytes, &v.path).map(Some),
            None => self.old_lease(incarnation),
        }
    }

    fn lease_of(&self, bytes: &[u8], path: &Path) -> Result<(u64, u64), StoreError> {
        let text = std::str::from_utf8(bytes).map_err(|e| self.malformed(path, e))?;
        let mut parts = text.split_whitespace().map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(epoch)), Some(Ok(expires)), None) => Ok((epoch, expires)),
            _ => Err(self.malformed(path, "expected `<epoch> <expires ms>`")),
        }
    }

    fn parse_entry(&self, bytes: &[u8], path: &Path) -> Result<KeyEntry, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| self.malformed(path, e))
    }

    fn entry_bytes(&self, entry: &KeyEntry) -> Vec<u8> {
        serde_json::to_vec_pretty(entry).expect("an entry serialises")
    }

    /// Every key's entry with its cell's version number (0: the old file's) and the file read,
    /// in key order.
    fn versioned_entries(&self) -> Result<Vec<(u64, KeyEntry, PathBuf)>, StoreError> {
        let mut out = vec![];
        let dir = self.dir.join("key");
        for item in fs::read_dir(&dir).map_err(|e| self.io(e))? {
            let item = item.map_err(|e| self.io(e))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let cell = self.key_cell_named(&name);
            // A cell made but never written (its first writer lost or stopped) holds no entry.
            if let Some(v) = self.read_cell(&cell)? {
                out.push((v.number, self.parse_entry(&v.bytes, &v.path)?, v.path));
            }
        }
        // Old entries not yet moved into their cells (another process is converting them).
        for (name, path) in self.old_entry_files()? {
            let cell = self.key_cell_named(&name);
            if let (0, Some(entry)) = self.old_entry_named(&name, &cell)? {
                out.push((0, entry, path));
            }
        }
        out.sort_by(|a, b| a.1.key.cmp(&b.1.key));
        Ok(out)
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

    fn contended(&self, cell: &Cell) -> StoreError {
        StoreError::Contended {
            root: self.dir.clone(),
            cell: cell.dir().to_path_buf(),
        }
    }

    // ------------------------------------------------------------------------------------------
    // An older root's files (the store under its lock)

    /// The last incarnation the old counter handed out (0: none).
    fn old_incarnations(&self) -> Result<u64, StoreError> {
        let path = self.dir.join("incarnations");
        match fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|e| self.malformed(&path, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(self.io(e)),
        }
    }

    /// An old lease file (`leases/<incarnation>`), read while the lease's cell was never
    /// written. The old files are never changed nor removed here, so it needs no second look.
    fn old_lease(&self, incarnation: u32) -> Result<Option<(u64, u64)>, StoreError> {
        let path = self.dir.join("leases").join(incarnation.to_string());
        match fs::read(&path) {
            Ok(bytes) => self.lease_of(&bytes, &path).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(e)),
        }
    }

    /// The old layout's entry file of a key.
    fn old_entry_path(&self, name: &str) -> PathBuf {
        self.dir.join("keys").join(format!("{name}.json"))
    }

    /// The old file's entry of the key `name`, if its cell is still empty (0) after the file
    /// was read; else the cell's newest number (the caller reads the cell again). The file is
    /// read before the cell is listed again: a conversion links the cell's first version
    /// before it removes the file, so a file found missing with the cell still empty was
    /// never there.
    fn old_entry_named(
        &self,
        name: &str,
        cell: &Cell,
    ) -> Result<(u64, Option<KeyEntry>), StoreError> {
        let path = self.old_entry_path(name);
        let old = match fs::read(&path) {
            Ok(bytes) => Some(self.parse_entry(&bytes, &path)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(self.io(e)),
        };
        match cell.newest().map_err(|e| self.io(e))? {
            0 => Ok((0, old)),
            number => Ok((number, None)),
        }
    }

    /// The old layout's entry files: (key name, path).
    fn old_entry_files(&self) -> Result<Vec<(String, PathBuf)>, StoreError> {
        let items = match fs::read_dir(self.dir.join("keys")) {
            Ok(items) => items,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(self.io(e)),
        };
        let mut out = vec![];
        for item in items {
            let path = item.map_err(|e| self.io(e))?.path();
            if path.extension().is_some_and(|x| x == "json") {
                if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                    out.push((stem.to_string(), path.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Moves each old entry file into its key's cell (as the cell's first version, unless a
    /// version is there already), then removes the file.
    fn convert_old_entries(&self) -> Result<(), StoreError> {
        for (name, path) in self.old_entry_files()? {
            let cell = self.key_cell_named(&name);
            if let (0, Some(entry)) = self.old_entry_named(&name, &cell)? {
                // Lost or in doubt: another process converted it first; either way the cell
                // has a version now.
                cell.write(0, &self.entry_bytes(&entry))
                    .map_err(|e| self.io(e))?;
            }
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(self.io(e)),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Waits a little before deciding again after a conflict: growing with the attempt (up to
/// about 10 ms) and spread by a per-process stir, so that writers that collided do not
/// collide again in step.
fn back_off(attempt: u32) {
    let base = 20u64 << attempt.min(9);
    let stir = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9) ^ u64::from(attempt);
    std::thread::sleep(Duration::from_micros(base + stir % base));
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

/// Runs one store operation on a blocking thread (file system calls block). Dropping the future
/// leaves the operation to finish there: each is atomic by its cell's compare-and-set.
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

/// A key from its display form (`session:s1`, `user:u`, `agent`, `global`).
fn parse_key(text: &str) -> Result<Key, String> {
    Key::try_from(text.to_string()).map_err(|e| format!("key {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::UNIX_EPOCH;

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
    fn each_operation_is_atomic_across_handles_without_a_lock() {
        let (_dir, store) = store();
        // Each thread works on the cells through its own handle, as another process would.
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
        // Dense unless a register gave a number up as in doubt (a thread descheduled between
        // its write and its look while others registered several times): never reused.
        assert!(distinct.last().is_some_and(|&last| last >= 200));
    }

    #[test]
    fn a_malformed_file_is_a_typed_error_naming_it() {
        let (dir, store) = store();
        let fleet = dir.path().join(".fleet");
        std::fs::create_dir_all(fleet.join("lease/4")).unwrap();
        std::fs::write(fleet.join("lease/4/1"), "nonsense").unwrap();
        let e = store.is_live((4, 1), at(0)).unwrap_err();
        assert!(
            matches!(&e, StoreError::Malformed { file, .. } if file.ends_with("lease/4/1")),
            "{e}"
        );
        // An older root's lease file, as well.
        std::fs::create_dir_all(fleet.join("leases")).unwrap();
        std::fs::write(fleet.join("leases/5"), "nonsense").unwrap();
        let e = store.is_live((5, 1), at(0)).unwrap_err();
        assert!(
            matches!(&e, StoreError::Malformed { file, .. } if file.ends_with("leases/5")),
            "{e}"
        );
        // A key's entry: every operation on it, and the listing, name the file.
        std::fs::create_dir_all(fleet.join("key/session:s")).unwrap();
        std::fs::write(fleet.join("key/session:s/3"), "{").unwrap();
        let e = store.claim(&key("s"), 1, 1, at(0)).unwrap_err();
        assert!(
            matches!(&e, StoreError::Malformed { file, .. } if file.ends_with("session:s/3")),
            "{e}"
        );
        assert!(matches!(
            store.entries().unwrap_err(),
            StoreError::Malformed { .. }
        ));
        // An entry in another key's cell.
        std::fs::write(
            fleet.join("key/session:s/4"),
            serde_json::to_vec(&KeyEntry {
                key: "session:t".into(),
                ..KeyEntry::default()
            })
            .unwrap(),
        )
        .unwrap();
        let e = store
            .release(&key("s"), 1, Token(1), StoredRecord::default(), at(0))
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Malformed { why, .. } if why.contains("session:t")),
            "{e}"
        );
    }

    /// A root the store wrote under its former lock (`incarnations`, `leases/<n>`,
    /// `keys/<key>.json`) is read: the counter goes on from the old one, a live lease is still
    /// live, and each key's entry is moved into its cell at open, owner, token and record kept.
    #[test]
    fn an_older_root_is_read_and_its_entries_moved_into_cells() {
        let dir = tempdir::Dir::new();
        let fleet = dir.path().join(".fleet");
        std::fs::create_dir_all(fleet.join("leases")).unwrap();
        std::fs::create_dir_all(fleet.join("keys")).unwrap();
        std::fs::write(fleet.join("lock"), "").unwrap();
        std::fs::write(fleet.join("incarnations"), "7\n").unwrap();
        let expires = unix_ms(at(5));
        std::fs::write(fleet.join("leases/7"), format!("2 {expires}\n")).unwrap();
        let record = StoredRecord {
            snapshot: None,
            warm: Some(sandkeeper::SandboxId(7 << 32)),
        };
        let old = KeyEntry {
            key: "session:s".into(),
            owner: Some((7, 2)),
            token: 4,
            record: record.clone(),
            wants: BTreeSet::from([3]),
            recording: Some(9),
        };
        std::fs::write(
            fleet.join("keys/session:s.json"),
            serde_json::to_vec_pretty(&old).unwrap(),
        )
        .unwrap();

        let store = LocalStore::open(dir.path(), Duration::from_secs(10)).unwrap();
        assert!(!fleet.join("keys/session:s.json").exists(), "moved");
        assert_eq!(store.entries().unwrap(), vec![old]);
        assert_eq!(store.register().unwrap(), 8);
        assert!(store.is_live((7, 2), at(4)).unwrap());
        assert!(!store.is_live((7, 2), at(5)).unwrap());
        // The old owner's renewal under its epoch lands, and an older one is refused.
        assert_eq!(store.renew(7, 2, at(4)).unwrap(), Some(vec![key("s")]));
        assert_eq!(store.renew(7, 1, at(4)).unwrap(), None);
        assert!(store
            .release(&key("s"), 7, Token(4), record.clone(), at(5))
            .unwrap());
        assert_eq!(
            store.claim(&key("s"), 8, 1, at(6)).unwrap(),
            Claim::Claimed(Token(5), record)
        );
    }

    /// An entry read by a process while another converts it: with the old file and the cell
    /// both present (the converter linked the cell's first version and has not removed the
    /// file yet), the cell is what counts, and the listing shows the key once.
    #[test]
    fn a_key_both_converted_and_still_in_its_old_file_is_read_once_from_its_cell() {
        let (dir, store) = store();
        store.renew(1, 1, at(0)).unwrap();
        let Claim::Claimed(token, _) = store.claim(&key("s"), 1, 1, at(0)).unwrap() else {
            panic!()
        };
        let fleet = dir.path().join(".fleet");
        std::fs::create_dir_all(fleet.join("keys")).unwrap();
        let stale = KeyEntry {
            key: "session:s".into(),
            ..KeyEntry::default()
        };
        std::fs::write(
            fleet.join("keys/session:s.json"),
            serde_json::to_vec(&stale).unwrap(),
        )
        .unwrap();
        let entries = store.entries().unwrap();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].owner, Some((1, 1)));
        assert!(store
            .release(&key("s"), 1, token, StoredRecord::default(), at(1))
            .unwrap());
    }
}
