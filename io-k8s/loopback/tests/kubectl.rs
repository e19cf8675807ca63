//! The loopback API driven by the real `kubectl` (discovery, OpenAPI-backed validation, apply,
//! get, wait over watches, exec over the websocket protocol with stdin, delete with cascade).
//! Skipped, with the reason printed, only where no kubectl is installed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_loopback::resources::{PODS, SANDBOXES, SANDBOX_CLAIMS};
use k8s_loopback::Loopback;
use tokio::io::AsyncWriteExt;

fn kubectl_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KUBECTL") {
        return Some(PathBuf::from(p));
    }
    let default = PathBuf::from("/usr/bin/kubectl");
    if default.exists() {
        return Some(default);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubectl"))
            .find(|p| p.exists())
    })
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn new(bin: PathBuf, dir: &Path, server: &str) -> Self {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: loopback\n  cluster:\n    server: {server}\nusers:\n- name: tester\n  user: {{}}\ncontexts:\n- name: loopback\n  context: {{cluster: loopback, user: tester, namespace: default}}\ncurrent-context: loopback\n"
            ),
        )
        .unwrap();
        Kubectl {
            bin,
            kubeconfig,
            cache: dir.join("cache"),
        }
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Out {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("kubectl starts");
        if let Some(data) = stdin {
            let mut s = child.stdin.take().unwrap();
            s.write_all(data).await.unwrap();
            drop(s);
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within 60 s"))
            .unwrap();
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn run(&self, args: &[&str]) -> Out {
        self.run_with_stdin(args, None).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert_eq!(
            o.code, 0,
            "kubectl {args:?} failed: {}\n{}",
            o.stdout, o.stderr
        );
        o.stdout
    }
}

const OBJECTS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: busybox
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: tpl
spec:
  podTemplate:
    metadata:
      labels: {role: sandbox}
    spec:
      containers:
      - name: main
        image: busybox
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: pool
spec:
  replicas: 1
  sandboxTemplateRef: {name: tpl}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata:
  name: claim1
  labels: {owner: me}
spec:
  warmPoolRef: {name: pool}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubectl_drives_the_loopback_api() {
    let Some(bin) = kubectl_path() else {
        println!("SKIPPED real_kubectl_drives_the_loopback_api: no kubectl installed (looked at $KUBECTL, /usr/bin/kubectl, $PATH)");
        return;
    };
    let server = Loopback::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(bin, dir.path(), &server.url());

    // Discovery.
    let version = k.ok(&["version", "-o", "json"]).await;
    assert!(version.contains("v1.33.0-loopback"), "{version}");
    let resources = k.ok(&["api-resources", "-o", "name"]).await;
    for r in [
        "pods",
        "leases.coordination.k8s.io",
        "sandboxes.agents.x-k8s.io",
        "sandboxclaims.extensions.agents.x-k8s.io",
        "sandboxwarmpools.extensions.agents.x-k8s.io",
        "sandboxtemplates.extensions.agents.x-k8s.io",
    ] {
        assert!(
            resources.lines().any(|l| l == r),
            "{r} missing from:\n{resources}"
        );
    }

    // Client-side apply (with server-side field validation) creates everything.
    let manifest = dir.path().join("objects.yaml");
    std::fs::write(&manifest, OBJECTS).unwrap();
    let applied = k.ok(&["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(applied.contains("pod/web created"), "{applied}");
    assert!(
        applied.contains("sandboxclaim.extensions.agents.x-k8s.io/claim1 created"),
        "{applied}"
    );

    // The scripted agent-sandbox controller makes the claim Ready; kubectl wait watches for it.
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        "sandboxclaim/claim1",
        "--timeout=30s",
    ])
    .await;
    let sandbox = k
        .ok(&[
            "get",
            "sandboxclaim",
            "claim1",
            "-o",
            "jsonpath={.status.sandbox.name}",
        ])
        .await;
    // Adopted from the pool: the Sandbox keeps the pool's generated name.
    assert!(sandbox.starts_with("pool-"), "{sandbox}");
    let pod = k
        .ok(&[
            "get",
            "sandbox",
            &sandbox,
            "-o",
            "jsonpath={.metadata.annotations.agents\\.x-k8s\\.io/pod-name}",
        ])
        .await;
    assert_eq!(pod, sandbox, "the pod has its Sandbox's name");
    let labelled = k
        .ok(&["get", "pods", "-l", "role=sandbox", "-o", "name"])
        .await;
    assert_eq!(labelled.trim(), format!("pod/{pod}"));

    // A second apply with a changed label patches the pod.
    std::fs::write(
        &manifest,
        OBJECTS.replace("labels: {app: web}", "labels: {app: web, tier: front}"),
    )
    .unwrap();
    let reapplied = k.ok(&["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(reapplied.contains("pod/web configured"), "{reapplied}");
    assert!(
        reapplied.contains("sandboxclaim.extensions.agents.x-k8s.io/claim1 unchanged"),
        "{reapplied}"
    );
    let tier = k
        .ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.labels.tier}",
        ])
        .await;
    assert_eq!(tier, "front");

    // Exec over the websocket protocol: stdout, stderr, exit codes, stdin.
    let o = k
        .run(&[
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ])
        .await;
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert_eq!(o.stdout, "out\n");
    assert!(o.stderr.contains("err"), "{}", o.stderr);
    assert_eq!(k.ok(&["exec", "web", "--", "true"]).await, "");
    let o = k
        .run_with_stdin(
            &["exec", "-i", &pod, "--", "tee", "/workspace/note.txt"],
            Some(b"written through kubectl exec\n"),
        )
        .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "written through kubectl exec\n");
    let on_disk =
        std::fs::read_to_string(server.pod_path("default", &pod, "/workspace/note.txt")).unwrap();
    assert_eq!(on_disk, "written through kubectl exec\n");

    // Errors come back as Status bodies kubectl understands.
    let o = k.run(&["get", "pod", "nope"]).await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("Error from server (NotFound): pods \"nope\" not found"),
        "{}",
        o.stderr
    );
    let o = k.run(&["exec", "web", "--", "/no/such/binary"]).await;
    assert_ne!(o.code, 0);

    // Deleting the claim cascades to its Sandbox and Pod.
    let deleted = k
        .ok(&["delete", "sandboxclaim", "claim1", "--wait=true"])
        .await;
    assert!(deleted.contains("deleted"), "{deleted}");
    assert!(server.store().all(&SANDBOX_CLAIMS).is_empty());
    assert!(server.store().all(&SANDBOXES).is_empty());
    assert_eq!(
        server.store().all(&PODS).len(),
        1,
        "only the plain pod is left"
    );
    k.ok(&["delete", "pod", "web"]).await;
    assert_eq!(k.ok(&["get", "pods", "-o", "name"]).await, "");
    let o = k.run(&["get", "pods"]).await;
    assert!(
        o.stderr
            .contains("No resources found in default namespace."),
        "{}",
        o.stderr
    );
}
