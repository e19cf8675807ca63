//! Fleet mode across real processes on one local root (`fleet_turn`, one turn of a session per
//! process): a process killed with SIGKILL while it holds a session warm leaves the session to
//! the next process, which waits for the killed one's lease to expire, adopts its sandbox from
//! the key's record and finds every earlier turn; a process that closes leaves the workspace as
//! a snapshot, which the next one resumes. Real time: the lease is 1.5 s, and the waits below
//! are bounded polls for what the processes print, never fixed sleeps.
#![cfg(not(loom))]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("sk-fleet-proc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn turn(root: &Path, session: &str, turn: u32, linger: bool) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet_turn"));
    cmd.arg("--root")
        .arg(root)
        .args(["--session", session, "--turn", &turn.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if linger {
        cmd.args(["--linger", "600"]);
    }
    cmd.spawn().expect("fleet_turn runs")
}

/// The JSON line a turn prints when it is done.
fn done(child: &mut Child) -> serde_json::Value {
    let stdout = child.stdout.as_mut().expect("piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    if line.is_empty() {
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        panic!("the turn printed nothing: {err}");
    }
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

fn finished(mut child: Child) -> serde_json::Value {
    let value = done(&mut child);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    value
}

#[test]
fn a_session_survives_a_sigkill_of_the_process_that_held_it() {
    let root = root("sigkill");
    // Turn 1 by a process that then stays up, the sandbox warm, and is killed.
    let mut first = turn(&root, "s1", 1, true);
    let one = done(&mut first);
    first.kill().unwrap(); // SIGKILL: no close, no release, no last renewal
    first.wait().unwrap();

    // Turn 2 by another process: the key is the killed one's until its lease expires; then the
    // record it wrote while it owned the key hands over the warm sandbox.
    let two = finished(turn(&root, "s1", 2, false));
    assert_eq!(two["sandbox"], one["sandbox"], "adopted: {two}");
    assert_eq!(two["adopted"], true, "{two}");
    assert!(
        two["waited_ms"].as_u64().unwrap() >= 500,
        "waited for the lease: {two}"
    );

    // Turn 3 by a third: the second closed, keeping the workspace as a snapshot in the key's
    // record; the third resumes it.
    let three = finished(turn(&root, "s1", 3, false));
    assert_eq!(three["resumed"], true, "{three}");
    assert_ne!(three["sandbox"], one["sandbox"]);

    // Two sessions at once on two processes never share a sandbox, and each keeps its turns.
    let (a, b) = (turn(&root, "s2", 1, false), turn(&root, "s3", 1, false));
    let (a, b) = (finished(a), finished(b));
    assert_ne!(a["sandbox"], b["sandbox"]);
    std::fs::remove_dir_all(&root).unwrap();
}
