//! The manifest: the last object a snapshot's upload writes, and the only one whose presence
//! says the snapshot is complete. It names the data object and its size, every
//! entry of the workspace in archive order with its size and content hash, what was skipped,
//! and the retention.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::SnapshotError;

/// The manifest format this crate writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// A snapshot's manifest, stored as JSON at `<prefix>/<name>/manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`] when written.
    pub format: u32,
    /// The snapshot's name (`sbx-<n>-<instance>`).
    pub name: String,
    /// The data object's file name beside the manifest (`data-<upload>.tar`): unique to the
    /// upload that wrote it, so two writers never write the same object.
    pub data: String,
    /// The data object's size in bytes.
    pub data_size: u64,
    /// BLAKE3 of the whole data object, hex: what a fetch that streams the archive on without
    /// unpacking it ([`ObjectSnapshots::fetch_archive`](crate::ObjectSnapshots::fetch_archive))
    /// checks. `None` in manifests written before it was recorded (absent from the JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_hash: Option<String>,
    /// When the snapshot may be swept, in seconds since the Unix epoch; `None`: kept until
    /// discarded.
    pub retain_until: Option<u64>,
    /// The key whose sandbox it was taken from, as the uploader said (`Key`'s text, e.g.
    /// `user:u1`): what a fleet sweep judges it by. `None`: not said (absent from the JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Every entry of the archive, in archive order.
    pub entries: Vec<Entry>,
    /// What the workspace held that a snapshot does not keep.
    pub skipped: Vec<Skipped>,
}

impl Manifest {
    /// Whether the snapshot's retention has passed at `now`.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        let now = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        self.retain_until
            .is_some_and(|until| until <= now.as_secs())
    }

    /// The total size of the regular files.
    pub fn file_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|entry| match entry.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }

    /// Parses a stored manifest of the snapshot `name`.
    pub(crate) fn from_json(name: &str, bytes: &[u8]) -> Result<Self, SnapshotError> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| SnapshotError::corrupt(name, format!("manifest: {e}")))?;
        if manifest.format != MANIFEST_FORMAT {
            let why = format!(
                "manifest format {} (this build reads {MANIFEST_FORMAT})",
                manifest.format
            );
            return Err(SnapshotError::corrupt(name, why));
        }
        if manifest.name != name {
            let why = format!("the manifest names {:?}", manifest.name);
            return Err(SnapshotError::corrupt(name, why));
        }
        let data_ok = manifest.data.starts_with("data-")
            && manifest.data.ends_with(".tar")
            && !manifest.data.contains('/');
        if !data_ok {
            return Err(SnapshotError::corrupt(
                name,
                "the manifest's data object name",
            ));
        }
        Ok(manifest)
    }
}

/// One entry of a snapshot: a path relative to the workspace (`/`-separated, no `.` or `..`)
/// and what is there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The path inside the workspace.
    pub path: String,
    /// What it is.
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EntryKind {
    /// A directory, with its permission bits.
    Dir {
        /// Permission bits (`0o777` at most).
        mode: u32,
    },
    /// A regular file.
    File {
        /// Permission bits (`0o777` at most).
        mode: u32,
        /// Its size in bytes.
        size: u64,
        /// Its modification time, in seconds since the Unix epoch.
        mtime: u64,
        /// BLAKE3 of its contents, hex.
        hash: String,
    },
    /// A symbolic link, kept as a link: its target is recorded, never followed.
    Symlink {
        /// The link's target, as written.
        target: String,
    },
}

/// Something in the workspace a snapshot does not keep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Its path (lossy where the name is not UTF-8).
    pub path: String,
    /// Why: a FIFO, a socket, a device, or a name that is not UTF-8.
    pub why: String,
}
