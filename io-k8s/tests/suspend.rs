//! `ReleasePolicy::Suspend` through the io-tokio driver (`Keeper`) against the loopback API:
//! the last release suspends the claim (`Sandbox.spec.operatingMode: Suspended`, no pod; the
//! pod's deletion is reported as a lost instance and the core, which knows the sandbox is
//! being suspended or no longer tracks it, counts no death), the next call of the key resumes
//! the same claim with its workspace under a new sandbox number that its new pod carries from
//! birth, so deaths of the resumed sandbox name it while a late Delete of the suspended pod
//! names the suspended sandbox (stale for the core), a swept claim makes a fresh start, and
//! the keeper refuses `Suspend` in pod mode.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::{LEASES, PODS, SANDBOXES, SANDBOX_CLAIMS};
use k8s_loopback::store::{EventType, Propagation};
use k8s_loopback::{Fault, Loopback, Matcher, Verb};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sandkeeper::{CallId, CallSpec, Config, PathName, ReleasePolicy, SessionId};
use sandkeeper_k8s::{ConfigError, K8sBackend, K8sError, LossCounts};
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

/// Waits until the backend completed `n` suspensions and the core took them in (its `Persist`
/// answers reached it). The backend's count alone is not enough: a test that deletes the
/// suspended claim in between races the answer, and the core rightly counts a claim lost while
/// it still awaits the Persist as a death (CI hit this under load). No event marks a completed
/// suspension, so the core's count is polled until the deadline.
async fn suspended(keeper: &Keeper<K8sBackend>, n: u64) {
    let mut rx = keeper.backend().suspensions();
    tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n))
        .await
        .expect("suspended in time")
        .expect("the backend lives");
    tokio::time::timeout(WAIT, async {
        while keeper.stats().suspended < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the core took the suspensions in, in time");
}

/// Waits until the call is told its sandbox was lost (no event marks it on the guard, so it is
/// polled until the deadline).
async fn lost(guard: &CallGuard<K8sBackend>) {
    tokio::time::timeout(WAIT, async {
        while !guard.is_lost() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the call is told in time");
}

/// Waits until the losses the death watch reported satisfy `done` (each counted once the core
/// took it in).
async fn counts_until(keeper: &Keeper<K8sBackend>, done: impl Fn(&LossCounts) -> bool) {
    let mut rx = keeper.backend().loss_counts();
    tokio::time::timeout(WAIT, rx.wait_for(|c| done(c)))
        .await
        .expect("loss counts in time")
        .expect("the backend lives");
}

fn losses(keeper: &Keeper<K8sBackend>) -> LossCounts {
    *keeper.backend().loss_counts().borrow()
}

/// The `sandkeeper.sandbox.users.io/sandbox` label of the pod with `uid` in every change the store recorded
/// of it, from its creation on.
fn pod_label_history(server: &Loopback, uid: &str) -> Vec<(EventType, Value)> {
    let (history, _) = server.store().watch_from(0).unwrap();
    history
        .iter()
        .filter(|e| e.resource.plural == PODS.plural)
        .filter(|e| e.object["metadata"]["uid"].as_str() == Some(uid))
        .map(|e| {
            (
                e.kind,
                e.object["metadata"]["labels"]["sandkeeper.sandbox.users.io/sandbox"].clone(),
            )
        })
        .collect()
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
    let backend = connect(server, claim_config(owner)).await;
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

    // Suspended: the claim and its Sandbox stay, the pod goes, and its deletion is reported as
    // a lost instance of the first sandbox: the suspension's own doing while the persist is
    // outstanding, stale once it answered. No death either way.
    until(&server, "the sandbox is suspended", |s| {
        operating_mode(s, &sandbox_name).as_deref() == Some("Suspended")
            && !exists(s, &PODS, &h1.pod)
    })
    .await;
    counts_until(&keeper, |c| c.instances >= 1).await;
    assert!(
        exists(&server, &SANDBOX_CLAIMS, &h1.object),
        "the claim is kept"
    );
    let stats = keeper.stats();
    assert_eq!(stats.deaths, 0, "a suspension is no death");
    assert_eq!(stats.shutdowns_ordered, 0, "Suspend orders no shutdown");
    assert!(
        stats.instance_losses_suspending + stats.stale_answers >= 1,
        "{stats:?}"
    );
    assert_eq!(
        losses(&keeper),
        LossCounts {
            sandboxes: 0,
            instances: 1,
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
        server.store().get(rt, NS, name).unwrap()["metadata"]["labels"]
            ["sandkeeper.sandbox.users.io/sandbox"]
            .clone()
    };
    let new_number = Value::from(second.sandbox().0.to_string());
    assert_eq!(label(&SANDBOX_CLAIMS, &h2.object), new_number);
    assert_eq!(label(&PODS, &h2.pod), new_number);
    assert_eq!(
        server.store().get(&SANDBOXES, NS, &sandbox_name).unwrap()["spec"]["podTemplate"]
            ["metadata"]["labels"]["sandkeeper.sandbox.users.io/sandbox"],
        new_number,
        "the Sandbox makes its pods with the new number"
    );
    let born = pod_label_history(&server, &h2.pod_uid);
    assert_eq!(born.first().map(|e| e.0), Some(EventType::Added));
    assert!(
        born.iter().all(|(_, l)| *l == new_number),
        "the resumed pod carries the new number from birth: {born:?}"
    );
    let pushed: Timestamp = expiry(&server, &h2.object).parse().unwrap();
    assert!(
        pushed >= t0,
        "the resume pushed the expiry backstop out again: {pushed} < {t0}"
    );

    // A loss of the resumed sandbox's pod is reported as the new sandbox's. Its claim and
    // volume remain, so the core keeps the workspace (issue 30): the call is told, and the
    // sandbox is suspended again at its last release, the claim kept for the next call.
    delete_pod(&server, &h2.pod);
    counts_until(&keeper, |c| c.instances >= 2).await;
    lost(&second).await;
    assert!(
        keeper.resolve(&session).is_err(),
        "the call's sandbox is lost"
    );
    second.release().await;
    suspended(&keeper, 2).await;
    assert!(
        exists(&server, &SANDBOX_CLAIMS, &h2.object),
        "the claim is kept"
    );
    let stats = keeper.stats();
    assert_eq!(
        (stats.deaths, stats.instance_losses_kept),
        (0, 1),
        "{stats:?}"
    );
    close(keeper, &server, "susp").await;
}

fn first_sandbox(h: &sandkeeper_k8s::SandboxHandle) -> sandkeeper::SandboxId {
    sandkeeper::SandboxId(h.sandbox)
}

/// The pod goes from outside while the suspension is under way: reported as a lost instance,
/// which the core, knowing the sandbox is being suspended, takes for no death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_suspending_is_no_death() {
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
    delete_pod(&server, &h1.pod);
    counts_until(&keeper, |c| c.instances >= 1).await;
    let stats = keeper.stats();
    assert_eq!(
        (stats.instance_losses_suspending, stats.deaths),
        (1, 0),
        "the core knew the sandbox was being suspended: {stats:?}"
    );
    server.pause_controllers(false);
    // The suspension completes; the next call resumes the same claim.
    let second = call(&keeper, "c2", &session).await;
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_eq!(h2.object, h1.object);
    let stats = keeper.stats();
    assert_eq!((stats.deaths, stats.suspended), (0, 1));
    assert_eq!(
        losses(&keeper),
        LossCounts {
            sandboxes: 0,
            instances: 1,
        }
    );
    second.release().await;
    close(keeper, &server, "susp-d").await;
}

/// The race of issue #5: the death watch learns of the suspended pod's deletion only after the
/// claim resumed as a new sandbox, and the resumed pod has the same name. The resume labelled
/// the claim and its Sandbox's pod template with the new number before the new pod existed, so
/// the late Delete carries the old number: it is reported as a lost instance of the suspended
/// sandbox, which the core no longer tracks and ignores (a stale report), and the resumed
/// sandbox lives on. No table of incarnations or pod UIDs is needed for that.
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
    let (old_number, new_number) = (h1.sandbox.to_string(), second.sandbox().0.to_string());
    // Each pod carried its own sandbox's number for its whole life.
    let old = pod_label_history(&server, &h1.pod_uid);
    assert_eq!(old.last().map(|e| e.0), Some(EventType::Deleted));
    assert!(old.iter().all(|(_, l)| *l == old_number), "{old:?}");
    let born = pod_label_history(&server, &h2.pod_uid);
    assert_eq!(born.first().map(|e| e.0), Some(EventType::Added));
    assert!(
        born.iter().all(|(_, l)| *l == new_number),
        "the resumed pod carries the new number from birth: {born:?}"
    );
    assert_eq!(
        losses(&keeper),
        LossCounts::default(),
        "the death watch has seen nothing yet"
    );
    let before = keeper.stats();

    // Now the death watch sees the suspended pod's deletion, after the resume.
    server.faults().release_held_events();
    counts_until(&keeper, |c| c.total() >= 1).await;
    assert_eq!(
        losses(&keeper),
        LossCounts {
            sandboxes: 0,
            instances: 1,
        },
        "reported as what it is: the instance of the suspended sandbox"
    );
    let after = keeper.stats();
    assert_eq!(after.deaths, 0, "{after:?}");
    assert_eq!(
        after.instance_losses_suspending, before.instance_losses_suspending,
        "nothing is being suspended now"
    );
    assert!(
        after.stale_answers > before.stale_answers,
        "the core ignored a report naming a sandbox it no longer tracks: {after:?}"
    );
    assert_eq!(
        keeper.resolve(&session).expect("the resumed sandbox lives"),
        second.sandbox()
    );
    run_in(
        &keeper,
        &second,
        &["mkdir", "/workspace/after-the-late-event"],
    )
    .await
    .expect("the resumed pod still serves the call");
    keeper
        .flush(
            &session,
            &PathName::session_log(),
            b"{\"turn\":2}\n".to_vec(),
        )
        .unwrap();
    tokio::time::timeout(WAIT, keeper.mirror_settled(&session))
        .await
        .unwrap();
    let log = format!("/workspace/s1/{}", PathName::session_log().as_str());
    run_in(&keeper, &second, &["test", "-f", &log])
        .await
        .expect("an upload reached the resumed pod");

    // A loss of the resumed pod itself is still reported, as the resumed sandbox's: the call
    // is told, and the core suspends the sandbox (issue 30: its claim and volume remain).
    delete_pod(&server, &h2.pod);
    lost(&second).await;
    second.release().await;
    suspended(&keeper, 2).await;
    assert!(
        exists(&server, &SANDBOX_CLAIMS, &h2.object),
        "the claim is kept"
    );
    assert_eq!(keeper.stats().deaths, 0);
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
    // Reported as the suspended sandbox's loss; the core no longer tracks it.
    counts_until(&keeper, |c| c.sandboxes >= 1).await;
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
    use sandkeeper_tokio::Backend;
    let server = server().await;
    let suspend = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    // The backend says why when asked...
    let backend = connect(&server, pod_config("susp-p")).await;
    let why = backend.check_config(&suspend).unwrap_err();
    assert_eq!(why, ConfigError::SuspendNeedsAgentSandbox.to_string());
    assert!(why.contains("agentSandbox"), "{why}");
    // ... and other policies are fine in pod mode.
    let keep_warm = Config {
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(1),
        },
        ..Config::default()
    };
    assert_eq!(backend.check_config(&keep_warm), Ok(()));
    assert_eq!(backend.check_config(&Config::default()), Ok(()));
    backend.close().await.unwrap();
    // The keeper asks at construction and refuses to run.
    let backend = connect(&server, pod_config("susp-p")).await;
    let Err(e) = Keeper::new(KeeperConfig::with_core(suspend), backend) else {
        panic!("the keeper accepted Suspend in pod mode");
    };
    assert!(
        matches!(&e, KeeperError::Unsupported(why) if why.contains("agentSandbox")),
        "{e}"
    );
    // Agent-sandbox mode can.
    let backend = connect(&server, claim_config("susp-c")).await;
    assert_eq!(
        backend.check_config(&Config {
            release: ReleasePolicy::Suspend,
            ..Config::default()
        }),
        Ok(())
    );
    backend.close().await.unwrap();
    cluster(&server, pod_config("susp-p"))
        .release_lease()
        .await
        .unwrap();
    assert!(
        server.store().all(&LEASES).is_empty(),
        "{:?}",
        server.store().all(&LEASES)
    );
}

/// A suspending stop or persist never reaches a pod-mode backend (the keeper refuses the
/// policy); if one did, it is a fatal error, not a guess.
#[tokio::test]
async fn a_suspending_stop_or_persist_in_pod_mode_is_fatal() {
    use sandkeeper::{SandboxId, Snapshot};
    use sandkeeper_tokio::{Backend, FailureClass, PersistRequest, StopRequest};
    let server = server().await;
    let backend = connect(&server, pod_config("susp-x")).await;
    let sandbox = SandboxId(4);
    let e = backend
        .stop(StopRequest {
            sandbox,
            suspend: true,
            token: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Fatal, "{e}");
    let e = backend
        .persist(PersistRequest {
            sandbox,
            snapshot: Some(Snapshot::new("sk-susp-x-4")),
            suspend: true,
            retain_until: None,
            token: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Fatal, "{e}");
    // Without suspend there is nothing to do on the way down before the shutdown.
    let stopped = backend
        .stop(StopRequest {
            sandbox,
            suspend: false,
            token: None,
        })
        .await;
    assert_eq!(stopped, Ok(None));
    let persisted = backend
        .persist(PersistRequest {
            sandbox,
            snapshot: None,
            suspend: false,
            retain_until: None,
            token: None,
        })
        .await;
    assert_eq!(persisted, Ok(()));
    backend.close().await.unwrap();
}

#[tokio::test]
async fn a_malformed_snapshot_is_a_typed_start_failure() {
    use sandkeeper::{Key, Snapshot, Spec};
    use sandkeeper_tokio::{Backend, FailureClass, StartRequest};
    let server = server().await;
    let backend = connect(&server, claim_config("susp-m")).await;
    for bad in ["", "sk-other-3", "sk-susp-m-x", "../../etc"] {
        let e = backend
            .start(StartRequest {
                sandbox: sandkeeper::SandboxId(3),
                key: Key::Session(SessionId::new("s1").unwrap()),
                spec: Spec::default(),
                resume_from: Some(Snapshot::new(bad)),
                resumes: Some(sandkeeper::SandboxId(1)),
                token: None,
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
    // watch, which reports the failed pod (born with the new number) as the new sandbox's.
    assert_eq!(
        keeper.stats().starts_ok,
        1,
        "only the first start succeeded"
    );
    server.fail_new_pods(false);
    close(keeper, &server, "susp-f").await;
}

/// Tiers with a retention (issue 14): the suspended claim carries the retention's end as its
/// `shutdownTime` with policy `Delete`, so the claim controller deletes it by itself when no
/// keeper is left to (the claim's loss is stale news for the core, no death); a Discard deletes
/// a suspended claim at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_suspension_carries_its_expiry_on_the_claim_and_a_discard_deletes_it() {
    use sandkeeper::{DiscardReason, Key, Snapshot, Tiers, WayDown};
    use sandkeeper_tokio::{Backend, DiscardRequest};
    let server = server().await;
    let backend = connect(&server, claim_config("susp-r")).await;
    let core = Config {
        release: ReleasePolicy::Tiered(Tiers {
            idle: Duration::ZERO,
            then: WayDown::Suspend,
            retain: Some(Duration::from_secs(3_600)),
        }),
        ..Config::default()
    };
    let keeper = Keeper::new(KeeperConfig::with_core(core), backend).unwrap();
    let first = call(&keeper, "c1", &SessionId::new("s1").unwrap()).await;
    let second = call(&keeper, "c2", &SessionId::new("s2").unwrap()).await;
    let (h1, h2) = (
        keeper.backend().handle(first.sandbox()).unwrap(),
        keeper.backend().handle(second.sandbox()).unwrap(),
    );
    let x2 = second.sandbox();
    first.release().await;
    second.release().await;
    suspended(&keeper, 2).await;

    // The retention's end (an hour, from the Persist's deadline), policy Delete.
    let claim = server.store().get(&SANDBOX_CLAIMS, NS, &h1.object).unwrap();
    assert_eq!(
        claim["spec"]["lifecycle"]["shutdownPolicy"].as_str(),
        Some("Delete")
    );
    let until: Timestamp = expiry(&server, &h1.object).parse().unwrap();
    let now = Timestamp::now();
    assert!(
        until > now + SignedDuration::from_secs(3_590)
            && until < now + SignedDuration::from_secs(3_600 + 40),
        "shutdownTime {until}, now {now}"
    );

    // A Discard deletes the second claim now.
    keeper
        .backend()
        .discard(DiscardRequest {
            sandbox: x2,
            key: Key::Session(SessionId::new("s2").unwrap()),
            snapshot: Snapshot::new(h2.object.clone()),
            reason: DiscardReason::Retention,
            token: None,
        })
        .await
        .unwrap();
    until_gone(&server, &h2.object).await;

    // No keeper discards the first one: past its shutdownTime the controller deletes it.
    server.advance_clock(Duration::from_secs(3_700));
    until_gone(&server, &h1.object).await;
    assert_eq!(
        keeper.stats().deaths,
        0,
        "losses of suspended claims are no deaths"
    );
    close(keeper, &server, "susp-r").await;
}

async fn until_gone(server: &Loopback, claim: &str) {
    until(server, "the claim is gone", |s| {
        !exists(s, &SANDBOX_CLAIMS, claim)
    })
    .await;
}
