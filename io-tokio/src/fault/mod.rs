//! The fault backend: a seeded, in-memory world for tests under tokio's paused clock.
//!
//! Sandboxes are records, files are bytes in them, latencies are tokio sleeps (virtual under
//! `start_paused`), and every failure is drawn from one seeded source: start failures, transient
//! upload failures, uploads that hang forever, stop and shutdown failures, sandboxes that die on
//! their own; the application's own work ([`SandboxOps`](crate::ops::SandboxOps), in
//! `fault/work.rs`) hangs or meets its sandbox's death mid-operation. Sessions can be made to
//! hang on purpose ([`FaultBackend::hang_uploads`]) and
//! sandboxes killed on purpose ([`FaultBackend::kill`]).
//!
//! It also watches the driver from the backend's side and records a *violation* for every
//! order the races (docs/design.md) would produce, by `sandkeeper_check`'s lane rules (the ones the
//! core's tests and the simulator apply to the core's commands): an upload received after the
//! sandbox's Stop or Shutdown, any operation after Shutdown, Persist before Stop, a second Stop
//! or Start; and, this world having no external sandboxes, an upload into a sandbox it never
//! started, and a version of a file written after a newer one.

mod work;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkeeper::{
    DiscardReason, PathName, Payload, SandboxId, SessionId, Snapshot, Token, Version,
};

use crate::backend::{
    Backend, BackendError, DeathSink, DiscardRequest, PersistRequest, StartRequest, StopRequest,
    UploadRequest,
};
use crate::rng::SplitMix64;
use sandkeeper_check::Lanes;

/// Fault rates and latencies. Probabilities are per operation.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Start latency, drawn between the two.
    pub start_latency: (Duration, Duration),
    /// Upload latency.
    pub upload_latency: (Duration, Duration),
    /// Stop, persist and shutdown latency.
    pub op_latency: (Duration, Duration),
    /// A start fails (fatal).
    pub start_failure: f64,
    /// An upload fails transiently.
    pub upload_failure: f64,
    /// An upload never answers.
    pub upload_hang: f64,
    /// A stop fails.
    pub stop_failure: f64,
    /// A shutdown fails.
    pub shutdown_failure: f64,
    /// A started sandbox dies on its own, some time later.
    pub death: f64,
    /// How long after its start a dying sandbox dies, at most.
    pub death_within: Duration,
    /// Stop returns a snapshot.
    pub snapshots: bool,
    /// Latency of the application's own work (exec and file operations).
    pub work_latency: (Duration, Duration),
    /// Such work never answers (an exec that hangs: its timeout ends it).
    pub work_hang: f64,
    /// The sandbox dies while such work runs.
    pub work_death: f64,
}

impl FaultConfig {
    /// No faults; small latencies.
    pub fn reliable() -> Self {
        FaultConfig {
            start_latency: (Duration::from_millis(5), Duration::from_millis(20)),
            upload_latency: (Duration::from_millis(1), Duration::from_millis(10)),
            op_latency: (Duration::from_millis(1), Duration::from_millis(5)),
            start_failure: 0.0,
            upload_failure: 0.0,
            upload_hang: 0.0,
            stop_failure: 0.0,
            shutdown_failure: 0.0,
            death: 0.0,
            death_within: Duration::from_secs(1),
            snapshots: false,
            work_latency: (Duration::from_millis(1), Duration::from_millis(5)),
            work_hang: 0.0,
            work_death: 0.0,
        }
    }

    /// Every kind of fault, at rates that a run of a few hundred operations meets each of.
    pub fn stormy() -> Self {
        FaultConfig {
            start_failure: 0.1,
            upload_failure: 0.15,
            upload_hang: 0.05,
            stop_failure: 0.1,
            shutdown_failure: 0.05,
            death: 0.15,
            snapshots: true,
            work_hang: 0.05,
            work_death: 0.05,
            ..FaultConfig::reliable()
        }
    }
}

/// What the backend was asked, in the order it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A start.
    Start(SandboxId),
    /// An upload received (before its latency).
    Upload {
        /// Into.
        sandbox: SandboxId,
        /// Whose.
        session: SessionId,
        /// Which version.
        version: Version,
    },
    /// A stop.
    Stop(SandboxId),
    /// A persist.
    Persist(SandboxId),
    /// A shutdown.
    Shutdown(SandboxId),
}

impl Op {
    /// The kind of operation, as `sandkeeper_check` orders them.
    pub fn kind(&self) -> sandkeeper_check::Op {
        match self {
            Op::Start(_) => sandkeeper_check::Op::Start,
            Op::Upload { .. } => sandkeeper_check::Op::Upload,
            Op::Stop(_) => sandkeeper_check::Op::Stop,
            Op::Persist(_) => sandkeeper_check::Op::Persist,
            Op::Shutdown(_) => sandkeeper_check::Op::Shutdown,
        }
    }

    /// The sandbox it names.
    pub fn sandbox(&self) -> SandboxId {
        match self {
            Op::Start(x) | Op::Stop(x) | Op::Persist(x) | Op::Shutdown(x) => *x,
            Op::Upload { sandbox, .. } => *sandbox,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Starting,
    Up,
    Stopped,
    Persisted,
    ShutDown,
    Dead,
}

/// The files of one sandbox: (session, path) to (version, bytes).
type Files = BTreeMap<(SessionId, PathName), (Version, Payload)>;

#[derive(Debug)]
struct Box {
    phase: Phase,
    files: Files,
    /// The application's own files in its workspace: path to bytes (directories are implied).
    work: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
struct World {
    log: Vec<Op>,
    /// The order of the operations each sandbox received, judged by the rules the core's tests
    /// and the simulator judge the core's commands by.
    lanes: Lanes,
    boxes: BTreeMap<SandboxId, Box>,
    violations: Vec<String>,
    hung: HashSet<SessionId>,
    late_writes_refused: u64,
    /// Uploads and starts inside the backend now, and the most there ever were at once.
    uploads_now: usize,
    uploads_max: usize,
    starts_now: usize,
    starts_max: usize,
    /// Files of each sandbox as they were when its Shutdown was received.
    at_shutdown: BTreeMap<SandboxId, Files>,
    /// Pieces of the application's own work done in an up sandbox.
    work_done: u64,
    /// Changes by such work that reached a sandbox no longer up, refused.
    work_refused: u64,
    /// Snapshots a start took as `resume_from` (the new sandbox's from then on).
    taken: HashSet<Snapshot>,
    /// Discards received: the snapshot and why.
    discarded: Vec<(Snapshot, DiscardReason)>,
}

/// A seeded in-memory backend with faults. See the module docs.
pub struct FaultBackend {
    config: FaultConfig,
    rng: Mutex<SplitMix64>,
    world: Arc<Mutex<World>>,
    deaths: Mutex<Option<DeathSink>>,
}

impl FaultBackend {
    /// A backend drawing its faults from `seed`.
    pub fn new(seed: u64, config: FaultConfig) -> Self {
        FaultBackend {
            config,
            rng: Mutex::new(SplitMix64::new(seed)),
            world: Arc::new(Mutex::new(World::default())),
            deaths: Mutex::new(None),
        }
    }

    /// A backend with no faults.
    pub fn reliable() -> Self {
        Self::new(0, FaultConfig::reliable())
    }

    /// From now on, every upload of `session` hangs (never answers) until it is cancelled.
    pub fn hang_uploads(&self, session: &SessionId) {
        self.world().hung.insert(session.clone());
    }

    /// Kills `sandbox` now, as if its pod were evicted, and reports the death.
    pub fn kill(&self, sandbox: SandboxId) {
        self.die(sandbox);
    }

    /// Every operation received, in order.
    pub fn log(&self) -> Vec<Op> {
        self.world().log.clone()
    }

    /// The operations received for one sandbox, in order.
    pub fn ops_for(&self, sandbox: SandboxId) -> Vec<Op> {
        self.world()
            .log
            .iter()
            .filter(|op| op.sandbox() == sandbox)
            .cloned()
            .collect()
    }

    /// Orders that the races of `docs/design.md` would produce, seen from the backend.
    pub fn violations(&self) -> Vec<String> {
        self.world().violations.clone()
    }

    /// Writes that arrived at a stopped or gone sandbox after their upload was received in time
    /// (refused, so nothing landed after a snapshot).
    pub fn late_writes_refused(&self) -> u64 {
        self.world().late_writes_refused
    }

    /// The most uploads that were inside the backend at once.
    pub fn max_concurrent_uploads(&self) -> usize {
        self.world().uploads_max
    }

    /// The most starts that were inside the backend at once.
    pub fn max_concurrent_starts(&self) -> usize {
        self.world().starts_max
    }

    /// Pieces of the application's own work done, and changes refused because their sandbox
    /// was no longer up.
    pub fn work_counts(&self) -> (u64, u64) {
        let w = self.world();
        (w.work_done, w.work_refused)
    }

    /// A file of the application's own work in a sandbox's workspace.
    pub fn work_file(&self, sandbox: SandboxId, path: &str) -> Option<Vec<u8>> {
        self.world().boxes.get(&sandbox)?.work.get(path).cloned()
    }

    /// The version and bytes of a session's file in a sandbox, if written.
    pub fn file(
        &self,
        sandbox: SandboxId,
        session: &SessionId,
        path: &PathName,
    ) -> Option<(Version, Payload)> {
        let world = self.world();
        let key = (session.clone(), path.clone());
        world
            .boxes
            .get(&sandbox)
            .and_then(|b| b.files.get(&key))
            .or_else(|| world.at_shutdown.get(&sandbox).and_then(|f| f.get(&key)))
            .cloned()
    }

    /// Sandboxes started and not shut down, dead or persisted-and-kept.
    pub fn live_sandboxes(&self) -> Vec<SandboxId> {
        self.world()
            .boxes
            .iter()
            .filter(|(_, b)| !matches!(b.phase, Phase::ShutDown | Phase::Dead | Phase::Persisted))
            .map(|(x, _)| *x)
            .collect()
    }

    /// The snapshots discarded, in order, with why.
    pub fn discarded(&self) -> Vec<(Snapshot, DiscardReason)> {
        self.world().discarded.clone()
    }

    /// Sandboxes persisted and never shut down: kept by the backend (the `Suspend` policy)
    /// until their snapshot is discarded.
    pub fn kept_sandboxes(&self) -> Vec<SandboxId> {
        self.world()
            .boxes
            .iter()
            .filter(|(_, b)| b.phase == Phase::Persisted)
            .map(|(x, _)| *x)
            .collect()
    }

    /// The death sink the keeper handed to `watch_deaths`, once it did.
    pub fn death_sink(&self) -> Option<DeathSink> {
        self.deaths
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sandboxes ever started.
    pub fn started(&self) -> usize {
        self.world().boxes.len()
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn draw<T>(&self, f: impl FnOnce(&mut SplitMix64) -> T) -> T {
        f(&mut self.rng.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn die(&self, sandbox: SandboxId) {
        {
            let mut world = self.world();
            match world.boxes.get_mut(&sandbox) {
                Some(b) if !matches!(b.phase, Phase::ShutDown | Phase::Dead) => {
                    b.phase = Phase::Dead
                }
                _ => return,
            }
        }
        let sink = self
            .deaths
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(sink) = sink {
            sink.report(sandbox);
        }
    }

    /// Records a received operation and checks the order against the sandbox's phase.
    fn receive(&self, op: Op) -> Option<Phase> {
        let mut world = self.world();
        let sandbox = op.sandbox();
        let phase = world.boxes.get(&sandbox).map(|b| b.phase);
        if let Err(v) = world.lanes.take(sandbox, op.kind()) {
            world.violations.push(format!("{v}: {op:?}"));
        } else if phase.is_none() && !matches!(op, Op::Start(_)) {
            // A lane takes an upload into a sandbox never started as one into an external
            // sandbox; this world has none.
            world
                .violations
                .push(format!("upload into a sandbox never started: {op:?}"));
        }
        world.log.push(op);
        phase
    }

    fn set_phase(&self, sandbox: SandboxId, phase: Phase) {
        if let Some(b) = self.world().boxes.get_mut(&sandbox) {
            if b.phase != Phase::Dead || phase == Phase::ShutDown {
                b.phase = phase;
            }
        }
    }
}

impl Backend for FaultBackend {
    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let _inside = Inside::enter(&self.world, Meter::Starts);
        let sandbox = request.sandbox;
        if let Some(snapshot) = &request.resume_from {
            self.world().taken.insert(snapshot.clone());
        }
        if self.receive(Op::Start(sandbox)).is_none() {
            self.world().boxes.insert(
                sandbox,
                Box {
                    phase: Phase::Starting,
                    files: BTreeMap::new(),
                    work: BTreeMap::new(),
                },
            );
        }
        let (latency, fails, dies, death_at) = self.draw(|r| {
            (
                r.between(self.config.start_latency.0, self.config.start_latency.1),
                r.chance(self.config.start_failure),
                r.chance(self.config.death),
                r.between(Duration::ZERO, self.config.death_within),
            )
        });
        tokio::time::sleep(latency).await;
        if fails {
            self.set_phase(sandbox, Phase::Dead);
            return Err(BackendError::fatal("start failed (injected)"));
        }
        {
            let mut world = self.world();
            let b = world.boxes.get_mut(&sandbox).expect("received");
            if b.phase == Phase::Dead {
                return Err(BackendError::gone("died while starting"));
            }
            b.phase = Phase::Up;
        }
        if dies {
            let sink = self
                .deaths
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(sink) = sink {
                // The death comes later, from the world, not from this call.
                let me = DeathLater {
                    world: self.world.clone(),
                    sink,
                    sandbox,
                };
                tokio::spawn(async move {
                    tokio::time::sleep(death_at).await;
                    me.fire();
                });
            }
        }
        Ok(())
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let _inside = Inside::enter(&self.world, Meter::Uploads);
        let sandbox = request.sandbox;
        let phase = self.receive(Op::Upload {
            sandbox,
            session: request.session.clone(),
            version: request.version,
        });
        if phase != Some(Phase::Up) {
            return Err(BackendError::gone(format!("sandbox is {phase:?}")));
        }
        let hung = self.world().hung.contains(&request.session);
        let (latency, fails, hangs) = self.draw(|r| {
            (
                r.between(self.config.upload_latency.0, self.config.upload_latency.1),
                r.chance(self.config.upload_failure),
                r.chance(self.config.upload_hang),
            )
        });
        if hung || hangs {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(latency).await;
        if fails {
            return Err(BackendError::transient("upload failed (injected)"));
        }
        let mut world = self.world();
        let Some(b) = world.boxes.get_mut(&sandbox) else {
            return Err(BackendError::gone("no such sandbox"));
        };
        match b.phase {
            Phase::Up => {
                let key = (request.session.clone(), request.path.clone());
                if let Some((old, _)) = b.files.get(&key) {
                    if *old >= request.version {
                        let v = format!(
                            "version {} written after {} for {key:?} in {sandbox}",
                            request.version, old
                        );
                        world.violations.push(v);
                        return Ok(());
                    }
                }
                b.files.insert(key, (request.version, request.payload));
                Ok(())
            }
            Phase::Dead => Err(BackendError::gone("sandbox died")),
            _ => {
                world.late_writes_refused += 1;
                Err(BackendError::gone("sandbox stopped"))
            }
        }
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        let sandbox = request.sandbox;
        let phase = self.receive(Op::Stop(sandbox));
        let (latency, fails) = self.draw(|r| {
            (
                r.between(self.config.op_latency.0, self.config.op_latency.1),
                r.chance(self.config.stop_failure),
            )
        });
        if phase == Some(Phase::Dead) {
            return Err(BackendError::gone("sandbox died"));
        }
        // Stopped at once: nothing may land after this point.
        self.set_phase(sandbox, Phase::Stopped);
        tokio::time::sleep(latency).await;
        if fails {
            return Err(BackendError::transient("stop failed (injected)"));
        }
        // A suspension always takes a snapshot (it is what the key resumes), as every real
        // backend's does; other stops only when snapshots are on.
        Ok((self.config.snapshots || request.suspend)
            .then(|| Snapshot::new(format!("snap-{}", sandbox.0))))
    }

    async fn discard(&self, request: DiscardRequest) -> Result<(), BackendError> {
        let mut world = self.world();
        let taken = world.taken.contains(&request.snapshot);
        if request.reason == DiscardReason::Taken {
            // A start here moves the snapshot into the sandbox it becomes: nothing is left of
            // it, and nothing is deleted.
            if !taken {
                let v = format!(
                    "discard-unreferenced: {:?} discarded as taken, and no start took it",
                    request.snapshot
                );
                world.violations.push(v);
            }
            world.discarded.push((request.snapshot, request.reason));
            return Ok(());
        }
        if taken {
            let v = format!(
                "discard-unreferenced: {:?} discarded after a start took it",
                request.snapshot
            );
            world.violations.push(v);
        }
        // A suspended sandbox whose snapshot goes is no longer kept.
        if let Some(b) = world.boxes.get_mut(&request.sandbox) {
            if b.phase == Phase::Persisted {
                b.phase = Phase::ShutDown;
            }
        }
        world.discarded.push((request.snapshot, request.reason));
        Ok(())
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        let sandbox = request.sandbox;
        self.receive(Op::Persist(sandbox));
        let latency = self.draw(|r| r.between(self.config.op_latency.0, self.config.op_latency.1));
        tokio::time::sleep(latency).await;
        self.set_phase(sandbox, Phase::Persisted);
        Ok(())
    }

    // Tokens are not checked here: a keeper refuses fleet mode at start-up until it runs a store.
    async fn shutdown(
        &self,
        sandbox: SandboxId,
        _token: Option<Token>,
    ) -> Result<(), BackendError> {
        let phase = self.receive(Op::Shutdown(sandbox));
        {
            let mut world = self.world();
            if let Some(b) = world.boxes.get(&sandbox) {
                let files = b.files.clone();
                world.at_shutdown.insert(sandbox, files);
            }
        }
        let (latency, fails) = self.draw(|r| {
            (
                r.between(self.config.op_latency.0, self.config.op_latency.1),
                r.chance(self.config.shutdown_failure),
            )
        });
        tokio::time::sleep(latency).await;
        self.set_phase(sandbox, Phase::ShutDown);
        if phase == Some(Phase::Dead) {
            return Err(BackendError::gone("already gone"));
        }
        if fails {
            return Err(BackendError::transient("shutdown failed (injected)"));
        }
        Ok(())
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        *self.deaths.lock().unwrap_or_else(|p| p.into_inner()) = Some(deaths);
    }
}

/// A death scheduled by the world.
struct DeathLater {
    world: Arc<Mutex<World>>,
    sink: DeathSink,
    sandbox: SandboxId,
}

impl DeathLater {
    fn fire(self) {
        {
            let mut world = self.world.lock().unwrap_or_else(|p| p.into_inner());
            match world.boxes.get_mut(&self.sandbox) {
                Some(b) if matches!(b.phase, Phase::Starting | Phase::Up) => b.phase = Phase::Dead,
                _ => return,
            }
        }
        self.sink.report(self.sandbox);
    }
}

#[derive(Clone, Copy)]
enum Meter {
    Uploads,
    Starts,
}

/// Counts an operation inside the backend while it lives (a cancelled one leaves on drop).
struct Inside {
    world: Arc<Mutex<World>>,
    meter: Meter,
}

impl Inside {
    fn enter(world: &Arc<Mutex<World>>, meter: Meter) -> Self {
        let mut w = world.lock().unwrap_or_else(|p| p.into_inner());
        match meter {
            Meter::Uploads => {
                w.uploads_now += 1;
                w.uploads_max = w.uploads_max.max(w.uploads_now);
            }
            Meter::Starts => {
                w.starts_now += 1;
                w.starts_max = w.starts_max.max(w.starts_now);
            }
        }
        Inside {
            world: world.clone(),
            meter,
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut w = self.world.lock().unwrap_or_else(|p| p.into_inner());
        match self.meter {
            Meter::Uploads => w.uploads_now -= 1,
            Meter::Starts => w.starts_now -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkeeper::{Key, Spec};

    fn start(x: u64) -> StartRequest {
        StartRequest {
            sandbox: SandboxId(x),
            key: Key::Global,
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            token: None,
        }
    }

    fn upload(x: u64, version: u64) -> UploadRequest {
        UploadRequest {
            upload: sandkeeper::UploadId(version),
            sandbox: SandboxId(x),
            session: SessionId::new("s").unwrap(),
            path: PathName::new("log").unwrap(),
            version: Version(version),
            payload: Payload::new(&b"x"[..]),
            token: None,
        }
    }

    fn stop(x: u64) -> StopRequest {
        StopRequest {
            sandbox: SandboxId(x),
            suspend: false,
            token: None,
        }
    }

    /// The watcher is only worth something if it speaks up: each order a race would produce is
    /// recorded as a violation naming the broken rule.
    #[tokio::test(start_paused = true)]
    async fn operations_out_of_order_are_recorded_as_violations() {
        let b = FaultBackend::reliable();
        b.start(start(1)).await.unwrap();
        b.upload(upload(1, 1)).await.unwrap();
        b.stop(stop(1)).await.unwrap();
        assert!(b.violations().is_empty(), "{:?}", b.violations());

        let _ = b.upload(upload(1, 2)).await;
        let _ = b.stop(stop(1)).await;
        b.shutdown(SandboxId(1), None).await.unwrap();
        let _ = b
            .persist(PersistRequest {
                sandbox: SandboxId(1),
                snapshot: None,
                suspend: false,
                retain_until: None,
                token: None,
            })
            .await;
        let _ = b.start(start(1)).await;
        let _ = b.upload(upload(7, 1)).await;
        let _ = b
            .persist(PersistRequest {
                sandbox: SandboxId(2),
                snapshot: None,
                suspend: false,
                retain_until: None,
                token: None,
            })
            .await;
        let seen: Vec<String> = b.violations();
        let rules: Vec<&str> = seen
            .iter()
            .map(|v| v.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            rules,
            [
                "no-upload-after-stop",
                "stop-once",
                "no-command-after-shutdown",
                "no-command-after-shutdown",
                "upload into a sandbox never started",
                "stop-managed-only",
            ],
            "{seen:#?}"
        );
    }
}
