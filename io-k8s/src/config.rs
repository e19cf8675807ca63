//! Configuration of the Kubernetes backend (read from YAML or JSON; see
//! `deploy/sandkeeper-k8s.example.yaml`). `mode` is written as a map with one key
//! (`mode: {agentSandbox: {warmPool: ...}}`); with serde_yaml 0.9, read the YAML into a
//! `serde_json::Value` first (it would expect a `!agentSandbox` tag otherwise).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::container::exec_container;
use crate::names::{check_owner, InvalidOwner};

/// How sandboxes are made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Mode {
    /// agent-sandbox: one `SandboxClaim` per sandbox against a warm pool.
    #[serde(rename_all = "camelCase")]
    AgentSandbox {
        /// Name of the `SandboxWarmPool`.
        warm_pool: String,
    },
    /// A plain `Pod` per sandbox, from a template (for clusters without agent-sandbox).
    #[serde(rename_all = "camelCase")]
    Pod {
        /// The pod template; name, namespace, labels and `activeDeadlineSeconds` are set by
        /// io-k8s.
        template: Box<Pod>,
    },
}

/// Configuration of the backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sConfig {
    /// Namespace of every object.
    pub namespace: String,
    /// This instance's name (see [`crate::names::check_owner`]); labels and its Lease use it.
    pub owner: String,
    /// Claims or pods.
    pub mode: Mode,
    /// Directory inside the container that session files are extracted under
    /// (`<workdir>/<session>/<path>`). Absolute.
    #[serde(default = "default_workdir")]
    pub workdir: String,
    /// Container to exec into. Required when the pod has more than one container: the API
    /// server picks the only container of a pod and refuses an unnamed exec into a pod with
    /// several (kubectl's "first container" is kubectl's own default). Checked against the pod
    /// template in pod mode.
    #[serde(default)]
    pub container: Option<String>,
    /// Server-side expiry backstop: claim `shutdownTime` / pod `activeDeadlineSeconds`.
    #[serde(default = "default_max_lifetime")]
    pub max_lifetime_secs: u64,
    /// How long a start may wait for readiness.
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_secs: u64,
    /// The in-container `timeout` of each command of an upload (extract, rename, clean up); the
    /// client waits [`crate::upload::EXEC_GRACE`] longer for each command's status.
    #[serde(default = "default_upload_timeout")]
    pub upload_timeout_secs: u64,
    /// Largest payload accepted for one upload.
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: u64,
    /// The in-container `timeout` of moving a whole workspace out of a pod or into one
    /// (`tar -c` / `tar -x`: pod mode suspending through a shelf); the client waits
    /// [`crate::upload::EXEC_GRACE`] longer for the command's status.
    #[serde(default = "default_archive_timeout")]
    pub archive_timeout_secs: u64,
    /// Lease duration; renewed every third of it.
    #[serde(default = "default_lease_duration")]
    pub lease_duration_secs: u64,
    /// Budget for retrying one API call on 409/429/5xx.
    #[serde(default = "default_api_deadline")]
    pub api_deadline_secs: u64,
    /// First retry delay (doubles, with jitter, up to 2 s).
    #[serde(default = "default_retry_base")]
    pub retry_base_millis: u64,
}

fn default_workdir() -> String {
    "/workspace".into()
}
fn default_max_lifetime() -> u64 {
    24 * 3600
}
fn default_ready_timeout() -> u64 {
    120
}
fn default_upload_timeout() -> u64 {
    30
}
fn default_max_payload() -> u64 {
    16 << 20
}
fn default_archive_timeout() -> u64 {
    600
}
fn default_lease_duration() -> u64 {
    60
}
fn default_api_deadline() -> u64 {
    30
}
fn default_retry_base() -> u64 {
    100
}

/// A configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Bad owner name.
    #[error(transparent)]
    Owner(#[from] InvalidOwner),
    /// Bad namespace.
    #[error("invalid namespace {0:?}: a DNS-1123 label is required")]
    Namespace(String),
    /// Bad workdir.
    #[error("invalid workdir {0:?}: an absolute path of plain components is required")]
    Workdir(String),
    /// A zero limit.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// A pod template without containers.
    #[error("the pod template has no containers")]
    NoContainers,
    /// The pod template's containers do not fit `container` by the API server's exec rule.
    #[error(
        "the pod template's exec container: {0}; set `container` to the container uploads go to"
    )]
    ExecContainer(String),
    /// Bad warm pool name.
    #[error("invalid warm pool name {0:?}")]
    WarmPool(String),
    /// `ReleasePolicy::Suspend` in pod mode without a shelf: a plain pod keeps nothing once it
    /// is deleted, so every suspended sandbox would either be lost or leak a running pod. The
    /// backend's `check_config` answers the keeper with this message.
    #[error("release policy Suspend needs agentSandbox mode (Sandbox.spec.operatingMode: Suspended) or a shelf (K8sBackend::with_shelf); pod mode cannot keep a sandbox without its pod: use Shutdown or KeepWarm, agentSandbox mode, or give the backend a shelf")]
    SuspendNeedsAgentSandbox,
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl K8sConfig {
    /// A configuration with defaults for everything but the essentials.
    pub fn new(namespace: impl Into<String>, owner: impl Into<String>, mode: Mode) -> Self {
        K8sConfig {
            namespace: namespace.into(),
            owner: owner.into(),
            mode,
            workdir: default_workdir(),
            container: None,
            max_lifetime_secs: default_max_lifetime(),
            ready_timeout_secs: default_ready_timeout(),
            upload_timeout_secs: default_upload_timeout(),
            max_payload_bytes: default_max_payload(),
            archive_timeout_secs: default_archive_timeout(),
            lease_duration_secs: default_lease_duration(),
            api_deadline_secs: default_api_deadline(),
            retry_base_millis: default_retry_base(),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_owner(&self.owner)?;
        if !dns_label(&self.namespace) {
            return Err(ConfigError::Namespace(self.namespace.clone()));
        }
        let wd_ok = self.workdir.starts_with('/')
            && self.workdir[1..].split('/').all(|c| {
                !c.is_empty()
                    && c != "."
                    && c != ".."
                    && !c.starts_with('-')
                    && c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            });
        if !wd_ok {
            return Err(ConfigError::Workdir(self.workdir.clone()));
        }
        for (name, v) in [
            ("maxLifetimeSecs", self.max_lifetime_secs),
            ("readyTimeoutSecs", self.ready_timeout_secs),
            ("uploadTimeoutSecs", self.upload_timeout_secs),
            ("maxPayloadBytes", self.max_payload_bytes),
            ("archiveTimeoutSecs", self.archive_timeout_secs),
            ("leaseDurationSecs", self.lease_duration_secs),
            ("apiDeadlineSecs", self.api_deadline_secs),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        match &self.mode {
            Mode::AgentSandbox { warm_pool } if !dns_label(warm_pool) => {
                Err(ConfigError::WarmPool(warm_pool.clone()))
            }
            Mode::Pod { template } => match template.spec.as_ref() {
                Some(spec) if !spec.containers.is_empty() => {
                    exec_container(spec, "<template>", self.container.as_deref())
                        .map(drop)
                        .map_err(ConfigError::ExecContainer)
                }
                _ => Err(ConfigError::NoContainers),
            },
            _ => Ok(()),
        }
    }

    /// [`K8sConfig::upload_timeout_secs`] as a duration.
    pub fn upload_timeout(&self) -> Duration {
        Duration::from_secs(self.upload_timeout_secs)
    }

    /// [`K8sConfig::ready_timeout_secs`] as a duration.
    pub fn ready_timeout(&self) -> Duration {
        Duration::from_secs(self.ready_timeout_secs)
    }

    /// [`K8sConfig::api_deadline_secs`] as a duration.
    pub fn api_deadline(&self) -> Duration {
        Duration::from_secs(self.api_deadline_secs)
    }
}
