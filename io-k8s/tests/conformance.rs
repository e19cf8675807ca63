//! Issue 12's rows: what the backend got wrong on a real agent-sandbox install, each checked
//! against the loopback where it now behaves like the real controller or API server.

mod common;

use common::*;

use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::{ErrorClass, K8sError, Mode, UploadFile};
use serde_json::json;

/// A warm pool `name` whose template's pod has a `main` container and a `proxy` sidecar.
fn pool_with_a_sidecar(server: &k8s_loopback::Loopback, name: &str) {
    pool_with(server, name, &["main", "proxy"]);
}

/// A warm pool `name` (template `<name>-tpl`) whose pods have these containers.
fn pool_with(server: &k8s_loopback::Loopback, name: &str, containers: &[&str]) {
    let containers: Vec<_> = containers
        .iter()
        .map(|c| json!({"name": c, "image": "busybox"}))
        .collect();
    pool_of(
        server,
        name,
        json!({"podTemplate": {"spec": {"containers": containers}}}),
    );
}

/// A warm pool `name` whose template `<name>-tpl` has this `spec`.
fn pool_of(server: &k8s_loopback::Loopback, name: &str, spec: serde_json::Value) {
    let template = format!("{name}-tpl");
    server
        .store()
        .create(
            &SANDBOX_TEMPLATES,
            NS,
            json!({"metadata": {"name": template}, "spec": spec}),
        )
        .unwrap();
    server
        .store()
        .create(
            &SANDBOX_WARM_POOLS,
            NS,
            json!({"metadata": {"name": name}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": template}}}),
        )
        .unwrap();
}

/// Row E: the API server runs an unnamed exec only in a pod's only container; with a sidecar
/// it answers 400 "a container name must be specified", and the error says so and names the
/// containers (it used to read "exec upgrade answered 400 Bad Request"). With `container`
/// set, the upload goes to that container.
#[tokio::test]
async fn e_an_unnamed_exec_into_a_pod_with_a_sidecar_says_which_container_to_name() {
    let server = server().await;
    pool_with_a_sidecar(&server, "sidecar");
    let mut config = claim_config("owner-e");
    config.mode = sandkeeper_k8s::Mode::AgentSandbox {
        warm_pool: "sidecar".into(),
    };
    let k = cluster(&server, config.clone());
    let h = k.start_sandbox(1, "s").await.unwrap();
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("f").unwrap());
    let file = UploadFile {
        session: &s,
        path: &p,
        bytes: b"x",
    };
    let e = k
        .upload(&h.pod, std::slice::from_ref(&file))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, K8sError::Invalid { code: 400, .. }), "{e:?}");
    assert!(
        text.contains(&format!(
            "a container name must be specified for pod {}, choose one of: [main proxy]",
            h.pod
        )),
        "{text}"
    );
    assert!(text.contains("set `container`"), "{text}");

    config.container = Some("main".into());
    let k = cluster(&server, config);
    k.upload(&h.pod, std::slice::from_ref(&file))
        .await
        .expect("an upload into the named container");
}

/// Row E in pod mode: a template with a sidecar and no `container` is refused when the
/// backend is configured, before any pod exists.
#[test]
fn e_a_pod_template_with_a_sidecar_needs_the_container_named() {
    let mut config = pod_config("owner-e");
    let sandkeeper_k8s::Mode::Pod { template } = &mut config.mode else {
        unreachable!()
    };
    let spec = template.spec.as_mut().unwrap();
    let mut sidecar = spec.containers[0].clone();
    sidecar.name = "proxy".into();
    spec.containers.push(sidecar);
    let e = config.validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "the pod template's exec container: a container name must be specified for pod \
         <template>, choose one of: [main proxy]; set `container` to the container uploads go to"
    );
    config.container = Some("proxy".into());
    config.validate().expect("the container is named");
    config.container = Some("nope".into());
    assert!(config.validate().is_err(), "a container the pod lacks");
}

/// The `Ready` condition's reason of the one claim in the store, if any.
fn claim_reason(server: &k8s_loopback::Loopback) -> Option<String> {
    let claims = server.store().all(&SANDBOX_CLAIMS);
    let conditions = claims
        .first()?
        .pointer("/status/conditions")?
        .as_array()?
        .clone();
    conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["reason"].as_str().map(str::to_string))
}

fn late_pool_config(owner: &str, ready_timeout_secs: u64) -> sandkeeper_k8s::K8sConfig {
    let mut config = claim_config(owner);
    config.mode = Mode::AgentSandbox {
        warm_pool: "late".into(),
    };
    config.ready_timeout_secs = ready_timeout_secs;
    config
}

/// Row D: `WarmPoolNotFound` is not final on the real controller (the claim is requeued, and
/// the pool's creation wakes it); a start whose pool appears while it waits gets its sandbox.
/// The previous backend failed the start at the first `WarmPoolNotFound`.
#[tokio::test]
async fn d_a_warm_pool_created_after_the_claim_still_serves_it() {
    let server = server().await;
    let k = cluster(&server, late_pool_config("owner-d", 30));
    let start = tokio::spawn(async move { k.start_sandbox(1, "s").await });
    until(&server, "the claim waits on its pool", || {
        claim_reason(&server).as_deref() == Some("WarmPoolNotFound")
    })
    .await;
    pool_with(&server, "late", &["main"]);
    let h = start
        .await
        .unwrap()
        .expect("the start ends well once the pool exists");
    assert!(server.store().get(&PODS, NS, &h.pod).is_ok());
}

/// Row D, the other way: a pool that never appears ends the start at its deadline, and the
/// error names the claim's last reason; the claim is cleaned up.
#[tokio::test]
async fn d_a_pool_that_never_appears_times_out_naming_the_reason() {
    let server = server().await;
    let k = cluster(&server, late_pool_config("owner-d2", 1));
    let e = k.start_sandbox(1, "s").await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("Ready=False WarmPoolNotFound: SandboxWarmPool \"late\" not found"),
        "{text}"
    );
    assert!(
        server.store().all(&SANDBOX_CLAIMS).is_empty(),
        "the failed start deleted its claim"
    );
}

/// Row G: an install older than agent-sandbox v0.5.0 serves only `v1alpha1`, so every call of
/// this backend would answer 404 with nothing saying why; connect now refuses it and names
/// the fix. So it does a cluster without agent-sandbox, and a warm pool that is not there.
#[tokio::test]
async fn g_connect_refuses_an_install_that_cannot_serve_and_names_the_fix() {
    use k8s_loopback::resources::AgentSandboxApi;
    let server = server().await;
    let refusal = |e: K8sError| match e {
        K8sError::Install { problem, fix } => (problem, fix),
        other => panic!("not an install refusal: {other:?}"),
    };

    server.serve_agent_sandbox(AgentSandboxApi::V1alpha1Only);
    let e = sandkeeper_k8s::K8sBackend::connect(cluster(&server, claim_config("owner-g")))
        .await
        .err()
        .expect("an old install is refused");
    let (problem, fix) = refusal(e);
    assert_eq!(
        problem,
        "the API server serves agents.x-k8s.io only as [\"v1alpha1\"], not v1beta1"
    );
    assert!(fix.contains("v0.5.0 or later is required"), "{fix}");

    server.serve_agent_sandbox(AgentSandboxApi::Absent);
    let e = sandkeeper_k8s::K8sBackend::connect(cluster(&server, claim_config("owner-g")))
        .await
        .err()
        .expect("no install is refused");
    assert!(refusal(e).0.contains("agent-sandbox is not installed"));

    server.serve_agent_sandbox(AgentSandboxApi::V1beta1);
    let mut config = claim_config("owner-g");
    config.mode = Mode::AgentSandbox {
        warm_pool: "missing".into(),
    };
    let e = sandkeeper_k8s::K8sBackend::connect(cluster(&server, config))
        .await
        .err()
        .expect("a missing pool is refused");
    assert_eq!(
        refusal(e).0,
        "the SandboxWarmPool \"missing\" does not exist in namespace \"sk-test\""
    );
    assert!(
        server
            .store()
            .all(&k8s_loopback::resources::LEASES)
            .is_empty(),
        "nothing was taken on before the checks"
    );

    sandkeeper_k8s::K8sBackend::connect(cluster(&server, claim_config("owner-g")))
        .await
        .expect("a v0.5 install with its pool is taken");
}

/// Row E at connect: a warm pool whose pods have a sidecar needs `container`, refused at
/// connect before any sandbox starts.
#[tokio::test]
async fn e_connect_refuses_a_pool_with_a_sidecar_and_no_container_named() {
    let server = server().await;
    pool_with_a_sidecar(&server, "sidecar");
    let mut config = claim_config("owner-e2");
    config.mode = Mode::AgentSandbox {
        warm_pool: "sidecar".into(),
    };
    let e = sandkeeper_k8s::K8sBackend::connect(cluster(&server, config.clone()))
        .await
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains(
            "a container name must be specified for pod <template sidecar-tpl>, choose one of: [main proxy]"
        ),
        "{e}"
    );
    config.container = Some("main".into());
    sandkeeper_k8s::K8sBackend::connect(cluster(&server, config))
        .await
        .expect("taken once the container is named");
}

/// The deploy examples fit together: the example warm pool and template, loaded into the
/// loopback, take the example configuration at connect; without its `container` line they
/// would not (the example pool's pods have a sidecar).
#[tokio::test]
async fn the_example_warm_pool_takes_the_example_config() {
    let server = k8s_loopback::Loopback::start().await.unwrap();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");
    let pool = std::fs::read_to_string(format!("{dir}/warm-pool.example.yaml")).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&pool) {
        let mut object: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        object["metadata"]["namespace"] = json!(NS);
        let rt = match object["kind"].as_str().unwrap() {
            "SandboxTemplate" => &SANDBOX_TEMPLATES,
            "SandboxWarmPool" => &SANDBOX_WARM_POOLS,
            other => panic!("unexpected kind {other}"),
        };
        server.store().create(rt, NS, object).unwrap();
    }
    let text = std::fs::read_to_string(format!("{dir}/sandkeeper-k8s.example.yaml")).unwrap();
    let value: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    let mut config: sandkeeper_k8s::K8sConfig = serde_json::from_value(value).unwrap();
    config.namespace = NS.into();
    assert_eq!(config.container.as_deref(), Some("sandbox"));
    let mut unnamed = config.clone();
    unnamed.container = None;
    assert!(matches!(
        sandkeeper_k8s::K8sBackend::connect(cluster(&server, unnamed)).await,
        Err(K8sError::Install { .. })
    ));
    let (backend, _) = sandkeeper_k8s::K8sBackend::connect(cluster(&server, config))
        .await
        .expect("the examples fit");
    let suspend = sandkeeper::Config {
        release: sandkeeper::ReleasePolicy::Suspend,
        ..sandkeeper::Config::default()
    };
    sandkeeper_tokio::Backend::check_config(&backend, &suspend)
        .expect("the example keeps the working directory on a claim volume");
}

/// Row A: the claim controller admits on a claim's pod only label domains of its allowlist
/// (default `sandbox.users.io` and subdomains) and leaves any other claim `InvalidMetadata`
/// for good. The previous backend asked for `app.kubernetes.io/managed-by` and `sandkeeper.io/*`
/// there, so every start failed on a default install; its labels are now in
/// `sandkeeper.sandbox.users.io`, and `managed-by` stays on the claim.
#[tokio::test]
async fn a_a_default_install_admits_the_claims_pod_labels() {
    use sandkeeper_k8s::names::{self, MANAGED_BY};
    let server = server().await;
    let k = cluster(&server, claim_config("owner-a"));
    let h = k
        .start_sandbox(3, "s")
        .await
        .expect("a start on a default install");
    let claim = server.store().get(&SANDBOX_CLAIMS, NS, &h.object).unwrap();
    let asked = claim["spec"]["additionalPodMetadata"]["labels"]
        .as_object()
        .unwrap();
    assert!(
        asked
            .keys()
            .all(|k| k.starts_with(&format!("{}/", names::LABEL_DOMAIN))),
        "{asked:?}"
    );
    assert_eq!(claim["metadata"]["labels"][MANAGED_BY], "sandkeeper");
    let pod = server.store().get(&PODS, NS, &h.pod).unwrap();
    assert_eq!(pod["metadata"]["labels"][names::SANDBOX], "3");
}

/// Row A, a cluster whose allowlist replaces the default without sandkeeper's domain: the
/// start fails at once with the controller's reason and message (not at its deadline).
#[tokio::test]
async fn a_an_allowlist_without_sandkeepers_domain_fails_the_start_with_the_reason() {
    let server = server().await;
    server.allow_label_domains(vec!["example.com".into()]);
    let k = cluster(&server, claim_config("owner-a2"));
    let e = k.start_sandbox(1, "s").await.unwrap_err();
    let K8sError::Terminal {
        reason, message, ..
    } = &e
    else {
        panic!("not terminal: {e:?}")
    };
    assert_eq!(reason, "InvalidMetadata");
    assert!(
        message.contains("label domain \"sandkeeper.sandbox.users.io\" is not in the allowlist"),
        "{message}"
    );
    assert!(server.store().all(&SANDBOX_CLAIMS).is_empty(), "cleaned up");
}

/// Suspends and resumes sandbox `h`'s Sandbox, returning once the new pod runs.
async fn suspend_and_resume(
    server: &k8s_loopback::Loopback,
    k: &sandkeeper_k8s::Cluster,
    h: &sandkeeper_k8s::SandboxHandle,
) {
    let sb = h.sandbox_name.clone().unwrap();
    k.set_operating_mode(&sb, true).await.unwrap();
    until(server, "the pod is deleted", || {
        server.store().get(&PODS, NS, &h.pod).is_err()
    })
    .await;
    k.set_operating_mode(&sb, false).await.unwrap();
    until(server, "the pod is back", || {
        server.store().get(&PODS, NS, &h.pod).is_ok()
    })
    .await;
    k.wait_pod_running(&h.pod).await.unwrap();
}

/// Row B: suspending deletes the pod, and only a volume of the template's
/// `volumeClaimTemplates` (kept while the Sandbox is suspended) keeps the working directory.
/// The loopback used to keep every pod's files, so the workspace seemed to survive on any
/// template; now a template without such a volume loses it, and the backend refuses the
/// Suspend policy for it; with one, the files survive.
#[tokio::test]
async fn b_suspend_keeps_the_workspace_only_on_a_claim_volume_and_is_refused_without_one() {
    use sandkeeper_tokio::Backend;
    let server = server().await;
    pool_with(&server, "scratch", &["main"]);
    let mut config = claim_config("owner-b");
    config.mode = Mode::AgentSandbox {
        warm_pool: "scratch".into(),
    };
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("f").unwrap());
    let file = UploadFile {
        session: &s,
        path: &p,
        bytes: b"kept?",
    };

    // No claim volume: the files go with the pod, and Suspend is refused up front.
    let k = cluster(&server, config.clone());
    let h = k.start_sandbox(1, "s").await.unwrap();
    k.upload(&h.pod, std::slice::from_ref(&file)).await.unwrap();
    let on_disk = server.pod_path(NS, &h.pod, "/workspace/s/f");
    assert!(on_disk.exists());
    suspend_and_resume(&server, &k, &h).await;
    assert!(
        !on_disk.exists(),
        "a container filesystem does not outlive its pod"
    );
    let (backend, _) = sandkeeper_k8s::K8sBackend::connect(cluster(&server, config))
        .await
        .unwrap();
    let suspend = sandkeeper::Config {
        release: sandkeeper::ReleasePolicy::Suspend,
        ..sandkeeper::Config::default()
    };
    let refusal = backend.check_config(&suspend).unwrap_err();
    assert!(refusal.contains("would lose the workspace"), "{refusal}");
    backend
        .check_config(&sandkeeper::Config::default())
        .expect("other policies are fine");

    // The common pool mounts a claim volume at /workspace: the files survive.
    let (backend, _) =
        sandkeeper_k8s::K8sBackend::connect(cluster(&server, claim_config("owner-b2")))
            .await
            .unwrap();
    backend.check_config(&suspend).expect("Suspend is taken");
    let k = cluster(&server, claim_config("owner-b3"));
    let h = k.start_sandbox(1, "s").await.unwrap();
    k.upload(&h.pod, std::slice::from_ref(&file)).await.unwrap();
    suspend_and_resume(&server, &k, &h).await;
    let on_disk = server.pod_path(NS, &h.pod, "/workspace/s/f");
    assert_eq!(std::fs::read(&on_disk).unwrap(), b"kept?");
}

fn condition_of(o: &serde_json::Value, ty: &str) -> Option<(String, String)> {
    o.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
}

/// Watch requests on pods served so far.
fn pod_watches(server: &k8s_loopback::Loopback) -> u64 {
    server
        .request_counts()
        .iter()
        .filter(|(r, _)| r.verb == k8s_loopback::faults::Verb::Watch && r.resource == "pods")
        .map(|(_, n)| n)
        .sum()
}

fn pod_name_annotation(sb: &serde_json::Value) -> Option<String> {
    sb.pointer("/metadata/annotations/agents.x-k8s.io~1pod-name")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

/// Row H, suspend: the controller deletes the pod with its grace period, and a container that
/// ignores SIGTERM (`sleep infinity` as PID 1) keeps it `Terminating` until the period ends.
/// The Sandbox is `Ready=False`/`SandboxSuspended` at once, `Suspended=False`/`PodTerminating`
/// while the pod terminates, and `Suspended=True`/`PodTerminated` with its `pod-name`
/// annotation cleared once it is gone. The backend's suspend ends only then (a resume must not
/// find the old pod), and the resumed pod is made under the Sandbox's name and annotated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_a_suspend_waits_out_a_pod_that_terminates_for_its_grace_period() {
    use k8s_loopback::resources::SANDBOXES;
    let server = server().await;
    server.pods_ignore_sigterm(true);
    let k = std::sync::Arc::new(cluster(&server, claim_config("owner-h")));
    let h = k.start_sandbox(1, "s").await.unwrap();
    let sb = h.sandbox_name.clone().unwrap();
    let sandbox = || server.store().get(&SANDBOXES, NS, &sb).unwrap();
    assert_eq!(pod_name_annotation(&sandbox()).as_deref(), Some(&*h.pod));
    assert_eq!(
        condition_of(&sandbox(), "Suspended"),
        Some(("False".into(), "NotSuspended".into()))
    );

    let pod_watches_before = pod_watches(&server);
    let mut suspending = tokio::spawn({
        let (k, h) = (k.clone(), h.clone());
        async move { k.suspend_sandbox(&h).await }
    });
    until(
        &server,
        "the pod terminates and the Sandbox says so",
        || {
            server
                .store()
                .get(&PODS, NS, &h.pod)
                .is_ok_and(|p| p.pointer("/metadata/deletionTimestamp").is_some())
                && condition_of(&sandbox(), "Suspended").is_some_and(|(_, r)| r == "PodTerminating")
        },
    )
    .await;
    let terminating = server.store().get(&PODS, NS, &h.pod).unwrap();
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 5);
    let s = sandbox();
    assert_eq!(
        condition_of(&s, "Ready"),
        Some(("False".into(), "SandboxSuspended".into()))
    );
    assert_eq!(
        condition_of(&s, "Suspended"),
        Some(("False".into(), "PodTerminating".into()))
    );
    assert_eq!(
        pod_name_annotation(&s).as_deref(),
        Some(&*h.pod),
        "kept while the pod terminates"
    );
    // The backend watches the pod itself (its wait for the pod to go) and stays waiting.
    loop {
        if pod_watches(&server) > pod_watches_before {
            break;
        }
        let opened = server.watches_opened();
        tokio::select! {
            _ = server.wait_for_watches(opened + 1) => {}
            r = &mut suspending => panic!("the suspend ended while the old pod still terminates: {r:?}"),
        }
    }
    let roundtrip = k.find_suspended(&h.object).await.unwrap();
    assert!(matches!(roundtrip, sandkeeper_k8s::Resumable::Claim(_)));
    assert!(
        !suspending.is_finished(),
        "the suspend ended while the old pod still terminates"
    );

    server.advance_clock(std::time::Duration::from_secs(6));
    suspending
        .await
        .unwrap()
        .expect("suspended once the pod is gone");
    assert!(server.store().get(&PODS, NS, &h.pod).is_err());
    let s = sandbox();
    assert_eq!(
        condition_of(&s, "Suspended"),
        Some(("True".into(), "PodTerminated".into()))
    );
    assert_eq!(
        pod_name_annotation(&s),
        None,
        "cleared once the pod is gone"
    );

    // A resume makes the pod again under the Sandbox's own name.
    k.set_operating_mode(&sb, false).await.unwrap();
    until(&server, "the pod is back", || {
        server.store().get(&PODS, NS, &sb).is_ok()
    })
    .await;
    k.wait_pod_running(&sb).await.unwrap();
    let s = sandbox();
    assert_eq!(pod_name_annotation(&s).as_deref(), Some(&*sb));
    assert_eq!(
        condition_of(&s, "Suspended"),
        Some(("False".into(), "NotSuspended".into()))
    );
}

/// The death watch's next report (bounded: 10 s).
async fn next_death(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<sandkeeper_k8s::Death>,
) -> sandkeeper_k8s::Death {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("a death within 10 s")
        .expect("watch alive")
}

/// Row H, deaths: a pod deleted by hand stays `Terminating` for its grace period, and the
/// death watch reports its loss at once (the sandbox is doomed), then not again when the pod
/// is removed: one object, one report.
#[tokio::test]
async fn h_a_pod_deleted_by_hand_is_reported_once_while_it_terminates() {
    use tokio::sync::mpsc;
    let server = server().await;
    server.pods_ignore_sigterm(true);
    let k = cluster(&server, claim_config("owner-h2"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _watch = k.spawn_death_watch(move |d| tx.send(d).is_ok());
    let a = k.start_sandbox(1, "s").await.unwrap();
    let b = k.start_sandbox(2, "s").await.unwrap();

    delete_pod(&server, &a.pod);
    let d = next_death(&mut rx).await;
    assert_eq!(d.sandbox, 1, "{d:?}");
    assert!(d.reason.contains("being deleted"), "{}", d.reason);
    assert!(
        server.store().get(&PODS, NS, &a.pod).is_ok(),
        "reported while it still terminates"
    );

    // The grace period ends and the pod is removed (the controller makes a new one under the
    // same name at once): no second report. Sandbox 2's pod, deleted after, is the next
    // report (one watch, events in order).
    server.advance_clock(std::time::Duration::from_secs(6));
    until(&server, "the pod is removed", || {
        server
            .store()
            .get(&PODS, NS, &a.pod)
            .map_or(true, |p| p["metadata"]["uid"] != a.pod_uid.as_str())
    })
    .await;
    delete_pod(&server, &b.pod);
    let d = next_death(&mut rx).await;
    assert_eq!(
        d.sandbox, 2,
        "sandbox 1's removal was not reported again: {d:?}"
    );
}

/// Row H, deaths in a fleet: an object that leaves the owner's selector is not dead. The API
/// server sends DELETED for it, with the content it had while it matched (the loopback does the
/// same); in a fleet a controller working from a stale cache sets an adopted pod's owner label
/// back to its last owner's for one pass, and the Kubernetes fleet harness test saw the death
/// watch report that pod's sandbox dead (the key continued from a fresh claim, acknowledged
/// logs lost). The watch now looks the object up: still there, it is not a loss.
#[tokio::test]
async fn h_a_pod_relabelled_out_of_the_owners_selector_is_not_reported_dead() {
    use futures_util::StreamExt;
    use kube::api::{Api, WatchEvent, WatchParams};
    use tokio::sync::mpsc;
    const OWNER: &str = "sandkeeper.sandbox.users.io/owner";
    let server = server().await;
    let k = cluster(&server, claim_config("owner-h4"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _watch = k.spawn_death_watch(move |d| tx.send(d).is_ok());
    let a = k.start_sandbox(1, "s").await.unwrap();
    let b = k.start_sandbox(2, "s").await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client(&server), NS);
    let from = server.store().get(&PODS, NS, &a.pod).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut raw = pods
        .watch(
            &WatchParams::default().labels(&format!("{OWNER}=owner-h4")),
            &from,
        )
        .await
        .unwrap()
        .boxed();

    // Another owner's label on sandbox 1's pod, as a stale controller pass writes it; the
    // loopback's controller sets it back from the Sandbox's pod template at once.
    server
        .store()
        .modify(&PODS, NS, &a.pod, |p| {
            p["metadata"]["labels"][OWNER] = json!("owner-stale");
        })
        .unwrap();
    // What a watcher of this owner's pods is sent: DELETED with the content the pod had while
    // it matched (this owner's label), then ADDED when it is set back.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(10), raw.next())
            .await
            .expect("watch events within 10 s")
            .expect("watch open")
            .unwrap();
        match ev {
            WatchEvent::Deleted(p) if p.metadata.name.as_deref() == Some(&*a.pod) => {
                assert_eq!(p.metadata.labels.unwrap()[OWNER], "owner-h4");
                seen.push("DELETED");
            }
            WatchEvent::Added(p) if p.metadata.name.as_deref() == Some(&*a.pod) => {
                assert!(seen == ["DELETED"], "{seen:?}");
                seen.push("ADDED");
            }
            _ => {}
        }
    }
    until(&server, "the pod is set back to its owner", || {
        server.store().get(&PODS, NS, &a.pod).unwrap()["metadata"]["labels"][OWNER] == "owner-h4"
    })
    .await;

    // Sandbox 2's pod, deleted after, is the first report: sandbox 1 was not reported (one
    // watch, events in order). Then sandbox 1's pod, deleted for real, is reported.
    delete_pod(&server, &b.pod);
    let d = next_death(&mut rx).await;
    assert_eq!(d.sandbox, 2, "sandbox 1 was reported dead: {d:?}");
    delete_pod(&server, &a.pod);
    assert_eq!(next_death(&mut rx).await.sandbox, 1);
}

/// Row H, the grace period at connect: a suspend waits for the pod to go, which takes the
/// whole grace period when the container ignores SIGTERM (`sleep infinity` as PID 1); with the
/// API's default of 30 s every suspend would outlast the keeper's default `command_timeout`
/// (30 s), fail, and lose the sandbox. The backend refuses `Suspend` for such a template and
/// names the fix; a shorter period is taken.
#[tokio::test]
async fn h_suspend_is_refused_when_the_pods_grace_period_outlasts_the_timeouts() {
    use sandkeeper_tokio::Backend;
    let server = server().await;
    // The common template (a claim volume at the working directory) without its grace period.
    let mut spec = server.store().get(&SANDBOX_TEMPLATES, NS, "tpl").unwrap()["spec"].take();
    spec["podTemplate"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("terminationGracePeriodSeconds");
    pool_of(&server, "slow", spec);
    let mut config = claim_config("owner-h3");
    config.mode = Mode::AgentSandbox {
        warm_pool: "slow".into(),
    };
    config.ready_timeout_secs = 120;
    let backend = connect(&server, config).await;
    let suspend = sandkeeper::Config {
        release: sandkeeper::ReleasePolicy::Suspend,
        ..sandkeeper::Config::default()
    };
    let refusal = backend.check_config(&suspend).unwrap_err();
    assert!(refusal.contains("grace period of 30 s"), "{refusal}");
    assert!(refusal.contains("within 30 s"), "{refusal}");
    let patient = sandkeeper::Config {
        command_timeout: std::time::Duration::from_secs(60),
        ..suspend.clone()
    };
    backend
        .check_config(&patient)
        .expect("timeouts above the grace period are fine");
    // The common template's 5 s is taken under the defaults.
    let backend = connect(&server, claim_config("owner-h4")).await;
    backend.check_config(&suspend).expect("5 s fits");
}

/// Auto-suspension, as upstream's newest source has it (kubernetes-sigs/agent-sandbox pull
/// request 1296, `shouldSuspend` and `computeReadyCondition` in `sandbox_controller.go`, the
/// suspension server's `handleResume`), behind `--enable-auto-suspend-and-resume`: a Sandbox
/// with `spec.autoSuspension.inactivityTimeoutSeconds` gets `status.lastActivityTime` at once;
/// once the timeout passed on the controller's clock its pod is deleted while `operatingMode`
/// stays `Running` (`Ready=False`/`SandboxAutoSuspended`, `Suspended=True`/`PodTerminated`,
/// forwarded to the claim), the volumes stay; a newer `lastActivityTime` (what the suspension
/// server writes on traffic) makes the pod again; `operatingMode: Suspended` overrides it
/// (`SandboxUserSuspended`), and `Running` after that counts as activity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_suspends_an_inactive_sandbox_by_itself() {
    use k8s_loopback::resources::SANDBOXES;
    let server = server().await;
    server.enable_auto_suspension(true);
    let k = cluster(&server, claim_config("owner-auto"));
    let h = k.start_sandbox(1, "s").await.unwrap();
    let sb = h.sandbox_name.clone().unwrap();
    let sandbox = || server.store().get(&SANDBOXES, NS, &sb).unwrap();
    let file = server.pod_path(NS, &h.pod, "/workspace/kept");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"x").unwrap();
    server.advance_clock(std::time::Duration::from_secs(120));
    assert!(
        server.store().get(&PODS, NS, &h.pod).is_ok(),
        "without spec.autoSuspension nothing is suspended"
    );

    server
        .store()
        .modify(&SANDBOXES, NS, &sb, |s| {
            s["spec"]["autoSuspension"] = json!({"inactivityTimeoutSeconds": 60});
        })
        .unwrap();
    until(&server, "the activity is noted", || {
        sandbox().pointer("/status/lastActivityTime").is_some()
    })
    .await;
    server.advance_clock(std::time::Duration::from_secs(59));
    assert!(server.store().get(&PODS, NS, &h.pod).is_ok(), "not yet");
    server.advance_clock(std::time::Duration::from_secs(2));
    until(&server, "the controller suspends it", || {
        server.store().get(&PODS, NS, &h.pod).is_err()
            && condition_of(&sandbox(), "Suspended").is_some_and(|(s, _)| s == "True")
    })
    .await;
    let s = sandbox();
    assert_eq!(s["spec"]["operatingMode"], "Running", "left as it was");
    assert_eq!(
        condition_of(&s, "Ready"),
        Some(("False".into(), "SandboxAutoSuspended".into()))
    );
    assert_eq!(
        condition_of(&s, "Suspended"),
        Some(("True".into(), "PodTerminated".into()))
    );
    until(
        &server,
        "the claim forwards its Sandbox's Ready condition",
        || {
            let claim = server.store().get(&SANDBOX_CLAIMS, NS, &h.object).unwrap();
            condition_of(&claim, "Ready") == Some(("False".into(), "SandboxAutoSuspended".into()))
        },
    )
    .await;

    // Traffic: the suspension server sets lastActivityTime to now; the pod comes back on the
    // same volume.
    let now = server.store().now_rfc3339();
    server
        .store()
        .modify(&SANDBOXES, NS, &sb, |s| {
            s["status"]["lastActivityTime"] = json!(now)
        })
        .unwrap();
    until(&server, "the pod runs again", || {
        condition_of(&sandbox(), "Ready").is_some_and(|(s, _)| s == "True")
    })
    .await;
    assert_eq!(std::fs::read(&file).unwrap(), b"x", "the volume stayed");

    // A suspension by mode overrides auto-suspension; Running after it is activity.
    k.set_operating_mode(&sb, true).await.unwrap();
    until(&server, "suspended by mode", || {
        condition_of(&sandbox(), "Ready") == Some(("False".into(), "SandboxUserSuspended".into()))
            && server.store().get(&PODS, NS, &h.pod).is_err()
    })
    .await;
    server.advance_clock(std::time::Duration::from_secs(600));
    let before = sandbox()["status"]["lastActivityTime"].clone();
    k.set_operating_mode(&sb, false).await.unwrap();
    until(&server, "running again, its activity noted", || {
        let s = sandbox();
        condition_of(&s, "Ready").is_some_and(|(s, _)| s == "True")
            && s["status"]["lastActivityTime"] != before
    })
    .await;
}
