//! The main job on Kubernetes: [`K8sBackend`] as a [`WorkloadTarget`] of the io-tokio
//! workload, and [`run_workload`], which the `harness-k8s` binary runs.
//!
//! - the message bus runs `argv` in the session's pod through `pods/exec` (no shell);
//! - a death from outside is a deletion of the sandbox's pod;
//! - after the keeper closed, no pod of this owner may run and every claim left must be a
//!   suspended one; the final sweep must delete exactly those (every shutdown deleted its
//!   object), and the owner's Lease is released.

use sandkeeper::SandboxId;
use sandkeeper_tokio::workload::{self, Summary, WorkloadError, WorkloadOptions, WorkloadTarget};

use crate::backend::K8sBackend;
use crate::cluster::Cluster;
use crate::error::K8sError;

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
