//! Why an operation of the PostgreSQL store failed. Every failure reaches the core as a
//! [`StoreFailure`](sandkeeper_tokio::store::StoreFailure): "not confirmed", tried again.

use std::time::Duration;

/// Why an operation of [`PgStore`](crate::PgStore) failed.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The server or the connection failed (refused, killed, restarted, a timeout of the
    /// server's: `lock_timeout`, `statement_timeout`). The connection is dropped and the next
    /// operation connects again.
    #[error("fleet store on PostgreSQL: {op}: {}", detail(.source))]
    Server {
        /// The operation.
        op: &'static str,
        /// What the server or the driver said.
        source: tokio_postgres::Error,
    },
    /// The operation did not end within the store's bound (a server that does not answer, a
    /// network that holds packets): its outcome is unknown, as for an answer lost at the core's
    /// deadline. The connection is dropped.
    #[error("fleet store on PostgreSQL: {op} did not end within {after:?}")]
    TimedOut {
        /// The operation.
        op: &'static str,
        /// The bound it ran into.
        after: Duration,
    },
    /// A number the store keeps as a PostgreSQL `bigint` is above `i64::MAX`.
    #[error("fleet store on PostgreSQL: {what} {value} is beyond what the store keeps (i64::MAX)")]
    OutOfRange {
        /// What the number is.
        what: &'static str,
        /// The number.
        value: u64,
    },
    /// What the store holds could not be read as what it should be (a row written by hand, or
    /// by a newer schema).
    #[error("fleet store on PostgreSQL: {what} is malformed: {why}")]
    Malformed {
        /// What was read.
        what: String,
        /// What is wrong.
        why: String,
    },
    /// A claim by an incarnation with no lease in the store (it never renewed): nothing taken.
    #[error("fleet store on PostgreSQL: incarnation {incarnation} claims a key without a lease")]
    NoLease {
        /// The claimant.
        incarnation: u32,
    },
    /// The backend's inventory, given for the sweep, failed to list or remove an object.
    #[error("fleet store on PostgreSQL: the sweep's inventory: {0}")]
    Inventory(#[source] std::io::Error),
    /// The TLS configuration for the store's connections could not be made.
    #[error("fleet store on PostgreSQL: TLS: {0}")]
    Tls(String),
    /// The store's schema could not be brought to this version.
    #[error("fleet store on PostgreSQL: migration {version} ({name}): {}", detail(.source))]
    Migration {
        /// The migration's version.
        version: i32,
        /// Its file name.
        name: &'static str,
        /// What the server said.
        source: tokio_postgres::Error,
    },
    /// The store's schema is newer than this build knows: a newer keeper migrated it.
    #[error("fleet store on PostgreSQL: the schema is at version {found}, this build knows up to {known}")]
    SchemaTooNew {
        /// The version in the database.
        found: i32,
        /// The newest version this build has.
        known: i32,
    },
}

/// What the server said (its error's severity, code and message), or else the driver's error:
/// tokio-postgres shows a server's error only as "db error".
fn detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => {
            // The client's own errors say what went wrong in their sources (a TLS handshake
            // refused for an unknown issuer, a refused connection): every one, in order.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}

/// The SQLSTATE the `claim` function raises for a claimant without a lease (migration 1).
pub(crate) const NO_LEASE: &str = "SKNLS";

/// A `u64` as the `bigint` the store keeps it in.
pub(crate) fn bigint(what: &'static str, value: u64) -> Result<i64, PgError> {
    i64::try_from(value).map_err(|_| PgError::OutOfRange { what, value })
}

/// A `bigint` read back as the `u64` it was written from.
pub(crate) fn unsigned(what: &str, value: i64) -> Result<u64, PgError> {
    u64::try_from(value).map_err(|_| PgError::Malformed {
        what: what.to_string(),
        why: format!("{value} is negative"),
    })
}

/// A `bigint` read back as an incarnation.
pub(crate) fn incarnation(what: &str, value: i64) -> Result<u32, PgError> {
    u32::try_from(value).map_err(|_| PgError::Malformed {
        what: what.to_string(),
        why: format!("incarnation {value} is not a u32"),
    })
}
