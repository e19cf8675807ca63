//! Fleet mode on Kubernetes end to end, against the loopback API: two keepers (two processes of
//! one fleet, each with its own owner name) over one namespace, each with its `K8sBackend`
//! connected for a fleet and its `K8sStore`. A session's next call lands on the other keeper,
//! which adopts the warm sandbox (same claim, same pod); a keeper that crashes (dropped without
//! close: no renewal, no release) leaves its session to the other once its lease expires, by
//! the record it wrote while it owned the key. Real time: the lease is 2 s.

mod common;

use std::time::Duration;

use common::*;
use sandkeeper::{CallId, CallSpec, Config, Fleet, PathName, ReleasePolicy, Scope, SessionId};
use sandkeeper_k8s::{K8sBackend, K8sStore};
use sandkeeper_tokio::{Keeper, KeeperConfig, KeeperError};

fn fleet() -> Fleet {
    Fleet {
        incarnation: 1,
        lease: Duration::from_secs(2),
        renew_every: Duration::from_millis(500),
        margin: Duration::from_millis(400),
        claim_retry: Duration::from_millis(100),
        handover: sandkeeper::Handover::Warm,
    }
}

fn config() -> KeeperConfig {
    KeeperConfig::with_core(Config {
        scope: Scope::Session,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(600),
        },
        fleet: Some(fleet()),
        ..Config::default()
    })
}

fn call(name: &str) -> CallSpec {
    CallSpec::new(CallId::new(name).unwrap(), SessionId::new("s1").unwrap())
}

async fn keeper(server: &k8s_loopback::Loopback, owner: &str) -> Keeper<K8sBackend> {
    let backend = K8sBackend::connect_fleet(cluster(server, pod_config(owner)))
        .await
        .unwrap();
    let store = K8sStore::new(cluster(server, pod_config(owner)), fleet().lease);
    Keeper::fleet(config(), backend, store).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_between_keepers_and_survives_a_crash() {
    let server = server().await;
    let a = keeper(&server, "a").await;
    let b = keeper(&server, "b").await;
    let session = SessionId::new("s1").unwrap();
    let log = PathName::session_log();

    let first = a.acquire(call("c1")).await.unwrap();
    let sandbox = first.sandbox();
    let pod = a.backend().handle(sandbox).unwrap().pod;
    a.flush(&session, &log, b"turn 1\n".to_vec()).unwrap();
    first.release().await;

    // Handed over warm: B adopts the same pod.
    let second = b.acquire(call("c2")).await.unwrap();
    assert_eq!(second.sandbox(), sandbox);
    assert_eq!(b.backend().handle(sandbox).unwrap().pod, pod);
    assert!(a.backend().handle(sandbox).is_none(), "A let go of it");
    second.release().await;
    assert_eq!((a.stats().handovers, b.stats().adoptions_ordered), (1, 1));

    // B crashes holding it warm: A gets it back once B's lease expired, from B's record.
    drop(b);
    let started = tokio::time::Instant::now();
    let third = a.acquire(call("c3")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "waited for B's lease"
    );
    assert_eq!(third.sandbox(), sandbox, "adopted again, not started");
    assert_eq!(a.backend().handle(sandbox).unwrap().pod, pod);
    third.release().await;
    assert_eq!(a.stats().starts_ordered, 1, "{:?}", a.stats());
    a.close(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_backend_connected_for_one_mode_refuses_the_other() {
    let server = server().await;
    let single = connect(&server, pod_config("single")).await;
    let store = K8sStore::new(cluster(&server, pod_config("single")), fleet().lease);
    let e = Keeper::fleet(config(), single, store).await.err();
    assert!(
        matches!(&e, Some(KeeperError::Unsupported(why)) if why.contains("connect_fleet")),
        "{e:?}"
    );
    let fleet_backend = K8sBackend::connect_fleet(cluster(&server, pod_config("f")))
        .await
        .unwrap();
    let e = Keeper::new(KeeperConfig::default(), fleet_backend).err();
    assert!(
        matches!(&e, Some(KeeperError::Unsupported(why)) if why.contains("fleet mode only")),
        "{e:?}"
    );
    // Keys handed over suspended would suspend pods, which pod mode cannot keep.
    let fleet_backend = K8sBackend::connect_fleet(cluster(&server, pod_config("g")))
        .await
        .unwrap();
    let mut suspended = config().core;
    suspended.fleet = Some(Fleet {
        handover: sandkeeper::Handover::Suspended,
        ..fleet()
    });
    let refusal = sandkeeper_tokio::Backend::check_config(&fleet_backend, &suspended).unwrap_err();
    assert!(refusal.contains("hand over warm"), "{refusal}");
    sandkeeper_tokio::Backend::check_config(&fleet_backend, &config().core)
        .expect("handed over warm, pod mode is fine");
}
