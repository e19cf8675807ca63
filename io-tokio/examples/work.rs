//! The application's own work in a call's sandbox, and in a session's after its call ended:
//! `cargo run -p sandkeeper-tokio --example work`. The README's embedding example; it asserts
//! what it shows.

use std::time::Duration;

use sandkeeper::{CallId, CallSpec, SessionId};
use sandkeeper_tokio::{ExecOptions, Keeper, KeeperConfig, LocalBackend, OpError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keeper = Keeper::new(KeeperConfig::default(), LocalBackend::new_temp()?)?;
    let session = SessionId::new("user-42")?;
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("turn-1")?, session.clone()))
        .await?;

    // A tool runs a command and works with files: in this call's sandbox, nowhere else.
    let work = guard.work();
    let out = work
        .exec(
            [
                "sh",
                "-c",
                "echo 'print(6 * 7)' > calc.py && python3 calc.py || echo 42",
            ],
            ExecOptions {
                timeout: Some(Duration::from_secs(10)),
                ..ExecOptions::default()
            },
        )
        .await?;
    assert!(out.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    work.write("notes/answer.txt", "42\n").await?;
    assert_eq!(work.read("notes/answer.txt").await?, b"42\n");
    // Out of the workspace is refused, not attempted.
    assert!(matches!(
        work.read("../../etc/passwd").await,
        Err(OpError::InvalidPath { .. })
    ));

    // A background writer acts for the session after the turn: it promised a write (a hold)
    // before the call ended, then enters the session's sandbox, which waits for it before it
    // stops. (Dropping the guard releases the call without waiting: awaiting `release` would
    // wait for the held write too.)
    keeper.hold(&session)?;
    drop(guard);
    let later = keeper.session_work(&session)?;
    keeper.unhold(&session)?;
    later.write("memory.md", "likes the number 42\n").await?;
    assert_eq!(later.read("notes/answer.txt").await?, b"42\n");
    drop(later); // the sandbox may stop now
    assert!(matches!(
        keeper.session_work(&session),
        Err(OpError::NoActiveSandbox { .. })
    ));

    let report = keeper.close(Duration::from_secs(5)).await;
    assert!(report.unconfirmed.is_empty(), "{report:?}");
    println!("ran a command and read a file in the call's sandbox; the session's work after it");
    Ok(())
}
