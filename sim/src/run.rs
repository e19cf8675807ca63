//! One seeded run: the random phase, then the liveness phase, with every step checked.

use std::time::Duration;

use sandkeeper::Config;

use crate::failure::Failure;
use crate::harness::{Harness, HarnessOptions, Stop};
use crate::marks::Marks;
use crate::step::Step;
use crate::swarm::Swarm;
use crate::world::{Move, World};

/// What to record during a run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Keep the trace (JSON lines).
    pub trace: bool,
    /// Compute the trace hash.
    pub hash: bool,
    /// Keep the transcript (the steps as a scenario spells them), for shrinking.
    pub transcript: bool,
    /// Override of the full-state check cadence: (small_state, full_check_every). `None`: the
    /// harness defaults.
    pub full_check: Option<(usize, u64)>,
    /// Override of the getter checks' full-look cadence (see
    /// [`HarnessOptions::getter_check_every`]); `None`: [`GETTER_CHECK_EVERY`].
    pub getter_check_every: Option<u64>,
    /// The application also enters its sessions' sandboxes for work (`enter`, `leave`); off
    /// by default, which leaves every seed's run as it was.
    pub operations: bool,
}

/// The outcome of one seed.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The sampled configuration, as printed at the start.
    pub swarm: Swarm,
    /// The core configuration.
    pub config: Config,
    /// The close deadline used.
    pub close_deadline: Duration,
    /// Steps applied.
    pub steps: usize,
    /// Core inputs given.
    pub inputs: u64,
    /// The first failure.
    pub failure: Option<Failure>,
    /// Marks reached.
    pub marks: Marks,
    /// The trace hash (when asked).
    pub hash: u64,
    /// The steps, as a scenario would spell them.
    pub transcript: Vec<Step>,
    /// The trace lines (when asked).
    pub trace: Vec<String>,
}

/// The bound on liveness rounds (each answers everything, then advances to the next timer).
const LIVENESS_ROUNDS: usize = 2_000;

/// Random runs ask the core about every live call every this many inputs, and in between about
/// the calls each input touched. 1 (every call after every input) by default: a larger value
/// costs fewer instructions per input but misses transient breaks between full looks (canary
/// r01 fails fewer seeds; the figures are in `docs/performance.md`); `explore
/// --getter-check-every N` trades that way when asked.
pub const GETTER_CHECK_EVERY: u64 = 1;

/// Runs one seed.
pub fn run_seed(seed: u64, opts: &RunOptions) -> RunReport {
    let swarm = Swarm::new(seed);
    let config = swarm.config.clone();
    let close_deadline = swarm.close_deadline;
    let mut hopts = HarnessOptions {
        keep_zombies: true,
        getter_check_every: opts.getter_check_every.unwrap_or(GETTER_CHECK_EVERY),
        trace: opts.trace,
        hash: opts.hash,
        ..HarnessOptions::default()
    };
    if let Some((small, every)) = opts.full_check {
        hopts.small_state = small;
        hopts.full_check_every = every.max(1);
    }
    let mut transcript = Transcript {
        keep: opts.transcript,
        steps: Vec::new(),
    };
    let mut harness =
        Harness::new(config.clone(), close_deadline, hopts).expect("swarm configs are valid");
    let mut world = World::new(seed, swarm).with_operations(opts.operations);
    let outcome = crate::panics::catch(|| drive(&mut harness, &mut world, &mut transcript));
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(Stop::Failed(f))) => Some(f),
        Ok(Err(Stop::Misuse(m))) => Some(Failure {
            invariant: "sim-misuse".into(),
            step: harness.steps,
            detail: m,
        }),
        Err(msg) => Some(Failure {
            invariant: "panic".into(),
            step: harness.steps,
            detail: msg,
        }),
    };
    RunReport {
        seed,
        swarm: world.swarm,
        config,
        close_deadline,
        steps: harness.steps,
        inputs: harness.inputs,
        failure,
        marks: harness.history.marks,
        hash: harness.hash,
        transcript: transcript.steps,
        trace: std::mem::take(&mut harness.trace),
    }
}

fn apply(h: &mut Harness, transcript: &mut Transcript, mut step: Step) -> Result<(), Stop> {
    // The world's resolves record what the core answered; the history judges it. (Filled in
    // place: a step is 128 bytes, and rebuilding it moved every step.)
    if let Step::Resolve(session, seen) = &mut step {
        match h.observe_resolve(session) {
            Some(answer) => *seen = answer,
            None => return Ok(()),
        }
    }
    if transcript.keep {
        transcript.steps.push(step.clone());
    }
    h.apply(&step)
}

/// The steps of a run, kept only when asked.
pub struct Transcript {
    keep: bool,
    steps: Vec<Step>,
}

fn drive(h: &mut Harness, w: &mut World, transcript: &mut Transcript) -> Result<(), Stop> {
    while !w.done(h) {
        match w.next(h) {
            Move::Step(step) => {
                // A hold or an enter the core refuses is taken back from the world's count.
                let counted = match &step {
                    Step::Hold(s) => Some((true, s.clone())),
                    Step::Enter(s) => Some((false, s.clone())),
                    _ => None,
                };
                apply(h, transcript, step)?;
                if let (Some((hold, s)), Some(_)) = (counted, h.last_error) {
                    if hold {
                        w.hold_refused(&s);
                    } else {
                        w.enter_refused(&s);
                    }
                }
            }
            Move::Raw(answer, op, what) => {
                if transcript.keep {
                    transcript.steps.push(Step::Unspellable(format!(
                        "{what}: {answer} {}",
                        op.sandbox
                    )));
                }
                h.apply_raw(&answer, &op, &what)?;
            }
        }
        w.plan(h);
    }
    check_all_calls(h)?;
    liveness(h, w, transcript)
}

/// The history's getter checks over every live call, whatever the cadence.
fn check_all_calls(h: &mut Harness) -> Result<(), Stop> {
    h.history.check_all_calls(&h.core);
    match &h.history.failure {
        Some(f) => Err(Stop::Failed(f.clone())),
        None => Ok(()),
    }
}

/// Answers everything, then moves time to the next timer, until neither is left.
fn quiesce(h: &mut Harness, transcript: &mut Transcript, phase: &str) -> Result<(), Stop> {
    h.ledger.zombies.clear();
    for _ in 0..LIVENESS_ROUNDS {
        if h.ledger.any(None) {
            apply(h, transcript, Step::Settle(None))?;
        }
        if h.history.closed() {
            return Ok(());
        }
        match h.core.poll_timeout() {
            Some(t) => {
                let t = t.as_nanos().div_ceil(1_000_000);
                let d = t.saturating_sub(h.now_ms).max(1);
                apply(h, transcript, Step::Advance(Duration::from_millis(d)))?;
            }
            None if !h.ledger.any(None) => return Ok(()),
            None => {}
        }
    }
    h.history.fail(
        "liveness-bound",
        format!("{phase}: still busy after {LIVENESS_ROUNDS} rounds"),
    );
    Err(Stop::Failed(h.history.failure.clone().expect("failed")))
}

/// Once quiet, the core keeps a key's record only for its snapshot: the core's own invariant
/// `key-forgotten` (no key record with nothing to remember), checked on the quiet core.
fn check_keys_forgotten(h: &mut Harness) {
    if let Err(v) = h.core.check_invariants() {
        h.history
            .fail("liveness-keys-forgotten", format!("a quiet core: {v}"));
    }
}

fn liveness_fail(h: &mut Harness, name: &str, detail: String) -> Stop {
    h.history.fail(name, detail);
    Stop::Failed(h.history.failure.clone().expect("failed"))
}

/// Faults stop; pending answers are delivered; time runs. Every call must become ready or
/// failed, every release complete, every version settle, the core go quiet, close complete.
pub fn liveness(h: &mut Harness, w: &mut World, transcript: &mut Transcript) -> Result<(), Stop> {
    // A: answer everything, let timers run; nobody may stay waiting or starting.
    for (session, n) in w.take_holds() {
        for _ in 0..n {
            apply(h, transcript, Step::Unhold(session.clone()))?;
        }
    }
    for (session, n) in w.take_entered() {
        for _ in 0..n {
            apply(h, transcript, Step::Leave(session.clone()))?;
        }
    }
    quiesce(h, transcript, "calls")?;
    check_all_calls(h)?;
    let pending = h.history.pending_calls();
    if !pending.is_empty() && !h.history.closed() {
        return Err(liveness_fail(
            h,
            "liveness-calls-resolve",
            format!("calls neither ready nor failed: {pending:?}"),
        ));
    }
    // B: the application releases everything; releases complete, versions settle, all quiet.
    let live = h.history.calls.live().ids();
    for call in live {
        apply(h, transcript, Step::Release(call))?;
    }
    quiesce(h, transcript, "release")?;
    if !h.history.closed() {
        h.history.check_all_settled();
        h.history.check_releases_completed();
        if h.history.failure.is_none() && !h.core.is_closing() && !h.core.is_quiescent() {
            h.history.fail(
                "liveness-quiescent",
                format!(
                    "after every release: {} calls, {} sandboxes, next timer {:?}",
                    h.core.live_calls(),
                    h.core.tracked_sandboxes(),
                    h.core.poll_timeout()
                ),
            );
        }
        if h.history.failure.is_none() && !h.core.is_closing() {
            check_keys_forgotten(h);
        }
        if let Some(f) = &h.history.failure {
            return Err(Stop::Failed(f.clone()));
        }
    }
    // C: close completes.
    if !h.core.is_closing() {
        apply(h, transcript, Step::Close(Some(h.close_deadline)))?;
    }
    quiesce(h, transcript, "close")?;
    if !h.history.closed() || !h.core.is_closed() {
        return Err(liveness_fail(
            h,
            "liveness-close-completes",
            "close never finished".into(),
        ));
    }
    h.history.check_all_settled();
    h.history.check_every_started_shut_down();
    // After Closed every input is refused.
    apply(h, transcript, Step::Advance(Duration::from_millis(1)))?;
    match &h.history.failure {
        Some(f) => Err(Stop::Failed(f.clone())),
        None => Ok(()),
    }
}
