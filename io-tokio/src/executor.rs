//! The tokio executor: runs the core's commands on a [`Backend`], concurrently, with explicit
//! limits, and feeds every answer back to the core.
//!
//! # How commands run
//!
//! - **Lifecycle commands** (Start, Stop, Persist, Shutdown) of one sandbox run one after the
//!   other on that sandbox's *lane*, a task fed in the core's order; lanes of different
//!   sandboxes run side by side. A lane holds at most four commands over its life (the core
//!   orders at most one of each per sandbox), so its channel is bounded by construction; it ends
//!   after Shutdown (or after Persist under `Suspend`).
//! - **Uploads** run each in its own task, never on a lane: a hung upload of one session never
//!   delays another session's upload, release, drain or any lifecycle command. `CancelUpload`
//!   aborts the task (its future is dropped at its next await point).
//! - **Drain** is published as a [`Notice::Drain`] for the sessions' background writers.
//!
//! # Limits
//!
//! At most [`KeeperConfig::max_lifecycle_ops`](crate::KeeperConfig) lifecycle operations and
//! [`KeeperConfig::max_uploads`](crate::KeeperConfig) uploads run on the backend at once; more
//! wait for a permit in FIFO order. The two pools are separate, so uploads (however slow) never
//! hold back a start or a shutdown. The core allows one upload per (session, path) in flight, so
//! one hung session occupies at most `max_paths_per_session` upload permits, and only until its
//! `upload_timeout`, when the core cancels it and the permit comes back.
//!
//! Every backend operation also runs under a driver-side deadline equal to the core's (start
//! timeout, upload timeout, command timeout), so a backend that never answers cannot hold a
//! lane or a permit forever; the core's own timer decides first or at the same instant, and the
//! later answer is stale.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sandkeeper::{Command, Event, Instant, SandboxId, UploadId};
use tokio::runtime::Handle;
use tokio::sync::{broadcast, mpsc, Notify, Semaphore};
use tokio::task::AbortHandle;
use tracing::Instrument;

use crate::backend::{Backend, BackendError, StartRequest, UploadRequest};
use crate::classify;
use crate::notice::Notice;
use crate::shared::{Executor, Shared};

/// The limits and deadlines the executor runs with.
#[derive(Clone, Debug)]
pub(crate) struct ExecutorLimits {
    pub(crate) max_lifecycle_ops: usize,
    pub(crate) max_uploads: usize,
    pub(crate) start_timeout: Duration,
    pub(crate) upload_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) suspend: bool,
}

/// Runs commands on tokio tasks against a backend.
pub(crate) struct TokioExecutor<B: Backend> {
    backend: Arc<B>,
    runtime: Handle,
    origin: tokio::time::Instant,
    limits: ExecutorLimits,
    lifecycle_permits: Arc<Semaphore>,
    upload_permits: Arc<Semaphore>,
    /// The lane of each sandbox with lifecycle work ahead.
    lanes: StdMutex<HashMap<SandboxId, mpsc::UnboundedSender<Command>>>,
    /// Uploads running, to cancel.
    uploads: StdMutex<HashMap<UploadId, AbortHandle>>,
    /// Wakes the timer task when the core's deadline changes.
    timer: Arc<Notify>,
    notices: broadcast::Sender<Notice>,
}

impl<B: Backend> TokioExecutor<B> {
    pub(crate) fn new(
        backend: Arc<B>,
        runtime: Handle,
        origin: tokio::time::Instant,
        limits: ExecutorLimits,
        timer: Arc<Notify>,
        notices: broadcast::Sender<Notice>,
    ) -> Self {
        TokioExecutor {
            lifecycle_permits: Arc::new(Semaphore::new(limits.max_lifecycle_ops)),
            upload_permits: Arc::new(Semaphore::new(limits.max_uploads)),
            backend,
            runtime,
            origin,
            limits,
            lanes: StdMutex::new(HashMap::new()),
            uploads: StdMutex::new(HashMap::new()),
            timer,
            notices,
        }
    }

    pub(crate) fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    pub(crate) fn origin(&self) -> tokio::time::Instant {
        self.origin
    }

    pub(crate) fn notices(&self) -> &broadcast::Sender<Notice> {
        &self.notices
    }

    /// Uploads running now (for tests and reports).
    pub(crate) fn uploads_running(&self) -> usize {
        lock_std(&self.uploads).len()
    }

    fn publish(&self, notice: Notice) {
        if self.notices.receiver_count() > 0 {
            // A lagging subscriber loses the oldest notices; the send never blocks.
            let _ = self.notices.send(notice);
        }
    }

    fn lane_send(&self, shared: &Arc<Shared<Self>>, command: Command) {
        let sandbox = command.sandbox();
        let last = match command {
            Command::Shutdown { .. } => true,
            Command::Persist { .. } => self.limits.suspend,
            _ => false,
        };
        let mut lanes = lock_std(&self.lanes);
        let sender = lanes.entry(sandbox).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let span = tracing::info_span!("sandbox", sandbox = %sandbox);
            self.runtime
                .spawn(Self::lane(shared.clone(), sandbox, rx).instrument(span));
            tx
        });
        if sender.send(command).is_err() {
            tracing::error!(sandbox = %sandbox, "lane ended before its last command");
        }
        if last {
            lanes.remove(&sandbox);
        }
    }

    /// One sandbox's lifecycle commands, in order.
    async fn lane(
        shared: Arc<Shared<Self>>,
        sandbox: SandboxId,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        while let Some(command) = commands.recv().await {
            let this = shared.executor();
            let Ok(_permit) = this.lifecycle_permits.clone().acquire_owned().await else {
                return;
            };
            let backend = this.backend.clone();
            let limits = this.limits.clone();
            tracing::debug!(command = command_name(&command), "run");
            let input = match command {
                Command::Start {
                    sandbox,
                    key,
                    spec,
                    resume_from,
                } => {
                    let request = StartRequest {
                        sandbox,
                        key,
                        spec,
                        resume_from,
                    };
                    let result = deadline(limits.start_timeout, backend.start(request)).await;
                    classify::start(sandbox, result)
                }
                Command::Stop { sandbox } => {
                    let result = deadline(limits.command_timeout, backend.stop(sandbox)).await;
                    classify::stop(sandbox, result)
                }
                Command::Persist { sandbox, snapshot } => {
                    let result =
                        deadline(limits.command_timeout, backend.persist(sandbox, snapshot)).await;
                    classify::persist(sandbox, result)
                }
                Command::Shutdown { sandbox } => {
                    let result = deadline(limits.command_timeout, backend.shutdown(sandbox)).await;
                    classify::shutdown(sandbox, result)
                }
                other => {
                    tracing::error!(command = ?other, "not a lifecycle command");
                    continue;
                }
            };
            tracing::debug!(answer = ?input, "answer");
            Shared::answer(&shared, input);
        }
        tracing::trace!(sandbox = %sandbox, "lane ended");
    }

    fn spawn_upload(&self, shared: &Arc<Shared<Self>>, request: UploadRequest) {
        let upload = request.upload;
        let span = tracing::info_span!(
            "upload",
            upload = %upload,
            sandbox = %request.sandbox,
            session = %request.session,
            path = %request.path,
            version = %request.version,
        );
        let shared2 = shared.clone();
        let permits = self.upload_permits.clone();
        let backend = self.backend.clone();
        let timeout = self.limits.upload_timeout;
        // The map is locked while spawning, so the task cannot forget itself before it is
        // remembered.
        let mut uploads = lock_std(&self.uploads);
        let task = self.runtime.spawn(
            async move {
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                let result = deadline(timeout, backend.upload(request)).await;
                let input = classify::upload(upload, result);
                tracing::debug!(answer = ?input, "upload answered");
                lock_std(&shared2.executor().uploads).remove(&upload);
                Shared::answer(&shared2, input);
            }
            .instrument(span),
        );
        uploads.insert(upload, task.abort_handle());
    }
}

impl<B: Backend> Executor for TokioExecutor<B> {
    fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        Instant::from_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }

    fn execute(&self, shared: &Arc<Shared<Self>>, command: Command) {
        match command {
            Command::Upload {
                upload,
                sandbox,
                session,
                path,
                version,
                payload,
            } => self.spawn_upload(
                shared,
                UploadRequest {
                    upload,
                    sandbox,
                    session,
                    path,
                    version,
                    payload,
                },
            ),
            Command::CancelUpload { upload, sandbox } => {
                if let Some(task) = lock_std(&self.uploads).remove(&upload) {
                    tracing::debug!(upload = %upload, sandbox = %sandbox, "upload cancelled");
                    task.abort();
                }
            }
            Command::Drain { sandbox, sessions } => {
                tracing::debug!(sandbox = %sandbox, sessions = sessions.len(), "drain");
                self.publish(Notice::Drain { sandbox, sessions });
            }
            lifecycle => self.lane_send(shared, lifecycle),
        }
    }

    fn observe(&self, event: &Event) {
        self.publish(Notice::Event(event.clone()));
    }

    fn rearm(&self, _deadline: Option<Instant>) {
        // A stored permit: the timer task sees it even if it was not waiting yet.
        self.timer.notify_one();
    }
}

/// Runs `op` under the driver-side deadline.
async fn deadline<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(limit, op).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::timeout(format!("no answer within {limit:?}"))),
    }
}

fn lock_std<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn command_name(command: &Command) -> &'static str {
    match command {
        Command::Start { .. } => "start",
        Command::Upload { .. } => "upload",
        Command::CancelUpload { .. } => "cancel-upload",
        Command::Drain { .. } => "drain",
        Command::Stop { .. } => "stop",
        Command::Persist { .. } => "persist",
        Command::Shutdown { .. } => "shutdown",
    }
}
