//! The main job on Kubernetes: [`K8sBackend`] as a [`WorkloadTarget`] of the io-tokio
//! workload, and [`run_workload`], which the `harness-k8s` binary runs.
//!
//! - the message bus runs `argv` in the session's pod through `pods/exec` (no shell);
//! - a death from outside is a deletion of the sandbox's pod;
//! - after the keeper closed, no pod of this owner may run and every claim left must be a
//!   suspended one; the final sweep must delete exactly those (every shutdown deleted its
//!   object), and the owner's Lease is released.
//!
//! As one process of a fleet ([`run_fleet_workload`]: `harness-k8s --fleet`) none of that
//! holds: other processes own the users' keys in turn, a sandbox handed over keeps running
//! for its next owner, and the backend's close deletes nothing. After close the process checks
//! what it alone decides ([`WorkloadTarget::after_fleet_close`]): it owns no key any more (its
//! close released each) and its close deleted nothing. What only the whole fleet shows is
//! checked once every process ended, by [`verify_fleet`](crate::verify_fleet).

use std::time::Duration;

use sandkeeper::SandboxId;
use sandkeeper_tokio::workload::{
    self, FleetOptions, Summary, WorkloadError, WorkloadOptions, WorkloadTarget,
};

use crate::backend::K8sBackend;
use crate::cluster::Cluster;
use crate::error::K8sError;
use crate::fleet_store::K8sStore;

impl WorkloadTarget for K8sBackend {
    fn kind(&self) -> &'static str {
        "k8s"
    }

    fn isolation(&self) -> String {
        format!(
            "the pod (container {}), environment cleared by env -i",
            self.install()
                .exec_container
                .clone()
                .or_else(|| self.cluster().config().container.clone())
                .unwrap_or_else(|| "the only one".into())
        )
    }

    async fn kill(&self, sandbox: SandboxId) {
        if let Some(h) = self.handle(sandbox) {
            // Gone already, or a failed delete: either way the workload goes on; the keeper
            // learns of the death (if any) from its watch.
            let _ = self.cluster().delete_pod(&h.pod).await;
        }
    }

    async fn after_close(&self) -> Vec<(bool, String)> {
        let owner = self.cluster().owner().to_string();
        let mut checks = Vec::new();
        // The keeper shut down every sandbox but those it suspended (whatever its policy,
        // which the backend is not told): a suspended sandbox is a claim whose Sandbox is
        // Suspended, without a pod. So nothing may hold a pod, every claim left must be
        // suspended, and the final sweep deletes exactly those.
        match self.cluster().owned_pods().await {
            Ok(n) => checks.push((
                n == 0,
                format!("no pod of owner {owner} runs after close ({n} left)"),
            )),
            Err(e) => checks.push((false, format!("listing pods after close failed: {e}"))),
        }
        let suspended = match self.cluster().owned_claims().await {
            Ok((claims, suspended)) => {
                checks.push((
                    claims == suspended,
                    format!(
                        "every claim of owner {owner} left after close is suspended ({suspended} of {claims})"
                    ),
                ));
                suspended
            }
            Err(e) => {
                checks.push((false, format!("listing claims after close failed: {e}")));
                0
            }
        };
        match self.close().await {
            Ok(n) => checks.push((
                n == suspended,
                if suspended > 0 {
                    format!("the final sweep deleted the {n} suspended claims of owner {owner}")
                } else {
                    format!(
                        "no object of owner {owner} remains after close ({n} deleted by the final sweep)"
                    )
                },
            )),
            Err(e) => checks.push((false, format!("the final sweep failed: {e}"))),
        }
        checks
    }

    async fn after_fleet_close(&self, incarnation: u32) -> Vec<(bool, String)> {
        let mut checks = Vec::new();
        match self.close().await {
            Ok(n) => checks.push((
                n == 0,
                format!("the fleet backend's close deleted nothing ({n} deleted)"),
            )),
            Err(e) => checks.push((false, format!("the fleet backend's close failed: {e}"))),
        }
        // Reads only: the store's lease duration plays no part.
        let store = K8sStore::new(self.cluster().clone(), Duration::ZERO);
        match store.held_by(incarnation).await {
            Ok(keys) => checks.push((
                keys.is_empty(),
                format!(
                    "incarnation {incarnation} owns no key after close: its close released \
                     every key it held ({} still owned: {keys:?})",
                    keys.len()
                ),
            )),
            Err(e) => checks.push((false, format!("reading the fleet's keys failed: {e}"))),
        }
        checks
    }
}

/// Why the workload did not run on the cluster.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Taking the owner's Lease or the start-up sweep failed.
    #[error("connecting to the cluster: {0}")]
    Connect(#[from] K8sError),
    /// The workload could not run.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The fleet's verification could not read the cluster or sweep it.
    #[error("verifying the fleet: {0}")]
    Verify(K8sError),
}

/// Connects a [`K8sBackend`] on `cluster` (takes the owner's Lease, sweeps orphans of dead
/// owners) and runs the harness workload on it (the keeper refuses `--suspend` in pod mode).
/// The summary's last check is the final sweep: nothing of this owner but its suspended
/// claims may be left after close, and the sweep deletes those.
pub async fn run_workload(
    cluster: Cluster,
    options: &WorkloadOptions,
) -> Result<Summary, HarnessError> {
    options.check()?;
    let (backend, _sweep) = K8sBackend::connect(cluster).await?;
    Ok(workload::run(backend, options).await?)
}

/// Runs the harness workload as one process of a fleet on `cluster`'s namespace
/// (`sandkeeper_tokio::workload::run_fleet`): the backend is
/// [`K8sBackend::connect_fleet`], the store [`K8sStore`] with the process lease
/// `fleet.lease_ms`. Its sessions are named after `fleet.replica`; its users are every
/// process's, so several processes running it on one namespace contend for the same keys.
/// The checks are this process's (see the module docs); with `fleet.ledger` it appends every
/// acknowledged session-log version there, for [`verify_fleet`](crate::verify_fleet).
pub async fn run_fleet_workload(
    cluster: Cluster,
    options: &WorkloadOptions,
    fleet: &FleetOptions,
) -> Result<Summary, HarnessError> {
    options.check()?;
    fleet.check()?;
    let backend = K8sBackend::connect_fleet(cluster.clone()).await?;
    let store = K8sStore::new(cluster, fleet.lease());
    Ok(workload::run_fleet(backend, store, options, fleet).await?)
}
