//! The invariants (`docs/design.md`, numbered 1–9) that can be read off the core's state,
//! checked in one pass.
//!
//! The core `debug_assert`s them after every input while it is small; the simulator calls
//! [`Lifecycle::check_invariants`] after every step, and checks the invariants about histories
//! (no command after Shutdown, versions settle once, ...) on the commands and events it drains.

use crate::call::CallState;
use crate::close::CloseState;
use crate::config::SameKey;
use crate::ids::Key;
use crate::key::Own;
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxState};
use smallvec::SmallVec;
use std::fmt;

/// A broken invariant: which one, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {} broken: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for Violation {}

macro_rules! ensure {
    ($cond:expr, $name:literal, $($detail:tt)+) => {
        if !$cond {
            return Err(Violation {
                invariant: $name,
                detail: format!($($detail)+),
            });
        }
    };
}

impl Lifecycle {
    /// Checks every state invariant in one pass over the state. O(n log n): for tests and the
    /// simulator, not for a hot path.
    ///
    /// Names: `bound-calls` (a sandbox's calls are exactly the calls bound to it, in a state
    /// that can hold calls), `key-counts` (a key's bound count, current and retiring sandboxes),
    /// `serialize` (never two live calls on one key under `Serialize`), `session-calls` (a
    /// session's ready list and coming count), `session-target` (a session's mirror goes to its
    /// own first up sandbox or its linger sandbox, and the sandbox lists it), `busy-count`,
    /// `uploads` (in flight only into sandboxes that accept uploads, one per path),
    /// `shutdown-once`, `timers` (every deadline is live in the table, nothing else is, and the
    /// table's next deadline is a live one),
    /// `key-forgotten` (a key record is kept only while it has a sandbox, a call, a waiter or a
    /// snapshot), `retention` (a key's snapshot has its retention timer exactly when the policy
    /// retains, and no starting sandbox of the key leaves it a snapshot: the start took it),
    /// `idle-count`, `closed` (nothing left after close), `call-index`, `session-index`,
    /// `key-index`, `sandbox-index` and `upload-index` (each index finds every record of its table and nothing
    /// else).
    pub fn check_invariants(&self) -> Result<(), Violation> {
        if let CloseState::Closed = self.close {
            ensure!(
                self.timers.len() == 0
                    && self.calls.is_empty()
                    && self.sandboxes.is_empty()
                    && self.uploads.is_empty()
                    && self.keys.len() == 0
                    && self.sessions.len() == 0,
                "closed",
                "state left after close: {} timers, {} calls, {} sandboxes, {} uploads, {} keys, \
                 {} session records",
                self.timers.len(),
                self.calls.len(),
                self.sandboxes.len(),
                self.uploads.len(),
                self.keys.len(),
                self.sessions.len()
            );
            return Ok(());
        }

        let mut expected_timers = 0usize;
        // Calls, seen from the calls. Counts that records keep of other records (a key's bound
        // calls, a session's coming calls) are tallied here and compared below.
        ensure!(
            self.calls.index_agrees(),
            "call-index",
            "the call name index and the call records disagree"
        );
        let mut bound_by_key = Tally::default();
        let mut coming_by_session = Tally::default();
        let mut waiting = 0usize;
        for (ix, call) in self.calls.iter() {
            let id = &call.id;
            let session = self.sessions.get(call.session);
            ensure!(
                session.is_some(),
                "session-calls",
                "call {id} has no session record"
            );
            let session = session.expect("checked");
            match call.state {
                CallState::Waiting { .. } => {
                    // Its deadline is checked against the table with the others, below.
                    waiting += 1;
                    expected_timers += 1;
                    coming_by_session.add(call.session);
                    let queued = self
                        .keys
                        .get(call.key)
                        .is_some_and(|k| k.waiters.contains(&ix));
                    ensure!(queued, "key-counts", "waiting call {id} is not queued");
                }
                CallState::Starting(x) | CallState::Ready(x) => {
                    ensure!(
                        self.sandboxes.get(x).is_some_and(|x| x.bound.contains(&ix)),
                        "bound-calls",
                        "call {id} is bound to {x:?}, which does not list it"
                    );
                    ensure!(
                        self.keys.get(call.key).is_some(),
                        "key-counts",
                        "call {id} is bound under an untracked key"
                    );
                    bound_by_key.add(call.key);
                    if matches!(call.state, CallState::Starting(_)) {
                        coming_by_session.add(call.session);
                    }
                    let ready = session.ready.contains(&ix);
                    ensure!(
                        ready == matches!(call.state, CallState::Ready(_)),
                        "session-calls",
                        "call {id} is {:?} but its session's ready list says {ready}",
                        call.state
                    );
                }
            }
        }
        bound_by_key.sort();
        coming_by_session.sort();
        ensure!(
            waiting == self.calls.waiting,
            "key-counts",
            "{} calls counted waiting, {waiting} are",
            self.calls.waiting
        );

        // Sandboxes.
        ensure!(
            self.sandboxes.index_agrees(),
            "sandbox-index",
            "the sandbox id index and the sandbox records disagree"
        );
        for (ix, x) in self.sandboxes.iter() {
            let id = &x.id;
            // With the calls' side above: the sandbox lists exactly the calls bound to it.
            for call in x.bound.iter() {
                ensure!(
                    self.calls.get(*call).and_then(|c| c.sandbox()) == Some(ix),
                    "bound-calls",
                    "sandbox {id} lists {call:?}, which is not bound to it"
                );
            }
            if !x.bound.is_empty() {
                ensure!(
                    matches!(
                        x.state,
                        SandboxState::Starting | SandboxState::Running | SandboxState::Dead
                    ),
                    "bound-calls",
                    "sandbox {id} has calls in state {:?}",
                    x.state
                );
            }
            for call in x.bound.iter() {
                let state = &self.calls[*call].state;
                let call = &self.calls[*call].id;
                let fits = match x.state {
                    SandboxState::Starting => matches!(state, CallState::Starting(_)),
                    SandboxState::Running => matches!(state, CallState::Ready(_)),
                    _ => true,
                };
                ensure!(
                    fits,
                    "bound-calls",
                    "call {call} is {state:?} on {id} which is {:?}",
                    x.state
                );
            }
            if x.shutdown_ordered {
                ensure!(
                    matches!(x.state, SandboxState::ShuttingDown | SandboxState::Dead),
                    "shutdown-once",
                    "sandbox {id} was ordered to shut down and is {:?}",
                    x.state
                );
                ensure!(x.is_managed(), "shutdown-once", "external {id} shut down");
            }
            if x.state == SandboxState::ShuttingDown {
                ensure!(
                    x.shutdown_ordered,
                    "shutdown-once",
                    "sandbox {id} shuts down unordered"
                );
            }
            let awaits_ok = match x.awaiting {
                Awaiting::Nothing => true,
                Awaiting::Start => x.state == SandboxState::Starting,
                Awaiting::Stop => x.state == SandboxState::Stopping,
                Awaiting::Persist => x.state == SandboxState::Persisting,
                Awaiting::Record => {
                    x.deadline.is_none()
                        && self.keys.get(x.key).is_some_and(|slot| {
                            matches!(slot.own, Own::Owned(_))
                                && match x.state {
                                    SandboxState::Persisted => slot.retiring == Some(ix),
                                    SandboxState::Starting => slot.current == Some(ix),
                                    _ => false,
                                }
                        })
                }
                Awaiting::Hook => match x.hook {
                    Some(h) if h.is_after() => x.state == SandboxState::Starting,
                    Some(_) => x.state == SandboxState::Stopping,
                    None => false,
                },
                Awaiting::Shutdown => x.shutdown_ordered,
            };
            ensure!(
                awaits_ok,
                "shutdown-once",
                "sandbox {id} in {:?} awaits {:?}",
                x.state,
                x.awaiting
            );
            if x.deadline.is_some() {
                expected_timers += 1;
            }
            if !x.accepts_uploads() {
                ensure!(
                    x.uploads.is_empty() && x.targeting.is_empty() && x.busy_sessions == 0,
                    "uploads",
                    "sandbox {id} in {:?} has {} uploads in flight and {} sessions targeting it",
                    x.state,
                    x.uploads.len(),
                    x.targeting.len()
                );
            }
            for upload in x.uploads.iter() {
                let up = self.uploads.get(*upload);
                ensure!(
                    up.is_some_and(|u| u.sandbox == ix),
                    "uploads",
                    "sandbox {id} lists upload {upload:?} which is not in flight into it"
                );
            }
        }

        // Keys.
        ensure!(
            self.keys.index_agrees(),
            "key-index",
            "the key index and the key slots disagree"
        );
        for (ix, slot) in self.keys.iter() {
            let key = &slot.key;
            ensure!(
                !slot.is_empty(),
                "key-forgotten",
                "key {key} is kept with nothing to remember (no sandbox, call, waiter or snapshot)"
            );
            let bound = bound_by_key.count(ix);
            ensure!(
                slot.bound as usize == bound,
                "key-counts",
                "key {key} counts {} bound calls, {bound} are bound",
                slot.bound
            );
            if self.config.same_key == SameKey::Serialize && !matches!(key, Key::External(_)) {
                ensure!(
                    bound <= 1,
                    "serialize",
                    "key {key} has {bound} live calls under Serialize"
                );
            }
            // Fleet: a key is owned only in fleet mode, and only a fleet key; its store work has
            // its one timer; its live sandboxes carry the token it is owned under.
            let fleet_key = self.is_fleet_key(key);
            ensure!(
                fleet_key || slot.own == Own::Local,
                "ownership",
                "key {key} is not a fleet key and is {:?}",
                slot.own
            );
            ensure!(
                slot.store_at.is_some()
                    == matches!(slot.own, Own::Claiming(..) | Own::Busy | Own::Releasing(..))
                    || matches!(slot.own, Own::Owned(_)),
                "ownership",
                "key {key} is {:?} with store timer {:?}",
                slot.own,
                slot.store_at
            );
            if slot.store_at.is_some() {
                expected_timers += 1;
            }
            if fleet_key
                && slot
                    .current
                    .is_some_and(|x| self.sandboxes[x].state != SandboxState::Dead)
            {
                ensure!(
                    matches!(slot.own, Own::Owned(_) | Own::Releasing(..)),
                    "ownership",
                    "key {key} has a live sandbox and is {:?}",
                    slot.own
                );
            }
            if let (Some(token), Some(x)) = (slot.token(), slot.current) {
                let x = &self.sandboxes[x];
                ensure!(
                    x.state == SandboxState::Dead || x.token == Some(token),
                    "ownership",
                    "key {key} is owned under {token} and its sandbox {} carries {:?}",
                    x.id,
                    x.token
                );
            }
            // Retention: a key keeps a snapshot for the policy's retention, on its own timer.
            let retains = self.config.release.tiers().retain.is_some();
            ensure!(
                slot.retain.is_some() == (retains && slot.snapshot.is_some()),
                "retention",
                "key {key} keeps a snapshot {:?} with retention timer {:?}",
                slot.snapshot,
                slot.retain
            );
            if slot.retain.is_some() {
                expected_timers += 1;
            }
            ensure!(
                slot.snapshot.is_none() || slot.current.is_none() || {
                    // A key's snapshot waits for its next start; a current sandbox that is
                    // starting has taken it.
                    !matches!(
                        self.sandboxes
                            .get(slot.current.expect("checked"))
                            .map(|x| x.state),
                        Some(SandboxState::Starting)
                    )
                },
                "retention",
                "key {key} keeps a snapshot while its sandbox starts (the start takes it)"
            );
            if let Some(x) = slot.current {
                let state = self.sandboxes.get(x).map(|x| x.state);
                ensure!(
                    matches!(
                        state,
                        Some(
                            SandboxState::Starting
                                | SandboxState::Running
                                | SandboxState::Idle
                                | SandboxState::Draining
                                | SandboxState::HandingOver
                        )
                    ) || (state == Some(SandboxState::Dead)
                        && self.sandboxes[x].shutdown_ordered
                        && slot.own != Own::Local),
                    "key-counts",
                    "key {key}'s current sandbox {x:?} is {state:?}"
                );
            }
            if let Some(x) = slot.retiring {
                let state = self.sandboxes.get(x).map(|x| x.state);
                ensure!(
                    matches!(
                        state,
                        Some(
                            SandboxState::Stopping
                                | SandboxState::Persisting
                                | SandboxState::Persisted
                        )
                    ) || (state == Some(SandboxState::Running) && self.sandboxes[x].instance_lost),
                    "key-counts",
                    "key {key}'s retiring sandbox {x:?} is {state:?}"
                );
            }
            for w in &slot.waiters {
                ensure!(
                    matches!(
                        self.calls.get(*w).map(|c| &c.state),
                        Some(CallState::Waiting { .. })
                    ),
                    "key-counts",
                    "key {key} queues {w:?}, which is not waiting"
                );
            }
        }

        // Sessions and the mirror.
        let mut idle = 0usize;
        let mut uploads_seen = 0usize;
        ensure!(
            self.sessions.index_agrees(),
            "session-index",
            "the session name index and the session records disagree"
        );
        let mut busy_by_sandbox = Tally::default();
        for (ix, s) in self.sessions.iter() {
            let id = &s.id;
            let coming = coming_by_session.count(ix);
            ensure!(
                s.coming as usize == coming,
                "session-calls",
                "session {id} counts {} coming calls, {coming} are waiting or starting",
                s.coming
            );
            for call in &s.ready {
                ensure!(
                    self.calls
                        .get(*call)
                        .is_some_and(|c| c.session == ix && matches!(c.state, CallState::Ready(_))),
                    "session-calls",
                    "session {id} lists {call:?} as ready"
                );
            }
            let first_up = s
                .ready
                .iter()
                .filter_map(|c| self.calls[*c].sandbox())
                .find(|x| self.sandboxes[*x].accepts_uploads());
            let expected = first_up.or(s
                .linger
                .filter(|x| self.sandboxes.get(*x).is_some_and(|x| x.accepts_uploads())));
            ensure!(
                s.target == expected,
                "session-target",
                "session {id} targets {:?}, expected {expected:?}",
                s.target
            );
            if let Some(t) = s.target {
                ensure!(
                    self.sandboxes[t].targeting.contains(&ix),
                    "session-target",
                    "sandbox {t:?} does not list session {id} that targets it"
                );
            }
            let busy_on = if s.is_busy() { s.target } else { None };
            ensure!(
                s.busy_on == busy_on,
                "busy-count",
                "session {id} is busy on {:?}, expected {busy_on:?}",
                s.busy_on
            );
            if let Some(b) = busy_on {
                ensure!(
                    self.sandboxes.get(b).is_some(),
                    "busy-count",
                    "session {id} is busy on untracked {b:?}"
                );
                busy_by_sandbox.add(b);
            }
            for slot in s.paths.iter() {
                if let Some(u) = slot.inflight {
                    uploads_seen += 1;
                    let up = self.uploads.get(u);
                    ensure!(
                        up.is_some_and(|up| up.session == ix && s.paths[up.slot].path == slot.path),
                        "uploads",
                        "session {id} path {} has upload {u:?} in flight that is not its own",
                        slot.path
                    );
                    let up = up.expect("checked");
                    ensure!(
                        up.version.0 <= slot.last
                            && slot.pending.as_ref().is_none_or(|(v, _)| *v > up.version),
                        "uploads",
                        "session {id} path {}: in flight {} out of order",
                        slot.path,
                        up.version
                    );
                    expected_timers += 1;
                }
                if slot.retry_at.is_some() {
                    expected_timers += 1;
                    ensure!(
                        slot.pending.is_some(),
                        "timers",
                        "session {id} path {} has a retry without a version",
                        slot.path
                    );
                }
            }
            if s.idle_stamp.is_some() {
                idle += 1;
                ensure!(
                    s.is_idle(),
                    "idle-count",
                    "session {id} counted idle while live"
                );
            }
        }
        ensure!(
            uploads_seen == self.uploads.len(),
            "uploads",
            "{} uploads in flight, {uploads_seen} referenced by sessions",
            self.uploads.len()
        );
        busy_by_sandbox.sort();
        for (ix, x) in self.sandboxes.iter() {
            let id = &x.id;
            let busy = busy_by_sandbox.count(ix);
            ensure!(
                x.busy_sessions as usize == busy,
                "busy-count",
                "sandbox {id} counts {} busy sessions, {busy} are busy on it",
                x.busy_sessions
            );
            for s in x.targeting.iter() {
                ensure!(
                    self.sessions.get(*s).is_some_and(|r| r.target == Some(ix)),
                    "session-target",
                    "sandbox {id} lists session {s:?} which targets elsewhere"
                );
            }
        }
        ensure!(
            idle == self.sessions.idle.count,
            "idle-count",
            "{} sessions counted idle, {idle} are",
            self.sessions.idle.count
        );
        ensure!(
            self.uploads.index_agrees(),
            "upload-index",
            "the upload id index and the upload records disagree"
        );
        for (ix, up) in self.uploads.iter() {
            let u = &up.id;
            ensure!(
                self.sandboxes
                    .get(up.sandbox)
                    .is_some_and(|x| x.accepts_uploads() && x.uploads.contains(&ix)),
                "uploads",
                "upload {u} in flight into {:?} which does not accept uploads",
                up.sandbox
            );
        }

        if matches!(
            self.close,
            CloseState::Draining { .. } | CloseState::Revoked { .. }
        ) {
            expected_timers += 1;
        }
        if let Some(live) = &self.liveness {
            // Fleet: the renewal timer is always set while open; the lapse timer exactly while
            // the lease is valid, at its end.
            ensure!(
                live.renew.is_some() && live.lapse.map(|at| at.at) == live.valid_until,
                "lease",
                "renewal timer {:?}, lapse timer {:?}, valid until {:?}",
                live.renew,
                live.lapse,
                live.valid_until
            );
            expected_timers +=
                usize::from(live.renew.is_some()) + usize::from(live.lapse.is_some());
        }
        // Every deadline a record keeps is in the table: each live entry of the table is one
        // record's deadline (its owner keeps that very entry, and entries are told apart by
        // their sequence number, checked distinct), so as many live entries as deadlines known
        // means every deadline has its entry.
        let mut live = Tally::default();
        for (at, timer) in self.timers.iter() {
            if self.timer_is_live(at, timer) {
                live.add(at);
            }
        }
        live.sort();
        ensure!(
            expected_timers == live.len(),
            "timers",
            "{} live timers in the table, {expected_timers} deadlines known",
            live.len()
        );
        ensure!(
            live.distinct(),
            "timers",
            "a deadline is in the table twice"
        );
        if let Some(next) = self.timers.next() {
            // The tally is sorted by deadline: its first entry is the earliest live one.
            let earliest_live = live.first().map(|at| at.at);
            ensure!(
                earliest_live == Some(next),
                "timers",
                "the next deadline {next:?} is not the earliest live one {earliest_live:?}"
            );
        }
        Ok(())
    }
}

/// Records counted by what they name (a key, a session, a sandbox), for the checks that compare
/// a count a record keeps with the records that make it up: a sorted list, inline while short,
/// so that checking a small state allocates nothing. Add every record, sort once, then count.
struct Tally<K>(SmallVec<[K; 16]>);

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally(SmallVec::new())
    }
}

impl<K: Ord + Copy> Tally<K> {
    fn add(&mut self, k: K) {
        self.0.push(k);
    }

    fn sort(&mut self) {
        self.0.sort_unstable();
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// How many times `k` was added (after [`sort`](Self::sort)).
    fn count(&self, k: K) -> usize {
        let from = self.0.partition_point(|x| *x < k);
        self.0[from..].partition_point(|x| *x == k)
    }

    /// The least added (after [`sort`](Self::sort)).
    fn first(&self) -> Option<&K> {
        self.0.first()
    }

    /// Whether nothing was added twice (after [`sort`](Self::sort)).
    fn distinct(&self) -> bool {
        self.0.windows(2).all(|w| w[0] != w[1])
    }
}
