//! Pod mode suspending through a shelf ([`K8sBackend::with_shelf`](crate::K8sBackend)): a plain
//! pod keeps nothing once it is deleted, so its workspace goes to the shelf (object storage,
//! `sandkeeper-snapshots`) first, streamed out of the pod as a tar (`archive.rs`), and a
//! resume streams it back into the new sandbox's pod.
//!
//! - A snapshot is named `sbx-<n>-<owner>`: the sandbox whose workspace it is and the owner
//!   (this process) whose pod `sk-<owner>-<n>` held it. The name says where the workspace
//!   still is while no Persist has kept it: in that pod.
//! - **Persist** puts the workspace on the shelf, and only then deletes the pod. A Persist
//!   that failed leaves the pod as it is (the core salvages the snapshot when every Persist
//!   failed: the pod is then the only copy).
//! - **Start** resuming a snapshot: a new pod, then the snapshot streamed into its workspace,
//!   checked whole against the shelf's record (`Shelf::fetch_archive`); on any failure the new
//!   pod is deleted and the start fails. A snapshot not on the shelf is taken from the pod
//!   that held it, if that pod still runs (a salvaged snapshot): put on the shelf first, its
//!   pod deleted only then, and resumed from the shelf as any other. A snapshot on neither is
//!   lost (the pod was deleted from outside before any Persist kept it): the start goes on
//!   fresh with a warning, as a claim that is gone does in agentSandbox mode.
//! - **Discard** removes the snapshot from the shelf, and its pod if a salvaged one still
//!   runs.

use bytes::Bytes;
use sandkeeper::Snapshot;
use sandkeeper_tokio::local::shelf::{snapshot_name_parts, ArchiveSource, Shelf, ShelfError};
use std::time::SystemTime;
use tokio::sync::{mpsc, oneshot};

use crate::cluster::Cluster;
use crate::error::K8sError;
use crate::names;

/// Chunks in flight between a pod's exec and the shelf.
const IN_FLIGHT: usize = 8;

/// What a restore from the shelf found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restored {
    /// The workspace is in the pod, whole.
    Whole,
    /// The shelf has no such snapshot; the pod was given nothing.
    NotOnShelf,
}

/// A shelf's failure as this backend's.
pub(crate) fn shelf_failure(e: ShelfError) -> K8sError {
    let retryable = matches!(e, ShelfError::Unavailable(_));
    K8sError::Shelf {
        retryable,
        message: e.to_string(),
    }
}

/// The snapshot of sandbox `n` held in a pod of `owner`.
pub(crate) fn snapshot_name(owner: &str, sandbox: u64) -> Snapshot {
    Snapshot::new(format!("sbx-{sandbox}-{owner}"))
}

/// The pod that held the snapshot `snapshot` (`sbx-<n>-<owner>` → `sk-<owner>-<n>`), for a
/// reference this backend made; [`K8sError::BadSnapshot`] otherwise.
pub(crate) fn pod_of_snapshot(snapshot: &Snapshot) -> Result<String, K8sError> {
    let text = snapshot.as_str();
    let bad = |why: &str| K8sError::BadSnapshot {
        snapshot: text.to_string(),
        why: format!("pod mode's snapshots are sbx-<number>-<owner>: {why}"),
    };
    let (sandbox, owner) = snapshot_name_parts(text).map_err(bad)?;
    names::check_owner(owner).map_err(|e| bad(&e.to_string()))?;
    Ok(names::object_name(owner, sandbox.0))
}

impl Cluster {
    /// Puts the workspace of `pod` on `shelf` as `snapshot` of `key`, kept until
    /// `retain_until`. The pod is left as it is.
    pub(crate) async fn shelve(
        &self,
        shelf: &dyn Shelf,
        pod: &str,
        snapshot: &Snapshot,
        key: &str,
        retain_until: Option<SystemTime>,
    ) -> Result<(), K8sError> {
        let (to, chunks) = mpsc::channel(IN_FLIGHT);
        let (said, finished) = oneshot::channel();
        let source = ArchiveSource { chunks, finished };
        let out = async {
            let r = self.workspace_out(pod, to).await;
            let _ = said.send(r.as_ref().map(drop).map_err(ToString::to_string));
            r
        };
        let put = shelf.put_archive(source, snapshot, key, retain_until);
        let (out, put) = tokio::join!(out, put);
        // The pod's failure explains the shelf's (which saw the archive end unfinished).
        out?;
        put.map_err(shelf_failure)
    }

    /// Streams `snapshot` from `shelf` into the workspace of the new pod `pod`. On an error
    /// the pod holds part of it at most: the caller deletes the pod.
    pub(crate) async fn unshelve(
        &self,
        shelf: &dyn Shelf,
        snapshot: &Snapshot,
        pod: &str,
    ) -> Result<Restored, K8sError> {
        let (to, from) = mpsc::channel::<Bytes>(IN_FLIGHT);
        let fetch = shelf.fetch_archive(snapshot, to);
        let (fetched, restored) = tokio::join!(fetch, self.workspace_in(pod, from));
        match (fetched, restored) {
            (Ok(()), Ok(())) => Ok(Restored::Whole),
            (Err(ShelfError::NotFound(_)), _) => Ok(Restored::NotOnShelf),
            // The pod's failure stopped the fetch (its receiver went away).
            (_, Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(shelf_failure(e)),
        }
    }
}
