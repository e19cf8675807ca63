//! deploy/rbac.yaml grants every call the code makes: statically (against the table of calls)
//! and dynamically (the loopback enforces the Role while a full run goes through, and every
//! request it logged is allowed). The example config parses and validates.

mod common;

use common::*;
use k8s_loopback::PolicyRule;
use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::calls;
use sandkeeper_k8s::{K8sConfig, UploadFile};
use serde::Deserialize;

fn role_rules() -> Vec<PolicyRule> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml")).unwrap();
    let mut kinds = Vec::new();
    let mut rules = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let kind = v["kind"].as_str().unwrap().to_string();
        if kind == "Role" {
            for r in v["rules"].as_sequence().unwrap() {
                let list = |k: &str| {
                    r[k].as_sequence()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                };
                rules.push(PolicyRule {
                    api_groups: list("apiGroups"),
                    resources: list("resources"),
                    verbs: list("verbs"),
                });
            }
        }
        kinds.push(kind);
    }
    assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
    rules
}

fn allows(rules: &[PolicyRule], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().any(|g| g == group || g == "*")
            && r.resources.iter().any(|x| x == resource || x == "*")
            && r.verbs.iter().any(|v| v == verb || v == "*")
    })
}

#[test]
fn the_role_grants_every_call_in_the_table() {
    let rules = role_rules();
    for c in calls::ALL {
        // "plural.group" or "plural/sub" for the core group.
        let (resource, group) = match c.resource.split_once('.') {
            Some((r, g)) => (r, g),
            None => (c.resource, ""),
        };
        assert!(
            allows(&rules, c.verb, group, resource),
            "deploy/rbac.yaml lacks `{}` on `{}`",
            c.verb,
            c.resource
        );
    }
}

#[tokio::test]
async fn a_full_run_under_the_role_is_never_forbidden_and_uses_only_granted_calls() {
    let server = server().await;
    let rules = role_rules();
    server.enforce_rbac(rules.clone());
    let k = cluster(&server, claim_config("rbac"));
    let kp = cluster(&server, pod_config("rbac"));
    k.acquire_lease().await.unwrap();
    k.renew_lease().await.unwrap();
    let report = k.sweep_orphans().await.unwrap();
    assert!(report.dead_owners.is_empty());
    let watch = k.spawn_death_watch(|_| true);
    let h = k.start_sandbox(1, "s").await.unwrap();
    let hp = kp.start_sandbox(2, "s").await.unwrap();
    let (s, p) = (SessionId::new("s").unwrap(), PathName::new("log").unwrap());
    k.upload(
        &h.pod,
        &[UploadFile {
            session: &s,
            path: &p,
            bytes: b"x",
        }],
    )
    .await
    .unwrap();
    // Suspend and resume (ReleasePolicy::Suspend): patch and watch the Sandbox, patch the
    // claim's labels and the Sandbox's pod template (never the pod).
    k.suspend_sandbox(&h).await.unwrap();
    let found = match k.find_suspended(&h.object).await.unwrap() {
        sandkeeper_k8s::Resumable::Claim(found) => found,
        lost => panic!("{lost:?}"),
    };
    let h = k.resume_sandbox(7, &found).await.unwrap();
    k.shutdown_sandbox(&h).await.unwrap();
    kp.shutdown_sandbox(&hp).await.unwrap();
    k.delete_all_owned().await.unwrap();
    k.release_lease().await.unwrap();
    drop(watch);
    let seen = server.requests();
    for r in &seen {
        let resource = match &r.subresource {
            Some(s) => format!("{}/{s}", r.resource),
            None => r.resource.clone(),
        };
        assert!(
            allows(&rules, r.verb.as_str(), &r.group, &resource),
            "{r:?} not granted"
        );
    }
    for needed in ["sandboxclaims", "pods", "leases", "sandboxes"] {
        assert!(
            seen.iter().any(|r| r.resource == needed),
            "the run never touched {needed}"
        );
    }
    // Without the exec grant, the upload is refused with the permission named.
    let no_exec: Vec<PolicyRule> = rules
        .into_iter()
        .filter(|r| !r.resources.contains(&"pods/exec".to_string()))
        .collect();
    server.enforce_rbac(no_exec);
    let h = kp.start_sandbox(3, "s").await.unwrap();
    let e = kp
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
    assert!(e.to_string().contains("pods/exec"), "{e}");
}

#[test]
fn the_example_config_parses_and_validates() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/sandkeeper-k8s.example.yaml"
    ))
    .unwrap();
    // YAML through a JSON value: `mode` is an externally tagged enum written as a map
    // (`mode: {agentSandbox: {...}}`), the same shape as in JSON.
    let value: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    let c: K8sConfig = serde_json::from_value(value).unwrap();
    c.validate().unwrap();
    assert_eq!(c.namespace, "sandkeeper");
    let mut bad = c.clone();
    bad.workdir = "/workspace/../etc".into();
    assert!(bad.validate().is_err());
    bad = c;
    bad.owner = "Not_Valid".into();
    assert!(bad.validate().is_err());
}
