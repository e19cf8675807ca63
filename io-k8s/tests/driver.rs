//! The Kubernetes backend under the io-tokio driver (`Keeper`), against the loopback API: the
//! session log reaches the session's pod, R6 (an upload into a deleted pod) becomes a typed
//! `SandboxGone` instead of a crash, and after close no object of this owner remains.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::PODS;
use sandkeeper::{CallId, CallSpec, Config, PathName, SessionId};
use sandkeeper_k8s::K8sBackend;
use sandkeeper_tokio::{Keeper, KeeperConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_mirrors_into_the_pod_and_close_leaves_nothing_behind() {
    let server = server().await;
    let (backend, sweep) = K8sBackend::connect(cluster(&server, pod_config("keeper")))
        .await
        .unwrap();
    assert!(sweep.dead_owners.is_empty());
    let keeper = Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap();
    let session = SessionId::new("s1").unwrap();
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("c1").unwrap(), session.clone()))
        .await
        .unwrap();
    let pod = format!("sk-keeper-{}", guard.sandbox().0);
    keeper
        .flush(
            &session,
            &PathName::session_log(),
            b"{\"turn\":1}\n".to_vec(),
        )
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), keeper.mirror_settled(&session))
        .await
        .unwrap();
    let log = server.pod_path(
        NS,
        &pod,
        &format!("/workspace/s1/{}", PathName::session_log().as_str()),
    );
    assert_eq!(std::fs::read_to_string(log).unwrap(), "{\"turn\":1}\n");
    guard.release().await;
    let _report = tokio::time::timeout(
        Duration::from_secs(30),
        keeper.close(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    keeper.backend().close().await.unwrap();
    assert!(
        owned_by(&server, "keeper").is_empty(),
        "left: {:?}",
        owned_by(&server, "keeper")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_an_upload_into_a_deleted_pod_becomes_sandbox_gone() {
    let server = server().await;
    let backend = connect(&server, claim_config("r6")).await;
    let keeper = Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap();
    let session = SessionId::new("s1").unwrap();
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("c1").unwrap(), session.clone()))
        .await
        .unwrap();
    // The pod is deleted under the live call (evicted, or a human with kubectl).
    for p in server.store().all(&PODS) {
        let name = p["metadata"]["name"].as_str().unwrap().to_string();
        delete_pod(&server, &name);
    }
    // A late mirror write: no crash, no success; the sandbox is reported dead.
    let _ = keeper.flush(&session, &PathName::session_log(), b"late\n".to_vec());
    tokio::time::timeout(Duration::from_secs(30), keeper.mirror_settled(&session))
        .await
        .unwrap();
    let resolved = keeper.resolve(&session);
    assert!(
        matches!(
            &resolved,
            Err(sandkeeper_tokio::KeeperError::Core(
                sandkeeper::Error::SandboxGone { .. }
            ))
        ),
        "{resolved:?}"
    );
    guard.release().await;
    tokio::time::timeout(
        Duration::from_secs(30),
        keeper.close(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    keeper.backend().close().await.unwrap();
    assert!(
        owned_by(&server, "r6").is_empty(),
        "left: {:?}",
        owned_by(&server, "r6")
    );
}
