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
    let extra: &[&str] = if linger { &["--linger", "600"] } else { &[] };
    turn_with(root, session, turn, extra)
}

fn turn_with(root: &Path, session: &str, turn: u32, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fleet_turn"))
        .arg("--root")
        .arg(root)
        .args(["--session", session, "--turn", &turn.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fleet_turn runs")
}

/// A turn that must fail: its exit status and what it said on standard error.
fn failed(child: Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "expected a failure");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The JSON line a turn prints when it is done (bounded: a minute; a turn that hangs is
/// killed, and the test fails with what it said).
fn done(child: &mut Child) -> serde_json::Value {
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = child.kill();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        panic!("the turn printed nothing in a minute: {err}");
    };
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

/// A turn whose check fails exits non-zero, after closing its keeper: the session's history is
/// still there for the next turn. (`fleet_turn` used to exit without closing, which, while a
/// claim took the key's record from the store, left the next turn an empty workspace; the next
/// test places that crash exactly.)
#[test]
fn a_turn_that_fails_its_check_loses_no_earlier_turn() {
    let root = root("failed-check");
    finished(turn(&root, "s1", 1, false));
    finished(turn(&root, "s1", 2, false));
    let (status, err) = failed(turn(&root, "s1", 2, false));
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("holds \"turn 1\\nturn 2\\n\""), "{err}");
    let three = finished(turn(&root, "s1", 3, false));
    assert_eq!(three["turn"], 3, "{three}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// A process that dies right after its claim (the key claimed, the snapshot resumed, the
/// sandbox's hook running: before its first record write) leaves the key's record as it found
/// it, and the next process continues from the workspace it resumed. Before the fix the claim
/// had taken the record, so the next process started an empty workspace: the check of the
/// turn after it failed every time.
#[test]
fn a_process_that_dies_right_after_its_claim_loses_nothing() {
    let root = root("die-claimed");
    finished(turn(&root, "s1", 1, false));
    let (status, err) = failed(turn_with(&root, "s1", 2, &["--die-at", "claimed"]));
    assert!(
        status.code().is_none(),
        "killed by a signal: {status:?} {err}"
    );
    assert!(err.contains("dies in the after-resume hook"), "{err}");
    // The dead process's lease (1.5 s) must expire first: the turn waits for it.
    let two = finished(turn(&root, "s1", 2, false));
    assert!(
        two["waited_ms"].as_u64().unwrap() >= 500,
        "waited for the lease: {two}"
    );
    finished(turn(&root, "s1", 3, false));
    std::fs::remove_dir_all(&root).unwrap();
}

/// A write that returned `Ok` is acknowledged: a process that dies right after it (before the
/// call's release, whatever its record write did) leaves it to the next process.
#[test]
fn a_write_acknowledged_before_a_crash_is_kept() {
    let root = root("die-written");
    finished(turn(&root, "s1", 1, false));
    let (status, err) = failed(turn_with(&root, "s1", 2, &["--die-at", "written"]));
    assert!(
        status.code().is_none(),
        "killed by a signal: {status:?} {err}"
    );
    let three = finished(turn(&root, "s1", 3, false));
    assert_eq!(three["turn"], 3, "{three}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T'))
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// A process paused past its lease with its call ready (SIGSTOP right before its write) and
/// continued after two other processes took its session over and acknowledged a newer turn
/// must not change the workspace: its write is refused (by its core's lapse, or at the backend,
/// `OpError::Fenced`, checked under the key's token lock), it exits on that error, and the next
/// turn finds every acknowledged turn. Without the backend's check, the stale write replaced
/// turn 3's file whenever it ran before the lapse: turn 4 found `turn 1\nturn 2\n`.
#[test]
fn a_paused_process_cannot_write_over_its_successors_turns() {
    let root = root("paused-write");
    finished(turn(&root, "s1", 1, false));
    let paused = turn_with(&root, "s1", 2, &["--stop-before-write"]);
    let pid = paused.id();
    // Bounded poll (3,000 looks 10 ms apart, 30 s): the turn resumes turn 1's snapshot first,
    // well under a second here; a real process gives nothing else to wait on.
    let mut looks = 0;
    while !is_stopped(pid) {
        looks += 1;
        assert!(looks < 3_000, "the turn never stopped itself");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Turn 2 again, by a process that waits out the paused one's lease and adopts its sandbox;
    // it stays up (warm), then is killed; turn 3 does the same after it.
    let mut two = turn(&root, "s1", 2, true);
    done(&mut two);
    two.kill().unwrap();
    two.wait().unwrap();
    let mut three = turn(&root, "s1", 3, true);
    let three_report = done(&mut three);
    assert_eq!(three_report["adopted"], true, "{three_report}");
    // The paused process goes on with its write: refused, by its own core (which lets the
    // lapsed lease fence the key first, when its timer runs before the write's check: the
    // sandbox is gone for it, or already relinquished at its backend) or by the backend's
    // token check (when the write's check runs first: the race the check is for; `fencing.rs`
    // pins it without the race).
    signal(pid, "-CONT");
    let (status, err) = failed(paused);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("belongs to another process")
            || err.contains("the keeper knows it dead")
            || err.contains("not running here"),
        "{err}"
    );
    three.kill().unwrap();
    three.wait().unwrap();
    let four = finished(turn(&root, "s1", 4, false));
    assert_eq!(four["turn"], 4, "{four}");
    std::fs::remove_dir_all(&root).unwrap();
}
