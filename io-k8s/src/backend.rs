//! [`K8sBackend`]: the io-tokio `Backend` on Kubernetes, built from the [`Cluster`] operations.
//! It executes the core's commands as they come and keeps no table to interpret them: each
//! command says what it needs (a stop or persist whether it suspends, a start which suspended
//! sandbox it resumes), and the release policy is the core's. [`Backend::check_config`] refuses
//! what this mode cannot do: `Suspend` in pod mode.
//!
//! - `start`: create the claim (or pod) and wait until its pod runs; with `resume_from` (a
//!   suspended claim's name), resume that claim instead (see [`crate::suspend`]): its objects
//!   are relabelled with the new sandbox number before its new pod is made; a claim that is
//!   gone, failed or not ours is a lost snapshot, so the start goes fresh with a warning; a
//!   malformed reference is [`K8sError::BadSnapshot`];
//! - `upload`: exec `tar -x` of a temporary name, then `mv -f -T` over the final name, in the
//!   pod ([`crate::upload`]: all or nothing); an upload into a pod that is gone is
//!   [`FailureClass::Gone`] (R6 becomes a typed `SandboxGone` in the core, never a crash), an
//!   unknown outcome is transient;
//! - `stop`: nothing to stop before shutdown (the core orders no upload after it). With
//!   `suspend` (agent-sandbox mode only) the snapshot is the claim's name; otherwise none. No
//!   pod is needed: the core suspends a sandbox whose pod was lost (see the crate docs);
//! - `persist`: with `suspend`, patch the sandbox's Sandbox `operatingMode: Suspended` and wait
//!   until its pod is gone (the one the controller made again after a loss, too; a Sandbox the
//!   controller suspended by itself until it shows the keeper's mode); the claim is kept for
//!   the start that resumes it, and the sandbox is
//!   never named again but by the discard of its claim. With a retention (`retain_until`), the
//!   claim's `spec.lifecycle.shutdownTime` becomes the retention's end (policy `Delete`): the
//!   controller deletes it then even if no keeper is left, and a resume pushes it out again.
//!   Otherwise nothing;
//! - `discard`: delete the suspended claim the snapshot names (ours by its name); gone already
//!   is success. A snapshot a start took (`DiscardReason::Taken`) is the claim the resumed
//!   sandbox runs in: nothing is deleted;
//! - `shutdown`: delete the claim (or pod) by its name (a resume's by the name of the claim it
//!   resumes, even when its start was abandoned); gone already is success;
//! - `watch_deaths`: deleted, failed or expired pods and claims of this owner, reported by the
//!   sandbox number on their label ([`crate::deaths`]): a claim's pod as a
//!   [`Loss::Instance`](sandkeeper_tokio::Loss::Instance), a claim or a plain pod as a
//!   [`Loss::Sandbox`](sandkeeper_tokio::Loss::Sandbox). Whether that is a death (or the
//!   suspension's own doing, or stale news of an earlier incarnation) is the core's to say.
//!
//! `KeepWarm` needs nothing here: the core simply does not order a shutdown, so the claim is
//! kept between calls (R11). A plain pod keeps nothing without the pod, so pod mode suspends
//! only with a shelf ([`K8sBackend::with_shelf`]; otherwise
//! [`ConfigError::SuspendNeedsAgentSandbox`]): then `stop` names the snapshot
//! `sbx-<n>-<owner>`, `persist` streams the workspace out of the pod onto the shelf before it
//! deletes the pod, a `start` resuming it streams it into a new pod, and `discard` removes it
//! from the shelf (`shelf.rs` says what happens when a step fails).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sandkeeper::{Config, SandboxId, Snapshot, Token};
use sandkeeper_tokio::local::shelf::Shelf;
use sandkeeper_tokio::{
    AdoptRequest, Backend, BackendError, DeathSink, DiscardRequest, FailureClass, PersistRequest,
    StartRequest, StopRequest, UploadRequest,
};

use crate::cluster::Cluster;
use crate::config::{ConfigError, Mode};
use crate::deaths::LossCounts;
use crate::error::{ErrorClass, K8sError};
use crate::install::Install;
use crate::lease::{LeaseRenewal, SweepReport};
use crate::names;
use crate::sandbox::SandboxHandle;
use crate::shelf::{pod_of_snapshot, snapshot_name, Restored};
use crate::suspend::Resumable;
use crate::upload::UploadFile;

/// Maps an operation error to the driver's failure classes.
pub fn failure(e: K8sError) -> BackendError {
    let class = match e.class() {
        ErrorClass::Gone => FailureClass::Gone,
        ErrorClass::Timeout => FailureClass::Timeout,
        ErrorClass::Retryable | ErrorClass::Conflict => FailureClass::Transient,
        ErrorClass::Fatal => FailureClass::Fatal,
        ErrorClass::Fenced => FailureClass::Fenced,
    };
    BackendError::new(class, e.to_string())
}

/// The Kubernetes backend of the io-tokio driver.
pub struct K8sBackend {
    cluster: Cluster,
    /// What connect learnt of the install (whether the workspace survives a suspension).
    install: Install,
    /// The sandboxes started (or adopted) here and not shut down, suspended or relinquished
    /// yet: their objects, and in fleet mode the token this process holds them under.
    started: Mutex<HashMap<SandboxId, Running>>,
    /// Claims being resumed by a start that has not answered yet: work in progress a shutdown
    /// ordered meanwhile (the start abandoned) must delete, and whose name (the first
    /// incarnation's) the sandbox number does not give.
    resuming: Mutex<HashMap<SandboxId, String>>,
    losses: Arc<tokio::sync::watch::Sender<LossCounts>>,
    suspensions: tokio::sync::watch::Sender<u64>,
    /// The owner Lease's renewal (not in fleet mode: the fleet store's process leases say who
    /// is live there).
    _lease: Option<LeaseRenewal>,
    /// Connected as one process of a fleet ([`K8sBackend::connect_fleet`]).
    fleet: bool,
    /// Pod mode: where a suspended sandbox's workspace is kept ([`K8sBackend::with_shelf`]).
    shelf: Option<Arc<dyn Shelf>>,
    /// Pod mode with a shelf: the pods this backend deletes itself on a step that answers
    /// for them (a Persist once the workspace is on the shelf, a start whose restore failed),
    /// by sandbox number. The death watch does not report that deletion: it would race the
    /// step's answer, and the core would count a suspension as a death, or a failed resume as
    /// one that lost the key's workspace. The first report of each is dropped.
    own_deletions: Arc<Mutex<std::collections::HashSet<u64>>>,
    /// Pod mode with a shelf: sandboxes whose start is restoring a snapshot from the shelf. A
    /// loss of such a pod is of the instance only: the snapshot is still on the shelf, and
    /// the core gives it back to the key when the start fails.
    restoring: Arc<Mutex<std::collections::HashSet<u64>>>,
}

/// A sandbox this backend drives.
struct Running {
    handle: SandboxHandle,
    /// The key it serves (what a snapshot on the shelf is judged by).
    key: String,
    /// Fleet mode: the newest token this process started, adopted or changed the sandbox
    /// under. The application's own changes in it are checked against its object's token
    /// before they are made (`work.rs`); `None` (a single keeper): nothing is checked.
    token: Option<Token>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl K8sBackend {
    /// Takes this owner's Lease, sweeps objects of owners whose Lease is gone, and keeps the
    /// Lease renewed while the backend lives. Whether this mode can serve the keeper's release
    /// policy is checked when the keeper is made ([`Backend::check_config`]). The report says
    /// what the sweep deleted, and how many claims of a dead owner or of this owner it found
    /// suspended by the controller for inactivity ([`SweepReport::auto_suspended`]: judged as
    /// claims their keeper suspended, each named in a warning; see the crate docs).
    pub async fn connect(cluster: Cluster) -> Result<(Self, SweepReport), K8sError> {
        let install = cluster.check_install().await?;
        cluster.acquire_lease().await?;
        let report = cluster.sweep_orphans().await?;
        let lease = cluster.spawn_lease_renewal();
        Ok((Self::made(cluster, install, Some(lease), false), report))
    }

    /// The backend for one process of a fleet (`sandkeeper_tokio::Keeper::fleet`, with a
    /// [`K8sStore`](crate::K8sStore) in the same namespace): it checks the install as
    /// [`connect`](Self::connect) does, but neither takes an owner Lease nor sweeps by owner
    /// Leases (that sweep would delete what a restarted process's earlier run kept for its
    /// users, and what other processes hold): in a fleet, the store's process leases say who is
    /// live, and the keeper's fleet sweep ([`K8sStore::sweep`](crate::K8sStore::sweep))
    /// removes only what nothing live holds and no record names. Its [`close`](Self::close)
    /// deletes nothing: the keeper's own close shut down what it drove, and what it handed over
    /// or kept is the fleet's.
    pub async fn connect_fleet(cluster: Cluster) -> Result<Self, K8sError> {
        let install = cluster.check_install().await?;
        Ok(Self::made(cluster, install, None, true))
    }

    fn made(cluster: Cluster, install: Install, lease: Option<LeaseRenewal>, fleet: bool) -> Self {
        K8sBackend {
            cluster,
            install,
            started: Mutex::new(HashMap::new()),
            resuming: Mutex::new(HashMap::new()),
            losses: Arc::new(tokio::sync::watch::channel(LossCounts::default()).0),
            suspensions: tokio::sync::watch::channel(0).0,
            _lease: lease,
            fleet,
            shelf: None,
            own_deletions: Arc::default(),
            restoring: Arc::default(),
        }
    }

    /// Pod mode suspending through `shelf` (`shelf.rs`): a suspended sandbox's workspace is
    /// streamed out of its pod onto the shelf before the pod is deleted, and back into a new
    /// pod when its key resumes. With a shelf, pod mode serves the `Suspend` release policy
    /// and a fleet's `Handover::Suspended`; agentSandbox mode refuses one (its claims keep a
    /// suspended sandbox), at [`Backend::check_config`].
    #[must_use]
    pub fn with_shelf(mut self, shelf: Arc<dyn Shelf>) -> Self {
        self.shelf = Some(shelf);
        self
    }

    /// The shelf, in pod mode with one.
    fn pod_shelf(&self) -> Option<&dyn Shelf> {
        match self.cluster.config().mode {
            Mode::Pod { .. } => self.shelf.as_deref(),
            Mode::AgentSandbox { .. } => None,
        }
    }

    /// Counts of the losses the death watch reported (what the core made of them is in its
    /// stats).
    pub fn loss_counts(&self) -> tokio::sync::watch::Receiver<LossCounts> {
        self.losses.subscribe()
    }

    /// Suspensions completed so far (persists with `suspend` that answered Ok).
    pub fn suspensions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.suspensions.subscribe()
    }

    /// Refuses a suspending stop or persist in pod mode (the keeper refused the policy at
    /// construction, so this is a bug).
    fn check_suspends(&self, sandbox: SandboxId) -> Result<(), BackendError> {
        match self.cluster.config().mode {
            Mode::AgentSandbox { .. } => Ok(()),
            Mode::Pod { .. } if self.shelf.is_some() => Ok(()),
            Mode::Pod { .. } => Err(BackendError::fatal(format!(
                "{sandbox}: {}",
                ConfigError::SuspendNeedsAgentSandbox
            ))),
        }
    }

    /// The claim a snapshot names: one this owner handed out, or in a fleet one any of its
    /// processes did (the key's last owner suspended it).
    fn claim_of(&self, snapshot: &Snapshot) -> Result<String, K8sError> {
        if self.fleet {
            self.cluster.claim_of_fleet_snapshot(snapshot.as_str())
        } else {
            self.cluster.claim_of_snapshot(snapshot.as_str())
        }
    }

    /// Resumes the claim `snapshot` names as `request.sandbox`, or starts fresh when it is
    /// lost. `Ok(None)`: lost, start fresh.
    async fn resume(
        &self,
        request: &StartRequest,
        snapshot: &Snapshot,
    ) -> Result<Option<SandboxHandle>, K8sError> {
        let sandbox = request.sandbox;
        let claim = self.claim_of(snapshot)?;
        locked(&self.resuming).insert(sandbox, claim.clone());
        let looked_up = if self.fleet {
            self.cluster.find_fleet_suspended(&claim).await?
        } else {
            self.cluster.find_suspended(&claim).await?
        };
        let found = match looked_up {
            Resumable::Claim(found) => found,
            Resumable::Lost(why) => {
                tracing::warn!(%sandbox, snapshot = %snapshot.as_str(), %why,
                    "the snapshot to resume from is lost; starting a fresh sandbox");
                return Ok(None);
            }
        };
        let resumes = request.resumes.map(|s| s.0);
        if found.label.is_some() && found.label != resumes {
            tracing::warn!(%sandbox, %claim, label = ?found.label, ?resumes,
                "the suspended claim is labelled with another sandbox than the one it resumes");
        }
        let handle = self.cluster.resume_sandbox(sandbox.0, &found).await?;
        tracing::info!(%sandbox, ?resumes, %claim, pod = %handle.pod, "resumed a suspended claim");
        Ok(Some(handle))
    }

    /// A new sandbox with an empty workspace.
    async fn start_fresh(&self, request: &StartRequest) -> Result<SandboxHandle, BackendError> {
        let key = request.key.to_string();
        self.cluster
            .start_sandbox(request.sandbox.0, &key)
            .await
            .map_err(failure)
    }

    /// Pod mode with a shelf: a new pod, and `snapshot`'s workspace restored into it
    /// ([`restore`](Self::restore)); true when there was one to restore. On a failure the new
    /// pod is deleted again.
    async fn start_from_shelf(
        &self,
        shelf: &dyn Shelf,
        request: &StartRequest,
        snapshot: &Snapshot,
    ) -> Result<(SandboxHandle, bool), K8sError> {
        let key = request.key.to_string();
        let n = request.sandbox.0;
        locked(&self.restoring).insert(n);
        let started = self.cluster.start_sandbox(n, &key).await;
        let restored = match started {
            Ok(handle) => match self.restore(shelf, request, snapshot, &handle).await {
                Ok(restored) => Ok((handle, restored)),
                Err(e) => Err((Some(handle), e)),
            },
            Err(e) => Err((None, e)),
        };
        match restored {
            Ok(done) => {
                locked(&self.restoring).remove(&n);
                Ok(done)
            }
            Err((None, e)) => {
                locked(&self.restoring).remove(&n);
                Err(e)
            }
            Err((Some(handle), e)) => {
                locked(&self.own_deletions).insert(n);
                locked(&self.restoring).remove(&n);
                if let Err(d) = self.cluster.delete_pod(&handle.object).await {
                    tracing::warn!(pod = %handle.object, error = %d,
                        "deleting a pod whose restore failed");
                }
                Err(e)
            }
        }
    }

    /// Restores `snapshot` into the new pod of `handle` from the shelf (`shelf.rs`). A snapshot
    /// not on the shelf is taken from the pod that held it, if it still runs: put on the shelf,
    /// its pod deleted, and restored from there. Ok(false): on neither, lost (the start goes on
    /// fresh).
    async fn restore(
        &self,
        shelf: &dyn Shelf,
        request: &StartRequest,
        snapshot: &Snapshot,
        handle: &SandboxHandle,
    ) -> Result<bool, K8sError> {
        let sandbox = request.sandbox;
        if self.cluster.unshelve(shelf, snapshot, &handle.pod).await? == Restored::Whole {
            tracing::info!(%sandbox, snapshot = %snapshot.as_str(), pod = %handle.pod,
                "resumed from the shelf");
            return Ok(true);
        }
        let held = pod_of_snapshot(snapshot)?;
        if let Err(e) = self.cluster.check_pod_alive(&held).await {
            if !e.is_gone() {
                return Err(e);
            }
            tracing::warn!(%sandbox, snapshot = %snapshot.as_str(), %held,
                "the snapshot to resume from is on neither the shelf nor its pod; starting a fresh sandbox");
            return Ok(false);
        }
        // A salvaged snapshot (no Persist kept it): its pod is the only copy until the put.
        let key = request.key.to_string();
        self.cluster
            .shelve(shelf, &held, snapshot, &key, None)
            .await?;
        self.cluster.admit(&held, request.token).await?;
        self.cluster.delete_pod(&held).await?;
        match self.cluster.unshelve(shelf, snapshot, &handle.pod).await? {
            Restored::Whole => {
                tracing::info!(%sandbox, snapshot = %snapshot.as_str(), %held, pod = %handle.pod,
                    "resumed a salvaged snapshot from the pod that held it, through the shelf");
                Ok(true)
            }
            Restored::NotOnShelf => Err(K8sError::Shelf {
                retryable: true,
                message: format!(
                    "{} vanished from the shelf right after it was put",
                    snapshot.as_str()
                ),
            }),
        }
    }

    /// Pod mode with a shelf: Persist puts the workspace of the stopped sandbox (its pod
    /// `h`) on the shelf as `snapshot`, then deletes the pod. On a failure the pod stays.
    async fn shelve(
        &self,
        shelf: &dyn Shelf,
        sandbox: SandboxId,
        h: &SandboxHandle,
        snapshot: &Snapshot,
        retain_until: Option<std::time::SystemTime>,
        token: Option<Token>,
    ) -> Result<(), K8sError> {
        if *snapshot != snapshot_name(self.cluster.owner(), sandbox.0) {
            return Err(K8sError::BadSnapshot {
                snapshot: snapshot.as_str().to_string(),
                why: format!("{sandbox} runs in pod {}", h.object),
            });
        }
        let key = locked(&self.started)
            .get(&sandbox)
            .map(|r| r.key.clone())
            .unwrap_or_default();
        self.cluster.admit(&h.object, token).await?;
        self.cluster
            .shelve(shelf, &h.pod, snapshot, &key, retain_until)
            .await?;
        // The suspension's own doing: not reported as a loss.
        locked(&self.own_deletions).insert(sandbox.0);
        self.cluster.delete_pod(&h.object).await?;
        locked(&self.started).remove(&sandbox);
        self.suspensions.send_modify(|n| *n += 1);
        tracing::debug!(%sandbox, snapshot = %snapshot.as_str(), "suspended to the shelf");
        Ok(())
    }

    /// Pod mode with a shelf: Discard removes the snapshot from the shelf, and the pod that
    /// held it if it still runs (a salvaged snapshot's).
    async fn unshelve_discard(
        &self,
        shelf: &dyn Shelf,
        request: &DiscardRequest,
    ) -> Result<(), K8sError> {
        let held = pod_of_snapshot(&request.snapshot)?;
        shelf
            .remove(&request.snapshot)
            .await
            .map_err(crate::shelf::shelf_failure)?;
        self.cluster.admit(&held, request.token).await?;
        let deleted = self.cluster.delete_pod(&held).await?;
        tracing::debug!(sandbox = %request.sandbox, snapshot = %request.snapshot.as_str(), deleted,
            reason = ?request.reason, "discarded a snapshot on the shelf");
        Ok(())
    }

    /// What connect learnt of the install.
    pub fn install(&self) -> &Install {
        &self.install
    }

    /// The operations underneath.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// After the keeper closed: deletes every object of this owner that is left, then its
    /// Lease. Returns how many objects were deleted. In a fleet (`connect_fleet`): nothing.
    pub async fn close(&self) -> Result<usize, K8sError> {
        if self.fleet {
            return Ok(0); // see `connect_fleet`
        }
        let n = self.cluster.delete_all_owned().await?;
        self.cluster.release_lease().await?;
        Ok(n)
    }

    /// The objects of a sandbox started here and not shut down (or suspended) yet.
    pub fn handle(&self, sandbox: SandboxId) -> Option<SandboxHandle> {
        locked(&self.started)
            .get(&sandbox)
            .map(|r| r.handle.clone())
    }

    /// The objects of a sandbox started here, with the token this process holds it under
    /// (fleet mode; `None` otherwise).
    pub(crate) fn running(&self, sandbox: SandboxId) -> Option<(SandboxHandle, Option<Token>)> {
        locked(&self.started)
            .get(&sandbox)
            .map(|r| (r.handle.clone(), r.token))
    }

    /// Records that this process drives `sandbox` under `token` now (a command under it was
    /// admitted): the newest it holds.
    fn holds(&self, sandbox: SandboxId, token: Option<Token>) {
        if let (Some(r), Some(t)) = (locked(&self.started).get_mut(&sandbox), token) {
            r.token = Some(r.token.map_or(t, |held| held.max(t)));
        }
    }
}

impl Backend for K8sBackend {
    /// Tokens on claims and pods (`fence.rs`), adoption (`adopt.rs`); in a fleet the backend
    /// is connected with [`K8sBackend::connect_fleet`].
    const FLEET: bool = true;

    fn check_config(&self, config: &Config) -> Result<(), String> {
        if config.fleet.is_some() && !self.fleet {
            return Err("fleet mode needs the backend connected with K8sBackend::connect_fleet (K8sBackend::connect sweeps by owner Leases, which would delete what other processes of the fleet hold)".to_string());
        }
        if config.fleet.is_none() && self.fleet {
            return Err("a backend connected with K8sBackend::connect_fleet serves fleet mode only (nothing would sweep a single keeper's orphans): use K8sBackend::connect".to_string());
        }
        let pod_mode = matches!(self.cluster.config().mode, Mode::Pod { .. });
        if !pod_mode && self.shelf.is_some() {
            return Err("a shelf is for pod mode: agentSandbox mode keeps a suspended sandbox in its claim (K8sBackend::with_shelf)".to_string());
        }
        // With a shelf, pod mode keeps a suspended workspace there.
        let pod_cannot_keep = pod_mode && self.shelf.is_none();
        // Keys handed over suspended suspend whatever the policy.
        let handover_suspends = config
            .fleet
            .is_some_and(|f| f.handover == sandkeeper::Handover::Suspended);
        if pod_cannot_keep && config.release.suspends() {
            return Err(ConfigError::SuspendNeedsAgentSandbox.to_string());
        }
        if pod_cannot_keep && handover_suspends {
            return Err("fleet handover Suspended suspends a key's sandbox before another process takes it, and pod mode cannot keep a sandbox without its pod: every process of a cluster reaches every pod, so hand over warm (Handover::Warm), use agentSandbox mode, or give the backend a shelf (K8sBackend::with_shelf)".to_string());
        }
        let suspends = config.release.suspends() || handover_suspends;
        if !pod_mode && suspends && !self.install.workdir_persistent {
            return Err(format!(
                "release policy Suspend would lose the workspace: suspending deletes the pod, and the working directory {} of template {} is not on a volume of its volumeClaimTemplates (a container filesystem or an emptyDir goes with the pod); mount a volumeClaimTemplates volume there (io-k8s/deploy/warm-pool.example.yaml), or use Shutdown or KeepWarm",
                self.cluster.config().workdir,
                self.install.template.as_deref().unwrap_or("?"),
            ));
        }
        if !pod_mode && !config.release.suspends() && !self.install.workdir_persistent {
            // Not refused: no policy here deletes the pod on purpose. But a pod lost from
            // outside (evicted, drained, OOM-killed) is suspended by the core to keep the
            // workspace, and there is none to keep.
            tracing::warn!(
                workdir = %self.cluster.config().workdir,
                template = self.install.template.as_deref().unwrap_or("?"),
                "the working directory is not on a volume of the template's volumeClaimTemplates: a pod lost from outside (evicted, drained, OOM-killed) takes its files with it, and the key's next call continues in an empty workspace; mount a volumeClaimTemplates volume there (io-k8s/deploy/warm-pool.example.yaml)"
            );
        }
        if !pod_mode && config.release.suspends() {
            let grace = u64::try_from(self.install.termination_grace_secs).unwrap_or(0);
            let bound = config
                .command_timeout
                .min(self.cluster.config().ready_timeout())
                .as_secs();
            if grace >= bound {
                return Err(format!(
                    "release policy Suspend would time out: suspending waits for the pod to go, and the pods of template {} have a grace period of {grace} s (terminationGracePeriodSeconds; 30 s unless set), which a container that ignores SIGTERM (such as `sleep infinity` as PID 1) takes in full, while the suspend must end within {bound} s (the smaller of the keeper's command_timeout and readyTimeoutSecs); set a shorter terminationGracePeriodSeconds in the template (io-k8s/deploy/warm-pool.example.yaml sets 5) or raise both timeouts above it",
                    self.install.template.as_deref().unwrap_or("?"),
                ));
            }
        }
        Ok(())
    }

    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let key = request.key.to_string();
        // Fleet mode: not under a token older than the key's newest (`fence.rs`).
        self.cluster
            .admit_start(&key, request.token)
            .await
            .map_err(failure)?;
        let (handle, resumed) = match (&request.resume_from, self.pod_shelf()) {
            (Some(snapshot), Some(shelf)) => self
                .start_from_shelf(shelf, &request, snapshot)
                .await
                .map_err(failure)?,
            (Some(snapshot), None) => {
                let r = self.resume(&request, snapshot).await;
                // Ended either way: resumed (now in `started`), failed (the claim deleted), or
                // lost (a fresh start follows, under the new sandbox's own name).
                locked(&self.resuming).remove(&request.sandbox);
                match r.map_err(failure)? {
                    Some(handle) => (handle, true),
                    None => (self.start_fresh(&request).await?, false),
                }
            }
            (None, _) => (self.start_fresh(&request).await?, false),
        };
        // Fleet mode: the new (or resumed) object records its owner's token.
        let mut admitted = self.cluster.admit(&handle.object, request.token).await;
        if let (Ok(()), Some(token), true) = (&admitted, request.token, resumed) {
            // The resumed workspace keeps the token file its last adopter wrote: the pod's
            // guard learns of this owner too (`work.rs`).
            admitted = self.cluster.raise_pod_token(&handle.pod, token).await;
        }
        let running = Running {
            handle,
            key,
            token: request.token,
        };
        locked(&self.started).insert(request.sandbox, running);
        admitted.map_err(failure)
    }

    async fn adopt(&self, request: AdoptRequest) -> Result<(), BackendError> {
        let handle = self
            .cluster
            .adopt_sandbox(request.sandbox.0, request.token)
            .await
            .map_err(|e| {
                tracing::warn!(sandbox = %request.sandbox, error = %e, "adoption failed");
                failure(e)
            })?;
        let running = Running {
            handle,
            key: request.key.to_string(),
            token: Some(request.token),
        };
        locked(&self.started).insert(request.sandbox, running);
        Ok(())
    }

    async fn relinquish(&self, sandbox: SandboxId) {
        // Left as it is, for the key's next owner; its objects keep this owner's label until
        // that owner adopts them.
        locked(&self.started).remove(&sandbox);
        locked(&self.resuming).remove(&sandbox);
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let Some(h) = self.handle(request.sandbox) else {
            return Err(BackendError::gone(format!(
                "{} is not started here",
                request.sandbox
            )));
        };
        self.cluster
            .admit(&h.object, request.token)
            .await
            .map_err(failure)?;
        self.holds(request.sandbox, request.token);
        let file = UploadFile {
            session: &request.session,
            path: &request.path,
            bytes: &request.payload.0,
        };
        self.cluster
            .upload_into(&h.pod, &h.pod_uid, &[file])
            .await
            .map_err(failure)
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        let StopRequest {
            sandbox,
            suspend,
            token,
        } = request;
        if let Some(h) = self.handle(sandbox) {
            self.cluster
                .admit(&h.object, token)
                .await
                .map_err(failure)?;
            self.holds(sandbox, token);
        }
        if !suspend {
            return Ok(None);
        }
        self.check_suspends(sandbox)?;
        let Some(h) = self.handle(sandbox) else {
            return Err(BackendError::fatal(format!(
                "{sandbox} is not started here: nothing to suspend"
            )));
        };
        if self.pod_shelf().is_some() {
            // Its workspace is in its pod until a Persist puts it on the shelf.
            return Ok(Some(snapshot_name(self.cluster.owner(), sandbox.0)));
        }
        // The claim owns the Sandbox whose volumes outlive the suspension.
        Ok(Some(Snapshot::new(h.object)))
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        let PersistRequest {
            sandbox,
            snapshot,
            suspend,
            retain_until,
            token,
        } = request;
        if !suspend {
            return Ok(());
        }
        self.check_suspends(sandbox)?;
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
        if let Some(shelf) = self.pod_shelf() {
            let shelved = self.shelve(shelf, sandbox, &h, &snapshot, retain_until, token);
            return shelved.await.map_err(|e| {
                tracing::warn!(%sandbox, error = %e, "suspending to the shelf failed; the pod stays");
                failure(e)
            });
        }
        let claim = self.claim_of(&snapshot).map_err(failure)?;
        if claim != h.object {
            return Err(failure(K8sError::BadSnapshot {
                snapshot: snapshot.as_str().to_string(),
                why: format!("{sandbox} runs in claim {}", h.object),
            }));
        }
        self.cluster
            .admit(&h.object, token)
            .await
            .map_err(failure)?;
        // The pod deletion this causes is reported like any other (a lost instance); the
        // core knows the sandbox is being suspended.
        self.cluster.suspend_sandbox(&h).await.map_err(failure)?;
        if let Some(until) = retain_until {
            // Recorded on the claim: the controller ends the retention even without a keeper.
            self.cluster
                .set_claim_expiry(&claim, until)
                .await
                .map_err(failure)?;
        }
        // The sandbox's last command: the claim waits for the start that resumes it.
        locked(&self.started).remove(&sandbox);
        self.suspensions.send_modify(|n| *n += 1);
        tracing::debug!(%sandbox, %claim, "suspended");
        Ok(())
    }

    async fn shutdown(
        &self,
        sandbox: SandboxId,
        token: Option<sandkeeper::Token>,
    ) -> Result<(), BackendError> {
        // By name, so a sandbox whose start answer was lost is deleted too (a resumed one by
        // the name of the claim it resumed).
        let object = self
            .handle(sandbox)
            .map(|h| h.object)
            .or_else(|| locked(&self.resuming).get(&sandbox).cloned())
            .unwrap_or_else(|| names::object_name(self.cluster.owner(), sandbox.0));
        // Fleet mode: refused under an older token, the sandbox left as it is.
        self.cluster.admit(&object, token).await.map_err(failure)?;
        locked(&self.started).remove(&sandbox);
        locked(&self.resuming).remove(&sandbox);
        let r = match &self.cluster.config().mode {
            Mode::AgentSandbox { .. } => self.cluster.delete_claim(&object).await,
            Mode::Pod { .. } => self.cluster.delete_pod(&object).await,
        };
        r.map(|_| ()).map_err(failure)
    }

    async fn discard(&self, request: DiscardRequest) -> Result<(), BackendError> {
        if let Some(shelf) = self.pod_shelf() {
            return self
                .unshelve_discard(shelf, &request)
                .await
                .map_err(failure);
        }
        if request.reason == sandkeeper::DiscardReason::Taken {
            // The claim a resume took is the sandbox it became: nothing of it is left over.
            return Ok(());
        }
        let claim = self.claim_of(&request.snapshot).map_err(failure)?;
        self.cluster
            .admit(&claim, request.token)
            .await
            .map_err(failure)?;
        let deleted = self.cluster.delete_claim(&claim).await.map_err(failure)?;
        tracing::debug!(sandbox = %request.sandbox, %claim, deleted, reason = ?request.reason, "discarded a suspended claim");
        Ok(())
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        let sink = deaths.clone();
        let losses = self.losses.clone();
        let own_deletions = self.own_deletions.clone();
        let restoring = self.restoring.clone();
        let _watch = self.cluster.spawn_death_watch(move |mut d| {
            if locked(&own_deletions).remove(&d.sandbox) {
                tracing::debug!(sandbox = d.sandbox, "a pod this backend deleted: no loss");
                return true;
            }
            if locked(&restoring).contains(&d.sandbox) {
                d.loss = sandkeeper_tokio::Loss::Instance;
            }
            tracing::debug!(sandbox = d.sandbox, loss = ?d.loss, reason = %d.reason, "reporting a loss");
            let listening = sink.report_loss(SandboxId(d.sandbox), d.loss);
            // Counted once the core took the report in.
            losses.send_modify(|c| c.add(d.loss));
            listening
        });
        // Until the keeper stops listening: no polling.
        deaths.stopped().await;
    }
}
