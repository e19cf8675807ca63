//! [`PgStore`]: the fleet store's operations, each one call of one of the schema's functions
//! (`migrations/0001_fleet.sql`) on the store's one connection, bounded in time, the connection
//! made again after it broke.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandkeeper::{Key, Token};
use sandkeeper_tokio::store::{
    unix_ms, Claim, FleetStore, KeyEntry, OwnSnapshots, StoreFailure, StoreFuture, StoredRecord,
    Swept,
};
use tokio::sync::Mutex;
use tokio_postgres::error::Severity;
use tokio_postgres::{Client, Config, Row, Statement};

use crate::error::{bigint, incarnation, unsigned, PgError, NO_LEASE};
use crate::schema;
use crate::sweep::Inventory;
use crate::tls::StoreTls;

/// The time limits of the store's work. The three server-side ones are set on every session the
/// store opens (as startup options, so they hold from the first statement); `operation` bounds
/// each operation on the client, connecting included.
///
/// The defaults, and why (measured in `docs/fleet-postgres.md`): a session idle inside a
/// transaction for `idle_in_transaction` is ended by the server, releasing its locks; a statement
/// waits for a lock at most `lock`, longer than that, so that an operation held up by a stopped
/// client outlasts the stop and succeeds; `statement` ends any one statement (the store's run in
/// milliseconds); `operation` is longer still, so that the server's own error arrives first and
/// the client's bound is only for a server or network that does not answer. All of it stays well
/// under a renewal period (5 s by default, `docs/fleet.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// `idle_in_transaction_session_timeout`: how long a session of the store may sit inside an
    /// open transaction. The store's own operations never do (each is one statement); this
    /// bounds any other client run with the same settings, such as an operator's `psql`.
    pub idle_in_transaction: Duration,
    /// `lock_timeout`: how long a statement waits for a row lock.
    pub lock: Duration,
    /// `statement_timeout`: how long one statement runs.
    pub statement: Duration,
    /// How long one operation of the store may take, on the client: past it the operation is
    /// [`PgError::TimedOut`] and its connection is dropped.
    pub operation: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            idle_in_transaction: Duration::from_secs(2),
            lock: Duration::from_secs(3),
            statement: Duration::from_secs(4),
            operation: Duration::from_secs(5),
        }
    }
}

impl Timeouts {
    /// The startup options that set the server-side limits on a session (`-c name=ms ...`):
    /// what the store appends to its connection's options, and what a test's raw client uses to
    /// run as a client of the store would.
    pub fn session_options(&self) -> String {
        format!(
            "-c idle_in_transaction_session_timeout={} -c lock_timeout={} -c statement_timeout={}",
            self.idle_in_transaction.as_millis(),
            self.lock.as_millis(),
            self.statement.as_millis()
        )
    }

    /// `config` with the session options appended to whatever options it had.
    pub fn apply(&self, config: &Config) -> Config {
        let mut config = config.clone();
        let options = match config.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {}", self.session_options()),
            _ => self.session_options(),
        };
        config.options(options);
        if config.get_application_name().is_none() {
            config.application_name("sandkeeper-fleet");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.operation);
        }
        config
    }
}

/// The fleet store on a PostgreSQL database: process leases, key entries with their fencing
/// tokens, owners, records and wants, in the schema `sandkeeper_fleet`. Cheap to clone (clones
/// share the connection).
///
/// It owns one connection, made at [`connect`](Self::connect) and made again by the first
/// operation after it broke (a killed backend, a restarted server): the operation that meets
/// the broken connection fails, a later one succeeds. Every operation is bounded by
/// [`Timeouts::operation`]. It holds no sandboxes: its [`sweep`](Self::sweep) removes what the
/// [`Inventory`] it was given holds (`sweep.rs`).
#[derive(Clone)]
pub struct PgStore {
    shared: Arc<Shared>,
    inventory: Option<Arc<dyn Inventory>>,
}

/// What the clones of a store share.
struct Shared {
    config: Config,
    tls: StoreTls,
    lease: Duration,
    timeouts: Timeouts,
    conn: Mutex<Option<Arc<Conn>>>,
}

/// One open connection with the store's statements prepared on it.
struct Conn {
    client: Client,
    backend_pid: i32,
    statements: Statements,
}

/// The store's statements, prepared once per connection.
struct Statements {
    register: Statement,
    renew: Statement,
    claim: Statement,
    record: Statement,
    release: Statement,
    entries: Statement,
    entry: Statement,
    processes: Statement,
    unrecord: Statement,
}

const ENTRY_COLUMNS: &str = "key, owner, owner_epoch, token, record, wants, recording";

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Statements {
            register: client
                .prepare("SELECT nextval('sandkeeper_fleet.incarnation')")
                .await?,
            renew: client
                .prepare("SELECT sandkeeper_fleet.renew($1, $2, $3)")
                .await?,
            claim: client
                .prepare(
                    "SELECT o_claimed, o_token, o_record FROM sandkeeper_fleet.claim($1, $2, $3, $4)",
                )
                .await?,
            record: client
                .prepare("SELECT sandkeeper_fleet.record($1, $2, $3, $4, $5, $6)")
                .await?,
            release: client
                .prepare("SELECT sandkeeper_fleet.release($1, $2, $3, $4, $5)")
                .await?,
            entries: client
                .prepare(&format!(
                    "SELECT {ENTRY_COLUMNS} FROM sandkeeper_fleet.key_entry ORDER BY key"
                ))
                .await?,
            entry: client
                .prepare(&format!(
                    "SELECT {ENTRY_COLUMNS} FROM sandkeeper_fleet.key_entry WHERE key = $1"
                ))
                .await?,
            processes: client
                .prepare("SELECT incarnation, epoch, expires_ms FROM sandkeeper_fleet.process")
                .await?,
            // The sweep's compare-and-set: drops the record's snapshot only if the entry is
            // still as the sweep read it (same token, owner and record).
            unrecord: client
                .prepare(
                    "UPDATE sandkeeper_fleet.key_entry SET record = record - 'snapshot' \
                     WHERE key = $1 AND token = $2 AND owner IS NOT DISTINCT FROM $3 \
                     AND owner_epoch IS NOT DISTINCT FROM $4 AND record = $5",
                )
                .await?,
        })
    }
}

impl Conn {
    /// Connects with `config`, and prepares the statements. The connection's I/O runs on a task
    /// of its own, which ends when the connection breaks or the client is dropped.
    async fn open(config: &Config, tls: &StoreTls) -> Result<Conn, tokio_postgres::Error> {
        let (client, _io) = tls.connect(config).await?;
        let backend_pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let statements = Statements::prepare(&client).await?;
        Ok(Conn {
            client,
            backend_pid,
            statements,
        })
    }
}

impl PgStore {
    /// The store in the database `config` names, whose process leases last `lease` after each
    /// renewal, its sessions under `timeouts`. Connects, and brings the schema up to this
    /// build's version (`schema.rs`) on a connection of its own, then opens the store's first
    /// connection: bounded by twice [`Timeouts::operation`], one for each.
    pub async fn connect(
        config: &Config,
        lease: Duration,
        timeouts: Timeouts,
    ) -> Result<PgStore, PgError> {
        PgStore::connect_tls(config, lease, timeouts, StoreTls::Off).await
    }

    /// [`connect`](Self::connect), every connection secured as `tls` says ([`StoreTls`]).
    pub async fn connect_tls(
        config: &Config,
        lease: Duration,
        timeouts: Timeouts,
        tls: StoreTls,
    ) -> Result<PgStore, PgError> {
        let config = timeouts.apply(config);
        let bound = timeouts.operation;
        let opened = async {
            let server = |source| PgError::Server {
                op: "connect",
                source,
            };
            let (mut client, io) = tls.connect(&config).await.map_err(server)?;
            schema::migrate(&mut client).await?;
            // Dropped here: the store's connection is opened after the schema is there (the
            // statements it prepares name the schema's functions).
            drop(client);
            let _ = io.await;
            Conn::open(&config, &tls).await.map_err(server)
        };
        let conn = tokio::time::timeout(bound.saturating_mul(2), opened)
            .await
            .map_err(|_| PgError::TimedOut {
                op: "connect",
                after: bound.saturating_mul(2),
            })??;
        Ok(PgStore {
            shared: Arc::new(Shared {
                config,
                tls,
                lease,
                timeouts,
                conn: Mutex::new(Some(Arc::new(conn))),
            }),
            inventory: None,
        })
    }

    /// This store, sweeping what `inventory` holds (the backend of the host it runs on).
    pub fn with_inventory(mut self, inventory: Arc<dyn Inventory>) -> PgStore {
        self.inventory = Some(inventory);
        self
    }

    /// How long a process lease lasts after its renewal.
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// The time limits the store runs under.
    pub fn timeouts(&self) -> Timeouts {
        self.shared.timeouts
    }

    /// The server process of the store's current connection (connecting if it has none): what
    /// `pg_terminate_backend` takes, and what `pg_stat_activity` shows as `pid`.
    pub async fn backend_pid(&self) -> Result<i32, PgError> {
        self.run("backend pid", |conn| async move { Ok(conn.backend_pid) })
            .await
    }

    /// Hands this process a new incarnation: the next number of a sequence, never handed out
    /// twice (at least 1).
    pub async fn register(&self) -> Result<u32, PgError> {
        let row = self
            .run("register", |conn| async move {
                conn.client.query_one(&conn.statements.register, &[]).await
            })
            .await?;
        incarnation("the incarnation sequence", row.get(0))
    }

    /// Renews the lease of `incarnation` under `epoch` at `now`: one write of the process's row,
    /// whatever it owns. `Some(keys)`: written, and the keys it owns under `epoch` that others
    /// want; `None`: refused (the store has a newer epoch for it).
    pub async fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Option<Vec<Key>>, PgError> {
        let epoch = bigint("epoch", epoch)?;
        let expires = self.expires_ms(now)?;
        let inc = i64::from(incarnation);
        let row = self
            .run("renew", |conn| async move {
                conn.client
                    .query_one(&conn.statements.renew, &[&inc, &epoch, &expires])
                    .await
            })
            .await?;
        let wanted: Option<Vec<String>> = row.get(0);
        wanted
            .map(|keys| keys.iter().map(|k| parse_key(k)).collect())
            .transpose()
    }

    /// Claims `key` for `(incarnation, epoch)` at `now`: one call that locks the key's row,
    /// then reads the leases it decides on.
    pub async fn claim(
        &self,
        key: &Key,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Claim, PgError> {
        let name = key.to_string();
        let (inc, epoch, now_ms) = (
            i64::from(incarnation),
            bigint("epoch", epoch)?,
            now_ms(now)?,
        );
        let answer = self
            .run("claim", |conn| async move {
                conn.client
                    .query_one(&conn.statements.claim, &[&name, &inc, &epoch, &now_ms])
                    .await
            })
            .await;
        let row = match answer {
            Err(PgError::Server { source, .. })
                if source.code().is_some_and(|c| c.code() == NO_LEASE) =>
            {
                return Err(PgError::NoLease { incarnation })
            }
            other => other?,
        };
        if !row.get::<_, bool>(0) {
            return Ok(Claim::Busy);
        }
        let token = unsigned("a claim's token", row.get(1))?;
        let record = parse_record(&key.to_string(), row.get(2))?;
        Ok(Claim::Claimed(Token(token), record))
    }

    /// Writes the record of `key`, which `incarnation` keeps owning under `token`, if it still
    /// does with a live lease at `now`; a write numbered at or below one applied since the key
    /// was claimed changes nothing (and answers `true`).
    pub async fn record(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: &StoredRecord,
        now: SystemTime,
    ) -> Result<bool, PgError> {
        let name = key.to_string();
        let (inc, token, recording, now_ms) = (
            i64::from(incarnation),
            bigint("token", token.0)?,
            bigint("recording", recording)?,
            now_ms(now)?,
        );
        let record = record_json(record);
        let row = self
            .run("record", |conn| async move {
                conn.client
                    .query_one(
                        &conn.statements.record,
                        &[&name, &inc, &token, &recording, &record, &now_ms],
                    )
                    .await
            })
            .await?;
        Ok(row.get(0))
    }

    /// Releases `key` from `incarnation` under `token`, leaving `record`, if it still owns the
    /// key with a live lease at `now`.
    pub async fn release(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        record: &StoredRecord,
        now: SystemTime,
    ) -> Result<bool, PgError> {
        let name = key.to_string();
        let (inc, token, now_ms) = (
            i64::from(incarnation),
            bigint("token", token.0)?,
            now_ms(now)?,
        );
        let record = record_json(record);
        let row = self
            .run("release", |conn| async move {
                conn.client
                    .query_one(
                        &conn.statements.release,
                        &[&name, &inc, &token, &record, &now_ms],
                    )
                    .await
            })
            .await?;
        Ok(row.get(0))
    }

    /// Every key's entry, in key order (for the sweep, reports and tests).
    pub async fn entries(&self) -> Result<Vec<KeyEntry>, PgError> {
        let rows = self
            .run("entries", |conn| async move {
                conn.client.query(&conn.statements.entries, &[]).await
            })
            .await?;
        rows.iter().map(entry_of).collect()
    }

    /// The entry of `key` as it is now, with the owner's epoch (`None`: no entry).
    pub(crate) async fn entry(&self, key: &Key) -> Result<Option<KeyEntry>, PgError> {
        let name = key.to_string();
        let rows = self
            .run("entry", |conn| async move {
                conn.client.query(&conn.statements.entry, &[&name]).await
            })
            .await?;
        rows.first().map(entry_of).transpose()
    }

    /// Every process lease: incarnation → (epoch, expires ms).
    pub async fn processes(&self) -> Result<BTreeMap<u32, (u64, u64)>, PgError> {
        let rows = self
            .run("processes", |conn| async move {
                conn.client.query(&conn.statements.processes, &[]).await
            })
            .await?;
        let mut out = BTreeMap::new();
        for row in rows {
            let inc = incarnation("a process lease", row.get(0))?;
            let epoch = unsigned("a process lease's epoch", row.get(1))?;
            let expires = unsigned("a process lease's expiry", row.get(2))?;
            out.insert(inc, (epoch, expires));
        }
        Ok(out)
    }

    /// Drops the snapshot from `entry`'s record if the key's row is still as `entry` shows it:
    /// whether it was dropped (the sweep's compare-and-set, `sweep.rs`).
    pub(crate) async fn unrecord(&self, entry: &KeyEntry) -> Result<bool, PgError> {
        let name = entry.key.clone();
        let token = bigint("token", entry.token)?;
        let owner = entry.owner.map(|(inc, _)| i64::from(inc));
        let owner_epoch = entry
            .owner
            .map(|(_, epoch)| bigint("epoch", epoch))
            .transpose()?;
        let record = record_json(&entry.record);
        let changed = self
            .run("unrecord", |conn| async move {
                conn.client
                    .execute(
                        &conn.statements.unrecord,
                        &[&name, &token, &owner, &owner_epoch, &record],
                    )
                    .await
            })
            .await?;
        Ok(changed == 1)
    }

    /// The inventory the sweep removes from, if the store was given one.
    pub(crate) fn inventory(&self) -> Option<&Arc<dyn Inventory>> {
        self.inventory.as_ref()
    }

    // ------------------------------------------------------------------------------------------
    // The connection

    /// Runs `op` on the store's connection (made first if there is none, or it broke), within
    /// [`Timeouts::operation`]. A failure that may have broken the session (anything but a
    /// statement's own error), and a timeout, drop the connection: the next operation connects
    /// again.
    async fn run<T, F, Fut>(&self, name: &'static str, op: F) -> Result<T, PgError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let bound = self.shared.timeouts.operation;
        let deadline = tokio::time::Instant::now() + bound;
        let timed_out = PgError::TimedOut {
            op: name,
            after: bound,
        };
        let conn = match tokio::time::timeout_at(deadline, self.conn()).await {
            Ok(conn) => conn.map_err(|source| PgError::Server { op: name, source })?,
            Err(_) => return Err(timed_out),
        };
        match tokio::time::timeout_at(deadline, op(conn.clone())).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(source)) => {
                if !statement_error(&source) {
                    self.forget(&conn).await;
                }
                Err(PgError::Server { op: name, source })
            }
            Err(_) => {
                self.forget(&conn).await;
                Err(timed_out)
            }
        }
    }

    /// The current connection, or a new one if there is none or it closed.
    async fn conn(&self) -> Result<Arc<Conn>, tokio_postgres::Error> {
        let mut slot = self.shared.conn.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(conn.clone());
        }
        *slot = None;
        let conn = Arc::new(Conn::open(&self.shared.config, &self.shared.tls).await?);
        tracing::info!(pid = conn.backend_pid, "fleet store connected");
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Drops `conn` as the store's connection, if it still is.
    async fn forget(&self, conn: &Arc<Conn>) {
        let mut slot = self.shared.conn.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    fn expires_ms(&self, now: SystemTime) -> Result<i64, PgError> {
        let lease = u64::try_from(self.shared.lease.as_millis()).unwrap_or(u64::MAX);
        bigint("a lease's expiry", unix_ms(now).saturating_add(lease))
    }
}

/// Whether `e` is one statement's failure on a session that is fine otherwise (an `ERROR`:
/// a lock or statement timeout, a constraint), rather than the session's end (`FATAL`, a closed
/// socket, a protocol error).
fn statement_error(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.parsed_severity() == Some(Severity::Error))
}

fn now_ms(now: SystemTime) -> Result<i64, PgError> {
    bigint("now", unix_ms(now))
}

fn record_json(record: &StoredRecord) -> serde_json::Value {
    // A record is plain data (numbers, strings, options): serialising it cannot fail.
    serde_json::to_value(record).unwrap_or_default()
}

fn parse_record(key: &str, value: Option<serde_json::Value>) -> Result<StoredRecord, PgError> {
    match value {
        None => Ok(StoredRecord::default()),
        Some(value) => serde_json::from_value(value).map_err(|e| PgError::Malformed {
            what: format!("the record of {key}"),
            why: e.to_string(),
        }),
    }
}

fn parse_key(text: &str) -> Result<Key, PgError> {
    Key::try_from(text.to_string()).map_err(|e| PgError::Malformed {
        what: format!("key {text:?}"),
        why: e.to_string(),
    })
}

/// A row of `key_entry` (the columns of `ENTRY_COLUMNS`) as the entry every store reports.
fn entry_of(row: &Row) -> Result<KeyEntry, PgError> {
    let key: String = row.get(0);
    let what = |field: &str| format!("the {field} of {key}");
    let owner = match (row.get::<_, Option<i64>>(1), row.get::<_, Option<i64>>(2)) {
        (Some(inc), Some(epoch)) => Some((
            incarnation(&what("owner"), inc)?,
            unsigned(&what("owner's epoch"), epoch)?,
        )),
        _ => None,
    };
    let wants = row
        .get::<_, Vec<i64>>(5)
        .into_iter()
        .map(|w| incarnation(&what("wants"), w))
        .collect::<Result<_, _>>()?;
    Ok(KeyEntry {
        owner,
        token: unsigned(&what("token"), row.get(3))?,
        record: parse_record(&key, row.get(4))?,
        wants,
        recording: row
            .get::<_, Option<i64>>(6)
            .map(|r| unsigned(&what("recording"), r))
            .transpose()?,
        key,
    })
}

impl FleetStore for PgStore {
    fn register(&self) -> StoreFuture<u32> {
        let store = self.clone();
        Box::pin(async move { PgStore::register(&store).await.map_err(failure) })
    }

    fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> StoreFuture<Option<Vec<Key>>> {
        let store = self.clone();
        Box::pin(async move {
            PgStore::renew(&store, incarnation, epoch, now)
                .await
                .map_err(failure)
        })
    }

    fn claim(&self, key: Key, incarnation: u32, epoch: u64, now: SystemTime) -> StoreFuture<Claim> {
        let store = self.clone();
        Box::pin(async move {
            PgStore::claim(&store, &key, incarnation, epoch, now)
                .await
                .map_err(failure)
        })
    }

    fn record(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        Box::pin(async move {
            PgStore::record(&store, &key, incarnation, token, recording, &record, now)
                .await
                .map_err(failure)
        })
    }

    fn sweep(&self, now: SystemTime) -> StoreFuture<Swept> {
        let store = self.clone();
        Box::pin(async move { PgStore::sweep(&store, now).await.map_err(failure) })
    }

    fn sweep_own(&self, now: SystemTime, own: OwnSnapshots) -> StoreFuture<Swept> {
        let store = self.clone();
        Box::pin(async move { PgStore::sweep_own(&store, now, &own).await.map_err(failure) })
    }

    fn release(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        Box::pin(async move {
            PgStore::release(&store, &key, incarnation, token, &record, now)
                .await
                .map_err(failure)
        })
    }
}

fn failure(e: PgError) -> StoreFailure {
    StoreFailure(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_limits_go_after_the_callers_options_and_name_the_session() {
        let timeouts = Timeouts::default();
        assert_eq!(
            timeouts.session_options(),
            "-c idle_in_transaction_session_timeout=2000 -c lock_timeout=3000 \
             -c statement_timeout=4000"
        );
        let mut given = Config::new();
        given.options("-c search_path=x");
        let applied = timeouts.apply(&given);
        assert_eq!(
            applied.get_options(),
            Some(format!("-c search_path=x {}", timeouts.session_options()).as_str())
        );
        assert_eq!(applied.get_application_name(), Some("sandkeeper-fleet"));
        assert_eq!(applied.get_connect_timeout(), Some(&timeouts.operation));
        // A bound under the server's limits would cut operations the server still runs.
        assert!(timeouts.idle_in_transaction < timeouts.lock);
        assert!(timeouts.lock < timeouts.statement && timeouts.statement < timeouts.operation);
    }

    #[test]
    fn numbers_beyond_a_bigint_and_negative_rows_are_typed_errors() {
        assert!(matches!(
            bigint("epoch", u64::MAX),
            Err(PgError::OutOfRange {
                what: "epoch",
                value: u64::MAX
            })
        ));
        assert!(matches!(
            unsigned("a token", -1),
            Err(PgError::Malformed { .. })
        ));
        assert!(matches!(
            incarnation("an owner", i64::from(u32::MAX) + 1),
            Err(PgError::Malformed { .. })
        ));
        assert!(matches!(
            parse_record("session:s", Some(serde_json::json!({"warm": "x"}))),
            Err(PgError::Malformed { .. })
        ));
        assert_eq!(
            parse_record("session:s", None).unwrap(),
            StoredRecord::default()
        );
    }
}
