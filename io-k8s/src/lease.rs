//! Owner liveness: one `coordination.k8s.io/v1` Lease per owner instance, renewed while the
//! instance lives; at start-up, objects of owners whose Lease is gone or expired are swept. At
//! close, an owner deletes everything it labelled.
//!
//! The start-up sweep judges a claim by its owner alone, whatever its Sandbox is doing: a dead
//! owner's claims go (running, suspended by a keeper, or suspended by the controller for
//! inactivity, [`Suspension::ByController`]), a live owner's and this owner's own stay. So a
//! claim the controller suspended is never deleted because its pod is gone, and goes exactly
//! where and when one its keeper suspended goes. The sweep still tells it apart, as the
//! operator may not expect it (a keeper ended with the sandbox running, and the controller
//! paused it since): it is counted in [`SweepReport::auto_suspended`] and named in a warning.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::SignedDuration;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::ResourceExt;

use crate::cluster::{calls, err, wall_clock, Cluster};
use crate::crd::{SandboxClaim, Suspension};
use crate::error::K8sError;
use crate::names::{self, MANAGED_BY, MANAGER, OWNER};

/// What a sweep removed, and the claims it found suspended by the controller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Owners found dead (no Lease, or an expired one), in name order.
    pub dead_owners: Vec<String>,
    /// Claims deleted.
    pub claims: usize,
    /// Pods deleted.
    pub pods: usize,
    /// Leases deleted.
    pub leases: usize,
    /// Claims whose Sandbox the controller had suspended for inactivity
    /// ([`Suspension::ByController`]: its pod deleted, `operatingMode` left `Running`), each
    /// named in a warning: a dead owner's, deleted with its owner's other claims (and counted
    /// in [`claims`](Self::claims) too), and this owner's own, left by an earlier run under the
    /// same name and kept. Either is judged as a claim its keeper suspended would be; a live
    /// owner's is that owner's to handle, and not counted.
    pub auto_suspended: usize,
}

/// Renews the Lease in the background until dropped.
pub struct LeaseRenewal(tokio::task::JoinHandle<()>);

impl Drop for LeaseRenewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lease_alive(lease: &Lease, now: k8s_openapi::jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let (Some(MicroTime(renewed)), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds)
    else {
        return false;
    };
    renewed
        .checked_add(SignedDuration::from_secs(i64::from(secs)))
        .is_ok_and(|end| end > now)
}

impl Cluster {
    fn lease_object(&self) -> Lease {
        let now = MicroTime(wall_clock());
        Lease {
            metadata: ObjectMeta {
                name: Some(names::lease_name(&self.config.owner)),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_string(), MANAGER.to_string()),
                    (OWNER.to_string(), self.config.owner.clone()),
                ])),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.owner.clone()),
                lease_duration_seconds: Some(
                    self.config.lease_duration_secs.min(i32::MAX as u64) as i32
                ),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        }
    }

    /// Creates this owner's Lease, or renews it when it exists (a restart of the same owner).
    pub async fn acquire_lease(&self) -> Result<(), K8sError> {
        let lease = self.lease_object();
        let what = format!("lease {}", lease.name_any());
        // 409 here means the Lease exists (a restart of this owner): renew it rather than
        // retrying the create until the deadline.
        let created = self
            .retry
            .run(|| async {
                match self.leases().create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) => match err(e, calls::CREATE_LEASE, &what) {
                        K8sError::Conflict { .. } => Ok(false),
                        other => Err(other),
                    },
                }
            })
            .await?;
        if created {
            Ok(())
        } else {
            self.renew_lease().await
        }
    }

    /// Sets the Lease's `renewTime` to now: a fresh read and a replace with its
    /// resourceVersion, again on 409; the Lease is created when it is gone.
    pub async fn renew_lease(&self) -> Result<(), K8sError> {
        let name = names::lease_name(&self.config.owner);
        let what = format!("lease {name}");
        self.retry
            .run(|| async {
                let current = self
                    .leases()
                    .get_opt(&name)
                    .await
                    .map_err(|e| err(e, calls::GET_LEASE, &what))?;
                let Some(mut lease) = current else {
                    let fresh = self.lease_object();
                    return self
                        .leases()
                        .create(&PostParams::default(), &fresh)
                        .await
                        .map(|_| ())
                        .map_err(|e| err(e, calls::CREATE_LEASE, &what));
                };
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.renew_time = Some(MicroTime(wall_clock()));
                spec.holder_identity = Some(self.config.owner.clone());
                spec.lease_duration_seconds =
                    Some(self.config.lease_duration_secs.min(i32::MAX as u64) as i32);
                self.leases()
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
                    .map_err(|e| err(e, calls::UPDATE_LEASE, &what))
            })
            .await
    }

    /// Renews the Lease every third of its duration until the returned guard is dropped.
    pub fn spawn_lease_renewal(&self) -> LeaseRenewal {
        let me = self.clone();
        let every = std::time::Duration::from_secs(self.config.lease_duration_secs.max(3) / 3);
        LeaseRenewal(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = me.renew_lease().await {
                    tracing::warn!(error = %e, "renewing the owner lease failed");
                }
            }
        }))
    }

    /// Deletes this owner's Lease (at close, after its objects).
    pub async fn release_lease(&self) -> Result<(), K8sError> {
        let name = names::lease_name(&self.config.owner);
        self.delete_lease(&name).await.map(|_| ())
    }

    async fn delete_lease(&self, name: &str) -> Result<bool, K8sError> {
        let what = format!("lease {name}");
        match self
            .retry
            .run(|| async {
                self.leases()
                    .delete(name, &DeleteParams::background())
                    .await
                    .map_err(|e| err(e, calls::DELETE_LEASE, &what))
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn list_claims(
        &self,
        selector: &str,
    ) -> Result<Vec<crate::crd::SandboxClaim>, K8sError> {
        let lp = ListParams::default().labels(selector);
        self.retry
            .run(|| async {
                self.claims()
                    .list(&lp)
                    .await
                    .map(|l| l.items)
                    .map_err(|e| err(e, calls::LIST_CLAIMS, "claims"))
            })
            .await
    }

    pub(crate) async fn list_pods(
        &self,
        selector: &str,
    ) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, K8sError> {
        let lp = ListParams::default().labels(selector);
        self.retry
            .run(|| async {
                self.pods()
                    .list(&lp)
                    .await
                    .map(|l| l.items)
                    .map_err(|e| err(e, calls::LIST_PODS, "pods"))
            })
            .await
    }

    /// Deletes every claim and pod of owners other than this one whose Lease is gone or
    /// expired, then their Leases. Owners with a live Lease are left alone. A cluster without
    /// the claims' CRD (pod mode) answers 404 to their list: no claims. A claim whose Sandbox
    /// the controller suspended is judged by its owner as any other (see the module docs), and
    /// reported: [`SweepReport::auto_suspended`], and a warning naming it.
    pub async fn sweep_orphans(&self) -> Result<SweepReport, K8sError> {
        let sel = names::managed_selector();
        let claims = match self.list_claims(&sel).await {
            Ok(c) => c,
            Err(e) if e.is_gone() => Vec::new(),
            Err(e) => return Err(e),
        };
        let pods = self.list_pods(&sel).await?;
        let leases = self
            .retry
            .run(|| async {
                self.leases()
                    .list(&ListParams::default().labels(&sel))
                    .await
                    .map(|l| l.items)
                    .map_err(|e| err(e, calls::LIST_LEASES, "leases"))
            })
            .await?;
        let now = wall_clock();
        let owner_of = |l: Option<&BTreeMap<String, String>>| l.and_then(|l| l.get(OWNER)).cloned();
        let mut owners: BTreeSet<String> = BTreeSet::new();
        owners.extend(
            claims
                .iter()
                .filter_map(|c| owner_of(c.metadata.labels.as_ref())),
        );
        owners.extend(
            pods.iter()
                .filter_map(|p| owner_of(p.metadata.labels.as_ref())),
        );
        owners.extend(
            leases
                .iter()
                .filter_map(|l| owner_of(l.metadata.labels.as_ref())),
        );
        owners.remove(&self.config.owner);
        let mut report = SweepReport::default();
        for owner in owners {
            let lease = leases
                .iter()
                .find(|l| owner_of(l.metadata.labels.as_ref()).as_deref() == Some(owner.as_str()));
            if lease.is_some_and(|l| lease_alive(l, now)) {
                continue;
            }
            tracing::info!(%owner, "sweeping the objects of an owner whose lease is gone");
            for c in claims
                .iter()
                .filter(|c| owner_of(c.metadata.labels.as_ref()).as_deref() == Some(owner.as_str()))
            {
                // Read before the deletion, which takes the Sandbox with the claim.
                let paused = self.paused_by_controller(c).await;
                let claim = c.name_any();
                if self.delete_claim(&claim).await? {
                    report.claims += 1;
                }
                if let Some(sandbox) = paused {
                    report.auto_suspended += 1;
                    tracing::warn!(%claim, %sandbox, %owner,
                        "a claim of an owner whose lease is gone, its Sandbox suspended by the controller for inactivity (its pod deleted, not dead); swept with its owner's other objects, as a claim its keeper suspended is");
                }
            }
            for p in pods
                .iter()
                .filter(|p| owner_of(p.metadata.labels.as_ref()).as_deref() == Some(owner.as_str()))
            {
                if self.delete_pod(&p.name_any()).await? {
                    report.pods += 1;
                }
            }
            if let Some(l) = lease {
                if self.delete_lease(&l.name_any()).await? {
                    report.leases += 1;
                }
            }
            report.dead_owners.push(owner);
        }
        let own = self.config.owner.as_str();
        for c in claims
            .iter()
            .filter(|c| owner_of(c.metadata.labels.as_ref()).as_deref() == Some(own))
        {
            if let Some(sandbox) = self.paused_by_controller(c).await {
                report.auto_suspended += 1;
                tracing::warn!(claim = %c.name_any(), %sandbox,
                    "a claim this owner left in an earlier run, its Sandbox suspended by the controller for inactivity (its pod deleted, not dead); kept, as a claim this owner suspended is");
            }
        }
        Ok(report)
    }

    /// The name of the claim's Sandbox when the controller suspended it for inactivity
    /// ([`Suspension::ByController`]). A Sandbox that cannot be read is not taken for one
    /// (with a warning): nothing the sweep does depends on it.
    async fn paused_by_controller(&self, claim: &SandboxClaim) -> Option<String> {
        let name = claim
            .status
            .as_ref()
            .and_then(|s| s.sandbox.as_ref())
            .map(|s| s.name.clone())
            .filter(|n| !n.is_empty())?;
        match self.sandbox_opt(&name).await {
            Ok(Some(sb)) if sb.suspension() == Suspension::ByController => Some(name),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, claim = %claim.name_any(), sandbox = %name,
                    "the sweep could not read a claim's Sandbox to tell whether the controller suspended it");
                None
            }
        }
    }

    /// How many pods labelled with this owner exist now and are not being deleted. A pod that
    /// was deleted stays `Terminating` for up to its grace period and then goes by itself (the
    /// kubelet's doing, on a real cluster as on the loopback), so it is not counted.
    pub async fn owned_pods(&self) -> Result<usize, K8sError> {
        let sel = names::owner_selector(&self.config.owner);
        Ok(self
            .list_pods(&sel)
            .await?
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count())
    }

    /// How many claims labelled with this owner exist now, and how many of them are
    /// suspended (their Sandbox's `operatingMode` is `Suspended`). None in pod mode on a
    /// cluster without agent-sandbox.
    pub async fn owned_claims(&self) -> Result<(usize, usize), K8sError> {
        let sel = names::owner_selector(&self.config.owner);
        let claims = match self.list_claims(&sel).await {
            Ok(c) => c,
            Err(e) if e.is_gone() => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        let mut suspended = 0;
        for c in &claims {
            let Some(sb) = c.status.as_ref().and_then(|s| s.sandbox.as_ref()) else {
                continue;
            };
            let found = self.sandbox_opt(&sb.name).await?;
            let mode = found.and_then(|s| s.spec.operating_mode);
            suspended += usize::from(mode.as_deref() == Some("Suspended"));
        }
        Ok((claims.len(), suspended))
    }

    /// Deletes every claim and pod labelled with this owner (at close). Returns how many.
    pub async fn delete_all_owned(&self) -> Result<usize, K8sError> {
        let sel = names::owner_selector(&self.config.owner);
        let mut n = 0;
        match self.list_claims(&sel).await {
            Ok(claims) => {
                for c in claims {
                    n += usize::from(self.delete_claim(&c.name_any()).await?);
                }
            }
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
        for p in self.list_pods(&sel).await? {
            n += usize::from(self.delete_pod(&p.name_any()).await?);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lives_for_its_duration_after_renewal() {
        let now = wall_clock();
        let lease = |renewed: k8s_openapi::jiff::Timestamp| Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(60),
                ..Default::default()
            }),
        };
        assert!(lease_alive(&lease(now), now));
        let old = now.checked_sub(SignedDuration::from_secs(61)).unwrap();
        assert!(!lease_alive(&lease(old), now));
        assert!(!lease_alive(&Lease::default(), now), "no spec: dead");
    }
}
