//! A fleet world driven by a scenario instead of a seed: the same replicas, store, backend,
//! drivers and checks as a seed's world (`super`), with every choice a seed's randomness makes
//! taken by the scenario's steps instead. Nothing here runs for a seed.
//!
//! What changes, and only when a scenario drives:
//!
//! - The application does what the steps say: no arrivals, flushes or releases of its own.
//! - A backend command the core orders waits, outstanding, until a step answers it (or
//!   `settle`); the backend then runs it and the answer reaches the replica at once or after the
//!   step's delay. Commands that want no answer (Drain, CancelUpload, Abandon, Relinquish,
//!   Discard) reach the backend at once. The driver still drops what its core abandoned,
//!   relinquished or cancelled before it ran, and answers that come after their deadline.
//! - Store work goes as the replica's link says ([`Link`]): answered at once as the store
//!   decides, failed at once, or held for a store step.
//! - Pauses end on their own; crashes last until a `restart` step. Sweeps run only when a step
//!   says, on the named replica's clock.
//! - Timers fire on their own as time reaches them (`advance`), before the next step.
//!
//! Every check of the seed's world runs as it does there, except `lapse-without-fault` (a
//! scenario's lapses are its own doing); a scenario adds the lane checks of each process
//! ([`seen`]) and the core's own `check_invariants` after every input.

mod expect;
mod run;
mod seen;
mod steps;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;

use sandkeeper::{Command, Config, Event, Input, Instant, SandboxId, StoreCommand};

use super::{backend::Backend, store::Store, Ev, FleetReport, World};
use crate::rng::Rng;
use crate::step::fleet::{FleetSpec, Link};
use seen::Seen;

pub use run::run_fleet_scenario;

/// A backend command the core ordered and no step answered yet.
#[derive(Clone, Debug)]
struct Outstanding {
    /// The replica, and the incarnation that ordered it.
    r: usize,
    inc: u32,
    cmd: Command,
    /// Its place among the replica's commands (the driver's drop rule compares it).
    seq: u64,
}

/// A scenario's hold on the world: what waits for its steps, and what it saw.
#[derive(Debug)]
pub(crate) struct Script {
    /// How each replica's store work is answered.
    links: Vec<Link>,
    /// Store work waiting for a store step, in order.
    held: Vec<(usize, u32, StoreCommand)>,
    /// Store work to take at once (`true`: it fails), in order.
    due: VecDeque<(usize, u32, StoreCommand, bool)>,
    /// Backend commands waiting for an answer, in order.
    outstanding: Vec<Outstanding>,
    /// What each replica's current incarnation ordered and reported.
    seen: Vec<Seen>,
    /// The replica of every incarnation.
    incarnations: BTreeMap<u32, usize>,
    /// Each replica's incarnations, in the order they started.
    runs: Vec<Vec<u32>>,
    /// What happened since the last look, for the run's log.
    log: Vec<String>,
    /// The deadline of a `close` step that gives none.
    close_deadline: Duration,
    /// When the log last said what time it was.
    noted_at: Option<u64>,
    /// Leave renewals out of the log (while liveness runs).
    quiet_renewals: bool,
    /// The step being taken (1-based), for failures.
    step: usize,
    /// What comes due happens only on `advance` (`events=on-advance`), not before every step.
    pub(super) on_advance: bool,
}

impl Script {
    /// Replica `r`'s core heard that `x` died: its lane here is dead from now on.
    pub(super) fn died(&mut self, r: usize, x: SandboxId) {
        self.seen[r].died(x);
    }
}

impl World {
    /// A world of `spec.replicas` replicas running `config` (whose `fleet` is the timing), at
    /// time 0, every replica's first wake-up due.
    fn scripted(config: Config, spec: &FleetSpec) -> World {
        let fleet = config
            .fleet
            .expect("a fleet scenario's configuration has its timing");
        let mut w = World {
            rng: Rng::new(0),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            replicas: Vec::new(),
            store: Store::new(fleet.lease.as_nanos() as u64),
            backend: Backend::new(spec.backend_fencing, spec.hosts),
            config,
            fleet,
            next_incarnation: 1,
            next_call: 0,
            sessions: Vec::new(),
            store_fail: 0,
            report: FleetReport::default(),
            faults: false,
            crashed: BTreeSet::new(),
            resumable: BTreeSet::new(),
            swept_sandboxes: BTreeSet::new(),
            swept_snapshots: BTreeSet::new(),
            conservation: sandkeeper_check::Conservation::new(),
            check_conservation: spec.conservation,
            flush_order: Default::default(),
            // As for a seed: every event printed as it happens.
            trace: std::env::var_os("SIM_FLEET_TRACE").is_some(),
            failed: None,
            names: Some(super::names::Names::default()),
            calm_from: spec.calm_after.map(ns),
            recorder: None,
            // A scenario's steps answer its hooks.
            hook_rng: Rng::new(0),
            // A scenario's steps enter and leave.
            work_rng: Rng::new(0),
            hold_rng: Rng::new(0),
            operations: 0,
            in_work: BTreeSet::new(),
            hook_fail: 0,
            hook_hang: 0,
            // A scenario's steps lose sandboxes (`die`, `instance-gone`).
            loss_rng: Rng::new(0),
            drivers: BTreeMap::new(),
            // A scenario's answers are the object store's faults.
            shelf_faults: Default::default(),
            shelf_rng: Rng::new(0),
            shelf_next: None,
            last_draw: Default::default(),
            script: Some(Box::new(Script {
                links: vec![spec.link; spec.replicas],
                held: Vec::new(),
                due: VecDeque::new(),
                outstanding: Vec::new(),
                seen: vec![Seen::default(); spec.replicas],
                incarnations: BTreeMap::new(),
                runs: vec![Vec::new(); spec.replicas],
                log: Vec::new(),
                close_deadline: Duration::from_secs(10),
                noted_at: None,
                quiet_renewals: false,
                step: 0,
                on_advance: spec.on_advance,
            })),
        };
        for r in 0..spec.replicas {
            let drift_ppm = spec.drift_ppm.get(r).copied().unwrap_or(0);
            let replica = w.start_incarnation(r, drift_ppm);
            w.replicas.push(replica);
            w.push(0, Ev::Wake(r));
        }
        w
    }

    /// A new incarnation for replica slot `r`, now, its clock drifting by `drift_ppm`.
    fn start_incarnation(&mut self, r: usize, drift_ppm: i64) -> super::Replica {
        let inc = self.next_incarnation;
        self.next_incarnation += 1;
        let s = self.script_mut();
        s.incarnations.insert(inc, r);
        s.runs[r].push(inc);
        self.boot_as(inc, self.now, drift_ppm)
    }

    fn script_mut(&mut self) -> &mut Script {
        self.script.as_mut().expect("a scenario drives this world")
    }

    fn script_ref(&self) -> &Script {
        self.script.as_ref().expect("a scenario drives this world")
    }

    fn names(&self) -> &super::names::Names {
        self.names
            .as_ref()
            .expect("a scenario's world names its calls")
    }

    /// A line for the run's log, after the time when it moved since the last one.
    fn note(&mut self, line: String) {
        let now = self.now;
        let s = self.script_mut();
        if s.quiet_renewals && (line.contains("Renew {") || line.contains("Renewed {")) {
            return;
        }
        if s.noted_at != Some(now) {
            s.noted_at = Some(now);
            s.log.push(format!("at {:.3} s", now as f64 / 1e9));
        }
        s.log.push(format!("  {line}"));
    }

    // ------------------------------------------------------------------------------------------
    // The world's hooks (called from `super` only when a scenario drives)

    /// The core of replica `r` ordered store work: it goes as the replica's link says.
    pub(super) fn script_store_ordered(&mut self, r: usize, inc: u32, cmd: StoreCommand) {
        self.note(format!("r{r} store: {cmd:?}"));
        let s = self.script_mut();
        s.seen[r].store(&cmd);
        match s.links[r] {
            Link::Auto => s.due.push_back((r, inc, cmd, false)),
            Link::Down => s.due.push_back((r, inc, cmd, true)),
            Link::Hold => s.held.push((r, inc, cmd)),
        }
    }

    /// The core of replica `r` ordered a backend command: one that wants no answer reaches the
    /// backend at once; any other waits for a step.
    pub(super) fn script_ordered(&mut self, r: usize, inc: u32, cmd: Command, seq: u64) {
        self.note(format!("r{r} orders: {}", short(&cmd)));
        if let Err(v) = self.script_mut().seen[r].command(&cmd) {
            self.fail(v.check, format!("replica {r}: {}", v.detail));
        }
        if cmd.deadline().is_none() {
            if !self.dropped(r, inc, &cmd, seq) {
                self.backend_runs(r, inc, &cmd);
            }
            if matches!(
                cmd,
                Command::Abandon { .. } | Command::Relinquish { .. } | Command::CancelUpload { .. }
            ) {
                // What the driver drops now is gone for good, whatever befalls the process.
                let s = self.script.as_ref().expect("a scenario drives this world");
                let kept: Vec<Outstanding> = s
                    .outstanding
                    .iter()
                    .filter(|o| !self.dropped(o.r, o.inc, &o.cmd, o.seq))
                    .cloned()
                    .collect();
                self.script_mut().outstanding = kept;
            }
            return;
        }
        self.script_mut()
            .outstanding
            .push(Outstanding { r, inc, cmd, seq });
    }

    /// The core of replica `r` reported `ev`.
    pub(super) fn script_saw_event(&mut self, r: usize, ev: &Event) {
        self.note(format!("r{r} event: {ev:?}"));
        self.script_mut().seen[r].event(ev);
    }

    /// Replica `r` took an input and its output was drained: the core checks its own
    /// invariants.
    pub(super) fn script_drained(&mut self, r: usize) {
        if let Err(v) = self.replicas[r].core.check_invariants() {
            self.fail(
                &format!("core:{}", v.invariant),
                format!("replica {r}: {}", v.detail),
            );
        }
    }

    // ------------------------------------------------------------------------------------------
    // Time

    /// Time runs to `target` (true time, ns): every queued event due by then (a timer, the end
    /// of a pause, a delayed answer) happens at its instant, in order, with the store work it
    /// causes.
    fn run_until(&mut self, target: u64) {
        self.run_to(target, None);
    }

    /// Time runs to `target`: every queued event due before it happens, and of those due at
    /// `target` exactly, the first `at_target` (all, when `None`), in order.
    fn run_to(&mut self, target: u64, at_target: Option<usize>) {
        let mut left = at_target.unwrap_or(usize::MAX);
        loop {
            self.pump();
            if self.report.failure.is_some() {
                return;
            }
            match self.queue.peek() {
                Some(Reverse((at, _, _))) if *at < target => {}
                Some(Reverse((at, _, _))) if *at == target && left > 0 => left -= 1,
                _ => break,
            }
            let Some(Reverse((at, _, i))) = self.queue.pop() else {
                break;
            };
            self.now = self.now.max(at);
            let ev = self.events[i].take().expect("each event once");
            if let Ev::Resume(r) = &ev {
                self.note(format!("r{r} resumes"));
            }
            self.process(ev);
            self.judge_conservation();
        }
        self.now = self.now.max(target);
    }

    /// Takes the store work due at once (answered as the store decides, or failed), in order,
    /// each answer reaching its replica now.
    fn pump(&mut self) {
        while let Some((r, inc, cmd, fails)) = self.script_mut().due.pop_front() {
            let (input, deadline) = self.store_runs(r, inc, cmd, fails);
            self.deliver(r, inc, input, deadline, None);
            self.judge_conservation();
        }
    }

    /// An answer for incarnation `inc` of replica `r` reaches its driver now, or `after` later
    /// (dropped past its deadline, kept while the replica is paused, lost if it crashed).
    fn deliver(
        &mut self,
        r: usize,
        inc: u32,
        input: Input,
        deadline: Instant,
        after: Option<Duration>,
    ) {
        let when = after.map_or(String::new(), |d| format!(" in {d:?}"));
        self.note(format!("r{r} hears{when}: {input:?}"));
        match after {
            None => self.process(Ev::Answer(r, inc, input, deadline)),
            Some(d) => {
                let at = self.now + ns(d);
                self.push(at, Ev::Answer(r, inc, input, deadline));
            }
        }
    }
}

/// A command as the run's log shows it (payloads by size).
fn short(cmd: &Command) -> String {
    match cmd {
        Command::Upload {
            upload,
            sandbox,
            session,
            path,
            version,
            token,
            ..
        } => format!(
            "Upload {{ upload: {upload}, sandbox: {sandbox}, session: {session}, path: {path}, version: {}, token: {token:?} }}",
            version.0
        ),
        other => format!("{other:?}"),
    }
}

/// The longest a scenario's single `advance`, `pause` or `after=` may be: a fleet's timers
/// never stop while its replicas are open, so time runs event by event.
const LONGEST: Duration = Duration::from_secs(3600);

/// Nanoseconds of a duration, as the world counts time.
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `d`, if it is at most [`LONGEST`].
fn bounded(what: &str, d: Duration) -> Result<Duration, crate::harness::Stop> {
    if d <= LONGEST {
        return Ok(d);
    }
    Err(crate::harness::Stop::Misuse(format!(
        "{what} {d:?} is longer than a fleet scenario's longest, {LONGEST:?}: time runs event by event"
    )))
}
