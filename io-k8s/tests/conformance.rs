//! Issue 12's rows: what the backend got wrong on a real agent-sandbox install, each checked
//! against the loopback where it now behaves like the real controller or API server.

mod common;

use common::*;
use k8s_loopback::resources::{SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use sandkeeper::{PathName, SessionId};
use sandkeeper_k8s::{K8sError, UploadFile};
use serde_json::json;

/// A warm pool `name` whose template's pod has a `main` container and a `proxy` sidecar.
fn pool_with_a_sidecar(server: &k8s_loopback::Loopback, name: &str) {
    let template = format!("{name}-tpl");
    server
        .store()
        .create(
            &SANDBOX_TEMPLATES,
            NS,
            json!({"metadata": {"name": template}, "spec": {"podTemplate": {"spec": {"containers": [
                {"name": "main", "image": "busybox"},
                {"name": "proxy", "image": "envoy"}
            ]}}}}),
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
