//! Where a local sandbox's files live, derived only from validated names, and the atomic write.
//!
//! ```text
//! <root>/sbx-<n>/                          one sandbox (its working directory: its workspace)
//! <root>/sbx-<n>/.sandkeeper/<session>/<path>   a session's mirrored file
//! <root>/.snapshots/<snapshot>/            a stopped sandbox's saved workspace
//! <root>/.meta/sandboxes/sbx-<n>.json      what sandbox <n> was started for (`meta.rs`)
//! <root>/.meta/snapshots/<snapshot>.json   what a snapshot was taken from, persisted, its expiry
//! <root>/.tokens/, <root>/.fleet/          fencing tokens (`fence.rs`), a fleet's store (`store/`)
//! ```
//!
//! `<n>` is the core's sandbox number; `<session>` and `<path>` are [`SessionId`] and
//! [`PathName`] values, which the core validated as single safe path components; a snapshot
//! name is checked the same way before it is used.
//!
//! Everything under `<root>/sbx-<n>/` and `<root>/.snapshots/<snapshot>/` is a workspace, its
//! commands' to change, `.sandkeeper/` included: the keeper writes there only the session
//! mirrors the commands read, and only through directory handles that never follow a link
//! (`nofollow.rs`). What the keeper decides from (what a directory was started for, whether a
//! snapshot is kept and until when) is in `.meta/`, outside every workspace and hidden from
//! every sandbox (`meta.rs`): a workspace's own `.sandkeeper/sandbox.json`, `persisted` or
//! `expires` (an older keeper wrote them there) are a command's files like any other, and never
//! read.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sandkeeper::{PathName, SandboxId, SessionId, Snapshot, UploadId};

/// The directory of a sandbox's session mirrors inside its workspace.
pub(crate) const META_DIR: &str = ".sandkeeper";

/// The directory of snapshots under the root.
pub(crate) const SNAPSHOTS_DIR: &str = ".snapshots";

/// A sandbox's directory.
pub(crate) fn sandbox_dir(root: &Path, sandbox: SandboxId) -> PathBuf {
    root.join(format!("sbx-{}", sandbox.0))
}

/// The sandbox a sandbox directory (`sbx-<n>`) is of, if its name is one.
pub(crate) fn sandbox_of(dir: &Path) -> Option<SandboxId> {
    let name = dir.file_name()?.to_str()?;
    name.strip_prefix("sbx-")?.parse().ok().map(SandboxId)
}

/// The sandbox directories under `root` (`sbx-<n>`), in name order.
pub(crate) fn sandbox_dirs(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() && entry.file_name().to_string_lossy().starts_with("sbx-") {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The snapshot directories under `root`, in name order (none when there is no snapshot
/// directory).
pub(crate) fn snapshot_dirs(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    let entries = match std::fs::read_dir(root.join(SNAPSHOTS_DIR)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(dirs),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Where a session's mirrored file `path` is inside `dir`, a sandbox's workspace or a snapshot's
/// (for checks of what a workspace holds, wherever it is).
pub fn session_file(dir: &Path, session: &SessionId, path: &PathName) -> PathBuf {
    dir.join(META_DIR)
        .join(session.as_str())
        .join(path.as_str())
}

/// A snapshot's directory, if its name is one safe path component.
pub(crate) fn snapshot_dir(root: &Path, snapshot: &Snapshot) -> io::Result<PathBuf> {
    let name = PathName::new(snapshot.as_str())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    Ok(root.join(SNAPSHOTS_DIR).join(name.as_str()))
}

/// Writes `bytes` to `target` atomically: a temporary file beside it (named after the upload,
/// so concurrent writers never share one), flushed, then renamed over the target. A reader sees
/// the old file or the new one, never a part. Only for the keeper's files outside every
/// workspace (the token files under `<root>/.tokens/`): a path in a workspace may go through a
/// link a command planted, and is written through handles instead (`nofollow.rs`).
pub(crate) fn write_atomically(target: &Path, upload: UploadId, bytes: &[u8]) -> io::Result<()> {
    let parent = target
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))?;
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{upload}.tmp"));
    let tmp = parent.join(tmp_name);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        std::fs::rename(&tmp, target)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_sandbox_and_snapshot_names_are_checked() {
        let root = Path::new("/r");
        let dir = sandbox_dir(root, SandboxId(4));
        assert_eq!(dir, Path::new("/r/sbx-4"));
        let s = SessionId::new("s1").unwrap();
        let p = PathName::session_log();
        assert_eq!(
            session_file(&dir, &s, &p),
            Path::new("/r/sbx-4/.sandkeeper/s1/session.log")
        );
        assert!(snapshot_dir(root, &Snapshot::new("../etc")).is_err());
        assert!(snapshot_dir(root, &Snapshot::new("a/b")).is_err());
        assert_eq!(
            snapshot_dir(root, &Snapshot::new("sbx-4")).unwrap(),
            Path::new("/r/.snapshots/sbx-4")
        );
    }
}
