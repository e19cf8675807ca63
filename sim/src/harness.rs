//! The harness: the real core, the backend ledger and the history, driven one step at a time.
//! After every input it drains commands and events, checks the history invariants and (amortised)
//! the core's own `check_invariants`, records marks and, when asked, the trace.

use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, CallStatus, Command, Config, Error, ErrorKind, Event, Instant, Lifecycle,
    PathName, Payload, SandboxId, SessionId, Settlement, Stats, UploadFailure,
};

use crate::backend::{Ledger, Op};
use crate::failure::Failure;
use crate::fastmap::{fnv1a, FNV_START};
use crate::history::History;
use crate::marks::Mark;
use crate::step::{Answer, Expect, OpKind, ResolveExpect, Step};

/// Why a step could not go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The step itself is wrong (a scenario answers a command the core did not order, names a
    /// call that never had a sandbox): an error of the scenario, not of the core.
    Misuse(String),
    /// An invariant or expectation broke.
    Failed(Failure),
}

/// How thoroughly to check and record.
#[derive(Clone, Debug)]
pub struct HarnessOptions {
    /// Keep cancelled uploads for late answers (random runs).
    pub keep_zombies: bool,
    /// Keep every settlement (scenario expectations).
    pub keep_settlements: bool,
    /// Run the core's full `check_invariants` after every input while it tracks at most this
    /// many calls plus sandboxes; beyond, every `full_check_every` inputs.
    pub small_state: usize,
    /// See `small_state`.
    pub full_check_every: u64,
    /// The history's getter checks (`binding-stable`, `resolve-own-sandbox`, ...) ask the core
    /// about every live call every this many inputs, and in between only about the calls the
    /// input touched (see `touched.rs`). 1: every live call after every input.
    pub getter_check_every: u64,
    /// Record the trace as JSON lines.
    pub trace: bool,
    /// Compute the trace hash (implies building each trace line).
    pub hash: bool,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        HarnessOptions {
            keep_zombies: false,
            keep_settlements: false,
            small_state: 0,
            full_check_every: 16,
            getter_check_every: 1,
            trace: false,
            hash: false,
        }
    }
}

/// The core under test and everything around it.
pub struct Harness {
    /// The real core.
    pub core: Lifecycle,
    /// Virtual time, in milliseconds.
    pub now_ms: u64,
    /// Outstanding backend commands.
    pub ledger: Ledger,
    /// The history and its checks.
    pub history: History,
    /// Steps applied.
    pub steps: usize,
    /// Core inputs given.
    pub inputs: u64,
    /// The error kind of the last input, if it was rejected.
    pub last_error: Option<ErrorKind>,
    /// Calls whose acquire named something the core refuses (failed with `invalid-name`), as
    /// written.
    refused_calls: Vec<String>,
    /// The default close deadline (`close` without `deadline=`).
    pub close_deadline: Duration,
    opts: HarnessOptions,
    /// Inputs left until the next periodic full check (`full_check_every`; counted down
    /// rather than `inputs % full_check_every`, a division on every input).
    full_check_in: u64,
    stats_before: Stats,
    /// The trace, one JSON line per input, when recorded.
    pub trace: Vec<String>,
    /// The trace hash, when computed.
    pub hash: u64,
    step_text: String,
    out_commands: Vec<Command>,
    out_events: Vec<Event>,
    was_closed: bool,
    /// The session log's name, made once (flushes without a path name it).
    session_log: PathName,
    /// The sandboxes each session's entered work is in, oldest first (`leave` takes the
    /// oldest).
    entered_by:
        crate::fastmap::FastMap<SessionId, std::collections::VecDeque<sandkeeper::SandboxId>>,
}

impl Harness {
    /// A harness around a fresh core.
    pub fn new(
        config: Config,
        close_deadline: Duration,
        opts: HarnessOptions,
    ) -> Result<Self, Error> {
        let mut history = History::new(&config, opts.keep_settlements);
        history.full_every = opts.getter_check_every.max(1);
        history.touched.recording = history.full_every > 1;
        let core = Lifecycle::new(config)?;
        Ok(Harness {
            core,
            now_ms: 0,
            ledger: Ledger::default(),
            history,
            steps: 0,
            inputs: 0,
            entered_by: Default::default(),
            last_error: None,
            refused_calls: Vec::new(),
            close_deadline,
            full_check_in: opts.full_check_every,
            opts,
            stats_before: Stats::default(),
            trace: Vec::new(),
            hash: FNV_START,
            step_text: String::new(),
            out_commands: Vec::new(),
            out_events: Vec::new(),
            was_closed: false,
            session_log: PathName::session_log(),
        })
    }

    /// A payload of `bytes` bytes (`x` repeated), shared between the flushes of that size on
    /// this thread, whatever harness makes them (small sizes; a large one is made afresh). Kept
    /// per thread rather than per harness: each seed's harness made its own, two allocations
    /// and a copy for every size a seed flushed; and not shared between threads, whose
    /// reference counts would then contend.
    fn payload(bytes: usize) -> Payload {
        const SHARED_UP_TO: usize = 4096;
        thread_local! {
            static PAYLOADS: std::cell::RefCell<Vec<Option<Payload>>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        if bytes > SHARED_UP_TO {
            return Payload::new(vec![b'x'; bytes]);
        }
        PAYLOADS.with_borrow_mut(|payloads| {
            if payloads.len() <= bytes {
                payloads.resize(bytes + 1, None);
            }
            payloads[bytes]
                .get_or_insert_with(|| Payload::new(vec![b'x'; bytes]))
                .clone()
        })
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.now_ms)
    }

    fn recording(&self) -> bool {
        self.opts.trace || self.opts.hash
    }

    /// Applies one step. A rejected input is not a failure (`last_error` says what it was);
    /// a broken invariant or expectation is.
    pub fn apply(&mut self, step: &Step) -> Result<(), Stop> {
        self.steps += 1;
        self.history.step = self.steps;
        self.history.now_ms = self.now_ms;
        self.was_closed = self.history.closed();
        if self.recording() {
            self.step_text = step.to_string();
        }
        let now = self.now();
        match step {
            Step::Acquire {
                call,
                session,
                user,
                external,
            } => {
                let mut spec = CallSpec::new(call.clone(), session.clone());
                spec.user = user.clone();
                spec.external = external.clone();
                let was_live = self.history.calls.live().contains(call);
                let r = self.core.acquire(now, spec);
                match &r {
                    Ok(()) => {
                        self.history
                            .acquired(call, session, user.as_ref(), external.as_ref())
                    }
                    Err(e) => self.history.acquire_rejected(call, e.kind(), was_live),
                }
                self.after(r.map_err(|e| e.kind()))?;
            }
            Step::Release(call) | Step::ReleaseAs(call, _) => {
                let way = step.asked_way();
                let r = match way {
                    None => self.core.release(now, call),
                    Some(way) => self.core.release_as(now, call, way),
                };
                match &r {
                    Ok(()) => self.history.released(call, way),
                    Err(e) => self.history.release_rejected(call, e.kind()),
                }
                self.after(r.map_err(|e| e.kind()))?;
            }
            Step::DropSnapshot(key) => {
                let r = self.core.drop_snapshot(now, key);
                if r.is_ok() {
                    self.history.snapshot_dropped(key);
                }
                self.after(r.map(drop).map_err(|e| e.kind()))?;
            }
            Step::Flush {
                session,
                path,
                bytes,
            } => {
                let path = path.clone().unwrap_or_else(|| self.session_log.clone());
                let payload = Self::payload(*bytes);
                let r = self.core.flush(now, session, &path, payload);
                if let Ok(v) = &r {
                    self.history.flushed(session, &path, v.0);
                }
                self.after(r.map(|_| ()).map_err(|e| e.kind()))?;
            }
            Step::Resolve(session, expect) => {
                self.last_error = None;
                let got = self.core.resolve(session);
                let fits = match (expect, &got) {
                    (ResolveExpect::Call(c), Ok(x)) => self.history.sandbox_of(c) == Some(*x),
                    (ResolveExpect::None, Err(Error::NoActiveSandbox { .. })) => true,
                    (ResolveExpect::Gone, Err(Error::SandboxGone { .. })) => true,
                    _ => false,
                };
                match fits {
                    true => {}
                    false => {
                        let got = self.core.resolve(session);
                        return Err(self.expectation(format!(
                            "resolve {session}: expected {expect:?}, got {got:?}"
                        )));
                    }
                }
            }
            Step::Hold(session) => {
                self.history.touched.session(session);
                let r = self.core.hold(now, session);
                if r.is_ok() {
                    *self.history.holds.entry(session.clone()).or_default() += 1;
                }
                self.after(r.map_err(|e| e.kind()))?;
            }
            Step::Unhold(session) => {
                self.history.touched.session(session);
                let r = self.core.unhold(now, session);
                if r.is_ok() {
                    if let Some(h) = self.history.holds.get_mut(session) {
                        *h = h.saturating_sub(1);
                    }
                }
                self.after(r.map_err(|e| e.kind()))?;
            }
            Step::Enter(session) => {
                self.history.touched.session(session);
                let r = self.core.enter(now, session);
                if let Ok(x) = r {
                    *self.history.entered.entry(x) += 1;
                    self.entered_by
                        .entry(session.clone())
                        .or_default()
                        .push_back(x);
                }
                self.after(r.map(drop).map_err(|e| e.kind()))?;
            }
            Step::Leave(session) => {
                self.history.touched.session(session);
                let x = self
                    .entered_by
                    .get_mut(session)
                    .and_then(std::collections::VecDeque::pop_front);
                let r = match x {
                    Some(x) => {
                        let r = self.core.leave(now, x);
                        if r.is_ok() {
                            let n = self.history.entered.entry(x);
                            *n = n.saturating_sub(1);
                            self.history.operation_done(x);
                        }
                        r.map_err(|e| e.kind())
                    }
                    // Nothing of the session's is in a sandbox: nothing to give the core.
                    None => Err(sandkeeper::ErrorKind::NotEntered),
                };
                self.after(r)?;
            }
            Step::Close(deadline) => {
                let d = deadline.unwrap_or(self.close_deadline);
                self.history.touched.all = true;
                let r = self.core.close(now, d);
                if r.is_ok() {
                    self.history.closing = true;
                    self.history.conservation.closing();
                    self.history
                        .bounds
                        .closing(sandkeeper::Instant::from_millis(self.now_ms), d);
                }
                self.after(r.map_err(|e| e.kind()))?;
            }
            Step::Advance(d) => {
                // Time passes the way a driver's timer lets it: each deadline on the way is
                // handled at its own instant (the time-bound checks rely on it), then the clock
                // reaches the target.
                let target = self.now_ms + d.as_millis() as u64;
                let mut fired = false;
                while let Some(t) = self.core.poll_timeout() {
                    let at = t.as_nanos().div_ceil(1_000_000);
                    if at > target || self.history.closed() {
                        break;
                    }
                    self.now_ms = self.now_ms.max(at);
                    self.history.now_ms = self.now_ms;
                    let r = self.core.handle_timeout(self.now());
                    self.after(r.map_err(|e| e.kind()))?;
                    fired = true;
                }
                self.now_ms = target;
                self.history.now_ms = self.now_ms;
                if self.history.closed() {
                    let r = self.core.handle_timeout(self.now());
                    self.after(r.map_err(|e| e.kind()))?;
                } else if !fired {
                    self.last_error = None;
                }
            }
            Step::Answer(answer, call) => {
                let Some(x) = self.history.sandbox_of(call) else {
                    return Err(Stop::Misuse(format!(
                        "@{call} names no sandbox: {call} was never bound"
                    )));
                };
                match answer.op() {
                    None if *answer == Answer::InstanceGone => {
                        self.history.note_resumed_loss(x);
                        let ops = || self.ledger.ops.iter().filter(|o| o.sandbox == x);
                        let starting = ops().any(|o| o.kind == OpKind::Start);
                        let awaiting = ops().any(|o| o.kind != OpKind::Upload);
                        self.history.instance_gone(x, starting, awaiting);
                        let r = self.core.handle_instance_gone(now, x);
                        self.after(r.map_err(|e| e.kind()))?;
                    }
                    None => {
                        self.history.note_resumed_loss(x);
                        self.history.died(x);
                        let r = self.core.handle_died(now, x);
                        self.after(r.map_err(|e| e.kind()))?;
                    }
                    Some(kind) => {
                        let Some(op) = self.ledger.take(kind, x) else {
                            return Err(Stop::Misuse(format!(
                                "{answer} @{call}: the core ordered no {kind:?} for {x} that is still unanswered"
                            )));
                        };
                        self.answer(answer, &op)?;
                    }
                }
            }
            Step::Settle(only) => {
                let x = match only {
                    None => None,
                    Some(call) => match self.history.sandbox_of(call) {
                        Some(x) => Some(x),
                        None => {
                            return Err(Stop::Misuse(format!(
                                "@{call} names no sandbox: {call} was never bound"
                            )))
                        }
                    },
                };
                self.settle(x)?;
            }
            Step::Expect(e) => self.expect(e)?,
            Step::Refused { call, .. } => {
                // The core's name types are its validation: the input never gets built.
                self.last_error = Some(ErrorKind::InvalidName);
                if let Some(c) = call {
                    self.refused_calls.push(c.clone());
                }
            }
            Step::Unspellable(_) => {}
            Step::On(..) | Step::Fleet(_) => {
                return Err(Stop::Misuse(format!(
                    "`{step}` is a fleet step: a one-process run has no replicas"
                )))
            }
        }
        Ok(())
    }

    /// Applies an answer a scenario cannot spell (late or duplicate), as one step.
    pub fn apply_raw(&mut self, answer: &Answer, op: &Op, what: &str) -> Result<(), Stop> {
        self.steps += 1;
        self.history.step = self.steps;
        self.history.now_ms = self.now_ms;
        self.was_closed = self.history.closed();
        if self.recording() {
            self.step_text = format!("{what}: {answer} {}", op.sandbox);
        }
        if what.starts_with("duplicate") {
            self.history.marks.hit(Mark::DuplicateAnswer);
        }
        self.answer(answer, op)
    }

    /// Gives one backend answer to an outstanding command taken from the ledger.
    pub fn answer(&mut self, answer: &Answer, op: &Op) -> Result<(), Stop> {
        let now = self.now();
        // `settle` gives several answers in one step: close may finish between them.
        self.was_closed = self.history.closed();
        let x = op.sandbox;
        self.history.touched.sandbox(x);
        let r = match (answer, op.kind) {
            (Answer::StartOk, OpKind::Start) => {
                self.history.start_answered(x, true);
                self.core.handle_start_ok(now, x)
            }
            (Answer::StartFail, OpKind::Start) => {
                self.history.start_answered(x, false);
                self.core.handle_start_failed(now, x)
            }
            (Answer::UploadOk, OpKind::Upload) => {
                let u = op.upload.expect("upload op");
                self.history.upload_answered(u, true, false);
                self.core.handle_upload_ok(now, u)
            }
            (Answer::UploadFail { gone }, OpKind::Upload) => {
                let u = op.upload.expect("upload op");
                self.history.upload_answered(u, false, *gone);
                let failure = if *gone {
                    UploadFailure::Gone
                } else {
                    UploadFailure::Transient
                };
                self.core.handle_upload_failed(now, u, failure)
            }
            (Answer::StopOk { snapshot }, OpKind::Stop) => {
                self.history.stop_answered(x, snapshot.as_ref());
                self.core.handle_stop_ok(now, x, snapshot.clone())
            }
            // Counted by the history only when the core took the answer (not a stale or
            // duplicated one): the core orders a failed Stop or Persist again, and the last
            // failure ends the way down in this input.
            (Answer::StopFail, OpKind::Stop) => {
                let before = self.core.stats().stops_failed;
                let r = self.core.handle_stop_failed(now, x);
                if self.core.stats().stops_failed > before {
                    self.history.stop_failed_answered(x);
                }
                r
            }
            (Answer::PersistOk, OpKind::Persist) => {
                self.history.persist_answered(x);
                self.core.handle_persist_ok(now, x)
            }
            (Answer::PersistFail, OpKind::Persist) => {
                let before = self.core.stats().persists_failed;
                let r = self.core.handle_persist_failed(now, x);
                if self.core.stats().persists_failed > before {
                    self.history.persist_failed_answered(x);
                }
                r
            }
            (Answer::ShutdownOk, OpKind::Shutdown) => self.core.handle_shutdown_ok(now, x),
            (Answer::ShutdownFail, OpKind::Shutdown) => self.core.handle_shutdown_failed(now, x),
            (Answer::HookOk, OpKind::Hook) => {
                self.history.hook_answered(x, true);
                self.core.handle_hook_ok(now, x)
            }
            (Answer::HookFail, OpKind::Hook) => {
                self.history.hook_answered(x, false);
                self.core.handle_hook_failed(now, x)
            }
            (a, k) => return Err(Stop::Misuse(format!("{a} does not answer a {k:?}"))),
        };
        if self.opts.keep_zombies {
            self.ledger.answered.push(op.clone());
            if self.ledger.answered.len() > 8 {
                self.ledger.answered.remove(0);
            }
        }
        let closed = self.was_closed;
        if r.is_err() && !closed {
            self.history.fail(
                "answers-accepted",
                format!("{answer} for {x} (an ordered command) was rejected: {r:?}"),
            );
        }
        self.after(r.map_err(|e| e.kind()))
    }

    /// Answers every outstanding command (for one sandbox, when given) with success until none
    /// is left. Time does not move.
    pub fn settle(&mut self, only: Option<sandkeeper::SandboxId>) -> Result<(), Stop> {
        let mut rounds = 0;
        while let Some(op) = self.ledger.oldest(only).cloned() {
            rounds += 1;
            if rounds > 100_000 {
                return Err(
                    self.fail_now("liveness-settle", "settle never ran out of commands".into())
                );
            }
            let op = self.ledger.take(op.kind, op.sandbox).expect("outstanding");
            let answer = match op.kind {
                OpKind::Stop if self.stop_takes_snapshot(op.sandbox) => Answer::StopOk {
                    snapshot: Some(sandkeeper::Snapshot::new(format!("kept-{}", op.sandbox.0))),
                },
                kind => Answer::success(kind),
            };
            self.answer(&answer, &op)?;
        }
        Ok(())
    }

    /// Whether a faithful backend's Stop of `x` must answer a snapshot: it suspends `x`, or
    /// `x` resumed one (a backend that suspends and resumes takes a snapshot of what it
    /// suspends; one that resumed a snapshot takes one again). The random world and `settle`
    /// answer so; only a Stop of a fresh sandbox, not suspended, may come without one (a
    /// backend that keeps nothing under the `Shutdown` way).
    pub fn stop_takes_snapshot(&self, x: SandboxId) -> bool {
        self.history
            .sandboxes
            .get(&x)
            .is_some_and(|s| s.stop_suspend || s.resume_from.is_some())
    }

    /// What `resolve(session)` answers, spelled as a scenario expectation; `None` for any other
    /// answer (or a sandbox no call names).
    pub fn observe_resolve(&mut self, session: &SessionId) -> Option<ResolveExpect> {
        match self.core.resolve(session) {
            Ok(x) => {
                // Prefer a live call of the session as the name, else the sandbox's first call.
                let live = self
                    .history
                    .calls
                    .live()
                    .iter()
                    .find(|r| &r.session == session && r.sandbox == Some(x));
                let name = live
                    .map(|r| r.call.clone())
                    .or_else(|| self.history.sandboxes.get(&x).and_then(|s| s.call.clone()))?;
                Some(ResolveExpect::Call(name))
            }
            Err(Error::NoActiveSandbox { .. }) => Some(ResolveExpect::None),
            Err(Error::SandboxGone { .. }) => Some(ResolveExpect::Gone),
            Err(_) => None,
        }
    }

    fn fail_now(&mut self, invariant: &str, detail: String) -> Stop {
        self.history.fail(invariant, detail);
        Stop::Failed(self.history.failure.clone().expect("just failed"))
    }

    fn expectation(&mut self, detail: String) -> Stop {
        Stop::Failed(Failure {
            invariant: "expectation".into(),
            step: self.steps,
            detail,
        })
    }

    /// Drains and checks after one core input.
    fn after(&mut self, result: Result<(), ErrorKind>) -> Result<(), Stop> {
        self.inputs += 1;
        self.last_error = result.err();
        let recording = self.recording();
        if self.was_closed && result.is_ok() {
            self.history.fail(
                "closed-refuses-inputs",
                format!("after Closed, `{}` was accepted", self.step_text),
            );
        }
        let mut new_starts = false;
        let mut outputs = false;
        self.history.way_down_timeouts();
        self.history.start_give_backs();
        while let Some(cmd) = self.core.poll_command() {
            outputs = true;
            self.history.command(&cmd);
            self.ledger.record(&cmd, self.opts.keep_zombies);
            new_starts |= matches!(cmd, Command::Start { .. });
            if recording {
                self.out_commands.push(cmd);
            }
        }
        while let Some(ev) = self.core.poll_event() {
            outputs = true;
            self.history.event(&ev);
            if recording {
                self.out_events.push(ev);
            }
        }
        if new_starts {
            self.learn_starting_bindings();
        }
        let stats = self.core.stats();
        if result.is_err() && (outputs || *stats != self.stats_before) {
            self.history.fail(
                "rejection-changes-nothing",
                format!(
                    "`{}` was rejected ({:?}) yet changed the core",
                    self.step_text, result
                ),
            );
        }
        self.stats_marks();
        self.history.after_input(&self.core);
        let small = self.core.live_calls() + self.core.tracked_sandboxes() <= self.opts.small_state;
        // Every `full_check_every`-th input (none when it is 0), as `inputs % full_check_every == 0`.
        let periodic = self.full_check_in == 1;
        if self.full_check_in > 1 {
            self.full_check_in -= 1;
        } else {
            self.full_check_in = self.opts.full_check_every;
        }
        if small || periodic {
            if let Err(v) = self.core.check_invariants() {
                let name = format!("core:{}", v.invariant);
                self.history.fail(&name, v.detail);
            }
        }
        if recording {
            self.record_trace(result);
        }
        match &self.history.failure {
            Some(f) => Err(Stop::Failed(f.clone())),
            None => Ok(()),
        }
    }

    fn learn_starting_bindings(&mut self) {
        let mut learned = Vec::new();
        for rec in self.history.calls.live().iter() {
            if rec.sandbox.is_none() {
                if let Some(CallStatus::Starting(x)) = self.core.call_status(&rec.call) {
                    learned.push((rec.call.clone(), x));
                }
            }
        }
        for (call, x) in learned {
            self.history.learn_binding(&call, x);
        }
    }

    fn stats_marks(&mut self) {
        let s = self.core.stats();
        let b = &self.stats_before;
        let m = &mut self.history.marks;
        if s.stale_answers > b.stale_answers {
            m.hit(Mark::StaleAnswer);
        }
        if s.upload_retries > b.upload_retries {
            m.hit(Mark::UploadRetry);
        }
        if s.suspended > b.suspended {
            m.hit(Mark::Suspended);
        }
        if s.abandoned > b.abandoned {
            m.hit(Mark::Abandoned);
        }
        if s.revivals > b.revivals {
            m.hit(Mark::Revival);
        }
        if s.orphan_starts > b.orphan_starts {
            m.hit(Mark::OrphanStart);
        }
        if s.stops_failed > b.stops_failed {
            m.hit(Mark::StopFailed);
        }
        if s.persists_failed > b.persists_failed {
            m.hit(Mark::PersistFailed);
        }
        if s.drain_deadlines > b.drain_deadlines {
            m.hit(Mark::DrainDeadline);
        }
        // A copy (432 bytes) costs less than comparing first.
        self.stats_before.clone_from(s);
    }

    fn record_trace(&mut self, result: Result<(), ErrorKind>) {
        // Payloads are written as their size: a trace is for reading.
        let commands: Vec<serde_json::Value> = self
            .out_commands
            .iter()
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap_or(serde_json::Value::Null);
                if let (Command::Upload { payload, .. }, Some(obj)) = (c, v.as_object_mut()) {
                    obj.insert("payload".into(), serde_json::json!(payload.len()));
                }
                v
            })
            .collect();
        let line = serde_json::json!({
            "step": self.steps,
            "t_ms": self.now_ms,
            "do": self.step_text,
            "result": match result { Ok(()) => "ok".to_string(), Err(k) => k.as_str().to_string() },
            "commands": commands,
            "events": self.out_events,
        })
        .to_string();
        self.out_commands.clear();
        self.out_events.clear();
        self.hash = fnv1a(self.hash, line.as_bytes());
        self.hash = fnv1a(self.hash, b"\n");
        if self.opts.trace {
            self.trace.push(line);
        }
    }

    /// Checks one expectation.
    fn expect(&mut self, e: &Expect) -> Result<(), Stop> {
        let sandbox = |h: &Harness, c: &CallId| h.history.sandbox_of(c);
        let ok = match e {
            Expect::Ready(c) => is_ready(self.core.call_status(c)),
            Expect::Waiting(c) => is_waiting(self.core.call_status(c)),
            Expect::Failed(c, kind) => failed_as(self.failure_of(c), kind.as_deref()),
            Expect::Uploaded {
                session,
                path,
                version,
                into,
            } => {
                let got = self.settled(session, path, *version);
                sandbox(self, into).is_some_and(|x| uploaded_into(got, x))
            }
            Expect::Dropped {
                session,
                path,
                version,
                reason,
            } => dropped_as(self.settled(session, path, *version), reason.as_deref()),
            Expect::Running(c) => sandbox(self, c).is_some_and(|x| {
                let up = self
                    .core
                    .sandbox_state(x)
                    .is_some_and(sandkeeper::SandboxState::accepts_uploads);
                let seen = self.history.sandboxes.get(&x);
                up && seen.is_some_and(|s| s.lane.is_up())
            }),
            Expect::State(c, want) => sandbox(self, c)
                .and_then(|x| self.core.sandbox_state(x))
                .is_some_and(|s| s == *want),
            Expect::Stop(c) | Expect::NoStop(c) => {
                let stopped = sandbox(self, c)
                    .and_then(|x| self.history.sandboxes.get(&x))
                    .is_some_and(|s| s.lane.is_stopped());
                stopped == matches!(e, Expect::Stop(_))
            }
            Expect::Shutdown(c) | Expect::NoShutdown(c) => {
                let down = sandbox(self, c)
                    .and_then(|x| self.history.sandboxes.get(&x))
                    .is_some_and(|s| s.lane.is_shut_down());
                down == matches!(e, Expect::Shutdown(_))
            }
            Expect::Resumed(c, snap) => sandbox(self, c)
                .and_then(|x| self.history.sandboxes.get(&x))
                .and_then(|s| s.resume_from.as_ref())
                .is_some_and(|s| s.as_str() == snap),
            Expect::Discarded(s) | Expect::NoDiscard(s) => {
                self.history.discarded.contains(s.as_str()) == matches!(e, Expect::Discarded(_))
            }
            Expect::Closed => self.history.closed(),
            Expect::Error(kind) => self.last_error.is_some_and(|k| k.as_str() == kind),
        };
        if ok {
            Ok(())
        } else {
            let detail = self.explain(e);
            Err(self.expectation(format!("`{e}` does not hold: {detail}")))
        }
    }

    /// How the call named `c` (as written) ended without becoming ready, if it did.
    fn failure_of(&self, c: &str) -> Option<ErrorKind> {
        failure_of(
            &self.refused_calls,
            |c| self.history.failed.get(c).copied(),
            c,
        )
    }

    /// How the version `expect uploaded|dropped` names settled, if it did.
    fn settled(
        &self,
        session: &SessionId,
        path: &Option<PathName>,
        version: u64,
    ) -> Option<&Settlement> {
        let key = settlement_key(session, path, version);
        self.history.settlements.as_ref()?.get(&key)
    }

    fn explain(&self, e: &Expect) -> String {
        match e {
            Expect::Ready(c) | Expect::Waiting(c) => {
                format!("{c} is {:?}", self.core.call_status(c))
            }
            Expect::Failed(c, _) => format!("{c} failed with {:?}", self.failure_of(c)),
            Expect::Error(_) => format!("the last input's error was {:?}", self.last_error),
            Expect::Uploaded {
                session,
                path,
                version,
                ..
            }
            | Expect::Dropped {
                session,
                path,
                version,
                ..
            } => format!("it settled as {:?}", self.settled(session, path, *version)),
            Expect::Running(c)
            | Expect::State(c, _)
            | Expect::Stop(c)
            | Expect::NoStop(c)
            | Expect::Shutdown(c)
            | Expect::NoShutdown(c)
            | Expect::Resumed(c, _) => match self.history.sandbox_of(c) {
                None => format!("{c} was never bound to a sandbox"),
                Some(x) => format!(
                    "{x} is {:?}; seen: {:?}",
                    self.core.sandbox_state(x),
                    self.history.sandboxes.get(&x)
                ),
            },
            Expect::Closed => "no Closed event yet".into(),
            Expect::Discarded(_) | Expect::NoDiscard(_) => {
                format!("discarded so far: {:?}", self.history.discarded)
            }
        }
    }
}

// What an expectation asks of what one process reported, the same in one process and on one
// replica of a fleet (`fleet/script/expect.rs`).

/// Whether `expect ready` holds of a call's status.
pub(crate) fn is_ready(status: Option<CallStatus>) -> bool {
    matches!(status, Some(CallStatus::Ready(_)))
}

/// Whether `expect waiting` holds of a call's status: queued, or its sandbox starting.
pub(crate) fn is_waiting(status: Option<CallStatus>) -> bool {
    matches!(status, Some(CallStatus::Waiting | CallStatus::Starting(_)))
}

/// How the call named `c` (as written) ended without becoming ready, if it did: refused by name
/// (`refused`, the calls as written whose acquire the core refused), else as `failed` says.
pub(crate) fn failure_of(
    refused: &[String],
    failed: impl FnOnce(&CallId) -> Option<ErrorKind>,
    c: &str,
) -> Option<ErrorKind> {
    if refused.iter().any(|r| r == c) {
        return Some(ErrorKind::InvalidName);
    }
    CallId::new(c).ok().and_then(|c| failed(&c))
}

/// Whether `expect failed <call> [error=<kind>]` holds of how the call ended.
pub(crate) fn failed_as(got: Option<ErrorKind>, kind: Option<&str>) -> bool {
    got.is_some_and(|k| kind.is_none_or(|want| want == k.as_str()))
}

/// The settlement `expect uploaded|dropped <session> [path=<path>] version=<n>` asks about (the
/// session log when no path is given).
pub(crate) fn settlement_key(
    session: &SessionId,
    path: &Option<PathName>,
    version: u64,
) -> (SessionId, PathName, u64) {
    let path = path.clone().unwrap_or_else(PathName::session_log);
    (session.clone(), path, version)
}

/// Whether `expect uploaded ... into=@<call>` holds of how the version settled, `x` being the
/// sandbox the call names.
pub(crate) fn uploaded_into(got: Option<&Settlement>, x: SandboxId) -> bool {
    matches!(got, Some(Settlement::Uploaded { sandbox }) if *sandbox == x)
}

/// Whether `expect dropped ... [reason=<why>]` holds of how the version settled: superseded,
/// or dropped for that reason.
pub(crate) fn dropped_as(got: Option<&Settlement>, reason: Option<&str>) -> bool {
    match got {
        Some(Settlement::Superseded { .. }) => reason.is_none_or(|r| r == "superseded"),
        Some(Settlement::Dropped { reason: why }) => reason.is_none_or(|r| r == why.as_str()),
        _ => false,
    }
}
