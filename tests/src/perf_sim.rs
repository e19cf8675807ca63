//! The simulator's workloads of the performance report (issue 6), measured both by
//! `src/bin/perf.rs` (the figures) and by `benches/sim.rs` (Criterion's detail behind them):
//!
//! - [`run_seed`]: one seed of the default scenario size with the default run options (random
//!   phase, liveness phase, invariant checks on every step), on this thread. Its core inputs
//!   per second back `sim.steps_per_sec`; seeds per second back `sim.seeds_per_sec`.
//! - [`sim_figures`] runs batches of such seeds (one thread) and also reports
//!   `sim.marks_reached`, the share of coverage marks the batches hit.

use std::sync::atomic::AtomicU64;

use sim::run::RunOptions;

use crate::measure::{median, wall, Sink};

/// Runs `seed` as the figures do and returns the core inputs it gave. Panics if the simulator
/// finds the seed failing: a figure of a failing run would mean nothing.
pub fn run_seed(seed: u64) -> u64 {
    let report = sim::run::run_seed(seed, &RunOptions::default());
    if let Some(failure) = report.failure {
        panic!("the simulator found seed {seed} failing: {failure:?}");
    }
    report.inputs
}

/// Seeds per round of the figures.
const SEEDS_PER_ROUND: u64 = 400;
/// Rounds (each a fresh range of seeds).
const ROUNDS: u64 = 5;

/// Measures `sim.steps_per_sec` (core inputs per second, invariant checks included) and
/// `sim.seeds_per_sec` on one thread, median over rounds of 400 seeds each, and
/// `sim.marks_reached` over all 2,000 seeds.
pub fn sim_figures(report: Sink) {
    let opts = RunOptions::default();
    let done = AtomicU64::new(0);
    let mut rates = Vec::new();
    let mut seed_rates = Vec::new();
    let mut marks = sim::marks::Marks::default();
    for round in 0..ROUNDS {
        let t0 = wall();
        let batch = sim::batch::run_batch(
            round * SEEDS_PER_ROUND,
            SEEDS_PER_ROUND,
            1,
            &done,
            false,
            &opts,
        );
        let secs = t0.elapsed().as_secs_f64();
        assert!(
            batch.failures.is_empty(),
            "the simulator found a failing seed: {:?}",
            batch.failures.first()
        );
        rates.push(batch.inputs as f64 / secs);
        seed_rates.push(batch.seeds as f64 / secs);
        marks = marks.union(batch.marks);
    }
    report("sim.steps_per_sec", median(rates), "inputs/s");
    report("sim.seeds_per_sec", median(seed_rates), "seeds/s");
    let reached = marks.reached().len();
    let total = reached + marks.missing().len();
    report(
        "sim.marks_reached",
        reached as f64 / total as f64,
        "share (of 2000 seeds)",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_inputs_as_the_batch_the_figures_run() {
        let inputs = run_seed(7);
        assert!(inputs > 0);
        let done = AtomicU64::new(0);
        let batch = sim::batch::run_batch(7, 1, 1, &done, false, &RunOptions::default());
        assert_eq!(batch.inputs, inputs);
    }
}
