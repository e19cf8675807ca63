//! Seeds: the committed corpus of once-failing seeds, a default batch (`SIM_SEEDS=N` sets its
//! size, `SIM_SEED=S` runs one seed), determinism, coverage marks and shrinking.

use std::path::Path;
use std::sync::atomic::AtomicU64;

use sim::batch::run_batch;
use sim::run::{run_seed, RunOptions};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Sized to about a minute in debug on two shared cores.
const DEFAULT_SEEDS: u64 = 25_000;

#[test]
fn once_failing_seeds_pass() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/regressions.txt");
    let text = std::fs::read_to_string(path).expect("seed corpus");
    let mut n = 0;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let seed: u64 = line.parse().expect("a seed per line");
        let r = run_seed(seed, &RunOptions::default());
        assert!(r.failure.is_none(), "seed {seed}: {:?}", r.failure);
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}

#[test]
fn seed_batch_passes_and_reaches_every_mark() {
    if let Some(seed) = env_u64("SIM_SEED") {
        let r = run_seed(seed, &RunOptions::default());
        println!("seed {seed}: {}", r.swarm);
        assert!(
            r.failure.is_none(),
            "seed {seed}: {}",
            r.failure.expect("failed")
        );
        return;
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let jobs = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let done = AtomicU64::new(0);
    let report = run_batch(0, seeds, jobs, &done, false, &RunOptions::default());
    println!(
        "{} seeds, {} steps, {} core inputs; marks reached: {}",
        report.seeds,
        report.steps,
        report.inputs,
        report.marks.reached().join(" ")
    );
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|(s, f)| format!("seed {s}: {f}  (replay: cargo run -p sim -- replay --seed {s})"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    if seeds >= DEFAULT_SEEDS {
        assert!(
            report.marks.missing().is_empty(),
            "marks not reached: {:?}",
            report.marks.missing()
        );
    }
}

#[test]
fn same_seed_same_trace_hash() {
    for seed in [0u64, 1, 7, 42, 1234, 99_999] {
        let opts = RunOptions {
            hash: true,
            ..RunOptions::default()
        };
        let a = run_seed(seed, &opts);
        let b = run_seed(seed, &opts);
        assert_eq!(a.hash, b.hash, "seed {seed}");
        assert_eq!(a.steps, b.steps);
        assert!(a.steps > 0);
    }
    let a = run_seed(
        3,
        &RunOptions {
            hash: true,
            ..RunOptions::default()
        },
    );
    let b = run_seed(
        4,
        &RunOptions {
            hash: true,
            ..RunOptions::default()
        },
    );
    assert_ne!(a.hash, b.hash, "different seeds, different runs");
}

#[test]
fn replay_trace_is_json_lines() {
    let r = run_seed(
        11,
        &RunOptions {
            trace: true,
            hash: true,
            ..RunOptions::default()
        },
    );
    assert!(!r.trace.is_empty());
    for line in &r.trace {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        assert!(v.get("step").is_some() && v.get("do").is_some());
    }
}

#[test]
fn the_swarm_varies_the_configuration() {
    let configs: std::collections::BTreeSet<String> = (0..64)
        .map(|s| {
            format!(
                "{:?}/{:?}",
                sim::swarm::Swarm::new(s).config.scope,
                sim::swarm::Swarm::new(s).config.same_key
            )
        })
        .collect();
    assert!(configs.len() >= 8, "{configs:?}");
}

/// The getter checks that look only at what an input touched (with a full look every few
/// inputs) reach the same verdict on the same runs as looking at every call after every input.
#[test]
fn touched_getter_checks_agree_with_full_ones() {
    for seed in 0..40u64 {
        let touched = run_seed(
            seed,
            &RunOptions {
                getter_check_every: Some(8),
                ..RunOptions::default()
            },
        );
        let full = run_seed(
            seed,
            &RunOptions {
                getter_check_every: Some(1),
                ..RunOptions::default()
            },
        );
        assert_eq!(touched.inputs, full.inputs, "seed {seed}");
        assert_eq!(touched.failure, full.failure, "seed {seed}");
    }
}

/// The application also enters its sessions' sandboxes for work (`enter`, `leave`): every
/// check still holds, and a Stop before the drain deadline with work entered fails
/// `drain-waits-for-work` (canary x06 removes that guard of the core).
#[test]
fn seeds_with_operations_pass() {
    let seeds = env_u64("SIM_OPERATION_SEEDS").unwrap_or(3_000);
    let jobs = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let done = AtomicU64::new(0);
    let opts = RunOptions {
        operations: true,
        ..RunOptions::default()
    };
    let report = run_batch(1_000_000, seeds, jobs, &done, false, &opts);
    println!(
        "{} seeds with operations, {} core inputs",
        report.seeds, report.inputs
    );
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|(seed, f)| format!("seed {seed}: {f}"))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}
