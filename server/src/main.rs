//! `sandkeeperd`: serves the E2B sandbox protocol on one address, with sandboxes on the local
//! backend under `--root`, or on Kubernetes (`--kubernetes FILE`).
//!
//! `sandkeeperd --listen 127.0.0.1:3000 --root /var/lib/sandkeeperd --api-key team-a:KEY`
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sandkeeperd::auth::{hash_key, Keys};
use sandkeeperd::hosts::Hosts;
use sandkeeperd::kubernetes::{ApiServer, Kubernetes};
use sandkeeperd::server::{Config, Limits, Server};
use sandkeeperd::tls::Tls;

/// A server speaking the E2B sandbox protocol, sandboxes kept by sandkeeper.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Where to listen (port 0: any free port; the first line printed names it).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// The local backend's root: sandboxes' directories are made under it.
    #[arg(long, conflicts_with = "kubernetes")]
    root: Option<PathBuf>,
    /// Run sandboxes on Kubernetes instead, with this backend configuration (YAML:
    /// io-k8s/deploy/sandkeeper-k8s.example.yaml). The API server: --kubeconfig, --kube-server,
    /// else KUBECONFIG, ~/.kube/config, then the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    kubernetes: Option<PathBuf>,
    /// Paused sandboxes outlive this process: the next sandkeeperd on the same --root takes
    /// them back (the keeper runs in fleet mode on the root's store; docs/server.md). Several
    /// sandkeeperd on one --root with --fleet are replicas: each answers for every sandbox,
    /// forwarding a request to the replica that runs its sandbox. With --kubernetes, several
    /// sandkeeperd on one namespace (each with its own `owner`) are replicas the same way.
    #[arg(long)]
    fleet: bool,
    /// With --fleet: the http://host:port the other replicas reach this one at (default: the
    /// --listen address, 127.0.0.1 for 0.0.0.0).
    #[arg(long, value_name = "URL", requires = "fleet")]
    advertise: Option<String>,
    /// With --fleet: replicas on hosts of their own, each with its own --root, sharing this
    /// PostgreSQL database (`postgres://user@host:port/db`, or a key=value connection string)
    /// for the fleet store and the sandbox table, and the shelf --snapshots names for paused
    /// workspaces (docs/server.md, "Replicas on hosts of their own").
    #[arg(long, value_name = "URL", requires = "fleet")]
    fleet_store: Option<String>,
    /// With --fleet-store: speak TLS to PostgreSQL, trusting the certificates in this PEM file.
    #[arg(long, value_name = "PEM", requires = "fleet_store")]
    fleet_store_ca: Option<PathBuf>,
    /// With --kubernetes: this kubeconfig file (its current context).
    #[arg(
        long,
        value_name = "FILE",
        requires = "kubernetes",
        conflicts_with = "kube_server"
    )]
    kubeconfig: Option<PathBuf>,
    /// With --kubernetes: the API server's URL, spoken to without credentials (`kubectl
    /// proxy`).
    #[arg(long, value_name = "URL", requires = "kubernetes")]
    kube_server: Option<String>,
    /// Keep paused workspaces in this object storage (s3://bucket/prefix, gs://, az://,
    /// file:///dir): with --kubernetes in pod mode, so that pod mode can pause; with
    /// --fleet-store (needed there), the shelf every host's paused workspaces go to.
    #[arg(long, value_name = "URL")]
    snapshots: Option<String>,
    /// An API key, `TEAM:KEY` (hashed at once; prefer --api-keys, since a flag shows in `ps`).
    #[arg(long = "api-key")]
    api_key: Vec<String>,
    /// A file of keys: one `<team> <sha256 hex of the key>` a line (`--hash-key` prints it).
    #[arg(long = "api-keys")]
    api_keys: Option<PathBuf>,
    /// A JSON file of lifecycle hooks: commands run in a sandbox after its start or resume and
    /// before it stops for a pause or a kill (docs/server.md, "Hooks").
    #[arg(long)]
    hooks: Option<PathBuf>,
    /// Print the SHA-256 of a key (for the --api-keys file) and exit.
    #[arg(long = "hash-key")]
    hash_key: Option<String>,
    /// The most bytes of a JSON request body.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// The most bytes of one upload to /files.
    #[arg(long, default_value_t = 100 << 20)]
    max_upload_bytes: usize,
    /// The most bytes of one file downloaded from /files.
    #[arg(long, default_value_t = 100 << 20)]
    max_download_bytes: usize,
    /// The longest timeout a sandbox may be given, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    max_timeout_secs: u64,
    /// Sandboxes one team may have at once.
    #[arg(long, default_value_t = 20)]
    sandboxes_per_team: usize,
    /// Requests a second one team may make, REST and envd together (burst: twice that; 0: no
    /// limit).
    #[arg(long, default_value_t = 0)]
    requests_per_second: u32,
    /// How long a paused sandbox is kept, in seconds: past it, it is killed and its workspace
    /// deleted (0: kept until it is killed).
    #[arg(long, default_value_t = 0)]
    paused_retention_secs: u64,
    /// The longest a command may run, in seconds (a request's timeout may shorten it).
    #[arg(long, default_value_t = 3600)]
    run_timeout_secs: u64,
    /// Serve HTTPS only, with this certificate chain (PEM, the server's certificate first;
    /// needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, RSA or SEC1; needs --tls-cert).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Where commands see their sandbox's workspace, and start (HOME too): an absolute path,
    /// by default E2B's /home/user, where the file API's paths are. Needs bubblewrap (the
    /// server does not start without it); `host` (or an empty value) runs commands at the
    /// workspace's host path under --root instead.
    #[arg(long, value_name = "PATH|host", default_value = "/home/user")]
    workspace_path: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            // Warnings (bubblewrap missing, ...) by default; RUST_LOG=info for every sandbox.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Some(key) = &args.hash_key {
        println!("{}", hex::encode(hash_key(key)));
        return std::process::ExitCode::SUCCESS;
    }
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandkeeperd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut keys = Keys::new();
    for flag in &args.api_key {
        keys.add_flag(flag)?;
    }
    if let Some(file) = &args.api_keys {
        keys.add_file(file)?;
    }
    if keys.is_empty() {
        return Err("no API keys: give --api-key TEAM:KEY or --api-keys FILE".into());
    }
    let hooks = args
        .hooks
        .as_deref()
        .map(sandkeeperd::hooks::HookFile::load)
        .transpose()?;
    // clap made sure the two come together.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Tls::from_pem_files(cert, key)?),
        _ => None,
    };
    let root = match args.root {
        Some(root) => root,
        None => std::env::temp_dir().join(format!("sandkeeperd-{}", std::process::id())),
    };
    if args.fleet_store.is_some() && args.kubernetes.is_some() {
        return Err("--fleet-store is for replicas on hosts of their own (the local backend); on Kubernetes, --fleet replicas share the namespace (its Leases hold the fleet store and the sandbox table)".into());
    }
    let hosts = match (&args.fleet_store, &args.snapshots) {
        (None, Some(_)) if args.kubernetes.is_none() => {
            return Err("--snapshots is for --kubernetes (pod mode) or --fleet-store".into())
        }
        (None, _) => None,
        (Some(_), None) => {
            return Err("--fleet-store needs --snapshots URL: the shelf the hosts' paused workspaces go to, which every host reaches".into())
        }
        (Some(store), Some(shelf)) => Some(Hosts {
            store: store.clone(),
            store_ca: args.fleet_store_ca.clone(),
            shelf: shelf.clone(),
        }),
    };
    let kubernetes = match &args.kubernetes {
        None => None,
        Some(file) => {
            let api = match (args.kubeconfig, args.kube_server) {
                (Some(path), _) => ApiServer::Kubeconfig(path),
                (None, Some(url)) => ApiServer::Url(url),
                (None, None) => ApiServer::Infer,
            };
            Some(Kubernetes::load(file, api, args.snapshots)?)
        }
    };
    let config = Config {
        listen: args.listen,
        root,
        kubernetes,
        fleet: args.fleet,
        advertise: args.advertise,
        hosts,
        keys,
        limits: Limits {
            json_body: args.max_body_bytes,
            upload: args.max_upload_bytes,
            download: args.max_download_bytes,
            max_timeout: Duration::from_secs(args.max_timeout_secs),
            sandboxes_per_team: args.sandboxes_per_team,
            run_timeout: Duration::from_secs(args.run_timeout_secs),
            requests_per_second: args.requests_per_second,
            paused_retention: (args.paused_retention_secs > 0)
                .then(|| Duration::from_secs(args.paused_retention_secs)),
        },
        hooks,
        tls,
        workspace_path: match args.workspace_path.as_str() {
            "" | "host" => None,
            path => Some(PathBuf::from(path)),
        },
    };
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let server = Server::bind(config).await?;
    println!("sandkeeperd listening on {scheme}://{}", server.addr()?);
    server.serve(shutdown()).await?;
    Ok(())
}

/// Resolves at Ctrl-C or SIGTERM.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
