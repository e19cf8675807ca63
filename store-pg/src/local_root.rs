//! The [`Inventory`] of a local root: what a host's [`LocalBackend`](sandkeeper_tokio::LocalBackend)
//! holds under its root, for a keeper whose fleet store is PostgreSQL. It owns nothing of its
//! own: the listing and the removal are the local root's
//! ([`sandkeeper_tokio::local::inventory`], the same functions the local root's own store
//! sweeps with), so a root is swept alike under either store: objects as their keeper records
//! under `<root>/.meta/` describe them, never as anything in a workspace says; a directory
//! without a record kept; a removal renamed to the root's trash before its record goes. This
//! adapter runs that file-system work on tokio's blocking threads, never on an async worker.

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sandkeeper::SweepObject;
use sandkeeper_tokio::local::inventory;
use sandkeeper_tokio::local::meta::MetaError;

use crate::sweep::{Inventory, InventoryFuture};

/// The sweep's view of one local root (`LocalConfig::root` of the host's backend).
#[derive(Clone, Debug)]
pub struct LocalRootInventory {
    root: PathBuf,
}

impl LocalRootInventory {
    /// The inventory of the local root at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalRootInventory { root: root.into() }
    }

    /// The root it lists.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Inventory for LocalRootInventory {
    /// The root's recorded sandboxes and snapshots, after clearing what a crashed sweep or start
    /// left (the trash; records without their directory, once old on the wall clock).
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        let root = self.root.clone();
        Box::pin(blocking(move || {
            // A driver reads the clock: a leftover record's age is its file's, on the wall clock.
            #[allow(clippy::disallowed_methods)]
            let now = SystemTime::now();
            inventory::clear_leftovers(&root, now)?;
            inventory::sweep_objects(&root)
        }))
    }

    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        let (root, object) = (self.root.clone(), object.clone());
        Box::pin(blocking(move || inventory::remove_swept(&root, &object)))
    }
}

/// Runs `work` on a blocking thread; its error as an [`io::Error`] that keeps the file-system
/// error's kind (a malformed record is `InvalidData`) and names the record or directory.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, MetaError> + Send + 'static,
) -> io::Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => {
            done.map_err(|e| io::Error::new(e.io_kind().unwrap_or(io::ErrorKind::InvalidData), e))
        }
        Err(e) => Err(io::Error::other(format!(
            "the local root's inventory task failed: {e}"
        ))),
    }
}
