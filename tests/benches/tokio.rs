//! Criterion's detail behind the io-tokio figures of the performance report (workloads in
//! `tests::perf_tokio`, the same code `src/bin/perf.rs` measures), each on a current-thread
//! runtime built once, outside the timed loop:
//!
//! - group `tokio/warm`: acquire + release of an already-warm sandbox through the keeper
//!   (`acquire_release`) against a bare mpsc + oneshot round trip (`channel_round_trip`):
//!   `tokio.acquire_release_ns` and `tokio.acquire_release_vs_channel`.
//! - group `tokio/drain`: acquire, optional flush, release with one pending upload
//!   (`pending_upload`) or none (`none`), on the paused clock the `tokio.drain_overhead` figure
//!   uses (the upload's simulated 100 ms passes at once): the wall time is the CPU a drain
//!   costs, which the virtual-time figure cannot show.
//!
//! Run: `cargo bench -p tests --bench tokio` (or `cargo bench -p tests -- tokio`).
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tests::measure::wall;
use tests::perf_tokio::{runtime, ChannelRoundTrip, DrainRelease, WarmSandbox};

fn warm(c: &mut Criterion) {
    let rt = runtime(false);
    let warm = rt.block_on(WarmSandbox::new());
    let channel = rt.block_on(async { ChannelRoundTrip::spawn() });
    let mut group = c.benchmark_group("tokio/warm");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("acquire_release", |b| {
        b.to_async(&rt).iter(|| warm.acquire_release())
    });
    group.bench_function("channel_round_trip", |b| {
        b.to_async(&rt).iter(|| channel.round_trip(black_box(1)))
    });
    group.finish();
    rt.block_on(warm.close());
}

fn drain(c: &mut Criterion) {
    let rt = runtime(true);
    let mut rig = rt.block_on(async { DrainRelease::new(Duration::from_millis(100)) });
    let mut group = c.benchmark_group("tokio/drain");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, pending) in [("pending_upload", true), ("none", false)] {
        group.bench_function(name, |b| {
            // One `block_on` per sample, timing only the releases (the rig is borrowed
            // mutably, which `to_async` cannot lend each iteration).
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let t0 = wall();
                    for _ in 0..iters {
                        black_box(rig.release(black_box(pending)).await);
                    }
                    t0.elapsed()
                })
            })
        });
    }
    group.finish();
    rt.block_on(rig.close());
}

criterion_group!(benches, warm, drain);
criterion_main!(benches);
