//! One turn of one session by one process of a fleet on Kubernetes (agent-sandbox mode): the
//! process joins the fleet (`Keeper::fleet` over `K8sBackend::connect_fleet` and `K8sStore` in
//! `--namespace`) and runs `sandkeeper_tokio::workload::run_turn` (the session's workspace
//! holds every earlier turn; it appends its own). Then it closes, or with `--linger` stays up
//! with the sandbox warm until it is killed. It prints the turn's report as one JSON line.
//!
//!     fleet-turn-k8s --server URL --namespace NS --warm-pool POOL --owner NAME \
//!         --session S --turn N [--linger SECS] [--lease-ms MS] [--stop-before-write]
//!
//! `--stop-before-write` stops the process (SIGSTOP) with its call ready, right before the
//! turn's write: a test continues it once other processes took the session over.
//!
//! `io-k8s/tests/fleet_processes.rs` runs it against the loopback API, kills one with SIGKILL,
//! and stops one past its lease.
#![forbid(unsafe_code)]

use std::time::Duration;

use clap::Parser;
use sandkeeper::{Config, SessionId};
use sandkeeper_k8s::{Cluster, K8sBackend, K8sConfig, K8sStore, Mode};
use sandkeeper_tokio::workload;
use sandkeeper_tokio::{Keeper, KeeperConfig};

/// One turn of one session by one fleet process on Kubernetes.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// API server URL spoken to without credentials (the loopback API, `kubectl proxy`).
    #[arg(long)]
    server: String,
    /// The namespace of the fleet's objects and Leases.
    #[arg(long)]
    namespace: String,
    /// The warm pool claims come from.
    #[arg(long)]
    warm_pool: String,
    /// This process's owner name (labels on what it drives).
    #[arg(long)]
    owner: String,
    /// The session.
    #[arg(long)]
    session: String,
    /// This turn's number (1 for the first).
    #[arg(long)]
    turn: u32,
    /// Stay up this many seconds after the turn, the sandbox warm, instead of closing.
    #[arg(long)]
    linger: Option<u64>,
    /// The process lease, in milliseconds.
    #[arg(long, default_value_t = 1_500)]
    lease_ms: u64,
    /// Stop (SIGSTOP to itself) right before the turn's write, the call ready: a pause a test
    /// ends with SIGCONT, after other processes took the session over.
    #[arg(long)]
    stop_before_write: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("fleet-turn-k8s: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let session = SessionId::new(&args.session).map_err(|e| e.to_string())?;
    let lease = Duration::from_millis(args.lease_ms);
    let mut client = kube::Config::new(
        args.server
            .parse()
            .map_err(|e| format!("--server {}: {e}", args.server))?,
    );
    client.default_namespace = args.namespace.clone();
    let client = Cluster::make_client(client).map_err(|e| format!("kube client: {e}"))?;
    let config = K8sConfig::new(
        args.namespace.clone(),
        args.owner.clone(),
        Mode::AgentSandbox {
            warm_pool: args.warm_pool.clone(),
        },
    );
    let cluster = Cluster::new(client, config).map_err(|e| e.to_string())?;
    let backend = K8sBackend::connect_fleet(cluster.clone())
        .await
        .map_err(|e| e.to_string())?;
    let store = K8sStore::new(cluster, lease);
    let core = workload::turn_config(lease, Config::default().wait_timeout);
    let keeper = Keeper::fleet(KeeperConfig::with_core(core), backend, store)
        .await
        .map_err(|e| e.to_string())?;
    let stop = || workload::stop_self("fleet-turn-k8s");
    let points = workload::TurnPoints {
        before_write: args
            .stop_before_write
            .then_some(&stop as &(dyn Fn() + Sync)),
        after_write: None,
    };
    let report = workload::run_turn_then(&keeper, &session, args.turn, points).await?;
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    if let Some(secs) = args.linger {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    keeper.close(Duration::from_secs(10)).await;
    Ok(())
}
