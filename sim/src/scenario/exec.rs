//! Running a scenario: every step through the harness (invariants after every input), the
//! `expect` lines, then liveness.

use std::time::Duration;

use crate::failure::Failure;
use crate::harness::{Harness, HarnessOptions, Stop};
use crate::scenario::parse::Scenario;
use crate::step::Step;
use sandkeeper_check::Phase;

/// How strictly to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// A backend step that answers nothing is an error of the scenario.
    Strict,
    /// Such a step is skipped (the shrinker uses this while it removes steps).
    Lenient,
}

/// The verdict on a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every invariant and expectation held, and liveness too.
    Pass,
    /// An invariant, expectation or liveness check failed at this line (0: after the last line).
    Fail {
        /// The line.
        line: usize,
        /// What failed.
        failure: Failure,
    },
    /// The scenario is wrong at this line (answers a command the core did not order, ...).
    Misuse {
        /// The line.
        line: usize,
        /// Why.
        message: String,
    },
}

impl Verdict {
    /// The failed invariant's name, if it failed.
    pub fn invariant(&self) -> Option<&str> {
        match self {
            Verdict::Fail { failure, .. } => Some(&failure.invariant),
            _ => None,
        }
    }
}

/// Runs a parsed scenario. `log` receives each step, the commands and events it caused.
pub fn run_scenario(scenario: &Scenario, log: Option<&mut dyn FnMut(&str)>) -> Verdict {
    run_steps(scenario, RunMode::Strict, log).0
}

/// Runs a scenario; also returns the indices of the steps that took effect (in lenient mode,
/// skipped steps are left out).
pub fn run_steps(
    scenario: &Scenario,
    mode: RunMode,
    mut log: Option<&mut dyn FnMut(&str)>,
) -> (Verdict, Vec<usize>) {
    if let Some(spec) = &scenario.fleet {
        return crate::fleet::script::run_fleet_scenario(scenario, spec, mode, log);
    }
    let opts = HarnessOptions {
        keep_settlements: true,
        trace: log.is_some(),
        ..HarnessOptions::default()
    };
    let mut h = match Harness::new(scenario.config.clone(), scenario.close_deadline, opts) {
        Ok(h) => h,
        Err(e) => {
            return (
                Verdict::Misuse {
                    line: 0,
                    message: format!("invalid configuration: {e}"),
                },
                Vec::new(),
            )
        }
    };
    let mut effective = Vec::new();
    for (i, (line, step)) in scenario.steps.iter().enumerate() {
        let shown = h.trace.len();
        let r = crate::panics::catch(|| h.apply(step));
        if let Some(log) = log.as_mut() {
            log(&format!("{line:>4}  {step}"));
            for t in &h.trace[shown..] {
                log(&format!("        {t}"));
            }
        }
        match r {
            Ok(Ok(())) => effective.push(i),
            Ok(Err(Stop::Failed(failure))) => {
                effective.push(i);
                return (
                    Verdict::Fail {
                        line: *line,
                        failure,
                    },
                    effective,
                );
            }
            Ok(Err(Stop::Misuse(message))) => match mode {
                RunMode::Strict => {
                    return (
                        Verdict::Misuse {
                            line: *line,
                            message,
                        },
                        effective,
                    )
                }
                RunMode::Lenient => {}
            },
            Err(panic) => {
                effective.push(i);
                return (
                    Verdict::Fail {
                        line: *line,
                        failure: panic_failure(panic, h.steps),
                    },
                    effective,
                );
            }
        }
    }
    let r = crate::panics::catch(|| end_liveness(&mut h));
    let verdict = match r {
        Ok(Ok(())) => Verdict::Pass,
        Ok(Err(Stop::Failed(failure))) => Verdict::Fail { line: 0, failure },
        Ok(Err(Stop::Misuse(message))) => Verdict::Misuse { line: 0, message },
        Err(panic) => Verdict::Fail {
            line: 0,
            failure: panic_failure(panic, h.steps),
        },
    };
    if let Some(log) = log.as_mut() {
        log("   -  (liveness: answer everything, run the timers)");
    }
    (verdict, effective)
}

fn panic_failure(msg: String, step: usize) -> Failure {
    Failure {
        invariant: "panic".into(),
        step,
        detail: msg,
    }
}

/// After the last line: answer every outstanding command, let time run until no timer is due;
/// every call must be ready, released or failed, and every flushed version settled.
fn end_liveness(h: &mut Harness) -> Result<(), Stop> {
    for _ in 0..2_000 {
        h.settle(None)?;
        if h.history.closed() {
            break;
        }
        match h.core.poll_timeout() {
            Some(t) => {
                let t = t.as_nanos().div_ceil(1_000_000);
                let d = t.saturating_sub(h.now_ms).max(1);
                h.apply(&Step::Advance(Duration::from_millis(d)))?;
            }
            None if !h.ledger.any(None) => break,
            None => {}
        }
    }
    if h.core.poll_timeout().is_some() && !h.history.closed() {
        h.history.fail(
            "liveness-bound",
            "timers still due after 2000 rounds".into(),
        );
    }
    let stuck: Vec<String> = h
        .history
        .calls
        .live()
        .iter()
        .filter(|r| r.phase == Phase::Pending)
        .map(|r| r.call.to_string())
        .collect();
    if !stuck.is_empty() {
        h.history.fail(
            "liveness-calls-resolve",
            format!("calls neither ready, released nor failed: {stuck:?}"),
        );
    }
    h.history.check_all_settled();
    match &h.history.failure {
        Some(f) => Err(Stop::Failed(f.clone())),
        None => Ok(()),
    }
}
