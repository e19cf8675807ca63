//! The lifecycle: calls, keys and sandboxes, from acquire to shutdown. The mirror lives in
//! `mirror.rs`, close in `close.rs`; all three are methods of [`Lifecycle`].

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::call::{Call, CallIx, CallSpec, CallState, CallStatus, Calls, EndedCalls, KeyIx, Keys};
use crate::close::CloseState;
use crate::command::Command;
use crate::config::{Config, ReleasePolicy, SameKey, Scope};
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::Event;
use crate::ids::{Key, SandboxId, Snapshot};
use crate::name::{CallId, SessionId};
use crate::sandbox::{Awaiting, Ownership, SandboxIx, SandboxState, Sandboxes};
use crate::session::{SessionIx, Sessions};
use crate::small_set::Few;
use crate::stats::Stats;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef, Timers};
use crate::upload::Uploads;

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
    pub(crate) config: Config,
    pub(crate) now: Instant,
    pub(crate) calls: Calls,
    pub(crate) sessions: Sessions,
    pub(crate) sandboxes: Sandboxes,
    pub(crate) keys: Keys,
    pub(crate) uploads: Uploads,
    pub(crate) timers: Timers,
    pub(crate) commands: VecDeque<Command>,
    pub(crate) events: VecDeque<Event>,
    pub(crate) ended: EndedCalls,
    /// Calls queued behind their keys, over all keys.
    pub(crate) waiting: usize,
    pub(crate) close: CloseState,
    pub(crate) stats: Stats,
    /// Sandboxes to look at once the current input is done (drain finished? record forgettable?).
    /// Always empty between inputs.
    #[serde(skip)]
    pub(crate) dirty: Vec<SandboxIx>,
    /// Sessions whose derived bookkeeping is brought up to date once the current input is done.
    /// Always empty between inputs.
    #[serde(skip)]
    pub(crate) touched: Vec<SessionIx>,
}

impl Lifecycle {
    /// A lifecycle with this configuration, at time zero of its own clock, with nothing live.
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        Ok(Lifecycle {
            config,
            now: Instant::ZERO,
            calls: Calls::default(),
            sessions: Sessions::default(),
            sandboxes: Sandboxes::default(),
            keys: Keys::default(),
            uploads: Uploads::default(),
            timers: Timers::default(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            ended: EndedCalls::default(),
            waiting: 0,
            close: CloseState::Open,
            stats: Stats::default(),
            dirty: Vec::new(),
            touched: Vec::new(),
        })
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
        let mut dead = None;
        for call in &s.ready {
            let x = &self.sandboxes[self.calls[*call].sandbox().expect("a ready call is bound")];
            if x.state.accepts_uploads() {
                return Ok(x.id);
            }
            dead.get_or_insert(x.id);
        }
        match dead {
            Some(sandbox) => Err(Error::SandboxGone {
                session: session.clone(),
                sandbox,
            }),
            None => Err(no_sandbox()),
        }
    }

    /// Where a live call is, or `None` for a call that is not live. O(1).
    pub fn call_status(&self, call: &CallId) -> Option<CallStatus> {
        let c = &self.calls[self.calls.find(call)?];
        Some(match c.state {
            CallState::Waiting { .. } => CallStatus::Waiting,
            CallState::Starting(x) => CallStatus::Starting(self.sandboxes[x].id),
            CallState::Ready(x) if self.sandboxes[x].state == SandboxState::Dead => {
                CallStatus::Lost(self.sandboxes[x].id)
            }
            CallState::Ready(x) => CallStatus::Ready(self.sandboxes[x].id),
        })
    }

    /// The state of a sandbox the core still tracks. O(1).
    pub fn sandbox_state(&self, sandbox: SandboxId) -> Option<SandboxState> {
        let x = self.sandboxes.find(sandbox)?;
        Some(self.sandboxes[x].state)
    }

    /// The ownership of a sandbox the core still tracks. O(1).
    pub fn sandbox_ownership(&self, sandbox: SandboxId) -> Option<&Ownership> {
        let x = self.sandboxes.find(sandbox)?;
        Some(&self.sandboxes[x].owner)
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
        &self.stats
    }

    /// Live calls (waiting, starting or bound).
    pub fn live_calls(&self) -> usize {
        self.calls.len()
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
            && self.commands.is_empty()
            && self.events.is_empty()
    }

    // ------------------------------------------------------------------------------------------
    // Outputs

    /// The next command for the driver. Drain until `None` after every input.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The next event for the application. Drain until `None` after every input.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest deadline: call [`handle_timeout`](Self::handle_timeout) when it has passed.
    /// `None` when no timer is set (always after close finished). O(log timers).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// Starts a call: binds it to its key's sandbox, starts one, or queues it behind its key.
    ///
    /// The outcome comes as an event: `CallReady` (at once when the key's sandbox is up, or an
    /// external sandbox is named), later `CallReady` or `CallFailed`. O(log n).
    ///
    /// Errors: `Closed` once close began, `DuplicateCall`, `MissingUser` (scope `User`),
    /// `QueueFull`, `LimitExceeded`.
    pub fn acquire(&mut self, now: Instant, spec: CallSpec) -> Result<(), Error> {
        if self.is_closing() {
            return Err(Error::Closed { what: "acquire" });
        }
        if self.calls.find(&spec.call).is_some() {
            return Err(Error::DuplicateCall { call: spec.call });
        }
        let limits = &self.config.limits;
        if self.calls.len() >= limits.max_calls {
            return Err(Error::LimitExceeded {
                limit: "max_calls",
                max: limits.max_calls,
            });
        }
        if self.sessions.find(&spec.session).is_none()
            && self.sessions.active() >= limits.max_active_sessions
        {
            return Err(Error::LimitExceeded {
                limit: "max_active_sessions",
                max: limits.max_active_sessions,
            });
        }
        let key = self.key_of(&spec)?;
        let slot = self.keys.find(&key);
        let must_wait = self.must_wait(&key, slot);
        if must_wait {
            let waiting = slot.map_or(0, |k| self.keys[k].waiters.len());
            if waiting >= self.config.max_waiters {
                return Err(Error::QueueFull {
                    key,
                    max: self.config.max_waiters,
                });
            }
        } else if slot.and_then(|k| self.keys[k].current).is_none()
            && self.sandboxes.len() >= self.config.limits.max_sandboxes
        {
            return Err(Error::LimitExceeded {
                limit: "max_sandboxes",
                max: self.config.limits.max_sandboxes,
            });
        }

        self.advance(now);
        let CallSpec {
            call,
            session,
            spec: start_spec,
            ..
        } = spec;
        tracing::debug!(call = %call, session = %session, key = %key, "acquire");
        self.stats.calls_acquired += 1;
        let session = self.sessions.find_or_insert(&session);
        let key = match slot {
            Some(slot) => slot,
            None => self.keys.find_or_insert(key),
        };
        let ix = self.calls.insert(Call {
            id: call,
            session,
            key,
            spec: start_spec,
            state: CallState::Waiting {
                deadline: TimerRef::UNSET,
            },
        });
        self.sessions[session].coming += 1;
        if must_wait {
            let at = self.now + self.config.wait_timeout;
            self.waiting += 1;
            let deadline = self.timers.set(at, Timer::Wait(ix));
            self.calls[ix].state = CallState::Waiting { deadline };
            self.keys[key].waiters.push_back(ix);
        } else {
            self.bind(ix);
        }
        self.session_changed(session);
        self.finish_input();
        Ok(())
    }

    /// Ends a call, whatever the reason (done, error, cancelled). Exactly once per call.
    ///
    /// A queued or starting call ends at once (`CallReleased` follows at once); a sandbox that
    /// was starting only for it is shut down as soon as its start answers. A bound call unbinds;
    /// when it was its sandbox's last call, the release policy applies (drain → Stop → Persist →
    /// Shutdown, keep warm, or suspend). `CallReleased` comes once its session's mirror work
    /// for that sandbox has settled. O(log n).
    ///
    /// Errors: `UnknownCall`, `AlreadyReleased`, `Closed` after close finished.
    pub fn release(&mut self, now: Instant, call: &CallId) -> Result<(), Error> {
        self.check_not_closed("release")?;
        let Some(ix) = self.calls.find(call) else {
            return Err(if self.ended.contains(call) {
                Error::AlreadyReleased { call: call.clone() }
            } else {
                Error::UnknownCall { call: call.clone() }
            });
        };
        self.advance(now);
        tracing::debug!(call = %call, "release");
        self.stats.calls_released += 1;
        self.end_call(ix, EndHow::Released);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The sandbox's Start succeeded: it is up, its calls are ready. A Start that is no longer
    /// awaited (the sandbox timed out, died, or was shut down by close) is stale and ignored.
    ///
    /// Errors: `UnknownSandbox` for an id never handed out, `Closed` after close finished.
    pub fn handle_start_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Start)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "start ok");
        self.stats.starts_ok += 1;
        self.cancel_sandbox_timer(sandbox);
        let x = self.sandboxes.get_mut(sandbox).expect("awaited");
        x.awaiting = Awaiting::Nothing;
        x.state = SandboxState::Running;
        let starters = self.calls.by_name_order(x.bound.iter().copied().collect());
        for call in starters {
            if matches!(self.calls[call].state, CallState::Starting(s) if s == sandbox) {
                self.make_ready(call, sandbox);
            }
        }
        let key = self.sandboxes[sandbox].key;
        self.admit(key);
        if self.sandboxes[sandbox].bound.is_empty() {
            // Every call it was started for ended while it started.
            self.stats.orphan_starts += 1;
            self.shutdown(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Start failed: the calls waiting on it fail with `start-failed`, and it is
    /// shut down (to clean up whatever the start left). Others' bindings are untouched.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_start_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Start)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "start failed");
        self.stats.starts_failed += 1;
        self.sandboxes.get_mut(sandbox).expect("awaited").awaiting = Awaiting::Nothing;
        self.fail_start(sandbox, ErrorKind::StartFailed);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Stop succeeded, with the snapshot it took, if any. Persist follows when
    /// there is a snapshot (or the policy is `Suspend`), else Shutdown.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_stop_ok(
        &mut self,
        now: Instant,
        sandbox: SandboxId,
        snapshot: Option<Snapshot>,
    ) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Stop)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), snapshot = ?snapshot, "stop ok");
        self.cancel_sandbox_timer(sandbox);
        let suspend = self.suspends();
        let x = self.sandboxes.get_mut(sandbox).expect("awaited");
        x.awaiting = Awaiting::Nothing;
        x.snapshot = snapshot;
        if x.snapshot.is_some() || suspend {
            self.persist(sandbox);
        } else {
            self.shutdown(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Stop failed: it is not running for the core (whatever a backend flag
    /// says); nothing is persisted; Shutdown follows.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_stop_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Stop)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "stop failed");
        self.stats.stops_failed += 1;
        self.cancel_sandbox_timer(sandbox);
        self.sandboxes.get_mut(sandbox).expect("awaited").awaiting = Awaiting::Nothing;
        self.shutdown(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Persist succeeded: its snapshot becomes its key's `resume_from`. Under
    /// `Suspend` the sandbox is done (kept by the backend); otherwise Shutdown follows.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_persist_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Persist)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "persist ok");
        self.cancel_sandbox_timer(sandbox);
        let x = self.sandboxes.get_mut(sandbox).expect("awaited");
        x.awaiting = Awaiting::Nothing;
        let (key, id) = (x.key, x.id);
        if let Some(snapshot) = x.snapshot.clone() {
            // The key's slot is kept by this sandbox, its retiring one.
            let slot = self
                .keys
                .get_mut(key)
                .expect("the key of a retiring sandbox");
            debug_assert_eq!(slot.retiring, Some(sandbox));
            if !matches!(slot.key, Key::Call(_)) {
                slot.snapshot = Some((snapshot, id));
            }
        }
        if self.suspends() {
            self.suspended(sandbox);
        } else {
            self.shutdown(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Persist failed: the key keeps its previous snapshot; Shutdown follows (a
    /// sandbox that could not be persisted is not kept suspended).
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_persist_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Persist)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "persist failed");
        self.stats.persists_failed += 1;
        self.cancel_sandbox_timer(sandbox);
        self.sandboxes.get_mut(sandbox).expect("awaited").awaiting = Awaiting::Nothing;
        self.shutdown(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Shutdown succeeded: the core forgets it (once no live call is bound to it).
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_shutdown_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Shutdown)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "shutdown ok");
        self.stats.shutdowns_ok += 1;
        self.close_note_shut_down();
        self.shutdown_answered(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's Shutdown failed: `ShutdownUnconfirmed` tells the application the backend
    /// may still hold it. Shutdown is never ordered twice.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_shutdown_failed(
        &mut self,
        now: Instant,
        sandbox: SandboxId,
    ) -> Result<(), Error> {
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Shutdown)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::warn!(sandbox = %self.sid(sandbox), "shutdown failed");
        self.unconfirmed(sandbox);
        self.shutdown_answered(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The backend reports the sandbox gone (pod evicted, claim expired, connection closed,
    /// directory removed). It is Dead: bound calls get `SandboxLost`, calls starting on it fail
    /// with `sandbox-gone`, uploads in flight into it are cancelled and their versions dropped
    /// (`sandbox-gone`), answers still outstanding become stale, and Shutdown is ordered once
    /// (managed sandboxes) to clean up whatever is left. A second report is ignored.
    ///
    /// Errors: `UnknownSandbox` for an id never handed out, `Closed` after close finished.
    pub fn handle_died(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.check_not_closed("died")?;
        self.check_sandbox_id(sandbox)?;
        let Some(sandbox) = self.sandboxes.find(sandbox) else {
            self.stats.stale_answers += 1;
            return Ok(());
        };
        if self.sandboxes[sandbox].state == SandboxState::Dead {
            return Ok(());
        }
        self.advance(now);
        self.died(sandbox);
        self.finish_input();
        Ok(())
    }

    /// The backend reports that the sandbox's running instance is gone (its processes; on
    /// Kubernetes its pod) while its workspace may remain (a claim and its volumes).
    ///
    /// While the sandbox is being suspended (its `Stop { suspend: true }` or
    /// `Persist { suspend: true }` outstanding) that is the suspension's own doing: it is
    /// counted (`instance_losses_suspending`) and changes nothing. In any other state the
    /// sandbox is dead, exactly as [`handle_died`](Self::handle_died). A report about a sandbox
    /// the core no longer tracks (a suspended one, an earlier incarnation of a resumed one) is
    /// stale.
    ///
    /// Errors: as [`handle_died`](Self::handle_died).
    pub fn handle_instance_gone(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.check_not_closed("instance-gone")?;
        self.check_sandbox_id(sandbox)?;
        let Some(sandbox) = self.sandboxes.find(sandbox) else {
            self.stats.stale_answers += 1;
            return Ok(());
        };
        let x = &self.sandboxes[sandbox];
        if x.state == SandboxState::Dead {
            return Ok(());
        }
        let suspending =
            matches!(x.awaiting, Awaiting::Stop | Awaiting::Persist) && self.suspends();
        self.advance(now);
        if suspending {
            tracing::debug!(sandbox = %self.sid(sandbox), "instance gone while suspending");
            self.stats.instance_losses_suspending += 1;
        } else {
            self.died(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// Fires every timer due at or before `now`, in deadline order. Calling it early, or twice,
    /// is harmless.
    ///
    /// Errors: `Closed` after close finished.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Error> {
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

    // ------------------------------------------------------------------------------------------
    // Internals: input checks

    /// The id of a tracked sandbox, as outputs and logs name it.
    pub(crate) fn sid(&self, sandbox: SandboxIx) -> SandboxId {
        self.sandboxes[sandbox].id
    }

    pub(crate) fn advance(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    pub(crate) fn check_not_closed(&self, what: &'static str) -> Result<(), Error> {
        if self.is_closed() {
            Err(Error::Closed { what })
        } else {
            Ok(())
        }
    }

    fn check_sandbox_id(&self, sandbox: SandboxId) -> Result<(), Error> {
        if !self.sandboxes.was_handed_out(sandbox) {
            Err(Error::UnknownSandbox { sandbox })
        } else {
            Ok(())
        }
    }

    /// Whether `sandbox` awaits this answer; a known sandbox that does not is a stale answer.
    /// The place of `sandbox` when it awaits this answer; `None` for a known sandbox that does
    /// not (a stale answer).
    fn awaits(&mut self, sandbox: SandboxId, answer: Awaiting) -> Result<Option<SandboxIx>, Error> {
        self.check_not_closed("answer")?;
        self.check_sandbox_id(sandbox)?;
        let awaited = self
            .sandboxes
            .find(sandbox)
            .filter(|x| self.sandboxes[*x].awaiting == answer);
        if awaited.is_none() {
            tracing::debug!(sandbox = %sandbox, answer = ?answer, "stale answer ignored");
            self.stats.stale_answers += 1;
        }
        Ok(awaited)
    }

    fn key_of(&self, spec: &CallSpec) -> Result<Key, Error> {
        if let Some(external) = &spec.external {
            return Ok(Key::External(external.clone()));
        }
        Ok(match self.config.scope {
            Scope::Call => Key::Call(spec.call.clone()),
            Scope::Session => Key::Session(spec.session.clone()),
            Scope::User => Key::User(spec.user.clone().ok_or_else(|| Error::MissingUser {
                call: spec.call.clone(),
            })?),
            Scope::Agent => Key::Agent,
            Scope::Global => Key::Global,
        })
    }

    /// Whether a new call of `key` must queue: others queue already (first in, first out), the
    /// key's previous sandbox is still stopping (its snapshot is not persisted yet), or the
    /// policy is `Serialize` and a call holds the key.
    fn must_wait(&self, key: &Key, slot: Option<KeyIx>) -> bool {
        if matches!(key, Key::External(_)) {
            return false;
        }
        slot.map(|k| &self.keys[k]).is_some_and(|k| {
            !k.waiters.is_empty()
                || k.retiring.is_some()
                || (self.config.same_key == SameKey::Serialize && k.bound > 0)
        })
    }

    /// Whether a managed sandbox's way down ends suspended (Stop, Persist, kept) rather than
    /// in Shutdown.
    pub(crate) fn suspends(&self) -> bool {
        self.config.release == ReleasePolicy::Suspend
    }

    // ------------------------------------------------------------------------------------------
    // Internals: binding

    /// Binds a call that is not queued to its key's sandbox, starting one when there is none.
    fn bind(&mut self, call: CallIx) {
        let key = self.calls[call].key;
        let slot = &self.keys[key];
        let sandbox = match slot.current {
            Some(x) => x,
            None => match &slot.key {
                Key::External(name) => {
                    let name = name.clone();
                    let x = self.sandboxes.create(
                        key,
                        Ownership::External(name.clone()),
                        SandboxState::Running,
                    );
                    self.keys[key].current = Some(x);
                    tracing::debug!(sandbox = %self.sid(x), external = %name, "external sandbox bound");
                    x
                }
                _ => self.start_sandbox(call),
            },
        };
        let session = self.calls[call].session;
        self.keys[key].bound += 1;
        let x = self.sandboxes.get_mut(sandbox).expect("current sandbox");
        x.bound.insert(call);
        match x.state {
            SandboxState::Starting => {
                self.calls[call].state = CallState::Starting(sandbox);
            }
            SandboxState::Running | SandboxState::Idle | SandboxState::Draining => {
                if x.state != SandboxState::Running {
                    // A warm or draining sandbox is revived for the next call of its key: no
                    // churn, the workspace stays.
                    tracing::debug!(sandbox = %x.id, state = ?x.state, "revived");
                    x.state = SandboxState::Running;
                    self.stats.revivals += 1;
                    self.cancel_sandbox_timer(sandbox);
                }
                self.make_ready(call, sandbox);
            }
            other => unreachable!("a key's current sandbox is never {other:?}"),
        }
        self.session_changed(session);
    }

    /// A bound call becomes ready on an up sandbox.
    fn make_ready(&mut self, call: CallIx, sandbox: SandboxIx) {
        let c = &mut self.calls[call];
        c.state = CallState::Ready(sandbox);
        let session = c.session;
        let s = &mut self.sessions[session];
        s.coming -= 1;
        s.ready.push(call);
        s.linger = None;
        self.stats.calls_ready += 1;
        let name = self.calls[call].id.clone();
        tracing::debug!(call = %name, sandbox = %self.sid(sandbox), "call ready");
        self.events.push_back(Event::CallReady {
            call: name,
            sandbox: self.sid(sandbox),
        });
        self.retarget(session, DropReason::NoSandbox);
    }

    /// Admits queued calls of `key` while the policy lets them in.
    pub(crate) fn admit(&mut self, key: KeyIx) {
        if self.waiting == 0 {
            return;
        }
        loop {
            let serialize = self.config.same_key == SameKey::Serialize;
            let Some(slot) = self.keys.get_mut(key) else {
                return;
            };
            if slot.retiring.is_some() || (serialize && slot.bound > 0) {
                return;
            }
            let Some(call) = slot.waiters.pop_front() else {
                return;
            };
            if let CallState::Waiting { deadline } = self.calls[call].state {
                self.timers.cancel(deadline);
            }
            self.waiting -= 1;
            tracing::debug!(call = %self.calls[call].id, key = %slot.key, "admitted");
            self.bind(call);
        }
    }

    /// Orders a Start for `call`'s key.
    fn start_sandbox(&mut self, call: CallIx) -> SandboxIx {
        let c = &self.calls[call];
        let key = c.key;
        let spec = c.spec.clone();
        let x = self
            .sandboxes
            .create(key, Ownership::Managed, SandboxState::Starting);
        self.sandboxes[x].awaiting = Awaiting::Start;
        let slot = &mut self.keys[key];
        slot.current = Some(x);
        let key = slot.key.clone();
        let (resume_from, resumes) = match slot.snapshot.clone() {
            Some((snapshot, by)) => (Some(snapshot), Some(by)),
            None => (None, None),
        };
        let deadline = self.set_sandbox_timer(x, self.config.start_timeout);
        self.stats.starts_ordered += 1;
        let id = self.sid(x);
        tracing::debug!(sandbox = %id, key = %key, resume_from = ?resume_from, "start");
        self.commands.push_back(Command::Start {
            sandbox: id,
            key,
            spec,
            resume_from,
            resumes,
            deadline,
        });
        x
    }

    // ------------------------------------------------------------------------------------------
    // Internals: ending calls

    /// Ends a live call: released by the application, failed, or revoked by close.
    pub(crate) fn end_call(&mut self, ix: CallIx, how: EndHow) {
        let c = self.calls.remove(ix);
        let call = &c.id;
        self.ended
            .remember(call.clone(), self.config.limits.remembered_ended_calls);
        let session = c.session;
        match how {
            EndHow::Released => {}
            EndHow::Failed(error) => {
                self.stats.calls_failed += 1;
                tracing::debug!(call = %call, error = %error, "call failed");
                self.events.push_back(Event::CallFailed {
                    call: call.clone(),
                    error,
                });
            }
            EndHow::Revoked => {
                self.stats.calls_revoked += 1;
                tracing::debug!(call = %call, "call revoked");
                self.events
                    .push_back(Event::CallRevoked { call: call.clone() });
            }
        }
        let released = how == EndHow::Released;
        match c.state {
            CallState::Waiting { deadline } => {
                self.timers.cancel(deadline);
                self.waiting -= 1;
                if let Some(slot) = self.keys.get_mut(c.key) {
                    slot.waiters.retain(|w| *w != ix);
                }
                self.sessions[session].coming -= 1;
                if released {
                    self.events
                        .push_back(Event::CallReleased { call: call.clone() });
                }
            }
            CallState::Starting(x) => {
                self.sessions[session].coming -= 1;
                self.unbind(ix, c.key, x);
                if released {
                    self.events
                        .push_back(Event::CallReleased { call: call.clone() });
                }
            }
            CallState::Ready(x) => {
                let s = &mut self.sessions[session];
                s.ready.retain(|r| *r != ix);
                // The session's mirror lingers on this sandbox unless another of its ready calls
                // has a sandbox that is up (a call whose sandbox died does not count).
                let other_up = s.ready.iter().any(|r| {
                    self.calls[*r]
                        .sandbox()
                        .is_some_and(|y| self.sandboxes[y].state.accepts_uploads())
                });
                if !other_up && self.sandboxes[x].state.accepts_uploads() {
                    s.linger = Some(x);
                }
                if released {
                    s.releasing.push((call.clone(), x));
                }
                self.unbind(ix, c.key, x);
            }
        }
        // With no sandbox to go to and none coming, the session's pending versions are dropped.
        let reason = if self.is_closing() {
            DropReason::Closed
        } else {
            DropReason::NoSandbox
        };
        self.retarget(session, reason);
        self.after_unbind_key(c.key);
    }

    /// Takes a call off its sandbox and key.
    fn unbind(&mut self, call: CallIx, key: KeyIx, sandbox: SandboxIx) {
        let slot = &mut self.keys[key];
        slot.bound -= 1;
        let x = self
            .sandboxes
            .get_mut(sandbox)
            .expect("sandbox of a bound call");
        let was_bound = x.bound.remove(&call);
        debug_assert!(was_bound, "call {call:?} was not bound to {sandbox:?}");
        if !x.bound.is_empty() {
            return;
        }
        match x.state {
            SandboxState::Running => {
                // Queued calls take the sandbox over before the release policy sees it empty.
                self.admit(key);
                if self.sandboxes[sandbox].bound.is_empty() {
                    self.last_call_released(sandbox);
                }
            }
            SandboxState::Starting => {
                // Its start answers later: a queued call takes it over, or it shuts down then.
                self.admit(key);
            }
            SandboxState::Dead => self.dirty.push(sandbox),
            other => unreachable!("a sandbox with calls is never {other:?}"),
        }
    }

    fn after_unbind_key(&mut self, key: KeyIx) {
        self.admit(key);
        self.keys.forget_if_empty(key);
    }

    /// The release policy, applied when a running sandbox's last call has gone.
    fn last_call_released(&mut self, sandbox: SandboxIx) {
        let x = &self.sandboxes[sandbox];
        match (&x.owner, self.config.release, self.is_closing()) {
            (Ownership::Managed, ReleasePolicy::KeepWarm { idle }, false) => {
                tracing::debug!(sandbox = %self.sid(sandbox), "kept warm");
                self.sandboxes.get_mut(sandbox).expect("live").state = SandboxState::Idle;
                self.set_sandbox_timer(sandbox, idle);
            }
            _ => self.begin_drain(sandbox),
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals: the way down (drain → Stop → Persist → Shutdown)

    /// The sandbox drains: its sessions' mirror work and holds finish before Stop, up to the
    /// drain deadline.
    pub(crate) fn begin_drain(&mut self, sandbox: SandboxIx) {
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        debug_assert!(x.bound.is_empty());
        x.state = SandboxState::Draining;
        let sessions = self.sessions.names(x.targeting.iter().copied());
        tracing::debug!(sandbox = %self.sid(sandbox), sessions = sessions.len(), "drain");
        self.set_sandbox_timer(sandbox, self.config.drain_deadline);
        self.commands.push_back(Command::Drain {
            sandbox: self.sid(sandbox),
            sessions,
        });
        self.dirty.push(sandbox);
    }

    /// Ends a drain, cleanly or at a deadline: what is still in flight or pending for it is
    /// dropped with `reason`, then a managed sandbox stops and an external one is unbound.
    pub(crate) fn end_drain(&mut self, sandbox: SandboxIx, reason: DropReason) {
        self.cancel_sandbox_timer(sandbox);
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        let managed = x.is_managed();
        x.state = if managed {
            SandboxState::Stopping
        } else {
            SandboxState::Dead
        };
        self.leave_uploads(sandbox, reason);
        let key = self.sandboxes[sandbox].key;
        let slot = &mut self.keys[key];
        if slot.current == Some(sandbox) {
            slot.current = None;
        }
        if managed {
            slot.retiring = Some(sandbox);
            let x = self.sandboxes.get_mut(sandbox).expect("live");
            x.awaiting = Awaiting::Stop;
            let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
            tracing::debug!(sandbox = %self.sid(sandbox), "stop");
            self.commands.push_back(Command::Stop {
                sandbox: self.sid(sandbox),
                suspend: self.suspends(),
                deadline,
            });
        } else {
            tracing::debug!(sandbox = %self.sid(sandbox), "external sandbox unbound");
            self.dirty.push(sandbox);
        }
        self.admit(key);
    }

    fn persist(&mut self, sandbox: SandboxIx) {
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        x.state = SandboxState::Persisting;
        x.awaiting = Awaiting::Persist;
        let snapshot = x.snapshot.clone();
        let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
        tracing::debug!(sandbox = %self.sid(sandbox), snapshot = ?snapshot, "persist");
        self.commands.push_back(Command::Persist {
            sandbox: self.sid(sandbox),
            snapshot,
            suspend: self.suspends(),
            deadline,
        });
    }

    /// Stops awaiting the sandbox's outstanding Start, Stop or Persist, if any: cancels its
    /// timer and orders `Abandon`. Its Shutdown follows at once (every caller orders it).
    pub(crate) fn abandon(&mut self, sandbox: SandboxIx) {
        if self.stop_awaiting(sandbox) {
            self.order_abandon(sandbox);
        }
    }

    /// Stops awaiting the sandbox's outstanding Start, Stop or Persist, without ordering
    /// `Abandon` yet; whether there was one. The caller orders it right before the Shutdown.
    fn stop_awaiting(&mut self, sandbox: SandboxIx) -> bool {
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        if !matches!(
            x.awaiting,
            Awaiting::Start | Awaiting::Stop | Awaiting::Persist
        ) {
            return false;
        }
        x.awaiting = Awaiting::Nothing;
        self.cancel_sandbox_timer(sandbox);
        true
    }

    fn order_abandon(&mut self, sandbox: SandboxIx) {
        self.stats.abandoned += 1;
        tracing::debug!(sandbox = %self.sid(sandbox), "abandon");
        self.commands.push_back(Command::Abandon {
            sandbox: self.sid(sandbox),
        });
    }

    /// Orders the sandbox's one Shutdown.
    pub(crate) fn shutdown(&mut self, sandbox: SandboxIx) {
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        debug_assert!(
            !x.shutdown_ordered,
            "shutdown ordered twice for {sandbox:?}"
        );
        debug_assert!(
            x.awaiting == Awaiting::Nothing,
            "shutdown of {sandbox:?} while awaiting {:?}",
            x.awaiting
        );
        debug_assert!(x.is_managed());
        debug_assert!(x.uploads.is_empty());
        x.shutdown_ordered = true;
        x.awaiting = Awaiting::Shutdown;
        if x.state != SandboxState::Dead {
            x.state = SandboxState::ShuttingDown;
        }
        let key = x.key;
        self.leave_uploads(sandbox, DropReason::SandboxGone);
        let deadline = self.set_sandbox_timer(sandbox, self.config.command_timeout);
        self.stats.shutdowns_ordered += 1;
        tracing::debug!(sandbox = %self.sid(sandbox), "shutdown");
        self.commands.push_back(Command::Shutdown {
            sandbox: self.sid(sandbox),
            deadline,
        });
        self.key_lets_go(key, sandbox);
    }

    /// `Suspend` is done for the sandbox: persisted, kept by the backend, forgotten by the core.
    fn suspended(&mut self, sandbox: SandboxIx) {
        tracing::debug!(sandbox = %self.sid(sandbox), "suspended");
        self.stats.suspended += 1;
        self.close_note_suspended(sandbox);
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        x.state = SandboxState::Dead;
        x.awaiting = Awaiting::Nothing;
        let key = x.key;
        self.key_lets_go(key, sandbox);
        self.dirty.push(sandbox);
    }

    /// The key no longer waits on the sandbox: queued calls may start a new one.
    fn key_lets_go(&mut self, key: KeyIx, sandbox: SandboxIx) {
        if let Some(slot) = self.keys.get_mut(key) {
            if slot.current == Some(sandbox) {
                slot.current = None;
            }
            if slot.retiring == Some(sandbox) {
                slot.retiring = None;
            }
        }
        self.admit(key);
        self.keys.forget_if_empty(key);
    }

    fn shutdown_answered(&mut self, sandbox: SandboxIx) {
        self.cancel_sandbox_timer(sandbox);
        self.sandboxes.get_mut(sandbox).expect("awaited").awaiting = Awaiting::Nothing;
        self.dirty.push(sandbox);
    }

    pub(crate) fn unconfirmed(&mut self, sandbox: SandboxIx) {
        self.stats.shutdowns_unconfirmed += 1;
        self.close_note_unconfirmed(sandbox);
        self.events.push_back(Event::ShutdownUnconfirmed {
            sandbox: self.sid(sandbox),
        });
    }

    /// A start that failed, timed out or died: its calls fail, it is cleaned up.
    fn fail_start(&mut self, sandbox: SandboxIx, error: ErrorKind) {
        // A start that failed was answered; one that timed out or died is abandoned (ordered
        // right before its Shutdown, after the calls' ends, which may start other sandboxes).
        let abandoned = self.stop_awaiting(sandbox);
        self.cancel_sandbox_timer(sandbox);
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        let key = x.key;
        if let Some(slot) = self.keys.get_mut(key) {
            if slot.current == Some(sandbox) {
                slot.current = None;
            }
        }
        let starters: Few<CallIx> = x.bound.iter().copied().collect();
        for call in self.calls.by_name_order(starters) {
            self.end_call(call, EndHow::Failed(error));
        }
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        // Only a managed sandbox starts, and one still starting has no Shutdown ordered yet.
        debug_assert!(x.is_managed() && !x.shutdown_ordered);
        if error == ErrorKind::SandboxGone {
            x.state = SandboxState::Dead;
        }
        // Dead or not, one Shutdown frees whatever the backend still holds of it.
        if abandoned {
            self.order_abandon(sandbox);
        }
        self.shutdown(sandbox);
        self.admit(key);
        self.keys.forget_if_empty(key);
    }

    /// The backend reported the sandbox gone.
    pub(crate) fn died(&mut self, sandbox: SandboxIx) {
        let x = self.sandboxes.get_mut(sandbox).expect("live");
        let previous = x.state;
        tracing::warn!(sandbox = %x.id, state = ?previous, "sandbox died");
        self.stats.deaths += 1;
        if previous == SandboxState::Starting {
            self.fail_start(sandbox, ErrorKind::SandboxGone);
            return;
        }
        x.state = SandboxState::Dead;
        let key = x.key;
        let lost: Few<CallIx> = x.bound.iter().copied().collect();
        // A Stop or Persist still outstanding is abandoned: its answer is stale now (Abandon is
        // ordered right before the Shutdown). An idle or drain deadline goes too; a Shutdown's
        // stays (its answer is still awaited).
        let abandoned = self.stop_awaiting(sandbox);
        if self.sandboxes[sandbox].awaiting != Awaiting::Shutdown {
            self.cancel_sandbox_timer(sandbox);
        }
        for call in self.calls.by_name_order(lost) {
            self.events.push_back(Event::SandboxLost {
                call: self.calls[call].id.clone(),
                sandbox: self.sid(sandbox),
            });
        }
        self.leave_uploads(sandbox, DropReason::SandboxGone);
        let x = &self.sandboxes[sandbox];
        if x.is_managed() && !x.shutdown_ordered {
            if abandoned {
                self.order_abandon(sandbox);
            }
            self.shutdown(sandbox);
        } else {
            self.key_lets_go(key, sandbox);
        }
        self.dirty.push(sandbox);
    }

    // ------------------------------------------------------------------------------------------
    // Internals: timers

    /// Sets the sandbox's one timer `after` from now, replacing the one it had; returns its
    /// instant.
    pub(crate) fn set_sandbox_timer(&mut self, sandbox: SandboxIx, after: Duration) -> Instant {
        self.cancel_sandbox_timer(sandbox);
        let at = self.timers.set(self.now + after, Timer::Sandbox(sandbox));
        self.sandboxes.get_mut(sandbox).expect("live").deadline = Some(at);
        at.at
    }

    pub(crate) fn cancel_sandbox_timer(&mut self, sandbox: SandboxIx) {
        if let Some(x) = self.sandboxes.get_mut(sandbox) {
            if let Some(at) = x.deadline.take() {
                self.timers.cancel(at);
            }
        }
    }

    fn fire(&mut self, at: TimerRef, timer: Timer) {
        match timer {
            Timer::Sandbox(sandbox) => {
                let x = self
                    .sandboxes
                    .get_mut(sandbox)
                    .expect("timer of a live sandbox");
                debug_assert_eq!(x.deadline, Some(at));
                x.deadline = None;
                match (x.state, x.awaiting) {
                    (SandboxState::Starting, Awaiting::Start) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "start timed out");
                        self.stats.starts_timed_out += 1;
                        self.fail_start(sandbox, ErrorKind::StartTimeout);
                    }
                    (SandboxState::Idle, _) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "idle timeout");
                        self.begin_drain(sandbox);
                    }
                    (SandboxState::Draining, _) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "drain deadline");
                        self.stats.drain_deadlines += 1;
                        self.end_drain(sandbox, DropReason::DrainDeadline);
                    }
                    (_, Awaiting::Stop) | (_, Awaiting::Persist) => {
                        tracing::debug!(sandbox = %self.sid(sandbox), "stop or persist timed out");
                        self.abandon(sandbox);
                        self.shutdown(sandbox);
                    }
                    (_, Awaiting::Shutdown) => {
                        tracing::warn!(sandbox = %self.sid(sandbox), "shutdown timed out");
                        self.unconfirmed(sandbox);
                        self.shutdown_answered(sandbox);
                    }
                    (state, awaiting) => {
                        unreachable!("sandbox timer in {state:?} awaiting {awaiting:?}")
                    }
                }
            }
            Timer::Upload(upload) => self.upload_timed_out(upload),
            Timer::Retry(session, slot) => self.retry_due(session, slot),
            Timer::Wait(call) => {
                tracing::debug!(call = %self.calls[call].id, "wait timed out");
                self.end_call(call, EndHow::Failed(ErrorKind::WaitTimeout));
            }
            Timer::Close => self.close_deadline(),
        }
    }

    /// Whether the timer set as `at` is live: its owner still holds this very reference. O(1).
    pub(crate) fn timer_is_live(&self, at: TimerRef, timer: &Timer) -> bool {
        match timer {
            Timer::Sandbox(x) => self
                .sandboxes
                .get(*x)
                .is_some_and(|x| x.deadline == Some(at)),
            Timer::Upload(u) => self.uploads.get(*u).is_some_and(|u| u.deadline == at),
            Timer::Retry(session, slot) => self
                .sessions
                .get(*session)
                .is_some_and(|s| s.paths.get(*slot).is_some_and(|p| p.retry_at == Some(at))),
            Timer::Wait(call) => self.calls.get(*call).is_some_and(
                |c| matches!(c.state, CallState::Waiting { deadline } if deadline == at),
            ),
            Timer::Close => match &self.close {
                CloseState::Draining { deadline, .. } => *deadline == at,
                CloseState::Revoked { grace, .. } => *grace == at,
                CloseState::Open | CloseState::Closed => false,
            },
        }
    }

    /// Drops cancelled timers from the top of the table (and compacts it now and then), so that
    /// `poll_timeout` is a live deadline.
    fn prune_timers(&mut self) {
        let mut timers = std::mem::take(&mut self.timers);
        timers.prune(|at, timer| self.timer_is_live(at, timer));
        self.timers = timers;
    }

    // ------------------------------------------------------------------------------------------
    // Internals: bookkeeping after each input

    /// Runs the work deferred during an input: the changed sessions' bookkeeping (once each),
    /// then finished drains and forgettable sandboxes, which may change sessions again; then
    /// close progress. Every input ends here.
    pub(crate) fn finish_input(&mut self) {
        loop {
            if !self.touched.is_empty() {
                let touched = std::mem::take(&mut self.touched);
                for &session in &touched {
                    self.reconcile_session(session);
                }
                // Keep the buffer: a reconciled session touches no other session.
                debug_assert!(self.touched.is_empty());
                self.touched = touched;
                self.touched.clear();
            }
            let Some(sandbox) = self.dirty.pop() else {
                break;
            };
            let Some(x) = self.sandboxes.get(sandbox) else {
                continue;
            };
            match x.state {
                SandboxState::Draining if x.uploads.is_empty() && x.busy_sessions == 0 => {
                    tracing::debug!(sandbox = %self.sid(sandbox), "drained");
                    self.end_drain(sandbox, DropReason::DrainDeadline);
                }
                SandboxState::Dead | SandboxState::ShuttingDown
                    if x.bound.is_empty() && x.awaiting == Awaiting::Nothing =>
                {
                    debug_assert!(x.uploads.is_empty() && x.targeting.is_empty());
                    let key = x.key;
                    self.sandboxes.remove(sandbox);
                    self.key_lets_go(key, sandbox);
                }
                _ => {}
            }
        }
        self.close_progress();
        self.prune_timers();
        #[cfg(debug_assertions)]
        if self.sandboxes.len() + self.calls.len() <= 64 {
            if let Err(v) = self.check_invariants() {
                panic!("internal invariant broken: {v}");
            }
        }
    }
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndHow {
    Released,
    Failed(ErrorKind),
    Revoked,
}
