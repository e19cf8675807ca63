//! The main job's workload (what `harness-k8s` runs) on the loopback API in pod mode: a few
//! sessions with deaths from outside, then the summary's checks: every call ended once, every
//! flushed version settled once, and no object of this owner is left after close.

mod common;

use std::time::Duration;

use common::*;
use sandkeeper_k8s::run_workload;
use sandkeeper_tokio::workload::WorkloadOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_workload_runs_on_pods_and_leaves_nothing_behind() {
    let server = server().await;
    let options = WorkloadOptions {
        sessions: 4,
        users: 2,
        calls: 2,
        turns: 3,
        concurrency: 4,
        death_rate: 0.25,
        seed: 7,
        close_deadline: 10,
        quiet: true,
        ..WorkloadOptions::default()
    };
    let summary = tokio::time::timeout(
        Duration::from_secs(120),
        run_workload(cluster(&server, pod_config("harness")), &options),
    )
    .await
    .expect("the workload ends")
    .expect("the workload runs");
    summary.print();
    assert!(summary.ok(), "failed checks: {:?}", summary.failures);
    assert_eq!(summary.stats.calls_acquired, 8);
    assert!(summary.calls_all_ended(), "{:?}", summary.stats);
    assert!(summary.versions_all_settled(), "{:?}", summary.tally);
    assert!(
        summary.stats.versions_flushed >= 8 * 3,
        "every turn flushed the log"
    );
    assert!(summary.stats.starts_ordered >= 1);
    assert!(summary.tally.uploaded >= 1, "something reached a pod");
    assert!(
        summary
            .rows
            .iter()
            .any(|(name, value)| name == "backend" && value == "k8s"),
        "{:?}",
        summary.rows
    );
    assert!(
        summary
            .rows
            .iter()
            .all(|(name, _)| name != "snapshots" && name != "files"),
        "local-only rows are left out"
    );
    assert!(
        owned_by(&server, "harness").is_empty(),
        "left: {:?}",
        owned_by(&server, "harness")
    );
}

/// `harness-k8s --suspend` on agent-sandbox claims: users' sandboxes are suspended at their last
/// release and resumed by their next call, with no death and no shutdown; after close no pod of
/// the owner runs, and the final sweep deletes the suspended claims, so nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_workload_suspends_and_resumes_claims() {
    let server = server().await;
    let options = WorkloadOptions {
        sessions: 4,
        users: 2,
        calls: 2,
        turns: 2,
        concurrency: 2,
        death_rate: 0.0,
        suspend: true,
        seed: 3,
        close_deadline: 10,
        quiet: true,
        ..WorkloadOptions::default()
    };
    let summary = tokio::time::timeout(
        Duration::from_secs(120),
        run_workload(cluster(&server, claim_config("suspender")), &options),
    )
    .await
    .expect("the workload ends")
    .expect("the workload runs");
    summary.print();
    assert!(summary.ok(), "failed checks: {:?}", summary.failures);
    assert!(summary.stats.suspended >= 1, "{:?}", summary.stats);
    // No deaths were injected, so none may be seen: in particular the Delete event of a pod a
    // suspension removed is reported as a lost instance of the suspended sandbox (its label),
    // which the core takes for the suspension's own doing, or ignores once it no longer tracks
    // that sandbox (see `a_late_delete_of_the_suspended_pod_...` in suspend.rs).
    assert_eq!(
        (summary.stats.deaths, summary.stats.shutdowns_ordered),
        (0, 0),
        "{:?}",
        summary.stats
    );
    assert!(
        owned_by(&server, "suspender").is_empty(),
        "left: {:?}",
        owned_by(&server, "suspender")
    );
}

/// `harness-k8s --warm-ms 1000 --suspend --retain-ms 60000` on agent-sandbox claims (issue 14):
/// the tiers and the demonstration hooks on the loopback cluster with its faithful suspension.
/// Every hook succeeds, every call finds the credential its own sandbox's hook wrote, every
/// resume finds the checkpoint the suspension's hook left, and nothing of the owner is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_workload_runs_the_tiers_and_the_hooks_on_claims() {
    let server = server().await;
    let options = WorkloadOptions {
        sessions: 4,
        users: 2,
        calls: 3,
        turns: 2,
        concurrency: 2,
        death_rate: 0.0,
        warm_ms: 1_000,
        suspend: true,
        retain_ms: 60_000,
        think_ms: 0,
        seed: 5,
        close_deadline: 10,
        quiet: true,
    };
    let summary = tokio::time::timeout(
        Duration::from_secs(120),
        run_workload(cluster(&server, claim_config("tiers")), &options),
    )
    .await
    .expect("the workload ends")
    .expect("the workload runs");
    summary.print();
    assert!(summary.ok(), "failed checks: {:?}", summary.failures);
    let stats = &summary.stats;
    assert!(stats.hooks_ordered >= 2, "{stats:?}");
    assert_eq!(stats.hooks_ordered, stats.hooks_ok, "{stats:?}");
    assert!(
        stats.revivals >= 1 && stats.suspended >= 1,
        "warm hits and suspensions: {stats:?}"
    );
    assert_eq!((stats.deaths, stats.shutdowns_ordered), (0, 0), "{stats:?}");
    assert!(
        owned_by(&server, "tiers").is_empty(),
        "left: {:?}",
        owned_by(&server, "tiers")
    );
}

/// The binary itself, pointed at the loopback API with `--server` and a pod template file:
/// it prints the summary, passes every check and exits 0; nothing of its owner is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_k8s_binary_runs_against_the_loopback_api() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("pod.yaml");
    std::fs::write(
        &template,
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, infinity]\n",
    )
    .unwrap();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_harness-k8s"))
        .args(["--namespace", NS, "--server", &server.url()])
        .arg("--pod-template")
        .arg(&template)
        .args(["--owner", "bin-harness", "--sessions", "3", "--users", "2"])
        .args(["--calls", "2", "--turns", "2", "--quiet"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the binary ends")
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("backend                  k8s"), "{stdout}");
    assert!(stdout.contains("6 acquired"), "{stdout}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    // A pod deleted last may still be terminating (its grace period, until the kubelet's next
    // pass): nothing of the owner is left once that ends.
    until(&server, "nothing of the owner is left", || {
        owned_by(&server, "bin-harness").is_empty()
    })
    .await;
}
