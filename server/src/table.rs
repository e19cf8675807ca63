//! The sandbox table the replicas share (`--fleet`), wherever it is kept: files under the root
//! ([`crate::durable`]) for replicas on one root, or rows in PostgreSQL ([`crate::table_pg`])
//! for replicas on hosts of their own, or Leases ([`crate::table_k8s`]) for replicas on one
//! Kubernetes namespace. Every change that depends on what a record says is one
//! [`Table::change`], never interleaved with another's (the root's `flock`, PostgreSQL's
//! compare-and-set, or the API server's `resourceVersion`), so that two replicas never both
//! act on one record. The decisions
//! themselves are [`crate::replicas`]'s.

use std::io;

use crate::durable::{Durable, Record};
use crate::table_k8s::K8sTable;
use crate::table_pg::PgTable;

/// Where the table is kept.
#[derive(Clone, Debug)]
pub enum Table {
    /// One file a sandbox under the root (replicas on one root).
    Files(Durable),
    /// One row a sandbox in PostgreSQL (replicas on hosts of their own).
    Postgres(PgTable),
    /// One Lease a sandbox in the namespace (replicas on Kubernetes; boxed: a client is large
    /// beside the others).
    Kubernetes(Box<K8sTable>),
}

/// What a [`Table::change`] does to the record it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    Keep,
    /// Writes this record in its place (boxed: a record is large beside the other two).
    Put(Box<Record>),
    /// Removes it.
    Remove,
}

impl Table {
    /// `id`'s record, if it has one. An id that is not a sandbox's is `InvalidInput`.
    pub async fn get(&self, id: &str) -> io::Result<Option<Record>> {
        match self {
            Table::Files(files) => {
                let (files, id) = (files.clone(), id.to_string());
                blocking(move || files.get(&id)).await
            }
            Table::Postgres(rows) => rows.get(id).await,
            Table::Kubernetes(leases) => leases.get(id).await,
        }
    }

    /// Every record, by id.
    pub async fn load(&self) -> io::Result<Vec<Record>> {
        match self {
            Table::Files(files) => {
                let files = files.clone();
                blocking(move || files.load()).await
            }
            Table::Postgres(rows) => rows.load().await,
            Table::Kubernetes(leases) => leases.load().await,
        }
    }

    /// How many of `team`'s sandboxes run (or are being killed) on any replica, as the table
    /// says: what a team's limit counts across the replicas.
    pub async fn running(&self, team: &str) -> io::Result<usize> {
        match self {
            Table::Files(_) => {
                let records = self.load().await?;
                Ok(records
                    .iter()
                    .filter(|r| r.team == team && r.runs_on.is_some())
                    .count())
            }
            Table::Postgres(rows) => rows.running(team).await,
            Table::Kubernetes(leases) => leases.running(team).await,
        }
    }

    /// Writes `record`, replacing any older one of its id, whatever it said.
    pub async fn put(&self, record: Record) -> io::Result<()> {
        match self {
            Table::Files(files) => {
                let files = files.clone();
                blocking(move || files.put(&record)).await
            }
            Table::Postgres(rows) => rows.put(&record).await,
            Table::Kubernetes(leases) => leases.put(&record).await,
        }
    }

    /// Reads `id`'s record, and does what `decide` says of it, as one step: no other
    /// change of the record comes between the read and the write (under the root's lock; in
    /// PostgreSQL, a write compared with what was read, `decide` asked again on what another
    /// wrote meanwhile). What `decide` answered besides.
    pub async fn change<T, F>(&self, id: &str, mut decide: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnMut(Option<Record>) -> (Change, T) + Send + 'static,
    {
        match self {
            Table::Files(files) => {
                let (files, id) = (files.clone(), id.to_string());
                blocking(move || {
                    files.locked(|table| {
                        let (change, out) = decide(table.get(&id)?);
                        match change {
                            Change::Keep => {}
                            Change::Put(record) => table.put(&record)?,
                            Change::Remove => table.remove(&id)?,
                        }
                        Ok(out)
                    })
                })
                .await
            }
            Table::Postgres(rows) => rows.change(id, decide).await,
            Table::Kubernetes(leases) => leases.change(id, decide).await,
        }
    }
}

/// `work` on a blocking task (file system calls, a lock that waits).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| io::Error::other(format!("the table's task failed: {e}")))?
}
