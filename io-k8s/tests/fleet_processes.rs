//! Fleet mode on Kubernetes across real processes, against the loopback API: a process
//! (`fleet-turn-k8s`) killed with SIGKILL while it holds a session warm leaves the session to
//! the next process, which waits for the killed one's lease (1.5 s) to expire, adopts its claim
//! from the record it wrote while it owned the key, and finds the earlier turn in the
//! workspace; a process stopped (SIGSTOP) past its lease right before its write and continued
//! after two others took the session over changes nothing. Waits are bounded reads of what the
//! processes print, never fixed sleeps (but one bounded poll of a process's state).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn turn(server: &k8s_loopback::Loopback, owner: &str, turn: u32, linger: bool) -> Child {
    turn_with(server, owner, turn, linger, &[])
}

fn turn_with(
    server: &k8s_loopback::Loopback,
    owner: &str,
    turn: u32,
    linger: bool,
    more: &[&str],
) -> Child {
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
    cmd.args(more);
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

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T'))
}

/// A process paused past its lease with its call ready (SIGSTOP right before its write) and
/// continued after two other processes took its session over (each adopting the claim) and
/// acknowledged turn 3 must not change the workspace: its write is refused (by its core's
/// lapse, or by the backend's token checks: `OpError::Fenced`), it exits on that error, and
/// turn 4 finds every acknowledged turn. Which refuses first is a race (its core's lapse
/// timer, or the write's check); with the checks disabled the stale write went through in one
/// run of three here (exit 0), the core's lapse refusing it in the others. `fencing.rs` pins
/// the checks without the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_process_cannot_write_over_its_successors_turns() {
    let server = server().await;
    let mut first = turn(&server, "first", 1, true);
    done(&mut first).await;
    let paused = turn_with(&server, "paused", 2, false, &["--stop-before-write"]);
    let pid = paused.id().expect("running");
    // Bounded poll (3,000 looks 10 ms apart, 30 s): the turn waits out the first process's
    // lease once it is killed; a real process gives nothing else to wait on.
    first.kill().await.unwrap();
    let mut looks = 0;
    while !is_stopped(pid) {
        looks += 1;
        assert!(looks < 3_000, "the turn never stopped itself");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Turn 2 again, by a process that waits out the paused one's lease and adopts its claim;
    // it stays up (warm), then is killed; turn 3 does the same after it.
    let mut two = turn(&server, "second", 2, true);
    done(&mut two).await;
    two.kill().await.unwrap();
    let mut three = turn(&server, "third", 3, true);
    let three_report = done(&mut three).await;
    assert_eq!(three_report["adopted"], true, "{three_report}");
    let status = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = tokio::time::timeout(Duration::from_secs(60), paused.wait_with_output())
        .await
        .expect("the paused turn ends")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("belongs to another process")
            || err.contains("the keeper knows it dead")
            || err.contains("not running here"),
        "{err}"
    );
    three.kill().await.unwrap();
    let mut four = turn(&server, "fourth", 4, false);
    let four_report = done(&mut four).await;
    assert_eq!(four_report["turn"], 4, "{four_report}");
}
