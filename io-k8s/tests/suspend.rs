//! `ReleasePolicy::Suspend` through the io-tokio driver (`Keeper`) against the loopback API:
//! the last release suspends the claim (`Sandbox.spec.operatingMode: Suspended`, no pod, no
//! death reported), the next call of the key resumes the same claim with its workspace, deaths
//! of the resumed sandbox name the new sandbox while a late Delete of the suspended pod names
//! none, a swept claim makes a fresh start, and pod mode refuses `Suspend`.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::{LEASES, PODS, SANDBOXES, SANDBOX_CLAIMS};
use k8s_loopback::store::Propagation;
use k8s_loopback::{Fault, Loopback, Matcher, Verb};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sandkeeper::{CallId, CallSpec, Config, PathName, ReleasePolicy, SessionId};
use sandkeeper_k8s::{ConfigError, DeathCounts, K8sBackend, K8sError};
use sandkeeper_tokio::{CallGuard, Keeper, KeeperConfig, KeeperError};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// Waits (bounded, without sleeping) until `done` holds for the store.
async fn until(server: &Loopback, what: &str, done: impl Fn(&Loopback) -> bool) {
    let mut events = server.store().subscribe();
    tokio::time::timeout(WAIT, async {
        while !done(server) {
            let _ = events.recv().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// Waits until the backend completed `n` suspensions.
async fn suspended(keeper: &Keeper<K8sBackend>, n: u64) {
    let mut rx = keeper.backend().suspensions();
    tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n))
        .await
        .expect("suspended in time")
        .expect("the backend lives");
}

async fn counts_until(keeper: &Keeper<K8sBackend>, done: impl Fn(&DeathCounts) -> bool) {
    let mut rx = keeper.backend().death_counts();
    tokio::time::timeout(WAIT, rx.wait_for(|c| done(c)))
        .await
        .expect("death counts in time")
        .expect("the backend lives");
}

fn operating_mode(server: &Loopback, sandbox: &str) -> Option<String> {
    server
        .store()
        .get(&SANDBOXES, NS, sandbox)
        .ok()
        .and_then(|s| s["spec"]["operatingMode"].as_str().map(str::to_string))
}

fn expiry(server: &Loopback, claim: &str) -> String {
    server.store().get(&SANDBOX_CLAIMS, NS, claim).unwrap()["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .unwrap()
        .to_string()
}

fn exists(server: &Loopback, rt: &k8s_loopback::resources::ResourceType, name: &str) -> bool {
    server.store().get(rt, NS, name).is_ok()
}

async fn suspending_keeper(server: &Loopback, owner: &str) -> Keeper<K8sBackend> {
    let backend = connect(server, claim_config(owner), ReleasePolicy::Suspend).await;
    let core = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    Keeper::new(KeeperConfig::with_core(core), backend).unwrap()
}

async fn call(
    keeper: &Keeper<K8sBackend>,
    name: &str,
    session: &SessionId,
) -> CallGuard<K8sBackend> {
    tokio::time::timeout(
        WAIT,
        keeper.acquire(CallSpec::new(CallId::new(name).unwrap(), session.clone())),
    )
    .await
    .expect("acquired in time")
    .unwrap()
}

/// Runs `argv` in the pod of the call's sandbox (no shell).
async fn run_in(
    keeper: &Keeper<K8sBackend>,
    guard: &CallGuard<K8sBackend>,
    argv: &[&str],
) -> Result<(), K8sError> {
    let h = keeper.backend().handle(guard.sandbox()).expect("started");
    keeper
        .backend()
        .cluster()
        .exec_with_stdin(
            &h.pod,
            argv.iter().map(|a| a.to_string()).collect(),
            Vec::new(),
        )
        .await
}

async fn close(keeper: Keeper<K8sBackend>, server: &Loopback, owner: &str) {
    tokio::time::timeout(WAIT, keeper.close(Duration::from_secs(10)))
        .await
        .unwrap();
    keeper.backend().close().await.unwrap();
    assert!(
        owned_by(server, owner).is_empty(),
        "left: {:?}",
        owned_by(server, owner)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_keeps_the_claim_without_a_pod_and_the_next_call_resumes_it() {
    let server = server().await;
    let keeper = suspending_keeper(&server, "susp").await;
    let session = SessionId::new("s1").unwrap();

    // First call: a file in the workspace, made in the pod itself (not by the mirror).
    let first = call(&keeper, "c1", &session).await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    let sandbox_name = h1.sandbox_name.clone().unwrap();
    run_in(&keeper, &first, &["mkdir", "/workspace/made-in-call-1"])
        .await
        .unwrap();
    keeper
        .flush(
            &session,
            &PathName::session_log(),
            b"{\"turn\":1}\n".to_vec(),
        )
        .unwrap();
    tokio::time::timeout(WAIT, keeper.mirror_settled(&session))
        .await
        .unwrap();
    first.release().await;

    // Suspended: the claim and its Sandbox stay, the pod goes, and its deletion is held back.
    until(&server, "the sandbox is suspended", |s| {
        operating_mode(s, &sandbox_name).as_deref() == Some("Suspended")
            && !exists(s, &PODS, &h1.pod)
    })
    .await;
    counts_until(&keeper, |c| c.held_back >= 1).await;
    assert!(
        exists(&server, &SANDBOX_CLAIMS, &h1.object),
        "the claim is kept"
    );
    let stats = keeper.stats();
    assert_eq!(stats.deaths, 0, "a suspension is no death");
    assert_eq!(stats.shutdowns_ordered, 0, "Suspend orders no shutdown");
    assert_eq!(
        *keeper.backend().death_counts().borrow(),
        DeathCounts {
            reported: 0,
            held_back: 1,
            late_pod_events: 0,
        }
    );

    // While suspended, the backstop comes nearer (as if the suspension lasted 12 hours).
    let t0: Timestamp = expiry(&server, &h1.object).parse().unwrap();
    let nearer = t0 - SignedDuration::from_hours(12);
    server
        .store()
        .modify(&SANDBOX_CLAIMS, NS, &h1.object, |c| {
            c["spec"]["lifecycle"]["shutdownTime"] = Value::from(nearer.to_string())
        })
        .unwrap();

    // Second call of the key: the same claim resumes (a new sandbox number, a new pod).
    let second = call(&keeper, "c2", &session).await;
    assert_ne!(second.sandbox(), first_sandbox(&h1));
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_eq!(
        h2.object, h1.object,
        "resumed the same claim (the start carried resume_from)"
    );
    assert_eq!(keeper.stats().suspended, 1);
    assert_eq!(
        operating_mode(&server, &sandbox_name).as_deref(),
        Some("Running")
    );
    run_in(
        &keeper,
        &second,
        &["test", "-d", "/workspace/made-in-call-1"],
    )
    .await
    .expect("the workspace survived the suspension");
    let label = |rt, name: &str| -> Value {
        server.store().get(rt, NS, name).unwrap()["metadata"]["labels"]["sandkeeper.io/sandbox"]
            .clone()
    };
    let new_number = Value::from(second.sandbox().0.to_string());
    assert_eq!(label(&SANDBOX_CLAIMS, &h2.object), new_number);
    assert_eq!(label(&PODS, &h2.pod), new_number);
    let pushed: Timestamp = expiry(&server, &h2.object).parse().unwrap();
    assert!(
        pushed >= t0,
        "the resume pushed the expiry backstop out again: {pushed} < {t0}"
    );

    // A death of the resumed sandbox is reported as the new sandbox's: the core loses it and
    // orders its Shutdown, which deletes the resumed claim as usual.
    server
        .store()
        .delete(&PODS, NS, &h2.pod, Propagation::Background, None)
        .unwrap();
    counts_until(&keeper, |c| c.reported >= 1).await;
    until(&server, "the resumed claim is deleted", |s| {
        !exists(s, &SANDBOX_CLAIMS, &h2.object)
    })
    .await;
    assert!(
        matches!(
            keeper.resolve(&session),
            Err(KeeperError::Core(sandkeeper::Error::SandboxGone { .. }))
        ),
        "{:?}",
        keeper.resolve(&session)
    );
    assert_eq!(keeper.stats().deaths, 1);
    second.release().await;
    close(keeper, &server, "susp").await;
}

fn first_sandbox(h: &sandkeeper_k8s::SandboxHandle) -> sandkeeper::SandboxId {
    sandkeeper::SandboxId(h.sandbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_suspending_is_not_reported_as_a_death() {
    let server = server().await;
    let keeper = suspending_keeper(&server, "susp-d").await;
    let session = SessionId::new("s1").unwrap();
    let first = call(&keeper, "c1", &session).await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    let sandbox_name = h1.sandbox_name.clone().unwrap();
    // The controllers stall; the backend patches Suspended and waits; meanwhile the pod is
    // deleted from outside (an eviction racing the suspension).
    server.pause_controllers(true);
    first.release().await;
    until(&server, "the suspension is ordered", |s| {
        operating_mode(s, &sandbox_name).as_deref() == Some("Suspended")
    })
    .await;
    server
        .store()
        .delete(&PODS, NS, &h1.pod, Propagation::Background, None)
        .unwrap();
    counts_until(&keeper, |c| c.held_back >= 1).await;
    server.pause_controllers(false);
    // The suspension completes; the next call resumes the same claim.
    let second = call(&keeper, "c2", &session).await;
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_eq!(h2.object, h1.object);
    let stats = keeper.stats();
    assert_eq!((stats.deaths, stats.suspended), (0, 1));
    assert_eq!(keeper.backend().death_counts().borrow().reported, 0);
    second.release().await;
    close(keeper, &server, "susp-d").await;
}

/// The race of issue #5: the death watch learns of the suspended pod's deletion only after the
/// claim resumed as a new sandbox. The late event carries the old pod's labels (the Sandbox's
/// pod template keeps the first sandbox number, which now routes to the resumed sandbox) and
/// the resumed pod has the same name, so only the pod's UID tells the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_delete_of_the_suspended_pod_is_no_death_of_the_resumed_sandbox() {
    let server = server().await;
    // The first pod watch is the death watch's (connecting lists, and starts in agent-sandbox
    // mode watch claims): its events are held until released.
    server
        .faults()
        .inject(Matcher::on(Verb::Watch, "pods"), Fault::HoldEvents, 1);
    let keeper = suspending_keeper(&server, "susp-l").await;
    // The death watch's two watches (pods, claims) are open before any call.
    tokio::time::timeout(WAIT, server.wait_for_watches(2))
        .await
        .expect("the death watch opened");
    assert_eq!(
        server.faults().pending(),
        0,
        "the death watch is the held one"
    );
    let session = SessionId::new("s1").unwrap();
    let first = call(&keeper, "c1", &session).await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first.release().await;
    suspended(&keeper, 1).await;
    let second = call(&keeper, "c2", &session).await;
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_eq!(h2.object, h1.object, "resumed the same claim");
    assert_eq!(
        h2.pod, h1.pod,
        "agent-sandbox names the pod after its Sandbox"
    );
    assert_ne!(h2.pod_uid, h1.pod_uid, "a new pod");
    assert_eq!(
        *keeper.backend().death_counts().borrow(),
        DeathCounts::default(),
        "the death watch has seen nothing yet"
    );

    // Now the death watch sees the suspended pod's deletion, after the resume.
    server.faults().release_held_events();
    counts_until(&keeper, |c| c.held_back + c.reported >= 1).await;
    let counts = *keeper.backend().death_counts().borrow();
    assert_eq!(
        counts,
        DeathCounts {
            reported: 0,
            held_back: 1,
            late_pod_events: 1,
        },
        "held back by the old pod's UID, not reported for the resumed sandbox"
    );
    assert_eq!(keeper.stats().deaths, 0);
    assert!(
        keeper.resolve(&session).is_ok(),
        "the resumed sandbox lives"
    );
    run_in(
        &keeper,
        &second,
        &["mkdir", "/workspace/after-the-late-event"],
    )
    .await
    .expect("the resumed pod still serves the call");

    // A death of the resumed pod itself is still reported, as the resumed sandbox's: the core
    // loses it and orders its Shutdown, which deletes the claim.
    server
        .store()
        .delete(&PODS, NS, &h2.pod, Propagation::Background, None)
        .unwrap();
    until(&server, "the resumed claim is deleted", |s| {
        !exists(s, &SANDBOX_CLAIMS, &h2.object)
    })
    .await;
    assert_eq!(keeper.stats().deaths, 1);
    second.release().await;
    close(keeper, &server, "susp-l").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_swept_claim_starts_a_fresh_one() {
    let server = server().await;
    let keeper = suspending_keeper(&server, "susp-g").await;
    let session = SessionId::new("s1").unwrap();
    let first = call(&keeper, "c1", &session).await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    let sandbox_name = h1.sandbox_name.clone().unwrap();
    first.release().await;
    until(&server, "the sandbox is suspended", |s| {
        operating_mode(s, &sandbox_name).as_deref() == Some("Suspended")
            && !exists(s, &PODS, &h1.pod)
    })
    .await;
    suspended(&keeper, 1).await;
    // The suspended claim is swept (a human, or its expiry backstop).
    server
        .store()
        .delete(
            &SANDBOX_CLAIMS,
            NS,
            &h1.object,
            Propagation::Background,
            None,
        )
        .unwrap();
    until(&server, "the claim is gone", |s| {
        !exists(s, &SANDBOX_CLAIMS, &h1.object)
    })
    .await;
    let second = call(&keeper, "c2", &session).await;
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_ne!(h2.object, h1.object, "a fresh claim");
    assert_eq!(h2.object, format!("sk-susp-g-{}", second.sandbox().0));
    assert!(exists(&server, &SANDBOX_CLAIMS, &h2.object));
    assert_eq!(
        keeper.stats().deaths,
        0,
        "the swept suspended claim was no death"
    );
    second.release().await;
    close(keeper, &server, "susp-g").await;
}

#[tokio::test]
async fn pod_mode_refuses_suspend() {
    let server = server().await;
    let r = K8sBackend::connect(
        cluster(&server, pod_config("susp-p")),
        ReleasePolicy::Suspend,
    )
    .await;
    let Err(e) = r else {
        panic!("pod mode accepted Suspend");
    };
    assert!(
        matches!(e, K8sError::Config(ConfigError::SuspendNeedsAgentSandbox)),
        "{e}"
    );
    assert!(e.to_string().contains("agentSandbox"), "{e}");
    assert!(
        server.store().all(&LEASES).is_empty(),
        "refused before taking a Lease"
    );
    // Other policies are fine in pod mode.
    let keep_warm = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(1),
    };
    let backend = connect(&server, pod_config("susp-p"), keep_warm).await;
    backend.close().await.unwrap();
}

#[tokio::test]
async fn a_malformed_snapshot_is_a_typed_start_failure() {
    use sandkeeper::{Key, Snapshot, Spec};
    use sandkeeper_tokio::{Backend, FailureClass, StartRequest};
    let server = server().await;
    let backend = connect(&server, claim_config("susp-m"), ReleasePolicy::Suspend).await;
    for bad in ["", "sk-other-3", "sk-susp-m-x", "../../etc"] {
        let e = backend
            .start(StartRequest {
                sandbox: sandkeeper::SandboxId(3),
                key: Key::Session(SessionId::new("s1").unwrap()),
                spec: Spec::default(),
                resume_from: Some(Snapshot::new(bad)),
            })
            .await
            .unwrap_err();
        assert_eq!(e.class, FailureClass::Fatal, "{bad:?}: {e}");
        assert!(e.message.contains("snapshot"), "{bad:?}: {e}");
    }
    assert!(
        server.store().all(&SANDBOX_CLAIMS).is_empty(),
        "nothing was created"
    );
    backend.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_fails_deletes_the_claim() {
    let server = server().await;
    let keeper = suspending_keeper(&server, "susp-f").await;
    let session = SessionId::new("s1").unwrap();
    let first = call(&keeper, "c1", &session).await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first.release().await;
    suspended(&keeper, 1).await;
    // The resumed pod fails: the Sandbox reports PodFailed (terminal), the start fails, and
    // the claim it resumed is deleted (the core will not offer its snapshot again).
    server.fail_new_pods(true);
    let r = tokio::time::timeout(
        WAIT,
        keeper.acquire(CallSpec::new(CallId::new("c2").unwrap(), session.clone())),
    )
    .await
    .expect("answered in time");
    assert!(r.is_err(), "the call on a failed resume fails");
    until(&server, "the claim is deleted", |s| {
        !exists(s, &SANDBOX_CLAIMS, &h1.object)
    })
    .await;
    // Failed either way: by the resume's own wait (PodFailed is terminal) or by the death
    // watch, which reports the failed pod as the new sandbox's.
    assert_eq!(
        keeper.stats().starts_ok,
        1,
        "only the first start succeeded"
    );
    server.fail_new_pods(false);
    close(keeper, &server, "susp-f").await;
}
