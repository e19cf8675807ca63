//! The simulator's command line: `explore`, `replay`, `shrink`, `run`.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use sim::batch::run_batch;
use sim::run::{run_seed, RunOptions};
use sim::scenario::{parse, run_scenario, Verdict};
use sim::shrink::{shrink_fleet_seed, shrink_seed};
use sim::swarm::Swarm;

/// The deterministic simulator of sandkeeper.
#[derive(Parser)]
#[command(name = "sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs a range of seeds; prints throughput, marks reached and every failing seed.
    Explore {
        /// How many seeds.
        #[arg(long, default_value_t = 1000)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Threads.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Stop at the first failing seed.
        #[arg(long)]
        stop_at_first: bool,
        /// Run the core's full state check after every input while calls plus sandboxes are at
        /// most this many (default 0) ...
        #[arg(long)]
        small_state: Option<usize>,
        /// ... and otherwise every this many inputs (default 16).
        #[arg(long)]
        full_check_every: Option<u64>,
        /// Ask the core about every live call every this many inputs, in between only about
        /// those an input touched (default 1: every call after every input).
        #[arg(long)]
        getter_check_every: Option<u64>,
        /// The application also enters its sessions' sandboxes for work (`enter`, `leave`).
        #[arg(long)]
        operations: bool,
        /// Replicas: with 2 or more, each seed runs a fleet of that many cores over one store
        /// and one backend (`sim::fleet`); 1 is the one-process simulator.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// With `--replicas`: each replica is a host with its own disk, over a shared object
        /// store with faults of its own (`sim/src/fleet/hosts.rs`).
        #[arg(long)]
        hosts: bool,
    },
    /// Reruns one seed and writes its trace (JSON lines).
    Replay {
        /// The seed.
        #[arg(long)]
        seed: u64,
        /// Where to write the trace (default: standard output).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// The seed was run with `--operations`.
        #[arg(long)]
        operations: bool,
    },
    /// Reduces a failing seed to a short scenario failing the same invariant.
    Shrink {
        /// The seed.
        #[arg(long)]
        seed: u64,
        /// Where to write the scenario (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The seed was run with `--operations`.
        #[arg(long)]
        operations: bool,
        /// The seed was run with `--replicas N` (N ≥ 2): shrink its fleet run to a fleet
        /// scenario.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// The seed was run with `--hosts`.
        #[arg(long)]
        hosts: bool,
    },
    /// Runs a scenario file: exit 0 on pass, 1 on failure, 2 when malformed.
    Run {
        /// The `.scn` file.
        file: PathBuf,
        /// Print only the verdict.
        #[arg(long, short)]
        quiet: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Explore {
            seeds,
            from,
            jobs,
            stop_at_first,
            small_state,
            full_check_every,
            getter_check_every,
            operations,
            replicas,
            hosts,
        } => {
            if replicas > 1 {
                return explore_fleet(seeds, from, replicas, hosts, stop_at_first);
            }
            let full_check = match (small_state, full_check_every) {
                (None, None) => None,
                (a, b) => Some((a.unwrap_or(0), b.unwrap_or(16))),
            };
            let opts = RunOptions {
                full_check,
                getter_check_every,
                operations,
                ..RunOptions::default()
            };
            explore(seeds, from, jobs, stop_at_first, &opts)
        }
        Cmd::Replay {
            seed,
            trace,
            operations,
        } => replay(seed, trace, operations),
        Cmd::Shrink {
            seed,
            out,
            operations,
            replicas,
            hosts,
        } => shrink(seed, out, operations, replicas, hosts),
        Cmd::Run { file, quiet } => run_file(file, quiet),
    }
}

// Throughput is measured on the wall clock: this is the driver, not the simulation.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> std::time::Instant {
    std::time::Instant::now()
}

fn explore(seeds: u64, from: u64, jobs: usize, stop_at_first: bool, opts: &RunOptions) -> ExitCode {
    let done = AtomicU64::new(0);
    let bar = ProgressBar::new(seeds);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} seeds {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = wall_clock();
    let report = std::thread::scope(|scope| {
        let (finished, wait) = std::sync::mpsc::channel();
        let counter = &done;
        scope.spawn(move || {
            let report = run_batch(from, seeds, jobs, counter, stop_at_first, opts);
            let _ = finished.send(report);
        });
        // Refresh the bar until the batch reports back (at once when it finishes).
        loop {
            bar.set_position(done.load(Ordering::Relaxed));
            match wait.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(report) => break report,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the batch thread ended without a report")
                }
            }
        }
    });
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "seeds {}..{}: {} run, {} steps, {} core inputs in {:.2}s on {} jobs",
        from,
        from + seeds,
        report.seeds,
        report.steps,
        report.inputs,
        secs,
        jobs
    );
    println!(
        "throughput: {:.0} seeds/s, {:.0} steps/s, {:.0} core inputs/s ({:.0} inputs/s per job)",
        report.seeds as f64 / secs,
        report.steps as f64 / secs,
        report.inputs as f64 / secs,
        report.inputs as f64 / secs / jobs.max(1) as f64
    );
    println!("marks reached: {}", report.marks.reached().join(" "));
    let missing = report.marks.missing();
    if !missing.is_empty() {
        println!("marks missing: {}", missing.join(" "));
    }
    if report.failures.is_empty() {
        println!("no failing seed");
        ExitCode::SUCCESS
    } else {
        for (seed, f) in &report.failures {
            println!("FAIL seed {seed}: {f}");
        }
        println!(
            "{} failing seeds; replay with `sim replay --seed S`, shrink with `sim shrink --seed S`",
            report.failures.len()
        );
        ExitCode::from(1)
    }
}

fn explore_fleet(
    seeds: u64,
    from: u64,
    replicas: usize,
    hosts: bool,
    stop_at_first: bool,
) -> ExitCode {
    let started = wall_clock();
    let (mut inputs, mut steps) = (0, 0);
    let mut marks = std::collections::BTreeSet::new();
    let mut failures = vec![];
    for seed in from..from + seeds {
        let mut opts = sim::fleet::FleetOptions::new(replicas);
        opts.hosts = hosts;
        opts.trace = std::env::var_os("SIM_FLEET_TRACE").is_some();
        // The canary of the backend's fencing, by hand.
        opts.backend_fencing = std::env::var_os("SIM_FLEET_NO_BACKEND_FENCING").is_none();
        // The conservation check, on unless turned off by hand.
        opts.conservation = std::env::var_os("SIM_FLEET_NO_CONSERVATION").is_none();
        let report = sim::fleet::run_fleet_seed(seed, opts);
        inputs += report.inputs;
        steps += report.steps;
        marks.extend(report.marks);
        if let Some(f) = report.failure {
            failures.push((seed, f));
            if stop_at_first {
                break;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let on_hosts = if hosts { " on hosts" } else { "" };
    println!(
        "fleet of {replicas}{on_hosts}, seeds {from}..{}: {steps} steps, {inputs} core inputs in {secs:.2}s ({:.0} inputs/s)",
        from + seeds,
        inputs as f64 / secs
    );
    println!(
        "marks reached: {}",
        marks.iter().copied().collect::<Vec<_>>().join(" ")
    );
    let host_marks = if hosts { sim::fleet::HOST_MARKS } else { &[] };
    let missing: Vec<&str> = (sim::fleet::MARKS.iter())
        .chain(host_marks)
        .copied()
        .filter(|m| !marks.contains(m))
        .collect();
    if !missing.is_empty() {
        println!("marks missing: {}", missing.join(" "));
    }
    if failures.is_empty() {
        println!("no failing seed");
        ExitCode::SUCCESS
    } else {
        for (seed, f) in &failures {
            println!("FAIL seed {seed}: {f}");
        }
        ExitCode::from(1)
    }
}

fn replay(seed: u64, trace: Option<PathBuf>, operations: bool) -> ExitCode {
    println!("seed {seed}: {}", Swarm::new(seed));
    let r = run_seed(
        seed,
        &RunOptions {
            trace: true,
            hash: true,
            operations,
            ..RunOptions::default()
        },
    );
    let text = r.trace.join("\n") + "\n";
    match trace {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("cannot write {}: {e}", path.display());
                return ExitCode::from(2);
            }
            println!(
                "trace: {} lines written to {}",
                r.trace.len(),
                path.display()
            );
        }
        None => {
            let _ = std::io::stdout().write_all(text.as_bytes());
        }
    }
    println!(
        "seed {seed}: {} steps, {} inputs, trace hash {:016x}",
        r.steps, r.inputs, r.hash
    );
    match r.failure {
        None => {
            println!("PASS");
            ExitCode::SUCCESS
        }
        Some(f) => {
            println!("FAIL seed {seed}: {f}");
            ExitCode::from(1)
        }
    }
}

fn shrink(
    seed: u64,
    out: Option<PathBuf>,
    operations: bool,
    replicas: usize,
    hosts: bool,
) -> ExitCode {
    let shrunk = if replicas > 1 {
        println!("seed {seed}: a fleet of {replicas} replicas");
        let mut opts = sim::fleet::FleetOptions::new(replicas);
        opts.hosts = hosts;
        // As `explore` ran it.
        opts.backend_fencing = std::env::var_os("SIM_FLEET_NO_BACKEND_FENCING").is_none();
        opts.conservation = std::env::var_os("SIM_FLEET_NO_CONSERVATION").is_none();
        shrink_fleet_seed(seed, opts)
    } else {
        println!("seed {seed}: {}", Swarm::new(seed));
        shrink_seed(seed, operations)
    };
    match shrunk {
        Ok(s) => {
            println!(
                "shrunk {} steps to {} (invariant {})",
                s.original_steps, s.steps, s.invariant
            );
            match out {
                Some(path) => {
                    if let Err(e) = std::fs::write(&path, &s.text) {
                        eprintln!("cannot write {}: {e}", path.display());
                        return ExitCode::from(2);
                    }
                    println!("written to {}", path.display());
                }
                None => print!("{}", s.text),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

fn run_file(file: PathBuf, quiet: bool) -> ExitCode {
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let scenario = match parse(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: malformed: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let mut print = |line: &str| {
        // A closed pipe (`| head`) is not an error of the scenario.
        let _ = writeln!(std::io::stdout(), "{line}");
    };
    let log: Option<&mut dyn FnMut(&str)> = if quiet { None } else { Some(&mut print) };
    match run_scenario(&scenario, log) {
        Verdict::Pass => {
            println!("PASS {}", file.display());
            ExitCode::SUCCESS
        }
        Verdict::Fail { line, failure } => {
            println!("FAIL {} line {line}: {failure}", file.display());
            ExitCode::from(1)
        }
        Verdict::Misuse { line, message } => {
            eprintln!("{}: malformed: line {line}: {message}", file.display());
            ExitCode::from(2)
        }
    }
}
