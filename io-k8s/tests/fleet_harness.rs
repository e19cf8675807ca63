//! The main job as a fleet of real processes on one namespace of the loopback API: two
//! `harness-k8s --fleet` processes with overlapping users and `--suspend`, one killed with
//! SIGKILL mid-run. The survivor takes over the killed one's keys once its lease expired and
//! finishes with every check passed and no failed call; a restart of the killed replica (a new
//! replica name) continues from the keys' records; then `sandkeeper_k8s::verify_fleet` checks
//! the namespace (no live owner, every recorded object there, nothing leaked after a sweep,
//! every session's last acknowledged log version in its user's recorded sandbox, read from the
//! pods' host directories) and the test checks the loopback's audit log of the token
//! annotation: no claim or pod was changed by two tokens out of order.
//!
//! A second test pauses one process (SIGSTOP) past its lease while its peer takes its keys, then
//! wakes it: it fences itself and both finish with every check passed.
//!
//! The order of events makes the takeover deterministic (as in io-tokio's
//! `tests/fleet_harness.rs`): `a` runs alone until its ledger shows it holds its users' keys,
//! `b` joins and registers (it prints its incarnation), and only then is `a` killed, so `b`'s
//! first claims find `a`'s keys held and wait for `a`'s lease (1.5 s) to expire. Real time:
//! the waits are bounded polls for what the processes print or write, never fixed sleeps.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_loopback::{AnnotationWrite, Loopback};
use sandkeeper_k8s::{verify_fleet, K8sStore};
use sandkeeper_tokio::store::{held_by, not_taken_over};
use sandkeeper_tokio::workload::Summary;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const LEASE_MS: u64 = 1500;
/// The annotation of the newest token a claim or pod has seen (io-k8s `fence.rs`).
const TOKEN: &str = "sandkeeper.sandbox.users.io/token";

fn harness(server: &Loopback, replica: &str, calls: usize, ledger: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness-k8s"));
    cmd.args(["--server", &server.url(), "--namespace", NS])
        .args(["--warm-pool", "pool", "--owner", replica, "--fleet"])
        .args(["--replica", replica, "--lease-ms", &LEASE_MS.to_string()])
        .args(["--suspend", "--death-rate", "0", "--quiet"])
        .args(["--sessions", "8", "--users", "4", "--concurrency", "8"])
        .args(["--calls", &calls.to_string(), "--turns", "3"])
        .arg("--ledger")
        .arg(ledger)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A harness process, its standard output read line by line, its standard error read to the
/// end on a task of its own (so that it never fills the pipe).
struct Proc {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    err: tokio::task::JoinHandle<String>,
}

fn spawn(mut cmd: Command) -> Proc {
    let mut child = cmd.spawn().expect("harness-k8s runs");
    let out = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut stderr = child.stderr.take().expect("piped");
    let err = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    Proc { child, out, err }
}

impl Proc {
    /// The incarnation the process prints first (bounded: 60 s).
    async fn incarnation(&mut self) -> u32 {
        let line = tokio::time::timeout(Duration::from_secs(60), self.out.next_line())
            .await
            .expect("the incarnation line within a minute")
            .unwrap()
            .unwrap_or_default();
        line.trim()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no incarnation line: {line:?}"))
    }

    /// The rest of its output, once it exited successfully (bounded: 5 minutes).
    async fn succeeded(mut self) -> String {
        let run = async {
            let mut stdout = String::new();
            while let Some(line) = self.out.next_line().await.unwrap() {
                stdout.push_str(&line);
                stdout.push('\n');
            }
            let status = self.child.wait().await.unwrap();
            let stderr = self.err.await.unwrap();
            (stdout, stderr, status)
        };
        let (stdout, stderr, status) = tokio::time::timeout(Duration::from_secs(300), run)
            .await
            .expect("the process ends within five minutes");
        assert!(status.success(), "{stdout}\n{stderr}");
        stdout
    }
}

/// Polls `done` every 5 ms until it holds, panicking with `what` after two minutes (24,000
/// polls): real processes, real time, so a bounded poll for what they write, never a fixed
/// sleep.
async fn poll<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..24_000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// The numbers of the printed summary's "fleet" row.
fn fleet_row(summary: &str) -> BTreeMap<String, u64> {
    Summary::figures_of(summary, "fleet").unwrap_or_else(|| panic!("no fleet row: {summary}"))
}

fn calls_failed(summary: &str) -> u64 {
    Summary::figures_of(summary, "calls").expect("a calls row")["failed"]
}

/// What the audit log of the token annotation says of the sandboxes' objects (claims and
/// pods): the writes that lowered an object's token (each a change by a token older than one
/// it had already seen), and how many objects were changed under more than one token.
fn token_order(audit: &[AnnotationWrite]) -> (Vec<String>, usize) {
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut tokens: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out_of_order = Vec::new();
    for w in audit {
        if w.annotation != TOKEN || !matches!(w.resource, "sandboxclaims" | "pods") {
            continue;
        }
        let Ok(token) = w.value.parse::<u64>() else {
            out_of_order.push(format!("{} {}: token {:?}", w.resource, w.name, w.value));
            continue;
        };
        let seen = newest.entry(&w.uid).or_insert(0);
        if token < *seen {
            out_of_order.push(format!(
                "{} {} at rv {}: token {token} after {seen}",
                w.resource, w.name, w.rv
            ));
        }
        *seen = (*seen).max(token);
        *tokens.entry(&w.uid).or_default() += 1;
    }
    let several = tokens.values().filter(|n| **n > 1).count();
    (out_of_order, several)
}

#[test]
fn the_token_order_check_finds_a_token_lowered() {
    let write = |rv, uid: &str, value: &str| AnnotationWrite {
        rv,
        resource: "sandboxclaims",
        namespace: NS.into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
        annotation: TOKEN.into(),
        previous: None,
        value: value.into(),
    };
    let ordered = [
        write(1, "u1", "1"),
        write(2, "u1", "3"),
        write(3, "u2", "2"),
    ];
    assert_eq!(token_order(&ordered), (vec![], 1));
    let lowered = [
        write(1, "u1", "3"),
        write(2, "u2", "1"),
        write(3, "u1", "2"),
    ];
    let (found, _) = token_order(&lowered);
    assert_eq!(
        found,
        vec!["sandboxclaims claim-u1 at rv 3: token 2 after 3"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_killed_mid_run_leaves_nothing_lost_to_its_peer_and_its_restart() {
    let server = server().await;
    server.store().audit_annotation(TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let ledger = |name: &str| -> PathBuf { dir.path().join(format!("ledger-{name}.jsonl")) };
    let (la, lb, la2) = (ledger("a"), ledger("b"), ledger("a2"));
    let store = K8sStore::new(
        cluster(&server, claim_config("verifier")),
        Duration::from_millis(LEASE_MS),
    );

    // `a` runs alone until it has been told of 24 uploads: it holds its users' keys. Then `b`
    // joins, wanting the same users' keys, and `a` is killed at once (no close, no release,
    // no last renewal): `b` gets the keys `a` held only when `a`'s lease expires.
    let mut a = spawn(harness(&server, "a", 60, &la));
    let ia = a.incarnation().await;
    poll("a made progress", || {
        assert!(
            a.child.try_wait().unwrap().is_none(),
            "a ended before the kill"
        );
        std::future::ready(lines(&la) >= 24)
    })
    .await;
    let mut b = spawn(harness(&server, "b", 6, &lb));
    let ib = b.incarnation().await;
    assert_ne!(ia, ib);
    a.child.kill().await.unwrap(); // SIGKILL, and waited for
    let held = held_by(&store.entries().await.unwrap(), ia);

    // The survivor finishes with every check passed and no call failed: its calls on the
    // killed one's keys waited for the lease to expire, then took the keys over.
    let survivor = b.succeeded().await;
    assert!(survivor.contains("all checks passed"), "{survivor}");
    assert_eq!(calls_failed(&survivor), 0, "{survivor}");
    let row = fleet_row(&survivor);
    assert!(
        row["waits"] > 0,
        "b's claims found the killed process's keys held: {row:?}"
    );
    assert!(row["adopted"] + row["resumed"] > 0, "{row:?}");
    assert!(!held.is_empty(), "the killed process held keys");
    let kept = not_taken_over(&held, &store.entries().await.unwrap(), ia);
    assert!(
        kept.is_empty(),
        "every key the killed process held ({held:?}) was taken over; not: {kept:?}\n{survivor}"
    );

    // The killed replica restarts (a new incarnation, a new replica name) and continues its
    // users' keys from their records: what the survivor suspended, it resumes.
    let mut a2 = spawn(harness(&server, "a2", 3, &la2));
    let ia2 = a2.incarnation().await;
    assert!(ia2 > ia.max(ib));
    let restarted = a2.succeeded().await;
    assert!(restarted.contains("all checks passed"), "{restarted}");
    let row = fleet_row(&restarted);
    assert!(row["resumed"] + row["adopted"] > 0, "{row:?}");

    // The whole namespace, once every process ended (some claims changed under more than
    // one token: the takeover and the restart).
    let report = verified(&server, &store, &[la, lb, la2]).await;
    // The killed process's sessions were checked from its ledger.
    assert!(
        report.contains("a-session-000's last acknowledged"),
        "{report}"
    );
}

/// The fleet's checks of the namespace once every process ended: `verify_fleet` (reading the
/// pods' host directories) passes, and the loopback's audit log of the token annotation shows
/// no claim or pod changed by two tokens out of order and some changed under more than one.
/// Returns the verdict's report.
async fn verified(server: &Loopback, store: &K8sStore, ledgers: &[PathBuf]) -> String {
    let verdict = verify_fleet(store, ledgers, |pod, path| {
        std::fs::read_to_string(server.pod_path(NS, pod, path)).ok()
    })
    .await
    .expect("the fleet's namespace can be verified");
    let report = verdict.report();
    println!("{report}");
    assert!(verdict.ok(), "{report}");
    let (out_of_order, several) = token_order(&server.store().annotation_audit());
    assert!(
        out_of_order.is_empty(),
        "{} changes out of token order, the first: {:?}",
        out_of_order.len(),
        &out_of_order[..out_of_order.len().min(5)]
    );
    assert!(several > 0, "some sandbox changed under several tokens");
    report
}

/// Sends `signal` (`STOP`, `CONT`) to the process, by the `kill` program (argv only).
fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("the process runs");
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal}");
}

/// One process paused (SIGSTOP) past its lease while its peer takes its keys, as
/// `io-tokio/tests/fleet_harness.rs` does on a local root: woken, it finds its lease lapsed by
/// its own clock and fences itself (fail closed); what it still had in flight under its old
/// tokens is refused by the claims' token annotations or dropped; both finish with every check
/// passed, the namespace verifies, and no claim or pod was changed by two tokens out of order.
/// With both the core's fail-closed fence (canary f02's patch) and the backend's token check
/// (`fence.rs`) removed, the verification finds the peer's acknowledged logs lost; with either
/// one alone it passes (two lines of defence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_paused_past_its_lease_is_fenced_and_its_peer_keeps_the_keys() {
    let server = server().await;
    server.store().audit_annotation(TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let (la, lb) = (
        dir.path().join("ledger-a.jsonl"),
        dir.path().join("ledger-b.jsonl"),
    );
    let store = K8sStore::new(
        cluster(&server, claim_config("verifier")),
        Duration::from_millis(LEASE_MS),
    );

    // `a` runs alone until it holds its users' keys, and is stopped mid-run: a pause longer
    // than its lease, with its work in flight.
    let mut a = spawn(harness(&server, "a", 10, &la));
    let ia = a.incarnation().await;
    poll("a made progress", || std::future::ready(lines(&la) >= 24)).await;
    signal(&a.child, "STOP");
    let held = held_by(&store.entries().await.unwrap(), ia);
    assert!(!held.is_empty(), "the paused process holds keys");
    // `b` joins and, once the paused lease expired, takes every key `a` held.
    let mut b = spawn(harness(&server, "b", 6, &lb));
    let ib = b.incarnation().await;
    poll("b took every key the paused process held", || async {
        let taken = held_by(&store.entries().await.unwrap(), ib);
        held.keys().all(|k| taken.contains_key(k))
    })
    .await;
    // `a` wakes after its keys went to `b`: it fences itself, claims again and finishes.
    signal(&a.child, "CONT");
    let woken = a.succeeded().await;
    assert!(woken.contains("all checks passed"), "{woken}");
    assert_eq!(calls_failed(&woken), 0, "{woken}");
    let row = fleet_row(&woken);
    assert!(
        row["lease"] >= 1,
        "the paused process saw its lease lapse: {row:?}"
    );
    assert!(row["fenced"] >= 1, "it fenced the keys it held: {row:?}");
    let survivor = b.succeeded().await;
    assert!(survivor.contains("all checks passed"), "{survivor}");
    assert_eq!(calls_failed(&survivor), 0, "{survivor}");

    verified(&server, &store, &[la, lb]).await;
}
