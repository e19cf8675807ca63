//! Starting and ending one sandbox in either mode: the operations a backend's `start` and
//! `shutdown` run.

use crate::cluster::Cluster;
use crate::config::Mode;
use crate::error::K8sError;

/// A started sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHandle {
    /// The core's sandbox number.
    pub sandbox: u64,
    /// The object whose deletion ends it: the claim (agent-sandbox) or the pod (pod mode).
    pub object: String,
    /// The Sandbox the claim got (agent-sandbox mode).
    pub sandbox_name: Option<String>,
    /// The pod files go into.
    pub pod: String,
    /// That pod's UID. Kubernetes never gives two objects the same UID: a resumed claim's pod
    /// has the same name as the pod its suspension removed, never the same UID.
    pub pod_uid: String,
}

impl Cluster {
    /// Creates the sandbox's claim or pod and waits until its pod runs. On failure, what this
    /// start created is deleted again (a start failure releases only what it acquired).
    pub async fn start_sandbox(
        &self,
        sandbox: u64,
        session_key: &str,
    ) -> Result<SandboxHandle, K8sError> {
        match &self.config.mode {
            Mode::AgentSandbox { .. } => {
                let claim = self.create_claim(sandbox, session_key).await?;
                let ready = async {
                    let sandbox_name = self.wait_claim_ready(&claim).await?;
                    let (pod, pod_uid) = self.find_pod(&sandbox_name).await?;
                    Ok::<_, K8sError>((sandbox_name, pod, pod_uid))
                }
                .await;
                match ready {
                    Ok((sandbox_name, pod, pod_uid)) => Ok(SandboxHandle {
                        sandbox,
                        object: claim,
                        sandbox_name: Some(sandbox_name),
                        pod,
                        pod_uid,
                    }),
                    Err(e) => {
                        if let Err(cleanup) = self.delete_claim(&claim).await {
                            tracing::warn!(error = %cleanup, %claim, "deleting the claim of a failed start");
                        }
                        Err(e)
                    }
                }
            }
            Mode::Pod { .. } => {
                let pod = self.create_pod(sandbox, session_key).await?;
                match self.wait_pod_running(&pod).await {
                    Ok(pod_uid) => Ok(SandboxHandle {
                        sandbox,
                        object: pod.clone(),
                        sandbox_name: None,
                        pod,
                        pod_uid,
                    }),
                    Err(e) => {
                        if let Err(cleanup) = self.delete_pod(&pod).await {
                            tracing::warn!(error = %cleanup, %pod, "deleting the pod of a failed start");
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// Ends a sandbox: deletes its claim (the Sandbox and Pod follow) or its pod. An object
    /// already gone is success.
    pub async fn shutdown_sandbox(&self, handle: &SandboxHandle) -> Result<(), K8sError> {
        match &self.config.mode {
            Mode::AgentSandbox { .. } => self.delete_claim(&handle.object).await.map(|_| ()),
            Mode::Pod { .. } => self.delete_pod(&handle.object).await.map(|_| ()),
        }
    }
}
