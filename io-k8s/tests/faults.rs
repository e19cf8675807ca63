//! Every fault switch of the loopback API against the operations: conflicts, throttling,
//! server errors, permission errors, slow answers, dropped watches, execs without a status
//! frame, an upload cut mid-stream (all or nothing: the previous version stays whole), a stalled
//! upload (killed in the pod, no temporary left), and a pod deleted in the middle of an upload.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS};
use k8s_loopback::{Fault, Matcher, Verb};
use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::EXEC_GRACE;
use sandkeeper_k8s::{Cluster, ErrorClass, K8sConfig, K8sError, SandboxHandle, UploadFile};

#[tokio::test]
async fn conflicts_throttling_and_server_errors_are_retried_to_success() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-f"));
    let f = server.faults();
    f.inject(
        Matcher::on(Verb::Create, "sandboxclaims"),
        Fault::Status(409),
        1,
    );
    f.inject(
        Matcher::on(Verb::Create, "sandboxclaims"),
        Fault::Status(429),
        2,
    );
    f.inject(Matcher::on(Verb::Get, "sandboxes"), Fault::Status(500), 1);
    f.inject(Matcher::on(Verb::Get, "pods"), Fault::Status(503), 2);
    f.inject(
        Matcher::on(Verb::Delete, "sandboxclaims"),
        Fault::Status(429),
        1,
    );
    let h = k.start_sandbox(1, "s").await.unwrap();
    k.shutdown_sandbox(&h).await.unwrap();
    assert_eq!(
        f.pending(),
        0,
        "every injected fault was met and retried past"
    );
    assert!(server.store().all(&SANDBOX_CLAIMS).is_empty());
}

#[tokio::test]
async fn a_conflicting_create_adopts_a_claim_that_an_earlier_attempt_made() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-c"));
    let first = k.create_claim(4, "s").await.unwrap();
    // The answer of the first create was "lost": creating again meets 409 AlreadyExists,
    // reads the claim afresh, finds it ours and adopts it.
    assert_eq!(k.create_claim(4, "s").await.unwrap(), first);
    // Someone else's claim under that name is not adopted.
    let other = cluster(&server, claim_config("owner-d"));
    let mut c = other.claim_for(4, "s").unwrap();
    c.metadata.name = Some("sk-owner-e-4".into());
    kube::Api::<sandkeeper_k8s::crd::SandboxClaim>::namespaced(client(&server), NS)
        .create(&Default::default(), &c)
        .await
        .unwrap();
    let e = cluster(&server, claim_config("owner-e"))
        .create_claim(4, "s")
        .await
        .unwrap_err();
    assert_eq!(e.class(), ErrorClass::Fatal, "{e}");
}

#[tokio::test]
async fn persistent_server_errors_give_up_within_the_deadline() {
    let server = server().await;
    let mut c = claim_config("owner-x");
    c.api_deadline_secs = 1;
    let k = cluster(&server, c);
    server.faults().inject(
        Matcher::on(Verb::Create, "sandboxclaims"),
        Fault::Status(503),
        10_000,
    );
    let e = k.create_claim(1, "s").await.unwrap_err();
    assert!(matches!(e, K8sError::Retryable { code: 503, .. }), "{e}");
    // Counted, not timed: backoff from 5 ms doubling fits about eight attempts into the 1 s
    // budget; a retry loop that ignored the deadline would go on through all 10,000.
    let attempts = 10_000 - server.faults().pending();
    assert!(
        (2..=20).contains(&attempts),
        "retried, then gave up at the deadline: {attempts} attempts"
    );
}

#[tokio::test]
async fn permission_errors_are_fatal_and_name_the_missing_permission() {
    let server = server().await;
    let k = cluster(&server, pod_config("owner-r"));
    server
        .faults()
        .inject(Matcher::on(Verb::Create, "pods"), Fault::Status(403), 1);
    let e = k.create_pod(1, "s").await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Fatal);
    assert!(e.to_string().contains("`create` on `pods`"), "{e}");
    server
        .faults()
        .inject(Matcher::on(Verb::Create, "pods"), Fault::Status(401), 1);
    assert!(matches!(
        k.create_pod(1, "s").await.unwrap_err(),
        K8sError::Forbidden { code: 401, .. }
    ));

    let h = k.start_sandbox(2, "s").await.unwrap();
    server
        .faults()
        .inject(Matcher::exec(), Fault::Status(403), 1);
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("f").unwrap());
    let e = k
        .upload(
            &h.pod,
            &[UploadFile {
                session: &s,
                path: &p,
                bytes: b"x",
            }],
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("`create` on `pods/exec`"), "{e}");
}

/// The files of a session directory in a pod (names sorted), temporaries included.
fn session_files(server: &k8s_loopback::Loopback, pod: &str, session: &str) -> Vec<String> {
    let dir = server.pod_path(NS, pod, &format!("/workspace/{session}"));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn put<'a>(s: &'a SessionId, p: &'a PathName, bytes: &'a [u8]) -> [UploadFile<'a>; 1] {
    [UploadFile {
        session: s,
        path: p,
        bytes,
    }]
}

/// A started pod-mode sandbox whose session `s` holds `log` = `v1`: the previous version the
/// upload-fault tests below must leave whole.
struct WithV1 {
    k: Cluster,
    h: SandboxHandle,
    s: SessionId,
    p: PathName,
}

async fn with_v1(server: &k8s_loopback::Loopback, config: K8sConfig) -> WithV1 {
    let k = cluster(server, config);
    let h = k.start_sandbox(1, "s").await.unwrap();
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("log").unwrap());
    k.upload(&h.pod, &put(&s, &p, b"v1")).await.unwrap();
    WithV1 { k, h, s, p }
}

#[tokio::test]
async fn an_exec_without_a_status_frame_is_an_unknown_outcome_never_success() {
    let server = server().await;
    let WithV1 { k, h, s, p } = with_v1(&server, pod_config("owner-n")).await;
    server
        .faults()
        .inject(Matcher::exec(), Fault::ExecWithoutStatus, 1);
    let e = k.upload(&h.pod, &put(&s, &p, b"data")).await.unwrap_err();
    assert!(matches!(e, K8sError::OutcomeUnknown { .. }), "{e}");
    assert_eq!(
        e.class(),
        ErrorClass::Retryable,
        "the pod lives: worth another try"
    );
    assert_eq!(server.faults().pending(), 0, "the fault was met");
    // The extraction ran, but with its outcome unknown nothing was renamed: the previous
    // version is intact, and the temporary was removed.
    let log = server.pod_path(NS, &h.pod, "/workspace/s/log");
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
    assert_eq!(session_files(&server, &h.pod, "s"), ["log"]);
    k.upload(&h.pod, &put(&s, &p, b"again")).await.unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), b"again");
    assert_eq!(session_files(&server, &h.pod, "s"), ["log"]);
}

#[tokio::test]
async fn an_upload_cut_mid_stream_leaves_the_previous_version_whole() {
    let server = server().await;
    let WithV1 { k, h, s, p } = with_v1(&server, pod_config("owner-t")).await;
    // The connection drops after 64 KiB of a 256 KiB upload: tar in the pod extracts a
    // truncated file and fails, and no status frame comes back.
    server
        .faults()
        .inject(Matcher::exec(), Fault::CutStdinAfter(64 * 1024), 1);
    let payload = vec![7u8; 256 * 1024];
    let e = k.upload(&h.pod, &put(&s, &p, &payload)).await.unwrap_err();
    assert!(matches!(e, K8sError::OutcomeUnknown { .. }), "{e}");
    assert_eq!(server.faults().pending(), 0, "the fault was met");
    // No partial file under the final name: the previous version is whole, and the truncated
    // temporary was removed.
    let log = server.pod_path(NS, &h.pod, "/workspace/s/log");
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
    assert_eq!(session_files(&server, &h.pod, "s"), ["log"]);
    k.upload(&h.pod, &put(&s, &p, &payload)).await.unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), payload);
}

/// A stalled upload: `tar` in the pod has begun its temporary and waits for the rest. The
/// in-container `timeout` kills it before the client's deadline (which is longer by
/// `EXEC_GRACE`), the status frame reports the kill, and only then are the temporaries removed:
/// nothing is left behind, and the previous version is whole.
#[tokio::test]
async fn a_stalled_upload_is_killed_in_the_pod_and_leaves_no_temporary() {
    let server = server().await;
    let mut c = pod_config("owner-k");
    c.upload_timeout_secs = 1;
    let WithV1 { k, h, s, p } = with_v1(&server, c).await;
    server
        .faults()
        .inject(Matcher::exec(), Fault::StallStdinAfter(4096), 1);
    let payload = vec![7u8; 256 * 1024];
    let e = k.upload(&h.pod, &put(&s, &p, &payload)).await.unwrap_err();
    assert!(
        matches!(&e, K8sError::Timeout { what, after }
            if what.contains("killed in the container") && *after == Duration::from_secs(1)),
        "killed by the in-container timeout (SIGKILL, exit 137), not cut by the client: {e}"
    );
    assert_eq!(e.class(), ErrorClass::Timeout, "worth a retry");
    assert_eq!(server.faults().pending(), 0, "the fault was met");
    let log = server.pod_path(NS, &h.pod, "/workspace/s/log");
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
    assert_eq!(
        session_files(&server, &h.pod, "s"),
        ["log"],
        "no temporary left"
    );
    k.upload(&h.pod, &put(&s, &p, &payload)).await.unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), payload);
}

#[tokio::test]
async fn a_pod_deleted_mid_upload_makes_the_upload_gone() {
    let server = server().await;
    // No deadline of the upload's own can end it: the connection's end must.
    let mut c = pod_config("owner-m");
    c.upload_timeout_secs = 3600;
    let WithV1 { k, h, s, p } = with_v1(&server, c).await;
    server
        .faults()
        .inject(Matcher::exec(), Fault::DeletePodMidUpload, 1);
    // More than the 64 KiB stdin buffer: the rest of the input cannot be written once the
    // connection is gone, and the upload must not wait for it.
    let payload = vec![7u8; 256 * 1024];
    let e = tokio::time::timeout(
        Duration::from_secs(60),
        k.upload(&h.pod, &put(&s, &p, &payload)),
    )
    .await
    .expect("the upload ends with its connection, not at a deadline")
    .unwrap_err();
    assert!(
        e.is_gone(),
        "R6: an upload into a deleted pod is a typed Gone, not a crash or a success: {e}"
    );
    assert!(server.store().all(&PODS).is_empty());
    // The upload was cut off mid-stream: the final name still holds the previous version
    // (what the pod's volume would keep), never a truncated new one.
    let log = server.pod_path(NS, &h.pod, "/workspace/s/log");
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
    // Exec into the pod that is gone is Gone as well (404 on the upgrade).
    let e = k.upload(&h.pod, &put(&s, &p, b"x")).await.unwrap_err();
    assert!(e.is_gone(), "{e}");
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
}

#[tokio::test]
async fn a_slow_exec_hits_the_client_deadline() {
    let server = server().await;
    let mut c = pod_config("owner-l");
    c.upload_timeout_secs = 1;
    let k = cluster(&server, c);
    let h = k.start_sandbox(1, "s").await.unwrap();
    server
        .faults()
        .inject(Matcher::exec(), Fault::Delay(Duration::from_secs(5)), 1);
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("log").unwrap());
    let e = k
        .upload(
            &h.pod,
            &[UploadFile {
                session: &s,
                path: &p,
                bytes: b"x",
            }],
        )
        .await
        .unwrap_err();
    // The client's own deadline: the in-container timeout (1 s) plus the grace. (Had the client
    // waited for the delayed answer, the upload would have succeeded.)
    assert!(
        matches!(e, K8sError::Timeout { after, .. } if after == Duration::from_secs(1) + EXEC_GRACE),
        "{e}"
    );
}

#[tokio::test]
async fn readiness_survives_slow_answers_and_dropped_watches() {
    let server = server().await;
    let k = cluster(&server, claim_config("owner-d"));
    server.faults().inject(
        Matcher::on(Verb::List, "sandboxclaims"),
        Fault::Delay(Duration::from_millis(50)),
        1,
    );
    server.pause_controllers(true);
    let name = k.create_claim(1, "s").await.unwrap();
    let waiting = {
        let k = k.clone();
        let name = name.clone();
        tokio::spawn(async move { k.wait_claim_ready(&name).await })
    };
    server.wait_for_watches(1).await;
    server.faults().drop_watches();
    server.wait_for_watches(2).await;
    server.faults().drop_watches();
    server.wait_for_watches(3).await;
    server.pause_controllers(false);
    let sandbox = waiting.await.unwrap().unwrap();
    assert!(
        sandbox.starts_with("pool-"),
        "the claim {name} is Ready with the pool Sandbox it adopted, not {sandbox}"
    );
}
