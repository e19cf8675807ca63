//! Owner leases, the start-up sweep of a crashed owner's objects, close leaving nothing behind,
//! and deaths from watches (deleted pods, expiry backstops).

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::{LEASES, PODS, SANDBOX_CLAIMS};
use k8s_loopback::store::Propagation;
use sandkeeper_k8s::Death;
use tokio::sync::mpsc;

#[tokio::test]
async fn a_crashed_owners_objects_are_swept_and_live_owners_are_left_alone() {
    let server = server().await;
    let alive = cluster(&server, claim_config("alive"));
    let crashed = cluster(&server, claim_config("crashed"));
    let crashed_pods = cluster(&server, pod_config("crashed"));
    let me = cluster(&server, claim_config("me"));
    alive.acquire_lease().await.unwrap();
    crashed.acquire_lease().await.unwrap();
    alive.start_sandbox(1, "a").await.unwrap();
    crashed.start_sandbox(1, "c").await.unwrap();
    crashed_pods.start_sandbox(2, "c").await.unwrap();
    // "crashed" stops renewing: its lease runs out.
    server
        .store()
        .modify(&LEASES, NS, "sandkeeper-owner-crashed", |l| {
            l["spec"]["renewTime"] = serde_json::json!("2020-01-01T00:00:00.000000Z");
        })
        .unwrap();
    me.acquire_lease().await.unwrap();
    let report = me.sweep_orphans().await.unwrap();
    assert_eq!(report.dead_owners, vec!["crashed".to_string()]);
    assert_eq!((report.claims, report.leases), (1, 1));
    assert!(
        owned_by(&server, "crashed").is_empty(),
        "left: {:?}",
        owned_by(&server, "crashed")
    );
    assert_eq!(
        owned_by(&server, "alive").len(),
        3,
        "claim, pod and lease of the live owner stay (its Sandbox, which carries no owner label, is the claim's): {:?}",
        owned_by(&server, "alive")
    );
    // An owner with objects and no lease at all is dead too.
    server
        .store()
        .delete(
            &LEASES,
            NS,
            "sandkeeper-owner-alive",
            Propagation::Background,
            None,
        )
        .unwrap();
    let report = me.sweep_orphans().await.unwrap();
    assert_eq!(report.dead_owners, vec!["alive".to_string()]);
    assert!(owned_by(&server, "alive").is_empty());
    assert_eq!(owned_by(&server, "me").len(), 1, "only my own lease");
}

#[tokio::test]
async fn lease_renewal_moves_the_renew_time_and_survives_conflicts() {
    let server = server().await;
    let k = cluster(&server, claim_config("renewer"));
    k.acquire_lease().await.unwrap();
    let before = server
        .store()
        .get(&LEASES, NS, "sandkeeper-owner-renewer")
        .unwrap();
    server.faults().inject(
        k8s_loopback::Matcher::on(k8s_loopback::Verb::Update, "leases"),
        k8s_loopback::Fault::Status(409),
        1,
    );
    k.renew_lease().await.unwrap();
    let after = server
        .store()
        .get(&LEASES, NS, "sandkeeper-owner-renewer")
        .unwrap();
    assert_ne!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    assert_eq!(after["spec"]["holderIdentity"], "renewer");
    // Acquiring again (a restart of the same owner) renews instead of failing.
    let again = tokio::time::Instant::now();
    k.acquire_lease().await.unwrap();
    assert!(
        again.elapsed() < Duration::from_secs(2),
        "an existing lease is renewed at once, not retried until the deadline: {:?}",
        again.elapsed()
    );
    k.release_lease().await.unwrap();
    assert!(server.store().all(&LEASES).is_empty());
}

#[tokio::test]
async fn after_close_no_object_labelled_by_this_owner_remains() {
    let server = server().await;
    let claims = cluster(&server, claim_config("closer"));
    let pods = cluster(&server, pod_config("closer"));
    claims.acquire_lease().await.unwrap();
    for i in 0..3 {
        claims.start_sandbox(i, &format!("s{i}")).await.unwrap();
    }
    pods.start_sandbox(10, "p").await.unwrap();
    assert_eq!(
        owned_by(&server, "closer").len(),
        3 + 3 + 1 + 1,
        "3 claims and their 3 pods (their Sandboxes carry no owner label), 1 pod, 1 lease"
    );
    let deleted = claims.delete_all_owned().await.unwrap();
    assert!(deleted >= 4, "{deleted}");
    claims.release_lease().await.unwrap();
    assert!(
        owned_by(&server, "closer").is_empty(),
        "left: {:?}",
        owned_by(&server, "closer")
    );
}

async fn next_death(rx: &mut mpsc::UnboundedReceiver<Death>) -> Death {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a death within 10 s")
        .expect("watch alive")
}

#[tokio::test]
async fn deaths_come_from_watches_deleted_pods_and_expiry_backstops() {
    let server = server().await;
    let k = cluster(&server, claim_config("watcher"));
    let kp = cluster(&server, pod_config("watcher"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _watch = k.spawn_death_watch(move |d| tx.send(d).is_ok());
    let a = k.start_sandbox(1, "s").await.unwrap();
    let b = k.start_sandbox(2, "s").await.unwrap();
    let c = kp.start_sandbox(3, "s").await.unwrap();

    // Someone deletes sandbox 1's pod.
    delete_pod(&server, &a.pod);
    let d = next_death(&mut rx).await;
    assert_eq!(d.sandbox, 1, "{d:?}");

    // The claim backstop: past shutdownTime the controller deletes claim 2 (policy Delete);
    // the pod backstop: past activeDeadlineSeconds pod 3 fails with DeadlineExceeded.
    server.advance_clock(Duration::from_secs(86_400 + 60));
    let mut dead = std::collections::BTreeSet::new();
    while !(dead.contains(&2) && dead.contains(&3)) {
        let d = next_death(&mut rx).await;
        dead.insert(d.sandbox);
    }
    assert!(
        server.store().get(&SANDBOX_CLAIMS, NS, &b.object).is_err(),
        "expired claim deleted"
    );
    let pod = server.store().get(&PODS, NS, &c.pod).unwrap();
    assert_eq!(pod["status"]["reason"], "DeadlineExceeded");
}
