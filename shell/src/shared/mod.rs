//! [`Shared`]: the core behind one lock. How inputs from many threads or tasks reach the one
//! core, how waiters learn what it decided, the close handshake, and the release of a dropped
//! call; also the pending-call and ready-call types ([`PendingCall`], [`CallTicket`]).
//!
//! # Why a mutex and not a driver task
//!
//! The core sits behind one mutex rather than behind a task fed by a channel, because a dropped
//! call must release its call *without awaiting and without being able to lose the release*:
//! with a bounded channel, `Drop` could only `try_send` and would lose the release when the
//! channel is full; with an unbounded one the queue has no limit. Under the mutex, `Drop`
//! applies `release` to the core itself, at once. Every critical section is one core input plus
//! its drain: pure, synchronous code in O(log n), never an await, never IO. Commands are handed
//! to the [`Executor`] *inside* the critical section, so the order in which the executor sees
//! them is exactly the core's order, whichever thread applied the input.
//!
//! # What the layer guarantees (checked by the loom models in `shared/models.rs`)
//!
//! - Every input goes through [`Shared`]: one at a time, each followed by the full drain.
//! - A waiter is registered in the same critical section as the input whose outcome it waits
//!   for, so the event that resolves it cannot come before it is registered (no lost wake-up).
//! - A call is released exactly once: by its ticket's `release`, by the ticket's drop, by the
//!   pending call's drop, or not at all when the core already ended it (failed, revoked). A
//!   per-acquire number makes sure a late drop never releases a newer call of the same name.
//! - After close has begun the core refuses new calls; after `Closed` nothing is executed and
//!   every waiter is woken.
//!
//! The lock, and the signals waiters wait on, come from the [`sync`](crate::sync) shim (std or
//! loom). The handle itself is a `std::sync::Arc` (loom has no `Weak`, which a driver's timer
//! needs so that it never keeps a dropped shell alive); loom does not need to see reference
//! counts to check the protocol.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, CloseReport, Event, Input, Instant, Key, Lifecycle, PathName, Payload,
    SandboxId, SessionId, Stats, Version, Violation, WayDown,
};

use crate::error::{CallEnd, KeeperError, Released};
use crate::executor::Executor;
use crate::signal::{signal, Signal, Wait};
use crate::sync::{block_on, lock, Mutex};
use crate::tally::Tally;

/// A live call, as the waiters see it.
struct CallEntry {
    /// Which acquire made it: a drop acts only on its own call, never a newer one of the same
    /// name.
    ticket: u64,
    /// The acquire's waiter, until it is told.
    ready: Option<Signal<Result<SandboxId, CallEnd>>>,
}

/// Everything under the one lock: the core and the waiters on its decisions.
struct State {
    core: Lifecycle,
    next_ticket: u64,
    calls: HashMap<CallId, CallEntry>,
    /// Released calls whose release has not completed, first released first.
    releasing: HashMap<CallId, VecDeque<Signal<Released>>>,
    /// Waiters for one session's mirror to settle.
    settled: HashMap<SessionId, Vec<Signal<()>>>,
    /// Waiters for a sandbox the core tracks to be forgotten (its way down ended).
    down: Vec<(SandboxId, Signal<()>)>,
    close_waiters: Vec<Signal<CloseReport>>,
    /// Set by the `Closed` event.
    report: Option<CloseReport>,
    /// The deadline the executor's timer was last armed for.
    armed: Option<Instant>,
    tally: Tally,
    /// Releases the core refused because the call had already ended (exactly-once evidence).
    release_refusals: u64,
    /// Commands executed after `Closed` (must stay zero).
    commands_after_closed: u64,
}

/// The core and its waiters behind one lock, plus the [`Executor`] that runs its commands: the
/// handle a driver shares between its threads or tasks (as `Arc<Shared<E>>`).
///
/// Every input method applies one core input under the lock, drains the core (commands to the
/// executor in order, events to the waiters), re-arms the timer if the deadline moved, and
/// returns. None of them blocks on the backend: what takes time is answered through a
/// [`Wait`] or a [`PendingCall`].
///
/// Method groups:
///
/// - **calls**: [`acquire`](Self::acquire) gives a [`PendingCall`], which becomes a
///   [`CallTicket`] once ready; the ticket's [`release`](CallTicket::release) (or its drop)
///   releases the call exactly once;
/// - **mirror**: [`flush`](Self::flush), [`hold`](Self::hold), [`unhold`](Self::unhold),
///   [`mirror_settled`](Self::mirror_settled);
/// - **lookup**: [`resolve`](Self::resolve);
/// - **end**: [`close`](Self::close);
/// - **backend and timer**, for the driver: [`answer`](Self::answer) (answers and deaths),
///   [`timeout`](Self::timeout), [`next_deadline`](Self::next_deadline);
/// - **getters**: [`executor`](Self::executor), [`is_closing`](Self::is_closing),
///   [`is_closed`](Self::is_closed), [`stats`](Self::stats), [`tally`](Self::tally),
///   [`release_refusals`](Self::release_refusals),
///   [`check_invariants`](Self::check_invariants), [`with_core`](Self::with_core).
pub struct Shared<E: Executor> {
    state: Mutex<State>,
    executor: E,
}

impl<E: Executor> Shared<E> {
    /// A shell around `core` that runs its commands on `executor`. Nothing is executed until
    /// the first input.
    pub fn new(core: Lifecycle, executor: E) -> Arc<Self> {
        Arc::new(Shared {
            state: Mutex::new(State {
                core,
                next_ticket: 0,
                calls: HashMap::new(),
                releasing: HashMap::new(),
                settled: HashMap::new(),
                down: Vec::new(),
                close_waiters: Vec::new(),
                report: None,
                armed: None,
                tally: Tally::default(),
                release_refusals: 0,
                commands_after_closed: 0,
            }),
            executor,
        })
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.executor
    }

    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// Applies `acquire` and registers the caller's waiter in the same critical section: the
    /// [`PendingCall`] resolves once the call is ready or ended. Dropping it releases the call.
    ///
    /// Errors: `Core(..)` when the core refuses the call (closed, duplicate name, queue full,
    /// limit, missing user); nothing changed then.
    pub fn acquire(self: &Arc<Self>, spec: CallSpec) -> Result<PendingCall<E>, KeeperError> {
        let call = spec.call.clone();
        let mut st = lock(&self.state);
        let now = self.executor.now();
        st.core.acquire(now, spec)?;
        let (ready, wait) = signal();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.calls.insert(
            call.clone(),
            CallEntry {
                ticket,
                ready: Some(ready),
            },
        );
        self.drain(&mut st);
        Ok(PendingCall {
            shared: self.clone(),
            call,
            ticket,
            wait,
            armed: true,
        })
    }

    /// Releases the call of `ticket` (asking `way` of its sandbox's way down, if given) and
    /// returns a waiter for the release's completion.
    fn release(
        self: &Arc<Self>,
        call: &CallId,
        ticket: u64,
        way: Option<WayDown>,
    ) -> Wait<Released> {
        let mut st = lock(&self.state);
        if st.calls.get(call).is_none_or(|e| e.ticket != ticket) {
            // The core already ended it: revoked by close, or close finished.
            let outcome = if st.report.is_some() {
                Released::Closed
            } else {
                Released::Revoked
            };
            return Wait::ready(outcome);
        }
        let now = self.executor.now();
        let released = match way {
            None => st.core.release(now, call),
            Some(way) => st.core.release_as(now, call, way),
        };
        if let Err(error) = released {
            tracing::debug!(call = %call, %error, "release refused");
            st.release_refusals += 1;
            st.calls.remove(call);
            return Wait::ready(Released::Closed);
        }
        st.calls.remove(call);
        let (done, wait) = signal();
        st.releasing
            .entry(call.clone())
            .or_default()
            .push_back(done);
        self.drain(&mut st);
        wait
    }

    /// Releases the call of `ticket` for a guard or an acquire future that was dropped: at once,
    /// without waiting for completion, and only if that very call is still live.
    fn release_dropped(self: &Arc<Self>, call: &CallId, ticket: u64) {
        let mut st = lock(&self.state);
        if st.calls.get(call).is_none_or(|e| e.ticket != ticket) {
            return;
        }
        st.calls.remove(call);
        let now = self.executor.now();
        match st.core.release(now, call) {
            Ok(()) => tracing::debug!(call = %call, "released on drop"),
            Err(error) => {
                tracing::debug!(call = %call, %error, "release on drop refused");
                st.release_refusals += 1;
            }
        }
        self.drain(&mut st);
    }

    /// Applies `flush`: records the next version of `path` of `session` and returns it at once,
    /// never waiting on an upload. The version settles exactly once (`Settled` events, see
    /// [`Executor::observe`] and [`tally`](Self::tally)).
    ///
    /// Errors: `Core(Closed)` after close (or during close for a session with nothing live),
    /// `Core(LimitExceeded)`.
    pub fn flush(
        self: &Arc<Self>,
        session: &SessionId,
        path: &PathName,
        payload: Payload,
    ) -> Result<Version, KeeperError> {
        let mut st = lock(&self.state);
        let now = self.executor.now();
        let version = st.core.flush(now, session, path, payload)?;
        self.drain(&mut st);
        Ok(version)
    }

    /// Applies `hold`: a background writer of `session` promises a write, and draining waits
    /// for it (bounded by the drain deadline). Errors: `Core(NoActiveSandbox)`,
    /// `Core(LimitExceeded)`, `Core(Closed)`.
    pub fn hold(self: &Arc<Self>, session: &SessionId) -> Result<(), KeeperError> {
        self.apply(|core, now| core.hold(now, session))
    }

    /// Applies `drop_snapshot`: lets go of what `key` keeps for its next start (the core orders
    /// its Discard); `false` when it keeps nothing. Errors: `Core(KeyInUse)`, `Core(Closed)`.
    pub fn drop_snapshot(self: &Arc<Self>, key: &Key) -> Result<bool, KeeperError> {
        self.apply(|core, now| core.drop_snapshot(now, key))
    }

    /// Applies `unhold`: lets one hold of `session` go. Errors: `Core(NotHeld)`, `Core(Closed)`.
    pub fn unhold(self: &Arc<Self>, session: &SessionId) -> Result<(), KeeperError> {
        self.apply(|core, now| core.unhold(now, session))
    }

    /// Applies `enter`: context-free code acting for `session` begins work in the session's
    /// sandbox, which is returned; its drain waits for the matching [`leave`](Self::leave) (up
    /// to the drain deadline). Errors: `Core(NoActiveSandbox)`, `Core(LimitExceeded)`,
    /// `Core(Closed)`.
    pub fn enter(self: &Arc<Self>, session: &SessionId) -> Result<SandboxId, KeeperError> {
        self.apply(|core, now| core.enter(now, session))
    }

    /// Applies `leave`: work entered into `sandbox` ends. Errors: `Core(NotEntered)`,
    /// `Core(UnknownSandbox)`, `Core(Closed)`.
    pub fn leave(self: &Arc<Self>, sandbox: SandboxId) -> Result<(), KeeperError> {
        self.apply(|core, now| core.leave(now, sandbox))
    }

    /// The sandbox of a live call of `session` (never another session's), for context-free
    /// code. Errors: `Core(NoActiveSandbox)`, `Core(SandboxGone)`, `Core(Closed)`.
    pub fn resolve(&self, session: &SessionId) -> Result<SandboxId, KeeperError> {
        Ok(lock(&self.state).core.resolve(session)?)
    }

    /// A waiter for every version flushed for `session` so far to settle; ready at once when
    /// they have (or close finished). Other sessions' mirrors are never waited for.
    pub fn mirror_settled(&self, session: &SessionId) -> Wait<()> {
        let mut st = lock(&self.state);
        if st.report.is_some() || st.core.is_mirror_settled(session) {
            return Wait::ready(());
        }
        let (done, wait) = signal();
        st.settled.entry(session.clone()).or_default().push(done);
        wait
    }

    /// A waiter that resolves once the core no longer tracks `sandbox`: its way down ended
    /// (shut down, suspended, left to the backend, or dead), or close finished. At once when it
    /// is not tracked now.
    pub fn sandbox_down(&self, sandbox: SandboxId) -> Wait<()> {
        let mut st = lock(&self.state);
        if st.report.is_some() || st.core.sandbox_state(sandbox).is_none() {
            return Wait::ready(());
        }
        let (done, wait) = signal();
        st.down.push((sandbox, done));
        wait
    }

    /// Begins close (once; a second call only waits) and returns a waiter for its report.
    ///
    /// The core refuses new calls at once; live calls may still flush and release, and mirror
    /// work drains, until `deadline`; then what is left is revoked, every managed sandbox is
    /// shut down, and the report comes once every shutdown answered (or the core's
    /// `close_grace` passed). The driver's timer must keep running until then.
    pub fn close(self: &Arc<Self>, deadline: Duration) -> Wait<CloseReport> {
        let mut st = lock(&self.state);
        if let Some(report) = &st.report {
            return Wait::ready(report.clone());
        }
        let (done, wait) = signal();
        st.close_waiters.push(done);
        if !st.core.is_closing() {
            let now = self.executor.now();
            if let Err(error) = st.core.close(now, deadline) {
                tracing::debug!(%error, "close refused");
            }
            self.drain(&mut st);
        }
        wait
    }

    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// Applies a backend answer (`StartOk`, `UploadFailed`, `ShutdownOk`, ...) or a death
    /// (`Died`, `InstanceGone`). Stale answers change nothing; answers after `Closed` are
    /// ignored; an input the core refuses is logged and changes nothing. No ordering with the
    /// core's timers is needed: an operation past its deadline is dropped by the executor and
    /// never answered. Never call it from inside an [`Executor`] method.
    pub fn answer(self: &Arc<Self>, input: Input) {
        let mut st = lock(&self.state);
        if st.core.is_closed() {
            return;
        }
        let now = self.executor.now();
        if let Err(error) = st.core.handle(now, input) {
            tracing::warn!(%error, "backend input refused");
        }
        self.drain(&mut st);
    }

    /// Fires the core's due timers (the driver's timer calls it once its clock reached the
    /// deadline; early or twice is harmless) and returns the next deadline. `None` also after
    /// close finished: the timer may stop then.
    pub fn timeout(self: &Arc<Self>) -> Option<Instant> {
        let mut st = lock(&self.state);
        if st.core.is_closed() {
            return None;
        }
        let now = self.executor.now();
        if let Err(error) = st.core.handle_timeout(now) {
            tracing::debug!(%error, "timeout refused");
        }
        self.drain(&mut st);
        st.core.poll_timeout()
    }

    // ------------------------------------------------------------------------------------------
    // Getters

    /// The core's next deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        lock(&self.state).core.poll_timeout()
    }

    /// Whether close has finished (the `Closed` event was routed).
    pub fn is_closed(&self) -> bool {
        lock(&self.state).report.is_some()
    }

    /// Whether close has begun.
    pub fn is_closing(&self) -> bool {
        lock(&self.state).core.is_closing()
    }

    /// Whether the live call of `ticket` lost its sandbox: the core's word
    /// (`CallStatus::Lost`), not a copy kept here.
    fn is_lost(&self, call: &CallId, ticket: u64) -> bool {
        let st = lock(&self.state);
        st.calls.get(call).is_some_and(|e| e.ticket == ticket)
            && matches!(
                st.core.call_status(call),
                Some(sandkeeper::CallStatus::Lost(_))
            )
    }

    /// The core's counters.
    pub fn stats(&self) -> Stats {
        lock(&self.state).core.stats().clone()
    }

    /// The shell's counts of the core's events (drops per reason, failures per kind, ...).
    pub fn tally(&self) -> Tally {
        lock(&self.state).tally.clone()
    }

    /// Checks the core's invariants and the shell's own (`no-command-after-closed`: no command
    /// executed after `Closed`): `Err` says which broke, by name.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        let st = lock(&self.state);
        st.core.check_invariants()?;
        if st.commands_after_closed > 0 {
            return Err(Violation {
                invariant: "no-command-after-closed",
                detail: format!(
                    "{} commands executed after Closed",
                    st.commands_after_closed
                ),
            });
        }
        Ok(())
    }

    /// Releases the core refused because the call had already ended (evidence for "every call
    /// ends exactly once"; zero in a correct shell).
    pub fn release_refusals(&self) -> u64 {
        lock(&self.state).release_refusals
    }

    /// Reads the core under the lock (for getters, tests and reports). `f` must not call back
    /// into the shell.
    pub fn with_core<R>(&self, f: impl FnOnce(&Lifecycle) -> R) -> R {
        f(&lock(&self.state).core)
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    fn apply<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Lifecycle, Instant) -> Result<R, sandkeeper::Error>,
    ) -> Result<R, KeeperError> {
        let mut st = lock(&self.state);
        let now = self.executor.now();
        let r = f(&mut st.core, now)?;
        self.drain(&mut st);
        Ok(r)
    }

    /// The drain contract: every command to the executor in order, every piece of store work
    /// to it too, every event to the observer and the waiters, then the timer.
    fn drain(self: &Arc<Self>, st: &mut State) {
        loop {
            let mut progressed = false;
            while let Some(command) = st.core.poll_command() {
                progressed = true;
                if st.report.is_some() {
                    st.commands_after_closed += 1;
                }
                self.executor.execute(self, command);
            }
            while let Some(work) = st.core.poll_store() {
                progressed = true;
                self.executor.store(self, work);
            }
            while let Some(event) = st.core.poll_event() {
                progressed = true;
                self.executor.observe(&event);
                st.route(event);
            }
            if !progressed {
                break;
            }
        }
        let mut i = 0;
        while i < st.down.len() {
            if st.core.sandbox_state(st.down[i].0).is_none() {
                st.down.swap_remove(i).1.set(());
            } else {
                i += 1;
            }
        }
        let next = st.core.poll_timeout();
        if next != st.armed {
            st.armed = next;
            self.executor.rearm(next);
        }
    }
}

impl State {
    /// Tells the waiters of one event.
    fn route(&mut self, event: Event) {
        self.tally.count(&event);
        match event {
            Event::CallReady { call, sandbox } => {
                if let Some(ready) = self.calls.get_mut(&call).and_then(|e| e.ready.take()) {
                    ready.set(Ok(sandbox));
                }
            }
            Event::CallFailed { call, error } => {
                if let Some(ready) = self.calls.remove(&call).and_then(|e| e.ready) {
                    ready.set(Err(CallEnd::Failed(error)));
                }
            }
            Event::CallRevoked { call } => {
                if let Some(ready) = self.calls.remove(&call).and_then(|e| e.ready) {
                    ready.set(Err(CallEnd::Revoked));
                }
            }
            Event::CallReleased { call } => {
                if let Some(queue) = self.releasing.get_mut(&call) {
                    if let Some(done) = queue.pop_front() {
                        done.set(Released::Completed);
                    }
                    if queue.is_empty() {
                        self.releasing.remove(&call);
                    }
                }
            }
            Event::SandboxLost { .. } | Event::KeyFenced { .. } => {}
            Event::MirrorSettled { session } => {
                for done in self.settled.remove(&session).unwrap_or_default() {
                    done.set(());
                }
            }
            Event::Closed { report } => {
                for done in self.close_waiters.drain(..) {
                    done.set(CloseReport::clone(&report));
                }
                self.report = Some(*report);
                for (_, entry) in self.calls.drain() {
                    if let Some(ready) = entry.ready {
                        ready.set(Err(CallEnd::Closed));
                    }
                }
                for (_, queue) in self.releasing.drain() {
                    for done in queue {
                        done.set(Released::Closed);
                    }
                }
                for (_, done) in self.down.drain(..) {
                    done.set(());
                }
                for (_, waiters) in self.settled.drain() {
                    for done in waiters {
                        done.set(());
                    }
                }
            }
            Event::Settled { .. }
            | Event::ShutdownUnconfirmed { .. }
            | Event::WayDownFailed { .. }
            | Event::WorkspaceLost { .. }
            | Event::HookFailed { .. } => {}
        }
    }
}

/// An acquire that the core accepted, waiting to be ready: await [`ready`](Self::ready) on an
/// async runtime, or block a plain thread with [`wait`](Self::wait). Dropping it before it
/// resolved releases the call in the core (cancellation safety: a sandbox started only for it
/// is shut down once its start answers).
#[must_use = "dropping a pending call releases it"]
pub struct PendingCall<E: Executor> {
    shared: Arc<Shared<E>>,
    call: CallId,
    ticket: u64,
    wait: Wait<Result<SandboxId, CallEnd>>,
    armed: bool,
}

impl<E: Executor> PendingCall<E> {
    /// The call.
    pub fn call(&self) -> &CallId {
        &self.call
    }

    /// Waits until the call is ready (a ticket that releases on drop) or ended without a
    /// sandbox ([`CallEnd`]).
    pub async fn ready(mut self) -> Result<CallTicket<E>, CallEnd> {
        let outcome = (&mut self.wait).await.unwrap_or(Err(CallEnd::Closed));
        // From here the ticket (or nobody, when the call ended) owns the release.
        self.armed = false;
        outcome.map(|sandbox| CallTicket {
            shared: self.shared.clone(),
            call: self.call.clone(),
            ticket: self.ticket,
            sandbox,
            done: false,
        })
    }

    /// [`ready`](Self::ready), blocking the calling thread: for embedders without an async
    /// runtime. Never call it from inside an [`Executor`] method.
    pub fn wait(self) -> Result<CallTicket<E>, CallEnd> {
        block_on(self.ready())
    }
}

impl<E: Executor> Drop for PendingCall<E> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release_dropped(&self.call, self.ticket);
        }
    }
}

impl<E: Executor> std::fmt::Debug for PendingCall<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCall")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

/// A ready call: its sandbox, and the one release it owes. Release it with
/// [`release`](Self::release) to learn when the release completed (its session's mirror work
/// for the sandbox settled); dropping it releases too, at once, without blocking and without
/// losing the release. Either way the call is released exactly once.
#[must_use = "dropping a call ticket releases the call"]
pub struct CallTicket<E: Executor> {
    shared: Arc<Shared<E>>,
    call: CallId,
    ticket: u64,
    sandbox: SandboxId,
    done: bool,
}

impl<E: Executor> CallTicket<E> {
    /// The call.
    pub fn call(&self) -> &CallId {
        &self.call
    }

    /// The sandbox it is bound to: every operation of the call goes there.
    pub fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// Whether its sandbox died while it was bound (the core said `SandboxLost`). The call
    /// stays live until released.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost(&self.call, self.ticket)
    }

    /// The keeper state the call lives in (to run the call's work in its sandbox).
    pub fn shared(&self) -> &Arc<Shared<E>> {
        &self.shared
    }

    /// Releases the call; the waiter resolves when the release completed
    /// ([`Released::Completed`]), or says that close ended the call first.
    pub fn release(mut self) -> Wait<Released> {
        self.done = true;
        self.shared.release(&self.call, self.ticket, None)
    }

    /// Releases the call as [`release`](Self::release) does, asking its sandbox's way down
    /// when it is the sandbox's last call (`Lifecycle::release_as`): `Suspend` pauses it for
    /// the key's next call, `Shutdown` lets its workspace go, whatever the release policy says.
    pub fn release_as(mut self, way: WayDown) -> Wait<Released> {
        self.done = true;
        self.shared.release(&self.call, self.ticket, Some(way))
    }
}

impl<E: Executor> Drop for CallTicket<E> {
    fn drop(&mut self) {
        if !self.done {
            self.shared.release_dropped(&self.call, self.ticket);
        }
    }
}

impl<E: Executor> std::fmt::Debug for CallTicket<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTicket")
            .field("call", &self.call)
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod models;
