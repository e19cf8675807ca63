//! Shared set-up: a loopback API server, a kube client for it, and agent-sandbox fixtures.

#![allow(dead_code)]

use k8s_loopback::resources::{SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use k8s_loopback::Loopback;
use k8s_openapi::api::core::v1::Pod;
use sandkeeper_k8s::{Cluster, K8sBackend, K8sConfig, Mode};
use serde_json::{json, Value};

pub const NS: &str = "sk-test";

pub async fn server() -> Loopback {
    let server = Loopback::start().await.expect("loopback starts");
    server
        .store()
        .create(
            &SANDBOX_TEMPLATES,
            NS,
            // The working directory on a per-sandbox claim volume, so a suspension keeps it;
            // a grace period that a suspend can wait out.
            json!({"metadata": {"name": "tpl"}, "spec": {
                "podTemplate": {"spec": {"terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "busybox",
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "workspace"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
            }}),
        )
        .unwrap();
    server
        .store()
        .create(
            &SANDBOX_WARM_POOLS,
            NS,
            json!({"metadata": {"name": "pool"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "tpl"}}}),
        )
        .unwrap();
    server
}

pub fn client(server: &Loopback) -> kube::Client {
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.default_namespace = NS.into();
    config.read_timeout = Some(std::time::Duration::from_secs(30));
    sandkeeper_k8s::Cluster::make_client(config).expect("client for the loopback")
}

pub fn claim_config(owner: &str) -> K8sConfig {
    let mut c = K8sConfig::new(
        NS,
        owner,
        Mode::AgentSandbox {
            warm_pool: "pool".into(),
        },
    );
    c.retry_base_millis = 5;
    c.api_deadline_secs = 10;
    c.ready_timeout_secs = 30;
    c.upload_timeout_secs = 10;
    c
}

pub fn pod_template() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"labels": {"app": "sandbox"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "infinity"]}]}
    }))
    .unwrap()
}

pub fn pod_config(owner: &str) -> K8sConfig {
    let mut c = claim_config(owner);
    c.mode = Mode::Pod {
        template: Box::new(pod_template()),
    };
    c
}

pub fn cluster(server: &Loopback, config: K8sConfig) -> Cluster {
    let c = Cluster::new(client(server), config).expect("valid config");
    assert_eq!(c.owner(), c.config().owner);
    c
}

/// A backend connected to the loopback with `config` (its sweep report dropped).
pub async fn connect(server: &Loopback, config: K8sConfig) -> K8sBackend {
    K8sBackend::connect(cluster(server, config))
        .await
        .expect("the backend connects")
        .0
}

pub fn labels(o: &Value) -> &serde_json::Map<String, Value> {
    o.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .expect("labels")
}

pub fn owned_by(server: &Loopback, owner: &str) -> Vec<String> {
    let mut out = Vec::new();
    for rt in k8s_loopback::resources::ALL {
        for o in server.store().all(rt) {
            let mine = o
                .pointer("/metadata/labels/sandkeeper.sandbox.users.io~1owner")
                .and_then(Value::as_str)
                == Some(owner);
            if mine {
                out.push(format!(
                    "{}/{}",
                    rt.plural,
                    o["metadata"]["name"].as_str().unwrap_or("")
                ));
            }
        }
    }
    out
}

/// Waits, on the loopback's own change events (no polling, no sleeping), until `done` holds;
/// panics naming `what` after 10 s.
pub async fn until(server: &k8s_loopback::Loopback, what: &str, done: impl Fn() -> bool) {
    let mut events = server.store().subscribe();
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !done() {
            let _ = events.recv().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never: {what}"));
}

/// Deletes a pod by hand, as `kubectl delete pod` does: gracefully (it may stay `Terminating`
/// for its grace period), its dependents in the background.
pub fn delete_pod(server: &Loopback, pod: &str) {
    server
        .store()
        .delete(
            &k8s_loopback::resources::PODS,
            NS,
            pod,
            k8s_loopback::store::Propagation::Background,
            None,
        )
        .unwrap();
}

/// The `Ready` condition of the Sandbox `sandbox` as `status/reason`, if it has one.
pub fn ready_reason(server: &Loopback, sandbox: &str) -> Option<String> {
    let sb = server
        .store()
        .get(&k8s_loopback::resources::SANDBOXES, NS, sandbox)
        .ok()?;
    sb.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| {
            Some(format!(
                "{}/{}",
                c["status"].as_str()?,
                c["reason"].as_str()?
            ))
        })
}

/// Has the controller suspend the Sandbox `sandbox` for inactivity, as upstream's
/// `--enable-auto-suspend-and-resume` does: a 60 s inactivity timeout set on it, then the
/// server clock moved past it. Waits until its pod `pod_name` is gone.
pub async fn auto_suspend(server: &Loopback, sandbox: &str, pod_name: &str) {
    outlive_inactivity_timeout(server, sandbox).await;
    let pod_gone = || {
        server
            .store()
            .get(&k8s_loopback::resources::PODS, NS, pod_name)
            .is_err()
    };
    until(server, "the controller suspended the Sandbox", || {
        ready_reason(server, sandbox).as_deref() == Some("False/SandboxAutoSuspended") && pod_gone()
    })
    .await;
    let sb = server
        .store()
        .get(&k8s_loopback::resources::SANDBOXES, NS, sandbox)
        .unwrap();
    assert_eq!(
        sb["spec"]["operatingMode"], "Running",
        "the controller suspends without touching operatingMode"
    );
}

/// Turns auto-suspension on for the Sandbox `sandbox` (60 s) and moves the server clock past
/// its inactivity timeout.
pub async fn outlive_inactivity_timeout(server: &Loopback, sandbox: &str) {
    use k8s_loopback::resources::SANDBOXES;
    server.enable_auto_suspension(true);
    server
        .store()
        .modify(&SANDBOXES, NS, sandbox, |sb| {
            sb["spec"]["autoSuspension"] = json!({"inactivityTimeoutSeconds": 60});
        })
        .unwrap();
    until(server, "the controller noted the activity", || {
        server
            .store()
            .get(&SANDBOXES, NS, sandbox)
            .is_ok_and(|sb| sb.pointer("/status/lastActivityTime").is_some())
    })
    .await;
    server.advance_clock(std::time::Duration::from_secs(61));
}
