//! Against a real cluster (kind, k3d, ...): `KUBECONFIG=... cargo test -p sandkeeper-k8s --
//! --ignored`. Pod mode with a busybox pod in `$SANDKEEPER_NAMESPACE` (default `default`); the
//! agent-sandbox test also needs the agent-sandbox CRDs and a warm pool named
//! `$SANDKEEPER_WARM_POOL` (it also suspends and resumes the claim).

use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::{Cluster, K8sConfig, Mode, UploadFile};

fn namespace() -> String {
    std::env::var("SANDKEEPER_NAMESPACE").unwrap_or_else(|_| "default".into())
}

async fn run(mode: Mode) {
    let kube_config = kube::Config::infer()
        .await
        .expect("KUBECONFIG points at a cluster");
    let client = Cluster::make_client(kube_config).unwrap();
    let mut config = K8sConfig::new(namespace(), "real-test", mode);
    config.workdir = "/tmp".into();
    let k = Cluster::new(client, config).unwrap();
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
    k.exec_with_stdin(
        &h.pod,
        vec![
            "grep".into(),
            "-q".into(),
            "hello".into(),
            "/tmp/real/hello.txt".into(),
        ],
        Vec::new(),
    )
    .await
    .expect("the file arrived");
    let h = if h.sandbox_name.is_some() {
        // agent-sandbox: suspend (pod deleted, claim kept) and resume the same claim. The file
        // survives only where the template puts the workdir on a volume, so only the new pod's
        // exec is checked.
        k.suspend_sandbox(&h).await.expect("suspended");
        let found = match k.find_suspended(&h.object).await.unwrap() {
            sandkeeper_k8s::Resumable::Claim(found) => found,
            lost => panic!("the suspended claim is lost: {lost:?}"),
        };
        let resumed = k.resume_sandbox(2, &found).await.expect("resumed");
        assert_eq!(resumed.object, h.object);
        k.exec_with_stdin(&resumed.pod, vec!["true".into()], Vec::new())
            .await
            .expect("the resumed pod runs commands");
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
    let pool = std::env::var("SANDKEEPER_WARM_POOL").unwrap_or_else(|_| "sandkeeper-test".into());
    run(Mode::AgentSandbox { warm_pool: pool }).await;
}
