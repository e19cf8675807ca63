//! Criterion's detail behind the simulator's figures of the performance report
//! (`sim.steps_per_sec`, `sim.seeds_per_sec`): one seed of the default scenario size, run as
//! the figures run it (`tests::perf_sim::run_seed`: default options, invariant checks on every
//! step), with its core inputs as the throughput, so Criterion reports inputs per second.
//!
//! Run: `cargo bench -p tests --bench sim` (or `cargo bench -p tests -- sim`).
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tests::perf_sim::run_seed;

/// The seed measured: the first of the figures' first batch.
const SEED: u64 = 0;

fn one_seed(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim/seed");
    // A seed is deterministic: one run outside the timed loop tells its inputs.
    let inputs = run_seed(SEED);
    group
        .throughput(Throughput::Elements(inputs))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function(BenchmarkId::new("default", SEED), |b| {
        b.iter(|| run_seed(black_box(SEED)))
    });
    group.finish();
}

criterion_group!(benches, one_seed);
criterion_main!(benches);
