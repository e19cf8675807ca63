//! The sandbox table in PostgreSQL (`--fleet-store`): replicas on hosts of their own share it,
//! as they share the fleet store there. One row a sandbox, `sandkeeperd.sandbox (id, record)`,
//! the record the JSON of [`Record`], in the database the fleet store uses, in a schema of
//! its own (made at [`PgTable::connect`], under an advisory lock so that servers starting
//! together make it once).
//!
//! Every operation is one statement: no transaction is ever left open by a server that stopped
//! (SIGSTOP, a network cut) holding a row. A change that depends on what a record says is a
//! compare-and-set ([`PgTable::change`]): the row read, the decision made here, and the write
//! (or removal) applied only if the row is still what was read; if another replica changed it
//! meanwhile, the decision is made again on what it wrote. Every operation is bounded (5 s by
//! default, the server's own limits below it: [`Timeouts`]); the connection is made again by
//! the first operation after it broke.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use sandkeeper_pg::{StoreTls, Timeouts};
use serde_json::Value;
use tokio::sync::Mutex;
use tokio_postgres::{Client, Config};

use crate::durable::{check_id, Record, MAX_RECORD};
use crate::table::Change;

/// The advisory lock the schema is made under ("sbxtable" in ASCII).
const SCHEMA_LOCK: i64 = 0x73_62_78_74_61_62_6c_65;

/// The schema, made if missing.
const SCHEMA: &str = "
    CREATE SCHEMA IF NOT EXISTS sandkeeperd;
    CREATE TABLE IF NOT EXISTS sandkeeperd.sandbox (
        id text PRIMARY KEY CHECK (id ~ '^sbx[0-9a-f]{20}$'),
        record jsonb NOT NULL
    )";

/// How many times a compare-and-set is tried before it gives up (each retry means another
/// replica changed the record in between: a few settle).
const ATTEMPTS: usize = 64;

/// The table. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct PgTable {
    shared: Arc<Shared>,
}

struct Shared {
    config: Config,
    tls: StoreTls,
    operation: Duration,
    client: Mutex<Option<Arc<Client>>>,
}

impl std::fmt::Debug for PgTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTable")
            .field("hosts", &self.shared.config.get_hosts())
            .finish_non_exhaustive()
    }
}

impl PgTable {
    /// The table in the database `config` names, connected as `tls` says; its schema made if
    /// missing. Bounded by the operation's limit.
    pub async fn connect(config: &Config, tls: StoreTls) -> io::Result<PgTable> {
        let timeouts = Timeouts::default();
        let mut config = timeouts.apply(config);
        config.application_name("sandkeeperd");
        let table = PgTable {
            shared: Arc::new(Shared {
                config,
                tls,
                operation: timeouts.operation,
                client: Mutex::new(None),
            }),
        };
        table
            .run("make the schema", |client| async move {
                client
                    .batch_execute(&format!(
                        "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {SCHEMA}; COMMIT"
                    ))
                    .await
            })
            .await?;
        Ok(table)
    }

    /// `id`'s record, if it has one.
    pub async fn get(&self, id: &str) -> io::Result<Option<Record>> {
        Ok(self.read(id).await?.map(|(record, _)| record))
    }

    /// Every record, by id. A row that is not a record is skipped, named in a warning.
    pub async fn load(&self) -> io::Result<Vec<Record>> {
        let rows = self
            .run("list the sandboxes", |client| async move {
                client
                    .query(
                        "SELECT id, record FROM sandkeeperd.sandbox ORDER BY id",
                        &[],
                    )
                    .await
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.get(0);
            match record_of(&id, row.get(1)) {
                Ok(record) => out.push(record),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "not a sandbox record: skipped")
                }
            }
        }
        Ok(out)
    }

    /// How many of `team`'s sandboxes run (or are being killed) on any replica: those whose
    /// record names a replica ([`crate::table::Table::running`]).
    pub async fn running(&self, team: &str) -> io::Result<usize> {
        let team = team.to_string();
        let row = self
            .run("count a team's sandboxes", |client| async move {
                client
                    .query_one(
                        "SELECT count(*) FROM sandkeeperd.sandbox
                         WHERE record->>'team' = $1
                           AND jsonb_typeof(record->'runs_on') = 'object'",
                        &[&team],
                    )
                    .await
            })
            .await?;
        let n: i64 = row.get(0);
        usize::try_from(n).map_err(|e| io::Error::other(format!("a count of {n}: {e}")))
    }

    /// Writes `record`, replacing any older one of its id, whatever it said.
    pub async fn put(&self, record: &Record) -> io::Result<()> {
        check_id(&record.id)?;
        let (id, json) = (record.id.clone(), json_of(record)?);
        self.run("write a sandbox", |client| async move {
            client
                .execute(
                    "INSERT INTO sandkeeperd.sandbox (id, record) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                    &[&id, &json],
                )
                .await
        })
        .await?;
        Ok(())
    }

    /// Reads `id`'s record and does what `decide` says, if the row is still what was read
    /// then; else asks `decide` again on what it is now. What `decide` answered.
    pub async fn change<T, F>(&self, id: &str, mut decide: F) -> io::Result<T>
    where
        F: FnMut(Option<Record>) -> (Change, T),
    {
        check_id(id)?;
        for _ in 0..ATTEMPTS {
            let read = self.read(id).await?;
            let (record, seen) = match read {
                Some((record, seen)) => (Some(record), Some(seen)),
                None => (None, None),
            };
            let (change, out) = decide(record);
            let applied = match change {
                Change::Keep => true,
                Change::Put(new) => self.swap(id, seen, Some(json_of(&new)?)).await?,
                Change::Remove => self.swap(id, seen, None).await?,
            };
            if applied {
                return Ok(out);
            }
        }
        Err(io::Error::other(format!(
            "sandbox {id}'s record kept changing while it was changed ({ATTEMPTS} tries)"
        )))
    }

    /// `id`'s record and its row as read (for a compare-and-set).
    async fn read(&self, id: &str) -> io::Result<Option<(Record, Value)>> {
        check_id(id)?;
        let owned = id.to_string();
        let row = self
            .run("read a sandbox", |client| async move {
                client
                    .query_opt(
                        "SELECT record FROM sandkeeperd.sandbox WHERE id = $1",
                        &[&owned],
                    )
                    .await
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let seen: Value = row.get(0);
        let record = record_of(id, seen.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{id}: {e}")))?;
        Ok(Some((record, seen)))
    }

    /// Replaces the row of `id` that was `seen` (`None`: there was none) with `new` (`None`:
    /// removed): whether it was still as seen.
    async fn swap(&self, id: &str, seen: Option<Value>, new: Option<Value>) -> io::Result<bool> {
        let id = id.to_string();
        let changed = self
            .run("change a sandbox", |client| async move {
                match (seen, new) {
                    (None, None) => Ok(1),
                    (None, Some(new)) => {
                        client
                            .execute(
                                "INSERT INTO sandkeeperd.sandbox (id, record) VALUES ($1, $2)
                                 ON CONFLICT (id) DO NOTHING",
                                &[&id, &new],
                            )
                            .await
                    }
                    (Some(seen), Some(new)) => {
                        client
                            .execute(
                                "UPDATE sandkeeperd.sandbox SET record = $3
                                 WHERE id = $1 AND record = $2",
                                &[&id, &seen, &new],
                            )
                            .await
                    }
                    (Some(seen), None) => {
                        client
                            .execute(
                                "DELETE FROM sandkeeperd.sandbox WHERE id = $1 AND record = $2",
                                &[&id, &seen],
                            )
                            .await
                    }
                }
            })
            .await?;
        Ok(changed == 1)
    }

    /// `op` on the table's connection (made again if it broke), bounded: an error that names
    /// `what` failed. A connection that failed or timed out is dropped, for the next
    /// operation to make anew.
    async fn run<T, Fut>(&self, what: &str, op: impl FnOnce(Arc<Client>) -> Fut) -> io::Result<T>
    where
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let bound = self.shared.operation;
        let done = tokio::time::timeout(bound, async {
            let client = self.client().await?;
            op(client).await.map_err(|e| failed(what, &e))
        })
        .await;
        match done {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => {
                self.drop_broken().await;
                Err(e)
            }
            Err(_) => {
                *self.shared.client.lock().await = None;
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the sandbox table: {what}: no answer from PostgreSQL in {bound:?}"),
                ))
            }
        }
    }

    /// The connection, made if there is none or it broke.
    async fn client(&self) -> io::Result<Arc<Client>> {
        let mut held = self.shared.client.lock().await;
        if let Some(client) = held.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let (client, _io) = self
            .shared
            .tls
            .connect(&self.shared.config)
            .await
            .map_err(|e| failed("connect", &e))?;
        let client = Arc::new(client);
        *held = Some(client.clone());
        Ok(client)
    }

    /// Forgets a connection that closed (the next operation connects anew).
    async fn drop_broken(&self) {
        let mut held = self.shared.client.lock().await;
        if held.as_ref().is_some_and(|c| c.is_closed()) {
            *held = None;
        }
    }
}

/// The record in a row of `id`: its JSON, which must name `id` and be bounded as a file's.
fn record_of(id: &str, json: Value) -> Result<Record, String> {
    let record: Record = serde_json::from_value(json).map_err(|e| e.to_string())?;
    if record.id != id {
        return Err(format!("names sandbox {:?}", record.id));
    }
    Ok(record)
}

/// `record` as the row's JSON, bounded as a file's.
fn json_of(record: &Record) -> io::Result<Value> {
    let json = serde_json::to_value(record).map_err(io::Error::other)?;
    let size = json.to_string().len() as u64;
    if size > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "sandbox {}'s record is {size} bytes, over {MAX_RECORD}",
                record.id
            ),
        ));
    }
    Ok(json)
}

/// An error of PostgreSQL, saying what failed.
fn failed(what: &str, e: &tokio_postgres::Error) -> io::Error {
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_string());
    io::Error::other(format!("the sandbox table: {what}: {detail}"))
}
