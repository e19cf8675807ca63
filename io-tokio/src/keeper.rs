//! The keeper: one cloneable handle for the whole agent.

use std::sync::Arc;
use std::time::Duration;

use sandkeeper::{
    CallSpec, CloseReport, Config, HookPoint, Lifecycle, PathName, Payload, SandboxId,
    SandboxState, SessionId, Stats, Version,
};
use sandkeeper_shell::{KeeperError, Shared, Tally};
use tokio::sync::{broadcast, Notify};
use tracing::Instrument;

use crate::backend::{Backend, DeathSink, Loss};
use crate::executor::{HookRunner, TokioExecutor};
use crate::guard::CallGuard;
use crate::notice::Notice;
use crate::ops::{SandboxOps, SandboxWork};
use crate::store::Swept;
use crate::store::{FleetRun, FleetStore};
use crate::timer;
use std::future::Future;

/// How a keeper runs: the core's configuration plus the driver's own limits.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// The core's configuration (scope, same-key and release policy, deadlines, limits).
    pub core: Config,
    /// Lifecycle operations (start, stop, persist, shutdown) running on the backend at once.
    /// More wait in FIFO order. Default 32.
    ///
    /// Uploads have no pool: a pool shared by sessions would let hung uploads of some sessions
    /// hold every slot another session needs. The core bounds them instead, to one per
    /// (session, path): at most `core.limits.max_active_sessions x
    /// core.limits.max_paths_per_session` run at once, and a hung session occupies at most
    /// `max_paths_per_session` of them, until its `upload_timeout`. Lower those two limits to
    /// bound a backend's upload concurrency.
    pub max_lifecycle_ops: usize,
    /// Notices kept for each subscriber; a subscriber that falls further behind loses the
    /// oldest (and is told how many). Default 1024.
    pub notice_capacity: usize,
    /// Fleet mode: how often this process sweeps the shared backend (see
    /// [`FleetStore::sweep`]); `None`: never (the renewals and handoffs go on regardless).
    /// Default every minute, the first at start-up.
    pub fleet_sweep: Option<Duration>,
}

impl Default for KeeperConfig {
    fn default() -> Self {
        KeeperConfig {
            core: Config::default(),
            max_lifecycle_ops: 32,
            notice_capacity: 1024,
            fleet_sweep: Some(Duration::from_secs(60)),
        }
    }
}

impl KeeperConfig {
    /// The default driver limits around this core configuration.
    pub fn with_core(core: Config) -> Self {
        KeeperConfig {
            core,
            ..KeeperConfig::default()
        }
    }
}

/// The handle an application embeds: acquire sandboxes for calls, flush session files, resolve a
/// session's sandbox for context-free code, wait for one session's mirror, close. Cheap to clone;
/// every clone drives the same core.
///
/// Method groups: **calls** ([`acquire`](Self::acquire), then the [`CallGuard`]), **mirror**
/// ([`flush`](Self::flush), [`hold`](Self::hold), [`unhold`](Self::unhold),
/// [`mirror_settled`](Self::mirror_settled)), **lookup** ([`resolve`](Self::resolve),
/// [`sandbox_state`](Self::sandbox_state)), **end** ([`close`](Self::close)), **observation**
/// ([`subscribe`](Self::subscribe), [`stats`](Self::stats), [`tally`](Self::tally),
/// [`check_invariants`](Self::check_invariants)).
///
/// Close before dropping the last handle: close shuts every sandbox down. A keeper dropped
/// without close stops its timer and leaves running sandboxes to the backend's own expiry.
pub struct Keeper<B: Backend> {
    shared: Arc<Shared<TokioExecutor<B>>>,
}

impl<B: Backend> Clone for Keeper<B> {
    fn clone(&self) -> Self {
        Keeper {
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend> Keeper<B> {
    /// A keeper over `backend`. Must be called inside a tokio runtime: it spawns the timer task
    /// and the backend's death watcher there, and runs every command on that runtime.
    ///
    /// Errors: `Core(InvalidConfig)` for a bad core configuration, `InvalidConfig` for a zero
    /// driver limit.
    pub fn new(config: KeeperConfig, backend: B) -> Result<Self, KeeperError> {
        no_hook_timeouts(&config)?;
        Self::build(config, backend, None, None)
    }

    /// A keeper that is one process of a fleet (see `docs/fleet.md`): several processes
    /// share `backend` and `store`, and for every key other than a call's own they behave as one
    /// keeper would. `config.core.fleet` gives the lease timing; its `incarnation` is replaced
    /// by the one `store` hands this process now (no other process, and no earlier run of this
    /// one, has it). The keeper runs the core's store work (renewals on their own timer,
    /// claims, releases) on `store`, and the backend checks every command's fencing token.
    ///
    /// Errors: as [`new`](Self::new); `Unsupported` when `config.core.fleet` is `None`, when
    /// the backend does not serve fleet mode ([`Backend::FLEET`]), or naming the store's failure
    /// when it cannot register this process.
    pub async fn fleet(
        config: KeeperConfig,
        backend: B,
        store: impl FleetStore,
    ) -> Result<Self, KeeperError> {
        no_hook_timeouts(&config)?;
        Self::join(config, backend, Arc::new(store), None).await
    }

    /// Registers with the fleet's store, builds the keeper on it, and starts its sweeps.
    async fn join(
        mut config: KeeperConfig,
        backend: B,
        store: Arc<dyn FleetStore>,
        hooks: Option<HookRunner<B>>,
    ) -> Result<Self, KeeperError> {
        let Some(fleet) = config.core.fleet.as_mut() else {
            return Err(KeeperError::Unsupported(
                "Keeper::fleet needs config.core.fleet (the lease timing)".to_string(),
            ));
        };
        if !B::FLEET {
            return Err(KeeperError::Unsupported(format!(
                "the backend {} does not serve fleet mode (no token checks, no adoption)",
                std::any::type_name::<B>()
            )));
        }
        let incarnation = store
            .register()
            .await
            .map_err(|e| KeeperError::Unsupported(format!("fleet mode: {e}")))?;
        fleet.incarnation = incarnation;
        tracing::info!(incarnation, "registered with the fleet store");
        let sweep = config.fleet_sweep;
        let keeper = Self::build(
            config,
            backend,
            hooks,
            Some(FleetRun {
                store: store.clone(),
                incarnation,
            }),
        )?;
        if let Some(every) = sweep {
            let shared = Arc::downgrade(&keeper.shared);
            let listening = keeper.shared.executor().listening();
            tokio::spawn(
                sweeps(shared, listening, store, every).instrument(tracing::info_span!("sweep")),
            );
        }
        Ok(keeper)
    }

    /// Fleet mode: what this process's sweeps removed so far.
    pub fn swept(&self) -> Swept {
        self.shared.executor().swept()
    }

    fn build(
        config: KeeperConfig,
        backend: B,
        hooks: Option<HookRunner<B>>,
        fleet: Option<FleetRun>,
    ) -> Result<Self, KeeperError> {
        if config.max_lifecycle_ops == 0 {
            return Err(KeeperError::InvalidConfig(
                "max_lifecycle_ops must be at least 1",
            ));
        }
        if config.notice_capacity == 0 {
            return Err(KeeperError::InvalidConfig(
                "notice_capacity must be at least 1",
            ));
        }
        if config.core.fleet.is_some() != fleet.is_some() {
            // The core orders store work in fleet mode (renewals, claims); a keeper that ignored
            // it would lose its lease and fence every key. Refuse at start-up rather than
            // misbehave.
            return Err(KeeperError::Unsupported(
                "fleet mode (config.core.fleet) needs a store: make the keeper with Keeper::fleet"
                    .to_string(),
            ));
        }
        let core = Lifecycle::new(config.core.clone())?;
        backend
            .check_config(&config.core)
            .map_err(KeeperError::Unsupported)?;
        let runtime = tokio::runtime::Handle::current();
        let wake = Arc::new(Notify::new());
        let (notices, _) = broadcast::channel(config.notice_capacity);
        let backend = Arc::new(backend);
        let executor = TokioExecutor::new(
            hooks,
            backend.clone(),
            runtime.clone(),
            fleet,
            config.max_lifecycle_ops,
            wake.clone(),
            notices,
        );
        let stop = executor.listening();
        let shared = Shared::new(core, executor);
        runtime.spawn(
            timer::run(Arc::downgrade(&shared), wake).instrument(tracing::info_span!("timer")),
        );
        let weak = Arc::downgrade(&shared);
        let listening = weak.clone();
        let deaths = DeathSink::new(
            move |sandbox, loss| {
                let Some(shared) = weak.upgrade() else {
                    return false;
                };
                if shared.is_closed() {
                    return false;
                }
                tracing::info!(sandbox = %sandbox, ?loss, "backend reports a loss");
                let input = match loss {
                    Loss::Sandbox => sandkeeper::Input::Died { sandbox },
                    Loss::Instance => sandkeeper::Input::InstanceGone { sandbox },
                };
                Shared::answer(&shared, input);
                true
            },
            move || listening.upgrade().is_some_and(|s| !s.is_closed()),
            stop,
        );
        runtime.spawn(
            async move { backend.watch_deaths(deaths).await }
                .instrument(tracing::info_span!("deaths")),
        );
        Ok(Keeper { shared })
    }

    /// The backend the keeper runs on.
    pub fn backend(&self) -> &B {
        self.shared.executor().backend()
    }

    // ------------------------------------------------------------------------------------------
    // Calls

    /// Acquires a sandbox for a call: resolves once the call is ready (bound to a sandbox that
    /// is up) with a guard that releases the call when released or dropped.
    ///
    /// Cancellation-safe: dropping the future at any await point releases the call in the core
    /// (a sandbox started only for it is shut down when its start answers; a shared one is
    /// released or kept for the others). Before its first poll it has done nothing.
    ///
    /// Errors: `Core(..)` when the core refuses the call (closed, duplicate name, queue full,
    /// limit, missing user); `CallFailed` when it ended without becoming ready (start failed or
    /// timed out, waited too long, sandbox gone, refused by close); `Revoked`; `Closed`.
    pub async fn acquire(&self, spec: CallSpec) -> Result<CallGuard<B>, KeeperError> {
        let call = spec.call.clone();
        let session = spec.session.clone();
        let span = tracing::info_span!("call", call = %call, session = %session);
        let pending = span.in_scope(|| Shared::acquire(&self.shared, spec))?;
        let ticket = pending
            .ready()
            .instrument(span.clone())
            .await
            .map_err(|end| end.into_error(call))?;
        span.in_scope(|| tracing::debug!(sandbox = %ticket.sandbox(), "ready"));
        Ok(CallGuard::new(ticket, session, span))
    }

    // ------------------------------------------------------------------------------------------
    // Mirror

    /// Records the next version of `path` of `session` and returns it at once; the upload runs
    /// in the background into the session's own sandbox. Settles exactly once (see
    /// [`Notice`]s, [`tally`](Self::tally)).
    ///
    /// Errors: `Core(Closed)` after close (or during close for a session with nothing live),
    /// `Core(LimitExceeded)`.
    pub fn flush(
        &self,
        session: &SessionId,
        path: &PathName,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<Version, KeeperError> {
        Shared::flush(&self.shared, session, path, Payload::new(bytes))
    }

    /// Lets go of what `key` keeps for its next start (a suspended sandbox: a kill of a paused
    /// sandbox that is not resumed first): the backend is ordered to delete it, and the key's
    /// next call starts fresh. `false` when the key keeps nothing here.
    ///
    /// Errors: `Core(KeyInUse)` while the key has a sandbox or a call, `Core(Closed)`.
    pub fn drop_snapshot(&self, key: &sandkeeper::Key) -> Result<bool, KeeperError> {
        Shared::drop_snapshot(&self.shared, key)
    }

    /// A background writer of `session` promises a write: draining waits for it (bounded by the
    /// drain deadline). Errors: `Core(NoActiveSandbox)`, `Core(LimitExceeded)`, `Core(Closed)`.
    pub fn hold(&self, session: &SessionId) -> Result<(), KeeperError> {
        Shared::hold(&self.shared, session)
    }

    /// Lets one hold of `session` go. Errors: `Core(NotHeld)`, `Core(Closed)`.
    pub fn unhold(&self, session: &SessionId) -> Result<(), KeeperError> {
        Shared::unhold(&self.shared, session)
    }

    /// Waits until every version flushed for `session` so far has settled (uploaded, superseded
    /// or dropped). Other sessions' mirrors are never waited for.
    pub async fn mirror_settled(&self, session: &SessionId) {
        self.shared.mirror_settled(session).await;
    }

    // ------------------------------------------------------------------------------------------
    // Lookup

    /// The sandbox context-free code acting for `session` must use: the sandbox of a live call
    /// of that session, never another session's.
    ///
    /// Errors: `Core(NoActiveSandbox)`, `Core(SandboxGone)`, `Core(Closed)`.
    pub fn resolve(&self, session: &SessionId) -> Result<SandboxId, KeeperError> {
        self.shared.resolve(session)
    }

    /// Work for `session` in its sandbox, for code that acts for the session without its call
    /// (a memory writer, a tool run after the turn): the session's live call's sandbox, else
    /// its warm or draining one, entered in the same step so that it is not stopped under the
    /// work (up to the drain deadline); dropping the handle lets it go. Never another session's
    /// sandbox.
    ///
    /// Errors: `NoActiveSandbox` when the session has no sandbox its work may use (none, or it
    /// was ordered to stop); `Keeper(Core(LimitExceeded | Closed))`.
    pub fn session_work(
        &self,
        session: &SessionId,
    ) -> Result<crate::ops::SessionWork<B>, crate::ops::OpError>
    where
        B: crate::ops::SandboxOps,
    {
        crate::ops::SessionWork::enter(self.shared.clone(), session)
    }

    /// Resolves once the core no longer tracks `sandbox`: its way down ended (shut down,
    /// suspended: its snapshot is its key's now, left to the backend, or dead), or close
    /// finished. At once for a sandbox not tracked now.
    pub async fn sandbox_down(&self, sandbox: SandboxId) {
        self.shared.sandbox_down(sandbox).await;
    }

    /// The core's state of a sandbox it still tracks.
    pub fn sandbox_state(&self, sandbox: SandboxId) -> Option<SandboxState> {
        self.shared.with_core(|core| core.sandbox_state(sandbox))
    }

    // ------------------------------------------------------------------------------------------
    // End

    /// Closes: refuses new calls at once; live calls may still flush and release, and mirror
    /// work drains, until `deadline`; then what is left is revoked, every managed sandbox is
    /// shut down, and the report comes once every shutdown answered (or the core's
    /// `close_grace` passed). Calling it again waits for the same report.
    pub async fn close(&self, deadline: Duration) -> CloseReport {
        let wait = Shared::close(&self.shared, deadline);
        wait.instrument(tracing::info_span!("close"))
            .await
            .unwrap_or_default()
    }

    /// Whether close has begun.
    pub fn is_closing(&self) -> bool {
        self.shared.is_closing()
    }

    /// Whether close has finished.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    // ------------------------------------------------------------------------------------------
    // Observation

    /// Notices from now on: the core's events in order, and drains.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.shared.executor().notices().subscribe()
    }

    /// In fleet mode, the incarnation the fleet's store handed this process at
    /// [`fleet`](Self::fleet) (the owner its keys' entries and its sandboxes' ids name);
    /// `None` for a single keeper.
    pub fn incarnation(&self) -> Option<u32> {
        self.shared.executor().incarnation()
    }

    /// The core's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The driver's counts of the core's events (drops per reason, failures per kind, ...).
    pub fn tally(&self) -> Tally {
        self.shared.tally()
    }

    /// Checks the core's invariants and the driver's own (`no-command-after-closed`): `Err`
    /// says which broke, by name.
    pub fn check_invariants(&self) -> Result<(), sandkeeper::Violation> {
        self.shared.check_invariants()
    }

    /// Releases the core refused because the call had already ended (a guard released after
    /// close revoked it). Evidence for "every call ends exactly once".
    pub fn release_refusals(&self) -> u64 {
        self.shared.release_refusals()
    }

    /// Uploads running on the backend now.
    pub fn uploads_running(&self) -> usize {
        self.shared.executor().uploads_running()
    }

    /// Starts running on the backend now (a start the core abandoned, or one past its
    /// deadline, no longer counts).
    pub fn starts_running(&self) -> usize {
        self.shared.executor().starts_running()
    }

    /// Live calls, tracked sandboxes and whether the core is quiescent.
    pub fn load(&self) -> Load {
        self.shared.with_core(|core| Load {
            live_calls: core.live_calls(),
            tracked_sandboxes: core.tracked_sandboxes(),
            quiescent: core.is_quiescent(),
        })
    }
}

/// How much the core holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    /// Live calls (waiting, starting or bound).
    pub live_calls: usize,
    /// Sandboxes the core tracks, in any state.
    pub tracked_sandboxes: usize,
    /// Nothing live: no call, sandbox, upload, timer or undrained output.
    pub quiescent: bool,
}

impl<B: SandboxOps> Keeper<B> {
    /// A keeper that runs the application's `hooks` at the transitions its core configuration
    /// names ([`Hooks`](sandkeeper::Hooks): a timeout for each hook point it wants). The core
    /// orders each hook at its place and bounds it by its timeout; the keeper calls
    /// `hooks(point, work)` with the sandbox's operations ([`SandboxWork`]: exec, files) and
    /// answers the core with its outcome: `Err` (say why) or past the timeout fails an
    /// after-start or after-resume hook's start, and is reported
    /// ([`Event::HookFailed`](sandkeeper::Event::HookFailed)) for a before-suspend or
    /// before-stop hook while the way down goes on. A hook holds no call: it cannot acquire
    /// through the keeper it runs for without risking its own deadline, and needs not.
    ///
    /// Errors: as [`new`](Self::new).
    pub fn with_hooks<H, F>(config: KeeperConfig, backend: B, hooks: H) -> Result<Self, KeeperError>
    where
        H: Fn(HookPoint, SandboxWork<'static, B>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        Self::build(config, backend, Some(hook_runner(hooks)), None)
    }

    /// A fleet keeper ([`fleet`](Self::fleet)) that runs the application's `hooks`
    /// ([`with_hooks`](Self::with_hooks)). An adopted sandbox runs no after-start hook: its
    /// first owner ran it.
    ///
    /// Errors: as [`fleet`](Self::fleet).
    pub async fn fleet_with_hooks<H, F>(
        config: KeeperConfig,
        backend: B,
        store: impl FleetStore,
        hooks: H,
    ) -> Result<Self, KeeperError>
    where
        H: Fn(HookPoint, SandboxWork<'static, B>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        Self::join(config, backend, Arc::new(store), Some(hook_runner(hooks))).await
    }
}

/// The executor's runner of the application's hooks.
fn hook_runner<B, H, F>(hooks: H) -> HookRunner<B>
where
    B: SandboxOps,
    H: Fn(HookPoint, SandboxWork<'static, B>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    let hooks = Arc::new(hooks);
    Arc::new(move |shared, sandbox, point| {
        let work = SandboxWork::for_hook(shared, sandbox, point);
        Box::pin(hooks(point, work))
    })
}

/// Refuses a configuration with hook timeouts for a keeper made without hooks.
fn no_hook_timeouts(config: &KeeperConfig) -> Result<(), KeeperError> {
    let h = &config.core.hooks;
    if [
        h.after_start,
        h.after_resume,
        h.before_suspend,
        h.before_stop,
    ]
    .iter()
    .any(Option::is_some)
    {
        return Err(KeeperError::Unsupported(
            "the core's configuration has hook timeouts but no hook is registered: make the \
             keeper with Keeper::with_hooks (or Keeper::fleet_with_hooks)"
                .to_string(),
        ));
    }
    Ok(())
}

/// What this process's core holds, for the sweep's own rule: asked at each decision; a keeper
/// gone meanwhile holds everything (nothing of its own is swept).
fn own_snapshots<B: Backend>(
    shared: &std::sync::Weak<Shared<TokioExecutor<B>>>,
    incarnation: u32,
) -> crate::store::OwnSnapshots {
    let shared = shared.clone();
    let holds = move |snapshot: &sandkeeper::Snapshot| match shared.upgrade() {
        Some(shared) => shared.with_core(|core| core.holds_snapshot(snapshot)),
        None => true,
    };
    crate::store::OwnSnapshots {
        incarnation,
        holds: Arc::new(holds),
    }
}

/// Fleet mode's sweep, on its own task: every `every` (the first at once) until the keeper
/// closes or is dropped. Nothing else waits on it, and it waits on nothing but the store.
async fn sweeps<B: Backend>(
    shared: std::sync::Weak<Shared<TokioExecutor<B>>>,
    mut listening: tokio::sync::watch::Receiver<bool>,
    store: Arc<dyn FleetStore>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = listening.wait_for(|listening| !*listening) => return,
        }
        let (clock, incarnation) = match shared.upgrade() {
            Some(shared) if !shared.is_closed() => {
                let executor = shared.executor();
                (executor.clock(), executor.incarnation())
            }
            _ => return,
        };
        let now = clock.wall(clock.now());
        let swept = match incarnation {
            Some(incarnation) => store.sweep_own(now, own_snapshots(&shared, incarnation)),
            None => store.sweep(now),
        };
        match swept.await {
            Ok(swept) => {
                if let Some(shared) = shared.upgrade() {
                    shared.executor().note_swept(swept);
                }
            }
            Err(e) => tracing::warn!(error = %e, "sweep failed; the next one tries again"),
        }
    }
}
