//! The sandbox table on Kubernetes (`--kubernetes FILE --fleet`, [`crate::table`]): one
//! `coordination.k8s.io/v1` Lease a sandbox in the backend's namespace, named
//! `sandkeeperd-<id>`, its record (JSON) in the annotation [`A_RECORD`], labelled
//! [`L_TABLE`]`=sandbox` so that the table is listed by one selector. Leases, as the fleet
//! store's (`sandkeeper_k8s::K8sStore`): the role the backend has already
//! (`io-k8s/deploy/rbac.yaml`: create, get, list, update, delete) covers them, and nothing is
//! installed. A record is small (a few kilobytes: the bounds of a create's metadata and
//! variables), far below the 256 KiB the API server allows a object's annotations.
//!
//! Every change that depends on what a record says is a read and a write under the read's
//! `resourceVersion`: a replace, a create (refused if the name was taken meanwhile), or a
//! delete with the `resourceVersion` as its precondition. A 409 (another replica wrote in
//! between) reads again and decides again, at most [`ATTEMPTS`] times. Each call to the API
//! server is bounded by [`CALL`]; a failure is an `io::Error` naming the call, which the
//! registry answers as 503 (nothing was done).

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

use crate::durable::{check_id, Record, MAX_RECORD};
use crate::table::Change;

/// The annotation holding a sandbox's record.
pub const A_RECORD: &str = "sandkeeper.sandbox.users.io/sandkeeperd-record";
/// The label of the table's Leases (value `sandbox`).
pub const L_TABLE: &str = "sandkeeper.sandbox.users.io/sandkeeperd-table";
/// How many times a change is read and decided again after a conflict.
pub const ATTEMPTS: usize = 64;
/// The bound of each call to the API server.
pub const CALL: Duration = Duration::from_secs(10);

/// The table in a namespace's Leases. Cheap to clone.
#[derive(Clone)]
pub struct K8sTable {
    leases: Api<Lease>,
}

impl std::fmt::Debug for K8sTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("K8sTable")
    }
}

impl K8sTable {
    /// The table in `namespace`, through `client`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        K8sTable {
            leases: Api::namespaced(client, namespace),
        }
    }

    /// `id`'s record, if it has one. An id that is not a sandbox's is `InvalidInput`.
    pub async fn get(&self, id: &str) -> io::Result<Option<Record>> {
        check_id(id)?;
        match self.read(id).await? {
            None => Ok(None),
            Some(lease) => record_of(id, &lease).map(Some),
        }
    }

    /// Every record, by id. A Lease of the table that holds no record is skipped, named in a
    /// warning.
    pub async fn load(&self) -> io::Result<Vec<Record>> {
        let params = ListParams::default().labels(&format!("{L_TABLE}=sandbox"));
        let leases = bounded("list the sandboxes", self.leases.list(&params)).await?;
        let mut out = Vec::with_capacity(leases.items.len());
        for lease in leases.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let id = name.strip_prefix(PREFIX).unwrap_or_default();
            match check_id(id).and_then(|()| record_of(id, &lease)) {
                Ok(record) => out.push(record),
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "not a sandbox record: skipped")
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// How many of `team`'s sandboxes name a replica ([`crate::table::Table::running`]).
    pub async fn running(&self, team: &str) -> io::Result<usize> {
        let records = self.load().await?;
        Ok(records
            .iter()
            .filter(|r| r.team == team && r.runs_on.is_some())
            .count())
    }

    /// Writes `record`, replacing any older one of its id, whatever it said.
    pub async fn put(&self, record: &Record) -> io::Result<()> {
        let record = record.clone();
        self.change(&record.id.clone(), move |_| {
            (Change::Put(Box::new(record.clone())), ())
        })
        .await
    }

    /// Reads `id`'s record and does what `decide` says, if the Lease is still what was read
    /// then; else asks `decide` again on what it is now. What `decide` answered.
    pub async fn change<T, F>(&self, id: &str, mut decide: F) -> io::Result<T>
    where
        F: FnMut(Option<Record>) -> (Change, T),
    {
        check_id(id)?;
        for _ in 0..ATTEMPTS {
            let lease = self.read(id).await?;
            let now = lease.as_ref().map(|l| record_of(id, l)).transpose()?;
            let (change, out) = decide(now);
            let written = match (change, lease) {
                (Change::Keep, _) | (Change::Remove, None) => return Ok(out),
                (Change::Put(record), None) => {
                    let lease = fresh(id, &record)?;
                    bounded(
                        "make a sandbox's record",
                        self.leases.create(&PostParams::default(), &lease),
                    )
                    .await
                    .map(drop)
                }
                (Change::Put(record), Some(mut lease)) => {
                    set_record(&mut lease, &record)?;
                    bounded(
                        "replace a sandbox's record",
                        self.leases
                            .replace(&name(id), &PostParams::default(), &lease),
                    )
                    .await
                    .map(drop)
                }
                (Change::Remove, Some(lease)) => {
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            resource_version: lease.metadata.resource_version.clone(),
                            uid: None,
                        }),
                        ..DeleteParams::default()
                    };
                    bounded(
                        "remove a sandbox's record",
                        self.leases.delete(&name(id), &params),
                    )
                    .await
                    .map(drop)
                }
            };
            match written {
                Ok(()) => return Ok(out),
                // Written (or taken, or removed) by another replica in between: again.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "sandbox {id}'s record kept changing while it was changed ({ATTEMPTS} attempts)"
        )))
    }

    async fn read(&self, id: &str) -> io::Result<Option<Lease>> {
        bounded("read a sandbox's record", self.leases.get_opt(&name(id))).await
    }
}

/// The prefix of the table's Lease names.
const PREFIX: &str = "sandkeeperd-";

/// The Lease of the sandbox `id` (a checked id: `sbx` and hex digits, a valid name).
fn name(id: &str) -> String {
    format!("{PREFIX}{id}")
}

/// A new Lease holding `record`.
fn fresh(id: &str, record: &Record) -> io::Result<Lease> {
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(name(id)),
            labels: Some(BTreeMap::from([(
                L_TABLE.to_string(),
                "sandbox".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: None,
    };
    set_record(&mut lease, record)?;
    Ok(lease)
}

/// Puts `record` in `lease`'s annotation.
fn set_record(lease: &mut Lease, record: &Record) -> io::Result<()> {
    let json = serde_json::to_string(record)?;
    if json.len() as u64 > MAX_RECORD.min(200 << 10) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "sandbox {}'s record is {} bytes: over what a Lease's annotations hold",
                record.id,
                json.len()
            ),
        ));
    }
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(A_RECORD.to_string(), json);
    Ok(())
}

/// The record `lease` holds for `id`.
fn record_of(id: &str, lease: &Lease) -> io::Result<Record> {
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sandbox {id}'s record: {why}"),
        )
    };
    let json = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(A_RECORD))
        .ok_or_else(|| bad("its Lease has no record".into()))?;
    let record: Record = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    if record.id != id {
        return Err(bad(format!("it names {:?}", record.id)));
    }
    Ok(record)
}

/// `call`, bounded by [`CALL`]; an API error as an `io::Error` of its kind (404 `NotFound`,
/// 409 `AlreadyExists`: a conflict or a name taken), naming `what`.
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> io::Result<T> {
    match tokio::time::timeout(CALL, call).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(kube::Error::Api(status))) => {
            let kind = match status.code {
                404 => io::ErrorKind::NotFound,
                409 => io::ErrorKind::AlreadyExists,
                _ => io::ErrorKind::Other,
            };
            Err(io::Error::new(
                kind,
                format!(
                    "the sandbox table on Kubernetes: {what}: {} {}",
                    status.code, status.message
                ),
            ))
        }
        Ok(Err(e)) => Err(io::Error::other(format!(
            "the sandbox table on Kubernetes: {what}: {e}"
        ))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the sandbox table on Kubernetes: {what}: no answer in {CALL:?}"),
        )),
    }
}
