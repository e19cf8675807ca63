//! The application's own work on the seeded fault backend, under tokio's paused clock: deaths
//! and hangs in the middle of an operation, and work refused once its sandbox was ordered to
//! stop, through the real keeper.
#![cfg(not(loom))]

use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SandboxState, SessionId};
use sandkeeper_tokio::fault::FaultConfig;
use sandkeeper_tokio::{ExecOptions, FaultBackend, Keeper, KeeperConfig, OpError};

fn keeper(core: Config, faults: FaultConfig) -> Keeper<FaultBackend> {
    Keeper::new(KeeperConfig::with_core(core), FaultBackend::new(7, faults)).unwrap()
}

fn spec(call: &str, session: &str) -> CallSpec {
    CallSpec::new(CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

/// Work lands in the call's own sandbox, and only there.
#[tokio::test(start_paused = true)]
async fn work_lands_in_the_calls_own_sandbox() {
    let k = keeper(Config::default(), FaultConfig::reliable());
    let a = k.acquire(spec("a", "sa")).await.unwrap();
    let b = k.acquire(spec("b", "sb")).await.unwrap();
    a.work().write("who", "a").await.unwrap();
    b.work()
        .exec(["write", "who", "b"], ExecOptions::default())
        .await
        .unwrap();
    let echoed = a
        .work()
        .exec(["echo", "x", "y"], ExecOptions::default())
        .await
        .unwrap();
    assert_eq!(echoed.stdout, b"x y\n");
    assert_eq!(a.work().read("who").await.unwrap(), b"a");
    assert_eq!(k.backend().work_file(a.sandbox(), "who").unwrap(), b"a");
    assert_eq!(k.backend().work_file(b.sandbox(), "who").unwrap(), b"b");
    assert_eq!(k.backend().work_counts(), (4, 0));
    a.release().await;
    b.release().await;
}

/// The sandbox dies while an exec runs: `SandboxGone`, the keeper learns of the death, and the
/// next operation is refused by the keeper before it reaches the backend.
#[tokio::test(start_paused = true)]
async fn an_exec_racing_its_sandboxs_death_is_sandbox_gone() {
    let faults = FaultConfig {
        work_death: 1.0,
        ..FaultConfig::reliable()
    };
    let k = keeper(Config::default(), faults);
    let g = k.acquire(spec("a", "s")).await.unwrap();
    let r = g.work().exec(["echo", "hi"], ExecOptions::default()).await;
    assert!(matches!(r, Err(OpError::SandboxGone { .. })), "{r:?}");
    // The death reached the keeper (from the backend's watch and from the operation).
    tokio::task::yield_now().await;
    assert!(g.is_lost());
    assert!(k
        .sandbox_state(g.sandbox())
        .is_none_or(|s| s == SandboxState::Dead));
    let again = g.work().read("x").await;
    assert!(
        matches!(again, Err(OpError::SandboxGone { .. })),
        "{again:?}"
    );
    assert_eq!(
        k.backend().work_counts(),
        (0, 0),
        "nothing ran in a dead sandbox"
    );
    g.release().await;
}

/// A hung operation ends at its timeout (virtual time), and the sandbox stays usable.
#[tokio::test(start_paused = true)]
async fn a_hung_exec_ends_at_its_timeout() {
    let faults = FaultConfig {
        work_hang: 1.0,
        ..FaultConfig::reliable()
    };
    let k = keeper(Config::default(), faults);
    let g = k.acquire(spec("a", "s")).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let r = g
        .work()
        .exec(
            ["echo", "never"],
            ExecOptions {
                timeout: Some(Duration::from_secs(7)),
                ..ExecOptions::default()
            },
        )
        .await;
    assert_eq!(
        r,
        Err(OpError::Timeout {
            after: Duration::from_secs(7)
        })
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(7));
    assert!(!g.is_lost());
    g.release().await;
}

/// A session's work entered before the release keeps the drain (no Stop reaches the backend),
/// and once the drain deadline passed and Stop was ordered, its next operation is refused by
/// the keeper: it never reaches the backend.
#[tokio::test(start_paused = true)]
async fn session_work_past_the_drain_deadline_is_refused_before_it_runs() {
    let core = Config {
        drain_deadline: Duration::from_secs(2),
        ..Config::default()
    };
    let k = keeper(core, FaultConfig::reliable());
    let s = SessionId::new("s").unwrap();
    let g = k.acquire(spec("a", "s")).await.unwrap();
    let x = g.sandbox();
    let work = k.session_work(&s).unwrap();
    drop(g);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(k.sandbox_state(x), Some(SandboxState::Draining));
    work.write("late-but-in-time", "ok").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!matches!(
        k.sandbox_state(x),
        Some(SandboxState::Draining | SandboxState::Running)
    ));
    let refused = work.write("too-late", "x").await;
    assert!(
        matches!(
            refused,
            Err(OpError::NoActiveSandbox { .. } | OpError::SandboxGone { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        k.backend().work_counts(),
        (1, 0),
        "the refused write never reached it"
    );
    drop(work);
    assert!(
        k.backend().violations().is_empty(),
        "{:?}",
        k.backend().violations()
    );
}
