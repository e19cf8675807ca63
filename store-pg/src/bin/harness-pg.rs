//! The main job as one host of a fleet without Kubernetes: the harness workload
//! (`sandkeeper_tokio::workload`) on a `LocalBackend` whose root is this host's own, its
//! persisted snapshots on a shelf in object storage (`--snapshots`), the fleet's leases and
//! records in PostgreSQL (`--store`). Run one per host, each with its own `--root` and
//! `--replica`: their users' keys move between them, a key suspended on one host resuming on
//! another from the shelf. Then `harness-pg --store … --snapshots … --root A --root B --verify
//! LEDGER…` checks the whole fleet (`sandkeeper_pg::hosts::verify_hosts`).
//! `README.md`, "Running a fleet without Kubernetes", shows two hosts on one machine.
//!
//! `cargo run --release -p sandkeeper-pg --bin harness-pg -- --help`
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use sandkeeper::Handover;
use sandkeeper_pg::hosts::{open_shelf, verify_hosts};
use sandkeeper_pg::{
    HostInventory, LocalRootInventory, PgStore, ShelfInventory, StoreTls, Timeouts,
};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::workload::{self, FleetOptions, WorkloadOptions};
use sandkeeper_tokio::LocalBackend;

/// One host of a fleet on PostgreSQL, its snapshots in object storage.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    workload: WorkloadOptions,
    #[command(flatten)]
    fleet: FleetOptions,
    /// The fleet's store: a PostgreSQL URL (`postgres://user@host:port/db`) or key=value
    /// connection string. The schema is made or brought up to date at start.
    #[arg(long, value_name = "URL")]
    store: String,
    /// Speak TLS to the store, trusting the certificates in this PEM file (the server's CA, or
    /// its own certificate); with `sslmode=require` in `--store`, every connection is TLS or
    /// fails. Without it the store's connections are in the clear.
    #[arg(long, value_name = "PEM")]
    store_ca: Option<PathBuf>,
    /// The shelf for persisted snapshots: `s3://bucket/prefix` (endpoint and credentials from
    /// `AWS_*`), `gs://…`, `az://…`, or `file:///dir`.
    #[arg(long, value_name = "URL")]
    snapshots: String,
    /// This host's local root (sandboxes, this host's snapshot copies, the token log). With
    /// `--verify`: each host's root, the option once per host.
    #[arg(long, value_name = "DIR", required = true)]
    root: Vec<PathBuf>,
    /// Run no workload: check the whole fleet once every process ended, with the ledgers the
    /// processes wrote (`--ledger`), and exit non-zero if a check fails.
    #[arg(long, value_name = "LEDGER", num_args = 0..)]
    verify: Option<Vec<PathBuf>>,
    /// Log level for tracing output on stderr (off, error, warn, info, debug, trace).
    #[arg(long, default_value = "off")]
    log: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("harness-pg: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    workload::log_to_stderr(&args.log)?;
    args.workload.check().map_err(|e| e.to_string())?;
    args.fleet.check().map_err(|e| e.to_string())?;
    let config: tokio_postgres::Config = args
        .store
        .parse()
        .map_err(|e| format!("--store {:?}: {e}", args.store))?;
    let shelf = open_shelf(&args.snapshots)?;
    let roots: Vec<Arc<dyn sandkeeper_pg::Inventory>> = args
        .root
        .iter()
        .map(|root| Arc::new(LocalRootInventory::new(root)) as Arc<dyn sandkeeper_pg::Inventory>)
        .collect();
    let inventory = HostInventory::new(roots, ShelfInventory::new(shelf.clone()));
    let tls = match &args.store_ca {
        Some(pem) => {
            let pem =
                std::fs::read(pem).map_err(|e| format!("--store-ca {}: {e}", pem.display()))?;
            StoreTls::trusting_pem(&pem).map_err(|e| format!("--store-ca: {e}"))?
        }
        None => StoreTls::Off,
    };
    let store = PgStore::connect_tls(&config, args.fleet.lease(), Timeouts::default(), tls)
        .await
        .map_err(|e| format!("--store: {e}"))?
        .with_inventory(Arc::new(inventory));

    if let Some(ledgers) = &args.verify {
        let verdict = verify_hosts(&store, &args.root, &shelf, ledgers).await?;
        print!("{}", verdict.report());
        let failed = verdict.checks.iter().filter(|(ok, _)| !ok).count();
        return match failed {
            0 => Ok(()),
            n => Err(format!("{n} fleet checks failed")),
        };
    }
    let [root] = args.root.as_slice() else {
        return Err("a host runs on one --root (several are for --verify)".into());
    };
    let local = LocalConfig {
        token_log: true,
        shelf: Some(shelf),
        ..LocalConfig::new(root)
    };
    let backend = LocalBackend::new(local).map_err(|e| format!("{}: {e}", root.display()))?;
    // Each host's sandboxes are out of the others' reach: a key goes to another host
    // suspended, through the shelf.
    let fleet = FleetOptions {
        handover: Handover::Suspended,
        ..args.fleet.clone()
    };
    let summary = workload::run_fleet(backend, store, &args.workload, &fleet)
        .await
        .map_err(|e| e.to_string())?;
    summary.print();
    if summary.ok() {
        Ok(())
    } else {
        Err(format!("{} checks failed", summary.failures.len()))
    }
}
