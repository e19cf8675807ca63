//! The keeper's own record of each sandbox and snapshot of a local root, kept outside every
//! workspace:
//!
//! ```text
//! <root>/.meta/sandboxes/sbx-<n>.json    what sandbox <n> was started for (its key, the snapshot it took)
//! <root>/.meta/snapshots/<snapshot>.json what a snapshot was taken from, whether a Persist kept it, until when
//! ```
//!
//! Why here: a workspace is its commands' to change, and what runs there is hostile. Whatever
//! the keeper decides from (which directory a resume or an adoption takes, what a sweep keeps or
//! removes, when a retention ends) must be nothing a command can write. A sandbox's bubblewrap
//! binds only its own workspace and hides the keeper's root under an empty `tmpfs`
//! (`isolation.rs`), so `.meta/` is out of every command's reach, as `.tokens/` and `.fleet/`
//! are.
//!
//! A record lives as long as its directory, in a crash-safe order: it is written (a temporary,
//! synced, renamed over the record, the directory synced) *before* the directory it describes is
//! made or renamed into place, and removed only *after* that directory is gone. So a directory
//! the keeper made always has its record; a crash between the two leaves a record without a
//! directory, which a sweep removes once it is older than [`ORPHAN_AGE`] (`clear_orphans`).
//!
//! A directory without a record (one made by a keeper older than this layout, whose metadata was
//! inside the workspace, or one made by hand) is never judged from its workspace: the sweeps keep
//! it, a resume by its snapshot name still takes it, and an adoption of a live one writes its
//! record from the adopting owner's own request. A record that is there but cannot be read as
//! one is an error ([`MetaError::Malformed`]), never a guess.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandkeeper::{PathName, SandboxId, Snapshot};
use serde::{Deserialize, Serialize};

use super::nofollow;

/// The keeper's directory of records under the root.
pub const META_ROOT: &str = ".meta";

/// How old a record without its directory (or a temporary left by a crashed write) must be
/// before a sweep takes it for a crash's leftover: a record is written moments before its
/// directory is made, and removed moments after it is gone.
pub const ORPHAN_AGE: Duration = Duration::from_secs(3_600);

/// The largest record read: one is a few hundred bytes.
const MAX_RECORD: u64 = 64 << 10;

/// What a sandbox was started for, as its Start (or an Adopt that found no record) wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartedFor {
    /// The sandbox.
    pub sandbox: u64,
    /// Its key, as it displays (`session:<id>`, …).
    pub key: String,
    /// The spec it was started with; `None` when an adoption wrote the record (an older root's
    /// sandbox), which does not know it.
    pub spec: Option<String>,
    /// The snapshot its start took as its workspace (renamed it to the sandbox's directory).
    pub resumed_from: Option<String>,
}

/// What a snapshot is: what the sandbox it was taken from was started for, and what its Persist
/// said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRecord {
    /// The record of the sandbox whose Stop took the snapshot.
    pub taken_from: StartedFor,
    /// A Persist kept it (else Shutdown removes it with its sandbox).
    pub persisted: bool,
    /// The end of the retention its Persist recorded, in seconds since the Unix epoch (rounded
    /// up); `None`: kept until its key's next start.
    pub expires: Option<u64>,
}

impl SnapshotRecord {
    /// The end of its retention, if its Persist recorded one.
    pub fn expiry(&self) -> Option<SystemTime> {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(self.expires?))
    }
}

/// A record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The file system failed.
    #[error("keeper record {}: {source}", path.display())]
    Io {
        /// The record (or its directory).
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A record is there but is not one: it is never followed, and never guessed at.
    #[error("keeper record {} is malformed: {why}", path.display())]
    Malformed {
        /// The record.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A snapshot name that is not one safe path component: no record is made of it.
    #[error("{name:?} is not a snapshot name a record can be kept under")]
    Name {
        /// The name.
        name: String,
    },
}

impl MetaError {
    /// The file system's `source` at `path`.
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        MetaError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The file system error beneath, if that is what failed.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            MetaError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

/// The record of `sandbox` under `root`, if there is one.
pub fn sandbox_record(root: &Path, sandbox: SandboxId) -> Result<Option<StartedFor>, MetaError> {
    let path = sandbox_record_path(root, sandbox);
    let Some(record) = read::<StartedFor>(&path)? else {
        return Ok(None);
    };
    if record.sandbox != sandbox.0 {
        return Err(MetaError::Malformed {
            path,
            why: format!("it is the record of sandbox {}", record.sandbox),
        });
    }
    Ok(Some(record))
}

/// The record of `snapshot` under `root`, if there is one.
pub fn snapshot_record(
    root: &Path,
    snapshot: &Snapshot,
) -> Result<Option<SnapshotRecord>, MetaError> {
    read(&snapshot_record_path(root, snapshot)?)
}

/// Writes the record of `sandbox` atomically (before its directory is made: module docs).
pub fn record_sandbox(
    root: &Path,
    sandbox: SandboxId,
    record: &StartedFor,
) -> Result<(), MetaError> {
    if record.sandbox != sandbox.0 {
        return Err(MetaError::Malformed {
            path: sandbox_record_path(root, sandbox),
            why: format!("it would be the record of sandbox {}", record.sandbox),
        });
    }
    write(&sandbox_record_path(root, sandbox), record)
}

/// Writes the record of `snapshot` atomically (before its directory is renamed into place).
pub fn record_snapshot(
    root: &Path,
    snapshot: &Snapshot,
    record: &SnapshotRecord,
) -> Result<(), MetaError> {
    write(&snapshot_record_path(root, snapshot)?, record)
}

/// Removes the record of `sandbox` (after its directory is gone); none there is no error.
pub(crate) fn forget_sandbox(root: &Path, sandbox: SandboxId) -> Result<(), MetaError> {
    remove(&sandbox_record_path(root, sandbox))
}

/// Removes the record of `snapshot` (after its directory is gone); none there is no error.
pub(crate) fn forget_snapshot(root: &Path, snapshot: &Snapshot) -> Result<(), MetaError> {
    remove(&snapshot_record_path(root, snapshot)?)
}

/// Removes the records under `root` whose directory is gone and which are older than
/// [`ORPHAN_AGE`] at `now`, and temporaries of writes that crashed as old; returns how many.
pub(crate) fn clear_orphans(root: &Path, now: SystemTime) -> Result<usize, MetaError> {
    let Some(before) = now.checked_sub(ORPHAN_AGE) else {
        return Ok(0);
    };
    let meta = root.join(META_ROOT);
    let mut cleared = 0;
    for (records, objects) in [
        (meta.join("sandboxes"), root.to_path_buf()),
        (
            meta.join("snapshots"),
            root.join(super::layout::SNAPSHOTS_DIR),
        ),
    ] {
        let items = match std::fs::read_dir(&records) {
            Ok(items) => items,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(MetaError::io(&records, source)),
        };
        for item in items {
            let item = item.map_err(|source| MetaError::io(&records, source))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let leftover = match name.strip_suffix(".json") {
                Some(object) if !name.starts_with('.') => !objects.join(object).exists(),
                // A temporary: its write crashed, or is under way (then it is young).
                _ => true,
            };
            let old = item
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at < before);
            if leftover && old {
                remove(&item.path())?;
                cleared += 1;
            }
        }
    }
    Ok(cleared)
}

fn sandbox_record_path(root: &Path, sandbox: SandboxId) -> PathBuf {
    root.join(META_ROOT)
        .join("sandboxes")
        .join(format!("sbx-{}.json", sandbox.0))
}

fn snapshot_record_path(root: &Path, snapshot: &Snapshot) -> Result<PathBuf, MetaError> {
    let name = PathName::new(snapshot.as_str()).map_err(|_| MetaError::Name {
        name: snapshot.as_str().to_string(),
    })?;
    Ok(root
        .join(META_ROOT)
        .join("snapshots")
        .join(format!("{}.json", name.as_str())))
}

fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, MetaError> {
    let (dir, name) = split(path);
    let read =
        nofollow::open_dir(dir).and_then(|dir| nofollow::read_file(dir, name, MAX_RECORD as usize));
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if matches!(nofollow::refusal(&e), Some(nofollow::Refused::TooLarge(_))) => {
            return Err(MetaError::Malformed {
                path: path.to_path_buf(),
                why: e.to_string(),
            })
        }
        Err(source) => return Err(MetaError::io(path, source)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| MetaError::Malformed {
            path: path.to_path_buf(),
            why: e.to_string(),
        })
}

/// Writes `record` to `path`: `nofollow::write_file`'s temporary beside it (a name of its own,
/// never another writer's), synced, renamed over it, then the directory synced, so that a
/// reader sees the old record or the new one, and a crash after the write leaves the new one.
fn write(path: &Path, record: &impl Serialize) -> Result<(), MetaError> {
    let io = |source| MetaError::io(path, source);
    let (dir, name) = split(path);
    std::fs::create_dir_all(dir).map_err(io)?;
    let bytes = serde_json::to_vec(record).map_err(|e| MetaError::Malformed {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let dir = nofollow::open_dir(dir).map_err(io)?;
    nofollow::write_file(&dir, name, &bytes).map_err(io)?;
    rustix::fs::fsync(&dir).map_err(|e| io(e.into()))
}

/// A record's directory and file name (every record path is `<root>/.meta/<kind>/<name>.json`).
fn split(path: &Path) -> (&Path, &str) {
    let dir = path.parent().expect("a record is in a directory");
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a record's name is its object's, valid UTF-8");
    (dir, name)
}

fn remove(path: &Path) -> Result<(), MetaError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(MetaError::io(path, source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sk-meta-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn started(sandbox: u64) -> StartedFor {
        StartedFor {
            sandbox,
            key: "session:s".into(),
            spec: Some(String::new()),
            resumed_from: None,
        }
    }

    #[test]
    fn records_round_trip_and_are_forgotten() {
        let root = scratch("round-trip");
        let x = SandboxId(7);
        assert_eq!(sandbox_record(&root, x).unwrap(), None);
        record_sandbox(&root, x, &started(7)).unwrap();
        assert_eq!(sandbox_record(&root, x).unwrap(), Some(started(7)));
        let snap = Snapshot::new("sbx-7-a");
        let kept = SnapshotRecord {
            taken_from: started(7),
            persisted: true,
            expires: Some(10),
        };
        record_snapshot(&root, &snap, &kept).unwrap();
        assert_eq!(snapshot_record(&root, &snap).unwrap(), Some(kept));
        forget_sandbox(&root, x).unwrap();
        forget_sandbox(&root, x).unwrap();
        forget_snapshot(&root, &snap).unwrap();
        assert_eq!(sandbox_record(&root, x).unwrap(), None);
        assert_eq!(snapshot_record(&root, &snap).unwrap(), None);
        let left: Vec<_> = std::fs::read_dir(root.join(".meta/sandboxes"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "no temporary left: {left:?}");
    }

    #[test]
    fn a_malformed_record_is_an_error_that_says_what_is_wrong() {
        let root = scratch("malformed");
        let x = SandboxId(3);
        let path = sandbox_record_path(&root, x);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        for (bytes, says) in [
            (&b"not json"[..], "expected"),
            (
                br#"{"sandbox":4,"key":"k","spec":null,"resumed_from":null}"#,
                "sandbox 4",
            ),
            (
                br#"{"sandbox":3,"key":"k","spec":null,"resumed_from":null,"x":1}"#,
                "unknown field",
            ),
        ] {
            std::fs::write(&path, bytes).unwrap();
            let e = sandbox_record(&root, x).unwrap_err();
            assert!(matches!(e, MetaError::Malformed { .. }), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        std::fs::write(&path, vec![b' '; MAX_RECORD as usize + 1]).unwrap();
        assert!(matches!(
            sandbox_record(&root, x),
            Err(MetaError::Malformed { .. })
        ));
        assert!(matches!(
            snapshot_record(&root, &Snapshot::new("../x")),
            Err(MetaError::Name { .. })
        ));
    }

    #[test]
    fn only_old_records_without_their_directory_are_cleared() {
        let root = scratch("orphans");
        record_sandbox(&root, SandboxId(1), &started(1)).unwrap();
        record_sandbox(&root, SandboxId(2), &started(2)).unwrap();
        std::fs::create_dir_all(root.join("sbx-2")).unwrap();
        // A record's age is its file's, on the wall clock: the test's `now` is that clock.
        #[allow(clippy::disallowed_methods)]
        let now = SystemTime::now();
        assert_eq!(clear_orphans(&root, now).unwrap(), 0, "young: kept");
        assert_eq!(clear_orphans(&root, now + ORPHAN_AGE * 2).unwrap(), 1);
        assert_eq!(sandbox_record(&root, SandboxId(1)).unwrap(), None);
        assert_eq!(
            sandbox_record(&root, SandboxId(2)).unwrap(),
            Some(started(2))
        );
    }
}
