//! One turn of one session, by one process of a fleet on a local root: the process joins the
//! fleet (`Keeper::fleet` over `LocalBackend` and `LocalStore` on `--root`) and runs
//! [`workload::run_turn`] (the session's workspace holds every earlier turn; it appends its
//! own). Then it
//! closes (the key is released with its record: the workspace kept as a snapshot), or, with
//! `--linger`, stays up with the sandbox warm until it is killed (its key's record, written
//! while it owns the key, lets the next process adopt the sandbox once its lease expires).
//!
//! It prints one JSON line when the turn is done: `{"session", "turn", "sandbox", "adopted",
//! "resumed", "waited_ms"}`, and exits non-zero with the reason on a failed check.
//!
//! `io-tokio/tests/fleet_processes.rs` runs it as separate processes and kills one with SIGKILL.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sandkeeper::SessionId;
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::workload;
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend};

/// One turn of one session by one fleet process on a local root.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// The fleet's root directory (sandboxes, snapshots, the store under `.fleet/`).
    #[arg(long)]
    root: PathBuf,
    /// The session.
    #[arg(long)]
    session: String,
    /// This turn's number (1 for the first): the workspace must hold turns 1 to turn - 1.
    #[arg(long)]
    turn: u32,
    /// Stay up this many seconds after the turn, the sandbox warm, instead of closing.
    #[arg(long)]
    linger: Option<u64>,
    /// The process lease, in milliseconds (renewals every third of it, a fifth as margin).
    #[arg(long, default_value_t = 1_500)]
    lease_ms: u64,
    /// How long the call may wait for the session's key (another process holding it).
    #[arg(long, default_value_t = 30)]
    wait_secs: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("fleet-turn: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let session = SessionId::new(&args.session).map_err(|e| e.to_string())?;
    let lease = Duration::from_millis(args.lease_ms);
    let core = workload::turn_config(lease, Duration::from_secs(args.wait_secs));
    let backend = LocalBackend::new(LocalConfig::new(&args.root))
        .map_err(|e| format!("{}: {e}", args.root.display()))?;
    let store = LocalStore::open(&args.root, lease).map_err(|e| e.to_string())?;
    let keeper = Keeper::fleet(KeeperConfig::with_core(core), backend, store)
        .await
        .map_err(|e| e.to_string())?;
    let report = workload::run_turn(&keeper, &session, args.turn).await?;
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    if let Some(secs) = args.linger {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    let report = keeper.close(Duration::from_secs(10)).await;
    if !report.unconfirmed.is_empty() {
        return Err(format!("close left {:?} unconfirmed", report.unconfirmed));
    }
    Ok(())
}
