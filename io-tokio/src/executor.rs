//! The tokio executor: runs the core's commands on a [`Backend`], concurrently, with explicit
//! limits, and feeds every answer back to the core. It keeps the drain contract of
//! `sandkeeper`'s crate docs and decides nothing: every command says what to do and by when.
//!
//! # How commands run
//!
//! - **Lifecycle commands** (Start, Stop, Persist, Shutdown) of one sandbox run one after the
//!   other on that sandbox's *lane*, a task fed in the core's order; lanes of different
//!   sandboxes run side by side. A lane holds at most four commands over its life (the core
//!   orders at most one of each per sandbox), so its channel is bounded by construction. It ends
//!   after the sandbox's last command: its Shutdown, or a `Persist { suspend: true }` (which the
//!   command itself says is last when it succeeds; if it fails, the Shutdown that follows gets a
//!   lane of its own).
//! - **Abandon** drops the sandbox's outstanding Start, Stop or Persist (or stops it waiting for
//!   its permit); the lane then runs the Shutdown that the core ordered right after, at once.
//!   No answer is given for the dropped command. A backend's operations must therefore be
//!   cancellation-safe (see [`Backend`]).
//! - **Uploads** run each in its own task, never on a lane: a hung upload of one session never
//!   delays another session's upload, release, drain or any lifecycle command. `CancelUpload`
//!   aborts the task (its future is dropped at its next await point).
//! - **Drain** is published as a [`Notice::Drain`] for the sessions' background writers.
//! - **Deadlines** are the core's, carried by each command and mapped to tokio's clock from the
//!   keeper's origin. At its deadline an operation (its wait for a permit included) is dropped
//!   and nothing is answered: the core's timer fires at that same instant and decides. The
//!   executor has no timeouts of its own.
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
//! upload task ends when its upload answers, at its deadline, or the moment the core cancels
//! it). An application whose backend needs a tighter bound lowers those two core limits; one
//! hung session can occupy at most `max_paths_per_session` uploads, and only its own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};

use sandkeeper::{Command, Event, HookPoint, Instant, SandboxId, StoreCommand, UploadId};
use sandkeeper_shell::{Executor, Shared};
use tokio::runtime::Handle;
use tokio::sync::{broadcast, mpsc, oneshot, Notify, Semaphore};
use tokio::task::AbortHandle;
use tracing::Instrument;

use crate::backend::{
    AdoptRequest, Backend, DiscardRequest, PersistRequest, StartRequest, StopRequest, UploadRequest,
};
use crate::classify;
use crate::clock::WallClock;
use crate::notice::Notice;
use crate::store::FleetRun;
use crate::store::Swept;

/// The application's hooks, as the executor runs them: the keeper made it from the
/// application's closure ([`Keeper::with_hooks`](crate::Keeper::with_hooks)), where the
/// backend's operations are known.
pub(crate) type HookRunner<B> = Arc<
    dyn Fn(
            Arc<Shared<TokioExecutor<B>>>,
            SandboxId,
            HookPoint,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// Runs commands on tokio tasks against a backend.
pub(crate) struct TokioExecutor<B: Backend> {
    /// The application's hooks, if it registered any.
    hooks: Option<HookRunner<B>>,
    backend: Arc<B>,
    runtime: Handle,
    /// The core's clock on tokio's, and both on the wall clock.
    clock: WallClock,
    /// Fleet mode: the store and this process's incarnation.
    fleet: Option<FleetRun>,
    lifecycle_permits: Arc<Semaphore>,
    /// The lane of each sandbox with lifecycle work ahead.
    lanes: StdMutex<HashMap<SandboxId, mpsc::UnboundedSender<LaneCommand>>>,
    /// The outstanding Start, Stop or Persist of each sandbox (at most one: the core awaits one
    /// answer at a time), with the switch that abandons it.
    outstanding: StdMutex<HashMap<SandboxId, Outstanding>>,
    /// Uploads running, to cancel.
    uploads: StdMutex<HashMap<UploadId, AbortHandle>>,
    /// Fleet mode: what the sweeps removed so far.
    swept: StdMutex<Swept>,
    /// Wakes the timer task when the core's deadline changes.
    timer: Arc<Notify>,
    notices: broadcast::Sender<Notice>,
    /// `true` until the core reports `Closed`; dropped with the keeper. A backend's death
    /// watch waits on it ([`DeathSink::stopped`](crate::DeathSink::stopped)) instead of
    /// polling.
    listening: tokio::sync::watch::Sender<bool>,
}

/// A lifecycle command handed to a lane and not yet ended.
struct Outstanding {
    start: bool,
    abandon: oneshot::Sender<()>,
}

impl<B: Backend> TokioExecutor<B> {
    pub(crate) fn new(
        hooks: Option<HookRunner<B>>,
        backend: Arc<B>,
        runtime: Handle,
        fleet: Option<FleetRun>,
        max_lifecycle_ops: usize,
        timer: Arc<Notify>,
        notices: broadcast::Sender<Notice>,
    ) -> Self {
        TokioExecutor {
            hooks,
            lifecycle_permits: Arc::new(Semaphore::new(max_lifecycle_ops)),
            backend,
            runtime,
            // The core's origin: now.
            clock: WallClock::new(tokio::time::Instant::now()),
            fleet,
            lanes: StdMutex::new(HashMap::new()),
            outstanding: StdMutex::new(HashMap::new()),
            uploads: StdMutex::new(HashMap::new()),
            swept: StdMutex::new(Swept::default()),
            timer,
            notices,
            listening: tokio::sync::watch::channel(true).0,
        }
    }

    /// A receiver of whether the keeper still listens (see `listening`).
    pub(crate) fn listening(&self) -> tokio::sync::watch::Receiver<bool> {
        self.listening.subscribe()
    }

    pub(crate) fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    pub(crate) fn clock(&self) -> WallClock {
        self.clock
    }

    pub(crate) fn notices(&self) -> &broadcast::Sender<Notice> {
        &self.notices
    }

    /// The incarnation the fleet's store handed this process (fleet mode only).
    pub(crate) fn incarnation(&self) -> Option<u32> {
        self.fleet.as_ref().map(|f| f.incarnation)
    }

    /// What the fleet sweeps removed so far.
    pub(crate) fn swept(&self) -> Swept {
        *lock_std(&self.swept)
    }

    /// Adds one sweep's removals.
    pub(crate) fn note_swept(&self, swept: Swept) {
        *lock_std(&self.swept) += swept;
    }

    /// Uploads running now (for tests and reports).
    pub(crate) fn uploads_running(&self) -> usize {
        lock_std(&self.uploads).len()
    }

    /// Starts handed to lanes and not yet ended: answered, dropped at their deadline or
    /// abandoned (for tests and reports).
    pub(crate) fn starts_running(&self) -> usize {
        lock_std(&self.outstanding)
            .values()
            .filter(|o| o.start)
            .count()
    }

    /// The tokio instant of a core deadline.
    fn instant(&self, deadline: Instant) -> tokio::time::Instant {
        self.clock.tokio(deadline)
    }

    fn publish(&self, notice: Notice) {
        if self.notices.receiver_count() > 0 {
            // A lagging subscriber loses the oldest notices; the send never blocks.
            let _ = self.notices.send(notice);
        }
    }

    fn lane_send(&self, shared: &Arc<Shared<Self>>, command: Command) {
        let sandbox = command.sandbox();
        // The command says whether it is the sandbox's last: a Shutdown or a Relinquish always,
        // a Persist that suspends when it succeeds.
        let last = matches!(
            command,
            Command::Shutdown { .. }
                | Command::Relinquish { .. }
                | Command::Persist { suspend: true, .. }
        );
        let abandon = match command {
            Command::Start { .. }
            | Command::Adopt { .. }
            | Command::Stop { .. }
            | Command::Persist { .. }
            | Command::Hook { .. } => {
                let (switch, abandon) = oneshot::channel();
                let previous = lock_std(&self.outstanding).insert(
                    sandbox,
                    Outstanding {
                        start: matches!(command, Command::Start { .. } | Command::Adopt { .. }),
                        abandon: switch,
                    },
                );
                debug_assert!(previous.is_none(), "two outstanding commands for {sandbox}");
                Some(abandon)
            }
            _ => None,
        };
        let deadline = command.deadline().map(|at| self.instant(at));
        let mut lanes = lock_std(&self.lanes);
        let sender = lanes.entry(sandbox).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let span = tracing::info_span!("sandbox", sandbox = %sandbox);
            self.runtime
                .spawn(Self::lane(Arc::downgrade(shared), sandbox, rx).instrument(span));
            tx
        });
        let lane_command = LaneCommand {
            command,
            deadline,
            abandon,
        };
        if sender.send(lane_command).is_err() {
            tracing::error!(sandbox = %sandbox, "lane ended before its last command");
        }
        if last {
            lanes.remove(&sandbox);
        }
    }

    /// Drops the sandbox's outstanding Start, Stop or Persist.
    fn abandon(&self, sandbox: SandboxId) {
        if let Some(o) = lock_std(&self.outstanding).remove(&sandbox) {
            tracing::debug!(sandbox = %sandbox, "abandoned");
            let _ = o.abandon.send(());
        }
    }

    /// One sandbox's lifecycle commands, in order.
    ///
    /// It holds the shell weakly while it waits for the next command (a warm sandbox's lane
    /// waits as long as the sandbox is up): a keeper dropped without close is gone, its timer
    /// and renewals with it, rather than kept alive by its lanes.
    async fn lane(
        shared: std::sync::Weak<Shared<Self>>,
        sandbox: SandboxId,
        mut commands: mpsc::UnboundedReceiver<LaneCommand>,
    ) {
        while let Some(LaneCommand {
            command,
            deadline,
            abandon,
        }) = commands.recv().await
        {
            let Some(shared) = shared.upgrade() else {
                tracing::debug!(sandbox = %sandbox, "keeper gone: lane ends");
                return;
            };
            let this = shared.executor();
            let permits = this.lifecycle_permits.clone();
            let backend = this.backend.clone();
            let name = command.name();
            // A sandbox's last command (its Shutdown, or letting it go) leaves nothing
            // outstanding to forget: its lane ends with it.
            let last = matches!(
                command,
                Command::Shutdown { .. } | Command::Relinquish { .. }
            );
            tracing::debug!(command = name, "run");
            let run = async {
                let _permit = permits.acquire_owned().await.ok()?;
                Some(match command {
                    Command::Start {
                        sandbox,
                        key,
                        spec,
                        resume_from,
                        resumes,
                        token,
                        ..
                    } => {
                        let request = StartRequest {
                            sandbox,
                            key,
                            spec,
                            resume_from,
                            resumes,
                            token,
                        };
                        classify::start(sandbox, backend.start(request).await)
                    }
                    Command::Stop {
                        sandbox,
                        suspend,
                        token,
                        ..
                    } => {
                        let request = StopRequest {
                            sandbox,
                            suspend,
                            token,
                        };
                        classify::stop(sandbox, backend.stop(request).await)
                    }
                    Command::Persist {
                        sandbox,
                        snapshot,
                        suspend,
                        retain_until,
                        token,
                        ..
                    } => {
                        let request = PersistRequest {
                            sandbox,
                            snapshot,
                            suspend,
                            retain_until: retain_until.map(|at| this.clock.wall(at)),
                            token,
                        };
                        classify::persist(sandbox, backend.persist(request).await)
                    }
                    Command::Shutdown { sandbox, token, .. } => {
                        classify::shutdown(sandbox, backend.shutdown(sandbox, token).await)
                    }
                    Command::Adopt {
                        sandbox,
                        key,
                        token,
                        ..
                    } => {
                        let request = AdoptRequest {
                            sandbox,
                            key,
                            token,
                        };
                        classify::adopt(sandbox, backend.adopt(request).await)
                    }
                    Command::Relinquish { sandbox } => {
                        // No answer: the core forgot the sandbox when it ordered this.
                        backend.relinquish(sandbox).await;
                        return None;
                    }
                    Command::Hook { sandbox, hook, .. } => {
                        // The keeper refuses a configuration with hooks and no runner.
                        let runner = this.hooks.clone().expect("hooks registered");
                        match runner(shared.clone(), sandbox, hook).await {
                            Ok(()) => sandkeeper::Input::HookOk { sandbox },
                            Err(why) => {
                                tracing::warn!(hook = hook.as_str(), %why, "hook failed");
                                sandkeeper::Input::HookFailed { sandbox }
                            }
                        }
                    }
                    other => unreachable!("{} is not a lifecycle command", other.name()),
                })
            };
            let result = tokio::select! {
                biased;
                () = abandoned(abandon) => None,
                result = until(deadline, run) => result.flatten(),
            };
            if !last {
                lock_std(&this.outstanding).remove(&sandbox);
            }
            let Some(input) = result else {
                tracing::debug!(command = name, "dropped: abandoned or past its deadline");
                continue;
            };
            tracing::debug!(answer = ?input, "answer");
            Shared::answer(&shared, input);
        }
        tracing::trace!(sandbox = %sandbox, "lane ended");
    }

    fn spawn_upload(
        &self,
        shared: &Arc<Shared<Self>>,
        request: UploadRequest,
        deadline: tokio::time::Instant,
    ) {
        let upload = request.upload;
        let sandbox = request.sandbox;
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
        // The map is locked while spawning, so the task cannot forget itself before it is
        // remembered.
        let mut uploads = lock_std(&self.uploads);
        let task = self.runtime.spawn(
            async move {
                let result = until(Some(deadline), backend.upload(request)).await;
                lock_std(&shared2.executor().uploads).remove(&upload);
                let Some(result) = result else {
                    tracing::debug!("upload dropped at its deadline");
                    return;
                };
                let input = classify::upload(upload, sandbox, result);
                tracing::debug!(answer = ?input, "upload answered");
                Shared::answer(&shared2, input);
            }
            .instrument(span),
        );
        uploads.insert(upload, task.abort_handle());
    }
}

impl<B: Backend> Executor for TokioExecutor<B> {
    fn now(&self) -> Instant {
        self.clock.now()
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
                deadline,
                token,
            } => {
                let deadline = self.instant(deadline);
                let request = UploadRequest {
                    upload,
                    sandbox,
                    session,
                    path,
                    version,
                    payload,
                    token,
                };
                self.spawn_upload(shared, request, deadline)
            }
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
            Command::Abandon { sandbox } => self.abandon(sandbox),
            Command::Relinquish { sandbox } => {
                // Drops what is outstanding on the sandbox; the lane then runs the Relinquish
                // (its last command) at once.
                self.abandon(sandbox);
                self.lane_send(shared, Command::Relinquish { sandbox });
            }
            Command::Discard {
                sandbox,
                key,
                snapshot,
                reason,
                token,
            } => {
                let request = DiscardRequest {
                    sandbox,
                    key,
                    snapshot,
                    reason,
                    token,
                };
                let backend = self.backend.clone();
                let span = tracing::info_span!("discard", sandbox = %sandbox);
                // Beside everything, no answer: a snapshot the backend fails to delete goes at
                // its recorded expiry.
                self.runtime.spawn(
                    async move {
                        match backend.discard(request).await {
                            Ok(()) => tracing::debug!(?reason, "snapshot discarded"),
                            Err(e) => tracing::warn!(error = %e, "discard failed: the snapshot goes at its recorded expiry"),
                        }
                    }
                    .instrument(span),
                );
            }
            lifecycle => self.lane_send(shared, lifecycle),
        }
    }

    fn store(&self, shared: &Arc<Shared<Self>>, command: StoreCommand) {
        let Some(fleet) = self.fleet.clone() else {
            // The keeper makes an executor with a store for every fleet configuration, and the
            // core orders store work only in fleet mode.
            tracing::error!(?command, "store work without a store: dropped");
            return;
        };
        let deadline = Some(self.instant(command.deadline()));
        let clock = self.clock;
        let shared = Arc::downgrade(shared);
        let span = tracing::info_span!("store", work = ?command);
        // Each on its own task: a renewal never waits behind a claim, a release or a sandbox.
        self.runtime.spawn(
            async move {
                let Some(input) = until(deadline, fleet.run(command, clock)).await else {
                    tracing::debug!("store work dropped at its deadline");
                    return;
                };
                tracing::debug!(answer = ?input, "store answered");
                if let Some(shared) = shared.upgrade() {
                    Shared::answer(&shared, input);
                }
            }
            .instrument(span),
        );
    }

    fn observe(&self, event: &Event) {
        if matches!(event, Event::Closed { .. }) {
            self.listening.send_replace(false);
        }
        self.publish(Notice::Event(event.clone()));
    }

    fn rearm(&self, _deadline: Option<Instant>) {
        // A stored permit: the timer task sees it even if it was not waiting yet.
        self.timer.notify_one();
    }
}

/// A lifecycle command for a lane, with its deadline on tokio's clock and, for a Start, Stop
/// or Persist, the switch that abandons it.
struct LaneCommand {
    command: Command,
    deadline: Option<tokio::time::Instant>,
    abandon: Option<oneshot::Receiver<()>>,
}

/// Resolves when the switch is thrown (or dropped: the executor is gone); never without one.
async fn abandoned(switch: Option<oneshot::Receiver<()>>) {
    match switch {
        Some(switch) => {
            let _ = switch.await;
        }
        None => std::future::pending().await,
    }
}

/// Runs `op` until the core's deadline: `None` once it has passed (the operation is dropped).
async fn until<T>(
    deadline: Option<tokio::time::Instant>,
    op: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, op).await.ok(),
        None => Some(op.await),
    }
}

fn lock_std<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
