//! The one-process world's call, time-bound and mirror checkers (`sandkeeper_check::CallChecker`,
//! `Deadlines`, `MirrorChecker`), held per incarnation of a replica and fed as `sim/src/history.rs`
//! feeds them in one process: the application's inputs the core accepted or refused (acquire,
//! release, flush, close), each command and event of an input, then the checks after it (the
//! getter checks over every live call, every input).
//!
//! What a fleet adds, and how it is fed:
//!
//! - **Dead, as the caller's word.** A sandbox counts as dead (its calls lost, nothing more
//!   goes into it) once an upload the core awaited in it was answered `gone`, or once its key
//!   was fenced (`KeyFenced` under the token it was started or adopted with: the core's ready
//!   calls on it get `SandboxLost`, and it is relinquished, not dead in the backend). The
//!   fleet's backend reports no other death.
//! - **Torn down.** Draining, stopped, shut down or relinquished (and not dead): no live call
//!   may be bound there (`no-teardown-under-live-call`).
//! - **Instants.** Every checker gets the replica's own clock. The bounds checked after an input
//!   (`upload-within-timeout`, `drain-within-deadline`, `wait-within-timeout`,
//!   `close-within-deadlines`) are judged at the instant the core's timers last ran (a wake-up
//!   runs every timer due; other inputs run none), as `snapshot-released` is: a paused replica's
//!   clock jumps, and the inputs queued for it while it was paused come before its wake-up.
//! - **Calls waiting for the record.** A fleet call is made ready once its key's durable record
//!   names its sandbox (the sandbox stays `Starting` until then): a live call the core places
//!   `Starting` on a sandbox that is up and waits for that record (`Lifecycle::awaits_record`:
//!   its start and after hook are over; the write naming it may wait for an earlier write of
//!   the key) leaves the bound of its wait and start (`Deadlines::awaits_record`).
//! - **Calls bound late.** A replica's inputs other than a wake-up run no timer: after a pause,
//!   one may bind a call whose wait deadline its clock passed before the wait's timer ran; its
//!   start and hook bound it from there (`Deadlines::bound`, told when a binding is learned).
//! - **Calls waiting again.** An adoption that failed puts the calls bound to it back in their
//!   key's queue, each with its wait timeout afresh: seen here as a live call the core had
//!   placed `Starting` and now places `Waiting` (`Deadlines::waiting_again`).
//! - **Dropped answers.** An upload answer the driver dropped past its deadline is no longer
//!   awaited by `intent.rs`'s `UploadChecker`, leniently; the core awaits it until its timers next
//!   run, so its path is not free for `mirror-independent` until then.
//! - **Handed over.** A drained sandbox whose key another process wants goes to it warm: the
//!   release of the key (its record naming the sandbox) ends the drain, without a Stop.
//! - **Relinquish** ends a sandbox as a Shutdown does (torn down); an **Adopt** starts it as a
//!   Start does (the lanes are `intent.rs`'s).
//!
//! With them, the one-process history's `counters`: after every input, the core's `Stats` count
//! the Starts, Shutdowns and Uploads it ordered, the versions flushed and the calls acquired and
//! released that were seen (an Adopt is no Start, a Relinquish no Shutdown).
//!
//! A crash drops the incarnation's checkers with it; a restart is a new incarnation, with fresh
//! ones.

use std::collections::BTreeMap;
use std::time::Duration;

use super::drains::Drains;
use crate::history::{core_counts, COUNTERS};

use sandkeeper::{
    CallId, CallStatus, Command, Config, DropReason, ErrorKind, Event, ExternalId, FenceReason,
    Instant, Key, KeyRecord, Lifecycle, PathName, SandboxId, SessionId, Settlement, StoreCommand,
    Token, UserId,
};
use sandkeeper_check::{
    CallChecker, Deadlines, Flight, Lane, MirrorChecker, Phase, UploadChecker, Versions, Violation,
};

/// What this process did with one sandbox, as these checks need it.
#[derive(Clone, Debug, Default)]
struct Sx {
    /// Its key and the token it was started or adopted under.
    key: Option<(Key, Option<Token>)>,
    /// Dead by the caller's word (see the module docs).
    dead: bool,
    /// A Drain was ordered and no call revived it, nor did its way down go on since.
    draining: bool,
    /// Relinquished.
    relinquished: bool,
}

/// One incarnation's `CallChecker`, `Deadlines` and `MirrorChecker`, and its counters. See the module docs.
#[derive(Debug)]
pub(super) struct Process {
    calls: CallChecker,
    bounds: Deadlines,
    mirror: MirrorChecker,
    /// What each drain waits for (`drain-waits-for-holds`, `drain-waits-for-work`).
    drains: Drains,
    sandboxes: BTreeMap<SandboxId, Sx>,
    /// Live calls the core last placed `Starting`, and where (to see one queued again).
    starting: BTreeMap<CallId, SandboxId>,
    /// The application's input of this input, at its instant, until fed.
    given: Option<(Given, Result<(), ErrorKind>, Instant)>,
    /// This input's events so far, and before which of them `given` is fed.
    event_no: usize,
    feed_at: usize,
    /// The events of a lapse that came first in this input: this many.
    lapse_end: usize,
    /// The version this input flushed.
    flushed_now: Option<(SessionId, PathName, u64)>,
    /// That version's `Settled` came among this input's events so far.
    flush_settled: bool,
    /// Paths whose upload's answer the driver dropped, since the core's timers last ran.
    late: Vec<(SessionId, PathName)>,
    /// Sandboxes handed over by this input's store commands.
    handed: Vec<SandboxId>,
    /// `Closed` came.
    closed: bool,
    /// What was seen of each of [`COUNTERS`].
    seen: [u64; 6],
}

/// An application input, kept until its input's events are seen.
#[derive(Debug)]
enum Given {
    Acquire(CallId, SessionId, Option<UserId>, Option<ExternalId>),
    Release(CallId),
    Close(Duration),
    Flush {
        session: SessionId,
        path: PathName,
        version: u64,
        in_flight: bool,
    },
}

/// What the application gave a core, for these checks.
#[derive(Clone, Copy, Debug)]
pub(super) enum Told<'a> {
    /// Nothing they look at (a wake-up, an answer).
    Nothing,
    /// `acquire` of a call of a session, by a user, of an external sandbox.
    Acquire(
        &'a CallId,
        &'a SessionId,
        Option<&'a UserId>,
        Option<&'a ExternalId>,
    ),
    /// `release(call)`.
    Release(&'a CallId),
    /// `close(deadline)`.
    Close(Duration),
    /// `hold(session)`.
    Hold(&'a SessionId),
    /// `unhold(session)`.
    Unhold(&'a SessionId),
    /// `leave(sandbox)`: the operation in it is over, whatever the core answers.
    Leave(SandboxId),
}

impl Process {
    /// Fresh checkers for a process running `config`.
    pub(super) fn new(config: &Config) -> Self {
        Process {
            calls: CallChecker::new(config),
            bounds: Deadlines::new(config),
            mirror: MirrorChecker::new(),
            drains: Drains::new(config.drain_deadline),
            sandboxes: BTreeMap::new(),
            starting: BTreeMap::new(),
            handed: Vec::new(),
            late: Vec::new(),
            given: None,
            event_no: 0,
            feed_at: 0,
            lapse_end: 0,
            flushed_now: None,
            flush_settled: false,
            closed: false,
            seen: [0; 6],
        }
    }

    fn dead(&self, x: SandboxId) -> bool {
        self.sandboxes.get(&x).is_some_and(|s| s.dead)
    }

    /// The application's input `told`, at `now`, accepted (`Ok`) or refused with its kind:
    /// fed with the input's events (see [`events_first`](Self::events_first)), at once when
    /// refused (a refused input has no outputs).
    pub(super) fn told(
        &mut self,
        told: Told<'_>,
        result: Result<(), ErrorKind>,
        now: Instant,
    ) -> Result<(), Violation> {
        let given = match told {
            Told::Nothing => return Ok(()),
            Told::Acquire(call, session, user, external) => Given::Acquire(
                call.clone(),
                session.clone(),
                user.cloned(),
                external.cloned(),
            ),
            Told::Release(call) => Given::Release(call.clone()),
            Told::Close(deadline) => Given::Close(deadline),
            Told::Hold(session) => {
                if result.is_ok() {
                    self.drains.held(session);
                }
                return Ok(());
            }
            Told::Unhold(session) => {
                if result.is_ok() {
                    self.drains.unheld(session);
                }
                return Ok(());
            }
            Told::Leave(x) => {
                self.drains.left(x);
                return Ok(());
            }
        };
        self.given = Some((given, result, now));
        if result.is_err() {
            return self.feed_given();
        }
        Ok(())
    }

    /// Feeds the application's input of this input, if not yet.
    fn feed_given(&mut self) -> Result<(), Violation> {
        let Some((given, result, now)) = self.given.take() else {
            return Ok(());
        };
        match (given, result) {
            (Given::Acquire(call, session, user, external), Ok(())) => {
                self.seen[4] += 1;
                let (call, user, external) = (&call, user.as_ref(), external.as_ref());
                let broken = self.calls.acquired(call, &session, user, external);
                self.starting.remove(call);
                self.bounds.acquired(call, now);
                broken
            }
            (Given::Acquire(call, ..), Err(kind)) => self.calls.acquire_rejected(&call, kind),
            (Given::Release(call), Ok(())) => {
                self.seen[5] += 1;
                let c = self.calls.released(&call)?;
                self.starting.remove(&call);
                self.bounds.call_settled(&call);
                if let (Phase::Ready, Some(x)) = (c.phase, c.sandbox) {
                    if !self.dead(x) {
                        self.mirror.released_up(&c.session);
                        // The mirror lingers on the released sandbox unless another call of
                        // the session has an up sandbox (then the mirror goes there).
                        let sandboxes = &self.sandboxes;
                        let dead = |x| sandboxes.get(&x).is_some_and(|s: &Sx| s.dead);
                        if !self.calls.has_up_call(&c.session, dead) {
                            self.drains.released(&c.session, x);
                        }
                    }
                }
                Ok(())
            }
            (Given::Release(call), Err(kind)) => {
                self.calls.release_rejected(&call, kind, self.closed)
            }
            (Given::Close(deadline), Ok(())) => {
                self.bounds.closing(now, deadline);
                self.drains.closing();
                Ok(())
            }
            (Given::Close(_), Err(_)) => Ok(()),
            (
                Given::Flush {
                    session,
                    path,
                    version,
                    in_flight,
                },
                _,
            ) => {
                self.seen[3] += 1;
                let (calls, sandboxes) = (&self.calls, &self.sandboxes);
                let dead = |x| sandboxes.get(&x).is_some_and(|s: &Sx| s.dead);
                let up = || calls.has_up_call(&session, dead);
                self.mirror.flushed(&session, &path, version, in_flight, up);
                Ok(())
            }
        }
    }

    /// `flush` returned `version`; `uploads`: the incarnation's uploads in flight.
    /// Fed before the input's commands, once a lapse's fences are known (`events_first`).
    pub(super) fn flushed(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        uploads: &UploadChecker,
    ) {
        let flush = Given::Flush {
            session: session.clone(),
            path: path.clone(),
            version,
            in_flight: uploads.in_flight(session, path)
                || self.late.iter().any(|(s, p)| s == session && p == path),
        };
        self.given = Some((flush, Ok(()), Instant::ZERO));
    }

    /// An upload answer the core awaited (`flight`) reaches it: `gone` counts as the sandbox's
    /// death; a transient failure leaves the version waiting for its retry.
    pub(super) fn upload_failed(&mut self, flight: Flight, gone: bool) {
        if gone {
            self.sandboxes.entry(flight.sandbox).or_default().dead = true;
        } else {
            self.mirror
                .upload_failed(flight.session, flight.path, flight.version);
        }
    }

    /// `liveness-release-completes`, as in one process: every release the core accepted has
    /// completed. Asked before close, of a process left undisturbed long enough to be quiet.
    pub(super) fn releases_completed(&self) -> Result<(), Violation> {
        self.calls.releases_completed()
    }

    /// The core is about to be told that `x` died, or lost its instance while up: its calls
    /// are lost, nothing more goes into it.
    pub(super) fn lost(&mut self, x: SandboxId) {
        self.sandboxes.entry(x).or_default().dead = true;
        self.drains.revived(x);
    }

    /// The driver dropped the answer to an upload (`flight`) past its deadline: the core awaits
    /// it until its timers next run (its upload timeout), the path not free until then.
    pub(super) fn upload_dropped(&mut self, flight: Flight) {
        self.late.push((flight.session, flight.path));
    }

    /// The core's timers run (a wake-up): the uploads whose answers were dropped timed out.
    pub(super) fn timers_run(&mut self) {
        self.late.clear();
    }

    /// The events of an input, before its commands: a fenced key's sandboxes (started or
    /// adopted under the fenced token) are dead from here on. An application input whose
    /// events begin with a lapse of the lease (every input runs the lapse first) is fed after
    /// the lapse's events: the fences, the calls they failed or lost and the versions they
    /// dropped.
    pub(super) fn events_first(&mut self, events: &[Event]) -> Result<(), Violation> {
        self.event_no = 0;
        self.feed_at = 0;
        let lapsed = events.iter().any(|ev| {
            matches!(
                ev,
                Event::KeyFenced {
                    reason: FenceReason::LeaseLapsed,
                    ..
                }
            )
        });
        self.lapse_end = 0;
        self.flushed_now = None;
        self.flush_settled = false;
        if lapsed {
            let fence = events.iter().rposition(|ev| match ev {
                Event::KeyFenced { .. } | Event::SandboxLost { .. } => true,
                Event::CallFailed { error, .. } => *error == ErrorKind::Fenced,
                Event::Settled {
                    outcome: Settlement::Dropped { reason },
                    ..
                } => *reason == DropReason::Fenced,
                _ => false,
            });
            self.lapse_end = fence.map_or(0, |i| i + 1);
            self.feed_at = self.lapse_end;
        }
        for ev in events {
            if let Event::KeyFenced { key, token, .. } = ev {
                for s in self.sandboxes.values_mut() {
                    if s.key
                        .as_ref()
                        .is_some_and(|(k, t)| k == key && *t == Some(*token))
                    {
                        s.dead = true;
                    }
                }
            }
        }
        // A flush before the input's commands (its Upload among them), its session's sandboxes
        // fenced by a lapse dead already.
        if let Some((
            Given::Flush {
                session,
                path,
                version,
                ..
            },
            ..,
        )) = &self.given
        {
            self.flushed_now = Some((session.clone(), path.clone(), *version));
            return self.feed_given();
        }
        Ok(())
    }

    /// One store command: a release of the key that hands a drained sandbox over (its record
    /// names it warm) ends that sandbox's drain, without a Stop, once the input's commands are
    /// in ([`commands_done`](Self::commands_done): an input's store commands are taken before
    /// its commands, and the Drain it ended may be among them).
    pub(super) fn store_command(&mut self, cmd: &StoreCommand) {
        if let StoreCommand::Release {
            record: KeyRecord { warm: Some(x), .. },
            ..
        } = cmd
        {
            self.handed.push(*x);
        }
    }

    /// `enter` let an operation into `x`.
    pub(super) fn entered(&mut self, x: SandboxId) {
        self.drains.entered(x);
    }

    /// The input's commands are in: the drains its handovers ended are over.
    pub(super) fn commands_done(&mut self) {
        for x in self.handed.drain(..) {
            self.drains.revived(x);
            if let Some(s) = self.sandboxes.get_mut(&x) {
                s.draining = false;
            }
        }
    }

    /// One command, ordered at `now`.
    pub(super) fn command(&mut self, cmd: &Command, now: Instant) -> Result<(), Violation> {
        let broken = self.bounds.command(cmd, now);
        self.mirror.command(cmd);
        self.drains.command(cmd, now);
        let x = cmd.sandbox();
        match cmd {
            Command::Upload { .. } => self.seen[2] += 1,
            Command::Start { key, token, .. } => {
                self.seen[0] += 1;
                self.sandboxes.insert(
                    x,
                    Sx {
                        key: Some((key.clone(), *token)),
                        ..Sx::default()
                    },
                );
            }
            Command::Adopt { key, token, .. } => {
                // Ordered again (its first went unanswered): its calls' start begins afresh.
                let again: Vec<CallId> = (self.starting.iter())
                    .filter(|(_, y)| **y == x)
                    .map(|(c, _)| c.clone())
                    .collect();
                for call in &again {
                    self.bounds.adopting_again(call, now);
                }
                // Taken over (perhaps again): what an earlier tenure here said no longer holds.
                self.sandboxes.insert(
                    x,
                    Sx {
                        key: Some((key.clone(), Some(*token))),
                        ..Sx::default()
                    },
                );
            }
            Command::Drain { .. } => self.sandboxes.entry(x).or_default().draining = true,
            // The drain ended: a before hook, or the way down goes on.
            Command::Hook { hook, .. } if !hook.is_after() => {
                self.sandboxes.entry(x).or_default().draining = false
            }
            Command::Stop { .. } => self.sandboxes.entry(x).or_default().draining = false,
            Command::Shutdown { .. } => {
                self.seen[1] += 1;
                self.sandboxes.entry(x).or_default().draining = false
            }
            Command::Relinquish { .. } => {
                let s = self.sandboxes.entry(x).or_default();
                s.draining = false;
                s.relinquished = true;
            }
            _ => {}
        }
        broken
    }

    /// One event of an input at `now`; `versions`: the incarnation's versions, this event's
    /// settlements included; `lane`: a sandbox's lane here.
    pub(super) fn event(
        &mut self,
        ev: &Event,
        now: Instant,
        versions: &Versions,
        lane: impl Fn(SandboxId) -> Option<Lane>,
    ) -> Result<(), Violation> {
        if self.event_no == self.feed_at {
            self.feed_given()?;
        }
        self.event_no += 1;
        match ev {
            Event::CallReady { call, sandbox } => {
                let x = *sandbox;
                let up = lane(x).is_some_and(|l| l.is_up()) && !self.dead(x);
                let broken = self.calls.ready(call, x, up);
                self.starting.remove(call);
                self.bounds.call_settled(call);
                let session = self.calls.live().get(call).map(|c| c.session.clone());
                if let Some(session) = session {
                    self.mirror.ready(&session, x);
                }
                self.sandboxes.entry(x).or_default().draining = false;
                self.drains.revived(x);
                broken
            }
            Event::CallFailed { call, error } => {
                let timely = self.bounds.call_failed(call, *error, now);
                self.starting.remove(call);
                self.calls.failed(call)?;
                timely
            }
            Event::CallReleased { call } => self.calls.release_completed(call),
            Event::CallRevoked { call } => {
                self.starting.remove(call);
                self.bounds.call_settled(call);
                self.calls.revoked(call).map(drop)
            }
            Event::SandboxLost { call, sandbox } => {
                let dead = self.dead(*sandbox);
                self.calls.lost(call, *sandbox, dead)
            }
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                if self.flushed_now.as_ref() == Some(&(session.clone(), path.clone(), version.0)) {
                    self.flush_settled = true;
                }
                self.bounds.version_settled(session, path, version.0);
                self.mirror.settled(session, path, version.0, outcome)
            }
            // A lapse before a flush settled the session's mirror as it was before the flush:
            // a `MirrorSettled` before the flush's own version settled is judged without it.
            Event::MirrorSettled { session } => match &self.flushed_now {
                Some((s, path, version)) if s == session && !self.flush_settled => {
                    let mut before = versions.clone();
                    let dropped = Settlement::Dropped {
                        reason: DropReason::Fenced,
                    };
                    before.settled(s, path, *version, &dropped)?;
                    self.mirror.mirror_settled(session, &before)
                }
                _ => self.mirror.mirror_settled(session, versions),
            },
            Event::Closed { .. } => {
                self.bounds.closed();
                self.calls.closed();
                self.starting.clear();
                self.closed = true;
                Ok(())
            }
            Event::KeyFenced { .. }
            | Event::WorkspaceLost { .. }
            | Event::ShutdownUnconfirmed { .. }
            | Event::WayDownFailed { .. }
            | Event::HookFailed { .. } => Ok(()),
        }
    }

    /// `counters`: the core's counters agree with what was seen of them.
    fn counters(&self, core: &Lifecycle) -> Result<(), Violation> {
        let counted = core_counts(core.stats());
        match (0..COUNTERS.len()).find(|i| counted[*i] != self.seen[*i]) {
            None => Ok(()),
            Some(i) => Err(Violation::new(
                "counters",
                format!(
                    "stats.{} is {}, {} were seen",
                    COUNTERS[i], counted[i], self.seen[i]
                ),
            )),
        }
    }

    /// An input at `now` ended, the core's timers having last run at `timers_at`: the bounds,
    /// the mirror, then the getter checks over every live call.
    pub(super) fn input_done(
        &mut self,
        core: &Lifecycle,
        now: Instant,
        timers_at: Instant,
        versions: &Versions,
        uploads: &UploadChecker,
        lane: impl Fn(SandboxId) -> Option<Lane>,
    ) -> Result<(), Violation> {
        self.feed_given()?;
        let (calls, sandboxes) = (&self.calls, &self.sandboxes);
        let dead = |x| sandboxes.get(&x).is_some_and(|s: &Sx| s.dead);
        self.drains
            .input_done(|session| calls.has_up_call(session, dead))?;
        let draining = |x: SandboxId| {
            let s = sandboxes.get(&x);
            s.is_some_and(|s| s.draining && !s.dead)
                && lane(x).is_some_and(|l| l.is_started() && l.is_up())
        };
        let closed = self.closed;
        self.bounds
            .after_input(timers_at, closed, |u| uploads.is_awaited(u), draining)?;
        self.mirror.input_done(versions)?;
        self.counters(core)?;
        if closed || self.calls.live().is_empty() {
            return Ok(());
        }
        // Where the core places each pending call: a binding learned, or a call queued again.
        let mut learned = Vec::new();
        let mut queued = Vec::new();
        let mut recording = Vec::new();
        for rec in self.calls.live().iter() {
            if rec.phase != Phase::Pending {
                continue;
            }
            match core.call_status(&rec.call) {
                Some(CallStatus::Starting(x)) => {
                    if core.awaits_record(x) {
                        recording.push(rec.call.clone());
                    }
                    learned.push((rec.call.clone(), x))
                }
                Some(CallStatus::Waiting) if self.starting.contains_key(&rec.call) => {
                    queued.push(rec.call.clone())
                }
                _ => {}
            }
        }
        for (call, x) in learned {
            self.calls.learn_binding(&call, x);
            if self.starting.get(&call) != Some(&x) {
                self.bounds.bound(&call, now);
            }
            self.starting.insert(call, x);
        }
        for call in recording {
            self.bounds.awaits_record(&call);
        }
        for call in queued {
            self.starting.remove(&call);
            self.bounds.waiting_again(&call, now);
        }
        let sandboxes = &self.sandboxes;
        let dead = |x: SandboxId| sandboxes.get(&x).is_some_and(|s| s.dead);
        let torn = |x: SandboxId| {
            let s = sandboxes.get(&x);
            !s.is_some_and(|s| s.dead)
                && (s.is_some_and(|s| s.draining || s.relinquished)
                    || lane(x).is_some_and(|l| l.is_stopped() || l.is_shut_down()))
        };
        self.calls.check_core(core, true, |_| true, dead, torn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkeeper::{Fleet, Spec};

    fn fleet_config() -> Config {
        Config {
            fleet: Some(Fleet {
                incarnation: 1,
                lease: Duration::from_secs(10),
                renew_every: Duration::from_secs(3),
                margin: Duration::from_secs(2),
                claim_retry: Duration::from_millis(500),
                handover: sandkeeper::Handover::Warm,
            }),
            ..Config::default()
        }
    }

    fn up(_: SandboxId) -> Option<Lane> {
        Some(Lane::default())
    }

    /// A process with call `c` of session `s` ready on sandbox `x`, started for key `s` under
    /// token 7.
    fn ready() -> (Process, CallId, SandboxId, Key) {
        let config = fleet_config();
        let mut p = Process::new(&config);
        let (c, s) = (CallId::new("c").unwrap(), SessionId::new("s").unwrap());
        let (x, key, at) = (SandboxId(1), Key::Session(s.clone()), Instant::ZERO);
        let versions = Versions::new();
        p.told(Told::Acquire(&c, &s, None, None), Ok(()), at)
            .unwrap();
        p.events_first(&[]).unwrap();
        let start = Command::Start {
            sandbox: x,
            key: key.clone(),
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            deadline: at + config.start_timeout,
            token: Some(Token(7)),
        };
        p.command(&start, at).unwrap();
        let ready = Event::CallReady {
            call: c.clone(),
            sandbox: x,
        };
        p.event(&ready, at, &versions, up).unwrap();
        (p, c, x, key)
    }

    /// Feeds one input's events: the first broken check, if any.
    fn input(p: &mut Process, events: &[Event]) -> Result<(), Violation> {
        let versions = Versions::new();
        p.events_first(events)?;
        events
            .iter()
            .try_for_each(|ev| p.event(ev, Instant::ZERO, &versions, up))
    }

    fn fenced(key: &Key, reason: FenceReason) -> Event {
        Event::KeyFenced {
            key: key.clone(),
            token: Token(7),
            reason,
        }
    }

    /// A call loses its sandbox only to a death or a fence of the token the sandbox was started
    /// under.
    #[test]
    fn a_sandbox_is_lost_only_when_dead_or_fenced() {
        let (mut p, c, x, key) = ready();
        let lost = Event::SandboxLost {
            call: c,
            sandbox: x,
        };
        let broken = input(&mut p, std::slice::from_ref(&lost)).unwrap_err();
        assert_eq!(broken.check, "call-events");
        let (mut p, c, x, key2) = ready();
        assert_eq!(key, key2);
        let other = Event::KeyFenced {
            key: key.clone(),
            token: Token(8),
            reason: FenceReason::Refused,
        };
        let lost = Event::SandboxLost {
            call: c,
            sandbox: x,
        };
        let broken = input(&mut p, &[other, lost.clone()]).unwrap_err();
        assert_eq!(broken.check, "call-events", "fenced under another token");
        let (mut p, ..) = ready();
        input(&mut p, &[fenced(&key, FenceReason::Refused), lost]).unwrap();
    }

    /// A release whose input lapsed the lease first is fed after the lapse's events (which lose
    /// the call's sandbox); after a fence that is not a lapse, it is fed first.
    #[test]
    fn a_release_is_fed_after_the_lapse_it_follows() {
        let (mut p, c, x, key) = ready();
        let lost = Event::SandboxLost {
            call: c.clone(),
            sandbox: x,
        };
        let released = Event::CallReleased { call: c.clone() };
        let events = [
            fenced(&key, FenceReason::LeaseLapsed),
            lost.clone(),
            released.clone(),
        ];
        p.told(Told::Release(&c), Ok(()), Instant::ZERO).unwrap();
        input(&mut p, &events).unwrap();

        let (mut p, ..) = ready();
        let events = [fenced(&key, FenceReason::Refused), lost, released];
        p.told(Told::Release(&c), Ok(()), Instant::ZERO).unwrap();
        let broken = input(&mut p, &events).unwrap_err();
        assert_eq!(broken.check, "call-events");
    }

    /// A counter of the core's that disagrees with what was seen fails by name: here an acquire
    /// the checks were told of and the core never took.
    #[test]
    fn a_counter_the_core_did_not_count_fails_by_name() {
        let config = fleet_config();
        let core = Lifecycle::new(config.clone()).unwrap();
        let mut p = Process::new(&config);
        let (versions, uploads) = (Versions::new(), UploadChecker::new());
        let at = Instant::ZERO;
        p.input_done(&core, at, at, &versions, &uploads, up)
            .unwrap();
        let (c, s) = (CallId::new("c").unwrap(), SessionId::new("s").unwrap());
        p.told(Told::Acquire(&c, &s, None, None), Ok(()), at)
            .unwrap();
        let broken = (p.input_done(&core, at, at, &versions, &uploads, up)).unwrap_err();
        assert_eq!(broken.check, "counters");
        assert!(
            broken.detail.contains("calls_acquired"),
            "{}",
            broken.detail
        );
    }
}
