//! Calls: what the application asks for ([`CallSpec`]), the call records and their table, the
//! memory of recently ended calls, and the call inputs: acquire, binding to the key's sandbox
//! (starting one when there is none), becoming ready, and ending (released, failed, revoked).

use crate::config::{Scope, WayDown};
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::Event;
use crate::ids::{Key, SandboxId, Spec};
use crate::key::{KeyIx, Own};
use crate::lifecycle::Lifecycle;
use crate::map::Map;
use crate::name::{CallId, ExternalId, SessionId, UserId};
use crate::sandbox::{SandboxIx, SandboxState};
use crate::session::SessionIx;
use crate::small_set::Few;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef};
use serde::{Deserialize, Serialize};

slotmap::new_key_type! {
    /// A live call's place in the call table. Records refer to calls by it; a call's name is
    /// hashed once, where it comes in ([`Calls::find`]). A place is reused after its call ended,
    /// with a new generation, so a stale one never finds the wrong call.
    pub(crate) struct CallIx;
}

/// What the application asks for when it acquires a sandbox for a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    /// The call's name; unique among live calls.
    pub call: CallId,
    /// The session the call belongs to.
    pub session: SessionId,
    /// The user, required by scope `User`.
    pub user: Option<UserId>,
    /// An application-supplied sandbox to bind at once instead of a managed one.
    pub external: Option<ExternalId>,
    /// Passed through to Start.
    pub spec: Spec,
}

impl CallSpec {
    /// A call of `session` with no user, no external sandbox and an empty spec.
    pub fn new(call: CallId, session: SessionId) -> Self {
        CallSpec {
            call,
            session,
            user: None,
            external: None,
            spec: Spec::default(),
        }
    }

    /// The same, naming the user.
    pub fn with_user(mut self, user: UserId) -> Self {
        self.user = Some(user);
        self
    }

    /// The same, bound to an external sandbox.
    pub fn with_external(mut self, external: ExternalId) -> Self {
        self.external = Some(external);
        self
    }

    /// The same, with a spec for Start.
    pub fn with_spec(mut self, spec: Spec) -> Self {
        self.spec = spec;
        self
    }
}

/// Where a live call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallStatus {
    /// Queued behind its key.
    Waiting,
    /// Bound to a sandbox that is starting.
    Starting(SandboxId),
    /// Bound to a sandbox that is up: ready.
    Ready(SandboxId),
    /// Was ready; its sandbox died. Live until released.
    Lost(SandboxId),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum CallState {
    /// Queued in its key's waiters until the deadline.
    Waiting { deadline: TimerRef },
    /// Bound to a starting sandbox.
    Starting(SandboxIx),
    /// Bound to a sandbox that was up when bound (it may have died since).
    Ready(SandboxIx),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Call {
    /// Its name, as the application gave it.
    pub(crate) id: CallId,
    pub(crate) session: SessionIx,
    pub(crate) key: KeyIx,
    /// What it asks of its sandbox, until the Start it orders takes it (a call orders at most
    /// one Start; moving the spec there saves a reference count on the way in and out).
    pub(crate) spec: Option<Spec>,
    pub(crate) state: CallState,
}

impl Call {
    /// The sandbox the call is bound to, if any.
    pub(crate) fn sandbox(&self) -> Option<SandboxIx> {
        match self.state {
            CallState::Waiting { .. } => None,
            CallState::Starting(sandbox) | CallState::Ready(sandbox) => Some(sandbox),
        }
    }
}

/// The live calls: records in a generational slab, and the index from names to places.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Calls {
    records: slotmap::SlotMap<CallIx, Call>,
    by_name: Map<CallId, CallIx>,
    /// The names of the calls that ended last, for `AlreadyReleased`.
    pub(crate) ended: EndedCalls,
    /// Calls queued behind their keys, over all keys.
    pub(crate) waiting: usize,
}

impl Calls {
    /// The place of the live call named `call`. The one hash of a call's name per input.
    #[inline(always)]
    pub(crate) fn find(&self, call: &CallId) -> Option<CallIx> {
        self.by_name.get(call).copied()
    }

    /// Adds a call whose name is not live.
    #[inline(always)]
    pub(crate) fn insert(&mut self, call: Call) -> CallIx {
        let id = call.id.clone();
        let ix = self.records.insert(call);
        let was = self.by_name.insert(id, ix);
        debug_assert!(was.is_none(), "a live call's name inserted twice");
        ix
    }

    /// Removes a live call.
    #[inline(always)]
    pub(crate) fn remove(&mut self, ix: CallIx) -> Call {
        let call = self.records.remove(ix).expect("a live call");
        self.by_name.remove(&call.id);
        call
    }

    /// The live call at `ix`, if it is still live.
    pub(crate) fn get(&self, ix: CallIx) -> Option<&Call> {
        self.records.get(ix)
    }

    /// Live calls.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no call is live.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every live call, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (CallIx, &Call)> {
        self.records.iter()
    }

    /// Whether the name index and the records agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_name.len() == self.records.len()
            && self
                .by_name
                .iter()
                .all(|(name, ix)| self.records.get(*ix).is_some_and(|c| &c.id == name))
    }

    /// `calls` sorted by name: the order in which several calls reach an output.
    pub(crate) fn by_name_order(&self, mut calls: Few<CallIx>) -> Few<CallIx> {
        calls.sort_by(|a, b| self[*a].id.cmp(&self[*b].id));
        calls
    }
}

impl std::ops::Index<CallIx> for Calls {
    type Output = Call;

    fn index(&self, ix: CallIx) -> &Call {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<CallIx> for Calls {
    fn index_mut(&mut self, ix: CallIx) -> &mut Call {
        &mut self.records[ix]
    }
}

/// The names of the last [`Limits::remembered_ended_calls`](crate::Limits) call ends, so that
/// a second release says `AlreadyReleased` rather than `UnknownCall`.
///
/// Each name is kept once, with the stamp of its latest end; a name is remembered while that
/// stamp is among the last `capacity`. Names that fell out of the window are dropped in one
/// pass whenever the index reaches twice the capacity: amortised O(1) per end, at most
/// `2 × capacity` names kept, and one copy of each name.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct EndedCalls {
    index: Map<CallId, u64>,
    /// The stamp the next end gets.
    next: u64,
}

impl EndedCalls {
    /// Notes that `call` ended.
    #[inline(always)]
    pub(crate) fn remember(&mut self, call: CallId, capacity: usize) {
        if capacity == 0 {
            return;
        }
        self.index.insert(call, self.next);
        self.next += 1;
        if self.index.len() >= 2 * capacity {
            let oldest = self.next - capacity as u64;
            self.index.retain(|_, stamp| *stamp >= oldest);
        }
    }

    /// Whether `call` is among the last `capacity` ends.
    pub(crate) fn contains(&self, call: &CallId, capacity: usize) -> bool {
        self.index
            .get(call)
            .is_some_and(|stamp| stamp + capacity as u64 >= self.next)
    }
}

impl Lifecycle {
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
        self.time_passes(now);
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
        let found = self.sessions.find(&spec.session);
        if found.is_none() && self.sessions.active() >= limits.max_active_sessions {
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
        self.out.stats.calls_acquired += 1;
        let session = self.sessions.take_up(found, &session);
        let key = match slot {
            Some(slot) => slot,
            None => self.keys.insert_new(key),
        };
        let ix = self.calls.insert(Call {
            id: call,
            session,
            key,
            spec: Some(start_spec),
            state: CallState::Waiting {
                deadline: TimerRef::UNSET,
            },
        });
        self.sessions[session].coming += 1;
        if self.liveness.is_some() && !matches!(self.keys[key].own, Own::Owned(_)) {
            // Fleet: the key is not this process's yet (or no longer: its release is under
            // way, and another process may own it before this one claims it back). What the
            // application writes for the session before a call of it is ready was not made
            // after the owner's last write.
            self.sessions[session].stale |= self.is_fleet_key(&self.keys[key].key);
        }
        if must_wait {
            let at = self.now + self.config.wait_timeout;
            self.calls.waiting += 1;
            let deadline = self.timers.set(at, Timer::Wait(ix));
            self.calls[ix].state = CallState::Waiting { deadline };
            self.keys[key].waiters.push_back(ix);
            self.claim_for_waiter(key);
        } else {
            self.bind(ix);
        }
        // A call waiting or starting changes nothing a session's reconciliation derives (its
        // busyness, its releases, its settling, whether it is idle: `take_up` took it out of
        // the idle queue); a call that became ready at once retargeted its session, which
        // reconciles it.
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
        self.release_with(now, call, None)
    }

    /// Ends a call as [`release`](Self::release) does, and says how its sandbox goes down when
    /// it was the sandbox's last call: at once (no warm tier), the way `way` names, whatever
    /// the release policy says. An application's explicit pause (`WayDown::Suspend`: drain,
    /// Stop, Persist, kept for the key's next start) or kill (`WayDown::Shutdown`: drain, Stop,
    /// Shutdown; a snapshot only if the backend's Stop takes one unasked) of one sandbox,
    /// beside a policy that serves every other release.
    ///
    /// The last release decides: when other calls are still bound, `way` is noted and the
    /// sandbox goes down as the last release of a ready call says (the policy's way if that
    /// one is a plain `release`). A call released before it was ready, or that ends otherwise
    /// (failed, or revoked by close), changes nothing of what was asked.
    /// A lost instance still suspends, and a fleet's handover still goes the way it needs.
    /// Asking `Shutdown` lets the sandbox's workspace go even when it continues its key's
    /// history (it resumed or was adopted): the application's choice, as a kill is.
    ///
    /// Errors: as [`release`](Self::release).
    pub fn release_as(&mut self, now: Instant, call: &CallId, way: WayDown) -> Result<(), Error> {
        self.release_with(now, call, Some(way))
    }

    fn release_with(
        &mut self,
        now: Instant,
        call: &CallId,
        way: Option<WayDown>,
    ) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("release")?;
        let Some(ix) = self.calls.find(call) else {
            return Err(
                if self
                    .calls
                    .ended
                    .contains(call, self.config.limits.remembered_ended_calls)
                {
                    Error::AlreadyReleased { call: call.clone() }
                } else {
                    Error::UnknownCall { call: call.clone() }
                },
            );
        };
        self.advance(now);
        tracing::debug!(call = %call, way = ?way, "release");
        self.out.stats.calls_released += 1;
        self.end_call(ix, EndHow::Released(way));
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Internals: binding

    pub(crate) fn key_of(&self, spec: &CallSpec) -> Result<Key, Error> {
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

    /// Binds a call that is not queued to its key's sandbox, starting one when there is none.
    pub(crate) fn bind(&mut self, call: CallIx) {
        let key = self.calls[call].key;
        let slot = &self.keys[key];
        let sandbox = match slot.current {
            Some(current) => current,
            None => match &slot.key {
                Key::External(name) => {
                    let name = name.clone();
                    let external = self.sandboxes.bind_external(key, name.clone());
                    self.keys[key].current = Some(external);
                    tracing::debug!(sandbox = %self.sid(external), external = %name, "external sandbox bound");
                    external
                }
                _ => match self.adopt_left(key) {
                    Some(adopted) => adopted,
                    None => self.start_sandbox(call),
                },
            },
        };
        self.keys[key].bound += 1;
        let record = self.sandboxes.get_mut(sandbox).expect("current sandbox");
        record.bound.insert(call);
        match record.state() {
            SandboxState::Starting => {
                self.calls[call].state = CallState::Starting(sandbox);
            }
            SandboxState::Running | SandboxState::Idle | SandboxState::Draining => {
                if record.state() != SandboxState::Running {
                    // A warm or draining sandbox is revived for the next call of its key: no
                    // churn, the workspace stays.
                    tracing::debug!(sandbox = %record.id, state = ?record.state(), "revived");
                    record.run();
                    self.out.stats.revivals += 1;
                    self.way_down().cancel_sandbox_timer(sandbox);
                }
                self.make_ready(call, sandbox);
            }
            other => unreachable!("a key's current sandbox is never {other:?}"),
        }
    }

    /// A bound call becomes ready on an up sandbox.
    #[inline(always)]
    pub(crate) fn make_ready(&mut self, call: CallIx, sandbox: SandboxIx) {
        let c = &mut self.calls[call];
        c.state = CallState::Ready(sandbox);
        let session = c.session;
        let s = &mut self.sessions[session];
        s.coming -= 1;
        s.ready.push(call);
        s.linger = None;
        s.stale = false;
        self.out.stats.calls_ready += 1;
        let name = self.calls[call].id.clone();
        tracing::debug!(call = %name, sandbox = %self.sid(sandbox), "call ready");
        self.out.events.push_back(Event::CallReady {
            call: name,
            sandbox: self.sid(sandbox),
        });
        self.mirror().retarget(session, DropReason::NoSandbox);
    }

    // ------------------------------------------------------------------------------------------
    // Internals: ending calls

    /// Ends a live call: released by the application, failed, or revoked by close.
    pub(crate) fn end_call(&mut self, ix: CallIx, how: EndHow) {
        let c = self.calls.remove(ix);
        let call = &c.id;
        let session = c.session;
        match how {
            EndHow::Released(_) => {}
            EndHow::Failed(error) => {
                self.out.stats.calls_failed += 1;
                tracing::debug!(call = %call, error = %error, "call failed");
                self.out.events.push_back(Event::CallFailed {
                    call: call.clone(),
                    error,
                });
            }
            EndHow::Revoked => {
                self.out.stats.calls_revoked += 1;
                tracing::debug!(call = %call, "call revoked");
                self.out
                    .events
                    .push_back(Event::CallRevoked { call: call.clone() });
            }
        }
        let released = matches!(how, EndHow::Released(_));
        match c.state {
            CallState::Waiting { deadline } => {
                self.timers.cancel(deadline);
                self.calls.waiting -= 1;
                if let Some(slot) = self.keys.get_mut(c.key) {
                    slot.waiters.retain(|w| *w != ix);
                }
                self.sessions[session].coming -= 1;
                if released {
                    self.out
                        .events
                        .push_back(Event::CallReleased { call: call.clone() });
                }
            }
            CallState::Starting(sandbox) => {
                self.sessions[session].coming -= 1;
                self.unbind(ix, c.key, sandbox);
                if released {
                    self.out
                        .events
                        .push_back(Event::CallReleased { call: call.clone() });
                }
            }
            CallState::Ready(sandbox) => {
                let s = &mut self.sessions[session];
                s.ready.retain(|r| *r != ix);
                // The session's mirror lingers on this sandbox unless another of its ready calls
                // has a sandbox that is up (a call whose sandbox died does not count).
                let other_up = s.first_up(&self.calls, &self.sandboxes).is_some();
                if !other_up && self.sandboxes[sandbox].accepts_uploads() {
                    s.linger = Some(sandbox);
                }
                if released {
                    s.releasing.push((call.clone(), sandbox));
                }
                if let EndHow::Released(way) = how {
                    // The last release of a ready call decides its sandbox's way down.
                    self.sandboxes
                        .get_mut(sandbox)
                        .expect("sandbox of a bound call")
                        .asked = way;
                }
                self.unbind(ix, c.key, sandbox);
            }
        }
        // With no sandbox to go to and none coming, the session's pending versions are dropped.
        let reason = if self.is_closing() {
            DropReason::Closed
        } else {
            DropReason::NoSandbox
        };
        self.mirror().retarget(session, reason);
        self.after_unbind_key(c.key);
        self.calls
            .ended
            .remember(c.id, self.config.limits.remembered_ended_calls);
    }

    /// Takes a call off its sandbox and key.
    #[inline(always)]
    pub(crate) fn unbind(&mut self, call: CallIx, key: KeyIx, sandbox: SandboxIx) {
        let slot = &mut self.keys[key];
        slot.bound -= 1;
        let record = self
            .sandboxes
            .get_mut(sandbox)
            .expect("sandbox of a bound call");
        let was_bound = record.bound.remove(&call);
        debug_assert!(was_bound, "call {call:?} was not bound to {sandbox:?}");
        if !record.bound.is_empty() {
            return;
        }
        match record.state() {
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
            SandboxState::Dead => self.reconcile.sandbox(sandbox),
            other => unreachable!("a sandbox with calls is never {other:?}"),
        }
    }

    pub(crate) fn after_unbind_key(&mut self, key: KeyIx) {
        self.admit(key);
        self.key_settles(key);
    }
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndHow {
    /// By the application, asking its sandbox's way down or not ([`Lifecycle::release_as`]).
    Released(Option<WayDown>),
    Failed(ErrorKind),
    Revoked,
}
