//! Typed structs for the agent-sandbox API (kubernetes-sigs/agent-sandbox, `v1beta1`), the
//! fields io-k8s reads and writes. Unknown fields are ignored on read, so newer controllers do
//! not break the client.
//!
//! - `extensions.agents.x-k8s.io/v1beta1` [`SandboxClaim`]: a request for a sandbox from a warm
//!   pool. It owns its [`Sandbox`], which owns its Pod: deleting the claim deletes all three.
//! - `agents.x-k8s.io/v1beta1` [`Sandbox`]: one pod with a stable identity; `operatingMode:
//!   Suspended` deletes the pod and keeps the rest, and so does the controller by itself after
//!   `spec.autoSuspension.inactivityTimeoutSeconds` of inactivity where auto-suspension is on
//!   ([`Suspension`]).

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Annotation on a Sandbox naming its pod when it was adopted from a warm pool.
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";

/// Condition type that says a claim or sandbox is usable.
pub const READY: &str = "Ready";

/// Reasons of a `Ready=False` condition after which the claim will never become ready
/// (agent-sandbox v0.5.6, `extensions/controllers/sandboxclaim_controller.go`,
/// `computeReadyCondition`: the reasons whose errors the controller suppresses without a
/// requeue, the expiries, and the Sandbox's pod ending, which the claim forwards).
///
/// `WarmPoolNotFound` and `TemplateNotFound` are not among them: the controller requeues those
/// claims every minute, and a pool's creation wakes the claims waiting on it at once, so a pool
/// created a moment after the claim (or a cache that lags) still gives a sandbox; a start waits
/// for them within its deadline and its timeout names the reason.
pub const TERMINAL_REASONS: &[&str] = &[
    "InvalidMetadata",
    "EnvVarsInjectionRejected",
    "VolumeClaimTemplatesError",
    "ClaimExpired",
    "SandboxExpired",
    "PodFailed",
    "PodSucceeded",
];

/// A Kubernetes condition (`metav1.Condition`), as far as io-k8s reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
}

/// Names the warm pool a claim takes its sandbox from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct WarmPoolRef {
    /// Name of the `SandboxWarmPool` in the claim's namespace.
    pub name: String,
}

/// When and how a claim ends on its own (the server-side expiry backstop).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    /// RFC 3339 time after which the controller ends the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    /// `Delete`, `DeleteForeground` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    /// Seconds to keep a finished claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i64>,
}

/// Labels and annotations the controller adds to the claim's pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodMetadata {
    /// Extra pod labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Spec of a [`SandboxClaim`].
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    namespaced,
    status = "SandboxClaimStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// The warm pool to take a sandbox from.
    pub warm_pool_ref: WarmPoolRef,
    /// Expiry backstop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    /// Extra pod metadata (io-k8s puts its owner and session labels here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
}

/// The sandbox a claim got.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    /// Name of the `Sandbox`.
    #[serde(default)]
    pub name: String,
    /// Its pod IPs. The JSON name is `podIPs` (the Go field `PodIPs`), which `camelCase` would
    /// spell `podIps`.
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
}

/// Status of a [`SandboxClaim`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    /// Conditions; `Ready` is authoritative.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The sandbox, once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

/// Spec of a [`Sandbox`] (the fields io-k8s touches; the pod template is passed through).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    namespaced,
    status = "SandboxStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// `Running` or `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
    /// RFC 3339 expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    /// The pod template, untyped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<serde_json::Value>,
    /// Auto-suspension (upstream pull request 1296, behind the controller flag
    /// `--enable-auto-suspend-and-resume`): the controller suspends the Sandbox by itself
    /// after this much inactivity, leaving `operatingMode` as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_suspension: Option<AutoSuspension>,
}

/// `Sandbox.spec.autoSuspension`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoSuspension {
    /// Seconds without activity (`status.lastActivityTime`) after which the controller
    /// suspends the Sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactivity_timeout_seconds: Option<i64>,
}

/// `Ready=False` reason of a Sandbox suspended by its `operatingMode`, from controllers
/// before auto-suspension (agent-sandbox v0.5.x).
pub const SUSPENDED_REASON: &str = "SandboxSuspended";

/// `Ready=False` reason of a Sandbox suspended by its `operatingMode`, from controllers with
/// auto-suspension (upstream pull request 1296 renames [`SUSPENDED_REASON`] to this).
pub const USER_SUSPENDED_REASON: &str = "SandboxUserSuspended";

/// `Ready=False` reason of a Sandbox the controller suspended for inactivity
/// (`spec.autoSuspension`), its `operatingMode` still `Running`.
pub const AUTO_SUSPENDED_REASON: &str = "SandboxAutoSuspended";

/// Who, if anyone, has a Sandbox suspended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suspension {
    /// It is meant to run (its pod may still be on its way, or lost and being made again).
    None,
    /// `spec.operatingMode: Suspended`: a keeper (or a user) suspended it.
    ByMode,
    /// The controller suspended it for inactivity (`spec.autoSuspension`): `operatingMode`
    /// is still `Running`, the `Ready` condition says `SandboxAutoSuspended`. Its workspace is
    /// kept as for any suspension; only activity (`status.lastActivityTime`) or a suspension
    /// by mode followed by `Running` brings it back.
    ByController,
}

impl Sandbox {
    /// Its `Ready` condition, if the controller wrote one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
    }

    /// Who has it suspended: its `operatingMode` first (it overrides auto-suspension), then the
    /// controller's `Ready` reason.
    pub fn suspension(&self) -> Suspension {
        if self.spec.operating_mode.as_deref() == Some("Suspended") {
            return Suspension::ByMode;
        }
        match self.ready_condition() {
            Some(c) if c.status == "False" && c.reason == AUTO_SUSPENDED_REASON => {
                Suspension::ByController
            }
            _ => Suspension::None,
        }
    }
}

/// Status of a [`Sandbox`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// Conditions; `Ready` is authoritative.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Pod IPs (JSON `podIPs`, as [`ClaimedSandbox::pod_ips`]).
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
    /// The last activity the controller counts for auto-suspension (RFC 3339); only kept
    /// where auto-suspension is on. A keeper's execs are not activity to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_time: Option<String>,
}

/// Names a `SandboxTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateRef {
    /// Name of the `SandboxTemplate` in the same namespace.
    pub name: String,
}

/// Spec of a [`SandboxWarmPool`] (read at connect: which template its sandboxes come from).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// The template of the pool's sandboxes (a v1beta1 claim reaches its template only
    /// through its pool).
    pub sandbox_template_ref: TemplateRef,
}

/// Spec of a [`SandboxTemplate`] (read at connect: the pod its sandboxes run).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// The pod template (`metadata`, `spec`), untyped.
    #[serde(default)]
    pub pod_template: serde_json::Value,
    /// Persistent volumes made per sandbox and kept while it is suspended, untyped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<serde_json::Value>,
}

/// What a claim's status says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// `status.sandbox.name` is set and `Ready=True`.
    Ready {
        /// The bound Sandbox.
        sandbox: String,
    },
    /// `Ready=False` with a reason after which it never becomes ready.
    Failed {
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// Still on its way.
    Pending,
}

impl SandboxClaim {
    /// Its `Ready` condition, if the controller wrote one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
    }

    /// Reads the claim's state from its status.
    pub fn state(&self) -> ClaimState {
        let Some(status) = &self.status else {
            return ClaimState::Pending;
        };
        let ready = status.conditions.iter().find(|c| c.type_ == READY);
        match (ready, &status.sandbox) {
            (Some(c), Some(sb)) if c.status == "True" && !sb.name.is_empty() => ClaimState::Ready {
                sandbox: sb.name.clone(),
            },
            (Some(c), _)
                if c.status == "False" && TERMINAL_REASONS.contains(&c.reason.as_str()) =>
            {
                ClaimState::Failed {
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                }
            }
            _ => ClaimState::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Bug F of issue 12: the controller writes `podIPs`; read as `podIps` the list was always
    /// empty.
    #[test]
    fn pod_ips_are_read_under_the_controllers_json_name() {
        let c: SandboxClaim = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": "c"}, "spec": {"warmPoolRef": {"name": "p"}},
            "status": {"sandbox": {"name": "sb", "podIPs": ["10.0.0.7"]}}
        }))
        .unwrap();
        let sandbox = c.status.unwrap().sandbox.unwrap();
        assert_eq!(sandbox.pod_ips, vec!["10.0.0.7".to_string()]);
        let back = serde_json::to_value(&sandbox).unwrap();
        assert_eq!(back["podIPs"], json!(["10.0.0.7"]));
        let s: SandboxStatus =
            serde_json::from_value(json!({"podIPs": ["10.0.0.8"], "conditions": []})).unwrap();
        assert_eq!(s.pod_ips, vec!["10.0.0.8".to_string()]);
    }

    #[test]
    fn claim_state_needs_both_the_sandbox_name_and_ready_true() {
        let mut c: SandboxClaim = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": "c"}, "spec": {"warmPoolRef": {"name": "p"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}]}
        }))
        .unwrap();
        assert_eq!(
            c.state(),
            ClaimState::Pending,
            "Ready without a sandbox name"
        );
        c.status.as_mut().unwrap().sandbox = Some(ClaimedSandbox {
            name: "sb".into(),
            pod_ips: vec![],
        });
        assert_eq!(
            c.state(),
            ClaimState::Ready {
                sandbox: "sb".into()
            }
        );
        c.status.as_mut().unwrap().conditions[0] = Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "InvalidMetadata".into(),
            message: "label domain not allowed".into(),
        };
        assert!(
            matches!(c.state(), ClaimState::Failed { reason, .. } if reason == "InvalidMetadata")
        );
        c.status.as_mut().unwrap().conditions[0].reason = "WarmPoolNotFound".into();
        assert_eq!(
            c.state(),
            ClaimState::Pending,
            "a pool created later still serves the claim"
        );
        c.status.as_mut().unwrap().conditions[0].reason = "DependenciesNotReady".into();
        assert_eq!(
            c.state(),
            ClaimState::Pending,
            "a passing reason is not terminal"
        );
    }
}
