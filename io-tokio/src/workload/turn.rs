//! One turn of one session by one process of a fleet: what the `fleet_turn` binaries (local,
//! Kubernetes) run, so that tests can kill a process mid-session and check what the next one
//! finds. The turn acquires a call for the session, checks that the session's workspace holds
//! every earlier turn (`turns.txt`, one line per turn), appends its own, flushes the session
//! log and releases the call.

use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, Fleet, PathName, ReleasePolicy, Scope, SessionId};
use serde::Serialize;

use crate::ops::{OpError, SandboxOps};
use crate::Keeper;

/// What one turn did, printed as one JSON line by the binaries.
#[derive(Clone, Debug, Serialize)]
pub struct TurnReport {
    /// The session.
    pub session: String,
    /// The turn's number.
    pub turn: u32,
    /// The sandbox the call ran in.
    pub sandbox: u64,
    /// The keeper adopted a sandbox another process handed over (or left when it crashed).
    pub adopted: bool,
    /// The keeper resumed the session's snapshot into a new sandbox.
    pub resumed: bool,
    /// How long the call waited for the session's key (another process holding it).
    pub waited_ms: u64,
}

/// The fleet timing the binaries use for a `lease`: renewals every third of it, a fifth as
/// margin, claims retried every tenth.
pub fn fleet_timing(lease: Duration) -> Fleet {
    Fleet {
        incarnation: 1, // the store hands out the real one
        lease,
        renew_every: lease / 3,
        margin: lease / 5,
        claim_retry: lease / 10,
        ..Fleet::default()
    }
}

/// The core's configuration of a turn's process: one sandbox per session, kept warm between
/// turns (an hour), calls waiting at most `wait` for the session's key, the fleet's timing for
/// `lease` ([`fleet_timing`]).
pub fn turn_config(lease: Duration, wait: Duration) -> Config {
    Config {
        scope: Scope::Session,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(3_600),
        },
        wait_timeout: wait,
        fleet: Some(fleet_timing(lease)),
        ..Config::default()
    }
}

/// Runs turn `turn` (from 1) of `session` on `keeper`. Errors say which check failed.
pub async fn run_turn<B: SandboxOps>(
    keeper: &Keeper<B>,
    session: &SessionId,
    turn: u32,
) -> Result<TurnReport, String> {
    run_turn_then(keeper, session, turn, TurnPoints::default()).await
}

/// Where [`run_turn_then`] calls a test's code: to place a crash or a pause at an exact
/// instant of a turn.
#[derive(Clone, Copy, Default)]
pub struct TurnPoints<'a> {
    /// Once the call is ready and the workspace checked, right before the turn's write.
    pub before_write: Option<&'a (dyn Fn() + Sync)>,
    /// Once the turn's write returned `Ok`, before the call is released.
    pub after_write: Option<&'a (dyn Fn() + Sync)>,
}

/// [`run_turn`], calling `points` at their instants.
pub async fn run_turn_then<B: SandboxOps>(
    keeper: &Keeper<B>,
    session: &SessionId,
    turn: u32,
    points: TurnPoints<'_>,
) -> Result<TurnReport, String> {
    if turn == 0 {
        return Err("turns count from 1".into());
    }
    let started = tokio::time::Instant::now();
    let call = CallId::new(format!("turn-{turn}")).map_err(|e| e.to_string())?;
    let guard = keeper
        .acquire(CallSpec::new(call, session.clone()))
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    let waited = started.elapsed();
    let sandbox = guard.sandbox();
    let work = guard.work();
    let earlier = match work.read("turns.txt").await {
        Ok(bytes) => String::from_utf8(bytes).map_err(|e| e.to_string())?,
        Err(OpError::NotFound { .. }) => String::new(),
        Err(e) => return Err(format!("read turns.txt: {e}")),
    };
    let expected: String = (1..turn).map(|t| format!("turn {t}\n")).collect();
    if earlier != expected {
        return Err(format!(
            "the workspace of {session} holds {earlier:?}, expected {expected:?}"
        ));
    }
    let now = format!("{expected}turn {turn}\n");
    if let Some(before_write) = points.before_write {
        before_write();
    }
    work.write("turns.txt", now.clone().into_bytes())
        .await
        .map_err(|e| format!("write turns.txt: {e}"))?;
    if let Some(after_write) = points.after_write {
        after_write();
    }
    keeper
        .flush(session, &PathName::session_log(), now.into_bytes())
        .map_err(|e| e.to_string())?;
    guard.release().await;
    let stats = keeper.stats();
    Ok(TurnReport {
        session: session.as_str().to_string(),
        turn,
        sandbox: sandbox.0,
        adopted: stats.adoptions_ordered > 0,
        resumed: stats.starts_ordered > 0 && turn > 1 && stats.adoptions_ordered == 0,
        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
    })
}

/// Sends SIGSTOP to this process (with `kill`: `forbid(unsafe_code)` leaves no direct
/// syscall) and returns once it was continued: a test's pause at an exact instant of a turn
/// ([`TurnPoints`]). `who` names the binary in what it prints; a failure to stop exits 2.
pub fn stop_self(who: &str) {
    eprintln!("{who}: stops before the write");
    let pid = std::process::id().to_string();
    match std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
    {
        Ok(status) if status.success() => {}
        other => {
            eprintln!("{who}: could not stop itself: {other:?}");
            std::process::exit(2);
        }
    }
}
