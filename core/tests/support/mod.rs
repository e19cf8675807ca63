//! A scripted harness for the core's named tests: one [`Script`] drives a [`Lifecycle`] step by
//! step, the way a driver would, so a test reads like the interleaving it encodes.
//!
//! After every input the script drains the core's commands and events into its own queues
//! (the drain contract), checks the core's state invariants, and checks the history invariants
//! that can only be seen on the outputs (no command after Shutdown, no Upload after Stop,
//! Shutdown or death, Persist only after Stop, one Shutdown per sandbox and none for an external
//! one, every version settled exactly once). A test then takes what it expects off the queues
//! with the `expect_*` and `take_*` helpers; [`Script::quiet`] asserts nothing is left unread.
//!
//! Tests that drive a bare [`Lifecycle`] without a script, and tests that suspend a session's
//! sandbox, share the helpers at the end of this file; fleet-mode set-up is [`fleet`].
#![allow(dead_code)] // each test file uses its own part of the harness

pub mod fleet;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use sandkeeper::*;
use sandkeeper_check::{
    CallChecker, Deadlines, Lane, Lanes, MirrorChecker, Op, OutputChecker, Phase, UploadChecker,
    Versions,
};

// ----------------------------------------------------------------------------------------------
// Names

/// A call name.
pub fn call(name: &str) -> CallId {
    CallId::new(name).unwrap()
}

/// A session name.
pub fn session(name: &str) -> SessionId {
    SessionId::new(name).unwrap()
}

/// Acquires `call` of `session` at time zero on a bare core and takes the Start it orders:
/// the call and the sandbox starting for it.
pub fn start_call(
    core: &mut Lifecycle,
    call_name: &str,
    session_name: &str,
) -> (CallId, SandboxId) {
    let c = call(call_name);
    core.acquire(
        Instant::ZERO,
        CallSpec::new(c.clone(), session(session_name)),
    )
    .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    (c, sandbox)
}

/// A user name.
pub fn user(name: &str) -> UserId {
    UserId::new(name).unwrap()
}

/// A mirrored path name.
pub fn path(name: &str) -> PathName {
    PathName::new(name).unwrap()
}

/// An external sandbox name.
pub fn external(name: &str) -> ExternalId {
    ExternalId::new(name).unwrap()
}

/// The session log path.
pub fn log() -> PathName {
    PathName::session_log()
}

/// A snapshot reference.
pub fn snap(name: &str) -> Snapshot {
    Snapshot::new(name)
}

/// A call of `session`.
pub fn spec(c: &str, s: &str) -> CallSpec {
    CallSpec::new(call(c), session(s))
}

/// Milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A configuration with short, distinct deadlines, so that a test can tell which fired:
/// start 1 s, upload 2 s, drain 3 s, wait 4 s, command 5 s, close grace 6 s, backoff 100 ms,
/// 3 retries.
pub fn config() -> Config {
    Config {
        start_timeout: secs(1),
        upload_timeout: secs(2),
        upload_retries: 3,
        retry_backoff: ms(100),
        drain_deadline: secs(3),
        wait_timeout: secs(4),
        command_timeout: secs(5),
        close_grace: secs(6),
        max_waiters: 2,
        ..Config::default()
    }
}

// ----------------------------------------------------------------------------------------------
// Commands and events, short

/// `Drain { sandbox, sessions }`.
pub fn drain(x: SandboxId, sessions: &[&str]) -> Command {
    Command::Drain {
        sandbox: x,
        sessions: sessions.iter().map(|s| session(s)).collect(),
    }
}

/// `Stop { sandbox }` on the way to Shutdown (deadlines are compared apart: see [`plain`]).
pub fn stop(x: SandboxId) -> Command {
    Command::Stop {
        sandbox: x,
        suspend: false,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// `Stop { sandbox }` of a suspension.
pub fn stop_to_suspend(x: SandboxId) -> Command {
    Command::Stop {
        sandbox: x,
        suspend: true,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// `Persist { sandbox, snapshot }` on the way to Shutdown.
pub fn persist(x: SandboxId, snapshot: Option<&str>) -> Command {
    Command::Persist {
        sandbox: x,
        snapshot: snapshot.map(snap),
        suspend: false,
        retain_until: None,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// `Persist { sandbox, snapshot }` of a suspension: its last command when it succeeds.
pub fn persist_to_suspend(x: SandboxId, snapshot: Option<&str>) -> Command {
    Command::Persist {
        sandbox: x,
        snapshot: snapshot.map(snap),
        suspend: true,
        retain_until: None,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// `Shutdown { sandbox }`.
pub fn shutdown(x: SandboxId) -> Command {
    Command::Shutdown {
        sandbox: x,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// `Discard { reason: Taken }` of `snapshot`, persisted by `by`, of the session key `s`: what a
/// resumed sandbox orders once it is up.
pub fn taken(by: SandboxId, s: &str, snapshot: &str) -> Command {
    Command::Discard {
        sandbox: by,
        key: Key::Session(session(s)),
        snapshot: snap(snapshot),
        reason: DiscardReason::Taken,
        token: None,
    }
}

/// `Abandon { sandbox }`.
pub fn abandon(x: SandboxId) -> Command {
    Command::Abandon { sandbox: x }
}

/// The command with its deadline zeroed. Every drained command's deadline is checked against
/// the configuration when it is drained (see `Script::check_command`), so tests compare the
/// rest.
pub fn plain(command: &Command) -> Command {
    let mut c = command.clone();
    match &mut c {
        Command::Start { deadline, .. }
        | Command::Upload { deadline, .. }
        | Command::Stop { deadline, .. }
        | Command::Persist { deadline, .. }
        | Command::Hook { deadline, .. }
        | Command::Adopt { deadline, .. }
        | Command::Shutdown { deadline, .. } => *deadline = Instant::ZERO,
        Command::Relinquish { .. }
        | Command::CancelUpload { .. }
        | Command::Drain { .. }
        | Command::Discard { .. }
        | Command::Abandon { .. } => {}
    }
    c
}

/// `CancelUpload { upload, sandbox }`.
pub fn cancel(upload: UploadId, x: SandboxId) -> Command {
    Command::CancelUpload { upload, sandbox: x }
}

/// `CallReady`.
pub fn ready(c: &str, x: SandboxId) -> Event {
    Event::CallReady {
        call: call(c),
        sandbox: x,
    }
}

/// `CallFailed`.
pub fn failed(c: &str, error: ErrorKind) -> Event {
    Event::CallFailed {
        call: call(c),
        error,
    }
}

/// `CallReleased`.
pub fn released(c: &str) -> Event {
    Event::CallReleased { call: call(c) }
}

/// `CallRevoked`.
pub fn revoked(c: &str) -> Event {
    Event::CallRevoked { call: call(c) }
}

/// `SandboxLost`.
pub fn lost(c: &str, x: SandboxId) -> Event {
    Event::SandboxLost {
        call: call(c),
        sandbox: x,
    }
}

/// `WorkspaceLost` of `x`, whose key is `key`.
pub fn workspace_lost(x: SandboxId, key: Key) -> Event {
    Event::WorkspaceLost { sandbox: x, key }
}

/// The key of session `s`'s calls under the default scope.
pub fn session_key(s: &str) -> Key {
    Key::Session(session(s))
}

/// `Settled` as `Uploaded` into `x`.
pub fn uploaded(s: &str, p: &PathName, v: u64, x: SandboxId) -> Event {
    Event::Settled {
        session: session(s),
        path: p.clone(),
        version: Version(v),
        outcome: Settlement::Uploaded { sandbox: x },
    }
}

/// `Settled` as `Superseded` by `by`.
pub fn superseded(s: &str, p: &PathName, v: u64, by: u64) -> Event {
    Event::Settled {
        session: session(s),
        path: p.clone(),
        version: Version(v),
        outcome: Settlement::Superseded { by: Version(by) },
    }
}

/// `Settled` as `Dropped` with `reason`.
pub fn dropped(s: &str, p: &PathName, v: u64, reason: DropReason) -> Event {
    Event::Settled {
        session: session(s),
        path: p.clone(),
        version: Version(v),
        outcome: Settlement::Dropped { reason },
    }
}

/// `MirrorSettled`.
pub fn mirror_settled(s: &str) -> Event {
    Event::MirrorSettled {
        session: session(s),
    }
}

/// `ShutdownUnconfirmed`.
pub fn unconfirmed(x: SandboxId) -> Event {
    Event::ShutdownUnconfirmed { sandbox: x }
}

// ----------------------------------------------------------------------------------------------
// The script

/// An Upload command the script has seen and not seen answered or cancelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenUpload {
    /// The upload.
    pub upload: UploadId,
    /// Where to.
    pub sandbox: SandboxId,
    /// Whose.
    pub session: SessionId,
    /// Which file.
    pub path: PathName,
    /// Which version.
    pub version: Version,
    /// The bytes.
    pub payload: Payload,
}

/// A Start command, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenStart {
    /// The new sandbox.
    pub sandbox: SandboxId,
    /// Its key.
    pub key: Key,
    /// The call's spec.
    pub spec: Spec,
    /// The snapshot to resume from.
    pub resume_from: Option<Snapshot>,
    /// The sandbox that persisted it.
    pub resumes: Option<SandboxId>,
}

/// The history invariants, checked on every drained command and event, are `sandkeeper_check`'s
/// (the rules the simulator and the drivers' tests check too): each sandbox's command order,
/// each path's versions, command deadlines, the stream's shape, the calls (with the getter checks
/// after every input), the uploads in flight and the mirror's routing and promptness.
#[derive(Clone, Debug)]
struct History {
    lanes: Lanes,
    versions: Versions,
    /// Command deadlines only: the script moves its clock freely ([`Script::wait`]), so the
    /// after-input bounds (nothing awaited past its deadline) are the simulator's, which hands
    /// the core a timeout at every deadline's own instant.
    deadlines: Deadlines,
    outputs: OutputChecker,
    calls: CallChecker,
    uploads: UploadChecker,
    mirror: MirrorChecker,
    /// Sandboxes whose Drain no call revived since (for `no-teardown-under-live-call`).
    draining: BTreeSet<SandboxId>,
}

impl History {
    fn new(config: &Config) -> Self {
        History {
            lanes: Lanes::new(),
            versions: Versions::new(),
            deadlines: Deadlines::new(config),
            outputs: OutputChecker::new(),
            calls: CallChecker::new(config),
            uploads: UploadChecker::new(),
            mirror: MirrorChecker::new(),
            draining: BTreeSet::new(),
        }
    }
}

/// A core driven step by step.
pub struct Script {
    /// The core under test.
    pub core: Lifecycle,
    /// The script's clock.
    pub now: Instant,
    /// Commands drained and not yet taken by the test.
    pub commands: VecDeque<Command>,
    /// Events drained and not yet taken by the test.
    pub events: VecDeque<Event>,
    /// Uploads ordered and not yet answered or cancelled.
    pub uploads: BTreeMap<UploadId, SeenUpload>,
    /// Every input applied, with its instant: a trace that can be replayed.
    pub trace: Vec<(Instant, Input)>,
    /// Every command drained, in order.
    pub all_commands: Vec<Command>,
    /// Every event drained, in order.
    pub all_events: Vec<Event>,
    history: History,
}

impl Script {
    /// A script over a core with `config`, at time zero.
    pub fn new(config: Config) -> Self {
        let history = History::new(&config);
        Script {
            core: Lifecycle::new(config).expect("valid config"),
            now: Instant::ZERO,
            commands: VecDeque::new(),
            events: VecDeque::new(),
            uploads: BTreeMap::new(),
            trace: Vec::new(),
            all_commands: Vec::new(),
            all_events: Vec::new(),
            history,
        }
    }

    /// A script over `core` (a copy of this script's, e.g. read back from its serialised
    /// form) that goes on from where this one is: same clock, the uploads it awaits, and the
    /// history its checks judge the next outputs against.
    pub fn twin(&self, core: Lifecycle) -> Self {
        Script {
            core,
            now: self.now,
            commands: VecDeque::new(),
            events: VecDeque::new(),
            uploads: self.uploads.clone(),
            trace: Vec::new(),
            all_commands: Vec::new(),
            all_events: Vec::new(),
            history: self.history.clone(),
        }
    }

    /// A script over [`config()`].
    pub fn default_config() -> Self {
        Script::new(config())
    }

    /// A script over [`config()`], changed by `f`.
    pub fn with(f: impl FnOnce(&mut Config)) -> Self {
        let mut c = config();
        f(&mut c);
        Script::new(c)
    }

    // ------------------------------------------------------------------------------------------
    // Inputs

    /// Applies one input now, drains, and checks ([`answer`](Self::answer)); a flush's version
    /// is `Some`.
    pub fn input(&mut self, input: Input) -> Result<Option<Version>, Error> {
        self.answer(input).map(|a| match a {
            Answer::Version(v) => Some(v),
            _ => None,
        })
    }

    /// Applies one input now, drains, and checks. An input that fails must change nothing: the
    /// serialised core is compared before and after.
    pub fn answer(&mut self, input: Input) -> Result<Answer, Error> {
        let before = serde_json::to_string(&self.core).expect("core serialises");
        let flushed = match &input {
            Input::Flush { session, path, .. } => Some((session.clone(), path.clone())),
            _ => None,
        };
        if let Input::Died { sandbox } = &input {
            if self.core.sandbox_state(*sandbox).is_some() {
                self.history.lanes.die(*sandbox);
            }
        }
        if let Input::InstanceGone { sandbox } = &input {
            // A death unless the sandbox is on its way down (being suspended, or after).
            if matches!(
                self.core.sandbox_state(*sandbox),
                Some(SandboxState::Running | SandboxState::Idle | SandboxState::Draining)
            ) {
                self.history.lanes.die(*sandbox);
            }
        }
        if let Input::UploadFailed {
            upload,
            failure: UploadFailure::Gone,
        } = &input
        {
            if let Some(up) = self.uploads.get(upload) {
                self.history.lanes.die(up.sandbox);
            }
        }
        match &input {
            Input::UploadOk { upload } => {
                self.history.uploads.answered(*upload, true);
            }
            Input::UploadFailed { upload, failure } => {
                let flight = self.history.uploads.answered(*upload, false);
                if let (Some(f), UploadFailure::Transient) = (flight, failure) {
                    self.history
                        .mirror
                        .upload_failed(f.session, f.path, f.version);
                }
            }
            _ => {}
        }
        self.trace.push((self.now, input.clone()));
        let result = self.core.handle(self.now, input.clone());
        match &result {
            Err(e) => {
                let after = serde_json::to_string(&self.core).expect("core serialises");
                assert_eq!(
                    before, after,
                    "a rejected input changed the core: {input:?}"
                );
                assert_eq!(self.core.poll_command(), None);
                assert_eq!(self.core.poll_event(), None);
                let h = &self.history;
                let judged = match &input {
                    Input::Acquire(spec) => h.calls.acquire_rejected(&spec.call, e.kind()),
                    Input::Release { call, .. } => {
                        h.calls
                            .release_rejected(call, e.kind(), h.outputs.is_closed())
                    }
                    _ => Ok(()),
                };
                if let Err(v) = judged {
                    panic!("{v}");
                }
            }
            Ok(answer) => {
                if let (Answer::Version(v), Some((s, p))) = (answer, flushed) {
                    // Only a forgotten idle session starts its numbering again, and only after
                    // every version it had settled (the rule is `versions-numbered`'s).
                    let h = &mut self.history;
                    if let Err(v) = h.versions.flushed(&s, &p, v.0) {
                        panic!("{v}");
                    }
                    let in_flight = h.uploads.in_flight(&s, &p);
                    let (lanes, calls) = (&h.lanes, &h.calls);
                    let up =
                        || calls.has_up_call(&s, |x| lanes.get(x).is_some_and(|l| l.is_dead()));
                    h.mirror.flushed(&s, &p, v.0, in_flight, up);
                }
                let h = &mut self.history;
                let calls = &mut h.calls;
                let judged = match &input {
                    Input::UploadOk { upload } | Input::UploadFailed { upload, .. } => {
                        self.uploads.remove(upload);
                        Ok(())
                    }
                    Input::Acquire(spec) => calls.acquired(
                        &spec.call,
                        &spec.session,
                        spec.user.as_ref(),
                        spec.external.as_ref(),
                    ),
                    Input::Release { call, .. } => calls.released(call).map(|c| {
                        let up = |x| !h.lanes.get(x).is_some_and(|l| l.is_dead());
                        if c.phase == Phase::Ready && c.sandbox.is_some_and(up) {
                            h.mirror.released_up(&c.session);
                        }
                    }),
                    _ => Ok(()),
                };
                if let Err(v) = judged {
                    panic!("{v}");
                }
            }
        }
        self.drain();
        result
    }

    /// Drains the core's outputs into the script's queues, checking each.
    pub fn drain(&mut self) {
        while let Some(command) = self.core.poll_command() {
            self.check_command(&command);
            self.all_commands.push(command.clone());
            self.commands.push_back(command);
        }
        while let Some(event) = self.core.poll_event() {
            self.check_event(&event);
            self.all_events.push(event.clone());
            self.events.push_back(event);
        }
        if let Err(v) = self.history.outputs.input_done() {
            panic!("{v}");
        }
        if let Err(v) = self.history.mirror.input_done(&self.history.versions) {
            panic!("{v}");
        }
        self.check_calls();
        if let Err(v) = self.core.check_invariants() {
            panic!("{v}");
        }
        if self.core.is_closed() {
            assert_eq!(self.core.poll_timeout(), None, "a timer after Closed");
        }
    }

    fn check_command(&mut self, command: &Command) {
        let now = self.core.now();
        let h = &mut self.history;
        let x = command.sandbox();
        if let Err(v) = h.outputs.command(command, h.lanes.get(x)) {
            panic!("{v}");
        }
        // The order of the commands a backend receives is the lane's; the others (Drain,
        // CancelUpload, Abandon) must not name a shut-down sandbox either.
        if let Err(v) = h.lanes.command(command) {
            panic!("{v}: {command:?}");
        }
        // A Discard names the sandbox that persisted a snapshot, shut down or not.
        if Op::of(command).is_none() && !matches!(command, Command::Discard { .. }) {
            assert!(
                !h.lanes.get(x).is_some_and(|l| l.is_shut_down()),
                "a command names {x} after its Shutdown: {command:?}"
            );
        }
        if let Err(v) = h.deadlines.command(command, now) {
            panic!("{v}: {command:?}");
        }
        if let Err(v) = h.uploads.command(command) {
            panic!("{v}");
        }
        h.mirror.command(command);
        match command {
            Command::Start {
                sandbox,
                resume_from,
                resumes,
                ..
            } => {
                assert_eq!(resume_from.is_some(), resumes.is_some(), "{command:?}");
                assert!(resumes.is_none_or(|r| r < *sandbox), "{command:?}");
            }
            Command::Upload {
                upload,
                sandbox,
                session,
                path,
                version,
                payload,
                ..
            } => {
                if let Err(v) = h.versions.ordered(session, path, version.0) {
                    panic!("{v}: {command:?}");
                }
                self.uploads.insert(
                    *upload,
                    SeenUpload {
                        upload: *upload,
                        sandbox: *sandbox,
                        session: session.clone(),
                        path: path.clone(),
                        version: *version,
                        payload: payload.clone(),
                    },
                );
            }
            Command::CancelUpload { upload, .. } => {
                self.uploads.remove(upload);
            }
            Command::Drain { sandbox, .. } => {
                h.draining.insert(*sandbox);
            }
            Command::Stop { sandbox, .. } => {
                h.draining.remove(sandbox);
            }
            Command::Persist { .. } | Command::Discard { .. } | Command::Hook { .. } => {}
            Command::Shutdown { sandbox, .. } | Command::Relinquish { sandbox } => {
                h.draining.remove(sandbox);
                self.uploads.retain(|_, u| u.sandbox != *sandbox);
            }
            Command::Adopt { .. } | Command::Abandon { .. } => {}
        }
    }

    fn check_event(&mut self, event: &Event) {
        let h = &mut self.history;
        if let Err(v) = h.outputs.event(event) {
            panic!("{v}");
        }
        match event {
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                if let Err(v) = h.versions.settled(session, path, version.0, outcome) {
                    panic!("{v}");
                }
                h.deadlines.version_settled(session, path, version.0);
                if let Err(v) = h.uploads.settled(session, path, version.0, outcome) {
                    panic!("{v}");
                }
                if let Err(v) = h.mirror.settled(session, path, version.0, outcome) {
                    panic!("{v}");
                }
            }
            Event::CallReady { call, sandbox } => {
                if matches!(
                    self.core.sandbox_ownership(*sandbox),
                    Some(Ownership::External(_))
                ) {
                    h.lanes.bind_external(*sandbox);
                }
                let up = h.lanes.get(*sandbox).is_none_or(|l| l.is_up());
                h.draining.remove(sandbox);
                if let Err(v) = h.calls.ready(call, *sandbox, up) {
                    panic!("{v}");
                }
                if let Some(c) = h.calls.live().get(call) {
                    h.mirror.ready(&c.session, *sandbox);
                }
            }
            Event::CallFailed { call, .. } => {
                if let Err(v) = h.calls.failed(call) {
                    panic!("{v}");
                }
            }
            Event::CallReleased { call } => {
                if let Err(v) = h.calls.release_completed(call) {
                    panic!("{v}");
                }
            }
            Event::CallRevoked { call } => {
                if let Err(v) = h.calls.revoked(call) {
                    panic!("{v}");
                }
            }
            Event::SandboxLost { call, sandbox } => {
                let dead = h.lanes.get(*sandbox).is_some_and(|l| l.is_dead());
                if let Err(v) = h.calls.lost(call, *sandbox, dead) {
                    panic!("{v}");
                }
            }
            Event::Closed { .. } => {
                h.calls.closed();
                h.uploads.closed();
            }
            Event::MirrorSettled { session } => {
                if let Err(v) = h.mirror.mirror_settled(session, &h.versions) {
                    panic!("{v}");
                }
            }
            Event::WayDownFailed { sandbox, .. } => h.lanes.leave_as_is(*sandbox),
            Event::ShutdownUnconfirmed { .. }
            | Event::HookFailed { .. }
            | Event::WorkspaceLost { .. }
            | Event::KeyFenced { .. } => {}
        }
    }

    /// The getter checks of `sandkeeper_check::CallChecker` over every live call: each is where its
    /// events put it, none is bound to a sandbox being torn down, `resolve` answers each
    /// session's own sandbox (and one call per key under `Serialize`).
    fn check_calls(&mut self) {
        if self.history.outputs.is_closed() {
            return;
        }
        let h = &mut self.history;
        let (lanes, draining) = (&h.lanes, &h.draining);
        let dead = |x| lanes.get(x).is_some_and(|l: &Lane| l.is_dead());
        let torn = |x| {
            lanes.get(x).is_some_and(|l: &Lane| {
                !l.is_dead() && (l.is_stopped() || l.is_shut_down() || draining.contains(&x))
            })
        };
        if let Err(v) = h.calls.check_core(&self.core, true, |_| true, dead, torn) {
            panic!("{v}");
        }
    }

    /// Every version flushed so far has settled exactly once.
    pub fn assert_all_settled(&self) {
        if let Err(v) = self.history.versions.all_settled() {
            panic!("{v}");
        }
    }

    /// Every sandbox the core started was ordered to shut down exactly once.
    pub fn assert_all_shut_down(&self) {
        if let Err(v) = self.history.lanes.every_started_ended(false) {
            panic!("{v}");
        }
    }

    /// Whether the script saw a Shutdown for `x`.
    pub fn was_shut_down(&self, x: SandboxId) -> bool {
        self.history.lanes.get(x).is_some_and(|l| l.is_shut_down())
    }

    // ------------------------------------------------------------------------------------------
    // Time

    /// Moves the clock by `d` without any input.
    pub fn wait(&mut self, d: Duration) {
        self.now = self.now + d;
    }

    /// Moves the clock by `d` and hands the core a timeout.
    pub fn advance(&mut self, d: Duration) {
        self.wait(d);
        self.timeout();
    }

    /// Hands the core a timeout now.
    pub fn timeout(&mut self) {
        self.input(Input::Timeout).expect("timeout");
    }

    /// Moves the clock to the core's next deadline and hands it a timeout there.
    pub fn run_to_next_deadline(&mut self) -> Instant {
        let at = self.core.poll_timeout().expect("a deadline is set");
        assert!(at >= self.now);
        self.now = at;
        self.timeout();
        at
    }

    /// The time from the script's start to the core's next deadline.
    pub fn next_deadline_in(&self) -> Option<Duration> {
        self.core
            .poll_timeout()
            .map(|at| at.saturating_duration_since(self.now))
    }

    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// Acquires `c` of session `s`.
    pub fn acquire(&mut self, c: &str, s: &str) {
        self.try_acquire(spec(c, s)).expect("acquire");
    }

    /// Acquires with a full spec.
    pub fn try_acquire(&mut self, spec: CallSpec) -> Result<(), Error> {
        self.input(Input::Acquire(spec)).map(|_| ())
    }

    /// Releases `c`.
    pub fn release(&mut self, c: &str) {
        self.try_release(c).expect("release");
    }

    /// Releases `c`, returning what the core said.
    pub fn try_release(&mut self, c: &str) -> Result<(), Error> {
        self.input(Input::Release {
            call: call(c),
            way: None,
        })
        .map(|_| ())
    }

    /// Releases `c`, asking its sandbox's way down ([`Lifecycle::release_as`]).
    pub fn release_as(&mut self, c: &str, way: WayDown) -> Result<(), Error> {
        self.input(Input::Release {
            call: call(c),
            way: Some(way),
        })
        .map(|_| ())
    }

    /// Flushes `bytes` as the next version of (s, p).
    pub fn flush(&mut self, s: &str, p: &PathName, bytes: &str) -> u64 {
        self.try_flush(s, p, bytes).expect("flush").0
    }

    /// Flushes, returning what the core said.
    pub fn try_flush(&mut self, s: &str, p: &PathName, bytes: &str) -> Result<Version, Error> {
        self.input(Input::Flush {
            session: session(s),
            path: p.clone(),
            payload: Payload::new(bytes.as_bytes().to_vec()),
        })
        .map(|v| v.expect("a flush returns its version"))
    }

    /// Holds session `s`.
    pub fn hold(&mut self, s: &str) -> Result<(), Error> {
        self.input(Input::Hold {
            session: session(s),
        })
        .map(|_| ())
    }

    /// Enters session `s`'s sandbox for work, returning it.
    pub fn enter(&mut self, s: &str) -> Result<SandboxId, Error> {
        self.answer(Input::Enter {
            session: session(s),
        })
        .map(|a| match a {
            Answer::Entered(x) => x,
            other => panic!("enter answered {other:?}"),
        })
    }

    /// Leaves sandbox `x` after work entered with [`enter`](Self::enter).
    pub fn leave(&mut self, x: SandboxId) -> Result<(), Error> {
        self.answer(Input::Leave { sandbox: x }).map(|_| ())
    }

    /// Lets one hold of `s` go.
    pub fn unhold(&mut self, s: &str) -> Result<(), Error> {
        self.input(Input::Unhold {
            session: session(s),
        })
        .map(|_| ())
    }

    /// Begins close with `deadline`.
    pub fn close(&mut self, deadline: Duration) -> Result<(), Error> {
        self.input(Input::Close { deadline }).map(|_| ())
    }

    // ------------------------------------------------------------------------------------------
    // Backend answers

    /// Start of `x` succeeded.
    pub fn start_ok(&mut self, x: SandboxId) {
        self.input(Input::StartOk { sandbox: x }).expect("start ok");
    }

    /// Start of `x` failed.
    pub fn start_failed(&mut self, x: SandboxId) {
        self.input(Input::StartFailed { sandbox: x })
            .expect("start failed");
    }

    /// Upload `u` succeeded.
    pub fn upload_ok(&mut self, u: UploadId) {
        self.input(Input::UploadOk { upload: u })
            .expect("upload ok");
    }

    /// Upload `u` failed.
    pub fn upload_failed(&mut self, u: UploadId, failure: UploadFailure) {
        self.input(Input::UploadFailed { upload: u, failure })
            .expect("upload failed");
    }

    /// Answers every outstanding upload into `x` as written, oldest first.
    pub fn answer_uploads_in(&mut self, x: SandboxId) -> usize {
        let ids: Vec<UploadId> = self
            .uploads
            .values()
            .filter(|u| u.sandbox == x)
            .map(|u| u.upload)
            .collect();
        for u in &ids {
            self.upload_ok(*u);
        }
        ids.len()
    }

    /// The outstanding upload of (s, p).
    pub fn upload_of(&self, s: &str, p: &PathName) -> SeenUpload {
        self.uploads
            .values()
            .find(|u| u.session.as_str() == s && &u.path == p)
            .cloned()
            .unwrap_or_else(|| panic!("no upload of {s}/{p} outstanding"))
    }

    /// Stop of `x` succeeded with `snapshot`.
    pub fn stop_ok(&mut self, x: SandboxId, snapshot: Option<&str>) {
        self.input(Input::StopOk {
            sandbox: x,
            snapshot: snapshot.map(snap),
        })
        .expect("stop ok");
    }

    /// Stop of `x` failed.
    pub fn stop_failed(&mut self, x: SandboxId) {
        self.input(Input::StopFailed { sandbox: x })
            .expect("stop failed");
    }

    /// Persist of `x` succeeded.
    pub fn persist_ok(&mut self, x: SandboxId) {
        self.input(Input::PersistOk { sandbox: x })
            .expect("persist ok");
    }

    /// Persist of `x` failed.
    pub fn persist_failed(&mut self, x: SandboxId) {
        self.input(Input::PersistFailed { sandbox: x })
            .expect("persist failed");
    }

    /// Shutdown of `x` succeeded.
    pub fn shutdown_ok(&mut self, x: SandboxId) {
        self.input(Input::ShutdownOk { sandbox: x })
            .expect("shutdown ok");
    }

    /// Shutdown of `x` failed.
    pub fn shutdown_failed(&mut self, x: SandboxId) {
        self.input(Input::ShutdownFailed { sandbox: x })
            .expect("shutdown failed");
    }

    /// The backend reports `x` gone.
    pub fn died(&mut self, x: SandboxId) {
        self.input(Input::Died { sandbox: x }).expect("died");
    }

    /// The backend reports `x`'s running instance gone.
    pub fn instance_gone(&mut self, x: SandboxId) {
        self.input(Input::InstanceGone { sandbox: x })
            .expect("instance gone");
    }

    // ------------------------------------------------------------------------------------------
    // Expectations

    /// Takes every pending command.
    pub fn take_commands(&mut self) -> Vec<Command> {
        self.commands.drain(..).collect()
    }

    /// Takes every pending event.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// The pending commands are exactly `expected`, in order; takes them.
    #[track_caller]
    pub fn expect_commands(&mut self, expected: &[Command]) {
        let got: Vec<Command> = self.take_commands().iter().map(plain).collect();
        let expected: Vec<Command> = expected.iter().map(plain).collect();
        assert_eq!(got, expected, "commands");
    }

    /// The pending events are exactly `expected`, in order; takes them.
    #[track_caller]
    pub fn expect_events(&mut self, expected: &[Event]) {
        let got = self.take_events();
        assert_eq!(got, expected, "events");
    }

    /// No command and no event is pending.
    #[track_caller]
    pub fn quiet(&mut self) {
        self.expect_commands(&[]);
        self.expect_events(&[]);
    }

    /// The pending commands are exactly one Start; takes it.
    #[track_caller]
    pub fn take_start(&mut self) -> SeenStart {
        let got = self.take_commands();
        match got.as_slice() {
            [Command::Start {
                sandbox,
                key,
                spec,
                resume_from,
                resumes,
                ..
            }] => SeenStart {
                sandbox: *sandbox,
                key: key.clone(),
                spec: spec.clone(),
                resume_from: resume_from.clone(),
                resumes: *resumes,
            },
            other => panic!("expected one Start, got {other:?}"),
        }
    }

    /// The pending commands are exactly one Start; takes it and returns its sandbox.
    #[track_caller]
    pub fn started(&mut self) -> SandboxId {
        self.take_start().sandbox
    }

    /// The pending commands are exactly one Upload; takes it.
    #[track_caller]
    pub fn take_upload(&mut self) -> SeenUpload {
        let got = self.take_commands();
        match got.as_slice() {
            [Command::Upload { upload, .. }] => self.uploads[upload].clone(),
            other => panic!("expected one Upload, got {other:?}"),
        }
    }

    /// The pending commands are exactly one Upload of (s, p, v) into `x`; takes it.
    #[track_caller]
    pub fn expect_upload(&mut self, s: &str, p: &PathName, v: u64, x: SandboxId) -> UploadId {
        let up = self.take_upload();
        assert_eq!(
            (up.session.as_str(), &up.path, up.version, up.sandbox),
            (s, p, Version(v), x),
            "upload"
        );
        up.upload
    }

    /// Acquires `c` of `s` on a fresh sandbox and starts it: returns the sandbox, with
    /// `CallReady` taken.
    #[track_caller]
    pub fn ready_call(&mut self, c: &str, s: &str) -> SandboxId {
        self.acquire(c, s);
        let x = self.started();
        self.start_ok(x);
        self.expect_events(&[ready(c, x)]);
        x
    }

    /// Takes the way down of `x` when nothing was mirrored: Drain (naming `sessions`), Stop,
    /// stop ok without a snapshot, Shutdown, shutdown ok.
    #[track_caller]
    pub fn expect_down(&mut self, x: SandboxId, sessions: &[&str]) {
        self.expect_commands(&[drain(x, sessions), stop(x)]);
        self.stop_ok(x, None);
        self.expect_commands(&[shutdown(x)]);
        self.shutdown_ok(x);
        self.expect_commands(&[]);
        assert_eq!(self.core.sandbox_state(x), None, "{x} forgotten");
    }

    /// `resolve(s)`.
    pub fn resolve(&self, s: &str) -> Result<SandboxId, Error> {
        self.core.resolve(&session(s))
    }

    /// The core serialised.
    pub fn snapshot_json(&self) -> String {
        serde_json::to_string(&self.core).unwrap()
    }
}

// ----------------------------------------------------------------------------------------------
// A bare core, without a script

pub fn id(c: &str) -> CallId {
    CallId::new(c).unwrap()
}

pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

pub fn commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

pub fn events(core: &mut Lifecycle) -> Vec<Event> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

/// Acquires `c` for `s` and answers its Start: the call is ready on the returned sandbox.
pub fn ready_call(core: &mut Lifecycle, c: &str, s: &str) -> SandboxId {
    core.acquire(Instant::ZERO, CallSpec::new(id(c), sid(s)))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start for {c}")
    };
    core.handle_start_ok(Instant::ZERO, sandbox).unwrap();
    assert!(events(core).contains(&Event::CallReady {
        call: id(c),
        sandbox
    }));
    sandbox
}

// ----------------------------------------------------------------------------------------------
// Suspension

pub fn suspending() -> Script {
    Script::with(|c| c.release = ReleasePolicy::Suspend)
}

/// Suspends the session `s`'s sandbox (call `c`) with snapshot `snapshot`; returns it.
pub fn suspend(h: &mut Script, c: &str, snapshot: &str) -> SandboxId {
    let x = h.ready_call(c, "s");
    h.release(c);
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, Some(snapshot));
    h.expect_commands(&[persist_to_suspend(x, Some(snapshot))]);
    h.persist_ok(x);
    h.take_events();
    h.quiet();
    assert_eq!(
        h.core.sandbox_state(x),
        None,
        "a suspended sandbox is forgotten"
    );
    x
}
