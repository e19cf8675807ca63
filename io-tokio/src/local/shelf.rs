//! The shelf: where a fleet of hosts keeps persisted snapshots beyond one host's root, so that a
//! key suspended on one host resumes on another. The local backend uses it, when configured
//! ([`LocalConfig::shelf`](super::LocalConfig::shelf)), at four steps:
//!
//! - **Persist** puts the stopped workspace (`<root>/.snapshots/<snapshot>`) on the shelf
//!   before it records the snapshot persisted, and fails if the put fails: a Persist that
//!   answered ok means the snapshot is on the shelf. The local directory stays, as this host's
//!   copy (a start here takes it by a rename).
//! - **Start** resuming a snapshot not on this host fetches it from the shelf straight into the
//!   new sandbox's directory (whole or not at all). A snapshot neither here nor on the shelf
//!   fails the Start (never a fresh workspace): it may be on the host whose every Persist
//!   failed, and the core then keeps it for the key.
//! - **Discard** removes it from the shelf too.
//! - **Adopt** of a sandbox not on this root answers [`FailureClass::Elsewhere`]: it may be up
//!   on another host's root, and the core leaves it to the key's next adoption there.
//!
//! A start does not remove a snapshot from the shelf as it takes it: until the sandbox it
//! becomes is up, a failed start gives the snapshot back to its key, and the next start
//! (perhaps on another host) needs the shelf's copy. Once that sandbox is up, the core orders
//! it discarded ([`DiscardReason::Taken`](sandkeeper::DiscardReason::Taken)), and Discard
//! removes it here and on the shelf. What no record names any more and no Discard reached is
//! removed by the fleet sweep (`docs/fleet-hosts.md`). The implementation on object storage is
//! `sandkeeper-snapshots`' `ObjectSnapshots`.
//!
//! A backend whose sandboxes the host cannot reach into (Kubernetes pod mode) puts and fetches
//! a workspace as a tar stream instead of a directory ([`Shelf::put_archive`],
//! [`Shelf::fetch_archive`]): the tar is made inside the sandbox, so the shelf treats it as
//! hostile input (`docs/snapshots.md`).
//!
//! [`FailureClass::Elsewhere`]: crate::backend::FailureClass::Elsewhere

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::SystemTime;

use bytes::Bytes;
use sandkeeper::{SandboxId, Snapshot};
use tokio::sync::{mpsc, oneshot};

/// What a shelf's operation returns.
pub type ShelfFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ShelfError>> + Send + 'a>>;

/// A place beyond this host that keeps snapshots (see the module docs).
pub trait Shelf: Debug + Send + Sync + 'static {
    /// Puts the stopped workspace `dir` on the shelf as `snapshot`, taken from a sandbox of
    /// `key` and kept until `retain_until` (`None`: until removed). Ok once it is there whole,
    /// also when it was there already (a Persist tried again: a snapshot's name is its sandbox
    /// and this backend's instance, so only this backend's own Stop made it).
    fn put<'a>(
        &'a self,
        dir: &'a Path,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()>;

    /// Fetches `snapshot` into `target`, which must not exist: made whole, or not at all.
    /// [`ShelfError::NotFound`] when the shelf has no such snapshot.
    fn fetch<'a>(&'a self, snapshot: &'a Snapshot, target: &'a Path) -> ShelfFuture<'a, ()>;

    /// Removes `snapshot` from the shelf; one that is not there is removed already.
    fn remove<'a>(&'a self, snapshot: &'a Snapshot) -> ShelfFuture<'a, ()>;

    /// Puts the workspace `archive` streams (a tar made inside the sandbox: untrusted) on the
    /// shelf as `snapshot`, as [`put`](Self::put) does a directory. The snapshot is made only
    /// once the archive's maker says it finished ([`ArchiveSource::finished`]); a maker that
    /// failed or went away leaves nothing. Ok also when the snapshot was there already.
    fn put_archive<'a>(
        &'a self,
        archive: ArchiveSource,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()>;

    /// Streams `snapshot` as a tar into `to`, chunk by chunk. Ok only once every byte was sent
    /// and the whole agreed with what the shelf recorded at the put: on an error, what was sent
    /// is not the snapshot and must be thrown away. [`ShelfError::NotFound`] when the shelf
    /// has no such snapshot (nothing was sent).
    fn fetch_archive<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        to: mpsc::Sender<Bytes>,
    ) -> ShelfFuture<'a, ()>;
}

/// A workspace as a tar stream from inside a sandbox ([`Shelf::put_archive`]).
#[derive(Debug)]
pub struct ArchiveSource {
    /// The tar's bytes, in order.
    pub chunks: mpsc::Receiver<Bytes>,
    /// Whether the tar's maker finished (`Ok`) or failed (why), sent once it knows. The
    /// chunks' end alone never says the tar is whole: a connection cut between two entries
    /// ends them too. A sender dropped unsent is a failure.
    pub finished: oneshot::Receiver<Result<(), String>>,
}

/// The parts of a snapshot's name on a shelf, `sbx-<n>-<instance>`: the sandbox whose
/// workspace it is (canonical decimal) and the rest, the instance (or owner) that stopped it,
/// unchecked beyond being there. The local backend names its snapshots so, and so does
/// Kubernetes pod mode; `Err` says what is wrong.
pub fn snapshot_name_parts(text: &str) -> Result<(SandboxId, &str), &'static str> {
    let rest = text
        .strip_prefix("sbx-")
        .ok_or("a snapshot name starts with sbx-")?;
    let (number, instance) = rest
        .split_once('-')
        .ok_or("a snapshot name is sbx-<n>-<instance>")?;
    let canonical = !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
        && (number == "0" || !number.starts_with('0'));
    let sandbox = number
        .parse::<u64>()
        .ok()
        .filter(|_| canonical)
        .ok_or("a sandbox number is decimal digits")?;
    Ok((SandboxId(sandbox), instance))
}

/// A shelf operation's failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShelfError {
    /// The shelf has no such snapshot.
    #[error("not on the shelf: {0}")]
    NotFound(String),
    /// It may work if tried again (a server error, a transfer cut).
    #[error("shelf unavailable: {0}")]
    Unavailable(String),
    /// It will not work if tried again (a damaged snapshot, permissions, configuration).
    #[error("shelf refused: {0}")]
    Refused(String),
}
