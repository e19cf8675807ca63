//! Two hosts' shared services for the tests of replicas on hosts of their own: a throwaway
//! PostgreSQL (the fleet store and the sandbox table) and a moto bucket (the shelf), both
//! stopped when dropped, and servers started on roots of their own against them.

use sandkeeper_pg::throwaway::Throwaway;
use sandkeeper_snapshots::moto::Moto;

use super::Server;

/// The services every host of a test shares.
pub struct Services {
    /// The database.
    pub pg: Throwaway,
    /// The object store.
    pub moto: Moto,
    /// The shelf's URL in it.
    pub shelf: String,
}

impl Services {
    /// Starts PostgreSQL and moto, the shelf in the bucket `bucket`.
    pub fn start(bucket: &str) -> Services {
        let pg = Throwaway::start().expect("a throwaway PostgreSQL");
        let moto = Moto::start(bucket);
        let shelf = moto.url("shelf");
        Services { pg, moto, shelf }
    }

    /// A host on `root`: `sandkeeperd --fleet --fleet-store … --snapshots …`.
    pub fn host(&self, root: &std::path::Path) -> Server {
        let root = root.to_str().expect("a UTF-8 root");
        Server::start_on_env(
            &[
                "--root",
                root,
                "--fleet",
                "--fleet-store",
                &self.pg.connection_string(),
                "--snapshots",
                &self.shelf,
            ],
            &self.moto.environment(),
        )
    }

    /// The shelf, opened as a test reads it (what is on it).
    pub fn shelf_store(&self) -> sandkeeper_snapshots::ObjectSnapshots {
        sandkeeper_snapshots::ObjectSnapshots::open(
            &self.shelf,
            sandkeeper_snapshots::SnapshotsConfig {
                options: Moto::options(self.moto.port),
                ..Default::default()
            },
        )
        .expect("the shelf")
    }

    /// A plain session on the database, as an operator's `psql`.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let (client, connection) = self
            .pg
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .expect("a session on the throwaway PostgreSQL");
        tokio::spawn(connection);
        client
    }
}
