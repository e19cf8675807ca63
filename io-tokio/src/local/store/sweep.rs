//! The fleet-safe sweep of a local root: what a crashed or departed process left under the root
//! (sandbox directories, kept snapshots) goes once nothing may need it, by
//! [`sandkeeper::sweep_verdict`], the decision every fleet sweep and the simulator share.
//!
//! It decides and moves under the store's lock, so that no claim, record write or renewal comes
//! between the two: a doomed directory is *renamed* into `<root>/.fleet/trash/` (O(1)) and a
//! record's reference to a snapshot whose retention ended is dropped in the same step; the
//! trash is emptied after the lock is let go, so a large workspace never holds up the store.
//! What it reads beside each object: `.sandkeeper/sandbox.json` (its key), and for a snapshot
//! `.sandkeeper/expires` (the retention its Persist recorded).
//!
//! It judges leases and retention one lease later than a claim would (`now - lease`): a claim
//! made on a clock that runs ahead is fenced at the backend, but a removal cannot be taken back,
//! so the sweep leaves a process whose clock drifts that much room.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sandkeeper::{
    sweep_verdict, Instant, SandboxId, Snapshot, SweepKey, SweepObject, SweepVerdict,
};

use super::{parse_key, unix_ms, LocalStore, StoreError};

/// What one sweep removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Sandbox directories removed.
    pub sandboxes: u64,
    /// Snapshots removed.
    pub snapshots: u64,
    /// Of those snapshots, ones a key's record named until its retention ended (the record no
    /// longer names them).
    pub unrecorded: u64,
}

impl std::ops::AddAssign for Swept {
    fn add_assign(&mut self, other: Swept) {
        self.sandboxes += other.sandboxes;
        self.snapshots += other.snapshots;
        self.unrecorded += other.unrecorded;
    }
}

impl LocalStore {
    /// Sweeps the root this store is under, at `now` (the caller's wall clock, as every store
    /// operation's), judging leases and retention as of `now - lease`. See the module docs.
    pub fn sweep(&self, now: SystemTime) -> Result<Swept, StoreError> {
        let root = self.root();
        let trash = self.dir.join("trash");
        fs::create_dir_all(&trash).map_err(|e| self.io(e))?;
        let mut swept = Swept::default();
        let now = now.checked_sub(self.lease).unwrap_or(UNIX_EPOCH);
        {
            let _lock = self.lock()?;
            let mut entries = BTreeMap::new();
            let mut keys = BTreeMap::new();
            for entry in self.entries()? {
                let key = parse_key(&entry.key)
                    .map_err(|why| self.malformed(&self.entry_path(&entry.key), why))?;
                let owner_live = match entry.owner {
                    Some(owner) => self.is_live(owner, now)?,
                    None => false,
                };
                let record = entry.record.on_unix_clock();
                keys.insert(key.clone(), SweepKey { owner_live, record });
                entries.insert(key, entry);
            }
            let now_core = core_instant(now);
            for (path, object) in self.objects(&root)? {
                let verdict = sweep_verdict(
                    &object,
                    &keys,
                    |incarnation| self.lease_live(incarnation, now).unwrap_or(true),
                    now_core,
                );
                if verdict == SweepVerdict::Keep {
                    continue;
                }
                let name = path.file_name().expect("a listed directory").to_owned();
                match fs::rename(&path, trash.join(&name)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(self.io(e)),
                }
                tracing::info!(object = %path.display(), ?verdict, "swept");
                match object {
                    SweepObject::Sandbox { .. } => swept.sandboxes += 1,
                    SweepObject::Snapshot { key, .. } => {
                        swept.snapshots += 1;
                        if verdict == SweepVerdict::SweepAndUnrecord {
                            let key = key.expect("a recorded snapshot's key is known");
                            let entry = entries.get_mut(&key).expect("a recorded key");
                            entry.record.snapshot = None;
                            self.write_entry(entry)?;
                            swept.unrecorded += 1;
                        }
                    }
                }
            }
        }
        // Outside the lock: a removal takes as long as the workspace is large.
        for item in fs::read_dir(&trash).map_err(|e| self.io(e))? {
            let path = item.map_err(|e| self.io(e))?.path();
            match fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(swept)
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

    /// The sandbox directories and snapshots under `root`, as the sweep sees them.
    fn objects(&self, root: &Path) -> Result<Vec<(PathBuf, SweepObject)>, StoreError> {
        let mut out = vec![];
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
                let (key, resumed_from) = read_info(&path);
                let object = if snapshots {
                    SweepObject::Snapshot {
                        snapshot: Snapshot::new(name.clone()),
                        by: SandboxId(id),
                        key,
                        expires: read_expiry(&path),
                    }
                } else {
                    SweepObject::Sandbox {
                        id: SandboxId(id),
                        key,
                        resumed_from,
                    }
                };
                out.push((path, object));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// The key a sandbox (or the snapshot of one) was started for, and the snapshot its start
/// took, from its `sandbox.json`; `None` for what cannot be read.
fn read_info(dir: &Path) -> (Option<sandkeeper::Key>, Option<Snapshot>) {
    let info = crate::local::layout::read_sandbox_info(dir).unwrap_or_default();
    let key = info.key.and_then(|k| parse_key(&k).ok());
    (key, info.resumed_from.map(Snapshot::new))
}

/// The expiry a Persist recorded in a snapshot (unix seconds), as the sweep's instant.
fn read_expiry(dir: &Path) -> Option<Instant> {
    let text = fs::read_to_string(dir.join(".sandkeeper").join("expires")).ok()?;
    let secs: u64 = text.trim().parse().ok()?;
    Some(Instant::from_nanos(secs.saturating_mul(1_000_000_000)))
}

/// A wall-clock time as the sweep's instant: nanoseconds since the Unix epoch.
fn core_instant(t: SystemTime) -> Instant {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}
