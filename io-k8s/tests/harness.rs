//! The main job's workload (what `harness-k8s` runs) on the loopback API in pod mode: a few
//! sessions with deaths from outside, then the summary's checks: every call ended once, every
//! flushed version settled once, and no object of this owner is left after close.

mod common;

use std::time::Duration;

use common::*;
use sandkeeper_k8s::workload::run_workload;
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
