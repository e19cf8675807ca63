//! The Kubernetes backend by configuration (`--kubernetes FILE`): the backend's settings
//! (`sandkeeper_k8s::K8sConfig`, the YAML of `io-k8s/deploy/sandkeeper-k8s.example.yaml`) and
//! how to reach the API server. The server connects once, at start: the backend takes its
//! owner's Lease and sweeps what dead owners left (`K8sBackend::connect`), and at the end
//! deletes what it still owns and lets the Lease go ([`SandboxBackend::close`]). One replica
//! of several (`--fleet`) connects for a fleet instead (`K8sBackend::connect_fleet`: no owner
//! Lease, and nothing deleted at its end: the fleet's sweep decides).
//!
//! [`SandboxBackend::close`]: crate::backend::SandboxBackend::close

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandkeeper_k8s::{Cluster, K8sBackend, K8sConfig};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotsConfig};

/// How to reach the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiServer {
    /// kube's usual inference: `KUBECONFIG`, `~/.kube/config`, then the in-cluster service
    /// account (a `sandkeeperd` deployed in the cluster needs nothing more).
    Infer,
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// A URL spoken to as it is, without credentials (`kubectl proxy`, a test's API server).
    Url(String),
}

/// The Kubernetes backend a server runs on.
#[derive(Clone, Debug)]
pub struct Kubernetes {
    /// The backend's settings (namespace, owner, claims or pods, ...).
    pub config: K8sConfig,
    /// Where the API server is.
    pub api: ApiServer,
    /// Pod mode's shelf: the object-storage URL (`s3://bucket/prefix`, `gs://`, `az://`,
    /// `file:///dir`) a paused sandbox's workspace is streamed to before its pod is deleted,
    /// and back from into a new pod at its resume (`K8sBackend::with_shelf`). Without it, pod
    /// mode cannot pause. Refused in `agentSandbox` mode, which keeps a paused workspace in its
    /// claim's volume.
    pub snapshots: Option<String>,
}

/// Why the Kubernetes backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    /// The configuration file could not be read or is not a valid configuration.
    #[error("{file}: {why}")]
    Config {
        /// The file.
        file: String,
        /// What was wrong.
        why: String,
    },
    /// No client for the API server.
    #[error("the Kubernetes API server: {0}")]
    Client(String),
    /// The object storage of `--snapshots` could not be opened.
    #[error("--snapshots {0}")]
    Snapshots(String),
    /// The backend did not connect (its install check, its Lease or its sweep failed).
    #[error("the Kubernetes backend: {0}")]
    Connect(String),
}

impl Kubernetes {
    /// Reads the backend's settings from a YAML (or JSON) file, and checks them.
    pub fn load(
        file: &Path,
        api: ApiServer,
        snapshots: Option<String>,
    ) -> Result<Self, KubernetesError> {
        let bad = |why: String| KubernetesError::Config {
            file: file.display().to_string(),
            why,
        };
        let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
        // Through a JSON value: serde_yaml would want a YAML tag for the `mode` enum.
        let value: serde_json::Value =
            serde_yaml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let config: K8sConfig = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        config.validate().map_err(|e| bad(e.to_string()))?;
        Ok(Kubernetes {
            config,
            api,
            snapshots,
        })
    }

    /// Connects the backend: a client for the API server, then `K8sBackend::connect`.
    pub async fn connect(&self) -> Result<K8sBackend, KubernetesError> {
        let client = self.client().await?;
        let cluster = Cluster::new(client, self.config.clone())
            .map_err(|e| KubernetesError::Connect(e.to_string()))?;
        let (backend, report) = K8sBackend::connect(cluster)
            .await
            .map_err(|e| KubernetesError::Connect(e.to_string()))?;
        tracing::info!(?report, namespace = %self.config.namespace, "kubernetes backend connected");
        self.shelved(backend)
    }

    /// Connects the backend as one replica of several on the namespace (`--fleet`): a client
    /// for the API server, then `K8sBackend::connect_fleet` (no owner Lease, no sweep by
    /// owner: the fleet store's process leases say who lives, and its sweep decides). Its
    /// cluster is the fleet store's and the sandbox table's too.
    pub async fn connect_fleet(&self) -> Result<K8sBackend, KubernetesError> {
        let client = self.client().await?;
        let cluster = Cluster::new(client, self.config.clone())
            .map_err(|e| KubernetesError::Connect(e.to_string()))?;
        let backend = K8sBackend::connect_fleet(cluster)
            .await
            .map_err(|e| KubernetesError::Connect(e.to_string()))?;
        tracing::info!(namespace = %self.config.namespace, owner = %self.config.owner, "kubernetes backend connected as a replica");
        self.shelved(backend)
    }

    /// `backend`, with the shelf of `--snapshots` if any.
    fn shelved(&self, backend: K8sBackend) -> Result<K8sBackend, KubernetesError> {
        let Some(url) = &self.snapshots else {
            return Ok(backend);
        };
        let shelf = ObjectSnapshots::open(url, SnapshotsConfig::default())
            .map_err(|e| KubernetesError::Snapshots(format!("{url}: {e}")))?;
        Ok(backend.with_shelf(Arc::new(shelf)))
    }

    async fn client(&self) -> Result<kube::Client, KubernetesError> {
        let failed = |e: &dyn std::fmt::Display| KubernetesError::Client(e.to_string());
        let mut config = match &self.api {
            ApiServer::Url(url) => kube::Config::new(
                url.parse()
                    .map_err(|e| KubernetesError::Client(format!("{url}: {e}")))?,
            ),
            ApiServer::Kubeconfig(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| KubernetesError::Client(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(
                    file,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(|e| KubernetesError::Client(format!("{}: {e}", path.display())))?
            }
            ApiServer::Infer => kube::Config::infer().await.map_err(|e| failed(&e))?,
        };
        config.default_namespace = self.config.namespace.clone();
        Cluster::make_client(config).map_err(|e| failed(&e))
    }
}
