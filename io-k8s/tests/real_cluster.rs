//! Against a real cluster (kind, k3d, ...): `KUBECONFIG=... cargo test -p sandkeeper-k8s --
//! --ignored`. Pod mode with a busybox pod in `$SANDKEEPER_NAMESPACE` (default `default`); the
//! agent-sandbox test also needs agent-sandbox v0.5.0 or later with its extensions, and a warm
//! pool named `$SANDKEEPER_WARM_POOL` (default `python-sandboxes`, as in
//! `deploy/warm-pool.example.yaml`) whose pods have the container `$SANDKEEPER_CONTAINER`
//! (default `sandbox`). It checks the install as connect does (API version, pool, template,
//! exec container: rows E and G of issue 12), starts a claim with the backend's pod labels on a
//! default allowlist (row A), uploads a file into the named container beside a sidecar (row E),
//! and suspends and resumes the claim, the file surviving on the template's claim volume
//! (row B). A second test makes a warm pool after its claim (row D): it needs rights to
//! create and delete SandboxWarmPools (the admin kubeconfig of kind has them). A third hands a
//! claim from one owner to another as a fleet does (adoption under a higher token). A fourth
//! deletes a claim's pod from outside and resumes the claim on its volume (row J).
//! io-k8s/README.md gives the commands for kind.

use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::{Cluster, K8sConfig, Mode, UploadFile};

fn namespace() -> String {
    std::env::var("SANDKEEPER_NAMESPACE").unwrap_or_else(|_| "default".into())
}

/// A cluster of owner `owner` in `mode` on the cluster `KUBECONFIG` names.
async fn cluster(mode: Mode, owner: &str) -> Cluster {
    let kube_config = kube::Config::infer()
        .await
        .expect("KUBECONFIG points at a cluster");
    let client = Cluster::make_client(kube_config).unwrap();
    let agent_sandbox = matches!(mode, Mode::AgentSandbox { .. });
    let mut config = K8sConfig::new(namespace(), owner, mode);
    config.workdir = if agent_sandbox {
        "/workspace".into()
    } else {
        "/tmp".into()
    };
    if agent_sandbox {
        config.container =
            Some(std::env::var("SANDKEEPER_CONTAINER").unwrap_or_else(|_| "sandbox".into()));
    }
    Cluster::new(client, config).unwrap()
}

fn warm_pool() -> Mode {
    let pool = std::env::var("SANDKEEPER_WARM_POOL").unwrap_or_else(|_| "python-sandboxes".into());
    Mode::AgentSandbox { warm_pool: pool }
}

async fn run(mode: Mode) {
    let agent_sandbox = matches!(mode, Mode::AgentSandbox { .. });
    let k = cluster(mode, "real-test").await;
    let workdir = k.config().workdir.clone();
    let install = k
        .check_install()
        .await
        .expect("the install serves this backend");
    if agent_sandbox {
        assert!(
            install.workdir_persistent,
            "the pool's template keeps {workdir} on a volumeClaimTemplates volume: {install:?}"
        );
    }
    k.acquire_lease().await.unwrap();
    let h = k.start_sandbox(1, "real").await.unwrap();
    let (s, p) = (
        SessionId::new("real").unwrap(),
        PathName::new("hello.txt").unwrap(),
    );
    k.upload(
        &h.pod,
        &[UploadFile {
            session: &s,
            path: &p,
            bytes: b"hello\n",
        }],
    )
    .await
    .unwrap();
    let has_hello = || -> Vec<String> {
        vec![
            "grep".into(),
            "-q".into(),
            "hello".into(),
            format!("{workdir}/real/hello.txt"),
        ]
    };
    k.exec_with_stdin(&h.pod, has_hello(), Vec::new())
        .await
        .expect("the file arrived");
    let h = if h.sandbox_name.is_some() {
        // agent-sandbox: suspend (pod deleted, claim kept) and resume the same claim; the file
        // survives on the template's claim volume.
        k.suspend_sandbox(&h).await.expect("suspended");
        let found = match k.find_suspended(&h.object).await.unwrap() {
            sandkeeper_k8s::Resumable::Claim(found) => found,
            lost => panic!("the suspended claim is lost: {lost:?}"),
        };
        let resumed = k.resume_sandbox(2, &found).await.expect("resumed");
        assert_eq!(resumed.object, h.object);
        k.exec_with_stdin(&resumed.pod, has_hello(), Vec::new())
            .await
            .expect("the file survived the suspension");
        resumed
    } else {
        h
    };
    k.shutdown_sandbox(&h).await.unwrap();
    k.delete_all_owned().await.unwrap();
    k.release_lease().await.unwrap();
}

#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored"]
async fn pod_mode_on_a_real_cluster() {
    let template = serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
    }))
    .unwrap();
    run(Mode::Pod {
        template: Box::new(template),
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored"]
async fn agent_sandbox_mode_on_a_real_cluster() {
    run(warm_pool()).await;
}

/// Fleet adoption against the real agent-sandbox controllers (what the loopback's controllers
/// imitate, `io-k8s/tests/adoption.rs`): a claim one owner started and handed over is adopted
/// by another under a higher token; the controllers keep the new owner's label on the claim
/// and the pod (the adoption patches the claim, the Sandbox's pod template, then the pod),
/// so the new owner's death watch reports nothing; the new owner's uploads land and the old
/// token is refused (`Fenced`).
#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored"]
async fn a_handed_over_claim_is_adopted_on_a_real_cluster() {
    use k8s_openapi::api::core::v1::Pod;
    use sandkeeper::{Key, Payload, SandboxId, Spec, Token, UploadId, Version};
    use sandkeeper_k8s::{crd::SandboxClaim, K8sBackend};
    use sandkeeper_tokio::{AdoptRequest, Backend, FailureClass, StartRequest, UploadRequest};
    const OWNER: &str = "sandkeeper.sandbox.users.io/owner";
    let session = SessionId::new("real-fleet").unwrap();
    let upload = |version: u64, token: u64| UploadRequest {
        upload: UploadId(version),
        sandbox: X,
        session: session.clone(),
        path: PathName::session_log(),
        version: Version(version),
        payload: Payload::new(format!("v{version}\n").into_bytes()),
        token: Some(Token(token)),
    };
    const X: SandboxId = SandboxId((1 << 32) | 7);
    let (first, _) = K8sBackend::connect(cluster(warm_pool(), "real-fleet-a").await)
        .await
        .expect("connects");
    let (second, _) = K8sBackend::connect(cluster(warm_pool(), "real-fleet-b").await)
        .await
        .expect("connects");
    let (tx, mut deaths) = tokio::sync::mpsc::unbounded_channel();
    let _watch = second
        .cluster()
        .spawn_death_watch(move |d| tx.send(d).is_ok());

    first
        .start(StartRequest {
            sandbox: X,
            key: Key::Session(session.clone()),
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            token: Some(Token(1)),
        })
        .await
        .expect("started");
    first.upload(upload(1, 1)).await.unwrap();
    let claim = first.handle(X).unwrap().object;
    first.relinquish(X).await;

    second
        .adopt(AdoptRequest {
            sandbox: X,
            key: Key::Session(session.clone()),
            token: Token(2),
        })
        .await
        .expect("adopted");
    let h = second.handle(X).expect("the second owner drives it");
    assert_eq!(h.object, claim);
    second.upload(upload(2, 2)).await.unwrap();
    let refused = second.upload(upload(3, 1)).await.unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");
    let k = second.cluster();
    let log = format!("{}/real-fleet/session.log", k.config().workdir);
    k.exec_with_stdin(
        &h.pod,
        vec!["grep".into(), "-q".into(), "v2".into(), log],
        Vec::new(),
    )
    .await
    .expect("the new owner's upload landed in the adopted claim");

    // After that work, the controllers have had their passes: the labels are still the new
    // owner's, and nothing was reported dead.
    let client = Cluster::make_client(kube::Config::infer().await.unwrap()).unwrap();
    let ns = namespace();
    let pod = kube::Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&h.pod)
        .await
        .unwrap();
    let c = kube::Api::<SandboxClaim>::namespaced(client, &ns)
        .get(&claim)
        .await
        .unwrap();
    for labels in [pod.metadata.labels, c.metadata.labels] {
        assert_eq!(labels.unwrap_or_default()[OWNER], "real-fleet-b");
    }
    assert!(deaths.try_recv().is_err(), "an adopted claim reported dead");
    second.shutdown(X, Some(Token(2))).await.unwrap();
    first.close().await.unwrap();
    second.close().await.unwrap();
}

/// Row J on a real cluster: a claim's pod deleted from outside (as `kubectl delete pod`, an
/// eviction or a drain does) is reported as a lost instance only; the suspension the core
/// orders for it works without the pod (the controller may have made it again meanwhile);
/// the claim is kept, and a resume as a new sandbox finds the file on the claim volume, in a
/// pod labelled with the new sandbox.
#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored"]
async fn a_claims_lost_pod_keeps_the_workspace_on_a_real_cluster() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;
    use sandkeeper::{Key, Payload, SandboxId, Snapshot, Spec, UploadId, Version};
    use sandkeeper_k8s::K8sBackend;
    use sandkeeper_tokio::{
        Backend, Loss, PersistRequest, StartRequest, StopRequest, UploadRequest,
    };
    const X: SandboxId = SandboxId((1 << 32) | 7);
    const Y: SandboxId = SandboxId((1 << 32) | 8);
    let session = SessionId::new("real-lost").unwrap();
    let start = |sandbox, resume_from: Option<Snapshot>, resumes| StartRequest {
        sandbox,
        key: Key::Session(session.clone()),
        spec: Spec::new(""),
        resume_from,
        resumes,
        token: None,
    };
    let (b, _) = K8sBackend::connect(cluster(warm_pool(), "real-lost").await)
        .await
        .expect("connects");
    let (tx, mut deaths) = tokio::sync::mpsc::unbounded_channel();
    let _watch = b.cluster().spawn_death_watch(move |d| tx.send(d).is_ok());
    b.start(start(X, None, None)).await.expect("started");
    b.upload(UploadRequest {
        upload: UploadId(1),
        sandbox: X,
        session: session.clone(),
        path: PathName::session_log(),
        version: Version(1),
        payload: Payload::new(b"v1\n".to_vec()),
        token: None,
    })
    .await
    .unwrap();
    let h = b.handle(X).unwrap();

    let client = Cluster::make_client(kube::Config::infer().await.unwrap()).unwrap();
    kube::Api::<Pod>::namespaced(client, &namespace())
        .delete(&h.pod, &DeleteParams::default())
        .await
        .expect("the pod deleted");
    let d = tokio::time::timeout(std::time::Duration::from_secs(120), deaths.recv())
        .await
        .expect("the loss reported in time")
        .unwrap();
    assert_eq!((d.sandbox, d.loss), (X.0, Loss::Instance), "{d:?}");

    let snapshot = b
        .stop(StopRequest {
            sandbox: X,
            suspend: true,
            token: None,
        })
        .await
        .expect("stopped without its pod");
    b.persist(PersistRequest {
        sandbox: X,
        snapshot: snapshot.clone(),
        suspend: true,
        retain_until: None,
        token: None,
    })
    .await
    .expect("suspended without its pod");
    b.start(start(Y, snapshot, Some(X))).await.expect("resumed");
    let h2 = b.handle(Y).unwrap();
    assert_eq!(h2.object, h.object, "the same claim");
    let k = b.cluster();
    let log = format!("{}/real-lost/session.log", k.config().workdir);
    k.exec_with_stdin(
        &h2.pod,
        vec!["grep".into(), "-q".into(), "v1".into(), log],
        Vec::new(),
    )
    .await
    .expect("the file an earlier call wrote is on the claim volume");
    while let Ok(d) = deaths.try_recv() {
        assert_eq!(d.loss, Loss::Instance, "never the sandbox: {d:?}");
    }
    b.shutdown(Y, None).await.unwrap();
    b.close().await.unwrap();
}

/// Row D on a real cluster: a claim whose warm pool does not exist yet waits (the controller
/// requeues `WarmPoolNotFound`, and the backend takes it as transient), and the pool made a
/// moment later (from `$SANDKEEPER_WARM_POOL`'s template) serves it within the start's wait.
#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored"]
async fn a_pool_created_after_its_claim_serves_it_on_a_real_cluster() {
    use kube::api::{Api, DeleteParams, Patch, PatchParams};
    use sandkeeper_k8s::crd::{SandboxClaim, SandboxWarmPool};
    let client = Cluster::make_client(kube::Config::infer().await.expect("KUBECONFIG")).unwrap();
    let ns = namespace();
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), &ns);
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns);
    let pool = std::env::var("SANDKEEPER_WARM_POOL").unwrap_or_else(|_| "python-sandboxes".into());
    let template = pools
        .get(&pool)
        .await
        .expect("the example pool exists")
        .spec
        .sandbox_template_ref
        .name;
    let late = "sandkeeper-late-pool";
    let _ = pools.delete(late, &DeleteParams::default()).await;

    let mut config = K8sConfig::new(
        ns.clone(),
        "real-late",
        Mode::AgentSandbox {
            warm_pool: late.into(),
        },
    );
    config.workdir = "/workspace".into();
    config.container =
        Some(std::env::var("SANDKEEPER_CONTAINER").unwrap_or_else(|_| "sandbox".into()));
    config.ready_timeout_secs = 300;
    let k = std::sync::Arc::new(Cluster::new(client, config).unwrap());
    k.acquire_lease().await.unwrap();
    let start = tokio::spawn({
        let k = k.clone();
        async move { k.start_sandbox(1, "late").await }
    });
    let claim = sandkeeper_k8s::names::object_name("real-late", 1);
    let waiting =
        kube::runtime::wait::await_condition(claims, &claim, |c: Option<&SandboxClaim>| {
            c.and_then(|c| serde_json::to_value(c).ok())
                .and_then(|c| c.pointer("/status/conditions").cloned())
                .and_then(|cs| cs.as_array().cloned())
                .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "WarmPoolNotFound"))
        });
    tokio::time::timeout(std::time::Duration::from_secs(120), waiting)
        .await
        .expect("the claim waits on its missing pool")
        .unwrap();
    assert!(
        !start.is_finished(),
        "the start waits through WarmPoolNotFound"
    );
    let made = serde_json::json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": late, "namespace": ns},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": template}},
    });
    pools
        .patch(
            late,
            &PatchParams::apply("sandkeeper-test"),
            &Patch::Apply(&made),
        )
        .await
        .expect("the pool is made");
    let h = start
        .await
        .unwrap()
        .expect("the pool made after the claim serves it");
    k.shutdown_sandbox(&h).await.unwrap();
    k.delete_all_owned().await.unwrap();
    k.release_lease().await.unwrap();
    let _ = pools.delete(late, &DeleteParams::default()).await;
}
