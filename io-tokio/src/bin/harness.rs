//! The main job: a realistic agent-harness workload on the embedded local backend.
//!
//! The workload itself is [`sandkeeper_tokio::workload`] (shared with `harness-k8s` in
//! `sandkeeper-k8s`, which runs it on Kubernetes); this binary runs it on [`LocalBackend`],
//! where it also checks the snapshot files and that every sandbox directory was removed.
//!
//! `cargo run --release -p sandkeeper-tokio --bin harness -- --help`
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::workload::{self, WorkloadOptions};
use sandkeeper_tokio::LocalBackend;

/// A harness workload on LocalBackend.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    workload: WorkloadOptions,
    /// Where sandboxes live (default: a fresh directory in the OS temporary directory).
    #[arg(long)]
    root: Option<PathBuf>,
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
    if args.log != "off" {
        let level: tracing::Level = args
            .log
            .parse()
            .map_err(|_| format!("unknown log level {:?}", args.log))?;
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .init();
    }
    let w = &args.workload;
    w.check().map_err(|e| e.to_string())?;
    let local = match &args.root {
        Some(root) => LocalConfig::new(root),
        None => LocalConfig::temp(),
    };
    let root = local.root.clone();
    let backend = LocalBackend::new(local).map_err(|e| format!("{}: {e}", root.display()))?;
    let summary = workload::run(backend, w).await.map_err(|e| e.to_string())?;
    summary.print();
    if summary.ok() {
        Ok(())
    } else {
        Err(format!("{} checks failed", summary.failures.len()))
    }
}
