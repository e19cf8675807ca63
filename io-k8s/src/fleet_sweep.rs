//! Fleet mode's sweep on Kubernetes: the claims (agent-sandbox mode) or pods (pod mode) a
//! crashed or departed process left go once nothing may need them, by
//! [`sandkeeper::sweep_verdict`], the decision the local root's sweep and the simulator take.
//!
//! What the sweep reads: the fleet store's key Leases (each key's owner, record and, through
//! its name, the hash the objects' `.../session-hash` label carries) and process Leases (who
//! is live), and the objects with their `.../sandbox` label (the maker's incarnation is the
//! number's upper half). A claim is seen as a sandbox, and also as a snapshot when its Sandbox
//! is suspended or a record names it as one (a suspended claim's `shutdownTime` is its
//! retention: what its Persist set, or else the backstop it was made or last resumed with); it
//! goes only when every way of seeing it lets it go. Leases and retention are judged a lease
//! later than a claim would be.
//!
//! A claim whose Sandbox the controller suspended by itself for inactivity
//! ([`Suspension::ByController`]: its pod deleted, `operatingMode` left `Running`) is judged
//! exactly as a claim its keeper suspended in the same place, never as a running sandbox whose
//! pod is gone: a keeper alive when the controller suspended it would have suspended it by mode
//! (the core suspends a sandbox whose instance was lost), and the claim it leaves is the one
//! that keeper's suspension without a retention leaves, its `shutdownTime` the backstop. So it
//! stays while its key's owner lives or its key's record names it (warm: the next owner adopts
//! it and runs it again on the same volumes, `adopt.rs`), however long the controller keeps it
//! suspended; named by nothing, it stays until its `shutdownTime`, when the claim controller
//! deletes it anyway.
//!
//! Unlike the local root's, this sweep cannot hold a lock across its decision: each deletion
//! carries the object's `resourceVersion` as read as a precondition, so an object that changed
//! since (adopted: its token raised and relabelled) is left for the next sweep; a record's
//! snapshot is dropped by a replace under the key Lease's `resourceVersion` as read, skipped
//! when the key changed meanwhile.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::ResourceExt;
use sandkeeper::{
    sweep_verdict, Instant, SandboxId, Snapshot, SweepKey, SweepObject, SweepVerdict,
};
use sandkeeper_tokio::store::{unix_ms, Swept};

use crate::cluster::{calls, err, Cluster};
use crate::config::Mode;
use crate::crd::{Suspension, POD_NAME_ANNOTATION};
use crate::error::K8sError;
use crate::fleet_store::K8sStore;
use crate::names::{self, SANDBOX, SESSION_HASH};

impl K8sStore {
    /// Sweeps the namespace at `now` (see the module docs).
    pub async fn sweep(&self, now: SystemTime) -> Result<Swept, K8sError> {
        let judged = now.checked_sub(self.lease()).unwrap_or(UNIX_EPOCH);
        let judged_ms = unix_ms(judged);
        let processes = self.processes().await?;
        let live = |inc: u32| {
            processes
                .get(&inc)
                .is_some_and(|(_, expires)| judged_ms < *expires)
        };
        let mut by_hash = BTreeMap::new();
        let mut keys = BTreeMap::new();
        let mut leases = BTreeMap::new();
        for (lease, key, owner, record) in self.keys().await? {
            let owner_live = owner.is_some_and(|(inc, epoch)| {
                processes
                    .get(&inc)
                    .is_some_and(|(e, expires)| *e == epoch && judged_ms < *expires)
            });
            by_hash.insert(names::session_hash(&key.to_string()), key.clone());
            keys.insert(
                key.clone(),
                SweepKey {
                    owner_live,
                    record: record.on_unix_clock(),
                },
            );
            leases.insert(key, lease);
        }
        let now = Instant::from_nanos(judged_ms.saturating_mul(1_000_000));
        let cluster = self.cluster();
        let mut swept = Swept::default();
        for object in cluster.fleet_objects().await? {
            let key = object.hash.as_ref().and_then(|h| by_hash.get(h)).cloned();
            let id = SandboxId(object.sandbox);
            // Resuming a suspended claim leaves it where it is: nothing moves.
            let as_sandbox = SweepObject::Sandbox {
                id,
                key: key.clone(),
                resumed_from: None,
            };
            let mut verdicts = vec![sweep_verdict(&as_sandbox, &keys, live, now)];
            let named = key
                .as_ref()
                .and_then(|k| keys.get(k))
                .and_then(|k| k.record.snapshot.as_ref())
                .is_some_and(|s| s.snapshot.as_str() == object.name);
            if object.claim && (object.suspended || named) {
                let as_snapshot = SweepObject::Snapshot {
                    snapshot: Snapshot::new(object.name.clone()),
                    by: id,
                    key: key.clone(),
                    expires: object.expires,
                };
                verdicts.push(sweep_verdict(&as_snapshot, &keys, live, now));
            }
            if verdicts.contains(&SweepVerdict::Keep) {
                continue;
            }
            if verdicts.contains(&SweepVerdict::SweepAndUnrecord) {
                let key = key.expect("a recorded claim's key is known");
                let lease = leases.get(&key).expect("a known key").clone();
                if !self.unrecord(lease, &object.name).await? {
                    continue; // the key changed since: the next sweep decides again
                }
                swept.unrecorded += 1;
            }
            if cluster.delete_as_read(&object).await? {
                tracing::info!(object = %object.name, by_controller = object.by_controller, "swept");
                if object.claim && object.suspended {
                    swept.snapshots += 1;
                } else {
                    swept.sandboxes += 1;
                }
            }
        }
        Ok(swept)
    }
}

/// One object the sweep looks at (and the fleet's verification, `fleet_verify.rs`).
pub(crate) struct FleetObject {
    pub(crate) name: String,
    resource_version: Option<String>,
    /// A claim (agent-sandbox mode) rather than a pod.
    pub(crate) claim: bool,
    /// The number of its sandbox (its `.../sandbox` label).
    pub(crate) sandbox: u64,
    hash: Option<String>,
    /// Its Sandbox is suspended, by a keeper or by the controller (claims only).
    pub(crate) suspended: bool,
    /// By the controller, for inactivity ([`Suspension::ByController`]).
    by_controller: bool,
    /// Its `shutdownTime`, for a suspended claim: its retention.
    expires: Option<Instant>,
    /// The pod whose workspace is the sandbox's: the pod itself, or the pod of a claim's
    /// Sandbox (its `agents.x-k8s.io/pod-name` annotation, else the Sandbox's name, which a
    /// suspended Sandbox's pod comes back under); `None` for a claim without a Sandbox yet.
    pub(crate) pod: Option<String>,
}

impl Cluster {
    /// The objects of sandboxes in the namespace: claims in agent-sandbox mode, pods in pod
    /// mode (a claim's pod goes with its claim).
    pub(crate) async fn fleet_objects(&self) -> Result<Vec<FleetObject>, K8sError> {
        let number = |labels: &BTreeMap<String, String>| {
            labels.get(SANDBOX).and_then(|n| n.parse::<u64>().ok())
        };
        let mut out = vec![];
        match &self.config.mode {
            Mode::AgentSandbox { .. } => {
                let claims = self.list_claims(SANDBOX).await?;
                let sandboxes = self
                    .retry
                    .run(|| async {
                        self.sandboxes()
                            .list(&ListParams::default())
                            .await
                            .map(|l| l.items)
                            .map_err(|e| err(e, calls::LIST_SANDBOXES, "sandboxes"))
                    })
                    .await?;
                let suspended: BTreeMap<String, Suspension> = sandboxes
                    .iter()
                    .map(|s| (s.name_any(), s.suspension()))
                    .filter(|(_, by)| *by != Suspension::None)
                    .collect();
                let pods: BTreeMap<String, String> = sandboxes
                    .iter()
                    .map(|s| {
                        let pod = s.annotations().get(POD_NAME_ANNOTATION).cloned();
                        (s.name_any(), pod.unwrap_or_else(|| s.name_any()))
                    })
                    .collect();
                for c in claims {
                    let Some(sandbox) = number(c.labels()) else {
                        continue;
                    };
                    let of = c.status.as_ref().and_then(|s| s.sandbox.as_ref());
                    let by = of.and_then(|s| suspended.get(&s.name)).copied();
                    let is_suspended = by.is_some();
                    let pod = of.and_then(|s| pods.get(&s.name)).cloned();
                    let expires = c
                        .spec
                        .lifecycle
                        .as_ref()
                        .and_then(|l| l.shutdown_time.as_deref())
                        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                        .map(|t| {
                            Instant::from_nanos(u64::try_from(t.as_nanosecond()).unwrap_or(0))
                        });
                    out.push(FleetObject {
                        name: c.name_any(),
                        resource_version: c.resource_version(),
                        claim: true,
                        sandbox,
                        hash: c.labels().get(SESSION_HASH).cloned(),
                        suspended: is_suspended,
                        by_controller: by == Some(Suspension::ByController),
                        expires: expires.filter(|_| is_suspended),
                        pod,
                    });
                }
            }
            Mode::Pod { .. } => {
                let pods = self.list_pods(SANDBOX).await?;
                for p in pods {
                    let Some(sandbox) = number(p.labels()) else {
                        continue;
                    };
                    out.push(FleetObject {
                        pod: Some(p.name_any()),
                        name: p.name_any(),
                        resource_version: p.resource_version(),
                        claim: false,
                        sandbox,
                        hash: p.labels().get(SESSION_HASH).cloned(),
                        suspended: false,
                        by_controller: false,
                        expires: None,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes the object if it has not changed since it was read: whether it was.
    async fn delete_as_read(&self, object: &FleetObject) -> Result<bool, K8sError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: object.resource_version.clone(),
                uid: None,
            }),
            ..DeleteParams::background()
        };
        let what = format!("{} (as read)", object.name);
        let r = if object.claim {
            self.claims()
                .delete(&object.name, &dp)
                .await
                .map(|_| ())
                .map_err(|e| err(e, calls::DELETE_CLAIM, &what))
        } else {
            self.pods()
                .delete(&object.name, &dp)
                .await
                .map(|_| ())
                .map_err(|e| err(e, calls::DELETE_POD, &what))
        };
        match r {
            Ok(()) => Ok(true),
            Err(K8sError::Conflict { .. }) => Ok(false),
            Err(e) if e.is_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }
}
