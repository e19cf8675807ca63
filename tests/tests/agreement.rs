//! Agreement: every scenario of `sim/scenarios/` run (a) through the simulator's own harness on
//! the real core and (b) through the io-tokio [`Keeper`] with a scripted backend that answers
//! each command exactly as the scenario's backend steps say, under tokio's paused clock. Both
//! runs must give the same settlements (session, path, version, outcome), the same commands in
//! the same order for every sandbox, the same call outcomes (ready, failed, revoked, lost) and
//! the same immediate answers to the application's inputs. The driver run also checks every
//! `resolve` and `expect` line on its own, and judges what it saw by `sandkeeper_check`'s rules
//! (the ones the simulator's history applies to the core's outputs): the order of the operations
//! its backend received, the numbering and settlement of the versions the keeper handed out and
//! announced, nothing after `Closed`.
//!
//! How the scenario maps onto the driver:
//! - `acquire` spawns `keeper.acquire(..)` (the call's name travels in its `Spec`, so a Start
//!   names the call that caused it); `release` releases the guard (`release … as=` with
//!   `release_as`), or drops the acquire future while it is not ready (the driver's
//!   cancellation, which the core sees as a release, asking nothing).
//! - backend steps answer the oldest matching command the scripted backend holds; `die` goes
//!   through the backend's `DeathSink`; `settle` answers everything outstanding with success
//!   until nothing is.
//! - `advance` is `tokio::time::advance`; between steps the test only yields (never parks), so
//!   the paused clock never moves on its own.
//! - after the last line, as the simulator does: every command is answered with success and time
//!   runs (auto-advance) until no timer is due.
//!
//! Steps the driver cannot express, skipped in (b) only (the simulator must have refused them,
//! so they changed nothing): a `release` of a call the application holds no guard for (an
//! unknown call, a second release, a release after close revoked or ended the call). The typed
//! API makes these impossible: a guard is consumed by its one release. This affects
//! `edge-errors.scn` (`release zz`, the second `release a`) and `r08-close-vs-late-write.scn`
//! (`release a` after `Closed`); the `expect error` line after such a step is left to the
//! simulator. Likewise a backend answer to a command the driver has already dropped because the
//! core stopped awaiting it (a start abandoned when the core ordered its sandbox's Shutdown, a
//! command past the driver's deadline) cannot reach the core: it is recorded as abandoned and
//! the `expect error` after it is the simulator's (`edge-answer-after-closed.scn`, `start-ok @a`
//! after `Closed`). No one-process scenario file is skipped as a whole; a fleet scenario (a file
//! with a `fleet` line, `fleet-*.scn`) runs several cores over the simulator's own store and
//! backend, and is the fleet simulator's alone (io-tokio's fleet mode has its own tests).
//!
//! A scenario known to disagree would be listed in [`KNOWN_DISAGREEMENTS`] (none is today): the
//! test requires each listed one to fail in exactly its known way, and fails when one starts
//! agreeing.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkeeper::{
    CallSpec, Command, DiscardReason, ErrorKind, Event, HookPoint, PathName, SandboxId,
    SandboxState, SessionId, Settlement, Snapshot, Spec,
};
use sandkeeper_check::{Lanes, OutputChecker, Versions};
use sandkeeper_tokio::ops::{ExecRequest, WorkPath};
use sandkeeper_tokio::{
    Backend, BackendError, CallGuard, DeathSink, DiscardRequest, Entry, ExecOutput, Keeper,
    KeeperConfig, KeeperError, Loss, Notice, OpError, PersistRequest, SandboxOps, SessionWork,
    StartRequest, StopRequest, UploadRequest,
};
use sim::harness::{Harness, HarnessOptions};
use sim::scenario::{parse, run_scenario, Scenario, Verdict};
use sim::step::{Answer, Expect, OpKind, ResolveExpect, Step};
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------------------------
// What both runs are compared on

/// A command as a backend receives it, without the ids and bytes that only one side has.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cmd {
    Start {
        resume_from: Option<String>,
        resumes: Option<u64>,
    },
    Upload {
        session: String,
        path: String,
        version: u64,
    },
    Stop {
        suspend: bool,
    },
    Persist {
        snapshot: Option<String>,
        suspend: bool,
    },
    Shutdown,
    Discard {
        snapshot: String,
        reason: DiscardReason,
    },
    Hook {
        hook: HookPoint,
    },
}

impl Cmd {
    /// The backend-facing commands of the core (Drain, CancelUpload and Abandon are not sent
    /// to a backend: the driver publishes the first and drops the operation for the others).
    fn of(command: &Command) -> Option<(SandboxId, Cmd)> {
        let snap = |s: &Option<Snapshot>| s.as_ref().map(|s| s.as_str().to_string());
        Some(match command {
            Command::Start {
                sandbox,
                resume_from,
                resumes,
                ..
            } => (
                *sandbox,
                Cmd::Start {
                    resume_from: snap(resume_from),
                    resumes: resumes.map(|x| x.0),
                },
            ),
            Command::Upload {
                sandbox,
                session,
                path,
                version,
                ..
            } => (
                *sandbox,
                Cmd::Upload {
                    session: session.to_string(),
                    path: path.to_string(),
                    version: version.0,
                },
            ),
            Command::Stop {
                sandbox, suspend, ..
            } => (*sandbox, Cmd::Stop { suspend: *suspend }),
            Command::Persist {
                sandbox,
                snapshot,
                suspend,
                ..
            } => (
                *sandbox,
                Cmd::Persist {
                    snapshot: snap(snapshot),
                    suspend: *suspend,
                },
            ),
            Command::Shutdown { sandbox, .. } => (*sandbox, Cmd::Shutdown),
            Command::Discard {
                sandbox,
                snapshot,
                reason,
                ..
            } => (
                *sandbox,
                Cmd::Discard {
                    snapshot: snapshot.as_str().to_string(),
                    reason: *reason,
                },
            ),
            Command::Hook { sandbox, hook, .. } => (*sandbox, Cmd::Hook { hook: *hook }),
            Command::CancelUpload { .. } | Command::Drain { .. } | Command::Abandon { .. } => {
                return None
            }
            Command::Adopt { .. } | Command::Relinquish { .. } => {
                panic!("{command:?}: the agreement runs configure no fleet")
            }
        })
    }
}

/// (session, path, version).
type VersionKey = (String, String, u64);

/// Everything one run is compared on.
#[derive(Debug, Default, PartialEq)]
struct Record {
    /// Per sandbox, the commands in the order the core ordered (sim) or the backend received
    /// them (driver).
    commands: BTreeMap<u64, Vec<Cmd>>,
    /// Every settled version.
    settlements: BTreeMap<VersionKey, Settlement>,
    /// Call events (ready, failed, revoked, lost), in order.
    calls: Vec<String>,
    /// The immediate answer to each acquire, flush, hold and unhold: (line, error kind).
    answers: Vec<(usize, Option<String>)>,
    /// Whether close finished.
    closed: bool,
    /// What `sandkeeper_check` found wrong in the driver run: operations its backend received
    /// out of order (lanes), versions handed out or settled wrongly (versions), events after
    /// `Closed` (outputs). The simulator's run checks the same rules on the core's outputs and
    /// has none when it passes.
    violations: Vec<String>,
}

impl Record {
    fn event(&mut self, event: &Event) {
        match event {
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                // Settling once is `settle-once`'s: the simulator's history checks it on its run,
                // the driver run's `Versions` on the events the keeper announced.
                let key = (session.to_string(), path.to_string(), version.0);
                self.settlements.insert(key, outcome.clone());
            }
            Event::CallReady { call, sandbox } => {
                self.calls.push(format!("{call} ready {sandbox}"))
            }
            Event::CallFailed { call, error } => {
                self.calls.push(format!("{call} failed {}", error.as_str()))
            }
            Event::CallRevoked { call } => self.calls.push(format!("{call} revoked")),
            Event::SandboxLost { call, sandbox } => {
                self.calls.push(format!("{call} lost {sandbox}"))
            }
            Event::Closed { .. } => self.closed = true,
            Event::KeyFenced { key, .. } => self.calls.push(format!("{key} fenced")),
            Event::HookFailed {
                sandbox,
                hook,
                late,
            } => self.calls.push(format!(
                "{sandbox} {} hook failed (late: {late})",
                hook.as_str()
            )),
            Event::WayDownFailed { sandbox, kept, .. } => self
                .calls
                .push(format!("{sandbox} left as it was (kept: {kept:?})")),
            Event::WorkspaceLost { sandbox, key } => self
                .calls
                .push(format!("{sandbox} of {key}: workspace lost")),
            Event::CallReleased { .. }
            | Event::MirrorSettled { .. }
            | Event::ShutdownUnconfirmed { .. } => {}
        }
    }
}

/// Whether a step is an application input whose immediate answer both sides can observe.
fn answered_at_once(step: &Step) -> bool {
    matches!(
        step,
        Step::Acquire { .. }
            | Step::Flush { .. }
            | Step::Hold(_)
            | Step::Unhold(_)
            | Step::Enter(_)
            | Step::Leave(_)
            | Step::DropSnapshot(_)
    )
}

// ---------------------------------------------------------------------------------------------
// (a) The simulator

/// Runs the scenario through the simulator's runner (it must pass), then once more through its
/// harness with the trace on, to read the commands and events the core gave.
fn simulate(scenario: &Scenario) -> Record {
    assert_eq!(run_scenario(scenario, None), Verdict::Pass);
    let opts = HarnessOptions {
        keep_settlements: true,
        trace: true,
        ..HarnessOptions::default()
    };
    let mut h = Harness::new(scenario.config.clone(), scenario.close_deadline, opts).unwrap();
    let mut answers = Vec::new();
    for (line, step) in &scenario.steps {
        h.apply(step)
            .unwrap_or_else(|e| panic!("line {line}: {e:?}"));
        if answered_at_once(step) {
            answers.push((*line, h.last_error.map(|k| k.as_str().to_string())));
        }
    }
    // The runner's liveness phase: answer everything, let time run until no timer is due.
    for _ in 0..2_000 {
        h.settle(None).unwrap();
        if h.history.closed() {
            break;
        }
        match h.core.poll_timeout() {
            Some(t) => {
                let t = t.as_nanos().div_ceil(1_000_000);
                let d = t.saturating_sub(h.now_ms).max(1);
                h.apply(&Step::Advance(Duration::from_millis(d))).unwrap();
            }
            None if !h.ledger.any(None) => break,
            None => {}
        }
    }
    let mut record = Record {
        answers,
        ..Record::default()
    };
    for line in &h.trace {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut commands = value["commands"].clone();
        // The trace writes an upload's payload as its length; the bytes are not compared.
        for c in commands.as_array_mut().into_iter().flatten() {
            if let Some(p) = c.get_mut("payload").filter(|p| p.is_number()) {
                *p = serde_json::json!([]);
            }
        }
        let commands: Vec<Command> = serde_json::from_value(commands).unwrap();
        for (x, cmd) in commands.iter().filter_map(Cmd::of) {
            record.commands.entry(x.0).or_default().push(cmd);
        }
        let events: Vec<Event> = serde_json::from_value(value["events"].clone()).unwrap();
        for event in &events {
            record.event(event);
        }
    }
    record
}

// ---------------------------------------------------------------------------------------------
// (b) The driver, on a scripted backend

/// How the script answers one command.
#[derive(Debug)]
enum Reply {
    Ok(Option<Snapshot>),
    Fail,
    Gone,
}

/// A command the backend received and has not answered.
struct Outstanding {
    kind: OpKind,
    sandbox: SandboxId,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct ScriptState {
    /// Every command received, in order.
    log: Vec<(SandboxId, Cmd)>,
    /// The order of each sandbox's operations, judged as it is received.
    lanes: Lanes,
    /// What the lanes found out of order.
    violations: Vec<String>,
    /// Commands waiting for the script, oldest first.
    outstanding: Vec<Outstanding>,
    /// Answer everything with success at once (the liveness phase).
    auto: bool,
    /// The sandbox each call's Start brought up (the call's name is its spec).
    starters: HashMap<String, SandboxId>,
    deaths: Option<DeathSink>,
}

impl ScriptState {
    /// Success, as the simulator's `settle` answers it: a Stop that suspends, or of a sandbox
    /// that resumed a snapshot, takes one (`kept-<sandbox>`), as a faithful backend would.
    fn auto_reply(&self, kind: OpKind, sandbox: SandboxId) -> Reply {
        if kind != OpKind::Stop {
            return Reply::Ok(None);
        }
        let mine = || {
            self.log
                .iter()
                .filter(|(x, _)| *x == sandbox)
                .map(|(_, c)| c)
        };
        let suspends = mine()
            .rev()
            .find_map(|c| match c {
                Cmd::Stop { suspend } => Some(*suspend),
                _ => None,
            })
            .unwrap_or(false);
        let resumed = mine().any(|c| {
            matches!(
                c,
                Cmd::Start {
                    resume_from: Some(_),
                    ..
                }
            )
        });
        if suspends || resumed {
            Reply::Ok(Some(Snapshot::new(format!("kept-{}", sandbox.0))))
        } else {
            Reply::Ok(None)
        }
    }
}

/// A backend that answers each command only when the test says how. Its clone shares the
/// state: the keeper's hooks receive through one (a hook is the application's, not the
/// backend's, but the scenario answers it like a command).
#[derive(Default, Clone)]
struct Script {
    state: Arc<Mutex<ScriptState>>,
}

impl Script {
    fn lock(&self) -> std::sync::MutexGuard<'_, ScriptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a received command and waits for its answer.
    async fn receive(&self, kind: OpKind, sandbox: SandboxId, cmd: Cmd) -> Reply {
        let rx = {
            let mut st = self.lock();
            if let Err(v) = st.lanes.take(sandbox, kind) {
                st.violations.push(format!("{v}: {cmd:?}"));
            }
            st.log.push((sandbox, cmd));
            if st.auto {
                return st.auto_reply(kind, sandbox);
            }
            let (reply, rx) = oneshot::channel();
            st.outstanding.push(Outstanding {
                kind,
                sandbox,
                reply,
            });
            rx
        };
        rx.await.unwrap_or(Reply::Fail)
    }

    /// Answers the oldest outstanding command of `kind` for `sandbox` whose caller still
    /// waits. `false`: there is none (the driver abandoned it, e.g. at its own deadline).
    fn answer(&self, kind: OpKind, sandbox: SandboxId, reply: Reply) -> bool {
        let mut st = self.lock();
        st.outstanding.retain(|o| !o.reply.is_closed());
        let Some(i) = st
            .outstanding
            .iter()
            .position(|o| o.kind == kind && o.sandbox == sandbox)
        else {
            return false;
        };
        let o = st.outstanding.remove(i);
        o.reply.send(reply).is_ok()
    }

    /// The oldest outstanding command (for `sandbox`, when given) whose caller still waits.
    fn oldest(&self, sandbox: Option<SandboxId>) -> Option<(OpKind, SandboxId)> {
        let mut st = self.lock();
        st.outstanding.retain(|o| !o.reply.is_closed());
        st.outstanding
            .iter()
            .find(|o| sandbox.is_none_or(|x| o.sandbox == x))
            .map(|o| (o.kind, o.sandbox))
    }

    /// From now on every command succeeds at once; the outstanding ones too.
    fn go_auto(&self) {
        let mut st = self.lock();
        st.auto = true;
        for o in std::mem::take(&mut st.outstanding) {
            let reply = st.auto_reply(o.kind, o.sandbox);
            let _ = o.reply.send(reply);
        }
    }

    fn received(&self, sandbox: SandboxId) -> Vec<Cmd> {
        self.lock()
            .log
            .iter()
            .filter(|(x, _)| *x == sandbox)
            .map(|(_, c)| c.clone())
            .collect()
    }
}

fn failure(reply: Reply) -> BackendError {
    match reply {
        Reply::Gone => BackendError::gone("scripted: gone"),
        _ => BackendError::fatal("scripted: failed"),
    }
}

/// The scripted world takes work into its sandboxes (`enter`, `leave`: what the agreement
/// compares) but runs none: scenarios have no step that runs a command or touches a file.
fn no_work() -> OpError {
    OpError::Backend {
        what: "agreement script",
        error: "scenarios enter and leave sandboxes but run no operation".into(),
    }
}

impl SandboxOps for Script {
    async fn exec(&self, _: SandboxId, _: ExecRequest) -> Result<ExecOutput, OpError> {
        Err(no_work())
    }
    async fn write(&self, _: SandboxId, _: WorkPath, _: Vec<u8>) -> Result<(), OpError> {
        Err(no_work())
    }
    async fn read(&self, _: SandboxId, _: WorkPath, _: usize) -> Result<Vec<u8>, OpError> {
        Err(no_work())
    }
    async fn list(&self, _: SandboxId, _: WorkPath) -> Result<Vec<Entry>, OpError> {
        Err(no_work())
    }
    async fn remove(&self, _: SandboxId, _: WorkPath) -> Result<(), OpError> {
        Err(no_work())
    }
    async fn exists(&self, _: SandboxId, _: WorkPath) -> Result<bool, OpError> {
        Err(no_work())
    }
}

impl Backend for Script {
    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let x = request.sandbox;
        self.lock()
            .starters
            .insert(request.spec.as_str().to_string(), x);
        let resume_from = request.resume_from.map(|s| s.as_str().to_string());
        let resumes = request.resumes.map(|x| x.0);
        match self
            .receive(
                OpKind::Start,
                x,
                Cmd::Start {
                    resume_from,
                    resumes,
                },
            )
            .await
        {
            Reply::Ok(_) => Ok(()),
            other => Err(failure(other)),
        }
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let cmd = Cmd::Upload {
            session: request.session.to_string(),
            path: request.path.to_string(),
            version: request.version.0,
        };
        match self.receive(OpKind::Upload, request.sandbox, cmd).await {
            Reply::Ok(_) => Ok(()),
            Reply::Fail => Err(BackendError::transient("scripted: failed")),
            Reply::Gone => Err(BackendError::gone("scripted: gone")),
        }
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        let cmd = Cmd::Stop {
            suspend: request.suspend,
        };
        match self.receive(OpKind::Stop, request.sandbox, cmd).await {
            Reply::Ok(snapshot) => Ok(snapshot),
            other => Err(failure(other)),
        }
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        let snapshot = request.snapshot.map(|s| s.as_str().to_string());
        let cmd = Cmd::Persist {
            snapshot,
            suspend: request.suspend,
        };
        match self.receive(OpKind::Persist, request.sandbox, cmd).await {
            Reply::Ok(_) => Ok(()),
            other => Err(failure(other)),
        }
    }

    async fn shutdown(
        &self,
        sandbox: SandboxId,
        _token: Option<sandkeeper::Token>,
    ) -> Result<(), BackendError> {
        match self.receive(OpKind::Shutdown, sandbox, Cmd::Shutdown).await {
            Reply::Ok(_) => Ok(()),
            other => Err(failure(other)),
        }
    }

    async fn discard(&self, request: DiscardRequest) -> Result<(), BackendError> {
        // No answer and no lane: recorded as received.
        let cmd = Cmd::Discard {
            snapshot: request.snapshot.as_str().to_string(),
            reason: request.reason,
        };
        self.lock().log.push((request.sandbox, cmd));
        Ok(())
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        self.lock().deaths = Some(deaths);
    }
}

/// The answer a scenario's backend step gives.
fn reply(answer: &Answer) -> Reply {
    match answer {
        Answer::StartOk
        | Answer::UploadOk
        | Answer::PersistOk
        | Answer::HookOk
        | Answer::ShutdownOk
        | Answer::StopOk { snapshot: None } => Reply::Ok(None),
        Answer::StopOk { snapshot } => Reply::Ok(snapshot.clone()),
        Answer::UploadFail { gone: true } => Reply::Gone,
        Answer::StartFail
        | Answer::UploadFail { gone: false }
        | Answer::StopFail
        | Answer::PersistFail
        | Answer::ShutdownFail
        | Answer::HookFail
        | Answer::Die
        | Answer::InstanceGone => Reply::Fail,
    }
}

/// Lets every task that can run, run, without letting the paused clock move (the test task is
/// always runnable, so the runtime never parks and never auto-advances).
async fn quiesce() {
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
}

/// `last_error` after a step the driver cannot express (see the module docs).
const SKIPPED: &str = "(step not expressible through the driver)";

type Acquire = JoinHandle<Result<CallGuard<Script>, KeeperError>>;

/// A call as the application holds it.
enum Held {
    Acquiring(Acquire),
    Ready(CallGuard<Script>),
}

/// The application side of the driver run.
struct Driver {
    keeper: Keeper<Script>,
    notices: broadcast::Receiver<Notice>,
    close_deadline: Duration,
    held: HashMap<String, Held>,
    /// Each session's entered work, oldest first (`leave` drops the oldest).
    entered: HashMap<String, std::collections::VecDeque<SessionWork<Script>>>,
    /// Calls that failed (at once or later), with the error kind.
    failed: HashMap<String, String>,
    /// The sandbox each call was bound to, as the driver saw it.
    bound: HashMap<String, SandboxId>,
    last_error: Option<String>,
    record: Record,
    /// The versions the keeper handed out and announced settled, and the shape of its event
    /// stream, judged by `sandkeeper_check`'s rules.
    versions: Versions,
    outputs: OutputChecker,
    tasks: Vec<JoinHandle<()>>,
    /// Steps skipped as inexpressible, and answers that found the command abandoned.
    skipped: Vec<usize>,
    abandoned: Vec<usize>,
}

impl Driver {
    fn new(scenario: &Scenario) -> Self {
        let script = Script::default();
        let hooks = script.clone();
        let keeper = Keeper::with_hooks(
            KeeperConfig::with_core(scenario.config.clone()),
            script,
            move |point, work| {
                let hooks = hooks.clone();
                async move {
                    let cmd = Cmd::Hook { hook: point };
                    match hooks.receive(OpKind::Hook, work.sandbox(), cmd).await {
                        Reply::Ok(_) => Ok(()),
                        _ => Err("scripted: failed".to_string()),
                    }
                }
            },
        )
        .unwrap();
        let notices = keeper.subscribe();
        Driver {
            keeper,
            notices,
            close_deadline: scenario.close_deadline,
            held: HashMap::new(),
            entered: HashMap::new(),
            failed: HashMap::new(),
            bound: HashMap::new(),
            last_error: None,
            record: Record::default(),
            versions: Versions::new(),
            outputs: OutputChecker::new(),
            tasks: Vec::new(),
            skipped: Vec::new(),
            abandoned: Vec::new(),
        }
    }

    fn script(&self) -> &Script {
        self.keeper.backend()
    }

    /// Lets the runtime settle, then reads the notices and the acquires that ended.
    async fn observe(&mut self) {
        quiesce().await;
        loop {
            match self.notices.try_recv() {
                Ok(Notice::Event(event)) => {
                    match &event {
                        Event::CallReady { call, sandbox }
                        | Event::SandboxLost { call, sandbox } => {
                            self.bound.insert(call.to_string(), *sandbox);
                        }
                        Event::CallFailed { call, error } => {
                            self.failed
                                .insert(call.to_string(), error.as_str().to_string());
                        }
                        _ => {}
                    }
                    let judged = self.outputs.event(&event).and_then(|()| match &event {
                        Event::Settled {
                            session,
                            path,
                            version,
                            outcome,
                        } => self.versions.settled(session, path, version.0, outcome),
                        _ => Ok(()),
                    });
                    if let Err(v) = judged {
                        self.record.violations.push(v.to_string());
                    }
                    self.record.event(&event);
                }
                Ok(Notice::Drain { .. }) => {}
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(e) => panic!("notices: {e}"),
            }
        }
        let finished: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| matches!(h, Held::Acquiring(t) if t.is_finished()))
            .map(|(c, _)| c.clone())
            .collect();
        for call in finished {
            let Some(Held::Acquiring(task)) = self.held.remove(&call) else {
                unreachable!()
            };
            match task.await.unwrap() {
                Ok(guard) => {
                    self.held.insert(call, Held::Ready(guard));
                }
                Err(KeeperError::CallFailed { error, .. }) => {
                    self.failed.insert(call, error.as_str().to_string());
                }
                Err(KeeperError::Core(e)) => {
                    self.failed.insert(call, e.kind().as_str().to_string());
                }
                Err(_) => {}
            }
        }
    }

    /// The sandbox `@call` names.
    fn sandbox_of(&self, call: &str) -> SandboxId {
        self.bound
            .get(call)
            .copied()
            .or_else(|| self.script().lock().starters.get(call).copied())
            .unwrap_or_else(|| panic!("@{call} names no sandbox in the driver run"))
    }

    fn answered(&mut self, line: usize, result: Result<(), ErrorKind>) {
        self.last_error = result.err().map(|k| k.as_str().to_string());
        self.record.answers.push((line, self.last_error.clone()));
    }

    async fn step(&mut self, line: usize, step: &Step) {
        match step {
            Step::Acquire {
                call,
                session,
                user,
                external,
            } => {
                let mut spec = CallSpec::new(call.clone(), session.clone())
                    .with_spec(Spec::new(call.as_str()));
                if let Some(u) = user {
                    spec = spec.with_user(u.clone());
                }
                if let Some(e) = external {
                    spec = spec.with_external(e.clone());
                }
                let keeper = self.keeper.clone();
                let task = tokio::spawn(async move { keeper.acquire(spec).await });
                quiesce().await;
                if task.is_finished() {
                    match task.await.unwrap() {
                        Err(KeeperError::Core(e)) => {
                            let kind = e.kind();
                            if !self.held.contains_key(call.as_str()) {
                                self.failed
                                    .insert(call.to_string(), kind.as_str().to_string());
                            }
                            self.answered(line, Err(kind));
                        }
                        Ok(guard) => {
                            self.held.insert(call.to_string(), Held::Ready(guard));
                            self.answered(line, Ok(()));
                        }
                        Err(other) => {
                            self.failed.insert(call.to_string(), format!("{other}"));
                            self.answered(line, Ok(()));
                        }
                    }
                } else {
                    self.held.insert(call.to_string(), Held::Acquiring(task));
                    self.answered(line, Ok(()));
                }
            }
            Step::Release(call) | Step::ReleaseAs(call, _) => match self.held.remove(call.as_str())
            {
                Some(Held::Ready(guard)) => {
                    let way = step.asked_way();
                    self.tasks.push(tokio::spawn(async move {
                        match way {
                            None => guard.release().await,
                            Some(way) => guard.release_as(way).await,
                        };
                    }));
                }
                // Dropping the acquire future is the driver's release of a call not ready yet.
                Some(Held::Acquiring(task)) => task.abort(),
                None => {
                    self.skipped.push(line);
                    self.last_error = Some(SKIPPED.to_string());
                }
            },
            Step::Flush {
                session,
                path,
                bytes,
            } => {
                let path = path.clone().unwrap_or_else(PathName::session_log);
                let r = self.keeper.flush(session, &path, vec![b'x'; *bytes]);
                if let Ok(v) = &r {
                    if let Err(v) = self.versions.flushed(session, &path, v.0) {
                        self.record.violations.push(v.to_string());
                    }
                }
                self.answered(line, r.map(|_| ()).map_err(kind_of));
            }
            Step::Resolve(session, expect) => self.resolve(line, session, expect),
            Step::Refused { call, .. } => {
                // The name never becomes an input: the driver's API takes the core's name
                // types, which refuse it, exactly as the simulator's run does.
                if let Some(c) = call {
                    self.failed
                        .insert(c.clone(), ErrorKind::InvalidName.as_str().to_string());
                }
                self.last_error = Some(ErrorKind::InvalidName.as_str().to_string());
            }
            Step::DropSnapshot(key) => {
                let r = self.keeper.drop_snapshot(key);
                self.answered(line, r.map(drop).map_err(kind_of));
            }
            Step::Hold(session) => {
                let r = self.keeper.hold(session);
                self.answered(line, r.map_err(kind_of));
            }
            Step::Unhold(session) => {
                let r = self.keeper.unhold(session);
                self.answered(line, r.map_err(kind_of));
            }
            Step::Enter(session) => match self.keeper.session_work(session) {
                Ok(work) => {
                    self.entered
                        .entry(session.to_string())
                        .or_default()
                        .push_back(work);
                    self.answered(line, Ok(()));
                }
                Err(OpError::NoActiveSandbox { .. }) => {
                    self.answered(line, Err(ErrorKind::NoActiveSandbox))
                }
                Err(OpError::Keeper(e)) => self.answered(line, Err(kind_of(e))),
                Err(other) => panic!("enter {session}: {other}"),
            },
            Step::Leave(session) => {
                let work = self
                    .entered
                    .get_mut(session.as_str())
                    .and_then(std::collections::VecDeque::pop_front);
                match work {
                    Some(work) => match work.leave() {
                        Ok(()) => self.answered(line, Ok(())),
                        Err(OpError::Keeper(e)) => self.answered(line, Err(kind_of(e))),
                        Err(other) => panic!("leave {session}: {other}"),
                    },
                    None => self.answered(line, Err(ErrorKind::NotEntered)),
                }
            }
            Step::Close(deadline) => {
                let keeper = self.keeper.clone();
                let d = deadline.unwrap_or(self.close_deadline);
                self.tasks.push(tokio::spawn(async move {
                    keeper.close(d).await;
                }));
            }
            Step::Advance(d) => tokio::time::advance(*d).await,
            Step::Answer(answer, call) => {
                let x = self.sandbox_of(call.as_str());
                match answer.op() {
                    None => {
                        let sink = self.script().lock().deaths.clone().expect("death sink");
                        let loss = if *answer == Answer::InstanceGone {
                            Loss::Instance
                        } else {
                            Loss::Sandbox
                        };
                        sink.report_loss(x, loss);
                    }
                    Some(kind) => {
                        if !self.script().answer(kind, x, reply(answer)) {
                            // The driver dropped the command (the core stopped awaiting it):
                            // the answer cannot reach the core, so its refusal, if any, is
                            // the simulator's to check.
                            self.abandoned.push(line);
                            self.last_error = Some(SKIPPED.to_string());
                        }
                    }
                }
            }
            Step::Settle(only) => {
                let only = only.as_ref().map(|c| self.sandbox_of(c.as_str()));
                for _ in 0..10_000 {
                    quiesce().await;
                    let Some((kind, x)) = self.script().oldest(only) else {
                        break;
                    };
                    let answer = Answer::success(kind);
                    assert!(self.script().answer(kind, x, reply(&answer)));
                }
            }
            Step::Expect(e) => {
                self.observe().await;
                self.expect(line, e);
            }
            Step::Unspellable(_) => {}
            Step::On(..) | Step::Fleet(_) => {
                unreachable!(
                    "line {line}: a fleet scenario's step; fleet scenarios are not run here"
                )
            }
        }
        self.observe().await;
    }

    fn resolve(&self, line: usize, session: &SessionId, expect: &ResolveExpect) {
        let got = self.keeper.resolve(session);
        let fits = match (expect, &got) {
            (ResolveExpect::Call(c), Ok(x)) => self.sandbox_of(c.as_str()) == *x,
            (ResolveExpect::None, Err(e)) => kind_of(e.clone()) == ErrorKind::NoActiveSandbox,
            (ResolveExpect::Gone, Err(e)) => kind_of(e.clone()) == ErrorKind::SandboxGone,
            _ => false,
        };
        assert!(
            fits,
            "line {line}: resolve {session}: expected {expect:?}, got {got:?}"
        );
    }

    fn expect(&self, line: usize, e: &Expect) {
        let cmds = |call: &str| self.script().received(self.sandbox_of(call));
        let settled = |session: &SessionId, path: &Option<PathName>, version: u64| {
            let path = path.clone().unwrap_or_else(PathName::session_log);
            self.record
                .settlements
                .get(&(session.to_string(), path.to_string(), version))
                .cloned()
        };
        let ok = match e {
            Expect::Ready(c) => matches!(self.held.get(c.as_str()), Some(Held::Ready(_))),
            Expect::Waiting(c) => matches!(self.held.get(c.as_str()), Some(Held::Acquiring(_))),
            Expect::Failed(c, kind) => self
                .failed
                .get(c.as_str())
                .is_some_and(|k| kind.as_ref().is_none_or(|want| want == k)),
            Expect::Uploaded {
                session,
                path,
                version,
                into,
            } => {
                let x = self.sandbox_of(into.as_str());
                settled(session, path, *version) == Some(Settlement::Uploaded { sandbox: x })
            }
            Expect::Dropped {
                session,
                path,
                version,
                reason,
            } => match settled(session, path, *version) {
                Some(Settlement::Superseded { .. }) => {
                    reason.as_deref().is_none_or(|r| r == "superseded")
                }
                Some(Settlement::Dropped { reason: why }) => {
                    reason.as_deref().is_none_or(|r| r == why.as_str())
                }
                _ => false,
            },
            Expect::Running(c) => {
                let x = self.sandbox_of(c.as_str());
                let up = self
                    .keeper
                    .sandbox_state(x)
                    .is_some_and(SandboxState::accepts_uploads);
                let down = cmds(c.as_str())
                    .iter()
                    .any(|cmd| matches!(cmd, Cmd::Stop { .. } | Cmd::Shutdown));
                up && !down
            }
            Expect::State(c, state) => {
                self.keeper.sandbox_state(self.sandbox_of(c.as_str())) == Some(*state)
            }
            Expect::Stop(c) => cmds(c.as_str())
                .iter()
                .any(|cmd| matches!(cmd, Cmd::Stop { .. })),
            Expect::NoStop(c) => !cmds(c.as_str())
                .iter()
                .any(|cmd| matches!(cmd, Cmd::Stop { .. })),
            Expect::Shutdown(c) => cmds(c.as_str()).contains(&Cmd::Shutdown),
            Expect::NoShutdown(c) => !cmds(c.as_str()).contains(&Cmd::Shutdown),
            Expect::Resumed(c, snap) => cmds(c.as_str())
                .iter()
                .any(|cmd| matches!(cmd, Cmd::Start { resume_from: Some(s), .. } if s == snap)),
            Expect::Discarded(s) | Expect::NoDiscard(s) => {
                // As the simulator counts them: a snapshot its key let go of, not what a start
                // left of one it took (`taken`).
                let discarded = self.script().lock().log.iter().any(|(_, cmd)| {
                    matches!(cmd, Cmd::Discard { snapshot, reason }
                        if snapshot == s && *reason != DiscardReason::Taken)
                });
                discarded == matches!(e, Expect::Discarded(_))
            }
            Expect::Closed => self.keeper.is_closed(),
            // The refusal of a step the driver cannot express is the simulator's to check.
            Expect::Error(kind) => {
                self.last_error.as_deref() == Some(SKIPPED)
                    || self.last_error.as_deref() == Some(kind.as_str())
            }
        };
        assert!(
            ok,
            "line {line}: `{e}` does not hold in the driver run; received: {:?}; abandoned answers at lines {:?}; calls: {:?}",
            self.script().lock().log,
            self.abandoned,
            self.record.calls,
        );
    }

    /// After the last line: every command succeeds and time runs until no timer is due.
    async fn liveness(&mut self) {
        self.observe().await;
        self.script().go_auto();
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        self.observe().await;
        for task in std::mem::take(&mut self.tasks) {
            assert!(task.is_finished(), "a release or close never finished");
        }
        let log = self.script().lock().log.clone();
        for (x, cmd) in log {
            self.record.commands.entry(x.0).or_default().push(cmd);
        }
    }
}

fn kind_of(e: KeeperError) -> ErrorKind {
    match e {
        KeeperError::Core(e) => e.kind(),
        other => panic!("not a core refusal: {other}"),
    }
}

async fn drive(scenario: &Scenario) -> (Record, Vec<usize>, Vec<usize>) {
    let mut d = Driver::new(scenario);
    d.observe().await;
    for (line, step) in &scenario.steps {
        d.step(*line, step).await;
    }
    d.liveness().await;
    d.keeper.check_invariants().unwrap();
    let violations = std::mem::take(&mut d.script().lock().violations);
    d.record.violations.extend(violations);
    if let Err(v) = d.versions.all_settled() {
        d.record.violations.push(v.to_string());
    }
    let skipped = std::mem::take(&mut d.skipped);
    let abandoned = std::mem::take(&mut d.abandoned);
    (std::mem::take(&mut d.record), skipped, abandoned)
}

// ---------------------------------------------------------------------------------------------
// The test

fn scenario_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sim/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "scn"))
        .collect();
    files.sort();
    files
}

/// Compares the two runs of one scenario: `Err` says where they differ.
async fn agree(name: &str, scenario: Scenario) -> Result<String, String> {
    let sim = simulate(&scenario);
    let steps = scenario.steps.clone();
    // A failed `expect`/`resolve` in the driver run panics inside its own task.
    let (driver, skipped, abandoned) = tokio::spawn(async move { drive(&scenario).await })
        .await
        .map_err(|e| format!("{name}: the driver run failed: {e}"))?;
    // Steps the driver cannot express were refused by the simulator (they changed nothing).
    for line in &skipped {
        if !steps
            .iter()
            .any(|(l, s)| l == line && matches!(s, Step::Release(_) | Step::ReleaseAs(..)))
        {
            return Err(format!("{name}: line {line} skipped"));
        }
    }
    let differs = |what: &str, d: &dyn std::fmt::Debug, s: &dyn std::fmt::Debug| {
        Err(format!(
            "{name}: {what} differ\n  driver:    {d:?}\n  simulator: {s:?}"
        ))
    };
    if driver.commands != sim.commands {
        return differs("commands per sandbox", &driver.commands, &sim.commands);
    }
    if driver.settlements != sim.settlements {
        return differs("settlements", &driver.settlements, &sim.settlements);
    }
    if driver.calls != sim.calls {
        return differs("call outcomes", &driver.calls, &sim.calls);
    }
    if driver.answers != sim.answers {
        return differs("immediate answers", &driver.answers, &sim.answers);
    }
    if driver.closed != sim.closed {
        return differs("close", &driver.closed, &sim.closed);
    }
    Ok(format!(
        "{name}: agree ({} sandboxes, {} commands, {} settlements; skipped lines {skipped:?}; \
         answers to commands the driver had abandoned at lines {abandoned:?})",
        sim.commands.len(),
        sim.commands.values().map(Vec::len).sum::<usize>(),
        sim.settlements.len()
    ))
}

/// Scenarios where the driver and the simulator are known to disagree, each with the text its
/// disagreement must contain; when one is fixed the test fails and says to remove the entry.
/// Empty: the two former entries (`edge-answer-after-closed.scn`, a Shutdown waiting behind an
/// outstanding Start on the sandbox's lane; `edge-start-timeout.scn`, the driver's start
/// deadline beating the core's start timeout at the same instant) were fixed in io-tokio.
const KNOWN_DISAGREEMENTS: &[(&str, &str)] = &[];

#[tokio::test(start_paused = true)]
async fn every_scenario_agrees_between_the_simulator_and_the_driver() {
    let files = scenario_files();
    assert!(files.len() >= 20, "scenario corpus not found: {files:?}");
    let mut disagreements = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        let scenario = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        if scenario.fleet.is_some() {
            eprintln!("{name}: a fleet scenario, the fleet simulator's alone");
            continue;
        }
        let known = KNOWN_DISAGREEMENTS.iter().find(|(n, _)| *n == name);
        match (agree(&name, scenario).await, known) {
            (Ok(line), None) => eprintln!("{line}"),
            (Err(why), Some((_, how))) if why.contains(how) => {
                eprintln!("known disagreement: {why}")
            }
            (Ok(_), Some(_)) => disagreements.push(format!(
                "{name} now agrees: remove it from KNOWN_DISAGREEMENTS"
            )),
            (Err(why), _) => {
                eprintln!("DISAGREE {why}");
                disagreements.push(why);
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}
