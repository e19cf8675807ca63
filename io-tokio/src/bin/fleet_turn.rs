//! One turn of one session, by one process of a fleet on a local root: the process joins the
//! fleet (`Keeper::fleet` over `LocalBackend` and `LocalStore` on `--root`) and runs
//! [`workload::run_turn`] (the session's workspace holds every earlier turn; it appends its
//! own). Then it
//! closes (the key is released with its record: the workspace kept as a snapshot), or, with
//! `--linger`, stays up with the sandbox warm until it is killed (its key's record, written
//! while it owns the key, lets the next process adopt the sandbox once its lease expires).
//!
//! It prints one JSON line when the turn is done: `{"session", "turn", "sandbox", "adopted",
//! "resumed", "waited_ms"}`, and exits non-zero with the reason on a failed check, after closing
//! its keeper (an error exit is not a crash: what it owns is released with its record). On
//! standard error it logs its incarnation and the key events it sees (claims, fences, ...), one
//! line each, for a test to read after the fact.
//!
//! `--die-at` ends the process with SIGABRT at a chosen instant (no close, no release, no last
//! renewal: as a SIGKILL there would), so that tests can place a crash exactly: `claimed` after
//! the claim and the sandbox's start, before the key's first record write (in the after-start
//! or after-resume hook); `written` after the turn's write returned `Ok`, before the call is
//! released. `--stop-before-write` stops the process (SIGSTOP) with its call ready, right before
//! the turn's write: a test continues it once another process took the session over.
//!
//! `io-tokio/tests/fleet_processes.rs` runs it as separate processes and kills one with SIGKILL.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sandkeeper::{Event, HookPoint, Hooks, SessionId};
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::workload;
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend, Notice};

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
    /// Stay up this many seconds (fractions allowed) after the turn, the sandbox warm, instead
    /// of closing at once.
    #[arg(long)]
    linger: Option<f64>,
    /// The process lease, in milliseconds (renewals every third of it, a fifth as margin).
    #[arg(long, default_value_t = 1_500)]
    lease_ms: u64,
    /// How long the call may wait for the session's key (another process holding it).
    #[arg(long, default_value_t = 30)]
    wait_secs: u64,
    /// Append every token the backend accepts to `<root>/.tokens/accepted.log`.
    #[arg(long)]
    token_log: bool,
    /// Die (SIGABRT: no close, no release) at this instant of the turn.
    #[arg(long, value_enum)]
    die_at: Option<DieAt>,
    /// Stop (SIGSTOP to itself) right before the turn's write, the call ready: a pause a test
    /// ends with SIGCONT, after another process took the session over.
    #[arg(long)]
    stop_before_write: bool,
}

/// Where `--die-at` ends the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DieAt {
    /// The key claimed and the sandbox started (or resumed), before its first record write.
    Claimed,
    /// The turn's write returned `Ok`, before the call's release.
    Written,
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
    let linger = match args.linger {
        Some(secs) => {
            Some(Duration::try_from_secs_f64(secs).map_err(|e| format!("--linger {secs}: {e}"))?)
        }
        None => None,
    };
    let lease = Duration::from_millis(args.lease_ms);
    let mut core = workload::turn_config(lease, Duration::from_secs(args.wait_secs));
    if args.die_at == Some(DieAt::Claimed) {
        core.hooks = Hooks {
            after_start: Some(Duration::from_secs(10)),
            after_resume: Some(Duration::from_secs(10)),
            ..Hooks::default()
        };
    }
    let mut local = LocalConfig::new(&args.root);
    local.token_log = args.token_log;
    let backend = LocalBackend::new(local).map_err(|e| format!("{}: {e}", args.root.display()))?;
    let store = LocalStore::open(&args.root, lease).map_err(|e| e.to_string())?;
    let config = KeeperConfig::with_core(core);
    let keeper = Keeper::fleet_with_hooks(
        config,
        backend,
        store,
        |point: HookPoint, _work| async move {
            eprintln!("fleet-turn: dies in the {} hook", point.as_str());
            std::process::abort()
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    eprintln!("fleet-turn: incarnation {:?}", keeper.incarnation());
    log_events(&keeper);
    let die = || {
        eprintln!("fleet-turn: dies after the write");
        std::process::abort()
    };
    let stop = || workload::stop_self("fleet-turn");
    let points = workload::TurnPoints {
        before_write: args
            .stop_before_write
            .then_some(&stop as &(dyn Fn() + Sync)),
        after_write: (args.die_at == Some(DieAt::Written)).then_some(&die as &(dyn Fn() + Sync)),
    };
    let turn = workload::run_turn_then(&keeper, &session, args.turn, points).await;
    let report = match turn {
        Ok(report) => report,
        Err(e) => {
            // A failed check is an error exit, not a crash: close, so that what this process
            // owns is released with its record.
            keeper.close(Duration::from_secs(10)).await;
            return Err(e);
        }
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    if let Some(linger) = linger {
        tokio::time::sleep(linger).await;
    }
    let report = keeper.close(Duration::from_secs(10)).await;
    if !report.unconfirmed.is_empty() {
        return Err(format!("close left {:?} unconfirmed", report.unconfirmed));
    }
    Ok(())
}

/// Logs the key events the keeper's core reports (a key fenced: a lapse or a refusal), one
/// line each on standard error.
fn log_events(keeper: &Keeper<LocalBackend>) {
    let mut notices = keeper.subscribe();
    tokio::spawn(async move {
        while let Ok(notice) = notices.recv().await {
            if let Notice::Event(event @ Event::KeyFenced { .. }) = notice {
                eprintln!("fleet-turn: event {event:?}");
            }
        }
    });
}
