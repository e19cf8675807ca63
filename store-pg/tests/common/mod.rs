//! What the store's tests share: a throwaway cluster (failing, never skipping, when PostgreSQL
//! is not installed), stores on it, an administrator's connection, keys and instants.

#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{Key, SessionId};
use sandkeeper_pg::throwaway::Throwaway;
use sandkeeper_pg::{PgStore, Timeouts};

/// How long the tests' process leases last.
pub const LEASE: Duration = Duration::from_secs(10);

/// A throwaway cluster; the test fails with the helper's message (install `postgresql`) when
/// the server's binaries are missing.
pub fn cluster() -> Throwaway {
    Throwaway::start().unwrap_or_else(|e| panic!("{e}"))
}

/// A store on `cluster` (a process of the fleet: its own connection), default timeouts.
pub async fn store(cluster: &Throwaway) -> PgStore {
    PgStore::connect(&cluster.config(), LEASE, Timeouts::default())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()))
}

/// A plain connection to the cluster's database, as an operator's `psql` (no store timeouts
/// unless `options` sets them).
pub async fn admin(cluster: &Throwaway, options: Option<&str>) -> tokio_postgres::Client {
    let mut config = cluster.config();
    if let Some(options) = options {
        config.options(options);
    }
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()));
    tokio::spawn(connection);
    client
}

pub fn key(name: &str) -> Key {
    Key::Session(SessionId::new(name).expect("a valid session name"))
}

/// A wall-clock instant the tests pass as `now` (the store never reads a clock of its own).
pub fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000 + secs)
}
