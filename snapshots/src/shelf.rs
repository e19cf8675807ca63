//! [`ObjectSnapshots`] as the local backend's [`Shelf`]: a host's persisted snapshots put in
//! object storage, fetched by whichever host resumes their key (`io-tokio`'s `local/shelf.rs`
//! says when the backend calls each). The backend's snapshot names are this crate's names.

use std::path::Path;
use std::time::SystemTime;

use bytes::Bytes;
use sandkeeper::Snapshot;
use sandkeeper_tokio::local::shelf::{ArchiveSource, Shelf, ShelfError, ShelfFuture};
use tokio::sync::mpsc;

use crate::{ObjectSnapshots, SnapshotError, SnapshotName};

impl Shelf for ObjectSnapshots {
    /// [`ObjectSnapshots::upload_for`]; a snapshot there already is put (its name is the
    /// putting backend's own, so only a retried Persist of the same Stop meets it).
    fn put<'a>(
        &'a self,
        dir: &'a Path,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            let name = SnapshotName::from_snapshot(snapshot).map_err(shelf_error)?;
            match self.upload_for(dir, &name, Some(key), retain_until).await {
                Ok(_) | Err(SnapshotError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(shelf_error(e)),
            }
        })
    }

    /// [`ObjectSnapshots::download`] into `target`.
    fn fetch<'a>(&'a self, snapshot: &'a Snapshot, target: &'a Path) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            let name = SnapshotName::from_snapshot(snapshot).map_err(shelf_error)?;
            self.download(&name, target)
                .await
                .map(|_| ())
                .map_err(shelf_error)
        })
    }

    /// [`ObjectSnapshots::discard`]; one not there is removed already.
    fn remove<'a>(&'a self, snapshot: &'a Snapshot) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            let name = SnapshotName::from_snapshot(snapshot).map_err(shelf_error)?;
            match self.discard(&name).await {
                Ok(()) | Err(SnapshotError::NotFound { .. }) => Ok(()),
                Err(e) => Err(shelf_error(e)),
            }
        })
    }

    /// [`ObjectSnapshots::upload_archive`]; a snapshot there already is put, as with
    /// [`put`](Shelf::put).
    fn put_archive<'a>(
        &'a self,
        archive: ArchiveSource,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            let name = SnapshotName::from_snapshot(snapshot).map_err(shelf_error)?;
            let ArchiveSource { chunks, finished } = archive;
            let uploaded = self
                .upload_archive(chunks, finished, &name, Some(key), retain_until)
                .await;
            match uploaded {
                Ok(_) | Err(SnapshotError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(shelf_error(e)),
            }
        })
    }

    /// [`ObjectSnapshots::fetch_archive`].
    fn fetch_archive<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        to: mpsc::Sender<Bytes>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            let name = SnapshotName::from_snapshot(snapshot).map_err(shelf_error)?;
            self.fetch_archive(&name, to)
                .await
                .map(|_| ())
                .map_err(shelf_error)
        })
    }
}

/// A snapshot failure as a shelf's: not found; worth another try (a store failure that may
/// pass, this host's file system, an archive from a sandbox that did not come whole, a
/// receiver that stopped); or not (a damaged snapshot, a bad name, a target there).
fn shelf_error(e: SnapshotError) -> ShelfError {
    match &e {
        SnapshotError::NotFound { .. } => ShelfError::NotFound(e.to_string()),
        SnapshotError::Local(_) | SnapshotError::Source(_) | SnapshotError::ReceiverGone => {
            ShelfError::Unavailable(e.to_string())
        }
        _ if e.is_retryable() => ShelfError::Unavailable(e.to_string()),
        _ => ShelfError::Refused(e.to_string()),
    }
}
