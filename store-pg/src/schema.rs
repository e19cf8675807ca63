//! The store's schema and its migrations: SQL files in `migrations/`, embedded in the crate,
//! applied in order at [`PgStore::connect`](crate::PgStore::connect). The table
//! `sandkeeper_fleet.schema_version` keeps the versions applied (in the store's own schema,
//! made here first: since PostgreSQL 15 a role that does not own the database may not create
//! tables in `public`); the whole of it runs in one transaction
//! under a transaction-level advisory lock, so that keepers starting together apply each
//! migration once (the others wait on the lock, then find it applied), and a migration that
//! fails leaves nothing half-applied.

use tokio_postgres::Client;

use crate::error::PgError;

/// One migration: its version (the order they apply in), its file's name and its SQL.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration this build knows, oldest first.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "0001_fleet.sql",
    sql: include_str!("../migrations/0001_fleet.sql"),
}];

/// The advisory lock key the migrations run under (any fixed number: "sandkeep" in ASCII).
const MIGRATION_LOCK: i64 = 0x73_61_6e_64_6b_65_65_70;

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 1;

/// Brings the database `client` is connected to up to [`SCHEMA_VERSION`]; a schema already
/// there is left as it is. A schema newer than this build is an error (a newer keeper's: this
/// one must not run against it).
pub(crate) async fn migrate(client: &mut Client) -> Result<(), PgError> {
    let server = |source| PgError::Server {
        op: "migrate",
        source,
    };
    let tx = client.transaction().await.map_err(server)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(server)?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS sandkeeper_fleet;
         CREATE TABLE IF NOT EXISTS sandkeeper_fleet.schema_version (
            version integer PRIMARY KEY,
            name text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(server)?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM sandkeeper_fleet.schema_version",
            &[],
        )
        .await
        .map_err(server)?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(PgError::SchemaTooNew {
            found,
            known: SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        let failed = |source| PgError::Migration {
            version: m.version,
            name: m.name,
            source,
        };
        tx.batch_execute(m.sql).await.map_err(failed)?;
        tx.execute(
            "INSERT INTO sandkeeper_fleet.schema_version (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .map_err(failed)?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "fleet store schema migrated"
        );
    }
    tx.commit().await.map_err(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migrations_are_in_order_and_end_at_the_schema_version() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        let expected: Vec<i32> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(versions, expected);
        for m in MIGRATIONS {
            assert!(
                m.name.starts_with(&format!("{:04}_", m.version)),
                "{}",
                m.name
            );
        }
    }
}
