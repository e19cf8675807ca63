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
//! - **A Start the core stops waiting for is abandoned.** When the core orders Stop or Shutdown
//!   of a sandbox whose Start is still outstanding (close revoked its calls, its start timed out,
//!   it died while starting), the lane drops the start future (or stops waiting for its permit)
//!   and runs the Shutdown at once; the core no longer awaits that start's answer, so none is
//!   given. A backend's start must therefore be cancellation-safe (see [`Backend`]).
//! - **Uploads** run each in its own task, never on a lane: a hung upload of one session never
//!   delays another session's upload, release, drain or any lifecycle command. `CancelUpload`
//!   aborts the task (its future is dropped at its next await point).
//! - **Drain** is published as a [`Notice::Drain`] for the sessions' background writers.
//!
//! # Limits
//!
//! At most [`KeeperConfig::max_lifecycle_ops`](crate::KeeperConfig) lifecycle operations run on
//! the backend at once; more wait for a permit in FIFO order.
//!
//! Uploads have **no shared pool**, on purpose: any pool shared by sessions lets enough hung
//! uploads of some sessions hold every slot, and another session's mirror and drain then wait
//! for a slot (R13 by the back door). Their number is bounded by the core instead: it has at
//! most one upload in flight per (session, path), a session has at most
//! `limits.max_paths_per_session` paths, and at most `limits.max_active_sessions` sessions are
//! active, so at most `max_active_sessions x max_paths_per_session` uploads run at once (an
//! upload task ends when its upload answers or the moment the core cancels it, at its
//! `upload_timeout` or when its sandbox goes). An application whose backend needs a tighter
//! bound lowers those two core limits; one hung session can occupy at most
//! `max_paths_per_session` uploads, and only its own.
//!
//! Every backend operation also runs under a driver-side deadline equal to the core's (start
//! timeout, upload timeout, command timeout), so a backend that never answers cannot hold a
//! lane or a permit forever. The core's own timer decides first: it fires no later than the
//! driver's deadline, and when both fall on the same instant, [`Shared::answer`] fires the
//! core's due timers before it applies the driver's answer, which is then stale.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sandkeeper::{Command, Event, Instant, SandboxId, UploadId};
use tokio::runtime::Handle;
use tokio::sync::{broadcast, mpsc, oneshot, Notify, Semaphore};
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
    /// The lane of each sandbox with lifecycle work ahead.
    lanes: StdMutex<HashMap<SandboxId, mpsc::UnboundedSender<LaneCommand>>>,
    /// Starts handed to a lane and not yet answered, each with the switch that abandons it.
    starts: StdMutex<HashMap<SandboxId, oneshot::Sender<()>>>,
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
            backend,
            runtime,
            origin,
            limits,
            lanes: StdMutex::new(HashMap::new()),
            starts: StdMutex::new(HashMap::new()),
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

    /// Starts handed to lanes and not yet answered nor abandoned (for tests and reports).
    pub(crate) fn starts_running(&self) -> usize {
        lock_std(&self.starts).len()
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
        let abandon = match command {
            Command::Start { .. } => {
                let (switch, abandon) = oneshot::channel();
                lock_std(&self.starts).insert(sandbox, switch);
                Some(abandon)
            }
            Command::Stop { .. } | Command::Shutdown { .. } => {
                // The core no longer awaits this sandbox's start: stop waiting for it, so the
                // command runs now rather than when the start answers or hits its deadline.
                if let Some(switch) = lock_std(&self.starts).remove(&sandbox) {
                    tracing::debug!(sandbox = %sandbox, "start abandoned");
                    let _ = switch.send(());
                }
                None
            }
            _ => None,
        };
        let mut lanes = lock_std(&self.lanes);
        let sender = lanes.entry(sandbox).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let span = tracing::info_span!("sandbox", sandbox = %sandbox);
            self.runtime
                .spawn(Self::lane(shared.clone(), sandbox, rx).instrument(span));
            tx
        });
        if sender.send(LaneCommand { command, abandon }).is_err() {
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
        mut commands: mpsc::UnboundedReceiver<LaneCommand>,
    ) {
        while let Some(LaneCommand { command, abandon }) = commands.recv().await {
            let this = shared.executor();
            let permits = this.lifecycle_permits.clone();
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
                    let run = async {
                        let _permit = permits.acquire_owned().await.ok()?;
                        Some(deadline(limits.start_timeout, backend.start(request)).await)
                    };
                    let abandoned = async {
                        match abandon {
                            // A dropped switch (the executor is gone) abandons too.
                            Some(abandon) => {
                                let _ = abandon.await;
                            }
                            None => std::future::pending().await,
                        }
                    };
                    let result = tokio::select! {
                        biased;
                        () = abandoned => None,
                        result = run => result,
                    };
                    lock_std(&this.starts).remove(&sandbox);
                    let Some(result) = result else {
                        tracing::debug!("start dropped: the core no longer awaits it");
                        continue;
                    };
                    classify::start(sandbox, result)
                }
                other => {
                    let Ok(_permit) = permits.acquire_owned().await else {
                        return;
                    };
                    match other {
                        Command::Stop { sandbox } => {
                            let result =
                                deadline(limits.command_timeout, backend.stop(sandbox)).await;
                            classify::stop(sandbox, result)
                        }
                        Command::Persist { sandbox, snapshot } => {
                            let result = deadline(
                                limits.command_timeout,
                                backend.persist(sandbox, snapshot),
                            )
                            .await;
                            classify::persist(sandbox, result)
                        }
                        Command::Shutdown { sandbox } => {
                            let result =
                                deadline(limits.command_timeout, backend.shutdown(sandbox)).await;
                            classify::shutdown(sandbox, result)
                        }
                        other => {
                            tracing::error!(command = ?other, "not a lifecycle command");
                            continue;
                        }
                    }
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
        let backend = self.backend.clone();
        let timeout = self.limits.upload_timeout;
        // The map is locked while spawning, so the task cannot forget itself before it is
        // remembered.
        let mut uploads = lock_std(&self.uploads);
        let task = self.runtime.spawn(
            async move {
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

/// A lifecycle command for a lane; a Start carries the switch that abandons it.
struct LaneCommand {
    command: Command,
    abandon: Option<oneshot::Receiver<()>>,
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
