//! Replicas on hosts of their own (`--fleet --fleet-store URL --snapshots URL`): each server
//! has its own root, and they share what one root's replicas share on disk through two
//! services: the fleet store and the sandbox table in PostgreSQL (`sandkeeper-pg`,
//! [`crate::table_pg`]), and a shelf in object storage for paused workspaces
//! (`sandkeeper-snapshots`, `docs/fleet-hosts.md`). A pause puts the workspace on the shelf
//! before it answers; a resume on another host fetches it from there. A running sandbox is on
//! its host's disk alone: requests for it are forwarded there, and when its host dies it waits
//! for that host to come back (a resume elsewhere answers 503).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandkeeper_pg::{
    HostInventory, LocalRootInventory, PgStore, ShelfInventory, StoreTls, Timeouts,
};
use sandkeeper_snapshots::ObjectSnapshots;

use crate::table_pg::PgTable;

/// Where the hosts' shared services are.
#[derive(Clone, Debug)]
pub struct Hosts {
    /// The PostgreSQL database of the fleet store and the sandbox table: a URL
    /// (`postgres://user@host:port/db`) or a `key=value` connection string.
    pub store: String,
    /// Trust the certificates in this PEM file and speak TLS to PostgreSQL; `None`: in the
    /// clear (or as the connection string's `sslmode` allows without TLS).
    pub store_ca: Option<PathBuf>,
    /// The shelf for paused workspaces: `s3://bucket/prefix` (endpoint and credentials from
    /// `AWS_*`), `gs://`, `az://` or `file:///dir`.
    pub shelf: String,
}

/// Why the hosts' services could not be reached or used.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The store's connection string does not parse.
    #[error("--fleet-store {url:?}: {why}")]
    StoreUrl {
        /// What was given (a password in it is not repeated: only the parse error is).
        url: String,
        /// Why.
        why: String,
    },
    /// The CA file could not be read or used.
    #[error("--fleet-store-ca {path}: {why}")]
    StoreCa {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The fleet store or the sandbox table could not be reached or made.
    #[error("--fleet-store: {0}")]
    Store(String),
    /// The shelf could not be opened.
    #[error("--snapshots: {0}")]
    Shelf(String),
    /// The host's id could not be read or made.
    #[error("the host's id {path}: {why}")]
    HostId {
        /// Its file.
        path: String,
        /// Why.
        why: String,
    },
}

impl Hosts {
    /// The shelf.
    pub fn shelf(&self) -> Result<Arc<ObjectSnapshots>, HostsError> {
        ObjectSnapshots::open(&self.shelf, Default::default())
            .map(Arc::new)
            .map_err(|e| HostsError::Shelf(format!("{}: {e}", self.shelf)))
    }

    /// The fleet store (leases of `lease`, sweeping this host's `root` and the `shelf`) and
    /// the sandbox table, both in the database, connected.
    pub async fn connect(
        &self,
        root: &Path,
        shelf: Arc<ObjectSnapshots>,
        lease: Duration,
    ) -> Result<(PgStore, PgTable), HostsError> {
        let config: tokio_postgres::Config =
            self.store.parse().map_err(|e| HostsError::StoreUrl {
                url: redacted(&self.store),
                why: format!("{e}"),
            })?;
        let tls = match &self.store_ca {
            None => StoreTls::Off,
            Some(path) => {
                let ca = |why: String| HostsError::StoreCa {
                    path: path.display().to_string(),
                    why,
                };
                let pem = std::fs::read(path).map_err(|e| ca(e.to_string()))?;
                StoreTls::trusting_pem(&pem).map_err(|e| ca(e.to_string()))?
            }
        };
        let inventory = HostInventory::new(
            vec![Arc::new(LocalRootInventory::new(root))],
            ShelfInventory::new(shelf),
        );
        let store = PgStore::connect_tls(&config, lease, Timeouts::default(), tls.clone())
            .await
            .map_err(|e| HostsError::Store(e.to_string()))?
            .with_inventory(Arc::new(inventory));
        let table = PgTable::connect(&config, tls)
            .await
            .map_err(|e| HostsError::Store(e.to_string()))?;
        Ok((store, table))
    }
}

/// This host's id (see [`crate::durable::Replica::host`]): kept in `<root>/.sandkeeperd/host`,
/// made (32 random hex digits) by the first server on the root. A workspace left on this
/// host's disk is continued by a server on this root alone. A root copied to another machine
/// must not keep the file: two hosts with one id would each take the other's sandboxes for
/// their own.
pub fn host_id(root: &Path) -> Result<String, HostsError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = root.join(".sandkeeperd");
    let path = dir.join("host");
    let fail = |why: String| HostsError::HostId {
        path: path.display().to_string(),
        why,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| fail(e.to_string()))?;
    if !path.exists() {
        // Written whole under a name of its own, then linked into place: a server starting
        // beside this one reads the whole id or makes its own, never half of one. Linking
        // fails if the file exists (the other's won): this one's is dropped.
        let made = crate::registry::random_hex(16).map_err(|e| fail(e.message))?;
        let draft = dir.join(format!("host.{made}.tmp"));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&draft)
            .and_then(|mut file| {
                file.write_all(made.as_bytes())?;
                file.sync_all()
            });
        let linked = written.and_then(|()| std::fs::hard_link(&draft, &path));
        let _ = std::fs::remove_file(&draft);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(e.to_string())),
        }
    }
    let id = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(fail(format!(
            "holds {:?}, not 32 hex digits: remove it, and a new id is made",
            id.chars().take(40).collect::<String>()
        )));
    }
    Ok(id)
}

/// A connection string with any password replaced, to be shown in an error.
fn redacted(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(config) if config.get_password().is_some() => {
            "(a connection string with a password)".into()
        }
        _ if url.contains("password") || url.contains('@') => "(a connection string)".into(),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_id_is_made_once_kept_and_refused_when_it_is_not_one() {
        let root = tempfile::tempdir().unwrap();
        let made = host_id(root.path()).unwrap();
        assert_eq!(made.len(), 32);
        assert_eq!(host_id(root.path()).unwrap(), made, "kept");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(host_id(other.path()).unwrap(), made, "each root its own");
        let file = root.path().join(".sandkeeperd/host");
        std::fs::write(&file, "not an id").unwrap();
        let e = host_id(root.path()).unwrap_err().to_string();
        assert!(
            e.contains("not 32 hex digits") && e.contains(".sandkeeperd/host"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(root.path().join(".sandkeeperd"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["host".to_string()], "no draft left");
    }
}
