//! The main job: a realistic agent-harness workload on the embedded local backend.
//!
//! The workload itself is [`sandkeeper_tokio::workload`] (shared with `harness-k8s` in
//! `sandkeeper-k8s`, which runs it on Kubernetes); this binary runs it on [`LocalBackend`],
//! where it also checks the snapshot files and that every sandbox directory was removed.
//!
//! With `--fleet-root DIR` the process is one replica of a fleet on the shared root `DIR`
//! (`workload::run_fleet`): run several at once, each with its own `--replica` name, and they
//! contend for the same users' keys; then `harness --fleet-root DIR --verify LEDGER...` checks
//! what only the whole fleet shows (`workload::verify_local_fleet`). `docs/fleet.md`
//! shows two terminals doing it.
//!
//! `cargo run --release -p sandkeeper-tokio --bin harness -- --help`
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::workload::{self, FleetOptions, WorkloadOptions};
use sandkeeper_tokio::LocalBackend;

/// A harness workload on LocalBackend.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    workload: WorkloadOptions,
    /// Where sandboxes live (default: a fresh directory in the OS temporary directory, removed
    /// after a run whose checks all passed unless `--keep` is given).
    #[arg(long, conflicts_with = "fleet_root")]
    root: Option<PathBuf>,
    /// Keep the temporary root after a successful run (a run with `--root`, or one whose checks
    /// failed, always keeps its files).
    #[arg(long, conflicts_with = "fleet_root")]
    keep: bool,
    /// Fleet mode: run as one process of a fleet sharing this root (sandboxes, snapshots, the
    /// fleet's store under `.fleet/`, the token log under `.tokens/`).
    #[arg(long, value_name = "DIR")]
    fleet_root: Option<PathBuf>,
    #[command(flatten)]
    fleet: FleetOptions,
    /// With `--fleet-root`: run no workload; check the root once every process of the fleet
    /// ended, with the ledgers the processes wrote (`--ledger`), and exit non-zero if a check
    /// fails.
    #[arg(long, value_name = "LEDGER", num_args = 0.., requires = "fleet_root")]
    verify: Option<Vec<PathBuf>>,
    /// Log level for tracing output on stderr (off, error, warn, info, debug, trace).
    #[arg(long, default_value = "off")]
    log: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("harness: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    workload::log_to_stderr(&args.log)?;
    let w = &args.workload;
    w.check().map_err(|e| e.to_string())?;
    if let Some(root) = &args.fleet_root {
        return fleet(&args, root).await;
    }
    let local = match &args.root {
        Some(root) => LocalConfig::new(root),
        None => LocalConfig::temp(),
    };
    let root = local.root.clone();
    let backend = LocalBackend::new(local).map_err(|e| format!("{}: {e}", root.display()))?;
    let summary = workload::run(backend, w).await.map_err(|e| e.to_string())?;
    let verdict = verdict(&summary);
    if args.root.is_none() {
        if verdict.is_ok() && !args.keep {
            std::fs::remove_dir_all(&root)
                .map_err(|e| format!("removing {}: {e}", root.display()))?;
            println!(
                "removed {} (--keep keeps it; --root DIR runs there)",
                root.display()
            );
        } else {
            println!("files kept in {}", root.display());
        }
    }
    verdict
}

/// Fleet mode: one replica's run, or the check of the whole fleet's root.
async fn fleet(args: &Args, root: &std::path::Path) -> Result<(), String> {
    args.fleet.check().map_err(|e| e.to_string())?;
    if let Some(ledgers) = &args.verify {
        let verdict = workload::verify_local_fleet(root, args.fleet.lease(), ledgers)
            .map_err(|e| e.to_string())?;
        let failed = verdict.checks.iter().filter(|(ok, _)| !ok).count();
        print!("{}", verdict.report());
        return match failed {
            0 => Ok(()),
            n => Err(format!("{n} fleet checks failed")),
        };
    }
    let local = LocalConfig {
        token_log: true,
        ..LocalConfig::new(root)
    };
    let backend = LocalBackend::new(local).map_err(|e| format!("{}: {e}", root.display()))?;
    let store = LocalStore::open(root, args.fleet.lease()).map_err(|e| e.to_string())?;
    let summary = workload::run_fleet(backend, store, &args.workload, &args.fleet)
        .await
        .map_err(|e| e.to_string())?;
    verdict(&summary)
}

fn verdict(summary: &workload::Summary) -> Result<(), String> {
    summary.print();
    if summary.ok() {
        Ok(())
    } else {
        Err(format!("{} checks failed", summary.failures.len()))
    }
}
