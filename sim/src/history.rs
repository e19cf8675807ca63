//! History invariants (docs/design.md, 1–9), checked from outside the core over what it
//! was given (inputs) and what it said (commands, events), plus what its getters answer. Each
//! check has a name; the first broken one is kept as the run's [`Failure`].
//!
//! The rules themselves are `sandkeeper_check`'s, one checker per concern (a sandbox's lane, a
//! path's versions, deadlines, the stream's shape, calls, uploads in flight, the mirror, what
//! holds a queued call back): the core's scripted tests, io-tokio's `FaultBackend` and the
//! agreement test judge by the same.
//! The history keeps the simulator's record of each sandbox, feeds every checker what it needs,
//! and adds the checks that need the whole world: intent across a key's sandboxes
//! (`resume-latest-snapshot`, `start-after-persist`, `suspension-keeps-workspace`),
//! `drain-before-stop`, `persist-after-stop` on the Stop's answer, `drain-waits-for-holds`,
//! the counters, and the coverage marks.

use sandkeeper::{
    CallId, Command, Config, DiscardReason, ErrorKind, Event, ExternalId, HookPoint, Hooks,
    Instant, Key, Lifecycle, PathName, ReleasePolicy, SandboxId, SessionId, SessionList,
    Settlement, Snapshot, UploadId, UserId, WayDown,
};

use sandkeeper_check::{
    CallChecker, Conservation, Deadlines, Lane, MirrorChecker, Op, OutputChecker, Phase, Progress,
    Snapshots, UploadChecker, Versions, Work,
};

use crate::by_sandbox::BySandbox;
use crate::failure::Failure;
use crate::fastmap::FastMap;
use crate::marks::{Mark, Marks};
use crate::touched::Touched;

/// What the history knows of one sandbox.
#[derive(Clone, Debug, Default)]
pub struct SandboxRecord {
    /// Its lane: the order of its backend-facing commands (started, external, stopped,
    /// persisted, shut down) and whether the core was told it died (a `die`, a lost instance
    /// that counts as one, an awaited upload answered `gone`). See `sandkeeper_check::Lane`.
    pub lane: Lane,
    /// A Drain was ordered and no call revived it since.
    pub draining: bool,
    /// A Stop answer was accepted while the Stop was outstanding.
    pub stop_ok: bool,
    /// Its last Stop was answered failed: the core may order it again (up to
    /// `WAY_DOWN_ATTEMPTS`), without a new Drain.
    pub stop_failed: bool,
    /// Its Stops answered failed, then (afresh after a Stop succeeded) its Persists.
    pub way_down_failures: u8,
    /// The snapshot its Start resumed from.
    pub resume_from: Option<Snapshot>,
    /// The first call bound to it, to name it as `@call`.
    pub call: Option<CallId>,
    /// Its isolation key (managed sandboxes).
    pub key: Option<Key>,
    /// When its last Drain was ordered (ms).
    pub drain_at: u64,
    /// The sessions its last Drain named.
    pub drain_sessions: SessionList,
    /// The snapshot its Stop answer carried.
    pub snapshot: Option<Snapshot>,
    /// Its Persist was answered ok while awaited.
    pub persist_ok: bool,
    /// Its hook outstanding: which, and its deadline (ms).
    pub hook: Option<(HookPoint, u64)>,
    /// Its after-start or after-resume hook answered ok.
    pub hook_passed: bool,
    /// A before-suspend or before-stop hook was ordered for it.
    pub before_hook: bool,
    /// Its Stop said it is being suspended.
    pub stop_suspend: bool,
    /// Its running instance was lost while it was up and awaited nothing: it keeps its
    /// workspace and goes down as a suspension, without a drain or a before-hook.
    pub instance_lost: bool,
    /// The deadline (ms) of its Stop or Persist outstanding, if one is.
    pub way_down_due: Option<u64>,
    /// The way down its last released ready call asked (`release_as`); `None`: the policy's.
    pub asked: Option<WayDown>,
}

/// The flags of a sandbox record, copied out for a check.
#[derive(Clone, Copy, Default)]
struct Flags {
    lane: Lane,
    draining: bool,
    stop_ok: bool,
    stop_failed: bool,
    drain_at: u64,
}

impl Flags {
    fn of(s: &SandboxRecord) -> Flags {
        Flags {
            lane: s.lane,
            draining: s.draining,
            stop_ok: s.stop_ok,
            stop_failed: s.stop_failed,
            drain_at: s.drain_at,
        }
    }
}

/// A Start that resumes a snapshot, until its sandbox is up (or its start failed).
#[derive(Clone, Debug)]
struct Resuming {
    sandbox: SandboxId,
    /// When it fails if not up (ms): the Start's deadline, then its after-resume hook's;
    /// `u64::MAX` answered and awaiting its hook; 0 failed in this input.
    due: u64,
    key: Key,
    snapshot: Snapshot,
    /// The sandbox that persisted `snapshot`.
    by: SandboxId,
}

/// The history of one run and its checks.
#[derive(Debug)]
pub struct History {
    release: ReleasePolicy,
    hooks: Hooks,
    /// Every sandbox ever named.
    pub sandboxes: BySandbox<SandboxRecord>,
    /// The calls (`sandkeeper_check::CallChecker`): live calls in the order they were acquired, and
    /// the checks of call events and of what the core answers about them.
    pub calls: CallChecker,
    /// What the current input touched (see `touched.rs`).
    pub touched: Touched,
    /// Inputs checked so far (for the cadence of the full getter checks).
    inputs: u64,
    /// The getter checks ask the core about every live call every this many inputs (1: every
    /// input), else only about those the input touched.
    pub full_every: u64,
    /// The sandbox each call (live or ended) was bound to, for `@call`.
    pub bound_to: FastMap<CallId, SandboxId>,
    /// How each ended-without-ready call failed (`CallFailed`, or a rejected acquire).
    pub failed: FastMap<CallId, ErrorKind>,
    /// Per path, its versions (numbering, settlement) and its upload in flight.
    paths: Versions,
    /// Uploads in flight (`sandkeeper_check::UploadChecker`).
    uploads: UploadChecker,
    /// Where and when versions are written (`sandkeeper_check::MirrorChecker`).
    mirror: MirrorChecker,
    /// Sandboxes stopped in this input before their drain deadline.
    stopped_now: Vec<SandboxId>,
    /// The time-bound checks (`sandkeeper_check::Deadlines`).
    pub bounds: Deadlines,
    /// The shape of the output stream (`sandkeeper_check::OutputChecker`): nothing after Closed, an
    /// Abandon followed at once by its Shutdown.
    outputs: OutputChecker,
    /// What holds back each key with a queued call (`sandkeeper_check::Progress`).
    progress: Progress,
    /// A sandbox whose lost instance this input reported while it was being suspended: the
    /// core must neither abandon nor shut it down for that.
    spared: Option<SandboxId>,
    /// Per key, the sandbox stopping or persisting (its snapshot is not in yet).
    retiring: FastMap<Key, SandboxId>,
    /// Per key, the latest snapshot persisted.
    /// Sandboxes a later Start said it continues (`resumes`), most recent last, at most 16: a
    /// random world reports late losses of them.
    pub resumed: Vec<SandboxId>,
    /// The snapshots the core ordered discarded because their key let go of them (not `taken`:
    /// what a start left of one); for scenario expectations.
    pub discarded: std::collections::BTreeSet<String>,
    /// Per key, the snapshot it keeps for its next start, and when the core must let it go
    /// (`sandkeeper_check::Snapshots`).
    snapshots: Snapshots,
    /// Per session, the sandbox of its last released ready call (cleared when a call of it
    /// becomes ready).
    last_released: FastMap<SessionId, SandboxId>,
    drain_deadline_ms: u64,
    /// Close was accepted.
    pub closing: bool,
    /// Each key's acknowledged work and the workspaces that hold it
    /// (`sandkeeper_check::Conservation`).
    pub conservation: Conservation,
    /// Operations acknowledged so far (each one's number).
    operations_done: u64,
    /// Starts that resume a snapshot, until their sandbox is up: a failed or timed-out one
    /// gives the snapshot back to its key.
    starting_resumed: Vec<Resuming>,
    /// Virtual time of the current input (ms).
    pub now_ms: u64,
    starts: u64,
    shutdowns: u64,
    uploads_ordered: u64,
    flushes: u64,
    acquires: u64,
    releases: u64,
    /// Holds the application took, per session (for the drain-waits-for-hold mark).
    pub holds: FastMap<SessionId, u32>,
    /// Work entered into each sandbox and not yet left (`drain-waits-for-work`).
    pub entered: BySandbox<u32>,
    /// The first broken invariant.
    pub failure: Option<Failure>,
    /// The current step, for failures.
    pub step: usize,
    /// Marks reached.
    pub marks: Marks,
    /// Every settlement seen, when kept (scenarios): (session, path, version) → outcome.
    pub settlements: Option<FastMap<(SessionId, PathName, u64), Settlement>>,
}

/// The core's counters of [`COUNTERS`], in that order.
pub(crate) fn core_counts(stats: &sandkeeper::Stats) -> [u64; 6] {
    [
        stats.starts_ordered,
        stats.shutdowns_ordered,
        stats.uploads_ordered,
        stats.versions_flushed,
        stats.calls_acquired,
        stats.calls_released,
    ]
}

/// Whether the core was told `x` died or lost its running instance (either way its calls are
/// lost and nothing more goes into it).
fn dead(sandboxes: &BySandbox<SandboxRecord>, x: SandboxId) -> bool {
    sandboxes
        .get(&x)
        .is_some_and(|s| s.lane.is_dead() || s.instance_lost)
}

macro_rules! check {
    ($self:ident, $cond:expr, $name:literal, $($arg:tt)+) => {
        if !$cond {
            $self.fail($name, format!($($arg)+));
        }
    };
}

/// The core's counters the history (and each fleet process, `fleet/process.rs`) counts too, as
/// `Stats` names them; [`core_counts`] reads them in this order.
pub(crate) const COUNTERS: [&str; 6] = [
    "starts_ordered",
    "shutdowns_ordered",
    "uploads_ordered",
    "versions_flushed",
    "calls_acquired",
    "calls_released",
];

impl History {
    /// An empty history for a core with this configuration.
    pub fn new(config: &Config, keep_settlements: bool) -> Self {
        History {
            release: config.release,
            hooks: config.hooks,
            sandboxes: BySandbox::default(),
            calls: CallChecker::new(config),
            touched: Touched::default(),
            inputs: 0,
            full_every: 1,
            // Sized for a seed's calls, so they do not grow in steps from empty.
            bound_to: FastMap::with_capacity_and_hasher(64, Default::default()),
            failed: FastMap::with_capacity_and_hasher(64, Default::default()),
            paths: Versions::new(),
            uploads: UploadChecker::new(),
            mirror: MirrorChecker::new(),
            retiring: FastMap::default(),
            snapshots: Snapshots::new(config.release.tiers().retain),
            resumed: Vec::new(),
            discarded: Default::default(),
            last_released: FastMap::default(),
            drain_deadline_ms: config.drain_deadline.as_millis() as u64,
            closing: false,
            conservation: Conservation::new(),
            operations_done: 0,
            starting_resumed: Vec::new(),
            now_ms: 0,
            stopped_now: Vec::new(),
            bounds: Deadlines::new(config),
            outputs: OutputChecker::new(),
            progress: Progress::new(config),
            spared: None,
            starts: 0,
            shutdowns: 0,
            uploads_ordered: 0,
            flushes: 0,
            acquires: 0,
            releases: 0,
            holds: FastMap::default(),
            entered: BySandbox::default(),
            failure: None,
            step: 0,
            marks: Marks::default(),
            settlements: keep_settlements.then(FastMap::default),
        }
    }

    /// Whether `Closed` was seen.
    pub fn closed(&self) -> bool {
        self.outputs.is_closed()
    }

    /// Records a broken invariant (the first one wins).
    pub fn fail(&mut self, invariant: &str, detail: String) {
        if self.failure.is_none() {
            self.failure = Some(Failure {
                invariant: invariant.to_string(),
                step: self.step,
                detail,
            });
        }
    }

    fn sbx(&mut self, x: SandboxId) -> &mut SandboxRecord {
        self.sandboxes.entry(x)
    }

    /// Whether `x` goes down suspended: the way its last release asked, else the policy's.
    fn wants_suspend(&self, x: SandboxId) -> bool {
        suspends_as(self.sandboxes.get(&x).and_then(|s| s.asked), self.release)
    }

    // ------------------------------------------------------------------------------------------
    // Inputs the core accepted

    /// `acquire` returned `Ok`.
    pub fn acquired(
        &mut self,
        call: &CallId,
        session: &SessionId,
        user: Option<&UserId>,
        external: Option<&ExternalId>,
    ) {
        self.acquires += 1;
        if let Err(v) = self.calls.acquired(call, session, user, external) {
            self.fail(v.check, v.detail);
        }
        self.bound_to.remove(call);
        self.failed.remove(call);
        self.bounds
            .acquired(call, Instant::from_millis(self.now_ms));
        self.touched.call(call);
        self.touched.session(session);
    }

    /// `acquire` was rejected.
    pub fn acquire_rejected(&mut self, call: &CallId, kind: ErrorKind, was_live: bool) {
        if !was_live {
            self.failed.insert(call.clone(), kind);
        }
        if kind == ErrorKind::QueueFull {
            self.marks.hit(Mark::QueueFull);
        }
        if kind == ErrorKind::DuplicateCall {
            self.marks.hit(Mark::DuplicateCall);
        }
        if let Err(v) = self.calls.acquire_rejected(call, kind) {
            self.fail(v.check, v.detail);
        }
    }

    /// The keys that keep a snapshot now, in key order.
    pub fn keys_keeping_snapshots(&self) -> impl Iterator<Item = &Key> {
        self.snapshots.keys()
    }

    /// `drop_snapshot` of `key` returned `Ok`: a `dropped` Discard of what it keeps may follow
    /// in this input, and must, if it keeps anything.
    pub fn snapshot_dropped(&mut self, key: &Key) {
        self.marks.hit(Mark::SnapshotDropped);
        self.snapshots.dropping(key);
    }

    /// `release` (`way`: `None`) or `release_as` returned `Ok`.
    pub fn released(&mut self, call: &CallId, way: Option<WayDown>) {
        self.releases += 1;
        let c = match self.calls.released(call) {
            Ok(c) => c,
            Err(v) => return self.fail(v.check, v.detail),
        };
        if c.phase == Phase::Pending {
            self.marks.hit(Mark::CancelBeforeReady);
        }
        self.bounds.call_settled(call);
        self.touched.session(&c.session);
        if let Some(x) = c.sandbox {
            self.touched.sandbox(x);
        }
        if let (Phase::Ready, Some(x)) = (c.phase, c.sandbox) {
            // The last release decides the way down (a call never ready asks nothing).
            self.sbx(x).asked = way;
            self.conservation.asked(x, way);
            if way.is_some() {
                self.marks.hit(Mark::ReleaseAsked);
            }
            if !dead(&self.sandboxes, x) {
                self.mirror.released_up(&c.session);
                // The mirror lingers on the released sandbox unless another call of the
                // session has an up sandbox (then the mirror goes there).
                if !self.has_up_call(&c.session) {
                    self.last_released.insert(c.session.clone(), x);
                }
            }
        }
    }

    /// `release` was rejected.
    pub fn release_rejected(&mut self, call: &CallId, kind: ErrorKind) {
        if kind == ErrorKind::AlreadyReleased {
            self.marks.hit(Mark::AlreadyReleased);
        }
        if let Err(v) = self.calls.release_rejected(call, kind, self.closed()) {
            self.fail(v.check, v.detail);
        }
    }

    /// `flush` returned `Ok(version)`.
    pub fn flushed(&mut self, session: &SessionId, path: &PathName, version: u64) {
        self.flushes += 1;
        self.touched.session(session);
        if let Err(v) = self.paths.flushed(session, path, version) {
            self.fail(v.check, v.detail);
        }
        let in_flight = self.uploads.in_flight(session, path);
        let (calls, sandboxes) = (&self.calls, &self.sandboxes);
        let up = || calls.has_up_call(session, |x| dead(sandboxes, x));
        self.mirror.flushed(session, path, version, in_flight, up);
    }

    /// Whether the session has a live call ready on a sandbox not reported dead.
    fn has_up_call(&self, session: &SessionId) -> bool {
        self.calls
            .has_up_call(session, |x| dead(&self.sandboxes, x))
    }

    /// A Stop was answered `ok` (before the core saw it).
    pub fn stop_answered(&mut self, x: SandboxId, snapshot: Option<&Snapshot>) {
        let s = self.sbx(x);
        let l = s.lane;
        if l.is_stopped()
            && !l.is_dead()
            && !l.is_shut_down()
            && !l.is_left()
            && !s.stop_ok
            && !l.is_persisted()
        {
            s.stop_ok = true;
            s.way_down_due = None;
            s.way_down_failures = 0;
            s.snapshot = snapshot.cloned();
            self.conservation.stopped(x, snapshot);
        }
    }

    /// Before the outputs of an input are seen: a Stop or Persist of a retiring sandbox whose
    /// deadline passed was given up by the core in this input. One that keeps the workspace
    /// (a Persist with the Stop's snapshot: salvaged, as at its last failure) lets its key
    /// go without a Shutdown, so its key's Start may come in the same input, before the
    /// `WayDownFailed` that says so.
    pub fn way_down_timeouts(&mut self) {
        let now = self.now_ms;
        let due: Vec<SandboxId> = self
            .retiring
            .values()
            .copied()
            .filter(|x| {
                self.sandboxes
                    .get(x)
                    .and_then(|s| s.way_down_due)
                    .is_some_and(|d| d <= now)
            })
            .collect();
        for x in due {
            let s = self.sbx(x);
            s.way_down_due = None;
            let l = s.lane;
            let persisting =
                l.is_persisted() && !l.is_dead() && !l.is_shut_down() && s.stop_ok && !s.persist_ok;
            if let (true, Some(key), Some(snapshot)) =
                (persisting, s.key.clone(), s.snapshot.clone())
            {
                self.snapshots
                    .persisted(&key, snapshot, x, Instant::from_millis(now));
                self.conservation.persisted(x);
            }
            self.lets_go(x);
        }
    }

    /// A Start was answered (before the core saw it): one that resumed a snapshot and failed
    /// while awaited gives the snapshot back to its key in this input.
    pub fn start_answered(&mut self, x: SandboxId, ok: bool) {
        let now = self.now_ms;
        // Only a Start still awaited (not timed out, not answered: a duplicate answer of a
        // Start that came up is stale) counts.
        let awaited = self
            .sandboxes
            .get(&x)
            .is_some_and(|s| s.hook.is_none() && !s.hook_passed);
        if let Some(i) = self.starting_resumed.iter().position(|s| s.sandbox == x) {
            if self.starting_resumed[i].due <= now
                || self.starting_resumed[i].due == u64::MAX
                || !awaited
            {
                return;
            }
            if !ok {
                self.starting_resumed[i].due = 0;
            } else if self.hooks.after_resume.is_some() {
                // Up once its after-resume hook passed (ordered next, if it has calls).
                self.starting_resumed[i].due = u64::MAX;
            } else {
                self.starting_resumed.remove(i);
            }
        }
    }

    /// Before the outputs of an input are seen: a resumed Start that failed or timed out in
    /// it (not died) gave its key's snapshot back (`give_back_snapshot` in the core); the key
    /// may start again from it in the same input, before the `WayDownFailed` that says so.
    pub fn start_give_backs(&mut self) {
        let now = self.now_ms;
        if self.starting_resumed.iter().all(|s| s.due > now) {
            return;
        }
        let mut i = 0;
        while i < self.starting_resumed.len() {
            if self.starting_resumed[i].due > now {
                i += 1;
                continue;
            }
            let Resuming {
                sandbox: x,
                key,
                snapshot,
                by,
                ..
            } = self.starting_resumed.remove(i);
            self.snapshots
                .persisted(&key, snapshot.clone(), by, Instant::from_millis(now));
            self.conservation.given_back(x, &snapshot);
            self.lets_go(x);
        }
    }

    /// A Stop was answered failed (before the core saw it): the core may order it again.
    pub fn stop_failed_answered(&mut self, x: SandboxId) {
        let s = self.sbx(x);
        let l = s.lane;
        if l.is_stopped() && !l.is_dead() && !l.is_shut_down() && !s.stop_ok {
            s.stop_failed = true;
            s.way_down_due = None;
            self.way_down_failed(x);
        }
    }

    /// A Persist was answered failed (before the core saw it): the core may order it again.
    pub fn persist_failed_answered(&mut self, x: SandboxId) {
        let s = self.sbx(x);
        let l = s.lane;
        let awaited =
            l.is_persisted() && !l.is_dead() && !l.is_shut_down() && s.stop_ok && !s.persist_ok;
        if awaited {
            self.sbx(x).way_down_due = None;
        }
        if awaited && self.way_down_failed(x) {
            // The last attempt: the key keeps the snapshot the Stop took (salvaged), as if it
            // had been persisted, in this input (before its commands are seen).
            let now = Instant::from_millis(self.now_ms);
            let s = self.sbx(x);
            if let (Some(key), Some(snapshot)) = (s.key.clone(), s.snapshot.clone()) {
                self.snapshots.persisted(&key, snapshot, x, now);
                self.conservation.persisted(x);
            }
        }
    }

    /// Counts a failed Stop or Persist: once `WAY_DOWN_ATTEMPTS` failed, the core's way down
    /// ends in this input (a Shutdown, or the sandbox left as it was), and the key no longer
    /// waits for it (its Start may come before the event that says so).
    /// Whether it was the last attempt.
    fn way_down_failed(&mut self, x: SandboxId) -> bool {
        let s = self.sbx(x);
        s.way_down_failures += 1;
        let last = s.way_down_failures >= sandkeeper::WAY_DOWN_ATTEMPTS;
        if last {
            self.lets_go(x);
        }
        last
    }

    /// A Persist was answered `ok` (before the core saw it).
    pub fn persist_answered(&mut self, x: SandboxId) {
        let policy = self.wants_suspend(x);
        let now = Instant::from_millis(self.now_ms);
        let s = self.sbx(x);
        // A sandbox whose instance was lost is suspended whatever the policy.
        let suspend = policy || s.stop_suspend;
        let l = s.lane;
        // Not once its way down ended without it (a late answer to a Persist ordered again).
        if l.is_persisted() && !l.is_dead() && !l.is_shut_down() && !l.is_left() && !s.persist_ok {
            s.persist_ok = true;
            s.way_down_due = None;
            self.conservation.persisted(x);
            let s = self.sbx(x);
            let key = s.key.clone();
            let snapshot = s.snapshot.clone();
            if let Some(key) = key {
                if let Some(snap) = snapshot {
                    self.snapshots.persisted(&key, snap, x, now);
                }
                if suspend && self.retiring.get(&key) == Some(&x) {
                    self.retiring.remove(&key);
                }
            }
        }
    }

    /// The configured timeout of the hook at `point`.
    fn hook_timeout(&self, point: HookPoint) -> Option<std::time::Duration> {
        match point {
            HookPoint::AfterStart => self.hooks.after_start,
            HookPoint::AfterResume => self.hooks.after_resume,
            HookPoint::BeforeSuspend => self.hooks.before_suspend,
            HookPoint::BeforeStop => self.hooks.before_stop,
        }
    }

    /// A hook was answered (before the core saw it): `ok` or failed.
    pub fn hook_answered(&mut self, x: SandboxId, ok: bool) {
        let now = self.now_ms;
        let s = self.sbx(x);
        // Only an answer the core still awaits counts (not one past its deadline, not one of a
        // sandbox that died or went down meanwhile).
        if let Some((point, due)) = s.hook {
            if now < due && !s.lane.is_dead() && !s.lane.is_shut_down() {
                s.hook = None;
                if point.is_after() && ok {
                    s.hook_passed = true;
                }
                if point.is_after() {
                    // A resumed sandbox whose after-resume hook failed gives its snapshot back.
                    if let Some(i) = self.starting_resumed.iter().position(|s| s.sandbox == x) {
                        if ok {
                            self.starting_resumed.remove(i);
                        } else {
                            self.starting_resumed[i].due = 0;
                        }
                    }
                }
            }
        }
    }

    fn lets_go(&mut self, x: SandboxId) {
        if let Some(key) = self.sandboxes.get(&x).and_then(|s| s.key.clone()) {
            if self.retiring.get(&key) == Some(&x) {
                self.retiring.remove(&key);
            }
        }
    }

    /// An upload is being answered (before the core sees it).
    pub fn upload_answered(&mut self, upload: UploadId, ok: bool, gone: bool) {
        let Some(f) = self.uploads.answered(upload, ok) else {
            return;
        };
        let sandbox = f.sandbox;
        if !ok && !gone {
            self.mirror.upload_failed(f.session, f.path, f.version);
        }
        // (An upload into a sandbox whose instance was lost was cancelled then: not awaited.)
        if gone && !self.sbx(sandbox).instance_lost {
            self.marks.hit(Mark::UploadGone);
            self.sbx(sandbox).lane.die();
            self.conservation.died(sandbox);
            self.lets_go(sandbox);
        }
    }

    /// Marks a loss reported for a sandbox whose key has resumed it as another since (the
    /// late-Delete race).
    pub fn note_resumed_loss(&mut self, x: SandboxId) {
        if self.resumed.contains(&x) {
            self.marks.hit(Mark::LateLossAfterResume);
        }
    }

    /// The backend reported a sandbox's running instance gone (before the core saw it): never
    /// a death of a managed sandbox, whose workspace remains. The ledger has a Start of it
    /// outstanding when `starting`, any command but an Upload when `awaiting`.
    ///
    /// - Being suspended (its Stop with `suspend` ordered and neither its Shutdown nor a death
    ///   since): the suspension's own doing (`suspension-keeps-workspace`).
    /// - Starting (its Start or after-hook outstanding): its start failed; a resumed one gives
    ///   its key's snapshot back.
    /// - Up and awaiting nothing: it keeps its workspace and goes down as a suspension
    ///   (`instance-loss-suspends`).
    /// - On its way down otherwise: the outstanding command decides (no Abandon, no Shutdown
    ///   now: `suspension-keeps-workspace`).
    ///
    /// An external sandbox's, or one already shut down or dead, counts as a death. Returns
    /// whether it counts as one.
    pub fn instance_gone(&mut self, x: SandboxId, starting: bool, awaiting: bool) -> bool {
        let suspend = self.sbx(x).stop_suspend;
        let s = Flags::of(self.sbx(x));
        let suspending =
            suspend && s.lane.is_stopped() && !s.lane.is_shut_down() && !s.lane.is_dead();
        if suspending {
            self.marks.hit(Mark::InstanceGoneWhileSuspending);
            self.spared = Some(x);
            return false;
        }
        let l = s.lane;
        if self.sbx(x).instance_lost {
            // Reported again: the first report decided.
            return false;
        }
        if !l.is_started() || l.is_external() || l.is_dead() || l.is_shut_down() || l.is_left() {
            self.died(x);
            return true;
        }
        self.touched.sandbox(x);
        let after_hook = self.sbx(x).hook.is_some_and(|(point, _)| point.is_after());
        if (starting && !l.is_stopped()) || after_hook {
            let now = self.now_ms;
            if let Some(e) = self.starting_resumed.iter_mut().find(|e| e.sandbox == x) {
                if e.due > now {
                    e.due = 0;
                }
            }
            return false;
        }
        if !l.is_stopped() && !awaiting {
            self.marks.hit(Mark::InstanceLostKept);
            self.progress.instance_lost(x);
            self.conservation.instance_lost(x);
            self.sbx(x).instance_lost = true;
        }
        self.spared = Some(x);
        false
    }

    /// The application's work in `x` ended (`leave` accepted): an operation that returned ok,
    /// which the key owes from now on, if `x` was still up then (work in a sandbox that died,
    /// lost its instance or stopped under it did not return ok).
    pub fn operation_done(&mut self, x: SandboxId) {
        let up = self.sandboxes.get(&x).is_some_and(|s| {
            let l = s.lane;
            l.is_started()
                && !l.is_stopped()
                && !l.is_dead()
                && !l.is_shut_down()
                && !s.instance_lost
        });
        if up {
            self.operations_done += 1;
            let work = Work::Operation(self.operations_done);
            self.conservation.written(x, work.clone(), 1);
            self.conservation.acknowledged(x, work, 1);
        }
    }

    /// The backend reported a sandbox dead (before the core saw it).
    pub fn died(&mut self, x: SandboxId) {
        self.touched.sandbox(x);
        let s = Flags::of(self.sbx(x));
        if !s.lane.is_shut_down() && !s.lane.is_dead() {
            if self.uploads.awaited_in(x) > 0 {
                self.marks.hit(Mark::DeathDuringUpload);
            }
            if s.draining {
                self.marks.hit(Mark::DeathDuringDrain);
            }
        }
        let starting = self
            .calls
            .live()
            .iter()
            .any(|r| r.phase == Phase::Pending && r.sandbox == Some(x));
        if starting {
            self.marks.hit(Mark::DeathDuringStart);
        }
        self.sbx(x).lane.die();
        self.starting_resumed.retain(|s| s.sandbox != x);
        self.conservation.died(x);
        self.lets_go(x);
    }

    // ------------------------------------------------------------------------------------------
    // Outputs

    /// One command the core emitted.
    pub fn command(&mut self, cmd: &Command) {
        let x = cmd.sandbox();
        self.touched.sandbox(x);
        let lane = self.sandboxes.get(&x).map(|s| &s.lane);
        if let Err(v) = self.outputs.command(cmd, lane) {
            self.fail(v.check, v.detail);
        }
        if let Err(v) = self.bounds.command(cmd, Instant::from_millis(self.now_ms)) {
            self.fail(v.check, v.detail);
        }
        self.progress.command(cmd);
        self.conservation.command(cmd);
        let rec = self.sandboxes.get(&x).map(Flags::of).unwrap_or_default();
        if self.spared == Some(x) {
            check!(
                self,
                !matches!(cmd, Command::Abandon { .. } | Command::Shutdown { .. }),
                "suspension-keeps-workspace",
                "{cmd:?}: the loss of {x}'s instance, its workspace intact (being suspended, or up and awaiting nothing), is not a death"
            );
        }
        // The order of backend-facing commands is the lane's (sandkeeper_check); the commands a
        // backend never receives must not name a shut-down sandbox either.
        if let Err(v) = self.uploads.command(cmd) {
            self.fail(v.check, v.detail);
        }
        self.mirror.command(cmd);
        match Op::of(cmd) {
            Some((_, op)) => {
                if let Err(v) = self.sbx(x).lane.take(x, op) {
                    self.fail(v.check, v.detail);
                }
            }
            // A Discard names the sandbox that persisted a snapshot, shut down or not.
            None => check!(
                self,
                !rec.lane.is_shut_down() || matches!(cmd, Command::Discard { .. }),
                "no-command-after-shutdown",
                "{cmd:?} names {x} after its Shutdown"
            ),
        }
        match cmd {
            Command::Start {
                resume_from,
                resumes,
                sandbox,
                key,
                deadline,
                ..
            } => {
                self.starts += 1;
                if let Some(old) = self.retiring.get(key) {
                    let old = *old;
                    self.fail(
                        "start-after-persist",
                        format!("Start {sandbox} for key {key} while its previous sandbox {old} still stops or persists"),
                    );
                }
                let expected = self.snapshots.kept(key).map(|(s, by)| (s.clone(), by));
                let expected = expected.as_ref();
                check!(
                    self,
                    resume_from.as_ref() == expected.map(|(s, _)| s),
                    "resume-latest-snapshot",
                    "Start {sandbox} for key {key} resumes from {resume_from:?}, the latest persisted is {expected:?}"
                );
                check!(
                    self,
                    *resumes == expected.map(|(_, by)| *by),
                    "resume-latest-snapshot",
                    "Start {sandbox} for key {key} says it continues {resumes:?}, the latest persisted is {expected:?}"
                );
                if resume_from.is_some() {
                    self.marks.hit(Mark::ResumeFrom);
                }
                if let Err(v) = self
                    .snapshots
                    .command(cmd, Instant::from_millis(self.now_ms))
                {
                    self.fail(v.check, v.detail);
                }
                if let Some(old) = resumes {
                    if self.resumed.len() == 16 {
                        self.resumed.remove(0);
                    }
                    self.resumed.push(*old);
                }
                if let (Some(snapshot), Some(by)) = (resume_from, resumes) {
                    let due = deadline.as_nanos().div_ceil(1_000_000);
                    self.starting_resumed.push(Resuming {
                        sandbox: x,
                        due,
                        key: key.clone(),
                        snapshot: snapshot.clone(),
                        by: *by,
                    });
                }
                let s = self.sbx(x);
                s.resume_from = resume_from.clone();
                s.key = Some(key.clone());
            }
            Command::Upload {
                session,
                path,
                version,
                ..
            } => {
                self.uploads_ordered += 1;
                self.touched.session(session);
                if let Err(v) = self.paths.ordered(session, path, version.0) {
                    self.fail(v.check, v.detail);
                }
            }
            Command::CancelUpload { .. } => {}
            Command::Hook { hook, deadline, .. } => {
                self.marks.hit(if hook.is_after() {
                    Mark::HookAfter
                } else {
                    Mark::HookBefore
                });
                // Deadlines in the simulator fall on whole milliseconds, rounded up here anyway.
                let due = deadline.as_nanos().div_ceil(1_000_000);
                if hook.is_after() {
                    if let Some(e) = self.starting_resumed.iter_mut().find(|s| s.sandbox == x) {
                        e.due = due;
                    }
                }
                let s = self.sbx(x);
                s.hook = Some((*hook, due));
                if !hook.is_after() {
                    // The drain ended: the before hook comes after it, then the Stop. What
                    // the drain had to wait for is judged here, where it ended.
                    s.before_hook = true;
                    s.draining = false;
                    let drain_at = s.drain_at;
                    if !self.closing && self.now_ms < drain_at + self.drain_deadline_ms {
                        self.stopped_now.push(x);
                    }
                }
            }
            Command::Discard {
                reason, snapshot, ..
            } => {
                // What scenarios' `discarded` expects: a snapshot its key let go of. A `taken`
                // Discard deletes only what a start left of a snapshot whose workspace lives on
                // in the sandbox that took it.
                if *reason != DiscardReason::Taken {
                    self.discarded.insert(snapshot.as_str().to_string());
                }
                if *reason == DiscardReason::Retention {
                    self.marks.hit(Mark::DiscardRetention);
                }
                if let Err(v) = self
                    .snapshots
                    .command(cmd, Instant::from_millis(self.now_ms))
                {
                    self.fail(v.check, v.detail);
                }
            }
            Command::Drain { sessions, .. } => {
                for s in sessions {
                    self.touched.session(s);
                }
                let now = self.now_ms;
                let s = self.sbx(x);
                s.drain_at = now;
                s.drain_sessions = sessions.clone();
                if sessions
                    .iter()
                    .any(|s| self.holds.get(s).is_some_and(|h| *h > 0))
                {
                    self.marks.hit(Mark::DrainWaitsForHold);
                }
                self.sbx(x).draining = true;
            }
            Command::Stop {
                suspend, deadline, ..
            } => {
                self.starting_resumed.retain(|s| s.sandbox != x);
                self.sbx(x).stop_suspend = *suspend;
                self.sbx(x).way_down_due = Some(deadline.as_nanos().div_ceil(1_000_000));
                // A before hook ended the drain (and cleared `draining`) before this Stop.
                let hooked = self.sandboxes.get(&x).is_some_and(|s| s.before_hook);
                // A Stop ordered again after a failed one needs no new Drain.
                let lost = self.sandboxes.get(&x).is_some_and(|s| s.instance_lost);
                check!(
                    self,
                    !lost || *suspend,
                    "instance-loss-suspends",
                    "Stop for {x}, whose instance was lost with its workspace intact, does not suspend it"
                );
                check!(
                    self,
                    rec.draining || hooked || rec.stop_failed || lost,
                    "drain-before-stop",
                    "Stop for {x} without a Drain first"
                );
                let now = self.now_ms;
                let asked = self.sandboxes.get(&x).and_then(|s| s.asked);
                check!(
                    self,
                    asked != Some(WayDown::Shutdown) || !*suspend || lost,
                    "release-way",
                    "Stop for {x} suspends it, though its last release asked it shut down"
                );
                check!(
                    self,
                    asked != Some(WayDown::Suspend) || *suspend || hooked,
                    "release-way",
                    "Stop for {x} shuts it down, though its last release asked it suspended"
                );
                let wanted = if self.wants_suspend(x) {
                    self.hooks.before_suspend
                } else {
                    self.hooks.before_stop
                };
                let s = self.sbx(x);
                let (hook, before) = (s.hook.take(), s.before_hook);
                if let Some((point, due)) = hook {
                    check!(
                        self,
                        now >= due,
                        "hook-before-stop",
                        "Stop for {x} at {now} ms while its {} hook runs (until {due} ms)",
                        point.as_str()
                    );
                }
                check!(
                    self,
                    before || wanted.is_none() || lost,
                    "hook-before-stop",
                    "Stop for {x} without its before hook"
                );
                if !self.closing
                    && !hooked
                    && !rec.stop_failed
                    && !lost
                    && self.now_ms < rec.drain_at + self.drain_deadline_ms
                {
                    // Checked once the input's events are in (a call of the session may have
                    // become ready elsewhere in the same input).
                    self.stopped_now.push(x);
                }
                if let Some(key) = self.sandboxes.get(&x).and_then(|s| s.key.clone()) {
                    self.retiring.insert(key, x);
                }
                self.sbx(x).draining = false;
                self.sbx(x).stop_failed = false;
            }
            Command::Persist { deadline, .. } => {
                self.sbx(x).way_down_due = Some(deadline.as_nanos().div_ceil(1_000_000));
                check!(
                    self,
                    rec.stop_ok,
                    "persist-after-stop",
                    "Persist for {x} before its Stop succeeded"
                );
            }
            Command::Abandon { .. } => {}
            // The simulator's world is one process: fleet mode is never configured, so the
            // core has nothing to adopt or relinquish.
            Command::Adopt { .. } | Command::Relinquish { .. } => self.fail(
                "fleet-unsimulated",
                format!("{cmd:?} in a one-process run, which has no fleet configured"),
            ),
            Command::Shutdown { .. } => {
                self.starting_resumed.retain(|s| s.sandbox != x);
                self.shutdowns += 1;
                self.lets_go(x);
                self.sbx(x).draining = false;
            }
        }
    }

    /// One event the core emitted.
    pub fn event(&mut self, ev: &Event) {
        if let Err(v) = self.outputs.event(ev) {
            self.fail(v.check, v.detail);
        }
        if let Event::KeyFenced { .. } = ev {
            self.fail(
                "fleet-unsimulated",
                format!("{ev:?} in a one-process run, which has no fleet configured"),
            );
            return;
        }
        match ev {
            Event::CallReady { call, sandbox } => {
                self.touched.call(call);
                self.touched.sandbox(*sandbox);
                if let Some(s) = self.sandboxes.get(sandbox) {
                    let wanted = if s.resume_from.is_some() {
                        self.hooks.after_resume
                    } else {
                        self.hooks.after_start
                    };
                    let (started, passed) = (s.lane.is_started(), s.hook_passed);
                    check!(
                        self,
                        !started || wanted.is_none() || passed,
                        "hook-before-bind",
                        "{call} ready on {sandbox}, whose after hook has not succeeded"
                    );
                }
                let rec = self
                    .sandboxes
                    .get(sandbox)
                    .map(Flags::of)
                    .unwrap_or_default();
                let up = rec.lane.is_up();
                if let Err(v) = self.calls.ready(call, *sandbox, up) {
                    self.fail(v.check, v.detail);
                }
                self.bounds.call_settled(call);
                let live = self.calls.live();
                let shared = live.iter().any(|r| {
                    &r.call != call && r.phase == Phase::Ready && r.sandbox == Some(*sandbox)
                });
                if shared {
                    self.marks.hit(Mark::SharedSandbox);
                }
                let session = live.get(call).map(|c| c.session.clone());
                if let Some(session) = &session {
                    self.touched.session(session);
                }
                self.bound_to.insert(call.clone(), *sandbox);
                if let Some(session) = session {
                    self.last_released.remove(&session);
                    self.mirror.ready(&session, *sandbox);
                }
                let s = self.sbx(*sandbox);
                s.draining = false;
                if s.call.is_none() {
                    s.call = Some(call.clone());
                }
                s.lane.bind_external();
            }
            Event::CallFailed { call, error } => {
                self.touched.call(call);
                let now = Instant::from_millis(self.now_ms);
                if let Err(v) = self.bounds.call_failed(call, *error, now) {
                    self.fail(v.check, v.detail);
                }
                let key = self.calls.live().get(call).and_then(|r| r.key.as_ref());
                if let Err(v) = self.progress.call_failed(call, key, *error) {
                    self.fail(v.check, v.detail);
                }
                match error {
                    ErrorKind::WaitTimeout => self.marks.hit(Mark::WaitTimeout),
                    ErrorKind::StartTimeout => self.marks.hit(Mark::StartTimeout),
                    ErrorKind::StartFailed => self.marks.hit(Mark::StartFailed),
                    ErrorKind::Closed => self.marks.hit(Mark::CloseRefusedWaiter),
                    _ => {}
                }
                match self.calls.failed(call) {
                    Ok(Some(c)) => self.touched.session(&c.session),
                    Ok(None) => {}
                    Err(v) => self.fail(v.check, v.detail),
                }
                self.failed.insert(call.clone(), *error);
                self.bounds.call_settled(call);
            }
            Event::CallReleased { call } => {
                if let Err(v) = self.calls.release_completed(call) {
                    self.fail(v.check, v.detail);
                }
            }
            Event::CallRevoked { call } => {
                self.marks.hit(Mark::CloseRevokedCall);
                match self.calls.revoked(call) {
                    Ok(Some(c)) => self.touched.session(&c.session),
                    Ok(None) => {}
                    Err(v) => self.fail(v.check, v.detail),
                }
                self.bounds.call_settled(call);
            }
            Event::SandboxLost { call, sandbox } => {
                self.touched.call(call);
                self.touched.sandbox(*sandbox);
                self.marks.hit(Mark::SandboxLost);
                let dead = dead(&self.sandboxes, *sandbox);
                if let Err(v) = self.calls.lost(call, *sandbox, dead) {
                    self.fail(v.check, v.detail);
                }
            }
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                self.bounds.version_settled(session, path, version.0);
                self.touched.session(session);
                if let Err(v) = self.paths.settled(session, path, version.0, outcome) {
                    self.fail(v.check, v.detail);
                }
                if let Err(v) = self.mirror.settled(session, path, version.0, outcome) {
                    self.fail(v.check, v.detail);
                }
                match outcome {
                    Settlement::Uploaded { sandbox } => {
                        // The one-process world keeps no backend content: what settled
                        // `Uploaded` is what landed.
                        let work = Work::Version(session.clone(), path.clone());
                        self.conservation.written(*sandbox, work.clone(), version.0);
                        self.conservation.acknowledged(*sandbox, work, version.0);
                        let acknowledged = self.uploads.settled(session, path, version.0, outcome);
                        if let Err(v) = acknowledged {
                            self.fail(v.check, v.detail);
                        }
                    }
                    Settlement::Superseded { .. } => self.marks.hit(Mark::Superseded),
                    Settlement::Dropped { reason } => match reason {
                        sandkeeper::DropReason::DrainDeadline => {
                            self.marks.hit(Mark::DrainDeadline)
                        }
                        sandkeeper::DropReason::NoSandbox => self.marks.hit(Mark::DroppedNoSandbox),
                        sandkeeper::DropReason::Closed => self.marks.hit(Mark::DroppedClosed),
                        sandkeeper::DropReason::UploadFailed => {
                            self.marks.hit(Mark::DroppedUploadFailed)
                        }
                        sandkeeper::DropReason::UploadTimeout => {
                            self.marks.hit(Mark::UploadTimeout)
                        }
                        sandkeeper::DropReason::SandboxGone => {}
                        sandkeeper::DropReason::Fenced => self.fail(
                            "fleet-unsimulated",
                            format!(
                                "{session}/{path} {version} dropped as fenced in a one-process run"
                            ),
                        ),
                    },
                }
                if let Some(all) = &mut self.settlements {
                    all.insert((session.clone(), path.clone(), version.0), outcome.clone());
                }
            }
            Event::MirrorSettled { session } => {
                self.touched.session(session);
                if let Err(v) = self.mirror.mirror_settled(session, &self.paths) {
                    self.fail(v.check, v.detail);
                }
            }
            Event::ShutdownUnconfirmed { .. } => self.marks.hit(Mark::ShutdownUnconfirmed),
            Event::WorkspaceLost { sandbox, key } => {
                let rec = self.sandboxes.get(sandbox);
                check!(
                    self,
                    rec.is_some_and(|s| s.lane.is_dead() && s.key.as_ref() == Some(key)),
                    "workspace-lost-reported",
                    "WorkspaceLost for {sandbox} of key {key}, which was not reported dead (or is of another key)"
                );
            }
            Event::WayDownFailed { sandbox, kept, .. } => {
                self.conservation.left(*sandbox, kept.as_ref());
                // Left to the backend as it was: its lane ends without a Shutdown (a snapshot
                // its key keeps of it was taken as persisted at the last failed answer).
                self.sbx(*sandbox).lane.leave_as_is();
                self.lets_go(*sandbox);
            }
            Event::HookFailed { hook, .. } => {
                check!(
                    self,
                    self.hook_timeout(*hook).is_some(),
                    "hook-before-stop",
                    "a {} hook failed, which the configuration does not have",
                    hook.as_str()
                );
                self.marks.hit(Mark::HookFailed);
            }
            Event::KeyFenced { .. } => unreachable!("refused above"),
            Event::Closed { .. } => {
                self.bounds.closed();
                self.marks.hit(Mark::Closed);
                self.uploads.closed();
                // Close revoked or dropped everything still live; it says so in its report.
                self.calls.closed();
                self.touched.all = true;
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // After every input

    /// Checks the core's getters and counters against the history.
    pub fn after_input(&mut self, core: &Lifecycle) {
        self.spared = None;
        let (uploads, sandboxes) = (&self.uploads, &self.sandboxes);
        let broken = self.bounds.after_input(
            Instant::from_millis(self.now_ms),
            self.closed(),
            |u| uploads.is_awaited(u),
            |x| {
                sandboxes
                    .get(&x)
                    .is_some_and(|s| s.draining && s.lane.is_started() && s.lane.is_up())
            },
        );
        if let Err(v) = broken {
            self.fail(v.check, v.detail);
        }
        if let Err(v) = self.outputs.input_done() {
            self.fail(v.check, v.detail);
        }
        if let Err(v) = self.conservation.after_input() {
            self.fail(v.check, v.detail);
        }
        let closed = self.closed();
        if let Err(v) = self
            .snapshots
            .input_done(Instant::from_millis(self.now_ms), closed)
        {
            self.fail(v.check, v.detail);
        }
        for x in std::mem::take(&mut self.stopped_now) {
            let Some(rec) = self.sandboxes.get(&x) else {
                continue;
            };
            let held = rec.drain_sessions.iter().find(|s| {
                self.holds.get(*s).is_some_and(|h| *h > 0)
                    && !self.has_up_call(s)
                    && self.last_released.get(*s) == Some(&x)
            });
            if let Some(held) = held {
                let held = held.clone();
                self.fail(
                    "drain-waits-for-holds",
                    format!("Stop for {x} before its drain deadline while session {held} still holds it"),
                );
            }
            if let Some(n) = self.entered.get(&x).filter(|n| **n > 0) {
                let n = *n;
                self.fail(
                    "drain-waits-for-work",
                    format!("Stop for {x} before its drain deadline with {n} piece(s) of work entered in it"),
                );
            }
        }
        if let Err(v) = self.mirror.input_done(&self.paths) {
            self.fail(v.check, v.detail);
        }
        let counted = self.counted(core.stats());
        if counted.iter().any(|(core_count, seen)| core_count != seen) {
            self.counters_disagree(counted);
        }
        self.inputs += 1;
        if self.closed() {
            self.touched.clear();
            return;
        }
        // A call of one process once bound (its sandbox learned) is never queued again.
        let live = self.calls.live().iter();
        let live = live.map(|r| {
            let may_queue = r.phase == Phase::Pending && r.sandbox.is_none();
            (may_queue, r.key.as_ref())
        });
        if let Err(v) = self.progress.after_input(core, live) {
            self.fail(v.check, v.detail);
        }
        let full = self.full_every <= 1 || self.inputs.is_multiple_of(self.full_every);
        self.check_calls(core, full);
    }

    /// The core's counters beside what the history saw, in [`COUNTERS`]' order.
    fn counted(&self, stats: &sandkeeper::Stats) -> [(u64, u64); 6] {
        let seen = [
            self.starts,
            self.shutdowns,
            self.uploads_ordered,
            self.flushes,
            self.acquires,
            self.releases,
        ];
        let core = core_counts(stats);
        std::array::from_fn(|i| (core[i], seen[i]))
    }

    /// Names the counters that disagree with what was seen.
    #[cold]
    fn counters_disagree(&mut self, counted: [(u64, u64); 6]) {
        for (name, (core_count, seen)) in COUNTERS.into_iter().zip(counted) {
            check!(
                self,
                core_count == seen,
                "counters",
                "stats.{name} is {core_count}, {seen} were seen"
            );
        }
    }

    /// Runs the getter checks over every live call (at the end of a phase, whatever the
    /// cadence).
    pub fn check_all_calls(&mut self, core: &Lifecycle) {
        if !self.closed() {
            self.check_calls(core, true);
        }
    }

    /// The getter checks (`sandkeeper_check::CallChecker::check_core`), over the live calls the input
    /// touched (every live call when `full`).
    fn check_calls(&mut self, core: &Lifecycle, full: bool) {
        let (touched, sandboxes) = (&self.touched, &self.sandboxes);
        let result = self.calls.check_core(
            core,
            full,
            |r| touched.reaches(r),
            |x| dead(sandboxes, x),
            |x| {
                sandboxes.get(&x).is_some_and(|s| {
                    let l = s.lane;
                    !l.is_dead() && (l.is_stopped() || l.is_shut_down() || s.draining)
                })
            },
        );
        self.touched.clear();
        if let Err(v) = result {
            self.fail(v.check, v.detail);
        }
    }

    /// The sandbox a `@call` names: the one the call is (or was) bound to.
    pub fn sandbox_of(&self, call: &CallId) -> Option<SandboxId> {
        self.bound_to.get(call).copied()
    }

    /// Learns that `call` is bound to `x` (from the core's getter, while starting).
    pub fn learn_binding(&mut self, call: &CallId, x: SandboxId) {
        self.bound_to.insert(call.clone(), x);
        self.touched.call(call);
        self.touched.sandbox(x);
        self.calls.learn_binding(call, x);
        let s = self.sbx(x);
        if s.call.is_none() {
            s.call = Some(call.clone());
        }
    }

    // ------------------------------------------------------------------------------------------
    // Liveness

    /// Every flushed version settled.
    pub fn check_all_settled(&mut self) {
        if let Err(v) = self.paths.all_settled() {
            self.fail(v.check, v.detail);
        }
    }

    /// Every completed release was announced.
    pub fn check_releases_completed(&mut self) {
        if let Err(v) = self.calls.releases_completed() {
            self.fail(v.check, v.detail);
        }
    }

    /// Every started sandbox was ordered to shut down (or suspended under `Suspend`).
    pub fn check_every_started_shut_down(&mut self) {
        let left = self
            .sandboxes
            .iter()
            .filter(|(_, s)| {
                let suspend = suspends_as(s.asked, self.release);
                s.lane.is_started() && !s.lane.has_ended(suspend || s.instance_lost)
            })
            .map(|(x, _)| x)
            .min();
        if let Some(x) = left {
            self.fail(
                "liveness-shutdown-every-started",
                format!("{x} was started and never ordered to shut down"),
            );
        }
    }

    /// Calls still live and not ready (none may remain after the liveness phase).
    pub fn pending_calls(&self) -> Vec<CallId> {
        self.calls.pending()
    }
}

/// Whether a sandbox whose last release asked `asked` goes down suspended under `release`.
fn suspends_as(asked: Option<WayDown>, release: ReleasePolicy) -> bool {
    asked.map_or(release.suspends(), |way| way == WayDown::Suspend)
}

#[cfg(test)]
mod tests {
    use sandkeeper::{CallId, Config, Lifecycle, SessionId};

    use super::History;

    /// A counter of the core's stats that disagrees with what the history saw is a failure that
    /// names the counter (here: an acquire the history saw and the core never counted).
    #[test]
    fn a_counter_the_core_did_not_count_fails_by_name() {
        let config = Config::default();
        let core = Lifecycle::new(config.clone()).unwrap();
        let mut history = History::new(&config, false);
        history.after_input(&core);
        assert!(history.failure.is_none(), "{:?}", history.failure);
        let (call, session) = (CallId::new("c").unwrap(), SessionId::new("s").unwrap());
        history.acquired(&call, &session, None, None);
        history.after_input(&core);
        let failure = history.failure.expect("the counters disagree");
        assert_eq!(failure.invariant, "counters");
        assert!(
            failure.detail.contains("calls_acquired"),
            "{}",
            failure.detail
        );
    }
}
