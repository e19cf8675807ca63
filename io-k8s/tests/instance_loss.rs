//! A claim's pod lost while its claim and volumes remain (deleted by hand, evicted, drained,
//! or deleted by the controller's own auto-suspension) loses the running instance only, never
//! the workspace. Against the loopback API, through the backend's commands as the core orders
//! them for an instance loss (issue 30, cause 4b): the sandbox is suspended at once (`Stop` and
//! `Persist` with `suspend`, its pod gone or made again by the controller meanwhile), nothing is
//! deleted, and the key's next start resumes the same claim with the files an earlier call
//! wrote, in the pod the controller makes, labelled with the new sandbox. A Sandbox the
//! controller suspended for inactivity (`spec.autoSuspension`, `operatingMode` left `Running`)
//! is reported as a lost instance only, and is resumed, or adopted in a fleet, as a suspended
//! one. Through the keeper: a warm sandbox's pod evicted (`KeepWarm`, `Tiered`) or a pod lost
//! under a call (told `SandboxLost`) keeps its claim and volume, and the key's next call
//! continues from the files earlier calls wrote.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_loopback::resources::{PODS, SANDBOXES, SANDBOX_CLAIMS};
use k8s_loopback::Loopback;
use sandkeeper::{
    CallId, CallSpec, Config, Key, PathName, Payload, ReleasePolicy, SandboxId, SessionId,
    Snapshot, Spec, Tiers, Token, Version, WayDown,
};
use sandkeeper_k8s::{Death, K8sBackend};
use sandkeeper_tokio::{
    AdoptRequest, Backend, CallGuard, Keeper, KeeperConfig, Loss, PersistRequest, StartRequest,
    StopRequest, UploadRequest,
};
use serde_json::Value;

fn key() -> Key {
    Key::Session(SessionId::new("s1").unwrap())
}

fn start(
    sandbox: SandboxId,
    resume_from: Option<Snapshot>,
    resumes: Option<SandboxId>,
) -> StartRequest {
    StartRequest {
        sandbox,
        key: key(),
        spec: Spec::new(""),
        resume_from,
        resumes,
        token: Some(Token(1)),
    }
}

fn upload(sandbox: SandboxId, version: u64, token: u64) -> UploadRequest {
    UploadRequest {
        upload: sandkeeper::UploadId(version),
        sandbox,
        session: SessionId::new("s1").unwrap(),
        path: PathName::session_log(),
        version: Version(version),
        payload: Payload::new(format!("v{version}").into_bytes()),
        token: Some(Token(token)),
    }
}

/// The session log an upload wrote, as the pod `pod` sees it.
fn session_log(server: &Loopback, pod: &str) -> Option<Vec<u8>> {
    let path = format!("/workspace/s1/{}", PathName::session_log().as_str());
    std::fs::read(server.pod_path(NS, pod, &path)).ok()
}

fn sandbox_label(o: &Value) -> Option<&str> {
    o.pointer("/metadata/labels/sandkeeper.sandbox.users.io~1sandbox")
        .and_then(Value::as_str)
}

fn pod(server: &Loopback, name: &str) -> Option<Value> {
    server.store().get(&PODS, NS, name).ok()
}

fn running(p: &Value) -> bool {
    p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/metadata/deletionTimestamp").is_none()
}

/// The sandbox's suspension as the core orders it on an instance loss: `Stop` then
/// `Persist`, both with `suspend`, no retention. Returns the snapshot (the claim's name).
async fn suspend(b: &K8sBackend, sandbox: SandboxId) -> Option<Snapshot> {
    let snapshot = b
        .stop(StopRequest {
            sandbox,
            suspend: true,
            token: Some(Token(1)),
        })
        .await
        .expect("the stop answers");
    b.persist(PersistRequest {
        sandbox,
        snapshot: snapshot.clone(),
        suspend: true,
        retain_until: None,
        token: Some(Token(1)),
    })
    .await
    .expect("the suspension answers");
    snapshot
}

/// Deletes the pod `name` by hand and waits until the controller made it again and it runs.
async fn lose_pod(server: &Loopback, name: &str) {
    let uid = pod(server, name).expect("the pod")["metadata"]["uid"].clone();
    delete_pod(server, name);
    until(server, "the controller made the pod again, running", || {
        pod(server, name).is_some_and(|p| p["metadata"]["uid"] != uid && running(&p))
    })
    .await;
}

/// The losses the death watch of `b`'s cluster reports, collected from now on (once its
/// watches are open).
async fn deaths(
    server: &Loopback,
    b: &K8sBackend,
) -> (
    tokio::sync::watch::Receiver<Vec<Death>>,
    sandkeeper_k8s::DeathWatch,
) {
    let (tx, rx) = tokio::sync::watch::channel(Vec::new());
    let tx = Arc::new(tx);
    let opened = server.watches_opened();
    let watch = b.cluster().spawn_death_watch(move |d| {
        tx.send_modify(|v| v.push(d));
        true
    });
    server.wait_for_watches(opened + 2).await;
    (rx, watch)
}

/// Runs `task` (spawned after the controllers were paused and `opened` watches counted): the
/// task must not answer while the controllers are paused but wait on a watch of its own, for
/// what only a controller does. The controllers run again then, and its answer is returned.
async fn waits_for_the_controller<T>(
    server: &Loopback,
    opened: u64,
    task: tokio::task::JoinHandle<T>,
    what: &str,
) -> T {
    let mut task = task;
    let early = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            r = &mut task => true.then_some(r),
            () = server.wait_for_watches(opened + 1) => None,
        }
    })
    .await
    .expect("it answers or waits, in time");
    assert!(
        early.is_none(),
        "{what} answered before the controller had done its part"
    );
    server.pause_controllers(false);
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("it answers once the controller runs")
        .expect("it does not panic")
}

/// A pod deleted by hand while its sandbox is warm: the controller makes it again on the same
/// volumes; the suspension the core orders neither deletes the claim nor its workspace, and
/// the key's next start resumes the same claim with the file an earlier call wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_by_hand_is_suspended_and_resumed_on_its_volume() {
    let server = server().await;
    let b = connect(&server, claim_config("me")).await;
    let x = SandboxId((1 << 32) | 7);
    b.start(start(x, None, None)).await.unwrap();
    b.upload(upload(x, 1, 1)).await.unwrap();
    let h = b.handle(x).unwrap();
    lose_pod(&server, &h.pod).await;

    let snapshot = suspend(&b, x).await;
    assert_eq!(snapshot, Some(Snapshot::new(h.object.clone())), "the claim");
    assert!(
        server.store().get(&SANDBOX_CLAIMS, NS, &h.object).is_ok(),
        "the claim is kept"
    );
    let sb = h.sandbox_name.clone().unwrap();
    let o = server.store().get(&SANDBOXES, NS, &sb).unwrap();
    assert_eq!(o["spec"]["operatingMode"], "Suspended");
    assert!(pod(&server, &h.pod).is_none(), "suspended: no pod");

    let y = SandboxId((1 << 32) | 8);
    b.start(start(y, snapshot, Some(x))).await.unwrap();
    let h2 = b.handle(y).unwrap();
    assert_eq!(h2.object, h.object, "the same claim");
    assert_eq!(
        session_log(&server, &h2.pod).as_deref(),
        Some(&b"v1"[..]),
        "the workspace an earlier call wrote"
    );
    let p = pod(&server, &h2.pod).unwrap();
    assert_eq!(sandbox_label(&p), Some(y.0.to_string().as_str()));
    b.upload(upload(y, 2, 1)).await.unwrap();
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v2"[..]));
    b.shutdown(y, Some(Token(1))).await.unwrap();
}

/// A resume of a claim whose Sandbox was never suspended (its pod lost and made again by the
/// controller, the suspension not done): the resume takes the pod the controller made, once
/// it carries the new sandbox's number, so its loss names the sandbox it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_takes_the_pod_the_controller_made_again() {
    let server = server().await;
    let b = Arc::new(connect(&server, claim_config("me")).await);
    let x = SandboxId((1 << 32) | 7);
    b.start(start(x, None, None)).await.unwrap();
    b.upload(upload(x, 1, 1)).await.unwrap();
    let h = b.handle(x).unwrap();
    lose_pod(&server, &h.pod).await;
    b.relinquish(x).await;

    // The controllers paused: the pod keeps the old sandbox's number until they run again.
    server.pause_controllers(true);
    let opened = server.watches_opened();
    let y = SandboxId((1 << 32) | 8);
    let snapshot = Snapshot::new(h.object.clone());
    let resuming = {
        let b = b.clone();
        tokio::spawn(async move { b.start(start(y, Some(snapshot), Some(x))).await })
    };
    waits_for_the_controller(&server, opened, resuming, "the resume")
        .await
        .unwrap();
    let h2 = b.handle(y).unwrap();
    assert_eq!(h2.object, h.object, "the same claim");
    let p = pod(&server, &h2.pod).expect("its pod");
    assert_eq!(p["metadata"]["uid"].as_str(), Some(h2.pod_uid.as_str()));
    assert_eq!(
        sandbox_label(&p),
        Some(y.0.to_string().as_str()),
        "the pod serves the resumed sandbox by the time the start answers"
    );
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v1"[..]));
    b.shutdown(y, Some(Token(1))).await.unwrap();
}

/// The controller's auto-suspension deletes the pod: a lost instance, never a lost sandbox;
/// the claim stays. The suspension the core orders then takes it over by mode, and the next
/// start resumes it with its workspace, running past the inactivity timeout it had used up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_suspension_is_a_lost_instance_and_the_claim_resumes() {
    let server = server().await;
    let b = Arc::new(connect(&server, claim_config("me")).await);
    let x = SandboxId((1 << 32) | 7);
    b.start(start(x, None, None)).await.unwrap();
    b.upload(upload(x, 1, 1)).await.unwrap();
    let h = b.handle(x).unwrap();
    let sb = h.sandbox_name.clone().unwrap();
    let (mut reported, _watch) = deaths(&server, &b).await;

    auto_suspend(&server, &sb, &h.pod).await;
    tokio::time::timeout(
        Duration::from_secs(10),
        reported.wait_for(|v| {
            v.iter()
                .any(|d| d.sandbox == x.0 && d.loss == Loss::Instance)
        }),
    )
    .await
    .expect("the pod's loss is reported in time")
    .unwrap();
    assert!(server.store().get(&SANDBOX_CLAIMS, NS, &h.object).is_ok());

    // The suspension answers only once the controller took it for a suspension by mode: a
    // resume setting `Running` before that would find the Sandbox suspended by the controller
    // still, which `Running` does not end (the resume would time out and delete the claim).
    server.pause_controllers(true);
    let opened = server.watches_opened();
    let suspending = {
        let b = b.clone();
        tokio::spawn(async move { suspend(&b, x).await })
    };
    let snapshot = waits_for_the_controller(&server, opened, suspending, "the suspension").await;
    assert_eq!(
        ready_reason(&server, &sb).as_deref(),
        Some("False/SandboxUserSuspended"),
        "the suspension is the keeper's now"
    );
    let y = SandboxId((1 << 32) | 8);
    b.start(start(y, snapshot, Some(x))).await.unwrap();
    let h2 = b.handle(y).unwrap();
    assert_eq!(h2.object, h.object);
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v1"[..]));
    // Running again counted as activity: the controller leaves it running.
    server.advance_clock(Duration::from_secs(30));
    b.upload(upload(y, 2, 1)).await.unwrap();
    assert!(pod(&server, &h2.pod).is_some_and(|p| running(&p)));

    let losses = reported.borrow().clone();
    assert!(
        losses.iter().all(|d| d.loss == Loss::Instance),
        "a suspension is never the loss of the sandbox: {losses:?}"
    );
    b.shutdown(y, Some(Token(1))).await.unwrap();
}

/// A start resuming a claim the controller suspended by itself (no keeper suspended it:
/// `operatingMode` is still `Running`, which setting again does not end) runs it again on its
/// volumes instead of waiting for it in vain and deleting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_controller_suspended_is_resumed_not_deleted() {
    let server = server().await;
    let b = connect(&server, claim_config("me")).await;
    let x = SandboxId((1 << 32) | 7);
    b.start(start(x, None, None)).await.unwrap();
    b.upload(upload(x, 1, 1)).await.unwrap();
    let h = b.handle(x).unwrap();
    let sb = h.sandbox_name.clone().unwrap();
    auto_suspend(&server, &sb, &h.pod).await;
    b.relinquish(x).await;

    let y = SandboxId((1 << 32) | 8);
    let r = b
        .start(start(y, Some(Snapshot::new(h.object.clone())), Some(x)))
        .await;
    assert!(
        server.store().get(&SANDBOX_CLAIMS, NS, &h.object).is_ok(),
        "never deleted"
    );
    r.unwrap();
    let h2 = b.handle(y).unwrap();
    assert_eq!(h2.object, h.object, "the same claim");
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v1"[..]));
    b.shutdown(y, Some(Token(1))).await.unwrap();
}

/// In a fleet, the next owner adopting a sandbox whose Sandbox the controller suspended for
/// inactivity finds it suspended, not dead: it runs again for the adopter, with its workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_controller_suspended_runs_again_for_the_adopter() {
    let server = server().await;
    let a = connect(&server, claim_config("first")).await;
    let x = SandboxId((1 << 32) | 7);
    a.start(start(x, None, None)).await.unwrap();
    a.upload(upload(x, 1, 1)).await.unwrap();
    let h = a.handle(x).unwrap();
    a.relinquish(x).await;
    auto_suspend(&server, h.sandbox_name.as_deref().unwrap(), &h.pod).await;

    let b = connect(&server, claim_config("second")).await;
    b.adopt(AdoptRequest {
        sandbox: x,
        key: key(),
        token: Token(2),
    })
    .await
    .expect("adopted");
    let h2 = b.handle(x).unwrap();
    assert_eq!(h2.object, h.object, "the same claim, running again");
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v1"[..]));
    b.upload(upload(x, 2, 2)).await.unwrap();
    assert_eq!(session_log(&server, &h2.pod).as_deref(), Some(&b"v2"[..]));
    b.shutdown(x, Some(Token(2))).await.unwrap();
}

const WAIT: Duration = Duration::from_secs(30);

async fn keeper(server: &Loopback, owner: &str, release: ReleasePolicy) -> Keeper<K8sBackend> {
    let backend = connect(server, claim_config(owner)).await;
    let core = Config {
        release,
        ..Config::default()
    };
    Keeper::new(KeeperConfig::with_core(core), backend).unwrap()
}

async fn call(keeper: &Keeper<K8sBackend>, name: &str) -> CallGuard<K8sBackend> {
    let spec = CallSpec::new(CallId::new(name).unwrap(), SessionId::new("s1").unwrap());
    tokio::time::timeout(WAIT, keeper.acquire(spec))
        .await
        .expect("acquired in time")
        .expect("acquired")
}

/// Runs `argv` (no shell) in the pod of the call's sandbox.
async fn run_in(keeper: &Keeper<K8sBackend>, guard: &CallGuard<K8sBackend>, argv: &[&str]) {
    let h = keeper.backend().handle(guard.sandbox()).expect("started");
    let argv = argv.iter().map(|a| a.to_string()).collect();
    keeper
        .backend()
        .cluster()
        .exec_with_stdin(&h.pod, argv, Vec::new())
        .await
        .expect("ran in the pod");
}

/// The first call's work, acknowledged: a directory made in the pod by the call, and the
/// session log flushed and mirrored into the sandbox.
async fn first_calls_work(keeper: &Keeper<K8sBackend>, guard: &CallGuard<K8sBackend>) {
    run_in(keeper, guard, &["mkdir", "/workspace/made-in-call-1"]).await;
    let session = SessionId::new("s1").unwrap();
    keeper
        .flush(
            &session,
            &PathName::session_log(),
            b"{\"turn\":1}\n".to_vec(),
        )
        .unwrap();
    tokio::time::timeout(WAIT, keeper.mirror_settled(&session))
        .await
        .expect("mirrored in time");
}

/// Polls the keeper's stats (no event marks them) until `done`, bounded.
async fn stats_until(
    keeper: &Keeper<K8sBackend>,
    what: &str,
    done: impl Fn(&sandkeeper::Stats) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        while !done(&keeper.stats()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never: {what}: {:?}", keeper.stats()));
}

/// The key's next call after the loss: the same claim resumed, with the first call's work.
async fn next_call_continues(server: &Loopback, keeper: &Keeper<K8sBackend>, claim: &str) {
    let second = call(keeper, "c2").await;
    let h2 = keeper.backend().handle(second.sandbox()).unwrap();
    assert_eq!(h2.object, claim, "the same claim, resumed");
    run_in(
        keeper,
        &second,
        &["test", "-d", "/workspace/made-in-call-1"],
    )
    .await;
    assert_eq!(
        session_log(server, &h2.pod).as_deref(),
        Some(&b"{\"turn\":1}\n"[..]),
        "the acknowledged session log"
    );
    let p = pod(server, &h2.pod).unwrap();
    assert_eq!(
        sandbox_label(&p),
        Some(second.sandbox().0.to_string().as_str())
    );
    second.release().await;
}

async fn close(keeper: Keeper<K8sBackend>) {
    tokio::time::timeout(WAIT, keeper.close(Duration::from_secs(10)))
        .await
        .unwrap();
    keeper.backend().close().await.unwrap();
}

/// A warm sandbox's pod evicted (deleted from outside; the controller makes it again on the
/// same volumes): the core suspends it instead of shutting it down, and the key's next call
/// resumes the same claim with what the first call wrote.
async fn a_warm_sandboxs_lost_pod_keeps_the_workspace(owner: &str, release: ReleasePolicy) {
    let server = server().await;
    let keeper = keeper(&server, owner, release).await;
    let first = call(&keeper, "c1").await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first_calls_work(&keeper, &first).await;
    first.release().await;
    stats_until(&keeper, "the sandbox is warm", |s| s.calls_released >= 1).await;

    delete_pod(&server, &h1.pod);
    stats_until(&keeper, "the lost instance was kept", |s| {
        s.instance_losses_kept >= 1 && s.suspended >= 1
    })
    .await;
    let stats = keeper.stats();
    assert_eq!(stats.deaths, 0, "{stats:?}");
    assert_eq!(stats.shutdowns_ordered, 0, "nothing deleted: {stats:?}");
    assert!(
        server.store().get(&SANDBOX_CLAIMS, NS, &h1.object).is_ok(),
        "the claim is kept"
    );
    let sb = h1.sandbox_name.clone().unwrap();
    assert_eq!(
        server.store().get(&SANDBOXES, NS, &sb).unwrap()["spec"]["operatingMode"],
        "Suspended"
    );

    next_call_continues(&server, &keeper, &h1.object).await;
    close(keeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_warm_a_warm_sandboxs_lost_pod_keeps_the_workspace() {
    let release = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(3_600),
    };
    a_warm_sandboxs_lost_pod_keeps_the_workspace("warm", release).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_a_warm_sandboxs_lost_pod_keeps_the_workspace() {
    let release = ReleasePolicy::Tiered(Tiers {
        idle: Duration::from_secs(3_600),
        then: WayDown::Shutdown,
        retain: None,
    });
    a_warm_sandboxs_lost_pod_keeps_the_workspace("tiered", release).await;
}

/// A pod lost under a call: the call is told (`SandboxLost`), the sandbox is suspended at its
/// last release, not shut down, and the key's next call continues from the first call's
/// acknowledged work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_pod_is_lost_is_told_and_the_key_continues() {
    let server = server().await;
    let release = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(3_600),
    };
    let keeper = keeper(&server, "told", release).await;
    let first = call(&keeper, "c1").await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first_calls_work(&keeper, &first).await;

    delete_pod(&server, &h1.pod);
    tokio::time::timeout(WAIT, async {
        while !first.is_lost() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the call is told in time");
    first.release().await;
    stats_until(&keeper, "the lost instance was kept", |s| {
        s.instance_losses_kept >= 1 && s.suspended >= 1
    })
    .await;
    let stats = keeper.stats();
    assert_eq!((stats.deaths, stats.shutdowns_ordered), (0, 0), "{stats:?}");
    assert!(server.store().get(&SANDBOX_CLAIMS, NS, &h1.object).is_ok());

    next_call_continues(&server, &keeper, &h1.object).await;
    close(keeper).await;
}

/// The controller's own auto-suspension of a warm sandbox: a lost instance, which the core
/// takes for a suspension; the next call resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_suspended_warm_sandbox_is_resumed_by_the_next_call() {
    let server = server().await;
    let release = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(3_600),
    };
    let keeper = keeper(&server, "auto", release).await;
    let first = call(&keeper, "c1").await;
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first_calls_work(&keeper, &first).await;
    first.release().await;
    stats_until(&keeper, "the sandbox is warm", |s| s.calls_released >= 1).await;

    // The core suspends it by mode as soon as it hears of the pod's loss.
    outlive_inactivity_timeout(&server, h1.sandbox_name.as_deref().unwrap()).await;
    stats_until(&keeper, "the lost instance was kept", |s| {
        s.instance_losses_kept >= 1 && s.suspended >= 1
    })
    .await;
    let stats = keeper.stats();
    assert_eq!((stats.deaths, stats.shutdowns_ordered), (0, 0), "{stats:?}");
    assert!(server.store().get(&SANDBOX_CLAIMS, NS, &h1.object).is_ok());

    next_call_continues(&server, &keeper, &h1.object).await;
    close(keeper).await;
}
