//! What can go wrong with a snapshot, typed so a caller can tell a snapshot that is not there
//! from one that is damaged and from a store that may answer next time.

use std::io;

/// A snapshot operation's failure.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A snapshot name, or an instance, that is not of the form this crate writes.
    #[error("invalid snapshot name {name:?}: {why}")]
    InvalidName {
        /// The name as given (at most 200 characters of it).
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No complete snapshot of that name: its manifest is absent.
    #[error("snapshot {name} not found")]
    NotFound {
        /// The snapshot's name.
        name: String,
    },
    /// A complete snapshot of that name exists already; it is never replaced.
    #[error("snapshot {name} already exists")]
    AlreadyExists {
        /// The snapshot's name.
        name: String,
    },
    /// The snapshot's objects do not agree with its manifest (truncated, altered, missing), or
    /// the archive holds an entry this crate refuses to unpack (escaping the target, a hard
    /// link, a device).
    #[error("snapshot {name} is corrupt: {why}")]
    Corrupt {
        /// The snapshot's name.
        name: String,
        /// What disagreed.
        why: String,
    },
    /// The directory a download was to make exists already.
    #[error("download target {path} exists")]
    TargetExists {
        /// The target directory.
        path: String,
    },
    /// Reading the workspace or writing the target failed on this host.
    #[error("local file system: {0}")]
    Local(#[source] io::Error),
    /// A workspace archive streamed from a sandbox
    /// ([`upload_archive`](crate::ObjectSnapshots::upload_archive)) did not come whole: its
    /// maker failed or went away, or what came is not a whole tar. Nothing was kept.
    #[error("the workspace archive: {0}")]
    Source(String),
    /// A streamed fetch's receiver stopped taking the archive.
    #[error("the archive's receiver stopped")]
    ReceiverGone,
    /// The object store failed. `retryable` is true when the same call may succeed later (a
    /// server error or a transport failure that outlasted `object_store`'s own retries); false
    /// when it will not without a change (permissions, configuration, an unsupported
    /// operation).
    #[error("object store ({}): {source}", if *retryable { "retryable" } else { "not retryable" })]
    Store {
        /// Whether trying again later may succeed.
        retryable: bool,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
}

impl SnapshotError {
    /// A store failure, classified.
    pub(crate) fn store(source: object_store::Error) -> Self {
        use object_store::Error as E;
        let retryable = matches!(source, E::Generic { .. } | E::JoinError { .. });
        SnapshotError::Store { retryable, source }
    }

    /// A corruption of the snapshot `name`.
    pub(crate) fn corrupt(name: impl ToString, why: impl ToString) -> Self {
        SnapshotError::Corrupt {
            name: name.to_string(),
            why: why.to_string(),
        }
    }

    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SnapshotError::Store {
                retryable: true,
                ..
            }
        )
    }
}
