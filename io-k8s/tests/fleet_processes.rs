//! Fleet mode on Kubernetes across real processes, against the loopback API: a process
//! (`fleet-turn-k8s`) killed with SIGKILL while it holds a session warm leaves the session to
//! the next process, which waits for the killed one's lease (1.5 s) to expire, adopts its claim
//! from the record it wrote while it owned the key, and finds the earlier turn in the
//! workspace. Waits are bounded reads of what the processes print, never fixed sleeps.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn turn(server: &k8s_loopback::Loopback, owner: &str, turn: u32, linger: bool) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-turn-k8s"));
    cmd.args(["--server", &server.url(), "--namespace", NS])
        .args(["--warm-pool", "pool", "--owner", owner, "--session", "s1"])
        .args(["--turn", &turn.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if linger {
        cmd.args(["--linger", "600"]);
    }
    cmd.spawn().expect("fleet-turn-k8s runs")
}

/// The JSON line the turn prints when done (bounded: 60 s).
async fn done(child: &mut Child) -> serde_json::Value {
    let stdout = child.stdout.as_mut().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the turn ends within a minute")
        .unwrap();
    match line {
        Some(line) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}")),
        None => {
            let mut err = String::new();
            if let Some(stderr) = child.stderr.as_mut() {
                let _ = tokio::io::AsyncReadExt::read_to_string(stderr, &mut err).await;
            }
            panic!("the turn printed nothing: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_a_sigkill_of_the_process_that_held_it() {
    let server = server().await;
    let mut first = turn(&server, "first", 1, true);
    let one = done(&mut first).await;
    first.kill().await.unwrap(); // SIGKILL: no close, no release, no last renewal

    let mut second = turn(&server, "second", 2, false);
    let two = done(&mut second).await;
    let status = tokio::time::timeout(Duration::from_secs(60), second.wait())
        .await
        .expect("the second turn ends")
        .unwrap();
    assert!(status.success());
    assert_eq!(two["sandbox"], one["sandbox"], "adopted: {two}");
    assert_eq!(two["adopted"], true, "{two}");
    assert!(
        two["waited_ms"].as_u64().unwrap() >= 500,
        "waited for the lease: {two}"
    );
}
