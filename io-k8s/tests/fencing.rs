//! Fleet mode's fencing on Kubernetes, against the loopback API: the newest token a sandbox has
//! seen is on its object (the pod, in pod mode; the claim in agent-sandbox mode), and a change
//! under an older one is refused with `FailureClass::Fenced` and changes nothing; a start under
//! a token older than the newest the fleet store handed out for its key starts nothing.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS};
use sandkeeper::{Key, PathName, Payload, SandboxId, SessionId, Spec, Token, UploadId, Version};
use sandkeeper_k8s::K8sStore;
use sandkeeper_tokio::store::{Claim, FleetStore};
use sandkeeper_tokio::{Backend, FailureClass, StartRequest, UploadRequest};

fn key(name: &str) -> Key {
    Key::Session(SessionId::new(name).unwrap())
}

fn start(sandbox: u64, key: &Key, token: u64) -> StartRequest {
    StartRequest {
        sandbox: SandboxId(sandbox),
        key: key.clone(),
        spec: Spec::new(""),
        resume_from: None,
        resumes: None,
        token: Some(Token(token)),
    }
}

fn upload(sandbox: u64, version: u64, token: u64) -> UploadRequest {
    UploadRequest {
        upload: UploadId(version),
        sandbox: SandboxId(sandbox),
        session: SessionId::new("s1").unwrap(),
        path: PathName::session_log(),
        version: Version(version),
        payload: Payload::new(format!("v{version}").into_bytes()),
        token: Some(Token(token)),
    }
}

fn token_of(o: &serde_json::Value) -> Option<&str> {
    o.pointer("/metadata/annotations/sandkeeper.sandbox.users.io~1token")
        .and_then(|v| v.as_str())
}

async fn fences_on(
    config: sandkeeper_k8s::K8sConfig,
    objects: &k8s_loopback::resources::ResourceType,
) {
    let server = server().await;
    let backend = connect(&server, config).await;
    let k = key("s1");
    let x = (1u64 << 32) | 1;
    backend.start(start(x, &k, 5)).await.unwrap();
    let object = backend.handle(SandboxId(x)).unwrap().object;
    let read = || server.store().get(objects, NS, &object).unwrap();
    assert_eq!(token_of(&read()), Some("5"), "the start recorded its token");

    let refused = backend.upload(upload(x, 1, 4)).await.unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");
    backend.upload(upload(x, 2, 6)).await.unwrap();
    assert_eq!(token_of(&read()), Some("6"), "a newer token is recorded");
    let refused = backend.upload(upload(x, 3, 5)).await.unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");

    // A stale owner's shutdown leaves the sandbox to its new owner.
    let refused = backend
        .shutdown(SandboxId(x), Some(Token(5)))
        .await
        .unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");
    assert!(
        server.store().get(objects, NS, &object).is_ok(),
        "still there"
    );
    backend
        .shutdown(SandboxId(x), Some(Token(6)))
        .await
        .unwrap();

    // The key's newest token is the fleet store's: a start under an older one starts nothing.
    let store = K8sStore::new(
        cluster(&server, claim_config("fleet")),
        Duration::from_secs(10),
    );
    let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let inc = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, inc, 1, now).await.unwrap();
    let k2 = key("s2");
    let Claim::Claimed(Token(newest), _) = FleetStore::claim(&store, k2.clone(), inc, 1, now)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let before = server.store().all(objects).len();
    let y = (1u64 << 32) | 2;
    let refused = backend.start(start(y, &k2, newest - 1)).await;
    let refused = match refused {
        Err(e) => e,
        Ok(()) => panic!("a start under an older token than the key's newest"),
    };
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");
    assert_eq!(
        server.store().all(objects).len(),
        before,
        "nothing was made"
    );
    backend.start(start(y, &k2, newest)).await.unwrap();
}

#[tokio::test]
async fn pods_record_the_newest_token_and_refuse_older_ones() {
    fences_on(pod_config("fencing"), &PODS).await;
}

#[tokio::test]
async fn claims_record_the_newest_token_and_refuse_older_ones() {
    fences_on(claim_config("fencing"), &SANDBOX_CLAIMS).await;
}
