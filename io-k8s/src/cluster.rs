//! [`Cluster`]: a `kube::Client` bound to one namespace and one owner instance, with the typed
//! APIs every operation uses.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use crate::config::{ConfigError, K8sConfig};
use crate::crd::{Sandbox, SandboxClaim};
use crate::error::Call;
use crate::retry::RetryPolicy;

/// RBAC calls the operations make (the deploy/rbac.yaml Role must grant every one).
pub mod calls {
    use crate::error::Call;

    /// Create a claim.
    pub const CREATE_CLAIM: Call = Call::new("create", "sandboxclaims.extensions.agents.x-k8s.io");
    /// Read a claim.
    pub const GET_CLAIM: Call = Call::new("get", "sandboxclaims.extensions.agents.x-k8s.io");
    /// List claims.
    pub const LIST_CLAIMS: Call = Call::new("list", "sandboxclaims.extensions.agents.x-k8s.io");
    /// Watch claims.
    pub const WATCH_CLAIMS: Call = Call::new("watch", "sandboxclaims.extensions.agents.x-k8s.io");
    /// Patch a claim (on resume: the sandbox label and a later `shutdownTime`; in fleet mode,
    /// the newest fencing token it has seen).
    pub const PATCH_CLAIM: Call = Call::new("patch", "sandboxclaims.extensions.agents.x-k8s.io");
    /// Delete a claim.
    pub const DELETE_CLAIM: Call = Call::new("delete", "sandboxclaims.extensions.agents.x-k8s.io");
    /// Read a sandbox.
    pub const GET_SANDBOX: Call = Call::new("get", "sandboxes.agents.x-k8s.io");
    /// List sandboxes (the watch of a suspension or resume lists first).
    pub const LIST_SANDBOXES: Call = Call::new("list", "sandboxes.agents.x-k8s.io");
    /// Watch sandboxes (until suspended, or Ready again).
    pub const WATCH_SANDBOXES: Call = Call::new("watch", "sandboxes.agents.x-k8s.io");
    /// Patch a sandbox (operatingMode).
    pub const PATCH_SANDBOX: Call = Call::new("patch", "sandboxes.agents.x-k8s.io");
    /// Read the warm pool (at connect: it exists, and names its template).
    pub const GET_WARM_POOL: Call = Call::new("get", "sandboxwarmpools.extensions.agents.x-k8s.io");
    /// Read the warm pool's template (at connect: its pod's containers).
    pub const GET_TEMPLATE: Call = Call::new("get", "sandboxtemplates.extensions.agents.x-k8s.io");
    /// Create a pod.
    pub const CREATE_POD: Call = Call::new("create", "pods");
    /// Read a pod.
    pub const GET_POD: Call = Call::new("get", "pods");
    /// List pods.
    pub const LIST_PODS: Call = Call::new("list", "pods");
    /// Watch pods.
    pub const WATCH_PODS: Call = Call::new("watch", "pods");
    /// Patch a pod (fleet mode, pod mode: the newest fencing token it has seen).
    pub const PATCH_POD: Call = Call::new("patch", "pods");
    /// Delete a pod.
    pub const DELETE_POD: Call = Call::new("delete", "pods");
    /// Exec into a pod (websocket exec: a GET, authorised as `create` on newer clusters).
    pub const EXEC: Call = Call::new("create", "pods/exec");
    /// Create a lease.
    pub const CREATE_LEASE: Call = Call::new("create", "leases.coordination.k8s.io");
    /// Read a lease.
    pub const GET_LEASE: Call = Call::new("get", "leases.coordination.k8s.io");
    /// List leases.
    pub const LIST_LEASES: Call = Call::new("list", "leases.coordination.k8s.io");
    /// Replace a lease (renewal).
    pub const UPDATE_LEASE: Call = Call::new("update", "leases.coordination.k8s.io");
    /// Delete a lease.
    pub const DELETE_LEASE: Call = Call::new("delete", "leases.coordination.k8s.io");

    /// Every call, for the RBAC coverage check.
    pub const ALL: &[Call] = &[
        CREATE_CLAIM,
        GET_CLAIM,
        LIST_CLAIMS,
        WATCH_CLAIMS,
        PATCH_CLAIM,
        DELETE_CLAIM,
        GET_SANDBOX,
        LIST_SANDBOXES,
        WATCH_SANDBOXES,
        PATCH_SANDBOX,
        GET_WARM_POOL,
        GET_TEMPLATE,
        CREATE_POD,
        GET_POD,
        LIST_PODS,
        WATCH_PODS,
        PATCH_POD,
        DELETE_POD,
        EXEC,
        Call::new("get", "pods/exec"),
        CREATE_LEASE,
        GET_LEASE,
        LIST_LEASES,
        UPDATE_LEASE,
        DELETE_LEASE,
    ];
}

/// A client bound to a namespace and an owner instance.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) client: Client,
    pub(crate) config: K8sConfig,
    pub(crate) retry: RetryPolicy,
}

impl Cluster {
    /// A client for sandkeeper from a kube `Config`: kube's own retry layer (up to 15 retries
    /// of 429/503/504, honouring `Retry-After`) is turned off, so that retries happen here,
    /// under [`K8sConfig::api_deadline_secs`], with the errors classified.
    pub fn make_client(mut config: kube::Config) -> Result<Client, kube::Error> {
        config.default_retry = false;
        Client::try_from(config)
    }

    /// Binds `client` to a validated configuration. Build the client with [`Cluster::make_client`]
    /// (kube's default retry layer would otherwise retry on its own, outside the deadline).
    pub fn new(client: Client, config: K8sConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let retry = RetryPolicy::new(
            config.api_deadline(),
            std::time::Duration::from_millis(config.retry_base_millis),
        );
        Ok(Cluster {
            client,
            config,
            retry,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &K8sConfig {
        &self.config
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// This instance's owner name.
    pub fn owner(&self) -> &str {
        &self.config.owner
    }

    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    pub(crate) fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    pub(crate) fn sandboxes(&self) -> Api<Sandbox> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    /// The Sandbox `name`, if there is one, read under the retry policy.
    pub(crate) async fn sandbox_opt(
        &self,
        name: &str,
    ) -> Result<Option<Sandbox>, crate::error::K8sError> {
        let what = format!("sandbox {name}");
        self.retry
            .run(|| async {
                self.sandboxes()
                    .get_opt(name)
                    .await
                    .map_err(|e| err(e, calls::GET_SANDBOX, &what))
            })
            .await
    }

    /// The Sandbox `name`, read under the retry policy (its absence is an error).
    pub(crate) async fn sandbox(&self, name: &str) -> Result<Sandbox, crate::error::K8sError> {
        let what = format!("sandbox {name}");
        self.retry
            .run(|| async {
                self.sandboxes()
                    .get(name)
                    .await
                    .map_err(|e| err(e, calls::GET_SANDBOX, &what))
            })
            .await
    }

    pub(crate) fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }
}

/// The wall clock as a timestamp, for server-side expiry times and lease renewals (these are
/// compared by the API server and other instances, so they must be wall-clock times).
pub(crate) fn wall_clock() -> k8s_openapi::jiff::Timestamp {
    // A driver may read the clock; this one needs wall time for Kubernetes timestamps.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    k8s_openapi::jiff::Timestamp::try_from(now).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// Shorthand used by the operations.
pub(crate) fn err(e: kube::Error, call: Call, what: &str) -> crate::error::K8sError {
    crate::error::classify(e, call, what)
}

impl Cluster {
    /// Creates `object` for `sandbox`, idempotently: on a conflict, a fresh read decides. An
    /// object of this owner and sandbox already there (from an attempt whose answer was lost) is
    /// adopted; one of another owner is fatal; none means the create is retried.
    pub(crate) async fn create_owned<K>(
        &self,
        api: Api<K>,
        object: &K,
        sandbox: u64,
        (create, get): (Call, Call),
        what: &str,
    ) -> Result<(), crate::error::K8sError>
    where
        K: kube::Resource
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        use crate::error::K8sError;
        let name = object.meta().name.clone().unwrap_or_default();
        self.retry
            .run(|| async {
                match api.create(&kube::api::PostParams::default(), object).await {
                    Ok(_) => Ok(()),
                    Err(e) => match err(e, create, what) {
                        K8sError::Conflict { message, .. } => {
                            let existing =
                                api.get_opt(&name).await.map_err(|e| err(e, get, what))?;
                            match existing {
                                Some(o) if self.is_ours(o.meta().labels.as_ref(), sandbox) => {
                                    Ok(())
                                }
                                Some(_) => Err(K8sError::Invalid {
                                    code: 409,
                                    reason: "AlreadyExists".into(),
                                    message: format!("{what} exists and belongs to another owner"),
                                }),
                                None => Err(K8sError::Conflict {
                                    what: what.to_string(),
                                    message,
                                }),
                            }
                        }
                        other => Err(other),
                    },
                }
            })
            .await
    }
}
