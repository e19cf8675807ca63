//! Owner leases, the start-up sweep of a crashed owner's objects (a claim the controller
//! suspended for inactivity judged as one its keeper suspended), close leaving nothing behind,
//! and deaths from watches (deleted pods, expiry backstops).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_loopback::resources::{LEASES, PODS, SANDBOX_CLAIMS};
use k8s_loopback::store::Propagation;
use sandkeeper_k8s::{Death, K8sBackend};
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

/// The `tracing` output of this thread while the guard [`Captured::warnings`] returns lives:
/// warnings and errors, without colours.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn warnings(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// The lines written that name `object`.
    fn naming(&self, object: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).to_string();
        text.lines()
            .filter(|l| {
                l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .any(|word| word == object)
            })
            .map(str::to_string)
            .collect()
    }
}

/// A keeper crashed; its warm sandbox idled and the controller suspended it for inactivity
/// (its pod deleted, `operatingMode` left `Running`). At connect, such a claim is judged as a
/// claim its keeper suspended is in the same place: a dead owner's goes with its owner's other
/// objects, this owner's own (left by an earlier run under the same name) and a live owner's
/// stay, never deleted because their pod is gone. Each of a dead owner's or this owner's is
/// counted in the report and named in a warning; a keeper's own suspension is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_judges_a_claim_the_controller_suspended_as_one_its_keeper_suspended() {
    let server = server().await;
    let crashed = cluster(&server, claim_config("crashed"));
    let earlier = cluster(&server, claim_config("me"));
    let alive = cluster(&server, claim_config("alive"));
    let mut by_keeper = vec![];
    let mut by_controller = vec![];
    for (k, n) in [(&crashed, 1), (&earlier, 3), (&alive, 5)] {
        k.acquire_lease().await.unwrap();
        let suspended = k.start_sandbox(n, &format!("k{n}")).await.unwrap();
        k.suspend_sandbox(&suspended).await.unwrap();
        by_keeper.push(suspended.object);
        let idle = k
            .start_sandbox(n + 1, &format!("k{}", n + 1))
            .await
            .unwrap();
        auto_suspend(&server, idle.sandbox_name.as_deref().unwrap(), &idle.pod).await;
        by_controller.push(idle.object);
    }
    // "crashed" stops renewing: its lease runs out.
    server
        .store()
        .modify(&LEASES, NS, "sandkeeper-owner-crashed", |l| {
            l["spec"]["renewTime"] = serde_json::json!("2020-01-01T00:00:00.000000Z");
        })
        .unwrap();

    let captured = Captured::default();
    let (backend, report) = {
        let _warnings = captured.warnings();
        K8sBackend::connect(cluster(&server, claim_config("me")))
            .await
            .expect("the backend connects")
    };
    let claim = |name: &str| server.store().get(&SANDBOX_CLAIMS, NS, name).is_ok();
    assert_eq!(report.dead_owners, vec!["crashed".to_string()]);
    assert_eq!(
        (report.claims, report.pods),
        (2, 0),
        "the dead owner's two claims, neither with a pod: {report:?}"
    );
    assert_eq!(
        report.auto_suspended, 2,
        "the dead owner's and this owner's claim the controller suspended: {report:?}"
    );
    assert!(!claim(&by_keeper[0]), "the keeper's suspension: swept");
    assert!(
        !claim(&by_controller[0]),
        "the controller's suspension: swept as the keeper's is"
    );
    for kept in [
        &by_keeper[1],
        &by_controller[1],
        &by_keeper[2],
        &by_controller[2],
    ] {
        assert!(claim(kept), "{kept}: this owner's or a live owner's, kept");
    }
    for found in [&by_controller[0], &by_controller[1]] {
        assert_eq!(
            captured.naming(found).len(),
            1,
            "one warning names {found}, suspended by the controller"
        );
    }
    for quiet in [
        &by_keeper[0],
        &by_keeper[1],
        &by_keeper[2],
        &by_controller[2],
    ] {
        assert_eq!(
            captured.naming(quiet),
            Vec::<String>::new(),
            "a keeper's suspension, or a live owner's claim: nothing to warn of"
        );
    }
    drop(backend);
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
