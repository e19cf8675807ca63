//! [`K8sBackend`]: the io-tokio `Backend` on Kubernetes, built from the [`Cluster`] operations.
//!
//! - `start`: create the claim (or pod) and wait until its pod runs;
//! - `upload`: exec `tar -x` in the pod with the file on stdin; an upload into a pod that is
//!   gone is [`FailureClass::Gone`] (R6 becomes a typed `SandboxGone` in the core, never a
//!   crash), an unknown outcome is transient;
//! - `stop`: nothing to do before shutdown (the core orders no upload after it); no snapshot;
//! - `persist`: nothing (snapshots are not supported yet);
//! - `shutdown`: delete the claim (or pod) by its name; gone already is success;
//! - `watch_deaths`: deleted, failed or expired pods and claims of this owner.
//!
//! `KeepWarm` needs nothing here: the core simply does not order a shutdown, so the claim is
//! kept between calls (R11).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sandkeeper::{SandboxId, Snapshot};
use sandkeeper_tokio::{
    Backend, BackendError, DeathSink, FailureClass, StartRequest, UploadRequest,
};

use crate::cluster::Cluster;
use crate::config::Mode;
use crate::error::{ErrorClass, K8sError};
use crate::lease::{LeaseRenewal, SweepReport};
use crate::names;
use crate::sandbox::SandboxHandle;
use crate::upload::UploadFile;

/// Maps an operation error to the driver's failure classes.
pub fn failure(e: K8sError) -> BackendError {
    let class = match e.class() {
        ErrorClass::Gone => FailureClass::Gone,
        ErrorClass::Timeout => FailureClass::Timeout,
        ErrorClass::Retryable | ErrorClass::Conflict => FailureClass::Transient,
        ErrorClass::Fatal => FailureClass::Fatal,
    };
    BackendError::new(class, e.to_string())
}

/// The Kubernetes backend of the io-tokio driver.
pub struct K8sBackend {
    cluster: Cluster,
    started: Mutex<HashMap<SandboxId, SandboxHandle>>,
    _lease: LeaseRenewal,
}

impl K8sBackend {
    /// Takes this owner's Lease, sweeps objects of owners whose Lease is gone, and keeps the
    /// Lease renewed while the backend lives.
    pub async fn connect(cluster: Cluster) -> Result<(Self, SweepReport), K8sError> {
        cluster.acquire_lease().await?;
        let report = cluster.sweep_orphans().await?;
        let lease = cluster.spawn_lease_renewal();
        Ok((
            K8sBackend {
                cluster,
                started: Mutex::new(HashMap::new()),
                _lease: lease,
            },
            report,
        ))
    }

    /// The operations underneath.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// After the keeper closed: deletes every object of this owner that is left, then its
    /// Lease. Returns how many objects were deleted.
    pub async fn close(&self) -> Result<usize, K8sError> {
        let n = self.cluster.delete_all_owned().await?;
        self.cluster.release_lease().await?;
        Ok(n)
    }

    /// The objects of a sandbox started here and not shut down yet.
    pub fn handle(&self, sandbox: SandboxId) -> Option<SandboxHandle> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sandbox)
            .cloned()
    }
}

impl Backend for K8sBackend {
    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let key = request.key.to_string();
        let handle = self
            .cluster
            .start_sandbox(request.sandbox.0, &key)
            .await
            .map_err(failure)?;
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(request.sandbox, handle);
        Ok(())
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let Some(h) = self.handle(request.sandbox) else {
            return Err(BackendError::gone(format!(
                "{} is not started here",
                request.sandbox
            )));
        };
        let file = UploadFile {
            session: &request.session,
            path: &request.path,
            bytes: &request.payload.0,
        };
        self.cluster.upload(&h.pod, &[file]).await.map_err(failure)
    }

    async fn stop(&self, _sandbox: SandboxId) -> Result<Option<Snapshot>, BackendError> {
        Ok(None)
    }

    async fn persist(
        &self,
        _sandbox: SandboxId,
        _snapshot: Option<Snapshot>,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    async fn shutdown(&self, sandbox: SandboxId) -> Result<(), BackendError> {
        let known = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sandbox);
        // By name, so a sandbox whose start answer was lost is deleted too.
        let object = known
            .map(|h| h.object)
            .unwrap_or_else(|| names::object_name(self.cluster.owner(), sandbox.0));
        let r = match &self.cluster.config().mode {
            Mode::AgentSandbox { .. } => self.cluster.delete_claim(&object).await,
            Mode::Pod { .. } => self.cluster.delete_pod(&object).await,
        };
        r.map(|_| ()).map_err(failure)
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        let sink = deaths.clone();
        let _watch = self
            .cluster
            .spawn_death_watch(move |d| sink.report(SandboxId(d.sandbox)));
        while deaths.is_listening() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
