//! The loopback Kubernetes API server as the tests of the Kubernetes backend set it up: the
//! agent-sandbox template and warm pool of the claim mode, a backend configuration file as a
//! user writes it, and the objects an owner labelled.

use std::path::Path;

use k8s_loopback::resources::{ALL, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use k8s_loopback::Loopback;
use sandkeeper_k8s::names::OWNER;
use serde_json::{json, Value};

/// The namespace the tests use.
pub const NS: &str = "sk-test";

/// The loopback with the agent-sandbox template and warm pool the claim mode uses (the working
/// directory on a per-claim volume, so a suspension keeps it).
pub async fn cluster() -> Loopback {
    let server = Loopback::start().await.expect("the loopback starts");
    let store = server.store();
    store
        .create(
            &SANDBOX_TEMPLATES,
            NS,
            json!({"metadata": {"name": "tpl"}, "spec": {
                "podTemplate": {"spec": {"terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "busybox",
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "workspace"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
            }}),
        )
        .expect("the template");
    store
        .create(
            &SANDBOX_WARM_POOLS,
            NS,
            json!({"metadata": {"name": "pool"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "tpl"}}}),
        )
        .expect("the warm pool");
    server
}

/// The backend's configuration file, as a user writes it.
pub fn config_file(dir: &Path, owner: &str, mode: &str) -> std::path::PathBuf {
    let mode = match mode {
        "claim" => "mode:\n  agentSandbox:\n    warmPool: pool\n".to_string(),
        _ => "mode:\n  pod:\n    template:\n      spec:\n        containers:\n        - name: main\n          image: busybox\n          command: [\"sleep\", \"infinity\"]\n".to_string(),
    };
    let yaml = format!(
        "namespace: {NS}\nowner: {owner}\n{mode}retryBaseMillis: 5\napiDeadlineSecs: 10\nreadyTimeoutSecs: 30\nuploadTimeoutSecs: 10\n"
    );
    let file = dir.join(format!("{owner}.yaml"));
    std::fs::write(&file, yaml).expect("write the configuration");
    file
}

/// The objects labelled with `owner` (claims, sandboxes, pods, leases), as `<plural>/<name>`.
pub fn owned_by(server: &Loopback, owner: &str) -> Vec<String> {
    let mut out = Vec::new();
    for rt in ALL {
        for o in server.store().all(rt) {
            let label = o.pointer("/metadata/labels").and_then(|l| l.get(OWNER));
            if label.and_then(Value::as_str) == Some(owner) {
                let name = o["metadata"]["name"].as_str().unwrap_or("");
                out.push(format!("{}/{name}", rt.plural));
            }
        }
    }
    out
}
