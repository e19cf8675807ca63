//! Fleet mode: taking over a sandbox another process handed over (or left when it crashed). The
//! sandbox is found by its number (the `.../sandbox` label every object of it carries), its
//! token admitted (`fence.rs`), its objects relabelled with this owner (so this owner's death
//! watch sees them, and its close or an owner-Lease sweep treats them as its own), and checked
//! up: its claim Ready with a running pod, or its pod running. A sandbox that is not there, or
//! not up, is `Gone`: the core then starts the key afresh. A claim whose Sandbox is suspended
//! (its owner suspended it and crashed before the key's record said so, or the controller
//! suspended it for inactivity, `operatingMode` still `Running`: [`Suspension::ByController`])
//! is set running again under the same number (`Cluster::run_again`: a suspension by the
//! controller is taken over by mode first), its retention backstop pushed out, and then
//! adopted as up, on the same volumes: a pause of the controller's is never read as a death.
//!
//! The new owner label goes on the claim (and its `additionalPodMetadata`), then on the
//! Sandbox's pod template, then on the pod: the controllers set a pod's labels back to its
//! Sandbox's template and the template's back to the claim's, so each is patched after what it
//! follows, and controllers working from current objects never set the pod back to the last
//! owner (which takes it out of this owner's death watch). A controller pass from a stale cache
//! may still set it back for one pass; the death watch tells that from a death
//! ([`crate::deaths`]). Both were false deaths found by `io-k8s/tests/fleet_harness.rs`.
//!
//! The real controller, by its source (`updatePodMetadata`), copies the Sandbox's pod-template
//! labels onto the pod, so the template patched first keeps the new owner on the pod; that a
//! real install keeps it is checked by the ignored `real_cluster.rs`
//! `a_handed_over_claim_is_adopted_on_a_real_cluster`, which has not been run on one here.

use kube::api::{Patch, PatchParams};
use kube::ResourceExt;
use sandkeeper::Token;
use serde_json::json;

use crate::cluster::{calls, err, Cluster};
use crate::config::Mode;
use crate::crd::{Suspension, POD_NAME_ANNOTATION};
use crate::error::K8sError;
use crate::names::{OWNER, SANDBOX};
use crate::sandbox::SandboxHandle;

impl Cluster {
    /// Takes over sandbox `sandbox` under `token` (see the module docs).
    pub(crate) async fn adopt_sandbox(
        &self,
        sandbox: u64,
        token: Token,
    ) -> Result<SandboxHandle, K8sError> {
        let selector = format!("{SANDBOX}={sandbox}");
        let gone = |why: &str| K8sError::Gone {
            what: format!("sandbox {sandbox}"),
            message: why.to_string(),
        };
        let owner = json!({ OWNER: self.config.owner });
        match &self.config.mode {
            Mode::AgentSandbox { .. } => {
                let claims = self.list_claims(&selector).await?;
                let [claim] = claims.as_slice() else {
                    return Err(gone(&format!("{} claims carry its label", claims.len())));
                };
                let suspended = match claim.status.as_ref().and_then(|s| s.sandbox.as_ref()) {
                    Some(sb) if !sb.name.is_empty() => self
                        .suspended_pod(&sb.name)
                        .await?
                        .map(|pod| (sb.name.clone(), pod)),
                    _ => None,
                };
                let claim = claim.name_any();
                self.admit(&claim, Some(token)).await?;
                if let Some((_, pod)) = &suspended {
                    // Its suspension's pod goes first, still labelled with the last owner:
                    // were it relabelled while it terminates (the controllers carry the new
                    // owner from the claim to the pod), this owner's death watch would see
                    // it go and report the sandbox just adopted as dead.
                    self.wait_pod_gone(pod, self.config.ready_timeout()).await?;
                }
                let mut patch = json!({
                    "metadata": {"labels": owner},
                    "spec": {"additionalPodMetadata": {"labels": owner}},
                });
                if suspended.is_some() {
                    // Its owner suspended it and crashed before the key's record said so: the
                    // record still names the sandbox. It runs again, under the same number;
                    // the retention backstop its suspension set is pushed out first.
                    patch["spec"]["lifecycle"] =
                        json!({"shutdownTime": self.claim_shutdown_time()});
                }
                self.merge_patch_claim(&claim, &patch).await?;
                if let Some((sb, _)) = &suspended {
                    tracing::warn!(sandbox, %claim,
                        "adopting a sandbox its crashed owner had suspended: it runs again");
                    self.run_again(sb).await?;
                }
                let sandbox_name = self.wait_claim_ready(&claim).await?;
                // The Sandbox's pod template before the pod: the Sandbox sets a pod label
                // patched against its template back, and the claim controller may not have
                // carried the claim's new `additionalPodMetadata` to the template yet. A pod
                // set back to the last owner leaves this owner's death watch (its selector):
                // a false death of the sandbox just adopted.
                self.label_pod_template_with(&sandbox_name, owner.clone())
                    .await?;
                let (pod, pod_uid) = self.find_pod(&sandbox_name).await?;
                self.patch_pod_labels(&pod, &owner).await?;
                self.raise_pod_token(&pod, token).await?;
                Ok(SandboxHandle {
                    sandbox,
                    object: claim,
                    sandbox_name: Some(sandbox_name),
                    pod,
                    pod_uid,
                })
            }
            Mode::Pod { .. } => {
                let pods = self.list_pods(&selector).await?;
                let [pod] = pods.as_slice() else {
                    return Err(gone(&format!("{} pods carry its label", pods.len())));
                };
                let pod = pod.name_any();
                self.admit(&pod, Some(token)).await?;
                self.patch_pod_labels(&pod, &owner).await?;
                let pod_uid = self.check_pod_alive(&pod).await?;
                self.raise_pod_token(&pod, token).await?;
                Ok(SandboxHandle {
                    sandbox,
                    object: pod.clone(),
                    sandbox_name: None,
                    pod,
                    pod_uid,
                })
            }
        }
    }

    /// When a Sandbox is suspended (`spec.operatingMode: Suspended`, or by the controller for
    /// inactivity: [`Suspension`]), the name of its pod (which may still be terminating, or
    /// gone).
    async fn suspended_pod(&self, sandbox_name: &str) -> Result<Option<String>, K8sError> {
        let sb = self.sandbox_opt(sandbox_name).await?;
        Ok(sb
            .filter(|sb| sb.suspension() != Suspension::None)
            .map(|sb| {
                sb.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(POD_NAME_ANNOTATION))
                    .cloned()
                    .unwrap_or_else(|| sandbox_name.to_string())
            }))
    }

    async fn patch_pod_labels(
        &self,
        pod: &str,
        labels: &serde_json::Value,
    ) -> Result<(), K8sError> {
        let what = format!("pod {pod}");
        let patch = json!({"metadata": {"labels": labels}});
        self.retry
            .run(|| async {
                self.pods()
                    .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(|e| err(e, calls::PATCH_POD, &what))
            })
            .await
    }
}
