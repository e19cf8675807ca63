//! The shared-state layer: how inputs from many tasks reach the one core, how waiters learn
//! what it decided, the close handshake, and the release of a dropped call.
//!
//! # Why a mutex and not a driver task
//!
//! The core sits behind one [`Mutex`] rather than behind a task fed by a channel, because a
//! dropped call guard must release its call *without awaiting and without being able to lose
//! the release*: with a bounded channel, `Drop` could only `try_send` and would lose the release
//! when the channel is full; with an unbounded one the queue has no limit. Under the mutex,
//! `Drop` applies `release` to the core itself, at once. Every critical section is one core
//! input plus its drain: pure, synchronous code in O(log n), never an await, never IO. Commands
//! are handed to the [`Executor`] *inside* the critical section, so the order in which the
//! executor sees them is exactly the core's order, whichever task applied the input.
//!
//! # What the layer guarantees (checked by the loom models in `models.rs`)
//!
//! - Every input goes through [`Shared`]: one at a time, each followed by the full drain.
//! - A waiter is registered in the same critical section as the input whose outcome it waits
//!   for, so the event that resolves it cannot come before it is registered (no lost wake-up).
//! - A call is released exactly once: by its guard's `release`, by the guard's drop, by the
//!   acquire future's drop, or not at all when the core already ended it (failed, revoked). A
//!   per-acquire ticket makes sure a late drop never releases a newer call of the same name.
//! - After close has begun the core refuses new calls; after `Closed` nothing is executed and
//!   every waiter is woken.
//!
//! The lock, and the signals waiters wait on, come from the [`sync`](crate::sync) shim (std or
//! loom). The handle itself is a `std::sync::Arc` (loom has no `Weak`, which the timer task
//! needs so that it never keeps a dropped keeper alive); loom does not need to see reference
//! counts to check the protocol.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, CloseReport, Command, Event, Input, Instant, Lifecycle, PathName, Payload,
    SandboxId, SessionId, Stats, Version, Violation,
};

use crate::error::{CallEnd, KeeperError, Released};
use crate::signal::{signal, Signal, Wait};
use std::sync::Arc;

use crate::sync::{lock, Mutex};
use crate::tally::Tally;

/// What the shared layer needs from the runtime around it: a clock, a way to start commands,
/// a place for events, and a timer to re-arm. All four are called with the core lock held, so
/// none may block, await or call back into [`Shared`].
pub(crate) trait Executor: Send + Sync + Sized + 'static {
    /// The driver's clock, as the core's instant.
    fn now(&self) -> Instant;
    /// Starts one command, in the core's order.
    fn execute(&self, shared: &Arc<Shared<Self>>, command: Command);
    /// Sees every event before it is routed to waiters.
    fn observe(&self, event: &Event);
    /// The core's earliest deadline changed.
    fn rearm(&self, deadline: Option<Instant>);
}

/// A live call, as the waiters see it.
struct CallEntry {
    /// Which acquire made it: a drop acts only on its own call, never a newer one of the same
    /// name.
    ticket: u64,
    /// The acquire's waiter, until it is told.
    ready: Option<Signal<Result<SandboxId, CallEnd>>>,
    /// Its sandbox died while it was bound.
    lost: bool,
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

/// The core and its waiters behind one lock, plus the executor that runs its commands.
pub(crate) struct Shared<E: Executor> {
    state: Mutex<State>,
    executor: E,
}

impl<E: Executor> Shared<E> {
    /// A shared layer around `core`.
    pub(crate) fn new(core: Lifecycle, executor: E) -> Arc<Self> {
        Arc::new(Shared {
            state: Mutex::new(State {
                core,
                next_ticket: 0,
                calls: HashMap::new(),
                releasing: HashMap::new(),
                settled: HashMap::new(),
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
    pub(crate) fn executor(&self) -> &E {
        &self.executor
    }

    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// Applies `acquire` and registers the caller's waiter in the same critical section.
    pub(crate) fn acquire(this: &Arc<Self>, spec: CallSpec) -> Result<PendingCall<E>, KeeperError> {
        let call = spec.call.clone();
        let mut st = lock(&this.state);
        let now = this.executor.now();
        st.core.acquire(now, spec)?;
        let (ready, wait) = signal();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.calls.insert(
            call.clone(),
            CallEntry {
                ticket,
                ready: Some(ready),
                lost: false,
            },
        );
        Self::drain(this, &mut st);
        Ok(PendingCall {
            shared: this.clone(),
            call,
            ticket,
            wait,
            armed: true,
        })
    }

    /// Releases the call of `ticket` and returns a waiter for the release's completion.
    fn release(this: &Arc<Self>, call: &CallId, ticket: u64) -> Wait<Released> {
        let mut st = lock(&this.state);
        if st.calls.get(call).is_none_or(|e| e.ticket != ticket) {
            // The core already ended it: revoked by close, or close finished.
            let outcome = if st.report.is_some() {
                Released::Closed
            } else {
                Released::Revoked
            };
            return Wait::ready(outcome);
        }
        let now = this.executor.now();
        if let Err(error) = st.core.release(now, call) {
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
        Self::drain(this, &mut st);
        wait
    }

    /// Releases the call of `ticket` for a guard or an acquire future that was dropped: at once,
    /// without waiting for completion, and only if that very call is still live.
    fn release_dropped(this: &Arc<Self>, call: &CallId, ticket: u64) {
        let mut st = lock(&this.state);
        if st.calls.get(call).is_none_or(|e| e.ticket != ticket) {
            return;
        }
        st.calls.remove(call);
        let now = this.executor.now();
        match st.core.release(now, call) {
            Ok(()) => tracing::debug!(call = %call, "released on drop"),
            Err(error) => {
                tracing::debug!(call = %call, %error, "release on drop refused");
                st.release_refusals += 1;
            }
        }
        Self::drain(this, &mut st);
    }

    /// Applies `flush`: returns the version at once, never waits on an upload.
    pub(crate) fn flush(
        this: &Arc<Self>,
        session: &SessionId,
        path: &PathName,
        payload: Payload,
    ) -> Result<Version, KeeperError> {
        let mut st = lock(&this.state);
        let now = this.executor.now();
        let version = st.core.flush(now, session, path, payload)?;
        Self::drain(this, &mut st);
        Ok(version)
    }

    /// Applies `hold`.
    pub(crate) fn hold(this: &Arc<Self>, session: &SessionId) -> Result<(), KeeperError> {
        Self::apply(this, |core, now| core.hold(now, session))
    }

    /// Applies `unhold`.
    pub(crate) fn unhold(this: &Arc<Self>, session: &SessionId) -> Result<(), KeeperError> {
        Self::apply(this, |core, now| core.unhold(now, session))
    }

    /// The sandbox of a live call of `session` (never another session's).
    pub(crate) fn resolve(&self, session: &SessionId) -> Result<SandboxId, KeeperError> {
        Ok(lock(&self.state).core.resolve(session)?)
    }

    /// A waiter for `session`'s mirror to settle; ready at once when it has.
    pub(crate) fn mirror_settled(&self, session: &SessionId) -> Wait<()> {
        let mut st = lock(&self.state);
        if st.report.is_some() || st.core.is_mirror_settled(session) {
            return Wait::ready(());
        }
        let (done, wait) = signal();
        st.settled.entry(session.clone()).or_default().push(done);
        wait
    }

    /// Begins close (once; a second call only waits) and returns a waiter for its report.
    pub(crate) fn close(this: &Arc<Self>, deadline: Duration) -> Wait<CloseReport> {
        let mut st = lock(&this.state);
        if let Some(report) = &st.report {
            return Wait::ready(report.clone());
        }
        let (done, wait) = signal();
        st.close_waiters.push(done);
        if !st.core.is_closing() {
            let now = this.executor.now();
            if let Err(error) = st.core.close(now, deadline) {
                tracing::debug!(%error, "close refused");
            }
            Self::drain(this, &mut st);
        }
        wait
    }

    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// Applies a backend answer or a death. Stale answers change nothing; answers after
    /// `Closed` are refused by the core and ignored here. No ordering with the core's timers is
    /// needed: an operation past its deadline is dropped by the executor and never answered.
    pub(crate) fn answer(this: &Arc<Self>, input: Input) {
        let mut st = lock(&this.state);
        if st.core.is_closed() {
            return;
        }
        let now = this.executor.now();
        if let Err(error) = st.core.handle(now, input) {
            tracing::warn!(%error, "backend input refused");
        }
        Self::drain(this, &mut st);
    }

    /// Fires the core's due timers; returns the next deadline.
    pub(crate) fn timeout(this: &Arc<Self>) -> Option<Instant> {
        let mut st = lock(&this.state);
        if st.core.is_closed() {
            return None;
        }
        let now = this.executor.now();
        if let Err(error) = st.core.handle_timeout(now) {
            tracing::debug!(%error, "timeout refused");
        }
        Self::drain(this, &mut st);
        st.core.poll_timeout()
    }

    // ------------------------------------------------------------------------------------------
    // Getters

    /// The core's next deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        lock(&self.state).core.poll_timeout()
    }

    /// Whether close has finished.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.state).report.is_some()
    }

    /// Whether close has begun.
    pub(crate) fn is_closing(&self) -> bool {
        lock(&self.state).core.is_closing()
    }

    /// Whether the live call of `ticket` lost its sandbox.
    fn is_lost(&self, call: &CallId, ticket: u64) -> bool {
        lock(&self.state)
            .calls
            .get(call)
            .is_some_and(|e| e.ticket == ticket && e.lost)
    }

    /// The core's counters.
    pub(crate) fn stats(&self) -> Stats {
        lock(&self.state).core.stats().clone()
    }

    /// The driver's counts of events.
    pub(crate) fn tally(&self) -> Tally {
        lock(&self.state).tally.clone()
    }

    /// The core's invariants, and the layer's own: no command after `Closed`.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let st = lock(&self.state);
        st.core
            .check_invariants()
            .map_err(|v: Violation| v.to_string())?;
        if st.commands_after_closed > 0 {
            return Err(format!(
                "{} commands executed after Closed",
                st.commands_after_closed
            ));
        }
        Ok(())
    }

    /// Releases the core refused because the call had already ended.
    pub(crate) fn release_refusals(&self) -> u64 {
        lock(&self.state).release_refusals
    }

    /// Reads the core under the lock (for tests and reports).
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&Lifecycle) -> R) -> R {
        f(&lock(&self.state).core)
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    fn apply(
        this: &Arc<Self>,
        f: impl FnOnce(&mut Lifecycle, Instant) -> Result<(), sandkeeper::Error>,
    ) -> Result<(), KeeperError> {
        let mut st = lock(&this.state);
        let now = this.executor.now();
        f(&mut st.core, now)?;
        Self::drain(this, &mut st);
        Ok(())
    }

    /// The drain contract: every command to the executor in order, every event to the
    /// observer and the waiters, then the timer.
    fn drain(this: &Arc<Self>, st: &mut State) {
        loop {
            let mut progressed = false;
            while let Some(command) = st.core.poll_command() {
                progressed = true;
                if st.report.is_some() {
                    st.commands_after_closed += 1;
                }
                this.executor.execute(this, command);
            }
            while let Some(event) = st.core.poll_event() {
                progressed = true;
                this.executor.observe(&event);
                st.route(event);
            }
            if !progressed {
                break;
            }
        }
        let next = st.core.poll_timeout();
        if next != st.armed {
            st.armed = next;
            this.executor.rearm(next);
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
            Event::SandboxLost { call, .. } => {
                if let Some(entry) = self.calls.get_mut(&call) {
                    entry.lost = true;
                }
            }
            Event::MirrorSettled { session } => {
                for done in self.settled.remove(&session).unwrap_or_default() {
                    done.set(());
                }
            }
            Event::Closed { report } => {
                for done in self.close_waiters.drain(..) {
                    done.set(report.clone());
                }
                self.report = Some(report);
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
                for (_, waiters) in self.settled.drain() {
                    for done in waiters {
                        done.set(());
                    }
                }
            }
            Event::Settled { .. } | Event::ShutdownUnconfirmed { .. } => {}
        }
    }
}

/// An acquire that the core accepted, waiting to be ready. Dropping it before it resolved
/// releases the call in the core (cancellation safety).
pub(crate) struct PendingCall<E: Executor> {
    shared: Arc<Shared<E>>,
    call: CallId,
    ticket: u64,
    wait: Wait<Result<SandboxId, CallEnd>>,
    armed: bool,
}

impl<E: Executor> PendingCall<E> {
    /// Waits until the call is ready (a ticket that releases on drop) or ended.
    pub(crate) async fn ready(mut self) -> Result<CallTicket<E>, CallEnd> {
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
}

impl<E: Executor> Drop for PendingCall<E> {
    fn drop(&mut self) {
        if self.armed {
            Shared::release_dropped(&self.shared, &self.call, self.ticket);
        }
    }
}

/// A ready call: its sandbox, and the one release it owes. Dropping it releases.
pub(crate) struct CallTicket<E: Executor> {
    shared: Arc<Shared<E>>,
    call: CallId,
    ticket: u64,
    sandbox: SandboxId,
    done: bool,
}

impl<E: Executor> CallTicket<E> {
    /// The call.
    pub(crate) fn call(&self) -> &CallId {
        &self.call
    }

    /// The sandbox it is bound to.
    pub(crate) fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// Whether its sandbox died while it was bound.
    pub(crate) fn is_lost(&self) -> bool {
        self.shared.is_lost(&self.call, self.ticket)
    }

    /// Releases the call; the waiter resolves when the release completed.
    pub(crate) fn release(mut self) -> Wait<Released> {
        self.done = true;
        Shared::release(&self.shared, &self.call, self.ticket)
    }
}

impl<E: Executor> Drop for CallTicket<E> {
    fn drop(&mut self) {
        if !self.done {
            Shared::release_dropped(&self.shared, &self.call, self.ticket);
        }
    }
}

#[cfg(all(test, loom))]
mod models;
