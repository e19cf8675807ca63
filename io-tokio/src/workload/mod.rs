//! The main job's workload, on any backend: a realistic agent-harness load with checks.
//!
//! Many sessions of many users run calls at once on one shared agent. Calls of one user share
//! a sandbox (same-key collisions under `Share`); every turn appends a JSON line to the
//! session log and flushes it; context-free components (a message bus) resolve the session's
//! sandbox and run real processes there; a memory writer holds the session and writes after
//! the call ends; now and then a sandbox is killed from outside (a death). At the end the
//! keeper closes and [`run`] checks what it can see: every call ended once, every flushed
//! version settled once, every shutdown confirmed, bus writes in the right sandbox; on
//! [`LocalBackend`](crate::LocalBackend) also the snapshot files and that no sandbox
//! directory remains; and whatever the backend adds ([`WorkloadTarget::after_close`], or in
//! fleet mode [`WorkloadTarget::after_fleet_close`]).
//!
//! Binaries: `harness` in this crate (local), `harness-k8s` in `sandkeeper-k8s`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandkeeper_tokio::workload::WorkloadError> {
//! use sandkeeper_tokio::workload::{self, WorkloadOptions};
//! use sandkeeper_tokio::LocalBackend;
//!
//! let options = WorkloadOptions { sessions: 4, quiet: true, ..WorkloadOptions::default() };
//! let summary = workload::run(LocalBackend::new_temp().unwrap(), &options).await?;
//! summary.print();
//! assert!(summary.ok());
//! # Ok(()) }
//! ```

mod after_close;
pub mod child;
mod fleet;
mod options;
mod summary;
mod target;
mod turn;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sandkeeper::{
    CallId, CallSpec, CloseReport, Config, Event, Fleet, HookPoint, Hooks, PathName, SameKey,
    SandboxId, Scope, SessionId, Settlement, UserId, Version,
};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::rng::SplitMix64;
use crate::store::FleetStore;
use crate::{ExecOptions, Keeper, KeeperConfig, KeeperError, Notice, Released};

pub use fleet::{
    last_acknowledged, verify_local_fleet, Acknowledged, FleetVerdict, LastAcknowledged,
};
pub use options::{FleetOptions, WorkloadOptions};
pub use summary::Summary;
pub use target::WorkloadTarget;
pub use turn::{
    fleet_timing, run_turn, run_turn_then, stop_self, turn_config, TurnPoints, TurnReport,
};

/// Why a workload could not run (failed checks are not errors: they are in the [`Summary`]).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A count that must be positive is zero.
    #[error("sessions, users, calls and concurrency must be at least 1")]
    Options,
    /// The keeper could not be made.
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    /// A workload task panicked or the progress style was rejected.
    #[error("{0}")]
    Internal(String),
    /// The local backend's directories could not be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A fleet option is wrong, or the fleet's store or ledger could not be read or written.
    #[error("fleet: {0}")]
    Fleet(String),
}

/// What one session's task saw.
#[derive(Default)]
struct SessionRecord {
    /// Contents of each flushed version of the session log.
    versions: BTreeMap<Version, String>,
    release_latencies: Vec<Duration>,
    calls_ok: u64,
    calls_failed: u64,
    bus_writes: u64,
    bus_misroutes: u64,
    /// The tools' operations by outcome (`ok` or the error's kind).
    operations: BTreeMap<&'static str, u64>,
    /// Tool files whose content read back was not what the tool wrote.
    tool_mismatches: u64,
    /// Calls that found their sandbox's credential, written by its own after-start or
    /// after-resume hook; and those that found none, or one of another incarnation.
    credentials_current: u64,
    credentials_wrong: u64,
    /// Sandboxes whose credential was not there: wrong unless the sandbox was killed (its
    /// directory being removed, file by file, while the call read it).
    credentials_missing: Vec<SandboxId>,
    killed: BTreeSet<SandboxId>,
}

/// Times of flushes and settlements, from the notices.
#[derive(Default)]
struct Timeline {
    flushed_at: HashMap<(SessionId, PathName, Version), Instant>,
    settle_latencies: Vec<Duration>,
    settled: BTreeMap<(SessionId, PathName, Version), Settlement>,
    settled_twice: u64,
    drains: u64,
    lagged: u64,
    /// Fleet mode with a ledger: each flushed session-log version's user and contents, and
    /// the file each acknowledged one is appended to.
    logs: HashMap<(SessionId, Version), (UserId, String)>,
    ledger: Option<std::fs::File>,
    ledger_error: Option<String>,
}

impl Timeline {
    /// Appends an acknowledged session-log version to the ledger, if there is one.
    fn acknowledge(&mut self, session: &SessionId, version: Version, sandbox: SandboxId) {
        let Some((user, log)) = self.logs.remove(&(session.clone(), version)) else {
            return;
        };
        let Some(file) = self.ledger.as_mut() else {
            return;
        };
        let line = Acknowledged {
            session: session.clone(),
            user,
            version,
            sandbox,
            log,
        };
        let mut text = serde_json::to_string(&line).expect("serialisable");
        text.push('\n');
        // One write per line (the file is opened for appending): a process killed mid-run
        // leaves whole lines.
        if let Err(e) = std::io::Write::write_all(file, text.as_bytes()) {
            self.ledger_error.get_or_insert(e.to_string());
        }
    }
}

/// The main job's binaries' `--log LEVEL`: tracing output at `level` and above on standard
/// error (`off`, `error`, `warn`, `info`, `debug`, `trace`); `off` sets up nothing.
///
/// Errors: a level that is none of these, named.
pub fn log_to_stderr(level: &str) -> Result<(), String> {
    if level == "off" {
        return Ok(());
    }
    let level: tracing::Level = level
        .parse()
        .map_err(|_| format!("unknown log level {level:?}"))?;
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

/// Runs the workload on `backend` and closes the keeper; returns what was measured and
/// checked. Must run inside a tokio runtime (a multi-threaded one for real backends).
pub async fn run<B: WorkloadTarget>(
    backend: B,
    options: &WorkloadOptions,
) -> Result<Summary, WorkloadError> {
    options.check()?;
    let config = keeper_config(options);
    let checkpoints = Arc::new(AtomicU64::new(0));
    let keeper = Keeper::with_hooks(config, backend, {
        let checkpoints = checkpoints.clone();
        move |point, work| demo_hook(point, work, checkpoints.clone())
    })?;
    drive(keeper, options, None, checkpoints).await
}

/// Runs the workload as one process of a fleet (see `docs/fleet.md`): the keeper joins
/// the fleet on `store` (`Keeper::fleet_with_hooks`), its sessions are named after
/// `fleet.replica` while its users are every process's, so other processes running the same
/// workload on the same backend and store contend for the same keys. The checks are this
/// process's own (calls, settlements, invariants, tools, credentials); what only the whole
/// fleet shows (snapshots on a shared root, token order, nothing leaked) is checked after
/// every process ended ([`verify_local_fleet`]). With `fleet.ledger`, each acknowledged
/// session-log version is appended there as it is acknowledged.
pub async fn run_fleet<B: WorkloadTarget>(
    backend: B,
    store: impl FleetStore,
    options: &WorkloadOptions,
    fleet: &FleetOptions,
) -> Result<Summary, WorkloadError> {
    options.check()?;
    fleet.check()?;
    fleet.check_ledger(options)?;
    let mut config = keeper_config(options);
    config.core.fleet = Some(Fleet {
        handover: fleet.handover,
        ..turn::fleet_timing(fleet.lease())
    });
    let checkpoints = Arc::new(AtomicU64::new(0));
    let keeper = Keeper::fleet_with_hooks(config, backend, store, {
        let checkpoints = checkpoints.clone();
        move |point, work| demo_hook(point, work, checkpoints.clone())
    })
    .await?;
    drive(keeper, options, Some(fleet), checkpoints).await
}

/// The keeper's configuration of a workload run: one sandbox per user, shared by its calls,
/// the options' release policy, and the demonstration hooks' timeouts.
fn keeper_config(args: &WorkloadOptions) -> KeeperConfig {
    let mut core = Config {
        scope: Scope::User,
        same_key: SameKey::Share,
        release: args.release_policy(),
        drain_deadline: Duration::from_secs(3),
        ..Config::default()
    };
    // The demonstration hooks: after a start or a resume the sandbox gets a short-lived
    // credential naming it (a suspension drops what the application put in; this puts it
    // back), and before a suspension a checkpoint marker, which the next resume finds.
    let hook_timeout = Some(Duration::from_secs(10));
    core.hooks = Hooks {
        after_start: hook_timeout,
        after_resume: hook_timeout,
        before_suspend: core.release.suspends().then_some(Duration::from_secs(10)),
        ..Hooks::default()
    };
    KeeperConfig {
        notice_capacity: 1 << 16,
        ..KeeperConfig::with_core(core)
    }
}
/// Runs the sessions on `keeper`, closes it, checks and summarises.
async fn drive<B: WorkloadTarget>(
    keeper: Keeper<B>,
    args: &WorkloadOptions,
    fleet: Option<&FleetOptions>,
    checkpoints: Arc<AtomicU64>,
) -> Result<Summary, WorkloadError> {
    let replica = fleet.map(|f| f.replica.clone());
    if let (Some(replica), Some(incarnation)) = (&replica, keeper.incarnation()) {
        // Printed at once, for whoever watches the fleet's processes (the tests kill one).
        println!("fleet replica {replica}: incarnation {incarnation}");
    }
    let ran = run_sessions(&keeper, args, fleet, replica.as_deref()).await?;
    let checked = after_close::check(&keeper, fleet, &ran, &checkpoints).await?;
    Ok(summary::summarize(
        &keeper,
        args,
        fleet,
        replica.as_deref(),
        &ran,
        checked,
    ))
}

/// What running the sessions left, once the keeper closed.
struct Ran {
    /// What each session's task saw.
    records: BTreeMap<SessionId, SessionRecord>,
    /// The notices seen.
    timeline: Timeline,
    /// Checks the sessions passed as they ran.
    passed: u64,
    workload: Duration,
    close_took: Duration,
    report: CloseReport,
}

/// Runs the sessions on `keeper` (as fleet `replica`, if any), closes it, and waits (bounded)
/// for the watcher to see the last notices.
async fn run_sessions<B: WorkloadTarget>(
    keeper: &Keeper<B>,
    args: &WorkloadOptions,
    fleet: Option<&FleetOptions>,
    replica: Option<&str>,
) -> Result<Ran, WorkloadError> {
    let mut timeline = Timeline::default();
    if let Some(path) = fleet.and_then(|f| f.ledger.as_ref()) {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| WorkloadError::Fleet(format!("ledger {}: {e}", path.display())))?;
        timeline.ledger = Some(file);
    }
    let timeline = Arc::new(Mutex::new(timeline));
    let watcher = tokio::spawn(watch(keeper.subscribe(), timeline.clone()));
    let checks = Arc::new(AtomicU64::new(0));

    let total_calls = (args.sessions * args.calls) as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total_calls)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} calls  {msg}",
        )
        .map_err(|e| WorkloadError::Internal(e.to_string()))?,
    );

    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = Vec::new();
    for s in 0..args.sessions {
        let keeper = keeper.clone();
        let args = args.clone();
        let gate = gate.clone();
        let bar = bar.clone();
        let timeline = timeline.clone();
        let checks = checks.clone();
        let session = sid(replica, s);
        tasks.push(tokio::spawn(async move {
            let _slot = gate.acquire_owned().await.expect("open");
            session_task(s, session, &args, &keeper, &bar, &timeline, &checks).await
        }));
    }
    let mut records = BTreeMap::new();
    for (s, task) in tasks.into_iter().enumerate() {
        let record = task
            .await
            .map_err(|e| WorkloadError::Internal(e.to_string()))?;
        records.insert(sid(replica, s), record);
    }
    let workload = started.elapsed();
    bar.set_message("closing");
    let close_started = Instant::now();
    let report = keeper.close(Duration::from_secs(args.close_deadline)).await;
    let close_took = close_started.elapsed();
    bar.finish_and_clear();
    // Let the watcher see the last notices (bounded wait).
    let flushed = keeper.stats().versions_flushed;
    for _ in 0..500 {
        let seen = timeline
            .lock()
            .map(|tl| tl.settled.len() as u64 + tl.lagged)
            .unwrap_or(flushed);
        if seen >= flushed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    let timeline = std::mem::take(
        &mut *timeline
            .lock()
            .map_err(|e| WorkloadError::Internal(e.to_string()))?,
    );
    Ok(Ran {
        records,
        timeline,
        passed: checks.load(Ordering::SeqCst),
        workload,
        close_took,
        report,
    })
}

/// Where the demonstration hooks put the sandbox's credential, and the checkpoint marker.
const CREDENTIAL: &str = "credentials/token";
const CHECKPOINT: &str = "checkpoint";

/// The demonstration hook pair (see [`run`]): after start or resume, a credential naming the
/// sandbox (a resume first counts the checkpoint its workspace came back with); before a
/// suspension, the checkpoint marker.
async fn demo_hook<B: WorkloadTarget>(
    point: HookPoint,
    work: crate::SandboxWork<'static, B>,
    checkpoints: Arc<AtomicU64>,
) -> Result<(), String> {
    let fail = |e: crate::OpError| e.to_string();
    match point {
        HookPoint::AfterStart | HookPoint::AfterResume => {
            if point == HookPoint::AfterResume && work.exists(CHECKPOINT).await.map_err(fail)? {
                checkpoints.fetch_add(1, Ordering::Relaxed);
            }
            let token = format!("sandbox={} ttl=30s\n", work.sandbox().0);
            work.write(CREDENTIAL, token).await.map_err(fail)
        }
        HookPoint::BeforeSuspend => work
            .write(
                CHECKPOINT,
                format!("suspended sandbox={}\n", work.sandbox().0),
            )
            .await
            .map_err(fail),
        HookPoint::BeforeStop => Ok(()),
    }
}

/// Counts an operation's outcome: `ok`, or its error's kind.
fn count<T>(counts: &mut BTreeMap<&'static str, u64>, r: &Result<T, crate::OpError>) {
    let kind = match r {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    *counts.entry(kind).or_default() += 1;
}

fn percentiles(xs: &mut [Duration]) -> String {
    if xs.is_empty() {
        return "no samples".into();
    }
    xs.sort();
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.2?}  p90 {:.2?}  p99 {:.2?}  max {:.2?}  (n={})",
        at(0.5),
        at(0.9),
        at(0.99),
        xs[xs.len() - 1],
        xs.len()
    )
}

/// Session `s`'s name: `session-<s>`, or `<replica>-session-<s>` for a fleet's replica
/// (checked valid by [`FleetOptions::check`]).
fn sid(replica: Option<&str>, s: usize) -> SessionId {
    let name = match replica {
        None => format!("session-{s:03}"),
        Some(r) => format!("{r}-session-{s:03}"),
    };
    SessionId::new(name).expect("a valid name")
}

/// One session: its calls one after another.
async fn session_task<B: WorkloadTarget>(
    s: usize,
    session: SessionId,
    args: &WorkloadOptions,
    keeper: &Keeper<B>,
    bar: &ProgressBar,
    timeline: &Arc<Mutex<Timeline>>,
    checks: &Arc<AtomicU64>,
) -> SessionRecord {
    let mut rng = SplitMix64::new(args.seed.wrapping_mul(0x9E37_79B9).wrapping_add(s as u64));
    let user = UserId::new(format!("user-{:02}", s % args.users)).expect("a valid name");
    let log_path = PathName::session_log();
    let memory = PathName::new("memory.md").expect("a valid name");
    let mut record = SessionRecord::default();
    let mut log = String::new();
    for c in 0..args.calls {
        let call = CallId::new(format!("{session}-call-{c}")).expect("a valid name");
        let spec = CallSpec::new(call, session.clone()).with_user(user.clone());
        let guard = match keeper.acquire(spec).await {
            Ok(guard) => guard,
            Err(_) => {
                record.calls_failed += 1;
                bar.inc(1);
                continue;
            }
        };
        record.calls_ok += 1;
        // The call's tools need the credential its sandbox's hook put there for *this*
        // sandbox (a resumed workspace brings the previous one's, which names another).
        match guard.work().read(CREDENTIAL).await {
            Ok(token) => {
                let want = format!("sandbox={} ", guard.sandbox().0);
                if token.starts_with(want.as_bytes()) {
                    record.credentials_current += 1;
                } else {
                    record.credentials_wrong += 1;
                }
            }
            Err(e) if e.kind() == "sandbox-gone" => {}
            Err(e) if e.kind() == "not-found" => record.credentials_missing.push(guard.sandbox()),
            Err(_) => record.credentials_wrong += 1,
        }
        let dies_at = rng
            .chance(args.death_rate)
            .then(|| rng.below(args.turns as u64));
        for t in 0..args.turns {
            let line = serde_json::json!({
                "session": session.as_str(),
                "user": user.as_str(),
                "call": c,
                "turn": t,
                "sandbox": guard.sandbox().0,
            });
            log.push_str(&line.to_string());
            log.push('\n');
            let flushed = Instant::now();
            if let Ok(v) = keeper.flush(&session, &log_path, log.clone().into_bytes()) {
                record.versions.insert(v, log.clone());
                if let Ok(mut tl) = timeline.lock() {
                    tl.flushed_at
                        .insert((session.clone(), log_path.clone(), v), flushed);
                    if tl.ledger.is_some() {
                        tl.logs
                            .insert((session.clone(), v), (user.clone(), log.clone()));
                    }
                }
            }
            // The call's tool runs a command and reads back what it wrote, in the call's own
            // sandbox.
            let note = format!("tools/{c}-{t}.txt");
            let work = guard.work();
            let ran = work
                .exec(
                    [
                        "sh",
                        "-c",
                        "printf %s \"$1\" > \"$2\"",
                        "sh",
                        session.as_str(),
                        note.as_str(),
                    ],
                    ExecOptions {
                        timeout: Some(Duration::from_secs(10)),
                        ..ExecOptions::default()
                    },
                )
                .await;
            count(&mut record.operations, &ran);
            if matches!(&ran, Ok(out) if out.success()) {
                let read = work.read(&note).await;
                count(&mut record.operations, &read);
                if matches!(&read, Ok(b) if b.as_slice() != session.as_str().as_bytes()) {
                    record.tool_mismatches += 1;
                }
            }
            // A context-free component (the message bus) acts for the session.
            if t % 2 == 1 {
                match keeper.session_work(&session) {
                    Ok(bus) => {
                        let wrote = bus.write(&format!("bus/{c}-{t}"), session.as_str()).await;
                        count(&mut record.operations, &wrote);
                        if wrote.is_ok() {
                            record.bus_writes += 1;
                            if bus.sandbox() != guard.sandbox() {
                                record.bus_misroutes += 1;
                            }
                        }
                    }
                    Err(e) => count::<()>(&mut record.operations, &Err(e)),
                }
            }
            if dies_at == Some(t as u64) {
                // Someone kills the sandbox from outside.
                record.killed.insert(guard.sandbox());
                keeper.backend().kill(guard.sandbox()).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.below(4))).await;
        }
        // The memory writer will write after the call ends: it holds the session.
        if keeper.hold(&session).is_ok() {
            let keeper2 = keeper.clone();
            let session2 = session.clone();
            let memory2 = memory.clone();
            let text = format!("# memory of {session}\ncalls so far: {}\n", c + 1);
            let delay = Duration::from_millis(1 + rng.below(10));
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = keeper2.flush(&session2, &memory2, text.into_bytes());
                let _ = keeper2.unhold(&session2);
            });
        }
        let t0 = Instant::now();
        let outcome = guard.release().await;
        if outcome == Released::Completed {
            record.release_latencies.push(t0.elapsed());
        }
        if keeper.check_invariants().is_ok() {
            checks.fetch_add(1, Ordering::SeqCst);
        } else {
            eprintln!("invariant broken: {:?}", keeper.check_invariants());
        }
        let load = keeper.load();
        bar.set_message(format!(
            "{} live calls, {} sandboxes",
            load.live_calls, load.tracked_sandboxes
        ));
        bar.inc(1);
        if args.think_ms > 0 && c + 1 < args.calls {
            tokio::time::sleep(Duration::from_millis(args.think_ms)).await;
        }
    }
    record
}

/// Reads notices: flush-to-settle latencies, settlements, drains.
async fn watch(
    mut notices: tokio::sync::broadcast::Receiver<Notice>,
    timeline: Arc<Mutex<Timeline>>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let notice = match notices.recv().await {
            Ok(notice) => notice,
            Err(RecvError::Lagged(n)) => {
                if let Ok(mut tl) = timeline.lock() {
                    tl.lagged += n;
                }
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let Ok(mut tl) = timeline.lock() else { return };
        match notice {
            Notice::Drain { .. } => tl.drains += 1,
            Notice::Event(Event::Settled {
                session,
                path,
                version,
                outcome,
            }) => {
                if let Settlement::Uploaded { sandbox } = &outcome {
                    if path == PathName::session_log() {
                        tl.acknowledge(&session, version, *sandbox);
                    }
                }
                let key = (session, path, version);
                if let Some(at) = tl.flushed_at.remove(&key) {
                    tl.settle_latencies.push(at.elapsed());
                }
                if tl.settled.insert(key, outcome).is_some() {
                    tl.settled_twice += 1;
                }
            }
            Notice::Event(_) => {}
        }
    }
}
