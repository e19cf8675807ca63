//! The sandbox table: every E2B sandbox this server runs, with the keeper call that holds its
//! keeper sandbox, its team, its access token and its timeout.
//!
//! An E2B sandbox is one keeper call at a time on its session's key: create acquires it
//! ([`Registry::create`]), and the [`CallGuard`] stays here while the sandbox runs. Work in it
//! ([`Sandbox::lease`]) holds the guard for reading. Every transition takes it for writing, so
//! it waits for every lease (the in-flight file operations finish) and no two transitions of
//! one sandbox overlap:
//!
//! - kill and expiry ([`Registry::kill`]) take the sandbox out of the table first (new
//!   requests see it gone), kill its commands, then release the call asking `Shutdown` and
//!   wait for the release (the keeper drains, stops and deletes the workspace); a paused
//!   sandbox's kept workspace is dropped (`Keeper::drop_snapshot`), or, while its session's
//!   key is in use, resumed into and released the same way;
//! - pause, and expiry with `autoPause` ([`Registry::pause`]), kill its commands, then release
//!   the call asking `Suspend` (the keeper drains, stops and keeps the workspace for the
//!   session's next call); the sandbox stays in the table, paused;
//! - connect and resume of a paused sandbox ([`Registry::resume`]) acquire a new call on the
//!   same session: the keeper's Start resumes the kept workspace.
//!
//! The last release on a key decides its way down: sandboxes that share a session (metadata
//! `sandkeeper.session`) share one keeper sandbox, which a pause or kill of one of them leaves
//! running for the others.
//!
//! With `--fleet`, every change is also written to the sandbox table, which the replicas on
//! the root share (`replicated.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use sandkeeper::{CallId, CallSpec, SandboxState, SessionId, WayDown};
use sandkeeper_tokio::{CallGuard, Keeper, SandboxWork};
use subtle::ConstantTimeEq;
use tokio::sync::{watch, OwnedRwLockReadGuard, RwLock};
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::Team;
use crate::backend::SandboxBackend;
use crate::clock;
use crate::durable::Record;
use crate::envd::processes::Processes;
use crate::envd::watchers::Watchers;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::replicas::{Claimed, Replicas, Retention};

mod lost;
mod replicated;
mod unrecorded;

pub use replicated::SWEEP;
use replicated::{held, moved, Counted, Op, Recorded};

/// The guard of a sandbox's keeper call.
pub type Guard = CallGuard<SandboxBackend>;

/// What a create asked for, checked ([`crate::api`]).
#[derive(Clone, Debug)]
pub struct NewSandbox {
    /// The template asked for: recorded and shown, not interpreted (one kind of sandbox
    /// exists here: the local backend's workspace).
    pub template: String,
    /// Until it expires.
    pub timeout: Duration,
    /// The metadata, shown back by get and list.
    pub metadata: BTreeMap<String, String>,
    /// Variables for every command.
    pub env: Vec<(String, String)>,
    /// The keeper session named by the metadata, if any (else the sandbox id is the session).
    pub session: Option<SessionId>,
    /// At its timeout it is paused (`autoPause`), not killed.
    pub auto_pause: bool,
}

/// Where a sandbox is, with what belongs there.
enum Life {
    /// Running: its keeper call.
    Running(Guard),
    /// Paused: no call; its session's keeper sandbox is suspended (or, shared, runs on for
    /// the others).
    Paused,
    /// Killed: out of the table.
    Ended,
}

/// What [`Registry::resume`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// It was running already.
    WasRunning,
    /// It was paused, and runs again.
    Resumed,
}

/// One E2B sandbox.
pub struct Sandbox {
    /// Its id (`sbx` and 20 hex digits).
    pub id: String,
    /// Its team: no other team sees it.
    pub team: Team,
    /// The template the create named.
    pub template: String,
    /// The create's metadata.
    pub metadata: BTreeMap<String, String>,
    /// Variables for every command.
    pub env: Vec<(String, String)>,
    /// Its keeper session.
    pub session: SessionId,
    /// The envd access token (hex of 32 random bytes).
    token: String,
    /// When it was created.
    pub started: SystemTime,
    /// When it expires, by the wall clock (for the API).
    end_at: Mutex<SystemTime>,
    /// When it expires, for its timer.
    deadline: watch::Sender<Instant>,
    /// At its timeout it is paused, not killed.
    pub auto_pause: bool,
    /// Running with its keeper call, paused, or ended; every transition holds it for writing.
    life: Arc<RwLock<Life>>,
    /// The API's view of `life` (list, get, envd routing), set under its write lock.
    paused: AtomicBool,
    /// How many times it was resumed: its timer's generation, and its next call's name.
    resumes: AtomicU32,
    /// When it was last paused, in Unix milliseconds, as its record says (`--fleet`): what
    /// its retention counts from.
    paused_ms: AtomicU64,
    /// Its commands (envd's process service).
    pub processes: Processes,
    /// Its directory watches (envd's `WatchDir`, `CreateWatcher`): ended with its commands.
    pub watchers: Watchers,
    next_pid: AtomicU32,
}

/// The sandbox's call held for one piece of work: kill and pause wait for it.
pub struct Lease(OwnedRwLockReadGuard<Life, Guard>);

impl Lease {
    /// The call's work in its sandbox.
    pub fn work(&self) -> SandboxWork<'_, SandboxBackend> {
        self.0.work()
    }
}

impl Sandbox {
    /// The sandbox a table record describes, with no call: paused, or (`paused` false) a view
    /// of one running on another replica, until the end its record says. Error: its id and
    /// why, when the record names no valid team or session.
    fn of_record(record: Record, paused: bool) -> Result<Sandbox, (String, String)> {
        let why = |e: String| (record.id.clone(), e);
        let team = Team::new(&record.team).map_err(|_| why(format!("team {:?}", record.team)))?;
        let session = SessionId::new(&record.session).map_err(|e| why(e.to_string()))?;
        let end = if paused && !record.interrupted {
            clock::now()
        } else {
            clock::from_unix_ms(record.end_ms)
        };
        // A record older than the field: its retention counts from now.
        let paused_ms = match record.paused_ms {
            0 => clock::unix_ms(clock::now()),
            at => at,
        };
        Ok(Sandbox {
            id: record.id,
            team,
            template: record.template,
            metadata: record.metadata,
            env: record.env,
            session,
            token: record.token,
            started: clock::from_unix_ms(record.started_ms),
            end_at: Mutex::new(end),
            deadline: watch::channel(Instant::now()).0,
            auto_pause: record.auto_pause,
            life: Arc::new(RwLock::new(Life::Paused)),
            paused: AtomicBool::new(paused),
            resumes: AtomicU32::new(0),
            paused_ms: AtomicU64::new(paused_ms),
            processes: Processes::default(),
            watchers: Watchers::default(),
            next_pid: AtomicU32::new(1),
        })
    }

    /// Its record for the table, paused (no replica, no end) at its last pause.
    fn record(&self) -> Record {
        Record {
            id: self.id.clone(),
            team: self.team.to_string(),
            template: self.template.clone(),
            metadata: self.metadata.clone(),
            env: self.env.clone(),
            session: self.session.to_string(),
            token: self.token.clone(),
            started_ms: clock::unix_ms(self.started),
            auto_pause: self.auto_pause,
            runs_on: None,
            end_ms: 0,
            interrupted: false,
            paused_ms: self.paused_ms.load(Ordering::Acquire),
            killing: false,
            held_on: None,
        }
    }

    /// Notes that it was paused now: its retention counts from here.
    fn paused_now(&self) {
        self.paused_ms
            .store(clock::unix_ms(clock::now()), Ordering::Release);
    }

    /// Whether `token` is its access token (compared in constant time).
    pub fn token_matches(&self, token: &[u8]) -> bool {
        self.token.as_bytes().ct_eq(token).into()
    }

    /// Its access token, for the create and connect answers.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// When it expires.
    pub fn end_at(&self) -> SystemTime {
        *lock(&self.end_at)
    }

    /// The sandbox's call for one piece of work, or `None` while it is paused or once it was
    /// killed.
    pub async fn lease(&self) -> Option<Lease> {
        let held = self.life.clone().read_owned().await;
        OwnedRwLockReadGuard::try_map(held, |life| match life {
            Life::Running(guard) => Some(guard),
            Life::Paused | Life::Ended => None,
        })
        .ok()
        .map(Lease)
    }

    /// Whether it is paused (as the API shows it).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// A new process id in this sandbox.
    pub fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// Expires it `timeout` from now; with `only_longer`, only if that is later than now set.
    fn set_timeout(&self, timeout: Duration, only_longer: bool) {
        let now = Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now);
        if only_longer && deadline <= *self.deadline.borrow() {
            return;
        }
        *lock(&self.end_at) = clock::after(clock::now(), timeout);
        self.deadline.send_replace(deadline);
    }
}

/// Bounds of the table.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Running sandboxes one team may have at once (creating and resuming count; paused ones
    /// do not).
    pub sandboxes_per_team: usize,
    /// How long a paused sandbox is kept: past it, it is killed (its workspace deleted) as a
    /// kill of a paused sandbox is. `None`: until it is killed.
    pub paused_retention: Option<Duration>,
}

/// Every sandbox of this server.
pub struct Registry {
    keeper: Keeper<SandboxBackend>,
    limits: Limits,
    /// Why its backend cannot keep a paused sandbox, when it cannot
    /// ([`SandboxBackend::can_pause`]): pauses and `autoPause` are refused with it.
    cannot_pause: Option<String>,
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    /// The root's sandbox table and this replica (`--fleet`): paused sandboxes outlive the
    /// process, and the replicas on the root answer for each other's.
    replicas: Option<Replicas>,
    /// Writes of records that failed after the keeper acted, by sandbox id: made again by the
    /// sweeps ([`unrecorded`]).
    pending: Mutex<HashMap<String, (Arc<Sandbox>, unrecorded::Pending)>>,
}

#[derive(Default)]
struct Inner {
    /// By id (ids are ours, but lookups take request-chosen strings: std's hasher, seeded).
    sandboxes: HashMap<String, Arc<Sandbox>>,
    /// Sandboxes of each team, being created or live.
    per_team: HashMap<Team, usize>,
}

impl Registry {
    /// A table over `keeper`, counting into `metrics`; with `replicas`, every sandbox is
    /// recorded in the sandbox table (the keeper must then be a fleet keeper on the same root,
    /// whose store keeps the workspaces' records), and the paused ones recorded by an earlier
    /// process are taken back ([`restore`](Self::restore)).
    pub fn new(
        keeper: Keeper<SandboxBackend>,
        limits: Limits,
        metrics: Arc<Metrics>,
        replicas: Option<Replicas>,
    ) -> Arc<Self> {
        let cannot_pause = keeper.backend().can_pause(replicas.is_some()).err();
        Arc::new(Registry {
            keeper,
            limits,
            cannot_pause,
            inner: Mutex::default(),
            metrics,
            replicas,
            pending: Mutex::default(),
        })
    }

    /// The replicas on the root (`--fleet`).
    pub fn replicas(&self) -> Option<&Replicas> {
        self.replicas.as_ref()
    }

    /// The keeper.
    pub fn keeper(&self) -> &Keeper<SandboxBackend> {
        &self.keeper
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether a sandbox may be paused here: 501 naming why when the backend cannot keep a
    /// paused sandbox's workspace (Kubernetes in pod mode).
    pub fn pausable(&self) -> Result<(), ApiError> {
        match &self.cannot_pause {
            None => Ok(()),
            Some(why) => Err(ApiError::new(
                axum::http::StatusCode::NOT_IMPLEMENTED,
                format!(
                    "pausing is not supported on this server's {} backend: {why}",
                    self.keeper.backend().name()
                ),
            )),
        }
    }

    /// Creates a sandbox for `team`: acquires its keeper call and starts its timer. Nothing
    /// changes when it fails. Errors: 429 past the team's limit, 503 when the keeper refused or
    /// could not start the sandbox, or (`--fleet`) the sandbox table could not record it.
    pub async fn create(
        self: &Arc<Self>,
        team: Team,
        new: NewSandbox,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let began = Instant::now();
        let span = tracing::info_span!("create", team = %team);
        let created = self.create_now(team, new).instrument(span).await;
        let outcome = match &created {
            Ok(_) => "ok",
            Err(e) if e.status == axum::http::StatusCode::TOO_MANY_REQUESTS => "limit",
            Err(_) => "keeper",
        };
        self.metrics.count(&self.metrics.creates, outcome);
        self.metrics
            .time(&self.metrics.create_seconds, outcome, began.elapsed());
        created
    }

    async fn create_now(
        self: &Arc<Self>,
        team: Team,
        new: NewSandbox,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let slot = self.reserve(&team)?;
        self.within_fleet_limit(&team, Counted::Without).await?;
        let id = format!("sbx{}", random_hex(10)?);
        let session = match &new.session {
            Some(s) => s.clone(),
            None => SessionId::new(&id).map_err(|e| ApiError::internal(e.to_string()))?,
        };
        let call = CallId::new(&id).map_err(|e| ApiError::internal(e.to_string()))?;
        let guard = self
            .keeper
            .acquire(CallSpec::new(call, session.clone()))
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    format!("the keeper could not give a sandbox: {e}"),
                )
            })?;
        let now = Instant::now();
        let (deadline, expiry) = watch::channel(now.checked_add(new.timeout).unwrap_or(now));
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            team,
            template: new.template,
            metadata: new.metadata,
            env: new.env,
            session,
            token: random_hex(32)?,
            started: clock::now(),
            end_at: Mutex::new(clock::after(clock::now(), new.timeout)),
            deadline,
            auto_pause: new.auto_pause,
            life: Arc::new(RwLock::new(Life::Running(guard))),
            paused: AtomicBool::new(false),
            resumes: AtomicU32::new(0),
            paused_ms: AtomicU64::new(0),
            processes: Processes::default(),
            watchers: Watchers::default(),
            next_pid: AtomicU32::new(1),
        });
        slot.commit();
        lock(&self.inner)
            .sandboxes
            .insert(id.clone(), sandbox.clone());
        self.metrics.sandboxes.inc();
        if let Err(e) = self.try_record(&sandbox, Recorded::Running).await {
            // Not in the table: the other replicas and a later server would never know it,
            // so it is not made at all.
            self.undo_create(&sandbox).await;
            return Err(e);
        }
        if let Err(e) = self.within_fleet_limit(&sandbox.team, Counted::With).await {
            // Past the team's limit across the replicas (another replica made one meanwhile):
            // killed, as a kill does it (its record marked first).
            if let Some(taken) = self.take_out(&sandbox) {
                if let Err(refused) = self.finish(taken, "limit").await {
                    tracing::warn!(sandbox = %sandbox.id, error = %refused.message, "a create past the limit not taken back: the sweep and its timeout end it");
                }
            }
            return Err(e);
        }
        tokio::spawn(self.clone().timer(sandbox.clone(), 0, expiry));
        tracing::info!(sandbox = %sandbox.id, team = %sandbox.team, session = %sandbox.session, "created");
        Ok(sandbox)
    }

    /// Takes back a create whose record could not be written: out of the table, its call
    /// released asking `Shutdown`, its place given back.
    async fn undo_create(&self, sandbox: &Arc<Sandbox>) {
        self.take_out(sandbox);
        let mut life = sandbox.life.write().await;
        if let Life::Running(guard) = std::mem::replace(&mut *life, Life::Ended) {
            self.metrics.sandboxes.dec();
            self.give_back_slot(&sandbox.team);
            let released = guard.release_as(WayDown::Shutdown).await;
            tracing::warn!(sandbox = %sandbox.id, ?released, "a create not recorded: taken back");
        }
    }

    /// The sandbox `id` if it is `team`'s.
    pub fn get(&self, team: &Team, id: &str) -> Option<Arc<Sandbox>> {
        self.any(id).filter(|s| &s.team == team)
    }

    /// The sandbox `id`, whoever's.
    pub fn any(&self, id: &str) -> Option<Arc<Sandbox>> {
        lock(&self.inner).sandboxes.get(id).cloned()
    }

    /// Every sandbox, whoever's (for a signed URL, which names none).
    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        lock(&self.inner).sandboxes.values().cloned().collect()
    }

    /// `team`'s sandboxes, oldest first: with replicas (`--fleet`), those the sandbox table
    /// says run on the others too, and every paused one (a table that cannot be read is
    /// logged, and this replica's own are answered).
    pub async fn list(&self, team: &Team) -> Vec<Arc<Sandbox>> {
        let mut all: HashMap<String, Arc<Sandbox>> = lock(&self.inner)
            .sandboxes
            .values()
            .filter(|s| &s.team == team)
            .map(|s| (s.id.clone(), s.clone()))
            .collect();
        if let Some(replicas) = self.replicas.clone() {
            let me = replicas.me.clone();
            match replicas.table.load().await {
                Ok(records) => {
                    // The table is what is paused, and where the rest runs: what this replica
                    // thought paused may have been resumed elsewhere, or killed, since.
                    // A sandbox being killed is listed nowhere.
                    let records: Vec<_> = records.into_iter().filter(|r| !r.killing).collect();
                    let recorded: std::collections::HashSet<_> =
                        records.iter().map(|r| r.id.clone()).collect();
                    all.retain(|id, s| !s.is_paused() || recorded.contains(id));
                    for record in records {
                        let elsewhere = record.runs_on.as_ref().is_some_and(|r| r != &me);
                        let known = all
                            .get(&record.id)
                            .is_some_and(|s| !elsewhere || !s.is_paused());
                        if record.team != team.to_string() || known {
                            continue;
                        }
                        if let Ok(view) = Sandbox::of_record(record, !elsewhere) {
                            all.insert(view.id.clone(), Arc::new(view));
                        }
                    }
                }
                failed => tracing::error!(?failed, "the sandbox table could not be read"),
            }
        }
        let mut all: Vec<_> = all.into_values().collect();
        all.sort_by(|a, b| a.started.cmp(&b.started).then(a.id.cmp(&b.id)));
        all
    }

    /// Sets the timeout of `team`'s sandbox `id` (from now): the sandbox, or `None` when the
    /// team has none of that id.
    pub fn set_timeout(
        self: &Arc<Self>,
        team: &Team,
        id: &str,
        timeout: Duration,
        only_longer: bool,
    ) -> Option<Arc<Sandbox>> {
        let sandbox = self.get(team, id)?;
        sandbox.set_timeout(timeout, only_longer);
        if self.replicas.is_some() && !sandbox.is_paused() {
            // The other replicas' lists show the new end.
            let (registry, extended) = (self.clone(), sandbox.clone());
            tokio::spawn(async move { registry.record_end(&extended).await });
        }
        Some(sandbox)
    }

    /// Kills `team`'s sandbox `id` (see the module docs). `Ok(false)` when there is none; 409
    /// when another replica resumed it meanwhile (a retry is sent there). The kill runs on its
    /// own task: a caller that goes away does not stop it half-way.
    pub async fn kill(self: &Arc<Self>, team: &Team, id: &str) -> Result<bool, ApiError> {
        let taken = {
            let mut inner = lock(&self.inner);
            match inner.sandboxes.get(id) {
                Some(s) if &s.team == team => inner.sandboxes.remove(id),
                _ => None,
            }
        };
        let Some(sandbox) = taken else {
            return Ok(false);
        };
        let registry = self.clone();
        match tokio::spawn(async move { registry.finish(sandbox, "api").await }).await {
            Ok(Ok(Claimed::Done)) => Ok(true),
            Ok(Ok(Claimed::Gone)) => Ok(false),
            Ok(Ok(Claimed::RunsOn(replica))) => Err(moved(id, &replica)),
            Ok(Ok(Claimed::Held(replica))) => Err(held(id, &replica)),
            Ok(Err(refused)) => Err(refused),
            Err(e) => Err(ApiError::internal(format!("a kill's task failed: {e}"))),
        }
    }

    /// Ends every sandbox here (at shutdown): kills them all; with the sandbox table
    /// (`--fleet`), pauses the running ones instead, recorded as interrupted (the first envd
    /// request for one, on any replica of the root, resumes it), and leaves the paused ones.
    /// A running one that cannot be paused is killed.
    pub async fn kill_all(self: &Arc<Self>) {
        let keep = self.replicas.is_some();
        let all: Vec<_> = lock(&self.inner).sandboxes.values().cloned().collect();
        for sandbox in all {
            if keep && sandbox.is_paused() {
                continue;
            }
            if keep {
                let end = Recorded::Interrupted {
                    end: sandbox.end_at(),
                };
                match self.pause_now(&sandbox, "shutdown", end).await {
                    Ok(()) => continue,
                    Err(e) => {
                        tracing::warn!(sandbox = %sandbox.id, error = %e.message, "not paused at the end: killed")
                    }
                }
            }
            let taken = lock(&self.inner).sandboxes.remove(&sandbox.id);
            if let Some(sandbox) = taken {
                if let Err(e) = self.finish(sandbox, "shutdown").await {
                    tracing::error!(error = %e.message, "a sandbox not killed at the end");
                }
            }
        }
        lock(&self.inner).sandboxes.clear();
    }

    /// Ends a sandbox already out of the table (`reason`: for the metrics). Not `Done` when
    /// it was paused and another replica took it, or it was killed there, meanwhile: then
    /// nothing is done here. 503 when its kill could not be recorded (`--fleet`): it is put
    /// back as it was (its commands ended), nothing else done.
    async fn finish(
        &self,
        sandbox: Arc<Sandbox>,
        reason: &'static str,
    ) -> Result<Claimed, ApiError> {
        let span = tracing::info_span!(
            "kill",
            sandbox = %sandbox.id,
            team = %sandbox.team,
            session = %sandbox.session,
            reason,
        );
        self.finish_now(sandbox, reason).instrument(span).await
    }

    async fn finish_now(
        &self,
        sandbox: Arc<Sandbox>,
        reason: &'static str,
    ) -> Result<Claimed, ApiError> {
        let began = Instant::now();
        sandbox.processes.kill_all();
        sandbox.watchers.stop_all();
        let mut life = sandbox.life.write().await;
        if matches!(*life, Life::Ended) {
            return Ok(Claimed::Gone);
        }
        // Marked as being killed here in the sandbox table (`--fleet`) before the keeper acts,
        // and forgotten once the keeper deleted it: a crash in between leaves the kill to the
        // other replicas, never a workspace that nothing deletes. Not marked: not killed.
        let marked = match self.try_change_record(&sandbox, Op::Kill).await {
            Ok(marked) => marked,
            Err(e) => {
                drop(life);
                lock(&self.inner)
                    .sandboxes
                    .entry(sandbox.id.clone())
                    .or_insert(sandbox);
                return Err(e);
            }
        };
        let was = std::mem::replace(&mut *life, Life::Ended);
        let mut reached = true;
        let mut taken = None;
        let guard = match was {
            Life::Running(guard) => {
                self.metrics.sandboxes.dec();
                self.give_back_slot(&sandbox.team);
                if let Claimed::RunsOn(replica) = &marked {
                    // Taken by another replica while this one's lease had lapsed: its call
                    // here was fenced off; released, it changes nothing there.
                    taken = Some(replica.clone());
                }
                Some(guard)
            }
            Life::Paused => {
                self.metrics.paused.dec();
                if marked != Claimed::Done {
                    sandbox.paused.store(false, Ordering::Release);
                    tracing::info!(?marked, "not killed here: another replica has it");
                    return Ok(marked);
                }
                match self.let_go_paused(&sandbox).await {
                    Ok(guard) => guard,
                    Err(()) => {
                        reached = false;
                        None
                    }
                }
            }
            Life::Ended => return Ok(Claimed::Gone),
        };
        sandbox.paused.store(false, Ordering::Release);
        if let Some(guard) = guard {
            let keeper_sandbox = guard.sandbox();
            let released = guard.release_as(WayDown::Shutdown).await;
            // Deleted once its way down ended; not while it runs on for the other sandboxes
            // of a shared session (it is not going down).
            if self.keeper.sandbox_state(keeper_sandbox) != Some(SandboxState::Running) {
                self.keeper.sandbox_down(keeper_sandbox).await;
            }
            tracing::info!(sandbox = %sandbox.id, team = %sandbox.team, ?released, "killed");
        }
        match (marked == Claimed::Done, reached) {
            (true, true) => {
                self.forget_record(&sandbox).await;
            }
            (true, false) if self.replicas.is_some() => {
                // Still marked as being killed, by no replica: any replica's sweep tries again
                // (the workspace's host may come back), and the API answers it gone meanwhile.
                self.change_record(&sandbox, Op::LetKillGo).await;
                tracing::warn!(sandbox = %sandbox.id, "a kill could not reach the workspace: recorded, and tried again by the sweeps");
            }
            _ => {}
        }
        drop(life);
        self.metrics.count(&self.metrics.kills, reason);
        self.metrics
            .time(&self.metrics.kill_seconds, reason, began.elapsed());
        Ok(taken.map_or(Claimed::Done, Claimed::RunsOn))
    }

    /// What a kill of a paused sandbox does: the keeper drops what its session's key keeps
    /// (`Keeper::drop_snapshot`: the suspended workspace is deleted, nothing is started). When
    /// the key is in use (another sandbox of a shared session runs it, or the pause's own way
    /// down has not ended), a call resumes into it, to be released asking `Shutdown`: the last
    /// release on the key decides what goes.
    /// `Err`: its workspace could not be reached (its key's sandbox is on a host that is
    /// down), and nothing was deleted.
    async fn let_go_paused(&self, sandbox: &Sandbox) -> Result<Option<Guard>, ()> {
        let key = sandkeeper::Key::Session(sandbox.session.clone());
        match self.keeper.drop_snapshot(&key) {
            // In a fleet, a key this process released keeps its workspace in the store's
            // record, which only the key's owner rewrites: nothing dropped here means resume
            // into it (claiming the key) and release asking `Shutdown`.
            Ok(false) if self.replicas.is_some() => {
                tracing::debug!(sandbox = %sandbox.id, "resuming to kill (kept in the fleet store)");
            }
            Ok(dropped) => {
                tracing::info!(sandbox = %sandbox.id, dropped, "paused sandbox let go");
                return Ok(None);
            }
            Err(e) => tracing::debug!(sandbox = %sandbox.id, error = %e, "resuming to kill"),
        }
        match self.acquire(sandbox).await {
            Ok(guard) => Ok(Some(guard)),
            Err(e) => {
                tracing::warn!(sandbox = %sandbox.id, error = %e.message, "a paused sandbox could not be resumed to be killed: its workspace stays with the keeper");
                Err(())
            }
        }
    }

    /// Pauses `team`'s sandbox `id`: its commands end, its in-flight work finishes, and its
    /// call is released asking `Suspend` (the keeper drains, stops and keeps the workspace).
    /// Runs on its own task, as a kill. Errors: 404 (none of that id), 409 (paused already),
    /// 501 (the backend cannot pause).
    pub async fn pause(self: &Arc<Self>, team: &Team, id: &str) -> Result<(), ApiError> {
        let sandbox = self
            .get(team, id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        self.pausable()?;
        let registry = self.clone();
        tokio::spawn(async move { registry.pause_now(&sandbox, "api", Recorded::Paused).await })
            .await
            .map_err(|e| ApiError::internal(format!("a pause's task failed: {e}")))?
    }

    /// Pauses `sandbox`, recording it as `how` says (paused by its user, or interrupted by
    /// the server's end).
    async fn pause_now(
        self: &Arc<Self>,
        sandbox: &Arc<Sandbox>,
        reason: &'static str,
        how: Recorded,
    ) -> Result<(), ApiError> {
        let span = tracing::info_span!(
            "pause",
            sandbox = %sandbox.id,
            team = %sandbox.team,
            session = %sandbox.session,
            reason,
        );
        let began = Instant::now();
        let paused = async {
            sandbox.processes.kill_all();
            sandbox.watchers.stop_all();
            let mut life = sandbox.life.write().await;
            let guard = match std::mem::replace(&mut *life, Life::Paused) {
                Life::Running(guard) => guard,
                Life::Paused => {
                    return Err(ApiError::new(
                        axum::http::StatusCode::CONFLICT,
                        format!("sandbox {} is already paused", sandbox.id),
                    ))
                }
                Life::Ended => {
                    *life = Life::Ended;
                    return Err(ApiError::sandbox_not_found(&sandbox.id));
                }
            };
            sandbox.paused.store(true, Ordering::Release);
            let keeper_sandbox = guard.sandbox();
            let released = guard.release_as(WayDown::Suspend).await;
            // Paused once its workspace is kept (the keeper's Stop and Persist ran), so that a
            // kill that follows finds it its key's to drop. Not while it runs on for the other
            // sandboxes of a shared session (it is not going down).
            if self.keeper.sandbox_state(keeper_sandbox) != Some(SandboxState::Running) {
                self.keeper.sandbox_down(keeper_sandbox).await;
            }
            tracing::info!(?released, "paused");
            sandbox.paused_now();
            Ok(self.record(sandbox, how).await)
        }
        .instrument(span)
        .await;
        if paused.is_ok() {
            self.metrics.sandboxes.dec();
            self.metrics.paused.inc();
            self.give_back_slot(&sandbox.team);
        }
        let paused = match paused {
            Ok(Claimed::RunsOn(replica)) => {
                // Another replica took it while this one's lease had lapsed: the keeper here
                // was fenced off it, and the table keeps saying where it runs.
                self.evict(&sandbox.id).await;
                Err(moved(&sandbox.id, &replica))
            }
            Ok(_) => {
                self.start_retention(sandbox);
                Ok(())
            }
            Err(e) => Err(e),
        };
        let outcome = match &paused {
            Ok(()) => reason,
            Err(_) => "refused",
        };
        self.metrics
            .time(&self.metrics.pause_seconds, outcome, began.elapsed());
        paused
    }

    /// Resumes `team`'s sandbox `id` if it is paused (connect, resume): a new keeper call on
    /// its session, whose Start resumes the kept workspace; it then expires `timeout` from
    /// now. A running one is left as it is. Errors: 404, 429 (the team's limit), 503 (the
    /// keeper could not resume it; it stays paused).
    pub async fn resume(
        self: &Arc<Self>,
        team: &Team,
        id: &str,
        timeout: Duration,
    ) -> Result<(Arc<Sandbox>, Resumed), ApiError> {
        let sandbox = self
            .get(team, id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        let registry = self.clone();
        let task = sandbox.clone();
        let resumed =
            tokio::spawn(async move { registry.resume_now(task, timeout, Recorded::Paused).await })
                .await
                .map_err(|e| ApiError::internal(format!("a resume's task failed: {e}")))??;
        Ok((sandbox, resumed))
    }

    /// Resumes `sandbox` for `timeout` (see [`resume`](Self::resume)); one the keeper could
    /// not resume is recorded as `again` says (as it was before: paused by its user, or
    /// interrupted).
    async fn resume_now(
        self: Arc<Self>,
        sandbox: Arc<Sandbox>,
        timeout: Duration,
        again: Recorded,
    ) -> Result<Resumed, ApiError> {
        let span = tracing::info_span!(
            "resume",
            sandbox = %sandbox.id,
            team = %sandbox.team,
            session = %sandbox.session,
        );
        let began = Instant::now();
        let resumed = async {
            let mut life = sandbox.life.write().await;
            match &*life {
                Life::Running(_) => return Ok(Resumed::WasRunning),
                Life::Ended => return Err(ApiError::sandbox_not_found(&sandbox.id)),
                Life::Paused => {}
            }
            let slot = self.reserve(&sandbox.team)?;
            match self.try_change_record(&sandbox, Op::Take).await? {
                Claimed::Done => {}
                Claimed::Gone => {
                    drop(life);
                    self.evict(&sandbox.id).await;
                    return Err(ApiError::sandbox_not_found(&sandbox.id));
                }
                Claimed::RunsOn(replica) => {
                    drop(life);
                    self.evict(&sandbox.id).await;
                    return Err(moved(&sandbox.id, &replica));
                }
                Claimed::Held(replica) => return Err(held(&sandbox.id, &replica)),
            }
            if let Err(e) = self.within_fleet_limit(&sandbox.team, Counted::With).await {
                // Past the team's limit across the replicas: given back as it was.
                self.record(&sandbox, again).await;
                return Err(e);
            }
            let guard = match self.acquire(&sandbox).await {
                Ok(guard) => guard,
                Err(e) => {
                    // Still paused: recorded again as it was, and its retention (which the
                    // attempt's generation ended) starts anew.
                    sandbox.paused_now();
                    self.record(&sandbox, again).await;
                    self.start_retention(&sandbox);
                    return Err(e);
                }
            };
            *life = Life::Running(guard);
            sandbox.processes.reopen();
            sandbox.watchers.reopen();
            sandbox.paused.store(false, Ordering::Release);
            slot.commit();
            let generation = sandbox.resumes.load(Ordering::Acquire);
            sandbox.set_timeout(timeout, false);
            self.record(&sandbox, Recorded::Running).await;
            tokio::spawn(self.clone().timer(
                sandbox.clone(),
                generation,
                sandbox.deadline.subscribe(),
            ));
            tracing::info!("resumed");
            Ok(Resumed::Resumed)
        }
        .instrument(span)
        .await;
        if resumed == Ok(Resumed::Resumed) {
            self.metrics.paused.dec();
            self.metrics.sandboxes.inc();
        }
        if !matches!(resumed, Ok(Resumed::WasRunning)) {
            let outcome = if resumed.is_ok() { "ok" } else { "refused" };
            self.metrics
                .time(&self.metrics.resume_seconds, outcome, began.elapsed());
        }
        resumed
    }

    /// A new keeper call on the sandbox's session, named after the sandbox and how many times
    /// it was resumed (a call's name is used once). Error: 503.
    async fn acquire(&self, sandbox: &Sandbox) -> Result<Guard, ApiError> {
        let n = sandbox.resumes.fetch_add(1, Ordering::AcqRel) + 1;
        let call = CallId::new(format!("{}.r{n}", sandbox.id))
            .map_err(|e| ApiError::internal(e.to_string()))?;
        self.keeper
            .acquire(CallSpec::new(call, sandbox.session.clone()))
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    format!("the keeper could not resume sandbox {}: {e}", sandbox.id),
                )
            })
    }

    /// Kills or (`autoPause`) pauses the sandbox when its deadline passes; ends when it is
    /// paused or killed otherwise (a resume starts a timer of the next `generation`).
    async fn timer(
        self: Arc<Self>,
        sandbox: Arc<Sandbox>,
        generation: u32,
        mut expiry: watch::Receiver<Instant>,
    ) {
        loop {
            loop {
                let deadline = *expiry.borrow_and_update();
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => break,
                    changed = expiry.changed() => if changed.is_err() { return },
                }
            }
            // Not a timer of this sandbox's present life: paused or resumed since, or killed
            // (out of the table; a kill does not stop the timer, which ends at its deadline).
            let current = self
                .any(&sandbox.id)
                .is_some_and(|s| Arc::ptr_eq(&s, &sandbox));
            let stale =
                sandbox.resumes.load(Ordering::Acquire) != generation || sandbox.is_paused();
            if !current || stale {
                return;
            }
            if sandbox.auto_pause {
                tracing::info!(sandbox = %sandbox.id, "timeout: pausing");
                if let Err(e) = self.pause_now(&sandbox, "timeout", Recorded::Paused).await {
                    tracing::debug!(sandbox = %sandbox.id, error = %e.message, "timeout: not paused");
                }
                return;
            }
            let Some(taken) = self.take_out(&sandbox) else {
                return;
            };
            tracing::info!(sandbox = %taken.id, "timeout: killing");
            match self.finish(taken, "timeout").await {
                Ok(_) => return,
                Err(e) => {
                    // Put back, its kill not recorded: tried again a sweep's time later.
                    tracing::warn!(sandbox = %sandbox.id, error = %e.message, "timeout: the kill not recorded, tried again");
                    sandbox
                        .deadline
                        .send_replace(Instant::now() + replicated::SWEEP);
                }
            }
        }
    }

    /// Starts the retention of a sandbox just paused (or left paused), when there is one: for
    /// its present generation, so that a resume ends it.
    fn start_retention(self: &Arc<Self>, sandbox: &Arc<Sandbox>) {
        if let Some(retention) = self.limits.paused_retention {
            let generation = sandbox.resumes.load(Ordering::Acquire);
            tokio::spawn(
                self.clone()
                    .retention(sandbox.clone(), generation, retention),
            );
        }
    }

    /// Kills the sandbox `retention` after its pause unless it was resumed (or killed) since:
    /// the pause of `generation` is still its present life here, checked under its write
    /// lock, and (`--fleet`) the sandbox table still says that pause ([`Replicas::retain`]):
    /// paused again since by another replica, its retention counts from then.
    async fn retention(
        self: Arc<Self>,
        sandbox: Arc<Sandbox>,
        generation: u32,
        retention: Duration,
    ) {
        loop {
            let paused_ms = sandbox.paused_ms.load(Ordering::Acquire);
            let end = clock::after(clock::from_unix_ms(paused_ms), retention);
            let left = end.duration_since(clock::now()).unwrap_or_default();
            tokio::time::sleep(left).await;
            let life = sandbox.life.write().await;
            let same_pause = matches!(*life, Life::Paused)
                && sandbox.resumes.load(Ordering::Acquire) == generation
                && self
                    .any(&sandbox.id)
                    .is_some_and(|s| Arc::ptr_eq(&s, &sandbox));
            if !same_pause {
                return;
            }
            match self.retain(&sandbox, paused_ms).await {
                Retention::Kill => {}
                Retention::PausedSince(at) => {
                    tracing::info!(sandbox = %sandbox.id, "retention: paused again since by another replica, counted from then");
                    sandbox.paused_ms.store(at, Ordering::Release);
                    continue;
                }
                Retention::Moved => {
                    tracing::info!(sandbox = %sandbox.id, "retention: not here to act on: resumed or killed by another replica");
                    drop(life);
                    self.evict(&sandbox.id).await;
                    return;
                }
            }
            let taken = self.take_out(&sandbox);
            drop(life);
            if let Some(sandbox) = taken {
                tracing::info!(sandbox = %sandbox.id, "paused past its retention: killing");
                if let Err(e) = self.finish(sandbox, "retention").await {
                    tracing::error!(error = %e.message, "retention: the kill not recorded");
                }
            }
            return;
        }
    }

    /// Takes `sandbox` out of the table if it is still this very sandbox there (not one put in
    /// its place since): new requests find it gone.
    fn take_out(&self, sandbox: &Arc<Sandbox>) -> Option<Arc<Sandbox>> {
        let mut inner = lock(&self.inner);
        match inner.sandboxes.get(&sandbox.id) {
            Some(s) if Arc::ptr_eq(s, sandbox) => inner.sandboxes.remove(&sandbox.id),
            _ => None,
        }
    }

    /// A running sandbox of `team` stopped counting against its limit.
    fn give_back_slot(&self, team: &Team) {
        let mut inner = lock(&self.inner);
        if let Some(n) = inner.per_team.get_mut(team) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.per_team.remove(team);
            }
        }
    }

    /// A slot for one more sandbox of `team`, or 429.
    fn reserve(self: &Arc<Self>, team: &Team) -> Result<Slot, ApiError> {
        let mut inner = lock(&self.inner);
        let n = inner.per_team.entry(team.clone()).or_insert(0);
        if *n >= self.limits.sandboxes_per_team {
            return Err(past_limit(team, self.limits.sandboxes_per_team));
        }
        *n += 1;
        Ok(Slot {
            registry: self.clone(),
            team: team.clone(),
            committed: false,
        })
    }
}

/// 429: `team` has its `limit` of running sandboxes.
fn past_limit(team: &Team, limit: usize) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        format!("team {team} has {limit} sandboxes, its limit: kill one first"),
    )
}

/// A team's place for a sandbox being created; given back unless committed.
struct Slot {
    registry: Arc<Registry>,
    team: Team,
    committed: bool,
}

impl Slot {
    fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut inner = lock(&self.registry.inner);
        if let Some(n) = inner.per_team.get_mut(&self.team) {
            *n = n.saturating_sub(1);
        }
    }
}

/// `n` random bytes as hex, from the OS (sandbox ids, access tokens, watcher ids).
pub(crate) fn random_hex(n: usize) -> Result<String, ApiError> {
    let mut bytes = vec![0u8; n];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(bytes))
}

/// A std mutex's content; a poisoned one is taken as it is (every update here is one step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
