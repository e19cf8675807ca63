//! [`Lifecycle`]: its state, its getters and outputs, the timer dispatch, the checks every input
//! makes, and the per-input bookkeeping. Its inputs live beside what they concern: calls in
//! `call.rs`, keys in `key.rs`, starts in `start.rs`, the way down in `way_down.rs`, deaths in
//! `death.rs`, the mirror in `mirror.rs`, session records in `session.rs`, close in
//! `close.rs`.

use crate::call::{CallState, CallStatus, Calls, EndHow};
use crate::close::CloseState;
use crate::command::Command;
use crate::config::Config;
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::Event;
use crate::fleet::StoreCommand;
use crate::hook::HookEnd;
use crate::ids::SandboxId;
use crate::ids::Snapshot;
use crate::key::Keys;
use crate::liveness::Liveness;
use crate::name::{CallId, SessionId};
use crate::output::Outputs;
use crate::sandbox::{Awaiting, Ownership, SandboxIx, SandboxState, Sandboxes};
use crate::session::{SessionIx, Sessions};
use crate::stats::Stats;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef, Timers};
use crate::upload::Uploads;
use serde::{Deserialize, Serialize};

/// The sans-IO lifecycle and mirror state machine of one agent's sandboxes.
///
/// Its methods come in four groups, in the manner of quinn-proto's `Connection`:
///
/// - **Getters** read state and never change it: [`resolve`](Self::resolve),
///   [`call_status`](Self::call_status), [`sandbox_state`](Self::sandbox_state),
///   [`is_mirror_settled`](Self::is_mirror_settled), [`stats`](Self::stats), ...
/// - **Application inputs** (mutators): [`acquire`](Self::acquire), [`release`](Self::release),
///   [`flush`](Self::flush), [`hold`](Self::hold), [`unhold`](Self::unhold),
///   [`close`](Self::close).
/// - **Backend inputs** (`handle_*`): the answers to commands, deaths, and
///   [`handle_timeout`](Self::handle_timeout).
/// - **Outputs** (`poll_*`): [`poll_command`](Self::poll_command),
///   [`poll_event`](Self::poll_event), [`poll_timeout`](Self::poll_timeout).
///
/// Every input takes `now`; time never goes backwards inside the core (an earlier `now` counts
/// as the latest one seen). An input that returns `Err` changed nothing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lifecycle {
    // Its state is a set of parts, each a type owned by the file of its name: the crate docs'
    // table of files says what each holds. What crosses parts (an input, a release, a death,
    // close) is done here, on the whole; mirror work and a sandbox's own way down run on
    // views that borrow only the parts they may change (`Mirror`, `WayDown`).
    pub(crate) config: Config,
    /// Virtual time: the latest `now` an input brought.
    pub(crate) now: Instant,
    /// Live calls, with the memory of ended ones and the count of queued ones (`call.rs`).
    pub(crate) calls: Calls,
    /// Session records and their idle queue (`session.rs`).
    pub(crate) sessions: Sessions,
    /// Tracked sandboxes (`sandbox.rs`).
    pub(crate) sandboxes: Sandboxes,
    /// Isolation-key slots (`key.rs`).
    pub(crate) keys: Keys,
    /// Uploads in flight (`upload.rs`).
    pub(crate) uploads: Uploads,
    /// Every deadline (`timer.rs`).
    pub(crate) timers: Timers,
    /// What it hands out (commands, store work, events) and its counters (`output.rs`).
    #[serde(flatten)]
    pub(crate) out: Outputs,
    /// Fleet mode: this process's lease (`liveness.rs`).
    pub(crate) liveness: Option<Liveness>,
    /// Close's phase and report (`close.rs`).
    pub(crate) close: CloseState,
    /// What the current input left to reconcile once it is done. Always empty between inputs.
    #[serde(skip)]
    pub(crate) reconcile: Reconcile,
}

/// The sessions and sandboxes an input changed, whose derived state is brought up to date once,
/// when the input is done ([`Lifecycle::finish_input`]), however often each changed: a session's
/// bookkeeping (where its release stands, whether its mirror settled, whether it is idle), a
/// sandbox's (has its drain finished, may it be forgotten, does its key's record change).
#[derive(Clone, Debug, Default)]
pub(crate) struct Reconcile {
    sessions: Vec<SessionIx>,
    sandboxes: Vec<SandboxIx>,
}

impl Reconcile {
    /// Notes that the session changed (once for a run of changes to the same session).
    pub(crate) fn session(&mut self, session: SessionIx) {
        if self.sessions.last() != Some(&session) {
            self.sessions.push(session);
        }
    }

    /// Notes that the sandbox changed.
    pub(crate) fn sandbox(&mut self, sandbox: SandboxIx) {
        self.sandboxes.push(sandbox);
    }

    /// Forgets every noted sandbox (close forgot them all).
    pub(crate) fn forget_sandboxes(&mut self) {
        self.sandboxes.clear();
    }
}

impl Lifecycle {
    /// A lifecycle with this configuration, at time zero of its own clock, with nothing live.
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        let liveness = config.fleet.map(Liveness::new);
        let first_sandbox = config.fleet.map_or(0, |f| f.first_sandbox());
        let mut core = Lifecycle {
            config,
            now: Instant::ZERO,
            calls: Calls::default(),
            sessions: Sessions::default(),
            sandboxes: Sandboxes::starting_at(first_sandbox),
            keys: Keys::default(),
            uploads: Uploads::default(),
            timers: Timers::default(),
            out: Outputs::default(),
            liveness,
            close: CloseState::Open,
            reconcile: Reconcile::default(),
        };
        core.begin_liveness();
        Ok(core)
    }

    // ------------------------------------------------------------------------------------------
    // Getters

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest `now` an input carried.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The sandbox that context-free code acting for `session` must use: the sandbox of the
    /// session's earliest bound live call whose sandbox is up. Never another session's sandbox;
    /// there is no agent-wide fallback. O(calls of the session).
    ///
    /// Errors: `NoActiveSandbox` when no live call of the session is bound to a sandbox (none,
    /// or all still waiting or starting); `SandboxGone` when every bound one's sandbox died;
    /// `Closed` after close finished.
    pub fn resolve(&self, session: &SessionId) -> Result<SandboxId, Error> {
        self.check_not_closed("resolve")?;
        let no_sandbox = || Error::NoActiveSandbox {
            session: session.clone(),
        };
        let s = &self.sessions[self.sessions.find(session).ok_or_else(no_sandbox)?];
        if let Some(up) = s.first_up(&self.calls, &self.sandboxes) {
            return Ok(self.sid(up));
        }
        // None is up: the earliest ready call's sandbox died, or there is no ready call.
        match s.ready.first() {
            Some(call) => Err(Error::SandboxGone {
                session: session.clone(),
                sandbox: self.sid(self.calls[*call].sandbox().expect("a ready call is bound")),
            }),
            None => Err(no_sandbox()),
        }
    }

    /// Where a live call is, or `None` for a call that is not live. O(1).
    pub fn call_status(&self, call: &CallId) -> Option<CallStatus> {
        let c = &self.calls[self.calls.find(call)?];
        Some(match c.state {
            CallState::Waiting { .. } => CallStatus::Waiting,
            CallState::Starting(sandbox) => CallStatus::Starting(self.sandboxes[sandbox].id),
            CallState::Ready(sandbox)
                if self.sandboxes[sandbox].state() == SandboxState::Dead
                    || self.sandboxes[sandbox].instance_lost =>
            {
                CallStatus::Lost(self.sandboxes[sandbox].id)
            }
            CallState::Ready(sandbox) => CallStatus::Ready(self.sandboxes[sandbox].id),
        })
    }

    /// Whether the core holds `snapshot`: a key keeps it (for its next start, or salvaged), or a
    /// sandbox it tracks made it (its Stop took it; a Persist may be under way) or took it (a
    /// start resumed it). What the core does not hold, only a key's record can bring back to a
    /// start (the fleet sweep's own rule, `sweep.rs`). O(keys + sandboxes).
    pub fn holds_snapshot(&self, snapshot: &Snapshot) -> bool {
        let kept = self
            .keys
            .iter()
            .any(|(_, slot)| slot.snapshot.as_ref().is_some_and(|(s, _)| s == snapshot));
        kept || self.sandboxes.iter().any(|(_, entry)| {
            entry.snapshot() == Some(snapshot)
                || entry.resumed().is_some_and(|(s, _)| s == snapshot)
        })
    }

    /// The state of a sandbox the core still tracks. O(1).
    pub fn sandbox_state(&self, sandbox: SandboxId) -> Option<SandboxState> {
        let tracked = self.sandboxes.find(sandbox)?;
        Some(self.sandboxes[tracked].state())
    }

    /// Fleet mode: whether the sandbox is up (started, its after hook passed) and its calls wait
    /// for the key's record to name it before they are ready (it stays `Starting` meanwhile;
    /// see [`Lifecycle::handle_recorded`]). `false` for a sandbox the core does not track. O(1).
    pub fn awaits_record(&self, sandbox: SandboxId) -> bool {
        self.sandboxes
            .find(sandbox)
            .is_some_and(|tracked| self.sandboxes[tracked].awaits_record_to_rise())
    }

    /// The ownership of a sandbox the core still tracks. O(1).
    pub fn sandbox_ownership(&self, sandbox: SandboxId) -> Option<&Ownership> {
        let tracked = self.sandboxes.find(sandbox)?;
        Some(&self.sandboxes[tracked].owner)
    }

    /// Whether every version flushed for `session` so far has settled. O(paths of the session).
    pub fn is_mirror_settled(&self, session: &SessionId) -> bool {
        self.sessions
            .find(session)
            .is_none_or(|ix| !self.sessions[ix].has_unsettled())
    }

    /// The last version flushed for (session, path), if the core remembers one.
    pub fn last_version(
        &self,
        session: &SessionId,
        path: &crate::name::PathName,
    ) -> Option<crate::ids::Version> {
        let s = &self.sessions[self.sessions.find(session)?];
        let slot = &s.paths[s.slot(path)?];
        Some(crate::ids::Version(slot.last))
    }

    /// Counters of everything the core has done.
    pub fn stats(&self) -> &Stats {
        &self.out.stats
    }

    /// Live calls (waiting, starting or bound).
    pub fn live_calls(&self) -> usize {
        self.calls.len()
    }

    /// Live calls queued behind their keys (each one's [`CallStatus`] is `Waiting`). O(1).
    pub fn queued_calls(&self) -> usize {
        self.calls.waiting
    }

    /// Live calls queued behind `key`. O(1).
    pub fn queued_on(&self, key: &crate::ids::Key) -> usize {
        self.keys
            .find(key)
            .map_or(0, |k| self.keys[k].waiters.len())
    }

    /// Sandboxes the core tracks, in any state.
    pub fn tracked_sandboxes(&self) -> usize {
        self.sandboxes.len()
    }

    /// Isolation keys the core tracks (a live call, a sandbox, a queue or a snapshot).
    pub fn tracked_keys(&self) -> usize {
        self.keys.len()
    }

    /// Session records kept (active and idle).
    pub fn session_records(&self) -> usize {
        self.sessions.len()
    }

    /// Whether close has begun.
    pub fn is_closing(&self) -> bool {
        !matches!(self.close, CloseState::Open)
    }

    /// Whether close has finished: no command will ever come again.
    pub fn is_closed(&self) -> bool {
        matches!(self.close, CloseState::Closed)
    }

    /// Whether nothing is live: no call, no sandbox, no upload, no timer, nothing to drain.
    pub fn is_quiescent(&self) -> bool {
        self.calls.is_empty()
            && self.sandboxes.is_empty()
            && self.uploads.is_empty()
            && self.timers.len() == 0
            && self.out.is_drained()
    }

    // ------------------------------------------------------------------------------------------
    // Outputs

    /// The next command for the driver. Drain until `None` after every input.
    #[inline]
    pub fn poll_command(&mut self) -> Option<Command> {
        self.out.commands.pop_front()
    }

    /// The next piece of work for the store, in fleet mode. Drain until `None` after every
    /// input, beside [`poll_command`](Self::poll_command).
    pub fn poll_store(&mut self) -> Option<StoreCommand> {
        self.out.store.pop_front()
    }

    /// The next event for the application. Drain until `None` after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// The earliest deadline: call [`handle_timeout`](Self::handle_timeout) when it has passed.
    /// `None` when no timer is set (always after close finished). O(log timers).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    // ------------------------------------------------------------------------------------------
    // Timers

    /// Fires every timer due at or before `now`, in deadline order. Calling it early, or twice,
    /// is harmless.
    ///
    /// Errors: `Closed` after close finished.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("timeout")?;
        self.advance(now);
        while let Some((at, timer)) = self.timers.pop_due(self.now) {
            if !self.timer_is_live(at, &timer) {
                continue; // cancelled: its owner let go of it
            }
            self.fire(at, timer);
            self.finish_input();
            if self.is_closed() {
                break;
            }
        }
        // Cancelled timers popped above may have uncovered others at the top.
        self.prune_timers();
        Ok(())
    }

    pub(crate) fn fire(&mut self, at: TimerRef, timer: Timer) {
        match timer {
            Timer::Sandbox(sandbox) => {
                let record = self
                    .sandboxes
                    .get_mut(sandbox)
                    .expect("timer of a live sandbox");
                debug_assert_eq!(record.deadline, Some(at));
                record.deadline = None;
                match (record.state(), record.awaiting()) {
                    (SandboxState::Starting, Awaiting::Start) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "start timed out");
                        self.out.stats.starts_timed_out += 1;
                        if !self.adopt_again(sandbox) {
                            self.fail_start(sandbox, ErrorKind::StartTimeout);
                        }
                    }
                    (SandboxState::Idle, _) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "idle timeout");
                        self.begin_drain(sandbox);
                    }
                    (SandboxState::Draining, _) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "drain deadline");
                        self.out.stats.drain_deadlines += 1;
                        self.end_drain(sandbox, DropReason::DrainDeadline);
                    }
                    (_, Awaiting::Hook) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "hook timed out");
                        self.hook_ended(sandbox, HookEnd::Late);
                    }
                    (_, Awaiting::Stop) | (_, Awaiting::Persist) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "stop or persist timed out");
                        if self.keeps_when_given_up(sandbox) {
                            // Unanswered, its outcome unknown: given up as if failed, without
                            // an Abandon (which a Shutdown must follow): its answer, if it
                            // comes, is stale.
                            let record = &self.sandboxes[sandbox];
                            let snapshot = (record.awaiting() == Awaiting::Persist)
                                .then(|| record.snapshot().cloned())
                                .flatten();
                            self.way_down().stop_awaiting(sandbox);
                            self.way_down_gave_up(sandbox, snapshot);
                        } else {
                            self.way_down().abandon(sandbox);
                            self.shutdown(sandbox);
                        }
                    }
                    (_, Awaiting::Shutdown) => {
                        tracing::warn!(sandbox = %self.sid(sandbox), "shutdown timed out");
                        self.way_down().unconfirmed(sandbox);
                        self.way_down().shutdown_answered(sandbox);
                    }
                    (state, awaiting) => {
                        unreachable!("sandbox timer in {state:?} awaiting {awaiting:?}")
                    }
                }
            }
            Timer::Upload(upload) => self.mirror().upload_timed_out(upload),
            Timer::Retry(session, slot) => self.mirror().retry_due(session, slot),
            Timer::Wait(call) => {
                tracing::debug!(call = %self.calls[call].id, "wait timed out");
                self.end_call(call, EndHow::Failed(ErrorKind::WaitTimeout));
            }
            Timer::Retain(key) => self.retention_over(key),
            Timer::Close => self.close_deadline(),
            Timer::KeyStore(key) => self.key_store_due(key),
            Timer::Renew => self.renew_due(),
            Timer::Lapse => self.lapsed(),
        }
    }

    /// Whether the timer set as `at` is live: its owner still holds this very reference. O(1).
    #[inline(always)]
    pub(crate) fn timer_is_live(&self, at: TimerRef, timer: &Timer) -> bool {
        match timer {
            Timer::Sandbox(sandbox) => self
                .sandboxes
                .get(*sandbox)
                .is_some_and(|record| record.deadline == Some(at)),
            Timer::Upload(u) => self.uploads.get(*u).is_some_and(|u| u.deadline == at),
            Timer::Retry(session, slot) => self
                .sessions
                .get(*session)
                .is_some_and(|s| s.paths.get(*slot).is_some_and(|p| p.retry_at == Some(at))),
            Timer::Wait(call) => self.calls.get(*call).is_some_and(
                |c| matches!(c.state, CallState::Waiting { deadline } if deadline == at),
            ),
            Timer::Retain(key) => self.keys.get(*key).is_some_and(|k| k.retain == Some(at)),
            Timer::KeyStore(key) => self.keys.get(*key).is_some_and(|k| k.store_at == Some(at)),
            Timer::Renew => self.liveness.as_ref().is_some_and(|l| l.renew == Some(at)),
            Timer::Lapse => self.liveness.as_ref().is_some_and(|l| l.lapse == Some(at)),
            Timer::Close => match &self.close {
                CloseState::Draining { deadline, .. } => *deadline == at,
                CloseState::Revoked { grace, .. } => *grace == at,
                CloseState::Open | CloseState::Closed => false,
            },
        }
    }

    /// Drops cancelled timers from the top of the table (and compacts it now and then), so that
    /// `poll_timeout` is a live deadline.
    ///
    /// The table stays in place (moving it out and back for the borrow cost more than the rest
    /// of this function): only the rare rebuild takes it out.
    #[inline(always)]
    pub(crate) fn prune_timers(&mut self) {
        if self.timers.rebuild_due() {
            let mut timers = std::mem::take(&mut self.timers);
            timers.rebuild(|at, timer| self.timer_is_live(at, timer));
            self.timers = timers;
        }
        while let Some((at, timer)) = self.timers.peek() {
            if self.timer_is_live(at, &timer) {
                break;
            }
            self.timers.pop_stale();
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals: input checks

    /// The id of a tracked sandbox, as outputs and logs name it.
    pub(crate) fn sid(&self, sandbox: SandboxIx) -> SandboxId {
        self.sandboxes[sandbox].id
    }

    /// Time never goes backwards inside the core: an earlier `now` counts as the latest seen.
    pub(crate) fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        debug_assert!(
            !self.lapse_due(self.now),
            "an input looked at the state before the lease's lapse was applied"
        );
    }

    /// Fleet mode: whether the lease ran out by `now` and has not lapsed yet.
    fn lapse_due(&self, now: Instant) -> bool {
        self.liveness
            .as_ref()
            .is_some_and(|l| l.valid_until.is_some_and(|until| until <= now))
    }

    /// The first thing every input does. Fleet mode: a lease that ran out by `now` lapses here,
    /// before the input looks at anything, so that no input (an answer, a timer due earlier than
    /// the lapse but handled late, as after a pause) acts under it. This is time passing, not the
    /// input: it happens even when the input is then refused.
    pub(crate) fn time_passes(&mut self, now: Instant) {
        if !self.is_closed() && self.lapse_due(now.max(self.now)) {
            self.now = self.now.max(now);
            self.lapsed();
            self.finish_input();
        }
    }

    pub(crate) fn check_not_closed(&self, what: &'static str) -> Result<(), Error> {
        if self.is_closed() {
            Err(Error::Closed { what })
        } else {
            Ok(())
        }
    }

    pub(crate) fn check_sandbox_id(&self, sandbox: SandboxId) -> Result<(), Error> {
        if !self.sandboxes.was_handed_out(sandbox) && !self.sandboxes.is_foreign(sandbox) {
            Err(Error::UnknownSandbox { sandbox })
        } else {
            Ok(())
        }
    }

    /// The place of `sandbox` when it awaits this answer; `None` for a known sandbox that does
    /// not (a stale answer, counted and ignored).
    #[inline(always)]
    pub(crate) fn awaits(
        &mut self,
        sandbox: SandboxId,
        answer: Awaiting,
    ) -> Result<Option<SandboxIx>, Error> {
        self.check_not_closed("answer")?;
        self.check_sandbox_id(sandbox)?;
        let awaited = self
            .sandboxes
            .find(sandbox)
            .filter(|tracked| self.sandboxes[*tracked].awaiting() == answer);
        if awaited.is_none() {
            tracing::debug!(sandbox = %sandbox, answer = ?answer, "stale answer ignored");
            self.out.stats.stale_answers += 1;
        }
        Ok(awaited)
    }

    /// Whether a managed sandbox's way down ends suspended (Stop, Persist, kept) rather than
    /// in Shutdown: the way its last release asked ([`Lifecycle::release_as`]), else the
    /// policy's.
    pub(crate) fn suspends(&self, sandbox: SandboxIx) -> bool {
        match self.sandboxes[sandbox].asked {
            Some(way) => way == crate::config::WayDown::Suspend,
            None => self.config.release.suspends(),
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals: bookkeeping after each input

    /// Runs the work deferred during an input: the changed sessions' bookkeeping (once each),
    /// then finished drains and forgettable sandboxes, which may change sessions again; then
    /// close progress. Every input ends here.
    pub(crate) fn finish_input(&mut self) {
        loop {
            if !self.reconcile.sessions.is_empty() {
                self.reconcile_sessions();
            }
            let Some(sandbox) = self.reconcile.sandboxes.pop() else {
                break;
            };
            let Some(record) = self.sandboxes.get(sandbox) else {
                continue;
            };
            let key = record.key;
            match record.state() {
                SandboxState::Draining
                    if record.uploads.is_empty()
                        && record.busy_sessions == 0
                        && record.operations == 0 =>
                {
                    tracing::debug!(sandbox = %self.sid(sandbox), "drained");
                    self.end_drain(sandbox, DropReason::DrainDeadline);
                }
                SandboxState::Dead | SandboxState::ShuttingDown
                    if record.bound.is_empty() && record.awaiting() == Awaiting::Nothing =>
                {
                    debug_assert!(record.uploads.is_empty() && record.targeting.is_empty());
                    self.sandboxes.remove(sandbox);
                    self.key_lets_go(key, sandbox);
                }
                _ => {}
            }
            // Fleet mode: a change of the sandbox may change what its key's record says.
            self.record_if_changed(key);
        }
        self.close_progress();
        self.prune_timers();
        #[cfg(debug_assertions)]
        self.debug_check_invariants();
    }

    /// Reconciles the sessions the input changed, once each. Out of line: the mirror's view
    /// takes many registers, which every input would otherwise set up at its end.
    #[inline(never)]
    fn reconcile_sessions(&mut self) {
        let mut sessions = std::mem::take(&mut self.reconcile.sessions);
        let mut mirror = self.mirror();
        for &session in &sessions {
            mirror.reconcile_session(session);
        }
        // Keep the buffer: a reconciled session touches no other session.
        debug_assert!(self.reconcile.sessions.is_empty());
        sessions.clear();
        self.reconcile.sessions = sessions;
    }

    /// In debug builds, checks every state invariant after every input while the state is small
    /// (the check is O(n log n)); a broken one is a bug in the core, so it panics. A switch for
    /// tests, not behaviour: `.cargo/mutants.toml` leaves it out of mutation testing.
    #[cfg(debug_assertions)]
    fn debug_check_invariants(&self) {
        if self.sandboxes.len() + self.calls.len() <= 64 {
            if let Err(v) = self.check_invariants() {
                panic!("internal invariant broken: {v}");
            }
        }
    }
}
