//! The performance report: one line per figure, `name value unit`; `--json` writes the same
//! figures as JSON. Every comparison is a ratio of two things measured in the same run,
//! interleaved, over several rounds, median reported.
//!
//! Run: `cargo run --release -p tests --bin perf [-- --json FILE]`.

use std::collections::HashMap;
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Command, Config, Instant, Lifecycle, PathName, Payload, SessionId,
};

/// A wall clock for measuring, which pure code never reads.
#[allow(clippy::disallowed_methods)] // a benchmark measures elapsed wall time: that is its job
fn wall() -> std::time::Instant {
    std::time::Instant::now()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Pre-made names so that neither side of a comparison pays for formatting.
struct Names {
    calls: Vec<CallId>,
    sessions: Vec<SessionId>,
    call_strings: Vec<String>,
    session_strings: Vec<String>,
}

impl Names {
    fn new(calls: usize, sessions: usize) -> Self {
        let call_strings: Vec<String> = (0..calls).map(|i| format!("call-{i}")).collect();
        let session_strings: Vec<String> = (0..sessions).map(|i| format!("hot-{i}")).collect();
        Names {
            calls: call_strings
                .iter()
                .map(|c| CallId::new(c).unwrap())
                .collect(),
            sessions: session_strings
                .iter()
                .map(|s| SessionId::new(s).unwrap())
                .collect(),
            call_strings,
            session_strings,
        }
    }
}

/// One full call through the core: acquire, start ack, flush, upload ack, release (drain),
/// stop ack, shutdown ack, with every output drained.
fn core_cycle(core: &mut Lifecycle, names: &Names, i: usize, t: Instant, log: &PathName) {
    let call = &names.calls[i % names.calls.len()];
    let session = &names.sessions[i % names.sessions.len()];
    core.acquire(t, CallSpec::new(call.clone(), session.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.flush(t, session, log, Payload::default()).unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    core.handle_upload_ok(t, upload).unwrap();
    core.release(t, call).unwrap();
    while let Some(cmd) = core.poll_command() {
        match cmd {
            Command::Stop { sandbox } => core.handle_stop_ok(t, sandbox, None).unwrap(),
            Command::Shutdown { sandbox } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            _ => {}
        }
    }
    while core.poll_event().is_some() {}
}

/// The baseline: the minimum bookkeeping for the same ids with `HashMap`s.
#[derive(Default)]
struct Baseline {
    calls: HashMap<String, (String, u64)>,
    sandboxes: HashMap<u64, (String, u32)>,
    versions: HashMap<(String, String), u64>,
    uploads: HashMap<u64, (String, u64)>,
    next: u64,
}

impl Baseline {
    fn cycle(&mut self, names: &Names, i: usize) {
        let call = &names.call_strings[i % names.call_strings.len()];
        let session = &names.session_strings[i % names.session_strings.len()];
        let sandbox = self.next;
        self.next += 1;
        self.calls.insert(call.clone(), (session.clone(), sandbox));
        self.sandboxes.insert(sandbox, (session.clone(), 1));
        let v = self
            .versions
            .entry((session.clone(), "session.log".to_string()))
            .or_default();
        *v += 1;
        let version = *v;
        self.uploads.insert(sandbox, (session.clone(), version));
        self.uploads.remove(&sandbox);
        let (_, x) = self.calls.remove(call).unwrap();
        if let Some(entry) = self.sandboxes.get_mut(&x) {
            entry.1 -= 1;
        }
        self.sandboxes.remove(&x);
    }
}

fn idle_core(idle_sessions: usize) -> Lifecycle {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let log = PathName::session_log();
    for j in 0..idle_sessions {
        let s = SessionId::new(format!("idle-{j}")).unwrap();
        core.flush(Instant::ZERO, &s, &log, Payload::default())
            .unwrap();
        while core.poll_event().is_some() {}
    }
    core
}

/// Resident memory in bytes, from /proc (Linux).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

struct Report {
    figures: Vec<(String, f64, String)>,
}

impl Report {
    fn add(&mut self, name: &str, value: f64, unit: &str) {
        println!("{name} {value:.3} {unit}");
        self.figures
            .push((name.to_string(), value, unit.to_string()));
    }
}

fn core_figures(report: &mut Report) {
    let names = Names::new(1024, 64);
    let log = PathName::session_log();
    let cycles = 20_000;
    let rounds = 7;
    let mut core = idle_core(0);
    let mut baseline = Baseline::default();
    let mut ours = Vec::new();
    let mut ratio = Vec::new();
    let mut i = 0;
    for _ in 0..rounds {
        let t0 = wall();
        for k in 0..cycles {
            core_cycle(&mut core, &names, i + k, Instant::ZERO, &log);
        }
        let a = t0.elapsed().as_nanos() as f64 / cycles as f64;
        let t1 = wall();
        for k in 0..cycles {
            baseline.cycle(&names, i + k);
        }
        let b = t1.elapsed().as_nanos() as f64 / cycles as f64;
        i += cycles;
        ours.push(a);
        ratio.push(a / b);
    }
    report.add("core.call_cycle_ns", median(ours), "ns");
    report.add("core.call_cycle_vs_hashmap", median(ratio), "x");
    if std::env::var_os("PERF_CORE_CYCLE_ONLY").is_some() {
        return;
    }

    // Scale: the same cycle with 1,000,000 idle session records kept, against 1,000.
    let small = idle_core(1_000);
    let before = resident_bytes();
    let big = idle_core(1_000_000);
    let after = resident_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        report.add(
            "core.bytes_per_idle_session",
            a.saturating_sub(b) as f64 / 999_000.0,
            "bytes",
        );
    }
    let mut cores = [small, big];
    let mut ratios = Vec::new();
    let mut i = 0;
    for _ in 0..rounds {
        let mut per_call = [0.0; 2];
        for (n, core) in cores.iter_mut().enumerate() {
            let t0 = wall();
            for k in 0..cycles {
                core_cycle(core, &names, i + k, Instant::ZERO, &log);
            }
            per_call[n] = t0.elapsed().as_nanos() as f64 / cycles as f64;
        }
        i += cycles;
        ratios.push(per_call[1] / per_call[0]);
    }
    report.add("core.scale_ratio_1m_vs_1k", median(ratios), "x");
    let _ = Duration::ZERO;
}

/// Simulator throughput on one thread: core inputs per second (invariant checks included) and
/// seeds per second for the default scenario size, and the share of coverage marks reached.
fn sim_figures(report: &mut Report) {
    use std::sync::atomic::AtomicU64;
    let opts = sim::run::RunOptions::default();
    let done = AtomicU64::new(0);
    let mut rates = Vec::new();
    let mut seed_rates = Vec::new();
    let mut marks = sim::marks::Marks::default();
    let per_round = 400;
    for round in 0..5 {
        let t0 = wall();
        let batch = sim::batch::run_batch(round * per_round, per_round, 1, &done, false, &opts);
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
    report.add("sim.steps_per_sec", median(rates), "inputs/s");
    report.add("sim.seeds_per_sec", median(seed_rates), "seeds/s");
    let reached = marks.reached().len();
    let total = reached + marks.missing().len();
    report.add(
        "sim.marks_reached",
        reached as f64 / total as f64,
        "share (of 2000 seeds)",
    );
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
    let json = args.iter().position(|a| a == "--json").map(|i| {
        args.get(i + 1)
            .cloned()
            .unwrap_or_else(|| "perf.json".into())
    });
    let mut report = Report {
        figures: Vec::new(),
    };
    core_figures(&mut report);
    tests::perf_tokio::tokio_figures(&mut |name, value, unit| report.add(name, value, unit));
    sim_figures(&mut report);
    loom_figures(&mut report);
    if let Some(path) = json {
        let body: Vec<String> = report
            .figures
            .iter()
            .map(|(n, v, u)| format!("  {{\"name\": \"{n}\", \"value\": {v}, \"unit\": \"{u}\"}}"))
            .collect();
        std::fs::write(&path, format!("[\n{}\n]\n", body.join(",\n"))).expect("write json");
        eprintln!("wrote {path}");
    }
}
