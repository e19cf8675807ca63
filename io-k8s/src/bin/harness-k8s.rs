//! The main job on Kubernetes: the io-tokio harness workload
//! ([`sandkeeper_tokio::workload`]) with sandboxes as agent-sandbox claims or plain pods.
//!
//! ```text
//! cargo run --release -p sandkeeper-k8s --bin harness-k8s -- \
//!     --namespace NS (--warm-pool NAME | --pod-template FILE) [--kubeconfig FILE | --server URL]
//! ```
//!
//! The client comes from `--kubeconfig` (its current context), else from the usual inference
//! (`KUBECONFIG`, `~/.kube/config`, in-cluster service account); `--server URL` talks plain
//! HTTP without credentials (the loopback API of the tests, or `kubectl proxy`). Exits
//! non-zero when a check fails; the last check is that no claim or pod of this owner is left.
//!
//! With `--fleet` the process is one replica of a fleet on the namespace
//! (`sandkeeper_k8s::run_fleet_workload`: `K8sBackend::connect_fleet`, the store `K8sStore` on
//! Leases): run several at once, each with its own `--replica` (and `--owner`), and they
//! contend for the same users' keys; `--ledger FILE` keeps what each was told. There is no
//! `--verify`: the fleet's check of the whole namespace needs the workspaces' files, which the
//! API does not give for a suspended claim (see `sandkeeper_k8s::verify_fleet`, which the
//! tests call against the loopback API). `docs/fleet.md` shows two terminals.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use sandkeeper_k8s::{run_fleet_workload, run_workload};
use sandkeeper_k8s::{Cluster, K8sConfig, Mode};
use sandkeeper_tokio::workload::{self, FleetOptions, WorkloadOptions};

/// The sandkeeper harness workload on a Kubernetes cluster.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "The sandkeeper harness workload on a Kubernetes cluster."
)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["warm_pool", "pod_template"])))]
struct Args {
    /// Namespace of every object (claims or pods, the owner's Lease).
    #[arg(long)]
    namespace: String,
    /// agent-sandbox mode: the `SandboxWarmPool` that claims are made against.
    #[arg(long, value_name = "NAME")]
    warm_pool: Option<String>,
    /// Pod mode: a Pod manifest (YAML or JSON) used as the template of every sandbox.
    #[arg(long, value_name = "FILE")]
    pod_template: Option<PathBuf>,
    /// Kubeconfig file (its current context); default: KUBECONFIG, ~/.kube/config, in-cluster.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    kubeconfig: Option<PathBuf>,
    /// API server URL spoken to without credentials (loopback API, `kubectl proxy`).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// This instance's owner name (labels, Lease); default `harness-<pid>`.
    #[arg(long)]
    owner: Option<String>,
    #[command(flatten)]
    workload: WorkloadOptions,
    /// Fleet mode: run as one process of a fleet sharing the namespace (its store on Leases,
    /// tokens on claims or pods); `--replica`, `--lease-ms` and `--ledger` apply.
    #[arg(long)]
    fleet: bool,
    #[command(flatten)]
    fleet_options: FleetOptions,
    /// Log level for tracing output on stderr (off, error, warn, info, debug, trace).
    #[arg(long, default_value = "off")]
    log: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("harness-k8s: {e}");
        std::process::exit(1);
    }
}

fn read_template(path: &PathBuf) -> Result<Pod, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // YAML is a superset of JSON; go through a JSON value (see `sandkeeper_k8s::config`).
    let value: serde_json::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_value(value).map_err(|e| format!("{}: not a Pod: {e}", path.display()))
}

async fn client(args: &Args) -> Result<kube::Client, String> {
    let mut config = if let Some(url) = &args.server {
        kube::Config::new(url.parse().map_err(|e| format!("--server {url}: {e}"))?)
    } else if let Some(path) = &args.kubeconfig {
        let file = kube::config::Kubeconfig::read_from(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        kube::Config::infer()
            .await
            .map_err(|e| format!("no cluster configuration: {e}"))?
    };
    config.default_namespace = args.namespace.clone();
    Cluster::make_client(config).map_err(|e| format!("kube client: {e}"))
}

async fn run(args: Args) -> Result<(), String> {
    workload::log_to_stderr(&args.log)?;
    args.workload.check().map_err(|e| e.to_string())?;
    let mode = match (&args.warm_pool, &args.pod_template) {
        (Some(pool), _) => Mode::AgentSandbox {
            warm_pool: pool.clone(),
        },
        (None, Some(path)) => Mode::Pod {
            template: Box::new(read_template(path)?),
        },
        (None, None) => return Err("--warm-pool or --pod-template is required".into()),
    };
    let owner = args
        .owner
        .clone()
        .unwrap_or_else(|| format!("harness-{}", std::process::id()));
    let config = K8sConfig::new(args.namespace.clone(), owner, mode);
    let cluster = Cluster::new(client(&args).await?, config).map_err(|e| e.to_string())?;
    let summary = if args.fleet {
        run_fleet_workload(cluster, &args.workload, &args.fleet_options).await
    } else {
        run_workload(cluster, &args.workload).await
    }
    .map_err(|e| e.to_string())?;
    summary.print();
    if summary.ok() {
        Ok(())
    } else {
        Err(format!("{} checks failed", summary.failures.len()))
    }
}
