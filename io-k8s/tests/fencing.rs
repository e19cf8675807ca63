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

/// The requests made between `before` and now, `pods/exec` and Leases (the owner Lease's
/// renewal runs on its own timer) left out.
fn api_requests_since(
    server: &k8s_loopback::Loopback,
    before: &std::collections::BTreeMap<k8s_loopback::RequestInfo, u64>,
) -> Vec<(k8s_loopback::RequestInfo, u64)> {
    server
        .request_counts()
        .into_iter()
        .map(|(r, n)| {
            let was = before.get(&r).copied().unwrap_or(0);
            (r, n - was)
        })
        .filter(|(r, n)| {
            *n > 0 && r.subresource.as_deref() != Some("exec") && r.resource != "leases"
        })
        .collect()
}

/// The application's own work in a sandbox is fenced like the keeper's commands: once another
/// backend adopted the sandbox under a newer token, the stale backend's write, removal and
/// command are refused (`OpError::Fenced`), although it still drives the sandbox as far as it
/// knows (it never learnt of the takeover), and the pod's workspace keeps what the new owner
/// wrote. Reads stay allowed (they change nothing). The check costs a fleet sandbox's change
/// one GET of its object, and a sandbox started without a token (a single keeper) nothing.
/// Without the check the stale write replaced the new owner's file.
async fn stale_operations_change_nothing_on(
    first: sandkeeper_k8s::K8sConfig,
    second: sandkeeper_k8s::K8sConfig,
    objects: &k8s_loopback::resources::ResourceType,
) {
    use sandkeeper_tokio::ops::ExecRequest;
    use sandkeeper_tokio::{AdoptRequest, ExecOptions, OpError, SandboxOps, WorkPath};
    let server = server().await;
    let stale = connect(&server, first).await;
    let next = connect(&server, second).await;
    let k = key("s1");
    let x = SandboxId((1 << 32) | 3);
    stale.start(start(x.0, &k, 3)).await.unwrap();
    let path = || WorkPath::new("turns.txt").unwrap();
    stale.write(x, path(), b"turn 1\n".to_vec()).await.unwrap();
    next.adopt(AdoptRequest {
        sandbox: x,
        key: k.clone(),
        token: Token(4),
    })
    .await
    .unwrap();
    let before = server.request_counts();
    next.write(x, path(), b"turn 1\nturn 2\n".to_vec())
        .await
        .unwrap();
    let paid = api_requests_since(&server, &before);

    let refused = stale.write(x, path(), b"stale\n".to_vec()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = stale.remove(x, path()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let touch = ExecRequest::new(
        vec!["touch".into(), "stale-was-here".into()],
        ExecOptions::default(),
    )
    .unwrap();
    let refused = stale.exec(x, touch).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(
        stale.read(x, path(), 1 << 10).await.unwrap(),
        b"turn 1\nturn 2\n",
        "reads are not fenced"
    );
    let pod = next.handle(x).unwrap().pod;
    assert_eq!(
        std::fs::read(server.pod_path(NS, &pod, "/workspace/turns.txt")).unwrap(),
        b"turn 1\nturn 2\n"
    );
    assert!(!server
        .pod_path(NS, &pod, "/workspace/stale-was-here")
        .exists());
    assert!(
        matches!(paid.as_slice(), [(r, 1)] if r.verb == k8s_loopback::Verb::Get
            && r.resource == objects.plural),
        "a fleet write costs one GET of its object: {paid:?}"
    );
    // The new owner's work goes on.
    next.remove(x, path()).await.unwrap();

    // A sandbox started without a token (a single keeper) pays nothing for the check.
    let y = SandboxId((1 << 32) | 4);
    let mut single = start(y.0, &key("s2"), 0);
    single.token = None;
    stale.start(single).await.unwrap();
    let before = server.request_counts();
    stale.write(y, path(), b"single\n".to_vec()).await.unwrap();
    stale.remove(y, path()).await.unwrap();
    let paid = api_requests_since(&server, &before);
    assert!(paid.is_empty(), "no request but execs: {paid:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_backend_s_operations_in_an_adopted_pod_change_nothing() {
    stale_operations_change_nothing_on(pod_config("first"), pod_config("second"), &PODS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_backend_s_operations_in_an_adopted_claim_change_nothing() {
    stale_operations_change_nothing_on(
        claim_config("first"),
        claim_config("second"),
        &SANDBOX_CLAIMS,
    )
    .await;
}

/// The pod itself refuses a change under a token older than its token file
/// (`<workdir>/.sandkeeper/token`), which an adopter writes before it touches the workspace:
/// the refusal is in the exec that would make the change, so a process whose check of the
/// object passed and which paused before its exec changes nothing once woken after a takeover.
/// Modelled by a token file newer than the object's annotation (what such a process's check
/// read): the object lets the change through, the pod refuses it. An adoption under a token
/// older than the pod's is refused too.
async fn the_pod_refuses_a_change_under_an_older_token_on(
    first: sandkeeper_k8s::K8sConfig,
    second: sandkeeper_k8s::K8sConfig,
    third: sandkeeper_k8s::K8sConfig,
) {
    use sandkeeper_tokio::ops::ExecRequest;
    use sandkeeper_tokio::{AdoptRequest, ExecOptions, OpError, SandboxOps, WorkPath};
    let server = server().await;
    let a = connect(&server, first).await;
    let b = connect(&server, second).await;
    let k = key("s1");
    let x = SandboxId((1 << 32) | 5);
    a.start(start(x.0, &k, 3)).await.unwrap();
    let path = || WorkPath::new("turns.txt").unwrap();
    a.write(x, path(), b"turn 1\n".to_vec()).await.unwrap();
    let adopt = |token| AdoptRequest {
        sandbox: x,
        key: k.clone(),
        token: Token(token),
    };
    b.adopt(adopt(4)).await.unwrap();
    let pod = b.handle(x).unwrap().pod;
    let file = server.pod_path(NS, &pod, "/workspace/.sandkeeper/token");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "4\n",
        "the adopter recorded its token in the pod"
    );
    b.write(x, path(), b"turn 1\nturn 2\n".to_vec())
        .await
        .unwrap();

    // A newer owner, as far as the pod knows; the object still says 4, so B's check passes.
    std::fs::write(&file, "5\n").unwrap();
    let refused = b.write(x, path(), b"late\n".to_vec()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = b.remove(x, path()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let touch = ExecRequest::new(
        vec!["touch".into(), "late-was-here".into()],
        ExecOptions::default(),
    )
    .unwrap();
    let refused = b.exec(x, touch).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read(server.pod_path(NS, &pod, "/workspace/turns.txt")).unwrap(),
        b"turn 1\nturn 2\n"
    );
    let root = WorkPath::new(".").unwrap();
    let names: Vec<String> = b
        .list(x, root)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        [".sandkeeper", "turns.txt"],
        "nothing made, no temporary left"
    );

    // An adoption under a token older than the pod's is refused.
    let c = connect(&server, third).await;
    let refused = c.adopt(adopt(4)).await.unwrap_err();
    assert_eq!(refused.class, FailureClass::Fenced, "{refused}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "5\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refuses_a_change_under_a_token_older_than_its_token_file() {
    the_pod_refuses_a_change_under_an_older_token_on(
        pod_config("first"),
        pod_config("second"),
        pod_config("third"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_pod_refuses_a_change_under_a_token_older_than_its_token_file() {
    the_pod_refuses_a_change_under_an_older_token_on(
        claim_config("first"),
        claim_config("second"),
        claim_config("third"),
    )
    .await;
}

/// A start that resumes a suspended claim records its token in the pod too: the workspace it
/// continues holds the token file an earlier owner's adoption wrote, which the pod's guard
/// must not take for the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_claim_s_pod_records_the_resuming_owner_s_token() {
    use sandkeeper_tokio::{AdoptRequest, PersistRequest, StopRequest};
    let server = server().await;
    let a = connect(&server, claim_config("first")).await;
    // A fleet's backend: it resumes claims any process of the fleet suspended.
    let b = sandkeeper_k8s::K8sBackend::connect_fleet(cluster(&server, claim_config("second")))
        .await
        .unwrap();
    let k = key("s1");
    let x = SandboxId((1 << 32) | 6);
    a.start(start(x.0, &k, 3)).await.unwrap();
    b.adopt(AdoptRequest {
        sandbox: x,
        key: k.clone(),
        token: Token(4),
    })
    .await
    .unwrap();
    let snapshot = b
        .stop(StopRequest {
            sandbox: x,
            suspend: true,
            token: Some(Token(4)),
        })
        .await
        .unwrap();
    b.persist(PersistRequest {
        sandbox: x,
        snapshot: snapshot.clone(),
        suspend: true,
        retain_until: None,
        token: Some(Token(4)),
    })
    .await
    .unwrap();
    let y = SandboxId((1 << 32) | 7);
    let mut resume = start(y.0, &k, 5);
    resume.resume_from = snapshot;
    resume.resumes = Some(x);
    b.start(resume).await.unwrap();
    let pod = b.handle(y).unwrap().pod;
    let file = server.pod_path(NS, &pod, "/workspace/.sandkeeper/token");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "5\n");
}
