//! The sandbox table: every E2B sandbox this server runs, with the keeper call that holds its
//! keeper sandbox, its team, its access token and its timeout.
//!
//! An E2B sandbox is one keeper call: create acquires it ([`Registry::create`]), and the
//! [`CallGuard`] stays here while the sandbox lives. Work in it ([`Sandbox::lease`]) holds the
//! guard for reading; kill and expiry ([`Registry::kill`]) take the sandbox out of the table
//! first (new requests see it gone), kill its commands, wait for every lease (the in-flight
//! file operations finish), then release the call and wait for the release (the keeper drains
//! and shuts the sandbox down).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use sandkeeper::{CallId, CallSpec, SessionId};
use sandkeeper_tokio::{CallGuard, Keeper, LocalBackend, SandboxWork};
use subtle::ConstantTimeEq;
use tokio::sync::{watch, OwnedRwLockReadGuard, RwLock};
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::Team;
use crate::clock;
use crate::envd::processes::Processes;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// The guard of a sandbox's keeper call.
pub type Guard = CallGuard<LocalBackend>;

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
    /// The keeper call; `None` once it was released.
    guard: Arc<RwLock<Option<Guard>>>,
    /// Its commands (envd's process service).
    pub processes: Processes,
    next_pid: AtomicU32,
}

/// The sandbox's call held for one piece of work: kill waits for it.
pub struct Lease(OwnedRwLockReadGuard<Option<Guard>, Guard>);

impl Lease {
    /// The call's work in its sandbox.
    pub fn work(&self) -> SandboxWork<'_, LocalBackend> {
        self.0.work()
    }
}

impl Sandbox {
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

    /// The sandbox's call for one piece of work, or `None` once it was released.
    pub async fn lease(&self) -> Option<Lease> {
        let held = self.guard.clone().read_owned().await;
        OwnedRwLockReadGuard::try_map(held, Option::as_ref)
            .ok()
            .map(Lease)
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
    /// Sandboxes one team may have at once (creating counts).
    pub sandboxes_per_team: usize,
}

/// Every sandbox of this server.
pub struct Registry {
    keeper: Keeper<LocalBackend>,
    limits: Limits,
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Inner {
    /// By id (ids are ours, but lookups take request-chosen strings: std's hasher, seeded).
    sandboxes: HashMap<String, Arc<Sandbox>>,
    /// Sandboxes of each team, being created or live.
    per_team: HashMap<Team, usize>,
}

impl Registry {
    /// A table over `keeper`.
    pub fn new(keeper: Keeper<LocalBackend>, limits: Limits) -> Arc<Self> {
        Arc::new(Registry {
            keeper,
            limits,
            inner: Mutex::default(),
            metrics: Arc::default(),
        })
    }

    /// The keeper.
    pub fn keeper(&self) -> &Keeper<LocalBackend> {
        &self.keeper
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Creates a sandbox for `team`: acquires its keeper call and starts its timer. Nothing
    /// changes when it fails. Errors: 429 past the team's limit, 503 when the keeper refused or
    /// could not start the sandbox.
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
        Metrics::count(&self.metrics.creates, outcome);
        Metrics::time(&self.metrics.create_seconds, outcome, began.elapsed());
        created
    }

    async fn create_now(
        self: &Arc<Self>,
        team: Team,
        new: NewSandbox,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let slot = self.reserve(&team)?;
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
            guard: Arc::new(RwLock::new(Some(guard))),
            processes: Processes::default(),
            next_pid: AtomicU32::new(1),
        });
        slot.commit();
        lock(&self.inner)
            .sandboxes
            .insert(id.clone(), sandbox.clone());
        self.metrics.sandboxes.inc();
        tokio::spawn(self.clone().timer(id, expiry));
        tracing::info!(sandbox = %sandbox.id, team = %sandbox.team, session = %sandbox.session, "created");
        Ok(sandbox)
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

    /// `team`'s sandboxes, oldest first.
    pub fn list(&self, team: &Team) -> Vec<Arc<Sandbox>> {
        let mut all: Vec<_> = lock(&self.inner)
            .sandboxes
            .values()
            .filter(|s| &s.team == team)
            .cloned()
            .collect();
        all.sort_by(|a, b| a.started.cmp(&b.started).then(a.id.cmp(&b.id)));
        all
    }

    /// Sets the timeout of `team`'s sandbox `id` (from now): the sandbox, or `None` when the
    /// team has none of that id.
    pub fn set_timeout(
        &self,
        team: &Team,
        id: &str,
        timeout: Duration,
        only_longer: bool,
    ) -> Option<Arc<Sandbox>> {
        let sandbox = self.get(team, id)?;
        sandbox.set_timeout(timeout, only_longer);
        Some(sandbox)
    }

    /// Kills `team`'s sandbox `id` (see the module docs). `false` when there is none. The
    /// kill runs on its own task: a caller that goes away does not stop it half-way.
    pub async fn kill(self: &Arc<Self>, team: &Team, id: &str) -> bool {
        let taken = {
            let mut inner = lock(&self.inner);
            match inner.sandboxes.get(id) {
                Some(s) if &s.team == team => inner.sandboxes.remove(id),
                _ => None,
            }
        };
        let Some(sandbox) = taken else {
            return false;
        };
        let registry = self.clone();
        let killed = tokio::spawn(async move { registry.finish(sandbox, "api").await });
        if let Err(e) = killed.await {
            tracing::error!(error = %e, "a kill's task failed");
        }
        true
    }

    /// Kills every sandbox (at shutdown).
    pub async fn kill_all(&self) {
        let all: Vec<_> = lock(&self.inner)
            .sandboxes
            .drain()
            .map(|(_, s)| s)
            .collect();
        for sandbox in all {
            self.finish(sandbox, "shutdown").await;
        }
    }

    /// Ends a sandbox already out of the table (`reason`: for the metrics).
    async fn finish(&self, sandbox: Arc<Sandbox>, reason: &'static str) {
        let span = tracing::info_span!(
            "kill",
            sandbox = %sandbox.id,
            team = %sandbox.team,
            session = %sandbox.session,
            reason,
        );
        self.finish_now(sandbox, reason).instrument(span).await;
    }

    async fn finish_now(&self, sandbox: Arc<Sandbox>, reason: &'static str) {
        let began = Instant::now();
        sandbox.processes.kill_all();
        let guard = sandbox.guard.write().await.take();
        if let Some(guard) = guard {
            let released = guard.release().await;
            tracing::info!(sandbox = %sandbox.id, team = %sandbox.team, ?released, "killed");
        }
        self.metrics.sandboxes.dec();
        Metrics::count(&self.metrics.kills, reason);
        Metrics::time(&self.metrics.kill_seconds, reason, began.elapsed());
        let mut inner = lock(&self.inner);
        if let Some(n) = inner.per_team.get_mut(&sandbox.team) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.per_team.remove(&sandbox.team);
            }
        }
    }

    /// Kills sandbox `id` when its deadline passes; ends when the sandbox is gone.
    async fn timer(self: Arc<Self>, id: String, mut expiry: watch::Receiver<Instant>) {
        loop {
            let deadline = *expiry.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                changed = expiry.changed() => if changed.is_err() { return },
            }
        }
        let taken = lock(&self.inner).sandboxes.remove(&id);
        if let Some(sandbox) = taken {
            tracing::info!(sandbox = %id, "timeout: killing");
            self.finish(sandbox, "timeout").await;
        }
    }

    /// A slot for one more sandbox of `team`, or 429.
    fn reserve(self: &Arc<Self>, team: &Team) -> Result<Slot, ApiError> {
        let mut inner = lock(&self.inner);
        let n = inner.per_team.entry(team.clone()).or_insert(0);
        if *n >= self.limits.sandboxes_per_team {
            return Err(ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "team {team} has {} sandboxes, its limit: kill one first",
                    self.limits.sandboxes_per_team
                ),
            ));
        }
        *n += 1;
        Ok(Slot {
            registry: self.clone(),
            team: team.clone(),
            committed: false,
        })
    }
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

/// `n` random bytes as hex, from the OS.
fn random_hex(n: usize) -> Result<String, ApiError> {
    let mut bytes = vec![0u8; n];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(bytes))
}

/// A std mutex's content; a poisoned one is taken as it is (every update here is one step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
