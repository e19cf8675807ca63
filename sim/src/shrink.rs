//! Shrinking: a failing seed's transcript becomes a scenario, then steps are removed (delta
//! debugging: chunks, halving) while the scenario still fails the same invariant. A fleet
//! seed's transcript (`--replicas N`) becomes a fleet scenario the same way.

use std::time::Duration;

use crate::fleet::{run_fleet_seed, FleetOptions};
use crate::run::{run_seed, RunOptions};
use crate::scenario::{config_line, fleet_line_text, run_steps, RunMode, Scenario, Verdict};
use crate::step::fleet::FleetStep;
use crate::step::Step;

/// A shrunk failure.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The invariant it fails.
    pub invariant: String,
    /// Steps in the original run.
    pub original_steps: usize,
    /// The scenario text.
    pub text: String,
    /// Steps left.
    pub steps: usize,
}

/// Why a seed could not be shrunk.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShrinkError {
    /// The seed passes.
    #[error("seed {0} does not fail")]
    Passes(u64),
    /// The transcript as a scenario does not fail the same way.
    #[error("seed {seed} fails {invariant}, but its transcript as a scenario gives {got}")]
    NotReproduced {
        /// The seed.
        seed: u64,
        /// The invariant the seed fails.
        invariant: String,
        /// What the scenario gave.
        got: String,
    },
}

fn fails_same(scenario: &Scenario, invariant: &str) -> Option<Vec<usize>> {
    let (verdict, effective) = run_steps(scenario, RunMode::Lenient, None);
    (verdict.invariant() == Some(invariant)).then_some(effective)
}

fn with_steps(base: &Scenario, steps: Vec<Step>) -> Scenario {
    // The steps' lines, after the header (a config line, and a fleet's fleet line).
    let header = 1 + usize::from(base.fleet.is_some());
    Scenario {
        config: base.config.clone(),
        close_deadline: base.close_deadline,
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(i, s)| (i + header + 1, s))
            .collect(),
        fleet: base.fleet.clone(),
    }
}

/// Removes steps of `current` (which fails `invariant` on `base`) while the scenario still
/// fails it: chunks, halving down to single steps, then neighbouring advances merged.
fn reduce(base: &Scenario, mut current: Vec<Step>, invariant: &str) -> Vec<Step> {
    let mut chunk = current.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        let mut changed = false;
        while i < current.len() {
            let end = (i + chunk).min(current.len());
            let mut candidate = current[..i].to_vec();
            candidate.extend_from_slice(&current[end..]);
            let sc = with_steps(base, candidate.clone());
            if let Some(effective) = fails_same(&sc, invariant) {
                current = effective.iter().map(|k| candidate[*k].clone()).collect();
                changed = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !changed {
            break;
        }
        if !changed {
            chunk = chunk.div_ceil(2);
        }
    }
    // Merge neighbouring advances, and keep the merge only if it still fails the same way.
    let mut merged: Vec<Step> = Vec::new();
    for s in &current {
        match (merged.last_mut(), s) {
            (Some(Step::Advance(a)), Step::Advance(b)) => *a += *b,
            (
                Some(Step::Fleet(FleetStep::Advance {
                    by: a,
                    at_target: first,
                })),
                Step::Fleet(FleetStep::Advance {
                    by: b,
                    at_target: then,
                }),
            ) => {
                // At one instant both counts add up; later, the earlier instant's all happen.
                *first = if b.is_zero() { *first + *then } else { *then };
                *a += *b;
            }
            _ => merged.push(s.clone()),
        }
    }
    if merged.len() < current.len()
        && fails_same(&with_steps(base, merged.clone()), invariant).is_some()
    {
        current = merged;
    }
    current
}

/// Shrinks the failing run of `seed` (run with the application's work in its sandboxes when
/// `operations`).
pub fn shrink_seed(seed: u64, operations: bool) -> Result<Shrunk, ShrinkError> {
    let report = run_seed(
        seed,
        &RunOptions {
            transcript: true,
            operations,
            // As its scenario will: every getter check after every input, so the seed and the
            // scenario stop at the same broken invariant.
            getter_check_every: Some(1),
            ..RunOptions::default()
        },
    );
    let Some(failure) = report.failure else {
        return Err(ShrinkError::Passes(seed));
    };
    let invariant = failure.invariant.clone();
    let steps: Vec<Step> = report
        .transcript
        .iter()
        .filter(|s| !matches!(s, Step::Unspellable(_)))
        .cloned()
        .collect();
    let original_steps = steps.len();
    let base = Scenario {
        config: report.config.clone(),
        close_deadline: report.close_deadline,
        steps: Vec::new(),
        fleet: None,
    };
    let mut current = steps;
    let first = with_steps(&base, current.clone());
    let Some(effective) = fails_same(&first, &invariant) else {
        let got = run_steps(&first, RunMode::Lenient, None).0;
        return Err(ShrinkError::NotReproduced {
            seed,
            invariant,
            got: format!("{got:?}"),
        });
    };
    current = effective.iter().map(|i| current[*i].clone()).collect();
    current = reduce(&base, current, &invariant);
    // The result must fail strictly, too.
    let strict = with_steps(&base, current.clone());
    let verdict = run_steps(&strict, RunMode::Strict, None).0;
    if verdict.invariant() != Some(invariant.as_str()) {
        return Err(ShrinkError::NotReproduced {
            seed,
            invariant,
            got: format!("strict run of the shrunk scenario: {verdict:?}"),
        });
    }
    let mut text = format!(
        "# Shrunk from seed {seed} ({original_steps} steps): fails invariant {invariant}.\n\
         # {}\n",
        failure.detail.replace('\n', " ")
    );
    text.push_str(&config_line(&report.config, report.close_deadline));
    text.push('\n');
    for s in &current {
        text.push_str(&s.to_string());
        text.push('\n');
    }
    Ok(Shrunk {
        invariant,
        original_steps,
        steps: current.len(),
        text,
    })
}

/// Shrinks the failing run of fleet seed `seed` run with `opts` (`explore --replicas N`): its
/// transcript becomes a fleet scenario (every store link `hold`, each answer at the instant the
/// seed had it, what came due in the seed's order), reduced the same way.
pub fn shrink_fleet_seed(seed: u64, opts: FleetOptions) -> Result<Shrunk, ShrinkError> {
    let replicas = opts.replicas;
    let opts = FleetOptions {
        transcript: true,
        trace: false,
        ..opts
    };
    let report = run_fleet_seed(seed, opts);
    let (Some(detail), Some(invariant), Some(transcript)) =
        (report.failure, report.invariant, report.transcript)
    else {
        return Err(ShrinkError::Passes(seed));
    };
    let steps: Vec<Step> = transcript
        .steps
        .into_iter()
        .filter(|s| !matches!(s, Step::Unspellable(_)))
        .collect();
    let original_steps = steps.len();
    let close_deadline = Duration::from_secs(10);
    let base = Scenario {
        config: transcript.config.clone(),
        close_deadline,
        steps: Vec::new(),
        fleet: Some(transcript.spec.clone()),
    };
    let first = with_steps(&base, steps.clone());
    if let Some(path) = std::env::var_os("SIM_DUMP_TRANSCRIPT") {
        let timing = transcript.config.fleet.expect("a fleet's configuration");
        let mut text = config_line(&transcript.config, close_deadline) + "\n";
        text.push_str(&(fleet_line_text(&transcript.spec, &timing) + "\n"));
        for s in &steps {
            text.push_str(&format!("{s}\n"));
        }
        let _ = std::fs::write(path, text);
    }
    let Some(effective) = fails_same(&first, &invariant) else {
        let got = run_steps(&first, RunMode::Lenient, None).0;
        return Err(ShrinkError::NotReproduced {
            seed,
            invariant,
            got: format!("{got:?}"),
        });
    };
    let mut current: Vec<Step> = effective.iter().map(|i| steps[*i].clone()).collect();
    // Merged advances may let more steps go: again, while it shrinks.
    loop {
        let before = current.len();
        current = reduce(&base, current, &invariant);
        if current.len() >= before {
            break;
        }
    }
    // Plain advances read better: kept if every event due at each target may happen.
    let plain: Vec<Step> = current
        .iter()
        .map(|s| match s {
            Step::Fleet(FleetStep::Advance { by, .. }) => Step::Advance(*by),
            other => other.clone(),
        })
        .collect();
    if plain != current && fails_same(&with_steps(&base, plain.clone()), &invariant).is_some() {
        current = plain;
    }
    let strict = with_steps(&base, current.clone());
    let verdict = run_steps(&strict, RunMode::Strict, None).0;
    if verdict.invariant() != Some(invariant.as_str()) {
        return Err(ShrinkError::NotReproduced {
            seed,
            invariant,
            got: format!("strict run of the shrunk scenario: {verdict:?}"),
        });
    }
    let timing = transcript.config.fleet.expect("a fleet's configuration");
    let mut text = format!(
        "# Shrunk from fleet seed {seed} ({replicas} replicas, {original_steps} steps): fails invariant {invariant}.\n\
         # {}\n",
        detail.replace('\n', " ")
    );
    text.push_str(&config_line(&transcript.config, close_deadline));
    text.push('\n');
    text.push_str(&fleet_line_text(&transcript.spec, &timing));
    text.push('\n');
    for s in &current {
        text.push_str(&s.to_string());
        text.push('\n');
    }
    Ok(Shrunk {
        invariant,
        original_steps,
        steps: current.len(),
        text,
    })
}

/// Whether a verdict is a failure of `invariant`.
pub fn is_failure_of(verdict: &Verdict, invariant: &str) -> bool {
    verdict.invariant() == Some(invariant)
}
