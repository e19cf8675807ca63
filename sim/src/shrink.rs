//! Shrinking: a failing seed's transcript becomes a scenario, then steps are removed (delta
//! debugging: chunks, halving) while the scenario still fails the same invariant.

use crate::run::{run_seed, RunOptions};
use crate::scenario::{config_line, run_steps, RunMode, Scenario, Verdict};
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
    Scenario {
        config: base.config.clone(),
        close_deadline: base.close_deadline,
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(i, s)| (i + 2, s))
            .collect(),
        fleet: base.fleet.clone(),
    }
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
    let mut chunk = current.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        let mut changed = false;
        while i < current.len() {
            let end = (i + chunk).min(current.len());
            let mut candidate = current[..i].to_vec();
            candidate.extend_from_slice(&current[end..]);
            let sc = with_steps(&base, candidate.clone());
            if let Some(effective) = fails_same(&sc, &invariant) {
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
            _ => merged.push(s.clone()),
        }
    }
    if merged.len() < current.len()
        && fails_same(&with_steps(&base, merged.clone()), &invariant).is_some()
    {
        current = merged;
    }
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

/// Whether a verdict is a failure of `invariant`.
pub fn is_failure_of(verdict: &Verdict, invariant: &str) -> bool {
    verdict.invariant() == Some(invariant)
}
