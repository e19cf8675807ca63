//! What [`K8sBackend::connect`](crate::K8sBackend::connect) checks of the cluster before it
//! takes anything on, in agent-sandbox mode, so that a cluster that cannot work fails at
//! start-up with the fix named, not at the first call with a bare 404:
//!
//! - the agent-sandbox API is served at `v1beta1` (agent-sandbox v0.5.0 on; v0.4.x serves only
//!   `v1alpha1`, where suspend was `spec.replicas`): one discovery read, `GET /apis`;
//! - the warm pool exists, and the template it names (a `v1beta1` claim reaches its template
//!   only through its pool);
//! - the template's pod takes an exec by the API server's container rule ([`exec_container`]):
//!   with several containers, `container` must name one of them;
//! - whether the working directory is on a volume the template's `volumeClaimTemplates` make
//!   (kept while a Sandbox is suspended): the backend refuses the `Suspend` policy where it is
//!   not, since suspending deletes the pod and every file not on such a volume with it;
//! - the template's pod grace period (`terminationGracePeriodSeconds`, 30 s unless set): a
//!   suspend waits for the pod to go, which takes the whole period when the container ignores
//!   SIGTERM, so the backend refuses `Suspend` when the period would outlast the core's
//!   `command_timeout` or its own `readyTimeoutSecs`.
//!
//! [`Install`] keeps what was learnt for the backend's later decisions.

use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;

use crate::cluster::{calls, err, Cluster};
use crate::config::Mode;
use crate::container::exec_container;
use crate::crd::{SandboxTemplate, SandboxWarmPool};
use crate::error::K8sError;

/// The API version of agent-sandbox this backend speaks.
pub const API_VERSION: &str = "v1beta1";

/// The API groups of agent-sandbox: Sandboxes, and the extensions (claims, pools, templates).
const GROUPS: [&str; 2] = ["agents.x-k8s.io", "extensions.agents.x-k8s.io"];

/// What connect learnt of the install.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Install {
    /// The warm pool's template (agent-sandbox mode).
    pub template: Option<String>,
    /// The container uploads exec into, by the server's rule (agent-sandbox mode).
    pub exec_container: Option<String>,
    /// Whether the working directory outlives the pod: in the exec container it is on (or
    /// under) a mount of a volume the template's `volumeClaimTemplates` make per sandbox, a
    /// PersistentVolumeClaim the controller keeps while the Sandbox is suspended. A container
    /// filesystem or an `emptyDir` goes with the pod, which suspending deletes.
    pub workdir_persistent: bool,
    /// The grace period of the template's pods (`spec.terminationGracePeriodSeconds`, else the
    /// API's default of 30 s): how long a suspend may wait for the pod to go when its
    /// container ignores SIGTERM, as `sleep infinity` as PID 1 does.
    pub termination_grace_secs: i64,
}

/// The API's default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_SECS: i64 = 30;

/// Whether `workdir` in container `container` of `spec` is on a volume named in
/// `claim_volumes`: a mount at `workdir` or at a directory above it.
pub(crate) fn workdir_on_volume(
    spec: &PodSpec,
    container: &str,
    workdir: &str,
    claim_volumes: &[String],
) -> bool {
    let Some(c) = spec.containers.iter().find(|c| c.name == container) else {
        return false;
    };
    c.volume_mounts.iter().flatten().any(|m| {
        let at = m.mount_path.trim_end_matches('/');
        let under = workdir == at || at.is_empty() || workdir.starts_with(&format!("{at}/"));
        under && claim_volumes.contains(&m.name)
    })
}

impl Cluster {
    /// Checks the install for the configured mode (nothing to check in pod mode).
    pub async fn check_install(&self) -> Result<Install, K8sError> {
        let Mode::AgentSandbox { warm_pool } = &self.config.mode else {
            return Ok(Install::default());
        };
        self.check_api_served().await?;
        let ns = &self.config.namespace;
        let pool = self
            .read_opt::<SandboxWarmPool>(warm_pool, calls::GET_WARM_POOL)
            .await?
            .ok_or_else(|| K8sError::Install {
                problem: format!(
                    "the SandboxWarmPool {warm_pool:?} does not exist in namespace {ns:?}"
                ),
                fix: "create it (io-k8s/deploy/warm-pool.example.yaml) or name an existing pool"
                    .into(),
            })?;
        let template_name = pool.spec.sandbox_template_ref.name;
        let template = self
            .read_opt::<SandboxTemplate>(&template_name, calls::GET_TEMPLATE)
            .await?
            .ok_or_else(|| K8sError::Install {
                problem: format!(
                    "the SandboxTemplate {template_name:?} that warm pool {warm_pool:?} names does not exist in namespace {ns:?}"
                ),
                fix: "create the template, or point the pool at an existing one".into(),
            })?;
        let spec: PodSpec = template
            .spec
            .pod_template
            .get("spec")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| K8sError::Install {
                problem: format!(
                    "the SandboxTemplate {template_name:?} has a pod spec that does not parse: {e}"
                ),
                fix: "fix the template's spec.podTemplate.spec".into(),
            })?
            .unwrap_or_default();
        let container = exec_container(
            &spec,
            &format!("<template {template_name}>"),
            self.config.container.as_deref(),
        )
        .map_err(|rule| K8sError::Install {
            problem: format!("uploads exec into the template's pods, and the API server would refuse them: {rule}"),
            fix: "set `container` in the io-k8s config to the container uploads go to".into(),
        })?;
        let claim_volumes: Vec<String> = template
            .spec
            .volume_claim_templates
            .iter()
            .filter_map(|v| v.pointer("/metadata/name")?.as_str().map(str::to_string))
            .collect();
        let workdir_persistent =
            workdir_on_volume(&spec, &container, &self.config.workdir, &claim_volumes);
        Ok(Install {
            template: Some(template_name),
            exec_container: Some(container),
            workdir_persistent,
            termination_grace_secs: spec
                .termination_grace_period_seconds
                .unwrap_or(DEFAULT_TERMINATION_GRACE_SECS),
        })
    }

    /// The object `name` of kind `K` in the namespace, if it exists, read under the retry
    /// policy.
    async fn read_opt<K>(&self, name: &str, call: crate::error::Call) -> Result<Option<K>, K8sError>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let what = format!("{} {name}", K::kind(&K::DynamicType::default()));
        self.retry
            .run(|| async { api.get_opt(name).await.map_err(|e| err(e, call, &what)) })
            .await
    }

    /// Both agent-sandbox groups are served at [`API_VERSION`].
    async fn check_api_served(&self) -> Result<(), K8sError> {
        let groups = self
            .retry
            .run(|| async {
                self.client.list_api_groups().await.map_err(|e| {
                    err(
                        e,
                        crate::error::Call::new("get", "/apis (discovery)"),
                        "API groups",
                    )
                })
            })
            .await?;
        for name in GROUPS {
            let Some(group) = groups.groups.iter().find(|g| g.name == name) else {
                return Err(K8sError::Install {
                    problem: format!("the API server does not serve the API group {name}: agent-sandbox is not installed"),
                    fix: "install agent-sandbox v0.5.0 or later, with its extensions (claims, warm pools, templates)".into(),
                });
            };
            let versions: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
            if !versions.contains(&API_VERSION) {
                return Err(K8sError::Install {
                    problem: format!(
                        "the API server serves {name} only as {versions:?}, not {API_VERSION}"
                    ),
                    fix: "agent-sandbox v0.5.0 or later is required (v0.4.x serves only v1alpha1); upgrade the install".into(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mounts: serde_json::Value) -> PodSpec {
        serde_json::from_value(serde_json::json!({"containers": [
            {"name": "main", "volumeMounts": mounts}, {"name": "side"}
        ]}))
        .unwrap()
    }

    #[test]
    fn the_workdir_is_persistent_only_on_or_under_a_claim_volume_of_the_exec_container() {
        let vols = vec!["workspace".to_string()];
        let at = spec(serde_json::json!([{"name": "workspace", "mountPath": "/workspace"}]));
        assert!(workdir_on_volume(&at, "main", "/workspace", &vols));
        assert!(
            !workdir_on_volume(&at, "side", "/workspace", &vols),
            "another container"
        );
        assert!(
            !workdir_on_volume(&at, "main", "/workspace2", &vols),
            "not a parent"
        );
        let above = spec(serde_json::json!([{"name": "workspace", "mountPath": "/data/"}]));
        assert!(workdir_on_volume(&above, "main", "/data/ws", &vols));
        let scratch = spec(serde_json::json!([{"name": "scratch", "mountPath": "/workspace"}]));
        assert!(
            !workdir_on_volume(&scratch, "main", "/workspace", &vols),
            "an emptyDir"
        );
    }
}
