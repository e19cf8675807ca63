//! agent-sandbox mode: a `SandboxClaim` per sandbox against the configured warm pool.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::cluster::{calls, err, wall_clock, Cluster};
use crate::config::Mode;
use crate::crd::{
    ClaimLifecycle, ClaimState, PodMetadata, SandboxClaim, SandboxClaimSpec, WarmPoolRef,
    POD_NAME_ANNOTATION,
};
use crate::error::K8sError;
use crate::names::{self, OWNER, SANDBOX};
use crate::wait::{wait_for, Step};

impl Cluster {
    /// The claim this instance would create for `sandbox` serving `session_key`: owner and
    /// session labels on the claim and (through `additionalPodMetadata`) on its pod, and a
    /// `shutdownTime` backstop `maxLifetimeSecs` from now with policy `Delete`.
    pub fn claim_for(&self, sandbox: u64, session_key: &str) -> Result<SandboxClaim, K8sError> {
        let Mode::AgentSandbox { warm_pool } = &self.config.mode else {
            return Err(K8sError::Invalid {
                code: 0,
                reason: "WrongMode".into(),
                message: "claims are only made in agentSandbox mode".into(),
            });
        };
        let labels = names::labels(&self.config.owner, session_key, sandbox);
        let shutdown = self.claim_shutdown_time();
        Ok(SandboxClaim {
            metadata: ObjectMeta {
                name: Some(names::object_name(&self.config.owner, sandbox)),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: SandboxClaimSpec {
                warm_pool_ref: WarmPoolRef {
                    name: warm_pool.clone(),
                },
                lifecycle: Some(ClaimLifecycle {
                    shutdown_time: Some(shutdown),
                    shutdown_policy: Some("Delete".into()),
                    ttl_seconds_after_finished: None,
                }),
                additional_pod_metadata: Some(PodMetadata {
                    labels: names::pod_labels(&self.config.owner, session_key, sandbox),
                    annotations: Default::default(),
                }),
            },
            status: None,
        })
    }

    /// A claim's `shutdownTime` backstop: `maxLifetimeSecs` from now (RFC 3339, whole seconds).
    pub(crate) fn claim_shutdown_time(&self) -> String {
        let shutdown = wall_clock()
            .checked_add(SignedDuration::from_secs(
                self.config.max_lifetime_secs as i64,
            ))
            .unwrap_or_else(|_| wall_clock());
        k8s_openapi::jiff::Timestamp::from_second(shutdown.as_second())
            .unwrap_or(shutdown)
            .to_string()
    }

    /// Creates the claim of `sandbox` (idempotent: a claim of this owner and sandbox that is
    /// already there, from an attempt whose answer was lost, is adopted). Returns its name.
    pub async fn create_claim(&self, sandbox: u64, session_key: &str) -> Result<String, K8sError> {
        let claim = self.claim_for(sandbox, session_key)?;
        let name = claim.metadata.name.clone().unwrap_or_default();
        let what = format!("claim {name}");
        self.create_owned(
            self.claims(),
            &claim,
            sandbox,
            (calls::CREATE_CLAIM, calls::GET_CLAIM),
            &what,
        )
        .await?;
        Ok(name)
    }

    pub(crate) fn is_ours(
        &self,
        labels: Option<&std::collections::BTreeMap<String, String>>,
        sandbox: u64,
    ) -> bool {
        labels.is_some_and(|l| {
            l.get(OWNER).map(String::as_str) == Some(self.config.owner.as_str())
                && l.get(SANDBOX) == Some(&sandbox.to_string())
        })
    }

    /// Waits until the claim is Ready with a sandbox name (returned), failing fast on a terminal
    /// reason ([`TERMINAL_REASONS`](crate::crd::TERMINAL_REASONS): `InvalidMetadata`,
    /// `ClaimExpired`, ...), a deleted claim, or the ready timeout, whose error names the
    /// claim's last `Ready=False` reason (a `WarmPoolNotFound` that never resolved, say).
    pub async fn wait_claim_ready(&self, claim: &str) -> Result<String, K8sError> {
        wait_for(
            self.claims(),
            claim,
            &format!("claim {claim}"),
            self.config.ready_timeout(),
            calls::WATCH_CLAIMS,
            self.retry,
            |c: &SandboxClaim| match c.state() {
                ClaimState::Ready { sandbox } => Step::Done(sandbox),
                ClaimState::Failed { reason, message } => Step::Fail(K8sError::Terminal {
                    claim: claim.to_string(),
                    reason,
                    message,
                }),
                ClaimState::Pending => match c.ready_condition() {
                    Some(r) if r.status == "False" && !r.reason.is_empty() => {
                        Step::Waiting(format!("Ready=False {}: {}", r.reason, r.message))
                    }
                    _ => Step::Wait,
                },
            },
        )
        .await
    }

    /// The pod of a Sandbox: its `agents.x-k8s.io/pod-name` annotation, else its own name;
    /// checked to exist and run. Returns its name and UID.
    pub async fn find_pod(&self, sandbox_name: &str) -> Result<(String, String), K8sError> {
        let sb = self.sandbox(sandbox_name).await?;
        let pod = sb
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_NAME_ANNOTATION))
            .cloned()
            .unwrap_or_else(|| sandbox_name.to_string());
        let uid = self.check_pod_alive(&pod).await?;
        Ok((pod, uid))
    }

    /// Deletes a claim (its Sandbox and Pod follow by garbage collection). `Ok(false)` when it
    /// was already gone.
    pub async fn delete_claim(&self, claim: &str) -> Result<bool, K8sError> {
        let what = format!("claim {claim}");
        let r = self
            .retry
            .run(|| async {
                self.claims()
                    .delete(claim, &DeleteParams::background())
                    .await
                    .map_err(|e| err(e, calls::DELETE_CLAIM, &what))
            })
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.is_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets `Sandbox.spec.operatingMode` (`Suspended` deletes the pod and keeps the Sandbox,
    /// its volumes and Service; `Running` brings a pod back).
    pub async fn set_operating_mode(
        &self,
        sandbox_name: &str,
        suspended: bool,
    ) -> Result<(), K8sError> {
        let mode = if suspended { "Suspended" } else { "Running" };
        self.patch_sandbox(sandbox_name, json!({"spec": {"operatingMode": mode}}))
            .await
    }

    /// Merge-patches the Sandbox `sandbox_name`, retrying what is worth a retry.
    pub(crate) async fn patch_sandbox(
        &self,
        sandbox_name: &str,
        patch: serde_json::Value,
    ) -> Result<(), K8sError> {
        let what = format!("sandbox {sandbox_name}");
        self.retry
            .run(|| async {
                self.sandboxes()
                    .patch(sandbox_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(|e| err(e, calls::PATCH_SANDBOX, &what))
            })
            .await
    }
}
