//! Fleet mode's adoption on Kubernetes, against the loopback API: a second owner takes over a
//! sandbox the first handed over (found by its sandbox label), raising its token and
//! relabelling its objects with the new owner; the first owner's stale token is refused from
//! then on; a sandbox that is not there cannot be adopted (`Gone`, and the core starts the key
//! afresh); a relinquished sandbox is forgotten and left as it is; a claim its crashed owner
//! had suspended (before the key's record said so) runs again for the adopter, with its
//! workspace.

mod common;

use common::*;
use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS};
use sandkeeper::{Key, PathName, Payload, SandboxId, SessionId, Spec, Token, UploadId, Version};
use sandkeeper_tokio::{
    AdoptRequest, Backend, FailureClass, PersistRequest, StartRequest, StopRequest, UploadRequest,
};

fn key() -> Key {
    Key::Session(SessionId::new("s1").unwrap())
}

/// A fresh start of `sandbox` under token 1.
fn start(sandbox: SandboxId) -> StartRequest {
    StartRequest {
        sandbox,
        key: key(),
        spec: Spec::new(""),
        resume_from: None,
        resumes: None,
        token: Some(Token(1)),
    }
}

fn upload(sandbox: SandboxId, version: u64, token: u64) -> UploadRequest {
    UploadRequest {
        upload: UploadId(version),
        sandbox,
        session: SessionId::new("s1").unwrap(),
        path: PathName::session_log(),
        version: Version(version),
        payload: Payload::new(format!("v{version}").into_bytes()),
        token: Some(Token(token)),
    }
}

fn label<'a>(o: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    o.pointer(&format!("/metadata/labels/{}", name.replace('/', "~1")))
        .and_then(|v| v.as_str())
}

async fn adopts_on(
    first: sandkeeper_k8s::K8sConfig,
    second: sandkeeper_k8s::K8sConfig,
    objects: &k8s_loopback::resources::ResourceType,
) {
    let server = server().await;
    let a = connect(&server, first).await;
    let b = connect(&server, second).await;
    let x = SandboxId((1 << 32) | 7);
    a.start(start(x)).await.unwrap();
    a.upload(upload(x, 1, 1)).await.unwrap();
    let object = a.handle(x).unwrap().object;
    a.relinquish(x).await;
    assert!(a.handle(x).is_none(), "forgotten");
    assert!(
        server.store().get(objects, NS, &object).is_ok(),
        "left as it is"
    );

    b.adopt(AdoptRequest {
        sandbox: x,
        key: key(),
        token: Token(2),
    })
    .await
    .unwrap();
    let h = b.handle(x).expect("B drives it now");
    assert_eq!(h.object, object);
    let o = server.store().get(objects, NS, &object).unwrap();
    assert_eq!(
        label(&o, "sandkeeper.sandbox.users.io/owner"),
        Some("second")
    );
    let pod = server.store().get(&PODS, NS, &h.pod).unwrap();
    assert_eq!(
        label(&pod, "sandkeeper.sandbox.users.io/owner"),
        Some("second")
    );
    b.upload(upload(x, 2, 2)).await.unwrap();
    // A could only act through its stale token now: refused.
    let refused = b.upload(upload(x, 3, 1)).await.unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");

    // Nothing to adopt under another number.
    let missing = b
        .adopt(AdoptRequest {
            sandbox: SandboxId((1 << 32) | 99),
            key: key(),
            token: Token(3),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.class, FailureClass::Gone, "{missing}");
    b.shutdown(x, Some(Token(2))).await.unwrap();
}

#[tokio::test]
async fn a_handed_over_pod_is_adopted_by_the_next_owner() {
    adopts_on(pod_config("first"), pod_config("second"), &PODS).await;
}

#[tokio::test]
async fn a_handed_over_claim_is_adopted_by_the_next_owner() {
    adopts_on(
        claim_config("first"),
        claim_config("second"),
        &SANDBOX_CLAIMS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_its_crashed_owner_had_suspended_runs_again_for_the_adopter() {
    let server = server().await;
    let a = connect(&server, claim_config("first")).await;
    let x = SandboxId((1 << 32) | 8);
    a.start(start(x)).await.unwrap();
    a.upload(upload(x, 1, 1)).await.unwrap();
    let claim = a.handle(x).unwrap().object;
    // `a` suspends it (with a retention) and crashes before the key's record says so.
    let snapshot = a
        .stop(StopRequest {
            sandbox: x,
            suspend: true,
            token: Some(Token(1)),
        })
        .await
        .unwrap();
    a.persist(PersistRequest {
        sandbox: x,
        snapshot,
        suspend: true,
        retain_until: Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(4_000_000_000)),
        token: Some(Token(1)),
    })
    .await
    .unwrap();
    drop(a);

    let b = connect(&server, claim_config("second")).await;
    b.adopt(AdoptRequest {
        sandbox: x,
        key: key(),
        token: Token(2),
    })
    .await
    .unwrap();
    let h = b.handle(x).expect("B drives it now");
    assert_eq!(h.object, claim, "the same claim, running again");
    let o = server.store().get(&SANDBOX_CLAIMS, NS, &claim).unwrap();
    assert_eq!(
        label(&o, "sandkeeper.sandbox.users.io/owner"),
        Some("second")
    );
    let log = server.pod_path(
        NS,
        &h.pod,
        &format!("/workspace/s1/{}", PathName::session_log().as_str()),
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        b"v1",
        "its workspace came back"
    );
    b.upload(upload(x, 2, 2)).await.unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), b"v2");
    b.shutdown(x, Some(Token(2))).await.unwrap();
}
