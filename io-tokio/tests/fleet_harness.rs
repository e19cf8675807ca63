//! The main job as a fleet of real processes on one local root: two `harness --fleet-root`
//! processes with overlapping users and `--suspend`, one killed with SIGKILL mid-run. The
//! survivor takes over the killed one's keys once its lease expired, and finishes with every
//! check passed; a restart of the killed replica continues from the keys' records; then
//! `harness --verify` checks the whole root: no sandbox changed by two tokens out of order
//! (the backends' token log), every session's last acknowledged log version in its user's
//! recorded snapshot (the killed process's too, from its ledger), nothing leaked, nothing
//! referenced swept. And one paused (SIGSTOP) past its lease while its peer takes its keys:
//! woken, it finds its lease lapsed and fences itself, what it had in flight under the old
//! tokens is refused or dropped, and both finish with every check passed. Real time (the lease
//! is 1.5 s): the waits are bounded polls for what the processes write, never fixed sleeps.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::store::{held_by, not_taken_over};
use sandkeeper_tokio::workload::child::{fleet_row, lines, ran, until, HarnessChild};
use sandkeeper_tokio::workload::Summary;

const LEASE_MS: &str = "1500";

fn harness(root: &Path, replica: &str, calls: usize, ledger: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness"));
    cmd.arg("--fleet-root")
        .arg(root)
        .args(["--replica", replica, "--lease-ms", LEASE_MS])
        .args(["--suspend", "--death-rate", "0", "--quiet"])
        .args(["--sessions", "8", "--users", "4", "--concurrency", "8"])
        .args(["--calls", &calls.to_string(), "--turns", "3"])
        .arg("--ledger")
        .arg(ledger);
    cmd
}

/// `harness --verify` over the root and the ledgers, once every process ended: its report,
/// after it succeeded.
fn verified(root: &Path, ledgers: &[&Path]) -> String {
    let mut verify = Command::new(env!("CARGO_BIN_EXE_harness"));
    verify
        .arg("--fleet-root")
        .arg(root)
        .args(["--lease-ms", LEASE_MS, "--verify"])
        .args(ledgers);
    ran(verify)
}

fn calls_failed(summary: &str) -> u64 {
    Summary::figures_of(summary, "calls").expect("a calls row")["failed"]
}

#[test]
fn a_harness_killed_mid_run_leaves_nothing_lost_to_its_peer_and_its_restart() {
    let root = std::env::temp_dir().join(format!("sk-fleet-harness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let ledger = |name: &str| -> PathBuf { root.join(format!("ledger-{name}.jsonl")) };
    let (la, lb, la2) = (ledger("a"), ledger("b"), ledger("a2"));

    // `a` runs alone until it has been told of 24 uploads: it holds its users' keys. Then `b`
    // joins, wanting the same users' keys, and `a` is killed at once (no close, no release,
    // no last renewal): `b` gets the keys `a` held only when `a`'s lease expires.
    let mut a = HarnessChild::spawn(harness(&root, "a", 60, &la));
    let ia = a.incarnation();
    until("a made no progress", || {
        assert!(
            a.child.try_wait().unwrap().is_none(),
            "a ended before the kill"
        );
        lines(&la) >= 24
    });
    let mut b = HarnessChild::spawn(harness(&root, "b", 20, &lb));
    let ib = b.incarnation();
    assert_ne!(ia, ib);
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    let store = LocalStore::open(&root, Duration::from_millis(1500)).unwrap();
    let held = held_by(&store.entries().unwrap(), ia);

    // The survivor finishes with every check passed and no call failed: its calls on the
    // killed one's keys waited for the lease to expire, then took the keys over.
    let survivor = b.succeeded();
    assert!(survivor.contains("all checks passed"), "{survivor}");
    assert_eq!(calls_failed(&survivor), 0, "{survivor}");
    let row = fleet_row(&survivor);
    assert!(
        row["waits"] > 0,
        "b's claims found the killed process's keys held: {row:?}"
    );
    assert!(row["adopted"] + row["resumed"] > 0, "{row:?}");
    assert!(!held.is_empty(), "the killed process held keys");
    let kept = not_taken_over(&held, &store.entries().unwrap(), ia);
    assert!(
        kept.is_empty(),
        "every key the killed process held ({held:?}) was taken over; not: {kept:?}\n{survivor}"
    );

    // The killed replica restarts (a new incarnation) and continues its users' keys from
    // their records: what the survivor suspended, it resumes.
    let mut a2 = HarnessChild::spawn(harness(&root, "a2", 3, &la2));
    let ia2 = a2.incarnation();
    assert!(ia2 > ia.max(ib));
    let restarted = a2.succeeded();
    assert!(restarted.contains("all checks passed"), "{restarted}");
    let row = fleet_row(&restarted);
    assert!(row["resumed"] + row["adopted"] > 0, "{row:?}");

    // The whole root, once every process ended.
    let report = verified(&root, &[&la, &lb, &la2]);
    // The killed process's sessions were checked from its ledger, and some sandbox was changed
    // under more than one token (the takeover).
    assert!(
        report.contains("a-session-000's last acknowledged"),
        "{report}"
    );
    let figures = report.lines().last().unwrap();
    assert!(!figures.contains(" 0 changed under several"), "{figures}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Sends `signal` (`STOP`, `CONT`) to the process, by the `kill` program (argv only).
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal}");
}

#[test]
fn a_harness_paused_past_its_lease_is_fenced_and_its_peer_keeps_the_keys() {
    let root = std::env::temp_dir().join(format!("sk-fleet-pause-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let (la, lb) = (root.join("ledger-a.jsonl"), root.join("ledger-b.jsonl"));
    let store = LocalStore::open(&root, Duration::from_millis(1500)).unwrap();

    // `a` runs alone until it holds its users' keys, and is stopped (SIGSTOP) mid-run: a pause
    // longer than its lease, with its work in flight.
    let mut a = HarnessChild::spawn(harness(&root, "a", 40, &la));
    let ia = a.incarnation();
    until("a made no progress", || lines(&la) >= 24);
    signal(&a.child, "STOP");
    let held = held_by(&store.entries().unwrap(), ia);
    assert!(!held.is_empty(), "the paused process holds keys");
    // `b` joins and, once the paused lease expired, takes every key `a` held.
    let mut b = HarnessChild::spawn(harness(&root, "b", 20, &lb));
    let ib = b.incarnation();
    until("b never took the paused process's keys", || {
        let taken = held_by(&store.entries().unwrap(), ib);
        held.keys().all(|k| taken.contains_key(k))
    });
    // `a` wakes up after its keys went to `b`: its lease lapsed by its own clock, so it
    // fences itself (fail closed) and any change it still had in flight under its old tokens
    // is refused by the backend; then it claims again and finishes.
    signal(&a.child, "CONT");
    let woken = a.succeeded();
    assert!(woken.contains("all checks passed"), "{woken}");
    let row = fleet_row(&woken);
    assert!(
        row["lease"] >= 1,
        "the paused process saw its lease lapse: {row:?}"
    );
    let survivor = b.succeeded();
    assert!(survivor.contains("all checks passed"), "{survivor}");

    verified(&root, &[&la, &lb]);
    std::fs::remove_dir_all(&root).unwrap();
}
