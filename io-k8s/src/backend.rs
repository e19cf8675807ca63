//! [`K8sBackend`]: the io-tokio `Backend` on Kubernetes, built from the [`Cluster`] operations.
//! It learns the keeper's [`ReleasePolicy`] at construction ([`K8sBackend::connect`]): the
//! commands do not carry it, and `Suspend` changes what `stop` and `persist` do.
//!
//! - `start`: create the claim (or pod) and wait until its pod runs; with `resume_from` (a
//!   suspended claim's name), resume that claim instead (see [`crate::suspend`]): a claim that is
//!   gone, failed or not ours is a lost snapshot, so the start goes fresh with a warning; a
//!   malformed reference is [`K8sError::BadSnapshot`];
//! - `upload`: exec `tar -x` of a temporary name, then `mv -f -T` over the final name, in the
//!   pod ([`crate::upload`]: all or nothing); an upload into a pod that is gone is
//!   [`FailureClass::Gone`] (R6 becomes a typed `SandboxGone` in the core, never a crash), an
//!   unknown outcome is transient;
//! - `stop`: nothing to stop before shutdown (the core orders no upload after it). Under
//!   `Suspend` (agent-sandbox mode only) the snapshot is the claim's name; otherwise none;
//! - `persist`: under `Suspend`, hold back the sandbox's deaths and, for good, every event of
//!   its current pod (by UID), patch its Sandbox
//!   `operatingMode: Suspended` and wait until the pod is gone; the claim is kept for the next
//!   start of the key. Otherwise nothing;
//! - `shutdown`: delete the claim (or pod) by its name; gone already is success;
//! - `watch_deaths`: deleted, failed or expired pods and claims of this owner, routed through
//!   [`DeathRoutes`] (suspended sandboxes and the pods suspensions removed held back, resumed
//!   ones named by their new number).
//!
//! `KeepWarm` needs nothing here: the core simply does not order a shutdown, so the claim is
//! kept between calls (R11). `Suspend` in pod mode is refused at construction
//! ([`ConfigError::SuspendNeedsAgentSandbox`]): a plain pod keeps nothing without the pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkeeper::{ReleasePolicy, SandboxId, Snapshot};
use sandkeeper_tokio::{
    Backend, BackendError, DeathSink, FailureClass, StartRequest, UploadRequest,
};

use crate::cluster::Cluster;
use crate::config::{ConfigError, Mode};
use crate::deaths::{DeathCounts, DeathRoutes};
use crate::error::{ErrorClass, K8sError};
use crate::lease::{LeaseRenewal, SweepReport};
use crate::names;
use crate::sandbox::SandboxHandle;
use crate::suspend::Resumable;
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
    policy: ReleasePolicy,
    started: Mutex<HashMap<SandboxId, SandboxHandle>>,
    /// Claims being resumed by a start that has not answered yet: a shutdown ordered meanwhile
    /// (the start abandoned) deletes them.
    resuming: Mutex<HashMap<SandboxId, String>>,
    routes: Arc<DeathRoutes>,
    suspensions: tokio::sync::watch::Sender<u64>,
    _lease: LeaseRenewal,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl K8sBackend {
    /// Checks that the cluster's mode can serve the keeper's release `policy` (give it the
    /// same value as the keeper's core `Config::release`; `Suspend` needs agent-sandbox mode),
    /// takes this owner's Lease, sweeps objects of owners whose Lease is gone, and keeps the
    /// Lease renewed while the backend lives.
    pub async fn connect(
        cluster: Cluster,
        policy: ReleasePolicy,
    ) -> Result<(Self, SweepReport), K8sError> {
        if policy == ReleasePolicy::Suspend && matches!(cluster.config().mode, Mode::Pod { .. }) {
            return Err(ConfigError::SuspendNeedsAgentSandbox.into());
        }
        cluster.acquire_lease().await?;
        let report = cluster.sweep_orphans().await?;
        let lease = cluster.spawn_lease_renewal();
        Ok((
            K8sBackend {
                cluster,
                policy,
                started: Mutex::new(HashMap::new()),
                resuming: Mutex::new(HashMap::new()),
                routes: Arc::new(DeathRoutes::default()),
                suspensions: tokio::sync::watch::channel(0).0,
                _lease: lease,
            },
            report,
        ))
    }

    /// The release policy this backend serves.
    pub fn policy(&self) -> &ReleasePolicy {
        &self.policy
    }

    /// Counts of the deaths its watch saw: reported, or held back (suspensions).
    pub fn death_counts(&self) -> tokio::sync::watch::Receiver<DeathCounts> {
        self.routes.counts()
    }

    /// Suspensions completed so far (persists under `Suspend` that answered Ok).
    pub fn suspensions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.suspensions.subscribe()
    }

    fn suspends(&self) -> bool {
        self.policy == ReleasePolicy::Suspend
            && matches!(self.cluster.config().mode, Mode::AgentSandbox { .. })
    }

    /// Resumes the claim `snapshot` names as `request.sandbox`, or starts fresh when it is
    /// lost. `Ok(None)`: lost, start fresh.
    async fn resume(
        &self,
        sandbox: SandboxId,
        snapshot: &Snapshot,
    ) -> Result<Option<SandboxHandle>, K8sError> {
        let claim = self.cluster.claim_of_snapshot(snapshot.as_str())?;
        locked(&self.resuming).insert(sandbox, claim.clone());
        let found = match self.cluster.find_suspended(&claim).await? {
            Resumable::Claim(found) => found,
            Resumable::Lost(why) => {
                locked(&self.resuming).remove(&sandbox);
                tracing::warn!(%sandbox, snapshot = %snapshot.as_str(), %why,
                    "the snapshot to resume from is lost; starting a fresh sandbox");
                return Ok(None);
            }
        };
        // From now on, deaths of the claim's objects are the new sandbox's.
        let number = claim.rsplit('-').next().and_then(|n| n.parse().ok());
        let label = found.label.or(number).unwrap_or(sandbox.0);
        self.routes.resume(label, sandbox.0);
        let handle = self.cluster.resume_sandbox(sandbox.0, &found).await?;
        tracing::info!(%sandbox, %claim, pod = %handle.pod, "resumed a suspended claim");
        Ok(Some(handle))
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
        locked(&self.started).get(&sandbox).cloned()
    }
}

impl Backend for K8sBackend {
    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let key = request.key.to_string();
        let resumed = match &request.resume_from {
            Some(snapshot) => {
                let r = self.resume(request.sandbox, snapshot).await;
                locked(&self.resuming).remove(&request.sandbox);
                r.map_err(failure)?
            }
            None => None,
        };
        let handle = match resumed {
            Some(h) => h,
            None => self
                .cluster
                .start_sandbox(request.sandbox.0, &key)
                .await
                .map_err(failure)?,
        };
        locked(&self.started).insert(request.sandbox, handle);
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

    async fn stop(&self, sandbox: SandboxId) -> Result<Option<Snapshot>, BackendError> {
        if !self.suspends() {
            return Ok(None);
        }
        // The claim owns the Sandbox whose volumes outlive the suspension.
        Ok(self.handle(sandbox).map(|h| Snapshot::new(h.object)))
    }

    async fn persist(
        &self,
        sandbox: SandboxId,
        snapshot: Option<Snapshot>,
    ) -> Result<(), BackendError> {
        if !self.suspends() {
            return Ok(());
        }
        let Some(h) = self.handle(sandbox) else {
            return Err(BackendError::fatal(format!(
                "{sandbox} is not started here: nothing to suspend"
            )));
        };
        let Some(snapshot) = snapshot else {
            return Err(BackendError::fatal(format!(
                "{sandbox}: suspend without a snapshot"
            )));
        };
        let claim = self
            .cluster
            .claim_of_snapshot(snapshot.as_str())
            .map_err(failure)?;
        if claim != h.object {
            return Err(failure(K8sError::BadSnapshot {
                snapshot: snapshot.as_str().to_string(),
                why: format!("{sandbox} runs in claim {}", h.object),
            }));
        }
        // Before the patch: the pod deletion the suspension causes is not a death.
        self.routes.suspend(sandbox.0, &h.pod_uid);
        self.cluster.suspend_sandbox(&h).await.map_err(failure)?;
        // The core forgets the sandbox now; the claim waits for its key's next start.
        locked(&self.started).remove(&sandbox);
        self.suspensions.send_modify(|n| *n += 1);
        tracing::debug!(%sandbox, %claim, "suspended");
        Ok(())
    }

    async fn shutdown(&self, sandbox: SandboxId) -> Result<(), BackendError> {
        let known = locked(&self.started).remove(&sandbox);
        let resuming = locked(&self.resuming).remove(&sandbox);
        self.routes.forget(sandbox.0);
        // By name, so a sandbox whose start answer was lost is deleted too (a resumed one by
        // the name of the claim it resumed).
        let object = known
            .map(|h| h.object)
            .or(resuming)
            .unwrap_or_else(|| names::object_name(self.cluster.owner(), sandbox.0));
        let r = match &self.cluster.config().mode {
            Mode::AgentSandbox { .. } => self.cluster.delete_claim(&object).await,
            Mode::Pod { .. } => self.cluster.delete_pod(&object).await,
        };
        r.map(|_| ()).map_err(failure)
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        let sink = deaths.clone();
        let routes = self.routes.clone();
        let _watch = self.cluster.spawn_death_watch(move |d| {
            match routes.route(&d) {
                Some(x) => sink.report(SandboxId(x)),
                None => {
                    tracing::debug!(sandbox = d.sandbox, reason = %d.reason, "death of a suspended sandbox held back");
                    true
                }
            }
        });
        while deaths.is_listening() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
