//! Criterion's detail behind the core's figures of the performance report (workloads in
//! `tests::perf_core`, the same code `src/bin/perf.rs` measures):
//!
//! - group `core/call_cycle`: one full call through the core (`sandkeeper`) against the
//!   `HashMap` baseline doing the minimum bookkeeping for the same ids (`hashmap_baseline`):
//!   `core.call_cycle_ns` and `core.call_cycle_vs_hashmap`.
//! - group `core/idle_sessions`: the same call on a core holding 1,000 and 1,000,000 idle
//!   session records: `core.scale_ratio_1m_vs_1k`. Each core is built once, when its benchmark
//!   first runs (not at all when a filter skips it), outside the timed loop.
//!
//! Run: `cargo bench -p tests --bench core` (or `cargo bench -p tests -- core`).
#![forbid(unsafe_code)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sandkeeper::Lifecycle;
use tests::perf_core::{idle_core, CallCycle, HashMapBaseline};

fn call_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("core/call_cycle");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut core = idle_core(0);
    let mut cycle = CallCycle::new();
    group.bench_function("sandkeeper", |b| b.iter(|| cycle.run(&mut core)));
    let mut baseline = HashMapBaseline::new();
    group.bench_function("hashmap_baseline", |b| b.iter(|| baseline.run()));
    group.finish();
}

fn idle_sessions(c: &mut Criterion) {
    let mut group = c.benchmark_group("core/idle_sessions");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for idle in [1_000, 1_000_000] {
        // Built once, on the benchmark's first call (so not at all when a filter skips it),
        // outside every timed loop: the 1M core takes seconds to build.
        let mut built: Option<(Lifecycle, CallCycle)> = None;
        group.bench_function(BenchmarkId::new("call_cycle", idle), |b| {
            let (core, cycle) = built.get_or_insert_with(|| (idle_core(idle), CallCycle::new()));
            b.iter(|| cycle.run(core))
        });
    }
    group.finish();
}

criterion_group!(benches, call_cycle, idle_sessions);
criterion_main!(benches);
