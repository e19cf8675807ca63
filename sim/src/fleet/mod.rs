//! The fleet simulator: several replicas, each a real `sandkeeper` core in fleet mode, over one
//! simulated store ([`store`]) and one simulated backend ([`backend`]), in true virtual time, from
//! one seed. `sim explore --replicas N` runs it for N ≥ 2; N = 1 is the one-process simulator,
//! unchanged.
//!
//! The world: sessions whose calls land on any replica (the load balancer), flushes of each
//! call's session log, the application's operations (a quarter of the calls that become ready
//! enter their sandbox, write their session's file under the token their process holds the key
//! by, and leave; one at a time per session in a process; drawn from a stream of their own),
//! background writers (a fifth of the calls that become ready start one: it holds the session,
//! flushes its log later and lets go; a stream of their own; `background.rs`), the application's hooks in two fifths of the seeds (each hook point
//! configured or not; a hook succeeds, fails or hangs past its timeout, drawn from a stream of
//! its own so a seed without hooks runs as it did before), the backend's losses in half the
//! seeds (a sandbox that is up loses its running instance with its workspace intact, or dies
//! with it; its driver hears it; `losses.rs`), and faults for the first minute:
//! replicas paused (sometimes for longer than a lease), crashed (memory lost; restarted later
//! as a new incarnation, the store and backend kept), clocks that drift (mostly within the
//! margin, sometimes beyond it), slow and failed store writes. Each replica's driver runs its core's commands after a latency, drops
//! what its core abandoned, relinquished or cancelled, and drops an answer that comes after the
//! command's deadline. Then faults stop, every replica is closed, and the liveness checks run.
//!
//! With hosts (`FleetOptions::hosts`, `--hosts`; `hosts.rs`, issue 33) each replica slot is a
//! host with its own disk over a shared object store for snapshots, which fails, slows and
//! loses answers to uploads and downloads during the faults (a stream of its own): a sandbox is
//! adopted, stopped, persisted or shut down only on its own host, a snapshot resumed from its
//! host's disk or the store, and the sweep runs per host. Without it, a seed runs step for step
//! as before.
//!
//! A fleet scenario (a `.scn` file with a `fleet` line) drives the same world instead of a
//! seed: `script` takes every choice the seed would make from the scenario's steps. A seed's run
//! can be written out as such a scenario (`transcript`), which the shrinker reduces.
//!
//! Checked after every step:
//!
//! | check | what must hold |
//! |---|---|
//! | `token-order` | no sandbox accepts a change (a start included) under a token older than one it, or any sandbox of its key, has seen |
//! | `lease-valid` | a replica orders a claim, or a command carrying a token, only while its lease is valid by its own clock with the margin taken off (computed here, apart from the core, from the renewals it ordered and the confirmations it got) |
//! | `settle-once` (and the other `Versions` checks) | every version a replica flushed settles exactly once, in that replica (per incarnation) |
//! | `record-shut-down` | no released key's durable record names a warm sandbox that was shut down (an owned key's record names the sandbox its owner runs, for the next owner should the owner crash; the owner may shut it down before it writes the record again) |
//! | `sweep-live` | the sweep (every few seconds, by [`sandkeeper::sweep_verdict`] on the clock of a replica that is up) removes no sandbox that a replica with a live lease drives, and no snapshot such a replica then resumes |
//! | `record-swept` | no key's durable record names a sandbox or snapshot the sweep removed (checked after every sweep and every record write) |
//! | `retention` | no snapshot is swept before its retention ends: the one its key's record gives it, else the one its Persist recorded |
//! | `fenced-token-retired` | once a replica reported a key fenced, or its lease epoch moved on (the lease lapsed), it orders nothing more under the token it held for that key: no sandbox command, no record write, no release |
//! | `record-parity` | an owned key's durable record names what its owner would continue from (`parity.rs`). Judged while the owner is quiet about the key: a live incarnation with a live lease in the store holds it under the store's token, no record write or release of it is in flight or in doubt (ordered and its answer not taken by the core; one its driver dropped, until the core's timers next ran; one answered failed, until the core writes again), and no sandbox it started or adopted for the key under that token is starting (its after hook included), stopping, persisting, shutting down, handed over or dead. Then the record's `warm` is the key's sandbox that is up (running, idle or draining; none when none is) and its snapshot is the one the key keeps for its next start (its last persist, or the one its claim was handed), by name and persisting sandbox |
//! | `resume-latest-snapshot`, `discard-unreferenced`, `discard-after-retention`, `snapshot-released` | per incarnation, `sandkeeper_check::Snapshots` as in one process (`intent.rs`): every Start resumes exactly the snapshot its key keeps, and a Discard names one it keeps, at its retention; a claim hands the key its record's snapshot with the record's retention, and a key the process no longer owns (released, fenced) keeps nothing there. `snapshot-released` is judged at the instant the core's timers last ran (a wake-up runs them; other inputs do not) |
//! | `hook-before-bind`, `hook-before-stop`, `hook-not-again` | per incarnation (`intent.rs`): a call is ready on a sandbox started here only after its after-start or after-resume hook succeeded; a Stop comes after its before hook, never while it runs; an adopted sandbox gets no after hook again (its first owner ran it) |
//! | `drain-waits-for-holds`, `drain-waits-for-work` | per incarnation, as the one-process history judges them (`drains.rs`): a drain that ends with its sandbox's way down (its before hook or first Stop) before its deadline, the replica not closing, left no hold of a session whose mirror lingers there, and no operation entered into it |
//! | `drain-before-stop`, `persist-after-stop`, `start-after-persist` | per incarnation, as the one-process history judges them (`intent.rs`): a first Stop after a Drain or a before hook, a Persist only once its Stop was answered ok, no Start for a key while its previous sandbox stops or persists |
//! | lane checks, `nothing-after-closed`, `abandon-then-shutdown`, `one-upload-per-path`, `uploaded-is-acknowledged` | per incarnation, `sandkeeper_check::Lane` (an Adopt starts a new lane), `OutputChecker` and `UploadChecker` (`intent.rs`) |
//! | `progress`, `wait-timeout-held` | per replica, `sandkeeper_check::Progress`: every key with a queued call is held back by something real (a sandbox of the key stopping, persisting or handed over; under `Serialize` a live call of it bound; the key not the replica's while a claim of it is under way or made again later or the lease is not valid; a release of it under way or in doubt), and a call fails `wait-timeout` only if its key had queued calls, held back, at the last look |
//! | `call-events`, `ready-on-live-sandbox`, `binding-stable`, `no-teardown-under-live-call`, `resolve-own-sandbox`, `release-live`, `release-completes-once`, `typed-errors` (and the other `CallChecker` checks) | per incarnation, `sandkeeper_check::CallChecker` as in one process (`process.rs`), the getter checks over every live call after every input: a sandbox is dead once an upload the core awaited in it was answered `gone` or its key was fenced under the token it was started or adopted with (its ready calls then get `SandboxLost`); torn down once draining (until a Stop, a before hook, or a handover of its key ends the drain), stopped, shut down or relinquished. An application input whose own input lapsed the lease first is fed after the lapse's events |
//! | `command-deadline`, `upload-within-timeout`, `drain-within-deadline`, `wait-within-timeout`, `close-within-deadlines` | per incarnation, `sandkeeper_check::Deadlines` (`process.rs`) on the replica's clock, the bounds after an input judged at the instant its core's timers last ran; in fleet mode a `wait-timeout` comes at or after its deadline (at the replica's first timer run), a call queued again after a failed adoption waits afresh, one whose Adopt went unanswered and was ordered again starts afresh, one bound after its wait deadline (an input before the wake-up, after a pause) is held to its start from then, and one whose sandbox waits for its key's record to name it leaves the bound (no call timer runs then) |
//! | `upload-routing`, `mirror-independent`, `release-drains-mirror`, `mirror-settled-true` | per incarnation, `sandkeeper_check::MirrorChecker` (`process.rs`): an upload whose answer the driver dropped past its deadline keeps its path busy until the core's timers next run; a `MirrorSettled` among the events of a lapse that came before a flush (before the flush's own version settled) is judged without that version |
//! | `workspace-lost-reported`, `instance-loss-suspends`, `suspension-keeps-workspace` | per incarnation (`intent.rs`, fed by `losses.rs`), as the one-process history judges them: a `WorkspaceLost` names a sandbox reported dead to that process (a death report, or an upload answered `gone` while its instance was not lost), of its key; a sandbox whose instance was lost while it was up (running, idle or draining) goes down as a suspension; the input that loses an instance, its workspace intact, abandons and shuts down nothing of it |
//! | `liveness-release-completes` | per replica, `CallChecker` as in one process, before its close when it ran undisturbed (no pause, crash or restart) for the 30 s before: every release it accepted has completed |
//! | `counters` | per incarnation, as in one process (`process.rs`): the core's `Stats` count the Starts, Shutdowns and Uploads it ordered, the versions flushed and the calls acquired and released that were seen (an Adopt is no Start, a Relinquish no Shutdown) |
//! | `lapse-without-fault` | once faults stopped, a replica whose clock drifts within the margin and that ran for a lease and more without a pause, a crash or a slow store never lets its lease lapse: its renewals come on their own, whatever else it does or does not do |
//! | `conservation` | `sandkeeper_check::Conservation` over the shared backend: fed what the backend did (a start, an adoption, a write, a Stop's snapshot, a Persist, a Shutdown, a Discard, a sweep), each version settled `Uploaded` as acknowledged, numbered by the world's flush order (a process numbers its own versions; every flush writes the session's whole log as it then was), and each operation's file as acknowledged once the backend took its write and the core its `leave`, numbered when the operation entered (a write replaces the file whole: a stale one lands over newer work unless the backend refuses its token) |
//! | `core:*` | the core's own invariants (debug builds check them after every input) |
//! | `panic` | the core (or the world) panicked: caught per seed, the seed fails, the batch goes on |
//!
//! `conservation` holds the fleet to what one process promises: a version settled `Uploaded` is
//! in what the key's next owner continues from, through crashes, pauses past the lease, failed
//! and late store writes and adoptions. What it found, each fixed in the core: calls made ready
//! (and work acknowledged) in a sandbox no record named yet; a persisted sandbox shut down, or
//! its suspension taken by a resume, while the record still named it; a sandbox left as it was
//! (its Stop unanswered) dropped from the record; a fresh sandbox shut down after its Stop went
//! unanswered, the workspace already moved into a snapshot nobody learned of; a salvaged
//! snapshot resumed while the record still named its sandbox; an adoption that timed out shut
//! down with the key's history; a key claimed back while its own relinquished sandbox was still
//! tracked, started afresh beside it; a stale flush of a fenced process written over the next
//! owner's newer log; with the background writers, a version flushed by a session whose call
//! came while its key's release was under way, and one of a session whose call waited for a key
//! that was then fenced, each kept and written over the next owner's newer log once the key was
//! claimed back; with the backend's losses, an adopted sandbox whose instance was lost while it
//! was taken over shut down with the key's history, a key released with a record that forgot
//! the sandbox left to its next adoption, a late record write naming a sandbox whose start
//! failed landing after the core resumed its snapshot elsewhere (and one unanswered in time
//! never written again when what the record should say came back to what was last confirmed),
//! and calls of a key claimed back waiting seconds for an adoption that the forgetting of the
//! sandbox no longer admitted; and in the simulated backend, a start resuming a snapshot an earlier start took, an adoption of a
//! sandbox its crashed owner stopped, the sweep told which snapshot a start took.
//!
//! Liveness, after the faults stopped and every replica closed: every call ended (ready then
//! released, or failed), every version settled, every replica closed, and every key with one
//! owner or none (none once the leases ran out).

mod backend;
mod background;
mod drains;
mod hosts;
mod intent;
mod losses;
mod names;
mod parity;
mod process;
mod retired;
pub(crate) mod script;
mod store;
mod transcript;

pub use hosts::HOST_MARKS;
pub use transcript::FleetTranscript;

use background::operation_work;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Command, Config, Event, FenceReason, Fleet, Hooks, Input, Instant, Key,
    KeyRecord, Lifecycle, PathName, Payload, ReleasePolicy, RenewalId, SandboxId, Scope, SessionId,
    StoreCommand, SuspendHookFailure, Token, UploadId,
};
use sandkeeper_check::{Conservation, Progress, Versions, Work};

use crate::rng::Rng;
use crate::step::fleet::{FleetSpec, FleetStep, Link};
use crate::step::Step;
use backend::{Backend, Outcome};
use process::Told;
use store::{ClaimAnswer, Store};

const MS: u64 = 1_000_000;
/// How long faults run.
const FAULTS_NS: u64 = 60_000 * MS;
/// How long the world runs after the faults before close.
const SETTLE_NS: u64 = 60_000 * MS;
/// How long a replica must have run undisturbed before close for its releases to be judged
/// complete (`liveness-release-completes`).
const QUIET_NS: u64 = 30_000 * MS;

/// The marks a fleet run can reach: each a situation the world made happen at least once.
pub const MARKS: &[&str] = &[
    "claim",
    "busy",
    "handoff",
    "adopt",
    "resume-from-record",
    "record-after-crash",
    "fence-lapse",
    "fence-refused",
    "backend-refused",
    "expiry-during-pause",
    "crash-restart-adoption",
    "swept",
    "swept-recorded",
    "death",
    "instance-lost",
];

/// What one fleet seed did.
#[derive(Clone, Debug, Default)]
pub struct FleetReport {
    /// Core inputs applied, over every replica.
    pub inputs: u64,
    /// World steps.
    pub steps: u64,
    /// Marks reached.
    pub marks: BTreeSet<&'static str>,
    /// The first broken invariant.
    pub failure: Option<String>,
    /// Its name.
    pub invariant: Option<String>,
    /// The run as a fleet scenario, when asked for (`FleetOptions::transcript`).
    pub transcript: Option<FleetTranscript>,
}

/// Switches for the canaries: a check of the world's own that a canary turns off.
#[derive(Clone, Copy, Debug)]
pub struct FleetOptions {
    /// Replicas.
    pub replicas: usize,
    /// The backend refuses old tokens (off: the `token-order` check must catch what follows).
    pub backend_fencing: bool,
    /// Run the `conservation` check (on by default; `SIM_FLEET_NO_CONSERVATION` turns it off,
    /// to show what it alone catches).
    pub conservation: bool,
    /// Print every step to standard output.
    pub trace: bool,
    /// Write the run out as a fleet scenario (`FleetReport::transcript`), for the shrinker.
    /// The run itself is the same.
    pub transcript: bool,
    /// Each replica slot is a host with its own disk, over a shared object store with faults
    /// of its own (`hosts.rs`; off: one backend root every replica shares).
    pub hosts: bool,
}

impl FleetOptions {
    /// `replicas` replicas over a fencing backend.
    pub fn new(replicas: usize) -> Self {
        FleetOptions {
            replicas,
            backend_fencing: true,
            conservation: true,
            trace: false,
            transcript: false,
            hosts: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    Up,
    Paused { until: u64 },
    Crashed,
}

/// A call as the application on one replica sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Ready,
    Released,
}

struct Replica {
    core: Lifecycle,
    incarnation: u32,
    run: Run,
    closed: bool,
    drift_ppm: i64,
    base_true: u64,
    base_local: u64,
    /// Renewals ordered: when (local) and under which epoch.
    renewals: BTreeMap<RenewalId, (u64, u64)>,
    epoch: u64,
    valid_until: Option<u64>,
    versions: Versions,
    /// The application's calls: session, phase, and key (`progress` looks at it).
    calls: BTreeMap<CallId, (SessionId, Phase, Option<Key>)>,
    /// Sandbox commands ordered before this sequence number were dropped by the driver
    /// (Abandon, Relinquish).
    dropped_before: BTreeMap<SandboxId, u64>,
    cancelled: BTreeSet<UploadId>,
    /// The earliest wake-up pending for it (true time).
    next_wake: u64,
    /// When it last came back from a pause or was started (true time).
    disturbed: u64,
    /// Lease lapses seen so far.
    lapses: u64,
    /// The tokens it held and may no longer order anything under (`fenced-token-retired`).
    retired: retired::Retired,
    /// What holds back each key with a queued call (`progress`, `wait-timeout-held`).
    progress: Progress,
    /// What it does with its keys' sandboxes: lanes, outputs, snapshots, hooks (`intent`).
    intent: intent::Intent,
    /// Its record writes and releases in flight (`record-parity`).
    writes: parity::Writes,
    /// The one-process world's `CallChecker`, `Deadlines` and `MirrorChecker` (`process.rs`).
    process: process::Process,
    /// When its core's timers last ran (its clock): a wake-up runs every timer due; other
    /// inputs run none but the lease's lapse.
    timers_at: Instant,
}

impl Replica {
    fn local(&self, t: u64) -> u64 {
        let elapsed = t - self.base_true;
        let drifted = i128::from(elapsed) * i128::from(1_000_000 + self.drift_ppm) / 1_000_000;
        self.base_local + drifted as u64
    }

    fn true_of(&self, local: u64) -> u64 {
        let elapsed = local.saturating_sub(self.base_local);
        let t = i128::from(elapsed) * 1_000_000 / i128::from(1_000_000 + self.drift_ppm);
        self.base_true + t as u64 + 1
    }

    /// The earliest true time at which its clock reads `local` or later.
    fn wake_at(&self, local: u64) -> u64 {
        let t = self.true_of(local);
        if t > self.base_true && self.local(t - 1) >= local {
            t - 1
        } else {
            t
        }
    }
}

#[derive(Clone, Debug)]
enum Ev {
    Wake(usize),
    Arrive(usize, SessionId),
    Release(usize, u32, CallId),
    Flush(usize, u32, SessionId),
    /// The application enters its session's sandbox for an operation (a write of its file).
    Enter(usize, u32, SessionId),
    /// The operation entered into `SandboxId` writes its file, made at the world's flush order
    /// `u64`, and leaves.
    Leave(usize, u32, SessionId, SandboxId, u64),
    /// A background writer of the session holds it.
    Hold(usize, u32, SessionId),
    /// The background writer of the session flushes and lets its hold go.
    Unhold(usize, u32, SessionId),
    Apply(usize, u32, Command, u64),
    StoreApply(usize, u32, StoreCommand),
    Answer(usize, u32, Input, Instant),
    Pause(usize, u64),
    Resume(usize),
    Crash(usize),
    Restart(usize),
    Close(usize),
    /// A sweep of the backend, on the clock of a replica that is up (drift included).
    Sweep,
    /// The backend loses a sandbox that is up: its instance only, or with its workspace
    /// (`losses.rs`).
    Lose,
}

/// A version one incarnation of a replica flushed: (replica, incarnation, session, path,
/// version).
type FlushedVersion = (usize, u32, SessionId, PathName, u64);

struct World {
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    replicas: Vec<Replica>,
    store: Store,
    backend: Backend,
    config: Config,
    fleet: Fleet,
    next_incarnation: u32,
    next_call: u64,
    sessions: Vec<SessionId>,
    store_fail: u32,
    report: FleetReport,
    faults: bool,
    /// Incarnations that crashed, and keys claimed from them.
    crashed: BTreeSet<u32>,
    /// Keys whose claim handed a record with a snapshot, until their next Start.
    resumable: BTreeSet<Key>,
    /// Sandboxes and snapshots the sweep removed.
    swept_sandboxes: BTreeSet<SandboxId>,
    swept_snapshots: BTreeSet<String>,
    /// `conservation`: each key's acknowledged work and the backend's workspaces that hold it
    /// (`sandkeeper_check::Conservation`, fed what the backend did, not what was ordered).
    conservation: Conservation,
    /// Whether `conservation` is judged (it is always fed).
    check_conservation: bool,
    /// Each version a replica flushed, by (replica, incarnation, session, path, its version),
    /// as the world's flush order: a process numbers its own versions, but every flush writes
    /// the path's whole content as it was then, so a later flush holds every earlier one,
    /// whichever process made it.
    flush_order: std::collections::HashMap<FlushedVersion, u64>,
    /// Print every step (`FleetOptions::trace`).
    trace: bool,
    /// The first check that broke and what it saw, beside `report.failure`.
    failed: Option<(String, String)>,
    /// A scenario drives this world (`script`); `None` for a seed's world.
    script: Option<Box<script::Script>>,
    /// What `@call` names, when a scenario drives or a transcript is written.
    names: Option<names::Names>,
    /// The instant faults stopped, after which `lapse-without-fault` holds (`None`: never).
    calm_from: Option<u64>,
    /// The run written out as a scenario, when asked for.
    recorder: Option<Box<transcript::Recorder>>,
    /// The application's hooks: how they end (a stream of their own, so that a seed without
    /// hooks draws as it did before there were any).
    hook_rng: Rng,
    /// The application's operations (`enter`, a write, `leave`): a stream of their own, so
    /// that the other draws of a seed stay as they were.
    work_rng: Rng,
    /// The application's holds (a background writer's hold, flush and unhold): a stream of
    /// their own.
    hold_rng: Rng,
    /// Operation files made so far (each write replaces the file: a later one holds more).
    operations: u64,
    /// The sessions with an operation entered and not left, per incarnation: one at a time per
    /// session in a process (two at once would race each other's writes, which is the
    /// application's race, not a loss).
    in_work: BTreeSet<(u32, SessionId)>,
    /// Per mille of hooks that fail, and that hang (never answered: their timeout ends them).
    hook_fail: u32,
    hook_hang: u32,
    /// The backend's losses (which sandbox, instance or workspace, how late the report): a
    /// stream of their own.
    loss_rng: Rng,
    /// Per sandbox, the replica and incarnation whose Start or Adopt the backend last took: the
    /// one its losses are reported to (a real backend's watch reports to the process that
    /// runs the sandbox).
    drivers: BTreeMap<SandboxId, (usize, u32)>,
    /// With hosts (`hosts.rs`): the object store's faults of the seed, and their stream (of
    /// its own, drawn from only with hosts).
    shelf_faults: hosts::ShelfFaults,
    shelf_rng: Rng,
    /// A scenario's step gives the object store's fault of the command it runs (`shelf=`).
    shelf_next: Option<hosts::Draw>,
    /// The object store's faults in the last command the backend ran (for the transcript).
    last_draw: hosts::Draw,
}

/// The key a call of `session` is isolated under, when the world knows it (a seed's world has
/// no users; a scenario's calls under scope `user` are not looked at by `progress`).
pub(crate) fn key_of(scope: Scope, call: &CallId, session: &SessionId) -> Option<Key> {
    match scope {
        Scope::Session => Some(Key::Session(session.clone())),
        Scope::Call => Some(Key::Call(call.clone())),
        Scope::Agent => Some(Key::Agent),
        Scope::Global => Some(Key::Global),
        Scope::User => None,
    }
}

/// The hooks of a seed's fleet (in two fifths of the seeds, as in one process: each hook point
/// configured or not, with its timeout), and the per mille of hooks that fail and that hang.
fn draw_hooks(rng: &mut Rng) -> (Hooks, u32, u32) {
    if !rng.chance(400) {
        return (Hooks::default(), 0, 0);
    }
    let mut hook = || {
        rng.chance(700)
            .then(|| Duration::from_millis(rng.range(50, 2_000)))
    };
    let hooks = Hooks {
        after_start: hook(),
        after_resume: hook(),
        before_suspend: hook(),
        before_stop: hook(),
        on_suspend_failure: if rng.chance(500) {
            SuspendHookFailure::Shutdown
        } else {
            SuspendHookFailure::Suspend
        },
    };
    (hooks, rng.range(0, 300) as u32, rng.range(0, 100) as u32)
}

/// Runs one fleet seed.
pub fn run_fleet_seed(seed: u64, opts: FleetOptions) -> FleetReport {
    run_world(World::new(seed, opts), opts)
}

/// Runs a seed's world `w`, made with `opts`, to its end: its report.
fn run_world(mut w: World, opts: FleetOptions) -> FleetReport {
    let spec = opts.transcript.then(|| FleetSpec {
        replicas: w.replicas.len(),
        drift_ppm: w.replicas.iter().map(|r| r.drift_ppm).collect(),
        link: Link::Hold,
        calm_after: Some(Duration::from_nanos(FAULTS_NS)),
        on_advance: true,
        backend_fencing: opts.backend_fencing,
        conservation: opts.conservation,
        hosts: opts.hosts,
    });
    // A core panic fails the seed (check `panic`), as in one process; the world is not looked
    // at again but for what it reported and recorded up to the panic.
    if let Err(msg) = crate::panics::catch(|| w.run()) {
        w.fail("panic", msg);
    }
    w.report.invariant = w.failed.as_ref().map(|(check, _)| check.clone());
    if w.failed.is_some() {
        w.record_time();
    }
    if let (Some(spec), Some(rec)) = (spec, w.recorder.take()) {
        w.report.transcript = Some(FleetTranscript {
            config: Config {
                fleet: Some(w.fleet),
                ..w.config.clone()
            },
            spec,
            steps: rec.steps,
        });
    }
    w.report
}

impl World {
    fn new(seed: u64, opts: FleetOptions) -> World {
        let mut rng = Rng::new(seed ^ 0xf1ee7);
        let release = match rng.below(4) {
            0 => ReleasePolicy::Shutdown,
            1 => ReleasePolicy::KeepWarm {
                idle: Duration::from_millis(rng.range(500, 3_000)),
            },
            2 => ReleasePolicy::Suspend,
            _ => ReleasePolicy::Tiered(sandkeeper::Tiers {
                idle: Duration::from_millis(rng.range(0, 2_000)),
                then: sandkeeper::WayDown::Suspend,
                retain: Some(Duration::from_secs(rng.range(5, 30))),
            }),
        };
        let fleet = Fleet {
            incarnation: 1,
            lease: Duration::from_secs(10),
            renew_every: Duration::from_secs(3),
            margin: Duration::from_secs(2),
            claim_retry: Duration::from_millis(rng.range(200, 1_000)),
            // Hosts reach only each other's snapshots: keys go between them suspended, as
            // the local backend with a shelf requires (`check_config`).
            handover: if opts.hosts {
                sandkeeper::Handover::Suspended
            } else {
                sandkeeper::Handover::Warm
            },
        };
        let config = Config {
            scope: Scope::Session,
            release,
            wait_timeout: Duration::from_secs(rng.range(5, 20)),
            start_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            upload_timeout: Duration::from_secs(3),
            drain_deadline: Duration::from_secs(2),
            close_grace: Duration::from_secs(10),
            fleet: Some(fleet),
            ..Config::default()
        };
        let mut hook_rng = Rng::new(seed ^ 0x4006_5eed);
        let (hooks, hook_fail, hook_hang) = draw_hooks(&mut hook_rng);
        let config = Config { hooks, ..config };
        let sessions = (0..rng.range(2, 6))
            .map(|i| SessionId::new(format!("s{i}")).expect("a valid name"))
            .collect();
        let store_fail = [0, 20, 100][rng.index(3)];
        let mut w = World {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            replicas: Vec::new(),
            store: Store::new(fleet.lease.as_nanos() as u64),
            backend: Backend::new(opts.backend_fencing, opts.hosts),
            config,
            fleet,
            next_incarnation: 1,
            next_call: 0,
            sessions,
            store_fail,
            report: FleetReport::default(),
            faults: true,
            crashed: BTreeSet::new(),
            resumable: BTreeSet::new(),
            swept_sandboxes: BTreeSet::new(),
            swept_snapshots: BTreeSet::new(),
            conservation: Conservation::new(),
            check_conservation: opts.conservation,
            flush_order: Default::default(),
            trace: opts.trace,
            failed: None,
            script: None,
            names: opts.transcript.then(names::Names::default),
            calm_from: Some(FAULTS_NS),
            recorder: opts.transcript.then(Default::default),
            hook_rng,
            work_rng: Rng::new(seed ^ 0x0e4a_7e0b),
            hold_rng: Rng::new(seed ^ 0x401d_5eed),
            operations: 0,
            in_work: BTreeSet::new(),
            hook_fail,
            hook_hang,
            loss_rng: Rng::new(seed ^ 0x1055_5eed),
            drivers: BTreeMap::new(),
            shelf_faults: hosts::ShelfFaults::default(),
            shelf_rng: Rng::new(seed ^ 0x5e1f_5eed),
            shelf_next: None,
            last_draw: hosts::Draw::default(),
        };
        if opts.hosts {
            w.shelf_faults = hosts::ShelfFaults::draw(&mut w.shelf_rng);
        }
        for r in 0..opts.replicas.max(1) {
            let replica = w.boot(0);
            if let Some(rec) = w.recorder.as_mut() {
                rec.booted(r, replica.incarnation);
            }
            w.replicas.push(replica);
            w.push(0, Ev::Wake(r));
        }
        // The workload and the faults, drawn up front for the fault phase.
        let mut t = 0;
        while t < FAULTS_NS {
            t += w.rng.range(50, 400) * MS;
            let r = w.rng.index(w.replicas.len());
            let s = w.sessions[w.rng.index(w.sessions.len())].clone();
            w.push(t, Ev::Arrive(r, s));
        }
        let mut t = w.rng.range(1_000, 10_000) * MS;
        while t < FAULTS_NS {
            let r = w.rng.index(w.replicas.len());
            match w.rng.below(3) {
                0 => w.push(t, Ev::Crash(r)),
                _ => {
                    let long = w.rng.chance(400);
                    let pause = if long {
                        w.rng.range(11_000, 25_000)
                    } else {
                        w.rng.range(500, 5_000)
                    };
                    w.push(t, Ev::Pause(r, pause * MS));
                }
            }
            t += w.rng.range(3_000, 20_000) * MS;
        }
        w.draw_losses();
        for r in 0..w.replicas.len() {
            w.push(FAULTS_NS + SETTLE_NS, Ev::Close(r));
        }
        let mut t = w.rng.range(500, 5_000) * MS;
        while t < FAULTS_NS + SETTLE_NS + 30_000 * MS {
            w.push(t, Ev::Sweep);
            t += w.rng.range(2_000, 8_000) * MS;
        }
        w
    }

    fn boot(&mut self, now: u64) -> Replica {
        let incarnation = self.next_incarnation;
        self.next_incarnation += 1;
        // Most clocks drift within the margin (2 s over a 10 s lease); one in ten beyond it.
        let drift_ppm = if self.rng.chance(100) {
            self.rng.range(0, 600_000) as i64 - 300_000
        } else {
            self.rng.range(0, 40_000) as i64 - 20_000
        };
        self.boot_as(incarnation, now, drift_ppm)
    }

    /// A new process, incarnation `incarnation`, started at `now` with a clock that drifts by
    /// `drift_ppm` parts per million against true time.
    fn boot_as(&mut self, incarnation: u32, now: u64, drift_ppm: i64) -> Replica {
        let config = Config {
            fleet: Some(Fleet {
                incarnation,
                ..self.fleet
            }),
            ..self.config.clone()
        };
        Replica {
            progress: Progress::new(&config),
            intent: intent::Intent::new(&config),
            writes: parity::Writes::default(),
            process: process::Process::new(&config),
            timers_at: Instant::ZERO,
            core: Lifecycle::new(config).expect("a valid configuration"),
            incarnation,
            run: Run::Up,
            closed: false,
            drift_ppm,
            base_true: now,
            base_local: 0,
            renewals: BTreeMap::new(),
            epoch: 1,
            valid_until: None,
            versions: Versions::new(),
            calls: BTreeMap::new(),
            dropped_before: BTreeMap::new(),
            cancelled: BTreeSet::new(),
            next_wake: u64::MAX,
            disturbed: now,
            lapses: 0,
            retired: retired::Retired::default(),
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((at, self.seq, self.events.len() - 1)));
    }

    fn fail(&mut self, check: &str, detail: String) {
        if self.report.failure.is_none() {
            let detail_at = format!("{detail} (at {} ms)", self.now / MS);
            self.failed = Some((check.to_string(), detail_at));
            self.report.failure = Some(format!(
                "invariant {check} broken: {detail} (at {} ms)",
                self.now / MS
            ));
        }
    }

    fn run(&mut self) {
        let end = FAULTS_NS + SETTLE_NS + 40_000 * MS;
        while let Some(Reverse((at, _, i))) = self.queue.pop() {
            if at > end || self.report.failure.is_some() {
                break;
            }
            self.now = at;
            if self.faults && at >= FAULTS_NS {
                self.faults = false;
                self.store_fail = 0;
            }
            let ev = self.events[i].take().expect("each event once");
            self.process(ev);
        }
        if self.report.failure.is_none() {
            self.liveness();
        }
    }

    /// One event at `now`, counted, then the backend's `token-order` check.
    fn process(&mut self, ev: Ev) {
        if matches!(ev, Ev::Wake(_) | Ev::Resume(_) | Ev::Answer(..)) {
            if let Some(rec) = self.recorder.as_mut() {
                rec.came_due(self.now);
            }
        }
        self.report.steps += 1;
        if self.trace {
            println!("{:>9} ms {ev:?}", self.now / MS);
        }
        self.step(ev);
        if let Some(v) = self.backend.violation.take() {
            self.fail("token-order", v);
        }
        self.judge_conservation();
    }

    /// `conservation` after a step: the starts of the step continue from what their keys owe,
    /// and every key whose holders changed still holds it.
    pub(super) fn judge_conservation(&mut self) {
        let judged = self.conservation.after_input();
        if let (true, Err(v)) = (self.check_conservation, judged) {
            if std::env::var_os("SIM_DEBUG_CONSERVATION").is_some() {
                println!("{:#?}", self.conservation);
            }
            self.fail(v.check, v.detail);
        }
    }

    fn step(&mut self, ev: Ev) {
        // Work for a paused replica waits for it; for a crashed incarnation it is lost.
        let target = match &ev {
            Ev::Wake(r) | Ev::Arrive(r, _) | Ev::Close(r) => Some((*r, None)),
            Ev::Release(r, inc, _)
            | Ev::Flush(r, inc, _)
            | Ev::Enter(r, inc, _)
            | Ev::Leave(r, inc, ..)
            | Ev::Hold(r, inc, _)
            | Ev::Unhold(r, inc, _)
            | Ev::Answer(r, inc, _, _) => Some((*r, Some(*inc))),
            _ => None,
        };
        if let Some((r, inc)) = target {
            if inc.is_some_and(|inc| inc != self.replicas[r].incarnation) {
                return;
            }
            match self.replicas[r].run {
                Run::Paused { until } => {
                    // After the Resume at the same instant (pushed earlier).
                    self.push(until, ev);
                    return;
                }
                Run::Crashed => {
                    if matches!(ev, Ev::Close(_)) {
                        self.push(self.now + 1_000 * MS, ev);
                    }
                    return;
                }
                Run::Up => {}
            }
            if self.replicas[r].closed {
                return;
            }
        }
        match ev {
            Ev::Wake(r) => {
                if self.replicas[r].next_wake <= self.now {
                    self.replicas[r].next_wake = u64::MAX;
                }
                self.replicas[r].writes.timers_ran();
                self.replicas[r].process.timers_run();
                let local = self.replicas[r].local(self.now);
                self.replicas[r].timers_at = Instant::from_nanos(local);
                self.input(r, Told::Nothing, |core, t| core.handle_timeout(t))
            }
            Ev::Arrive(r, session) => self.arrive(r, session),
            Ev::Release(r, _, call) => {
                if let Some((_, phase, _)) = self.replicas[r].calls.get_mut(&call) {
                    if *phase == Phase::Ready {
                        *phase = Phase::Released;
                        if self.recorder.is_some() && !self.replicas[r].core.is_closed() {
                            self.record(Some(r), Step::Release(call.clone()));
                        }
                        let told = Told::Release(&call);
                        self.input(r, told, |core, t| core.release(t, &call));
                    }
                }
            }
            Ev::Flush(r, _, session) => self.flush(r, session),
            Ev::Enter(r, inc, session) => self.enter(r, inc, session),
            Ev::Leave(r, _, session, x, order) => self.leave(r, &session, x, order),
            Ev::Hold(r, inc, session) => self.hold(r, inc, session),
            Ev::Unhold(r, _, session) => self.unhold(r, session),
            Ev::Apply(r, inc, cmd, seq) => self.apply(r, inc, cmd, seq),
            Ev::StoreApply(r, inc, cmd) => self.store_apply(r, inc, cmd),
            Ev::Sweep => self.sweep(),
            Ev::Lose => self.lose_drawn(),
            Ev::Answer(r, _, input, deadline) => {
                let local = self.replicas[r].local(self.now);
                if local > deadline.as_nanos() {
                    // The driver dropped it at its deadline.
                    self.replicas[r].writes.answered(&input, false);
                    let dropped = self.replicas[r].intent.upload_answered(&input, false);
                    if let Some(flight) = dropped {
                        self.replicas[r].process.upload_dropped(flight);
                    }
                    return;
                }
                if let Input::Renewed { renewal, .. } = &input {
                    self.confirmed(r, *renewal);
                }
                self.replicas[r].progress.store_answer(&input);
                if let Input::Claimed {
                    claim, key, token, ..
                } = &input
                {
                    self.replicas[r].retired.claimed(*claim, key, *token);
                }
                self.answer_in(r, input);
            }
            Ev::Pause(r, ns) => {
                if self.replicas[r].run == Run::Up && !self.replicas[r].closed {
                    if self.recorder.is_some() {
                        let pause = FleetStep::Pause(Duration::from_nanos(ns));
                        self.record(Some(r), Step::Fleet(pause));
                    }
                    let until = self.now + ns;
                    self.replicas[r].run = Run::Paused { until };
                    self.push(until, Ev::Resume(r));
                }
            }
            Ev::Resume(r) => {
                if matches!(self.replicas[r].run, Run::Paused { .. }) {
                    self.replicas[r].run = Run::Up;
                    self.replicas[r].disturbed = self.now;
                    self.push(self.now, Ev::Wake(r));
                }
            }
            Ev::Crash(r) => {
                if self.replicas[r].run == Run::Up && !self.replicas[r].closed {
                    if self.recorder.is_some() {
                        self.record(Some(r), Step::Fleet(FleetStep::Crash));
                    }
                    self.replicas[r].run = Run::Crashed;
                    self.crashed.insert(self.replicas[r].incarnation);
                    let back = self.rng.range(1_000, 20_000) * MS;
                    self.push(self.now + back, Ev::Restart(r));
                }
            }
            Ev::Restart(r) => {
                let replica = self.boot(self.now);
                if let Some(rec) = self.recorder.as_mut() {
                    rec.booted(r, replica.incarnation);
                }
                if self.recorder.is_some() {
                    let restart = FleetStep::Restart {
                        drift_ppm: Some(replica.drift_ppm),
                    };
                    self.record(Some(r), Step::Fleet(restart));
                }
                self.replicas[r] = replica;
                self.push(self.now, Ev::Wake(r));
            }
            Ev::Close(r) => {
                // Undisturbed (no pause, crash or restart) for the settling time: every release
                // it accepted has completed, as the one-process world checks once quiet.
                let replica = &self.replicas[r];
                if !replica.core.is_closed() && self.now >= replica.disturbed + QUIET_NS {
                    if let Err(v) = replica.process.releases_completed() {
                        self.fail(v.check, format!("replica {r}: {}", v.detail));
                    }
                }
                // What close cuts is the application's choice.
                self.conservation.closing();
                let deadline = Duration::from_secs(5);
                if self.recorder.is_some() && !self.replicas[r].core.is_closed() {
                    let close = Step::Close(Some(deadline));
                    self.record(Some(r), close);
                }
                self.input(r, Told::Close(deadline), |core, t| core.close(t, deadline));
            }
        }
    }

    /// Feeds one input to replica `r` at its local time, then drains and schedules its output.
    /// `told`: what the application gave it, for `process.rs`.
    fn input(
        &mut self,
        r: usize,
        told: Told<'_>,
        f: impl FnOnce(&mut Lifecycle, Instant) -> Result<(), sandkeeper::Error>,
    ) {
        if self.replicas[r].core.is_closed() {
            return;
        }
        match self.apply_input(r, f) {
            Ok(((), local)) => {
                self.told(r, told, Ok(()), local);
                self.drain(r, local)
            }
            // The world only sends what the core asked for; a refusal is the core's to explain.
            Err(sandkeeper::Error::Closed { .. }) => {
                let local = self.replicas[r].local(self.now);
                self.told(r, told, Err(sandkeeper::ErrorKind::Closed), local);
            }
            Err(e) => self.fail("refused", format!("replica {r}: {e}")),
        }
    }

    /// What the application gave replica `r` at `local` (its clock), accepted or refused, fed
    /// to its `process.rs` checks before the input's outputs.
    pub(super) fn told(
        &mut self,
        r: usize,
        told: Told<'_>,
        result: Result<(), sandkeeper::ErrorKind>,
        local: u64,
    ) {
        let at = Instant::from_nanos(local);
        if let Err(v) = self.replicas[r].process.told(told, result, at) {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
    }

    /// Hands replica `r` the answer `input`: what it accepted is fed to its intent checks
    /// before the commands it caused are judged (in [`drain`](Self::drain)).
    fn answer_in(&mut self, r: usize, input: Input) {
        let taken = !self.replicas[r].core.is_closed();
        self.replicas[r].writes.answered(&input, taken);
        if !taken {
            return;
        }
        let flight = self.replicas[r].intent.upload_answered(&input, true);
        if let (Input::UploadFailed { failure, .. }, Some(flight)) = (&input, flight) {
            let gone = *failure == sandkeeper::UploadFailure::Gone;
            if gone {
                self.replicas[r].intent.upload_gone(flight.sandbox);
            }
            self.replicas[r].process.upload_failed(flight, gone);
        }
        self.loss_told(r, &input);
        let before = intent::Intent::before(&self.replicas[r].core, &input);
        let kept = (!matches!(before, intent::Before::Nothing)).then(|| input.clone());
        match self.apply_input(r, move |core, t| core.handle(t, input).map(|_| ())) {
            Ok(((), local)) => {
                if let Some(input) = kept {
                    let replica = &mut self.replicas[r];
                    let now = Instant::from_nanos(local);
                    replica.intent.answered(&replica.core, &input, before, now);
                }
                self.drain(r, local)
            }
            Err(sandkeeper::Error::Closed { .. }) => {}
            Err(e) => self.fail("refused", format!("replica {r}: {e}")),
        }
    }

    /// Applies one input to replica `r` at its local time, counted; the caller drains (after
    /// noting what the answer says, before the events that follow from it).
    fn apply_input<R>(
        &mut self,
        r: usize,
        f: impl FnOnce(&mut Lifecycle, Instant) -> Result<R, sandkeeper::Error>,
    ) -> Result<(R, u64), sandkeeper::Error> {
        let local = self.replicas[r].local(self.now);
        self.report.inputs += 1;
        f(&mut self.replicas[r].core, Instant::from_nanos(local)).map(|answer| (answer, local))
    }

    fn drain(&mut self, r: usize, local: u64) {
        while let Some(cmd) = self.replicas[r].core.poll_store() {
            self.replicas[r].progress.store_command(&cmd);
            self.replicas[r].process.store_command(&cmd);
            self.replicas[r].writes.ordered(&cmd);
            if let StoreCommand::Renew { renewal, epoch, .. } = &cmd {
                let replica = &mut self.replicas[r];
                if *epoch != replica.epoch {
                    replica.epoch = *epoch;
                    replica.valid_until = None;
                    replica.retired.epoch_moved(*epoch);
                }
                replica.renewals.insert(*renewal, (local, *epoch));
            } else {
                self.lease_valid(r, local, &cmd);
                if let Err(detail) = self.replicas[r].retired.store_ordered(&cmd) {
                    self.fail("fenced-token-retired", format!("replica {r} {detail}"));
                }
            }
            let inc = self.replicas[r].incarnation;
            if self.script.is_some() {
                self.script_store_ordered(r, inc, cmd);
                continue;
            }
            let latency = if self.faults && self.rng.chance(50) {
                self.rng.range(1_000, 6_000)
            } else {
                self.rng.range(1, 50)
            };
            self.push(self.now + latency * MS, Ev::StoreApply(r, inc, cmd));
        }
        // The input's events, taken first: a salvaged snapshot is the key's before the commands
        // that follow from it are judged (they are handled after the commands, as before).
        let events: Vec<Event> =
            std::iter::from_fn(|| self.replicas[r].core.poll_event()).collect();
        let at = Instant::from_nanos(local);
        self.replicas[r].intent.events_first(&events, at);
        if let Err(v) = self.replicas[r].process.events_first(&events) {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
        while let Some(cmd) = self.replicas[r].core.poll_command() {
            if cmd.token().is_some() {
                self.lease_valid(r, local, &cmd);
            }
            if let Err(v) = self.replicas[r].intent.command(&cmd, at) {
                self.fail(v.check, format!("replica {r}: {}", v.detail));
            }
            if let Err(v) = self.replicas[r].process.command(&cmd, at) {
                self.fail(v.check, format!("replica {r}: {}", v.detail));
            }
            if let Err(detail) = self.replicas[r].retired.ordered(&cmd) {
                self.fail("fenced-token-retired", format!("replica {r} {detail}"));
            }
            self.replicas[r].progress.command(&cmd);
            if let Command::Discard {
                snapshot, reason, ..
            } = &cmd
            {
                self.conservation.discard_ordered(snapshot, *reason);
            }
            self.seq += 1;
            let seq = self.seq;
            let inc = self.replicas[r].incarnation;
            match &cmd {
                Command::Abandon { sandbox } | Command::Relinquish { sandbox } => {
                    self.replicas[r].dropped_before.insert(*sandbox, seq);
                }
                Command::CancelUpload { upload, .. } => {
                    self.replicas[r].cancelled.insert(*upload);
                }
                _ => {}
            }
            if let Command::Start {
                key,
                resume_from: Some(_),
                ..
            } = &cmd
            {
                if self.resumable.remove(key) {
                    self.report.marks.insert("resume-from-record");
                }
            }
            if self.script.is_some() {
                self.script_ordered(r, inc, cmd, seq);
                continue;
            }
            let latency = self.rng.range(1, 300);
            if matches!(cmd, Command::Discard { .. }) {
                // A Discard wants no answer, and a scenario's replay runs it where it is ordered
                // (nothing in a transcript says when it landed): so does the world, the
                // harsher of the two (what it deletes is gone the soonest).
                self.apply(r, inc, cmd, seq);
                continue;
            }
            self.push(self.now + latency * MS, Ev::Apply(r, inc, cmd, seq));
        }
        self.replicas[r].process.commands_done();
        for ev in events {
            if let Err(v) = self.replicas[r].intent.event(&ev) {
                self.fail(v.check, format!("replica {r}: {}", v.detail));
            }
            let replica = &mut self.replicas[r];
            let (intent, versions) = (&replica.intent, &replica.versions);
            // Before the world's own handling, which settles `Settled` in `versions`: what
            // `MirrorSettled` reads is every earlier event's.
            if let Err(v) = (replica.process).event(&ev, at, versions, |x| intent.lane(x)) {
                self.fail(v.check, format!("replica {r}: {}", v.detail));
            }
            self.event(r, ev);
        }
        let replica = &mut self.replicas[r];
        if let Err(v) = replica.intent.input_done(&replica.core, replica.timers_at) {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
        let replica = &mut self.replicas[r];
        let (intent, versions) = (&replica.intent, &replica.versions);
        let done = replica.process.input_done(
            &replica.core,
            at,
            replica.timers_at,
            versions,
            intent.uploads(),
            |x| intent.lane(x),
        );
        if let Err(v) = done {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
        self.record_parity(Some(r), None);
        let replica = &mut self.replicas[r];
        let live = (replica.calls.values())
            .map(|(_, phase, key)| (*phase == Phase::Waiting, key.as_ref()));
        if let Err(v) = replica.progress.after_input(&replica.core, live) {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
        if let Some(names) = self.names.as_mut() {
            let replica = &self.replicas[r];
            names.learn(r, &replica.core, replica.calls.keys());
        }
        if self.script.is_some() {
            self.script_drained(r);
        }
        let lapses = self.replicas[r].core.stats().lease_lapses;
        // A scenario's lapses are its own doing, unless it says when faults stop.
        if let (true, Some(calm_from)) = (lapses > self.replicas[r].lapses, self.calm_from) {
            self.replicas[r].lapses = lapses;
            let lease = self.fleet.lease.as_nanos() as u64;
            let replica = &self.replicas[r];
            let calm_since = replica.disturbed.max(calm_from + 6_000 * MS);
            if replica.drift_ppm.abs() <= 20_000 && self.now > calm_since + lease {
                self.fail(
                    "lapse-without-fault",
                    format!(
                        "replica {r}'s lease lapsed with nothing in its way since {} ms",
                        calm_since / MS
                    ),
                );
            }
        }
        if let Some(next) = self.replicas[r].core.poll_timeout() {
            let at = if self.script.as_ref().is_some_and(|s| !s.on_advance) {
                // A scenario's `advance 3s` reaches a timer due at 3 s on a replica's clock
                // (with `events=on-advance`, a transcript's, the seed's instant instead).
                self.replicas[r].wake_at(next.as_nanos())
            } else {
                self.replicas[r].true_of(next.as_nanos())
            };
            let at = at.max(self.now);
            // One wake-up pending per replica: the earliest one.
            if at < self.replicas[r].next_wake {
                self.replicas[r].next_wake = at;
                self.push(at, Ev::Wake(r));
            }
        }
    }

    /// `record-parity` (see `parity.rs`) for the keys replica `r` owns (every replica's, when
    /// `None`), of `only` when given.
    fn record_parity(&mut self, r: Option<usize>, only: Option<&Key>) {
        let mut broken = None;
        for (key, e) in &self.store.keys {
            if only.is_some_and(|only| only != key) {
                continue;
            }
            let Some((inc, epoch)) = e.owner else {
                continue;
            };
            let owner = match r {
                Some(r) if self.replicas[r].incarnation == inc => r,
                Some(_) => continue,
                None => {
                    match (0..self.replicas.len()).find(|r| self.replicas[*r].incarnation == inc) {
                        Some(owner) => owner,
                        None => continue,
                    }
                }
            };
            let replica = &self.replicas[owner];
            if replica.run == Run::Crashed || !self.store.is_live((inc, epoch), self.now) {
                continue;
            }
            let (core, intent, writes) = (&replica.core, &replica.intent, &replica.writes);
            if let Err(detail) = parity::check(key, Token(e.token), &e.record, core, intent, writes)
            {
                broken = Some(format!("replica {owner}: {detail}"));
                break;
            }
        }
        if let Some(detail) = broken {
            self.fail("record-parity", detail);
        }
    }

    /// `lease-valid`: replica `r` may order `what` only under a lease valid by its own clock.
    /// (`what` is printed only when the check breaks: formatting every command cost a tenth of
    /// a seed's time.)
    fn lease_valid(&mut self, r: usize, local: u64, what: &dyn std::fmt::Debug) {
        let valid = self.replicas[r].valid_until;
        if valid.is_none_or(|until| local >= until) {
            self.fail(
                "lease-valid",
                format!(
                    "replica {r} ordered {what:?} at {} ms (its clock) with its lease valid until {:?}",
                    local / MS,
                    valid.map(|v| v / MS)
                ),
            );
        }
    }

    /// A renewal's confirmation reaches replica `r` in time: the lease is valid until its
    /// ordering instant plus the lease minus the margin (by the replica's clock).
    fn confirmed(&mut self, r: usize, renewal: RenewalId) {
        let valid_for = self.fleet.valid_for().as_nanos() as u64;
        let local = self.replicas[r].local(self.now);
        let replica = &mut self.replicas[r];
        if let Some((sent, epoch)) = replica.renewals.get(&renewal).copied() {
            let until = sent + valid_for;
            if epoch == replica.epoch && until > local {
                replica.valid_until = Some(replica.valid_until.map_or(until, |v| v.max(until)));
            }
        }
    }

    fn arrive(&mut self, r: usize, session: SessionId) {
        if !self.faults || self.replicas[r].core.is_closing() {
            return;
        }
        self.next_call += 1;
        let call = CallId::new(format!("c{}", self.next_call)).expect("a valid name");
        let key = key_of(self.config.scope, &call, &session);
        self.replicas[r]
            .calls
            .insert(call.clone(), (session.clone(), Phase::Waiting, key));
        if self.recorder.is_some() {
            let step = Step::Acquire {
                call: call.clone(),
                session: session.clone(),
                user: None,
                external: None,
            };
            self.record(Some(r), step);
        }
        let spec = CallSpec::new(call.clone(), session.clone());
        let told = Told::Acquire(&call, &session, None, None);
        match self.apply_input(r, |core, t| core.acquire(t, spec)) {
            Ok(((), local)) => {
                if let Some(names) = self.names.as_mut() {
                    names.acquired(&call, r);
                }
                self.told(r, told, Ok(()), local);
                self.drain(r, local)
            }
            // Too many calls wait for the key already: the application hears it at once.
            Err(sandkeeper::Error::QueueFull { .. }) => {
                let local = self.replicas[r].local(self.now);
                self.told(r, told, Err(sandkeeper::ErrorKind::QueueFull), local);
                self.replicas[r].calls.remove(&call);
            }
            Err(e) => self.fail("refused", format!("replica {r}: acquire: {e}")),
        }
    }

    /// Numbers the version replica `r` just flushed in the world's flush order
    /// (`flush_order`), for `conservation`.
    pub(super) fn note_flush(&mut self, r: usize, session: &SessionId, path: &PathName, v: u64) {
        let order = self.flush_order.len() as u64 + 1;
        let inc = self.replicas[r].incarnation;
        self.flush_order
            .insert((r, inc, session.clone(), path.clone(), v), order);
    }

    fn flush(&mut self, r: usize, session: SessionId) {
        if self.replicas[r].core.is_closing() {
            return;
        }
        let path = PathName::session_log();
        let payload = Payload::new(format!("{}", self.now).into_bytes());
        if self.recorder.is_some() {
            let step = Step::Flush {
                session: session.clone(),
                path: None,
                bytes: payload.len(),
            };
            self.record(Some(r), step);
        }
        match self.apply_input(r, |core, t| core.flush(t, &session, &path, payload)) {
            Ok((version, local)) => {
                // Recorded before the drain, whose events may settle it.
                self.note_flush(r, &session, &path, version.0);
                let flushed = self.replicas[r]
                    .versions
                    .flushed(&session, &path, version.0);
                if let Err(v) = flushed {
                    self.fail(v.check, v.detail);
                }
                let replica = &mut self.replicas[r];
                (replica.process).flushed(&session, &path, version.0, replica.intent.uploads());
                self.drain(r, local);
            }
            Err(e) => self.fail("refused", format!("replica {r}: flush: {e}")),
        }
    }

    fn event(&mut self, r: usize, ev: Event) {
        let inc = self.replicas[r].incarnation;
        if self.trace {
            println!("{:>9} ms   r{r} event {ev:?}", self.now / MS);
        }
        if self.script.is_some() {
            self.script_saw_event(r, &ev);
        }
        // A scenario's application does what its steps say, nothing on its own.
        let scripted = self.script.is_some();
        match ev {
            Event::CallReady { call, .. } => {
                if let Some((session, phase, _)) = self.replicas[r].calls.get_mut(&call) {
                    *phase = Phase::Ready;
                    let session = session.clone();
                    if scripted {
                        return;
                    }
                    let flush = self.rng.range(10, 500) * MS;
                    self.work_beside(r, inc, &session);
                    self.push(self.now + flush, Ev::Flush(r, inc, session));
                    let done = flush + self.rng.range(10, 2_000) * MS;
                    self.push(self.now + done, Ev::Release(r, inc, call));
                }
            }
            Event::CallFailed { call, error } => {
                let replica = &self.replicas[r];
                let key = replica
                    .calls
                    .get(&call)
                    .and_then(|(_, _, key)| key.as_ref());
                if let Err(v) = replica.progress.call_failed(&call, key, error) {
                    self.fail(v.check, format!("replica {r}: {}", v.detail));
                }
                self.replicas[r].calls.remove(&call);
            }
            Event::CallRevoked { call } => {
                self.replicas[r].calls.remove(&call);
            }
            Event::CallReleased { call } => {
                self.replicas[r].calls.remove(&call);
            }
            Event::SandboxLost { call, .. } => {
                if !scripted {
                    self.push(self.now + MS, Ev::Release(r, inc, call));
                }
            }
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                if let Err(v) = self.replicas[r]
                    .versions
                    .settled(&session, &path, version.0, &outcome)
                {
                    self.fail(v.check, v.detail);
                }
                if let sandkeeper::Settlement::Uploaded { sandbox } = outcome {
                    let flushed = (r, inc, session.clone(), path.clone(), version.0);
                    let order = self.flush_order.get(&flushed);
                    if let Some(order) = order.copied() {
                        let work = Work::Version(session, path);
                        self.conservation.acknowledged(sandbox, work, order);
                    }
                }
            }
            Event::WayDownFailed { sandbox, kept, .. } => {
                self.conservation.left(sandbox, kept.as_ref());
            }
            Event::KeyFenced { key, token, reason } => {
                self.replicas[r].retired.fenced(key, token);
                self.report.marks.insert(match reason {
                    FenceReason::LeaseLapsed => "fence-lapse",
                    FenceReason::Refused => "fence-refused",
                });
            }
            Event::Closed { .. } => self.replicas[r].closed = true,
            Event::MirrorSettled { .. }
            | Event::WorkspaceLost { .. }
            | Event::ShutdownUnconfirmed { .. }
            | Event::HookFailed { .. } => {}
        }
    }

    fn apply(&mut self, r: usize, inc: u32, cmd: Command, seq: u64) {
        if self.dropped(r, inc, &cmd, seq) {
            return;
        }
        if let Command::Hook { .. } = cmd {
            return self.hook_runs(r, inc, &cmd);
        }
        let outcome = self.backend_runs(r, inc, &cmd);
        self.answer(r, inc, &cmd, outcome);
    }

    /// Whether the driver of replica `r` dropped `cmd`, ordered as `seq` by incarnation `inc`,
    /// before it ran: what its core abandoned, relinquished or cancelled meanwhile (only its own
    /// incarnation's: a crashed one's requests in flight still land).
    fn dropped(&self, r: usize, inc: u32, cmd: &Command, seq: u64) -> bool {
        let replica = &self.replicas[r];
        if replica.incarnation != inc {
            return false;
        }
        let dropped = replica
            .dropped_before
            .get(&cmd.sandbox())
            .is_some_and(|before| seq < *before)
            && !matches!(cmd, Command::Shutdown { .. } | Command::Upload { .. });
        let cancelled =
            matches!(cmd, Command::Upload { upload, .. } if replica.cancelled.contains(upload));
        dropped || cancelled
    }

    /// The backend runs `cmd`, which incarnation `inc` of replica `r` ordered, with the checks
    /// and marks that go with it: what it did.
    fn backend_runs(&mut self, r: usize, inc: u32, cmd: &Command) -> Outcome {
        // `record-shut-down`: a released key's durable record that names this sandbox warm (an
        // owned key's record names the sandbox its owner runs, which the owner may shut down
        // before it writes the record again: a next owner after a crash finds it gone and
        // starts afresh).
        let named = match cmd {
            Command::Shutdown { sandbox, .. } => self
                .store
                .keys
                .iter()
                .find(|(_, e)| e.owner.is_none() && e.record.warm == Some(*sandbox))
                .map(|(k, _)| k.clone()),
            _ => None,
        };
        if let Command::Start {
            resume_from: Some(snapshot),
            ..
        } = cmd
        {
            if self.swept_snapshots.contains(snapshot.as_str()) && self.owner_live(r, inc) {
                self.fail(
                    "sweep-live",
                    format!(
                        "{} resumes {}, which the sweep removed",
                        cmd.sandbox(),
                        snapshot.as_str()
                    ),
                );
            }
        }
        let hosts = self.backend.shelf.is_some();
        let draw = match self.shelf_next {
            Some(draw) => draw,
            None if self.faults && hosts && hosts::touches_store(cmd) => {
                self.shelf_faults.for_command(&mut self.shelf_rng)
            }
            None => hosts::Draw::default(),
        };
        self.last_draw = draw;
        if let Command::Stop {
            sandbox,
            suspend: true,
            ..
        } = cmd
        {
            let up = self
                .backend
                .sandboxes
                .get(sandbox)
                .is_some_and(|s| s.life == backend::Life::Up);
            if hosts && up && !self.config.release.suspends() {
                // Suspended though the policy does not suspend and its instance is up: its key
                // goes to another host (`Handover::Suspended`).
                self.report.marks.insert("handover-suspended");
            }
        }
        let outcome = self.backend.apply(cmd, r, draw);
        if matches!(cmd, Command::Start { .. } | Command::Adopt { .. })
            && outcome == Outcome::Ok(None)
        {
            self.drivers.insert(cmd.sandbox(), (r, inc));
        }
        self.conserve(r, inc, cmd, &outcome);
        // With hosts: a snapshot whose last copy went (a Shutdown removed it) holds nothing
        // any more, and nothing is excused.
        if let Some(shelf) = self.backend.shelf.as_mut() {
            let (vanished, marks) = (std::mem::take(&mut shelf.vanished), shelf.marks.drain(..));
            self.report.marks.extend(marks);
            for snapshot in vanished {
                self.conservation.swept_snapshot(&snapshot, false);
            }
        }
        if let (
            Command::Persist {
                snapshot: Some(snapshot),
                retain_until: Some(until),
                ..
            },
            Outcome::Ok(_) | Outcome::Late,
        ) = (cmd, &outcome)
        {
            let until = self.replicas[r].true_of(until.as_nanos());
            if let Some(kept) = self.backend.snapshots.get_mut(snapshot.as_str()) {
                kept.expires = Some(until);
            }
            let shelf = self.backend.shelf.as_mut();
            if let Some(local) = shelf.and_then(|s| s.local.get_mut(snapshot.as_str())) {
                local.expires = Some(until);
            }
        }
        if let (Some(key), Outcome::Ok(_)) = (named, &outcome) {
            self.fail(
                "record-shut-down",
                format!(
                    "{} shut down while the record of {key} names it warm",
                    cmd.sandbox()
                ),
            );
        }
        if matches!(cmd, Command::Adopt { .. }) && outcome == Outcome::Ok(None) {
            self.report.marks.insert("adopt");
        }
        if outcome == Outcome::Fenced {
            self.report.marks.insert("backend-refused");
        }
        outcome
    }

    /// What the backend did with `cmd` (`outcome`), as `conservation` follows it: a start, an
    /// adoption, a write, a Stop's snapshot, a Persist, a Shutdown, a Discard. A refused
    /// command changed nothing.
    fn conserve(&mut self, r: usize, inc: u32, cmd: &Command, outcome: &Outcome) {
        let done = match outcome {
            Outcome::Ok(_) => true,
            Outcome::Silent => matches!(cmd, Command::Discard { .. }),
            Outcome::Gone
            | Outcome::Fenced
            | Outcome::Unavailable
            | Outcome::Elsewhere
            | Outcome::Late => false,
        };
        if !done {
            return;
        }
        match cmd {
            // With hosts: the Start continues from what the backend took (a fresh workspace
            // when it took nothing).
            Command::Start { sandbox, .. } if self.backend.shelf.is_some() => {
                let took =
                    (self.backend.sandboxes.get(sandbox)).and_then(|x| x.resumed_from.clone());
                let mut started = cmd.clone();
                if let Command::Start { resume_from, .. } = &mut started {
                    *resume_from = took;
                }
                self.conservation.command(&started);
            }
            _ => self.conservation.command(cmd),
        }
        match (cmd, outcome) {
            (
                Command::Upload {
                    sandbox,
                    session,
                    path,
                    version,
                    ..
                },
                _,
            ) => {
                let flushed = (r, inc, session.clone(), path.clone(), version.0);
                if let Some(order) = self.flush_order.get(&flushed).copied() {
                    let work = Work::Version(session.clone(), path.clone());
                    self.conservation.written(*sandbox, work, order);
                }
            }
            (Command::Stop { sandbox, .. }, Outcome::Ok(snapshot)) => {
                self.conservation.stopped(*sandbox, snapshot.as_ref());
            }
            (Command::Persist { sandbox, .. }, _) => self.conservation.persisted(*sandbox),
            _ => {}
        }
    }

    /// The application's hook `cmd` runs in its sandbox: it fails where the backend has the
    /// sandbox no longer up; else it succeeds, fails or hangs (never answered: the core's
    /// timeout ends it) as the seed's hook draws say.
    fn hook_runs(&mut self, r: usize, inc: u32, cmd: &Command) {
        let up = (self.backend.sandboxes.get(&cmd.sandbox()))
            .is_some_and(|x| x.life == backend::Life::Up);
        if up && self.hook_rng.chance(self.hook_hang) {
            return;
        }
        let sandbox = cmd.sandbox();
        let input = if up && !self.hook_rng.chance(self.hook_fail) {
            Input::HookOk { sandbox }
        } else {
            Input::HookFailed { sandbox }
        };
        let deadline = cmd.deadline().expect("a hook has a deadline");
        let latency = self.hook_rng.range(1, 200);
        if self.recorder.is_some() {
            self.record_backend(r, inc, cmd, &input, latency * MS);
        }
        self.push(self.now + latency * MS, Ev::Answer(r, inc, input, deadline));
    }

    fn answer(&mut self, r: usize, inc: u32, cmd: &Command, outcome: Outcome) {
        let late = outcome == Outcome::Late;
        let Some((input, deadline)) = Self::answer_of(cmd, outcome) else {
            return;
        };
        let mut latency = self.rng.range(1, 200);
        if self.faults && self.backend.shelf.is_some() && hosts::touches_store(cmd) {
            latency += self.shelf_latency(late);
        }
        if self.recorder.is_some() {
            self.record_backend(r, inc, cmd, &input, latency * MS);
        }
        self.push(self.now + latency * MS, Ev::Answer(r, inc, input, deadline));
    }

    /// What the driver answers its core once the backend ran `cmd` (`outcome`), with the
    /// command's deadline; `None` for a command that wants no answer.
    fn answer_of(cmd: &Command, outcome: Outcome) -> Option<(Input, Instant)> {
        let deadline = cmd.deadline()?;
        let sandbox = cmd.sandbox();
        let input = match (cmd, outcome) {
            (_, Outcome::Silent) => return None,
            (_, Outcome::Fenced) => Input::Fenced { sandbox },
            (Command::Start { .. } | Command::Adopt { .. }, Outcome::Ok(_)) => {
                Input::StartOk { sandbox }
            }
            (
                Command::Start { .. } | Command::Adopt { .. },
                Outcome::Gone | Outcome::Unavailable,
            ) => Input::StartFailed { sandbox },
            // With hosts: the sandbox lives on another host (`FailureClass::Elsewhere`).
            (Command::Adopt { .. }, Outcome::Elsewhere) => Input::InstanceGone { sandbox },
            (Command::Upload { upload, .. }, Outcome::Ok(_)) => Input::UploadOk { upload: *upload },
            (Command::Upload { upload, .. }, Outcome::Unavailable) => Input::UploadFailed {
                upload: *upload,
                failure: sandkeeper::UploadFailure::Transient,
            },
            (Command::Upload { upload, .. }, Outcome::Gone) => Input::UploadFailed {
                upload: *upload,
                failure: sandkeeper::UploadFailure::Gone,
            },
            (Command::Stop { .. }, Outcome::Ok(snapshot)) => Input::StopOk { sandbox, snapshot },
            (Command::Stop { .. }, Outcome::Gone) => Input::StopFailed { sandbox },
            (Command::Persist { .. }, Outcome::Ok(_)) => Input::PersistOk { sandbox },
            (Command::Persist { .. }, Outcome::Gone | Outcome::Unavailable | Outcome::Late) => {
                Input::PersistFailed { sandbox }
            }
            (Command::Shutdown { .. }, Outcome::Ok(_) | Outcome::Elsewhere) => {
                Input::ShutdownOk { sandbox }
            }
            (Command::Shutdown { .. }, Outcome::Gone) => Input::ShutdownOk { sandbox },
            (Command::Hook { .. }, _) => Input::HookFailed { sandbox },
            (other, outcome) => unreachable!("{other:?} answered {outcome:?}"),
        };
        Some((input, deadline))
    }

    fn store_apply(&mut self, r: usize, inc: u32, cmd: StoreCommand) {
        let fails = self.rng.chance(self.store_fail);
        let (input, deadline) = self.store_runs(r, inc, cmd, fails);
        if inc != self.replicas[r].incarnation {
            if self.recorder.is_some() {
                self.record_store(r, inc, &input, None);
            }
            return; // the process that asked crashed; the write (if any) stays
        }
        let latency = if self.faults && self.rng.chance(50) {
            self.rng.range(1_000, 6_000)
        } else {
            self.rng.range(1, 50)
        };
        if self.recorder.is_some() {
            self.record_store(r, inc, &input, Some(latency * MS));
        }
        self.push(self.now + latency * MS, Ev::Answer(r, inc, input, deadline));
    }

    /// The store takes `cmd`, which incarnation `inc` of replica `r` ordered (or errs, when
    /// `fails`), with the checks and marks that go with it: the answer and its deadline (for
    /// nobody when that incarnation crashed since; the write, if any, stays).
    fn store_runs(
        &mut self,
        r: usize,
        inc: u32,
        cmd: StoreCommand,
        fails: bool,
    ) -> (Input, Instant) {
        let deadline = cmd.deadline();
        let written = match &cmd {
            StoreCommand::Record { key, .. } | StoreCommand::Release { key, .. } => {
                Some(key.clone())
            }
            _ => None,
        };
        let input = match cmd {
            StoreCommand::Renew { renewal, epoch, .. } => {
                match (!fails)
                    .then(|| self.store.renew(inc, epoch, self.now))
                    .flatten()
                {
                    Some(wanted) => Input::Renewed { renewal, wanted },
                    None => Input::RenewFailed { renewal },
                }
            }
            StoreCommand::Claim {
                claim, key, epoch, ..
            } => {
                if fails {
                    Input::ClaimFailed { claim, key }
                } else {
                    let before = self.store.keys.get(&key).and_then(|e| e.owner);
                    match self.store.claim(&key, inc, epoch, self.now) {
                        ClaimAnswer::Claimed(token, record) => {
                            self.report.marks.insert("claim");
                            self.note_takeover(before, inc);
                            if before.is_some_and(|(owner, _)| {
                                owner != inc && self.crashed.contains(&owner)
                            }) && !record.is_empty()
                            {
                                // What a crashed owner wrote while it owned the key.
                                self.report.marks.insert("record-after-crash");
                            }
                            if record.warm.is_some() {
                                self.report.marks.insert("handoff");
                            }
                            if record.snapshot.is_some() {
                                self.resumable.insert(key.clone());
                            }
                            Input::Claimed {
                                claim,
                                key,
                                token,
                                record: self.record_to_local(r, record),
                            }
                        }
                        ClaimAnswer::Busy => {
                            self.report.marks.insert("busy");
                            Input::ClaimBusy { claim, key }
                        }
                    }
                }
            }
            StoreCommand::Record {
                recording,
                key,
                token,
                record,
                ..
            } => {
                if fails {
                    Input::RecordFailed { recording, key }
                } else if self.store.record(
                    &key,
                    inc,
                    token,
                    recording.0,
                    self.record_to_true(r, record),
                    self.now,
                ) {
                    Input::Recorded { recording, key }
                } else {
                    Input::RecordFenced { recording, key }
                }
            }
            StoreCommand::Release {
                release,
                key,
                token,
                record,
                ..
            } => {
                if fails {
                    Input::ReleaseFailed { release, key }
                } else {
                    let warm = record.warm;
                    let record = self.record_to_true(r, record);
                    if self.store.release(&key, inc, token, record, self.now) {
                        if let Some(x) = warm {
                            if self
                                .backend
                                .sandboxes
                                .get(&x)
                                .is_some_and(|s| s.life == backend::Life::Gone)
                            {
                                self.fail(
                                    "record-shut-down",
                                    format!(
                                        "the record of {key} names {x} warm, which was shut down"
                                    ),
                                );
                            }
                        }
                        Input::KeyReleased { release, key }
                    } else {
                        Input::ReleaseFenced { release, key }
                    }
                }
            }
        };
        if written.is_some() {
            self.records_name_nothing_swept(written.as_ref());
        }
        if let Some(key) = &written {
            self.record_parity(None, Some(key));
        }
        (input, deadline)
    }

    /// A claim took a key from `before`'s owner: mark what made that possible.
    fn note_takeover(&mut self, before: Option<(u32, u64)>, by: u32) {
        let Some((owner, _)) = before else {
            return;
        };
        if owner == by {
            return;
        }
        if self.crashed.contains(&owner) {
            self.report.marks.insert("crash-restart-adoption");
        }
        if self
            .replicas
            .iter()
            .any(|x| x.incarnation == owner && matches!(x.run, Run::Paused { .. }))
        {
            self.report.marks.insert("expiry-during-pause");
        }
    }

    /// A record from replica `r`'s clock onto true time, as its driver writes it.
    fn record_to_true(&self, r: usize, mut record: KeyRecord) -> KeyRecord {
        if let Some(s) = record.snapshot.as_mut() {
            s.retain_until = s
                .retain_until
                .map(|at| Instant::from_nanos(self.replicas[r].true_of(at.as_nanos())));
        }
        record
    }

    /// A record from true time onto replica `r`'s clock, as its driver reads it.
    fn record_to_local(&self, r: usize, mut record: KeyRecord) -> KeyRecord {
        if let Some(s) = record.snapshot.as_mut() {
            let replica = &self.replicas[r];
            s.retain_until = s.retain_until.map(|at| {
                let at = at.as_nanos().max(replica.base_true);
                Instant::from_nanos(replica.local(at))
            });
        }
        record
    }

    /// Whether incarnation `inc` of replica `r` holds a live lease in the store now.
    fn owner_live(&self, r: usize, inc: u32) -> bool {
        let replica = &self.replicas[r];
        replica.incarnation == inc
            && replica.run != Run::Crashed
            && self.store.is_live((inc, replica.epoch), self.now)
    }

    /// A sweep, by the shared decision (`sandkeeper::sweep_verdict`), on the clock of a replica
    /// that is up, judged a lease back as the local sweep does; then its checks: nothing a
    /// replica with a live lease tracks was removed (`sweep-live`), no record names what was
    /// removed (`record-swept`), no snapshot went before its retention (`retention`).
    fn sweep(&mut self) {
        let up: Vec<usize> = (0..self.replicas.len())
            .filter(|r| self.replicas[*r].run == Run::Up)
            .collect();
        if up.is_empty() {
            return;
        }
        let sweeper = up[self.rng.index(up.len())];
        if self.recorder.is_some() {
            self.record(Some(sweeper), Step::Fleet(FleetStep::Sweep));
        }
        self.sweep_on(sweeper);
    }

    /// The sweep of [`sweep`](Self::sweep), on the clock of replica `sweeper`.
    fn sweep_on(&mut self, sweeper: usize) {
        let lease = self.fleet.lease.as_nanos() as u64;
        let clock = self.replicas[sweeper].local(self.now);
        let judged = clock.saturating_sub(lease);
        // The store judges on true time; the sweeper's view of it is its own clock.
        let judged_true = self.replicas[sweeper].true_of(judged).min(self.now);
        let keys: BTreeMap<Key, sandkeeper::SweepKey> = self
            .store
            .keys
            .iter()
            .map(|(k, e)| {
                let owner_live = e.owner.is_some_and(|o| self.store.is_live(o, judged_true));
                let record = e.record.clone();
                (k.clone(), sandkeeper::SweepKey { owner_live, record })
            })
            .collect();
        let live = |inc: u32| self.store.lease_live(inc, judged_true);
        let now = Instant::from_nanos(judged_true);
        let mut doomed = vec![];
        let mut retention: BTreeMap<String, Option<u64>> = BTreeMap::new();
        // With hosts, the sweeper's host's sandboxes and local snapshots, and the object
        // store's snapshots (`hosts.rs`).
        let hosts = self.backend.shelf.is_some();
        for (id, x) in &self.backend.sandboxes {
            if matches!(x.life, backend::Life::Gone | backend::Life::Dead) {
                continue;
            }
            if hosts && x.host != sweeper {
                continue;
            }
            // The simulated backend's start moves the snapshot it resumes (as the local root's
            // rename does), and says so.
            let object = sandkeeper::SweepObject::Sandbox {
                id: *id,
                key: Some(x.key.clone()),
                resumed_from: x.resumed_from.clone(),
            };
            let verdict = sandkeeper::sweep_verdict(&object, &keys, live, now);
            if verdict != sandkeeper::SweepVerdict::Keep {
                doomed.push((object, verdict, false));
            }
        }
        let locals = (self.backend.shelf.iter()).flat_map(|s| &s.local);
        let locals = locals.filter(|(_, l)| l.host == sweeper).map(|(name, l)| {
            let kept = backend::Kept {
                by: l.by,
                key: l.key.clone(),
                expires: l.expires,
            };
            (name, kept, true)
        });
        let objects =
            (self.backend.snapshots.iter()).map(|(name, kept)| (name, kept.clone(), false));
        for (name, kept, local) in objects.chain(locals) {
            let snapshot = sandkeeper::Snapshot::new(name.clone());
            // The sweeper's own rule, for its host's copies of what is on the object store
            // (`sweep.rs`): what its core still holds.
            let sweeper = local.then(|| sandkeeper::Sweeper {
                incarnation: self.replicas[sweeper].incarnation,
                holds: self.replicas[sweeper].core.holds_snapshot(&snapshot),
            });
            let object = sandkeeper::SweepObject::Snapshot {
                snapshot,
                by: kept.by,
                key: Some(kept.key.clone()),
                expires: kept.expires.map(Instant::from_nanos),
            };
            let verdict = sandkeeper::sweep_verdict_of(&object, &keys, live, now, sweeper);
            if sweeper.is_some() && verdict != sandkeeper::SweepVerdict::Keep {
                let by_others = sandkeeper::sweep_verdict(&object, &keys, live, now);
                if by_others == sandkeeper::SweepVerdict::Keep {
                    self.report.marks.insert("swept-own-copy");
                }
            }
            if verdict != sandkeeper::SweepVerdict::Keep {
                // Its retention: the one its key's record gives it, else its Persist's.
                let recorded = keys
                    .get(&kept.key)
                    .and_then(|k| k.record.snapshot.as_ref())
                    .filter(|s| s.snapshot.as_str() == name);
                let until = match recorded {
                    Some(s) => s.retain_until.map(|at| at.as_nanos()),
                    None => kept.expires,
                };
                retention.insert(name.clone(), until);
                doomed.push((object, verdict, local));
            }
        }
        for (object, verdict, local) in doomed {
            if self.trace {
                let at = if local { " (a local copy)" } else { "" };
                println!(
                    "{:>9} ms   r{sweeper}'s sweep: {object:?}{at} {verdict:?}",
                    self.now / MS
                );
            }
            self.report.marks.insert("swept");
            match object {
                sandkeeper::SweepObject::Sandbox { id, .. } => {
                    if let Some(x) = self.backend.sandboxes.get_mut(&id) {
                        x.life = backend::Life::Gone;
                    }
                    self.conservation.swept_sandbox(id);
                    self.swept_sandboxes.insert(id);
                    let holder = (0..self.replicas.len()).find(|r| {
                        let replica = &self.replicas[*r];
                        self.owner_live(*r, replica.incarnation)
                            && replica.core.sandbox_state(id).is_some_and(|state| {
                                // Dead or handed over: it orders nothing more on it;
                                // shutting down: its one last order removes it too.
                                !matches!(
                                    state,
                                    sandkeeper::SandboxState::Dead
                                        | sandkeeper::SandboxState::HandingOver
                                        | sandkeeper::SandboxState::ShuttingDown
                                )
                            })
                    });
                    if let Some(r) = holder {
                        return self.fail(
                            "sweep-live",
                            format!(
                                "{id} swept while replica {r}, with a live lease, drives it ({:?})",
                                self.replicas[r].core.sandbox_state(id)
                            ),
                        );
                    }
                }
                sandkeeper::SweepObject::Snapshot { snapshot, key, .. } => {
                    if !local {
                        self.backend.snapshots.remove(snapshot.as_str());
                    } else if let Some(shelf) = self.backend.shelf.as_mut() {
                        shelf.local.remove(snapshot.as_str());
                    }
                    let expires = retention.get(snapshot.as_str()).copied().flatten();
                    let over = expires.is_some_and(|e| e <= self.now);
                    // With hosts, a snapshot holds its content while any copy is left.
                    if hosts && over {
                        // With hosts a start copies an object rather than taking it, and a
                        // copy may be left (on a host's disk, or in the sandbox a start took
                        // it into, which no record named): the snapshot's retention ended,
                        // which excuses what it holds wherever `conservation` follows it, as
                        // the Discard this removal stands for would.
                        let retention = sandkeeper::DiscardReason::Retention;
                        self.conservation.discard_ordered(&snapshot, retention);
                    }
                    // With hosts, a snapshot is swept once its last copy is: a host's copy of
                    // what the object store holds is only a copy.
                    if !hosts || !self.backend.anywhere(snapshot.as_str()) {
                        self.conservation.swept_snapshot(&snapshot, over);
                        self.swept_snapshots.insert(snapshot.as_str().to_string());
                    }
                    if verdict == sandkeeper::SweepVerdict::SweepAndUnrecord {
                        self.report.marks.insert("swept-recorded");
                        let key = key.expect("known");
                        if let Some(e) = self.store.keys.get_mut(&key) {
                            e.record.snapshot = None;
                        }
                    }
                    if let Some(expires) = retention.get(snapshot.as_str()).copied().flatten() {
                        if expires > self.now {
                            return self.fail(
                                "retention",
                                format!(
                                    "{} swept at {} ms, its retention ends at {} ms",
                                    snapshot.as_str(),
                                    self.now / MS,
                                    expires / MS
                                ),
                            );
                        }
                    }
                }
            }
        }
        self.records_name_nothing_swept(None);
    }

    /// `record-swept`: no key's record (of `only`, when given) names a sandbox or snapshot the
    /// sweep removed.
    fn records_name_nothing_swept(&mut self, only: Option<&Key>) {
        let named = self.store.keys.iter().find_map(|(k, e)| {
            if only.is_some_and(|only| only != k) {
                return None;
            }
            let warm = e.record.warm.filter(|x| self.swept_sandboxes.contains(x));
            let snapshot = e
                .record
                .snapshot
                .as_ref()
                .filter(|s| self.swept_snapshots.contains(s.snapshot.as_str()));
            match (warm, snapshot) {
                (Some(x), _) => Some(format!("the record of {k} names {x}, which was swept")),
                (_, Some(s)) => Some(format!(
                    "the record of {k} names {}, which was swept",
                    s.snapshot.as_str()
                )),
                _ => None,
            }
        });
        if let Some(detail) = named {
            self.fail("record-swept", detail);
        }
    }

    fn liveness(&mut self) {
        for (r, replica) in self.replicas.iter().enumerate() {
            if replica.run == Run::Crashed {
                continue;
            }
            if !replica.closed {
                return self.fail(
                    "liveness",
                    format!(
                        "replica {r} did not close (live calls {})",
                        replica.core.live_calls()
                    ),
                );
            }
            if let Some((call, _)) = replica.calls.iter().next() {
                return self.fail("liveness", format!("replica {r}: call {call} never ended"));
            }
            if let Err(v) = replica.versions.all_settled() {
                return self.fail(v.check, format!("replica {r}: {}", v.detail));
            }
        }
        // Leases of everyone ran out by now (no one renews after close): no key has an owner.
        let late = self.now + 2 * self.fleet.lease.as_nanos() as u64;
        if let Some((key, e)) = self
            .store
            .keys
            .iter()
            .find(|(k, _)| self.store.live_owner(k, late).is_some())
        {
            self.fail("liveness", format!("{key} still owned by {:?}", e.owner));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in a seed's world (here the world's own, as a core's would be) fails the seed
    /// with the check `panic`, naming where it happened; the run returns its report.
    #[test]
    fn a_panic_fails_the_seed_and_the_run_goes_on() {
        let opts = FleetOptions::new(3);
        let mut w = World::new(7, opts);
        // An event for a replica the fleet does not have: indexing it panics.
        w.push(1_000 * MS, Ev::Wake(99));
        let report = run_world(w, opts);
        assert_eq!(report.invariant.as_deref(), Some("panic"));
        let failure = report.failure.expect("failed");
        assert!(failure.starts_with("invariant panic broken: "), "{failure}");
        assert!(failure.contains("(panicked at sim/src/fleet/"), "{failure}");
        assert_eq!(
            run_fleet_seed(7, opts).failure,
            None,
            "the seed itself passes"
        );
    }
}
