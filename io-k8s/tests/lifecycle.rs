//! Start, upload and shutdown in both modes against the loopback API, with the labels, expiry
//! backstops, readiness waits and cascade the design asks for.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::{PODS, SANDBOXES, SANDBOX_CLAIMS};
use k8s_loopback::store::{Event, EventType};
use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::names::session_hash;
use sandkeeper_k8s::{ErrorClass, K8sError, UploadFile};
use serde_json::{json, Value};

/// Waits (bounded) for the store to report `kind` for pod `name`.
async fn pod_event(
    events: &mut tokio::sync::broadcast::Receiver<std::sync::Arc<Event>>,
    kind: EventType,
    name: &str,
) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.kind == kind && ev.resource == PODS && ev.object["metadata"]["name"] == name {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind:?} event for pod {name}"));
}

fn file<'a>(s: &'a SessionId, p: &'a PathName, bytes: &'a [u8]) -> UploadFile<'a> {
    UploadFile {
        session: s,
        path: p,
        bytes,
    }
}

#[tokio::test]
async fn agent_sandbox_claim_starts_takes_files_and_cascades_on_delete() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-a"));
    let h = k.start_sandbox(7, "session-1").await.unwrap();
    assert_eq!(h.object, "sk-owner-a-7");
    let sandbox = h.sandbox_name.clone().unwrap();
    assert!(
        sandbox.starts_with("pool-"),
        "an adopted Sandbox keeps the pool's name: {sandbox}"
    );
    assert_eq!(h.pod, sandbox, "the pod is named after its Sandbox");

    let claim = server
        .store()
        .get(&SANDBOX_CLAIMS, NS, "sk-owner-a-7")
        .unwrap();
    let l = labels(&claim);
    assert_eq!(l["sandkeeper.sandbox.users.io/owner"], "owner-a");
    assert_eq!(
        l["sandkeeper.sandbox.users.io/session-hash"],
        session_hash("session-1").as_str()
    );
    assert_eq!(l["sandkeeper.sandbox.users.io/sandbox"], "7");
    let shutdown: k8s_openapi::jiff::Timestamp = claim["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        shutdown > server.store().now(),
        "the expiry backstop is in the future"
    );
    assert_eq!(claim["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
    let pod = server.store().get(&PODS, NS, &h.pod).unwrap();
    assert_eq!(
        labels(&pod)["sandkeeper.sandbox.users.io/owner"],
        "owner-a",
        "pod labelled through additionalPodMetadata"
    );

    let (s, p) = (
        SessionId::new("session-1").unwrap(),
        PathName::new("log.jsonl").unwrap(),
    );
    k.upload(&h.pod, &[file(&s, &p, b"{\"turn\":1}\n")])
        .await
        .unwrap();
    k.upload(&h.pod, &[file(&s, &p, b"{\"turn\":2}\n")])
        .await
        .unwrap();
    let on_disk = server.pod_path(NS, &h.pod, "/workspace/session-1/log.jsonl");
    assert_eq!(std::fs::read_to_string(&on_disk).unwrap(), "{\"turn\":2}\n");

    k.shutdown_sandbox(&h).await.unwrap();
    assert!(server.store().all(&SANDBOX_CLAIMS).is_empty());
    assert!(
        server.store().all(&SANDBOXES).is_empty(),
        "the claim owned the Sandbox"
    );
    assert!(
        server.store().all(&PODS).is_empty(),
        "the Sandbox owned the Pod"
    );
    k.shutdown_sandbox(&h)
        .await
        .expect("a second shutdown finds it gone: success");
}

#[tokio::test]
async fn pod_mode_sets_the_deadline_backstop_and_uploads() {
    let server = server().await;
    let k = cluster(&server, pod_config("owner-p"));
    let h = k.start_sandbox(3, "s").await.unwrap();
    assert_eq!(h.pod, "sk-owner-p-3");
    let pod = server.store().get(&PODS, NS, &h.pod).unwrap();
    assert_eq!(pod["spec"]["activeDeadlineSeconds"], 86400);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(labels(&pod)["app"], "sandbox", "template labels kept");
    assert_eq!(labels(&pod)["sandkeeper.sandbox.users.io/owner"], "owner-p");
    assert!(pod["metadata"]["annotations"]["sandkeeper.sandbox.users.io/expires-at"].is_string());

    let (s, p) = (
        SessionId::new("s").unwrap(),
        PathName::new("memory.md").unwrap(),
    );
    let big = vec![b'x'; 300 * 1024];
    k.upload(&h.pod, &[file(&s, &p, &big)]).await.unwrap();
    assert_eq!(
        std::fs::read(server.pod_path(NS, &h.pod, "/workspace/s/memory.md")).unwrap(),
        big
    );
    k.shutdown_sandbox(&h).await.unwrap();
    assert!(server.store().all(&PODS).is_empty());
}

/// A reason the controller never reconciles away (here `InvalidMetadata`, set by hand while
/// the controllers are paused) fails the start at once, and the claim is cleaned up.
#[tokio::test]
async fn terminal_claim_reasons_fail_fast_and_clean_up() {
    let server = server().await;
    server.pause_controllers(true);
    let k = cluster(&server, claim_config("owner-t"));
    let start = tokio::spawn(async move { k.start_sandbox(1, "s").await });
    until(&server, "the claim", || {
        !server.store().all(&SANDBOX_CLAIMS).is_empty()
    })
    .await;
    server
        .store()
        .modify(&SANDBOX_CLAIMS, NS, "sk-owner-t-1", |c| {
            c["status"] = json!({"conditions": [{"type": "Ready", "status": "False",
                "reason": "InvalidMetadata", "message": "label domain \"x.io\" is not in the allowlist"}]});
        })
        .unwrap();
    let e = start.await.unwrap().unwrap_err();
    assert!(
        matches!(&e, K8sError::Terminal { reason, .. } if reason == "InvalidMetadata"),
        "{e}"
    );
    assert_eq!(e.class(), ErrorClass::Fatal);
    assert!(
        server.store().all(&SANDBOX_CLAIMS).is_empty(),
        "the failed start deleted its claim"
    );
}

#[tokio::test]
async fn readiness_comes_from_the_watch_and_a_deleted_claim_is_gone() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-w"));
    server.pause_controllers(true);
    let name = k.create_claim(1, "s").await.unwrap();
    let waiting = {
        let k = k.clone();
        let name = name.clone();
        tokio::spawn(async move { k.wait_claim_ready(&name).await })
    };
    server.wait_for_watches(1).await;
    assert!(
        !waiting.is_finished(),
        "not ready while the controller is paused"
    );
    server.pause_controllers(false);
    let sandbox = waiting.await.unwrap().unwrap();
    assert!(
        sandbox.starts_with("pool-"),
        "the claim {name} is Ready with the pool Sandbox it adopted, not {sandbox}"
    );

    // A claim deleted while waited for is gone, at once.
    server.pause_controllers(true);
    let name2 = k.create_claim(2, "s").await.unwrap();
    let opened = server.watches_opened();
    let waiting = {
        let k = k.clone();
        let name2 = name2.clone();
        tokio::spawn(async move { k.wait_claim_ready(&name2).await })
    };
    server.wait_for_watches(opened + 1).await;
    server
        .store()
        .delete(
            &SANDBOX_CLAIMS,
            NS,
            &name2,
            k8s_loopback::store::Propagation::Background,
            None,
        )
        .unwrap();
    let e = waiting.await.unwrap().unwrap_err();
    assert!(e.is_gone(), "{e}");
    // And a claim that is not there at all is gone too.
    assert!(k
        .wait_claim_ready("sk-owner-w-99")
        .await
        .unwrap_err()
        .is_gone());
}

#[tokio::test]
async fn the_wait_relists_after_410_gone_and_survives_dropped_watches() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-g"));
    server.pause_controllers(true);
    let name = k.create_claim(1, "s").await.unwrap();
    let waiting = {
        let k = k.clone();
        let name = name.clone();
        tokio::spawn(async move { k.wait_claim_ready(&name).await })
    };
    server.wait_for_watches(1).await;
    // The stream drops, then a change the waiter has not seen, then history compaction (all
    // before the waiter runs again): its re-watch from its old resourceVersion gets 410 and it
    // must relist.
    server.faults().drop_watches();
    server
        .store()
        .modify(&SANDBOX_CLAIMS, NS, &name, |c| {
            c["metadata"]["annotations"] = serde_json::json!({"touched": "yes"});
        })
        .unwrap();
    server.store().compact();
    server.wait_for_watches(2).await;
    server.pause_controllers(false);
    let sandbox = waiting.await.unwrap().unwrap();
    assert!(
        sandbox.starts_with("pool-"),
        "the claim {name} is Ready with the pool Sandbox it adopted, not {sandbox}"
    );
    assert!(
        server.watches_expired() >= 1,
        "a watch was answered 410 Gone and the waiter went on"
    );
}

#[tokio::test]
async fn suspend_deletes_the_pod_and_resume_brings_one_back() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-s"));
    let h = k.start_sandbox(1, "s").await.unwrap();
    let sb = h.sandbox_name.clone().unwrap();
    let mut events = server.store().subscribe();
    k.set_operating_mode(&sb, true).await.unwrap();
    pod_event(&mut events, EventType::Deleted, &h.pod).await;
    let e = k.wait_pod_running(&h.pod).await.unwrap_err();
    assert!(e.is_gone(), "a suspended sandbox has no pod: {e}");
    let sandbox = server.store().get(&SANDBOXES, NS, &sb).unwrap();
    assert_eq!(sandbox["spec"]["operatingMode"], "Suspended");
    k.set_operating_mode(&sb, false).await.unwrap();
    pod_event(&mut events, EventType::Added, &h.pod).await;
    k.wait_pod_running(&h.pod).await.unwrap();
    let sandbox = server.store().get(&SANDBOXES, NS, &sb).unwrap();
    let ready = sandbox["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready["status"], Value::from("True"));
}

#[tokio::test]
async fn upload_limits_and_command_failures_are_typed() {
    let server = server().await;
    let mut c = pod_config("owner-u");
    c.max_payload_bytes = 1024;
    c.workdir = "/workspace/missing-dir".into();
    let k = cluster(&server, c);
    let h = k.start_sandbox(1, "s").await.unwrap();
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("f").unwrap());
    let e = k
        .upload(&h.pod, &[file(&s, &p, &[0u8; 2048])])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            K8sError::TooLarge {
                size: 2048,
                limit: 1024
            }
        ),
        "{e}"
    );
    let e = k.upload(&h.pod, &[file(&s, &p, b"x")]).await.unwrap_err();
    assert!(
        matches!(&e, K8sError::CommandFailed { code, .. } if *code != 0),
        "{e}"
    );
}

/// Exec finds a pod by name, and the controller recreates a deleted pod under the same name:
/// an upload by name alone lands in the new, empty instance. `upload_into` pins the instance
/// by UID and fails `Gone` instead, naming both UIDs (the flake of driver test r6 was this:
/// an upload into the recreated pod succeeded before the death watch reported the deletion).
#[tokio::test]
async fn an_upload_pinned_to_an_instance_fails_gone_once_the_pod_was_recreated() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-pin"));
    let h = k.start_sandbox(1, "s").await.unwrap();
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("f").unwrap());
    k.upload_into(&h.pod, &h.pod_uid, &[file(&s, &p, b"one")])
        .await
        .unwrap();
    delete_pod(&server, &h.pod);
    let running_again = || {
        server.store().get(&PODS, NS, &h.pod).is_ok_and(|p| {
            p["metadata"]["uid"] != h.pod_uid.as_str() && p["status"]["phase"] == "Running"
        })
    };
    until(&server, "the pod", running_again).await;
    let e = k
        .upload_into(&h.pod, &h.pod_uid, &[file(&s, &p, b"two")])
        .await
        .unwrap_err();
    assert_eq!(e.class(), ErrorClass::Gone, "{e}");
    assert!(e.to_string().contains(&h.pod_uid), "{e}");
    // By name alone the same upload succeeds, into the new instance.
    k.upload(&h.pod, &[file(&s, &p, b"two")]).await.unwrap();
}

/// A resume names the claim's objects after the new sandbox before its pod exists: the claim,
/// the label it asks its pod to carry, and the Sandbox's pod template, so the new pod is made
/// with the new number. The controllers keep it so: a pod relabelled against its template, or a
/// Sandbox's template edited against its claim, is set back (as the real agent-sandbox
/// controllers do, which is why the resume never patches the pod itself).
#[tokio::test]
async fn a_resume_names_the_new_pod_after_the_new_sandbox_from_birth() {
    use sandkeeper_k8s::Resumable;
    let server = server().await;
    let k = cluster(&server, claim_config("owner-r"));
    let h = k.start_sandbox(1, "s").await.unwrap();
    k.suspend_sandbox(&h).await.unwrap();
    let Resumable::Claim(found) = k.find_suspended(&h.object).await.unwrap() else {
        panic!("the suspended claim is there");
    };
    assert_eq!(found.label, Some(1), "labelled by the sandbox it served");
    let r = k.resume_sandbox(7, &found).await.unwrap();
    assert_eq!((r.sandbox, &r.object, &r.pod), (7, &h.object, &h.pod));
    let label = "sandkeeper.sandbox.users.io/sandbox";
    let claim = server.store().get(&SANDBOX_CLAIMS, NS, &h.object).unwrap();
    assert_eq!(labels(&claim)[label], "7");
    assert_eq!(claim["spec"]["additionalPodMetadata"]["labels"][label], "7");
    let sb = h.sandbox_name.clone().unwrap();
    let template = |server: &k8s_loopback::Loopback| {
        server.store().get(&SANDBOXES, NS, &sb).unwrap()["spec"]["podTemplate"]["metadata"]
            ["labels"][label]
            .clone()
    };
    assert_eq!(template(&server), "7");
    // The new pod's every recorded change, from its creation on, carries 7.
    let (history, _) = server.store().watch_from(0).unwrap();
    let born: Vec<_> = history
        .iter()
        .filter(|e| e.resource == PODS && e.object["metadata"]["uid"] == r.pod_uid.as_str())
        .collect();
    assert_eq!(born.first().map(|e| e.kind), Some(EventType::Added));
    assert!(born.iter().all(|e| labels(&e.object)[label] == "7"));

    // Set back: a pod relabelled by hand, a Sandbox template edited against its claim.
    server
        .store()
        .modify(&PODS, NS, &r.pod, |p| {
            p["metadata"]["labels"][label] = Value::from("1")
        })
        .unwrap();
    let pod_label = || labels(&server.store().get(&PODS, NS, &r.pod).unwrap())[label].clone();
    until(&server, "the pod label", || pod_label() == "7").await;
    server
        .store()
        .modify(&SANDBOXES, NS, &sb, |s| {
            s["spec"]["podTemplate"]["metadata"]["labels"][label] = Value::from("1")
        })
        .unwrap();
    until(&server, "the Sandbox template", || {
        template(&server) == "7" && pod_label() == "7"
    })
    .await;
}
