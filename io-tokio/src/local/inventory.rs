//! What a local root holds, as a fleet sweep sees it, and the removal of one object: the one
//! place that knows it, used by the local root's own store (`store/sweep.rs`) and by any other
//! fleet store a keeper runs this backend under (a PostgreSQL store's `Inventory` is a thin
//! adapter over it). The store judges each object (leases, records, by
//! [`sandkeeper::sweep_verdict`]); this module only lists and removes.
//!
//! **Listed from the keeper's records, never from a workspace.** An object is a directory
//! `<root>/sbx-<n>` (a sandbox) or `<root>/.snapshots/sbx-<n>-<instance>` (a kept snapshot),
//! read as a directory entry without following a link (a link at either name is no object),
//! and described only by its record under `<root>/.meta/` (`meta.rs`): its key, the snapshot a
//! sandbox's start took, a snapshot's recorded retention. Nothing inside a workspace is read (a
//! command may have forged anything there, a `.meta/` of its own included). A directory without
//! a record (an older keeper's, or made by hand) is not listed, so it is kept, never judged on a
//! guess; a record that is not one is an error naming it ([`MetaError::Malformed`]).
//!
//! **Removed in the crash-safe order of the records.** A doomed directory is *renamed* into the
//! root's trash, `<root>/.fleet/trash/` (O(1), under a name no other sweep uses), then its
//! record is removed: a crash between the two leaves a record without its directory, which a
//! later sweep takes once old ([`clear_leftovers`]); never a directory without its record. The trashed directory is deleted after ([`remove_swept`] at once; the
//! local store once every decision of its sweep is acted on, [`empty_trash`]). Deletion never
//! follows a link in the workspace: `std::fs::remove_dir_all` removes a link, not its target.
//!
//! Everything here blocks on the file system: async callers run it on a blocking thread
//! (`tokio::task::spawn_blocking`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sandkeeper::{Instant, Key, PathName, SandboxId, Snapshot, SweepObject};

use super::layout::SNAPSHOTS_DIR;
use super::meta::{self, MetaError, StartedFor};

/// The root's trash, where a sweep renames what it removes before deleting it.
pub fn trash_dir(root: &Path) -> PathBuf {
    root.join(".fleet").join("trash")
}

/// The sandboxes and kept snapshots under `root` that have a keeper record, as the sweep judges
/// them, in the order of their directories' paths. Directories without a record are left out
/// (kept) and counted in a warning. See the module docs.
pub fn sweep_objects(root: &Path) -> Result<Vec<SweepObject>, MetaError> {
    let mut listed = vec![];
    let mut unrecorded = 0usize;
    for (dir, snapshots) in [
        (root.to_path_buf(), false),
        (root.join(SNAPSHOTS_DIR), true),
    ] {
        let items = match fs::read_dir(&dir) {
            Ok(items) => items,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(MetaError::io(&dir, source)),
        };
        for item in items {
            let item = item.map_err(|source| MetaError::io(&dir, source))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let Some(id) = object_id(&name, snapshots) else {
                continue;
            };
            // The entry's own type: a link is not a directory, and is never followed.
            let path = item.path();
            if !item
                .file_type()
                .map_err(|e| MetaError::io(&path, e))?
                .is_dir()
            {
                continue;
            }
            match recorded_object(root, &name, id, snapshots)? {
                Some(object) => listed.push((path, object)),
                None => {
                    tracing::debug!(object = %path.display(), "no keeper record: kept");
                    unrecorded += 1;
                }
            }
        }
    }
    if unrecorded > 0 {
        tracing::warn!(
            unrecorded,
            "objects without a keeper record (an older keeper's?) are kept: remove by hand \
             those no key continues (docs/operations-errors.md)"
        );
    }
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(listed.into_iter().map(|(_, object)| object).collect())
}

/// Removes `object` from `root`: its directory to the trash, then its record, then the trashed
/// directory deleted. Whether it was there to remove (`false`: another sweep took it, or it is
/// not a directory with a record, which is kept).
pub fn remove_swept(root: &Path, object: &SweepObject) -> Result<bool, MetaError> {
    let Some(trashed) = trash_swept(root, object)? else {
        return Ok(false);
    };
    delete_trashed(&trashed)?;
    Ok(true)
}

/// Renames `object`'s directory into the root's trash and then removes its record; where it
/// went, or `None` when it was not there to move (another sweep took it) or is no object of the
/// sweep's (a link, a file, a directory without a record: kept). The caller deletes the trash
/// ([`empty_trash`]).
pub fn trash_swept(root: &Path, object: &SweepObject) -> Result<Option<PathBuf>, MetaError> {
    let dir = object_dir(root, object)?;
    match fs::symlink_metadata(&dir) {
        Ok(found) if found.is_dir() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(MetaError::io(&dir, e)),
    }
    if !has_record(root, object)? {
        return Ok(None);
    }
    let trash = trash_dir(root);
    fs::create_dir_all(&trash).map_err(|e| MetaError::io(&trash, e))?;
    let Some(trashed) = rename_into(&dir, &trash)? else {
        return Ok(None);
    };
    // The record once the directory is gone from its place (module docs).
    match object {
        SweepObject::Sandbox { id, .. } => meta::forget_sandbox(root, *id)?,
        SweepObject::Snapshot { snapshot, .. } => meta::forget_snapshot(root, snapshot)?,
    }
    Ok(Some(trashed))
}

/// Deletes whatever is in the root's trash: what this sweep renamed there, another's, or a
/// crashed one's.
pub fn empty_trash(root: &Path) -> Result<(), MetaError> {
    let trash = trash_dir(root);
    let items = match fs::read_dir(&trash) {
        Ok(items) => items,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(MetaError::io(&trash, e)),
    };
    for item in items {
        delete_trashed(&item.map_err(|e| MetaError::io(&trash, e))?.path())?;
    }
    Ok(())
}

/// What a crashed sweep or a crashed start left under `root`, cleared at `now` (the wall
/// clock): the trash emptied, and records without their directory older than
/// [`meta::ORPHAN_AGE`] removed. Returns how many records went.
pub fn clear_leftovers(root: &Path, now: SystemTime) -> Result<usize, MetaError> {
    empty_trash(root)?;
    meta::clear_orphans(root, now)
}

/// The directory `object` is under `root`. A snapshot's name must be one safe path component
/// ([`MetaError::Name`] otherwise): a name is never a path to follow.
pub fn object_dir(root: &Path, object: &SweepObject) -> Result<PathBuf, MetaError> {
    match object {
        SweepObject::Sandbox { id, .. } => Ok(root.join(format!("sbx-{}", id.0))),
        SweepObject::Snapshot { snapshot, .. } => {
            let name = PathName::new(snapshot.as_str()).map_err(|_| MetaError::Name {
                name: snapshot.as_str().to_string(),
            })?;
            Ok(root.join(SNAPSHOTS_DIR).join(name.as_str()))
        }
    }
}

/// The sandbox a directory name is of: `sbx-<n>` for a sandbox, `sbx-<n>-<instance>` for a
/// snapshot; `None` for any other name.
fn object_id(name: &str, snapshot: bool) -> Option<SandboxId> {
    let rest = name.strip_prefix("sbx-")?;
    let (id, instance) = match rest.split_once('-') {
        Some((id, instance)) => (id, Some(instance)),
        None => (rest, None),
    };
    if instance.is_some() != snapshot {
        return None;
    }
    id.parse().ok().map(SandboxId)
}

/// The sweep's view of the directory `name` (a sandbox's, or a snapshot's made by `id`) from
/// its record under `root`; `None` without a record.
fn recorded_object(
    root: &Path,
    name: &str,
    id: SandboxId,
    snapshot: bool,
) -> Result<Option<SweepObject>, MetaError> {
    if snapshot {
        let snapshot = Snapshot::new(name);
        let Some(record) = meta::snapshot_record(root, &snapshot)? else {
            return Ok(None);
        };
        let key = recorded_key(&record.taken_from, root, "snapshots", name)?;
        return Ok(Some(SweepObject::Snapshot {
            snapshot,
            by: id,
            key: Some(key),
            expires: record.expires.map(expiry_instant),
        }));
    }
    let Some(record) = meta::sandbox_record(root, id)? else {
        return Ok(None);
    };
    let key = recorded_key(&record, root, "sandboxes", name)?;
    Ok(Some(SweepObject::Sandbox {
        id,
        key: Some(key),
        resumed_from: record.resumed_from.map(Snapshot::new),
    }))
}

/// Whether `object` has its keeper record under `root` (only such an object is removed).
fn has_record(root: &Path, object: &SweepObject) -> Result<bool, MetaError> {
    Ok(match object {
        SweepObject::Sandbox { id, .. } => meta::sandbox_record(root, *id)?.is_some(),
        SweepObject::Snapshot { snapshot, .. } => meta::snapshot_record(root, snapshot)?.is_some(),
    })
}

/// The key a record says its sandbox was started for; a malformed record error naming the
/// record (`<root>/.meta/<kind>/<name>.json`) otherwise.
fn recorded_key(
    record: &StartedFor,
    root: &Path,
    kind: &str,
    name: &str,
) -> Result<Key, MetaError> {
    Key::try_from(record.key.clone()).map_err(|e| MetaError::Malformed {
        path: root
            .join(meta::META_ROOT)
            .join(kind)
            .join(format!("{name}.json")),
        why: format!("key {:?}: {e}", record.key),
    })
}

/// Renames `dir` into `trash` under a name of its own (two sweeps, even of processes with one
/// process id in different namespaces, never rename onto each other's): where it went, or
/// `None` when it was not there to move.
fn rename_into(dir: &Path, trash: &Path) -> Result<Option<PathBuf>, MetaError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = dir.file_name().unwrap_or_default();
    let mut last = None;
    for _ in 0..100 {
        let mut unique = name.to_owned();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        unique.push(format!(".{}-{n}", std::process::id()));
        let to = trash.join(unique);
        match fs::rename(dir, &to) {
            Ok(()) => return Ok(Some(to)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // The name is taken: another one.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
                ) =>
            {
                last = Some(e)
            }
            Err(e) => return Err(MetaError::io(dir, e)),
        }
    }
    let source = last.unwrap_or_else(|| io::Error::other("no name free in the trash"));
    Err(MetaError::io(dir, source))
}

/// Deletes a trashed directory (a link in it is removed, never followed); gone already is no
/// error (another sweep emptied the trash).
fn delete_trashed(path: &Path) -> Result<(), MetaError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MetaError::io(path, e)),
    }
}

/// A retention's end in seconds since the Unix epoch, as the sweep's instant.
fn expiry_instant(secs: u64) -> Instant {
    Instant::from_nanos(secs.saturating_mul(1_000_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sk-inventory-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn sandbox(n: u64) -> SweepObject {
        SweepObject::Sandbox {
            id: SandboxId(n),
            key: None,
            resumed_from: None,
        }
    }

    fn record(root: &Path, n: u64) {
        let started = StartedFor {
            sandbox: n,
            key: "session:s".into(),
            spec: None,
            resumed_from: None,
        };
        meta::record_sandbox(root, SandboxId(n), &started).unwrap();
    }

    /// Only a real directory with its record is listed and removed: one without a record stays,
    /// a link at an object's name (even with a record) is neither listed nor moved, and a
    /// snapshot name that is a path is a typed error, never a path followed.
    #[test]
    fn only_recorded_directories_are_listed_and_removed() {
        let root = scratch("removed");
        let outside = scratch("removed-outside");
        for n in [1, 2] {
            fs::create_dir_all(root.join(format!("sbx-{n}"))).unwrap();
        }
        record(&root, 1);
        record(&root, 3);
        std::os::unix::fs::symlink(&outside, root.join("sbx-3")).unwrap();

        let listed = sweep_objects(&root).unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(matches!(
            listed[0],
            SweepObject::Sandbox {
                id: SandboxId(1),
                ..
            }
        ));
        assert!(!remove_swept(&root, &sandbox(2)).unwrap(), "no record");
        assert!(root.join("sbx-2").is_dir());
        assert!(!remove_swept(&root, &sandbox(3)).unwrap(), "a link");
        assert!(fs::symlink_metadata(root.join("sbx-3")).is_ok());
        assert!(remove_swept(&root, &sandbox(1)).unwrap());
        assert!(!root.join("sbx-1").exists());
        assert_eq!(meta::sandbox_record(&root, SandboxId(1)).unwrap(), None);
        assert!(!remove_swept(&root, &sandbox(1)).unwrap(), "gone already");
        assert_eq!(fs::read_dir(trash_dir(&root)).unwrap().count(), 0);

        let escaping = SweepObject::Snapshot {
            snapshot: Snapshot::new("../sbx-2"),
            by: SandboxId(2),
            key: None,
            expires: None,
        };
        let e = remove_swept(&root, &escaping).unwrap_err();
        assert!(matches!(e, MetaError::Name { .. }), "{e}");
        assert!(root.join("sbx-2").is_dir());
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }
}
