//! Seed batches: a range of seeds over several threads, with the union of marks, totals and
//! every failing seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::failure::Failure;
use crate::marks::Marks;
use crate::run::{run_seed, RunOptions};

/// What a batch found.
#[derive(Clone, Debug, Default)]
pub struct BatchReport {
    /// Seeds run.
    pub seeds: u64,
    /// Steps over all seeds.
    pub steps: u64,
    /// Core inputs over all seeds.
    pub inputs: u64,
    /// Marks reached by any seed.
    pub marks: Marks,
    /// Failing seeds, in seed order.
    pub failures: Vec<(u64, Failure)>,
}

/// Runs seeds `from..from + count` on `jobs` threads. `done` counts finished seeds (for a
/// progress bar). `stop_at_first`: stop handing out seeds once one fails.
pub fn run_batch(
    from: u64,
    count: u64,
    jobs: usize,
    done: &AtomicU64,
    stop_at_first: bool,
    opts: &RunOptions,
) -> BatchReport {
    let next = AtomicU64::new(from);
    let end = from.saturating_add(count);
    let report = Mutex::new(BatchReport::default());
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                let mut local = BatchReport::default();
                loop {
                    if stop_at_first && failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let r = run_seed(seed, opts);
                    local.seeds += 1;
                    local.steps += r.steps as u64;
                    local.inputs += r.inputs;
                    local.marks = local.marks.union(r.marks);
                    if let Some(f) = r.failure {
                        failed.store(true, Ordering::Relaxed);
                        local.failures.push((seed, f));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                let mut all = report.lock().expect("no panics while locked");
                all.seeds += local.seeds;
                all.steps += local.steps;
                all.inputs += local.inputs;
                all.marks = all.marks.union(local.marks);
                all.failures.extend(local.failures);
            });
        }
    });
    let mut report = report.into_inner().expect("no panics while locked");
    report.failures.sort_by_key(|(s, _)| *s);
    report
}
