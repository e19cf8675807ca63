//! The performance report: one line per figure, `name value unit`; `--json` writes the same
//! figures as JSON. Every comparison is a ratio of two things measured in the same run,
//! interleaved, over several rounds, median reported. The workloads live in the library
//! (`tests::perf_core`, `tests::perf_tokio`, `tests::perf_sim`, `tests::perf_k8s`), where the
//! Criterion benches (`cargo bench -p tests`) measure the same code in detail.
//!
//! Run: `cargo run --release -p tests --bin perf [-- --json FILE]
//! [--only core|tokio|sim|k8s|tiers|fleet|local|loom]`.

use tests::{perf_core, perf_fleet, perf_k8s, perf_local, perf_sim, perf_tiers, perf_tokio};

struct Report {
    figures: Vec<(String, f64, String)>,
}

/// A figure's goal (issue #11 and earlier): the value must stay at most, or at least, this.
#[derive(Clone, Copy)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
}

impl Goal {
    fn of(name: &str) -> Option<Goal> {
        Some(match name {
            "core.call_cycle_vs_hashmap" => Goal::AtMost(3.0),
            "core.scale_ratio_1m_vs_1k" => Goal::AtMost(2.0),
            "core.bytes_per_idle_session" => Goal::AtMost(256.0),
            "sim.steps_per_sec" => Goal::AtLeast(1_500_000.0),
            "tokio.acquire_release_vs_channel" => Goal::AtMost(3.0),
            "tokio.hol_release_ratio" => Goal::AtMost(1.5),
            "k8s.writes_per_call_cycle_claims" | "k8s.writes_per_call_cycle_pods" => {
                Goal::AtMost(4.0)
            }
            "k8s.idle_requests_per_min" => Goal::AtMost(0.0),
            "k8s.requests_per_warm_hit_claims" => Goal::AtMost(0.0),
            "tiers.local_suspend_resume_100mb_vs_1mb" => Goal::AtMost(1.5),
            "fleet.store_writes_1000_vs_10_keys" => Goal::AtMost(1.0),
            "local.exec_vs_bare_spawn" => Goal::AtMost(3.0),
            _ => return None,
        })
    }

    fn met(self, value: f64) -> bool {
        match self {
            Goal::AtMost(goal) => value <= goal,
            Goal::AtLeast(goal) => value >= goal,
        }
    }

    fn describe(self) -> String {
        match self {
            Goal::AtMost(goal) => format!("<= {goal}"),
            Goal::AtLeast(goal) => format!(">= {goal}"),
        }
    }
}

impl Report {
    /// Prints `name value unit`, and after a `#` the figure's goal and whether it is met.
    fn add(&mut self, name: &str, value: f64, unit: &str) {
        match Goal::of(name) {
            Some(goal) => {
                let verdict = if goal.met(value) { "met" } else { "missed" };
                println!(
                    "{name} {value:.3} {unit}  # goal {}: {verdict}",
                    goal.describe()
                );
            }
            None => println!("{name} {value:.3} {unit}"),
        }
        self.figures
            .push((name.to_string(), value, unit.to_string()));
    }
}

/// loom iteration counts, read from the log of the CI's loom run (`target/loom-models.log`), as
/// loom models only run in a `--cfg loom` build.
fn loom_figures(report: &mut Report) {
    let log = std::env::var("LOOM_LOG").unwrap_or_else(|_| "target/loom-models.log".into());
    let Ok(text) = std::fs::read_to_string(&log) else {
        eprintln!("loom.iterations: no {log}; run .ci/run's loom step first");
        return;
    };
    for line in text.lines() {
        // "loom model NAME: N iterations (preemption bound ...)"
        let Some(rest) = line.strip_prefix("loom model ") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once(": ") else {
            continue;
        };
        if let Some(n) = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
        {
            report.add(&format!("loom.iterations.{name}"), n, "iterations");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `--cycles SIDE N`: only run cycles, for callgrind (see `perf_core::callgrind_figures`).
    if let Some(i) = args.iter().position(|a| a == "--cycles") {
        let side = args.get(i + 1).map(String::as_str).unwrap_or("core");
        let n = args
            .get(i + 2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(10_000);
        if let Err(e) = perf_core::run_cycles(side, n) {
            eprintln!("perf --cycles: {e}");
            std::process::exit(2);
        }
        return;
    }
    let json = args.iter().position(|a| a == "--json").map(|i| {
        args.get(i + 1)
            .cloned()
            .unwrap_or_else(|| "perf.json".into())
    });
    let mut report = Report {
        figures: Vec::new(),
    };
    let mut add = |name: &str, value: f64, unit: &str| report.add(name, value, unit);
    // `--only PART` (core, tokio, sim, k8s or loom): only that part's figures.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args.get(i + 1).cloned().unwrap_or_default());
    if let Some(part) = &only {
        if ![
            "core", "tokio", "sim", "k8s", "tiers", "fleet", "local", "loom",
        ]
        .contains(&part.as_str())
        {
            eprintln!(
                "perf --only: unknown part {part:?}: core, tokio, sim, k8s, tiers, fleet, local or loom"
            );
            std::process::exit(2);
        }
    }
    let wanted = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if wanted("core") {
        perf_core::core_figures(&mut add);
        perf_core::callgrind_figures(&mut add);
    }
    if wanted("tokio") {
        perf_tokio::tokio_figures(&mut add);
    }
    if wanted("sim") {
        perf_sim::sim_figures(&mut add);
    }
    if wanted("k8s") {
        perf_k8s::k8s_figures(&mut add);
    }
    if wanted("tiers") {
        perf_tiers::tiers_figures(&mut add);
    }
    if wanted("fleet") {
        perf_fleet::fleet_figures(&mut add);
    }
    if wanted("local") {
        perf_local::local_figures(&mut add);
    }
    if wanted("loom") {
        loom_figures(&mut report);
    }
    if let Some(path) = json {
        let body: Vec<String> = report
            .figures
            .iter()
            .map(|(n, v, u)| match Goal::of(n) {
                Some(goal) => format!(
                    "  {{\"name\": \"{n}\", \"value\": {v}, \"unit\": \"{u}\", \"goal\": \"{}\", \"met\": {}}}",
                    goal.describe(),
                    goal.met(*v)
                ),
                None => format!("  {{\"name\": \"{n}\", \"value\": {v}, \"unit\": \"{u}\"}}"),
            })
            .collect();
        std::fs::write(&path, format!("[\n{}\n]\n", body.join(",\n"))).expect("write json");
        eprintln!("wrote {path}");
    }
}
