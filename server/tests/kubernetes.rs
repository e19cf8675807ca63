//! sandkeeperd on its Kubernetes backend (`--kubernetes FILE --kube-server URL`), against the
//! loopback API server (io-k8s's double: its exec runs each argv as a real process in the
//! pod's directory, its agent-sandbox controller makes, suspends and resumes claims' pods),
//! driven by the official Python SDK, unmodified (`py/e2b_k8s.py`): a command's standard input
//! is fed while it runs (`send_stdin`, `close_stdin`) in every mode; in agent-sandbox mode a
//! pause keeps the claim and connect resumes it with its files; in pod mode pause and
//! `autoPause` are refused and the sandbox runs on. Then the objects: a killed sandbox's are
//! gone, a running one's are there, and after SIGTERM nothing of the server's owner is left.
//!
//! What the loopback does not model (io-k8s/loopback's docs): images (the argv runs on this
//! host), scheduling, and real volumes (a pod's directory stays on disk).

mod common;

use std::path::Path;

use common::k8s::{cluster, config_file, owned_by};
use common::{sdk_python, Server};
use k8s_loopback::resources::ALL;
use k8s_loopback::Loopback;
use sandkeeper::{Key, SessionId};
use sandkeeper_k8s::names::{session_hash, OWNER, SESSION_HASH};
use serde_json::Value;

/// The objects of `owner` that serve the server's sandbox `id` (its keeper session is the id;
/// the backend labels each object with a hash of the session's key), as `<plural>/<name>`.
fn serving(server: &Loopback, owner: &str, id: &str) -> Vec<String> {
    let session = SessionId::new(id).expect("a session name");
    let hash = session_hash(&Key::Session(session).to_string());
    let mut out = Vec::new();
    for rt in ALL {
        for o in server.store().all(rt) {
            let labels = o.pointer("/metadata/labels");
            let label = |name: &str| labels.and_then(|l| l.get(name)).and_then(Value::as_str);
            if label(OWNER) == Some(owner) && label(SESSION_HASH) == Some(hash.as_str()) {
                let name = o["metadata"]["name"].as_str().unwrap_or("");
                out.push(format!("{}/{name}", rt.plural));
            }
        }
    }
    out
}

async fn run_script(mode: &'static str) {
    let cluster = cluster().await;
    let dir = tempfile::tempdir().expect("a temporary dir");
    let owner = format!("sandkeeperd-{mode}");
    let file = config_file(dir.path(), &owner, mode);
    let url = cluster.url();
    let shelf = dir.path().join("shelf");
    std::fs::create_dir(&shelf).expect("the shelf's directory");
    let shelf_url = (mode == "pod-shelf").then(|| format!("file://{}", shelf.display()));
    let (mut server, out) = tokio::task::spawn_blocking(move || {
        let mut flags = vec![
            "--kubernetes".to_string(),
            file.to_str().expect("a UTF-8 path").to_string(),
            "--kube-server".to_string(),
            url,
        ];
        if let Some(shelf) = shelf_url {
            flags.extend(["--snapshots".to_string(), shelf]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = Server::start_on(&flags);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/e2b_k8s.py");
        let out = sdk_python(240, &server.url)
            .arg(&script)
            .env("K8S_MODE", mode)
            .output()
            .expect("run the script");
        (server, out)
    })
    .await
    .expect("the script's thread");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all steps passed"), "{stdout}");
    // A command's standard input fed while it runs in the pod, in every mode.
    assert!(
        stdout.contains("ok stdin: send_stdin twice, close_stdin, wait"),
        "{stdout}"
    );
    let ids: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("sandbox "))
        .collect();
    let [killed, running] = ids[..] else {
        panic!("two sandboxes named: {stdout}")
    };

    // The killed sandbox's objects are gone; the running one's are there, in the cluster.
    assert_eq!(serving(&cluster, &owner, killed), Vec::<String>::new());
    let kinds: Vec<String> = serving(&cluster, &owner, running)
        .iter()
        .map(|o| o.split('/').next().unwrap_or("").to_string())
        .collect();
    let expected: &[&str] = match mode {
        "claim" => &["pods", "sandboxclaims"],
        _ => &["pods"],
    };
    let paused_once = mode != "pod";
    assert!(
        expected.iter().all(|k| kinds.iter().any(|x| x == k)),
        "the running sandbox's {expected:?}: {:?}",
        owned_by(&cluster, &owner)
    );

    // The metrics name the backend.
    let scrape = reqwest::get(format!("{}/metrics", server.url))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("the text");
    let line = |sample: &str| scrape.lines().any(|l| l == sample);
    let created = r#"sandkeeperd_creates_total{backend="kubernetes",outcome="ok"} 2"#;
    assert!(line(created), "{created} in:\n{scrape}");
    // Two pauses where the backend can: one resumed, one killed while paused.
    let paused = r#"sandkeeperd_pause_seconds_count{backend="kubernetes",outcome="api"} 2"#;
    assert_eq!(line(paused), paused_once, "{paused} in:\n{scrape}");

    // SIGTERM: the server kills what runs, closes the keeper and the backend deletes what its
    // owner still has and lets its Lease go.
    let status = tokio::task::spawn_blocking(move || server.terminate(30))
        .await
        .expect("the terminate thread");
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(owned_by(&cluster, &owner), Vec::<String>::new());
    // The shelf kept the paused workspace only until its resume; nothing is left on it.
    let left: Vec<_> = walk(&shelf);
    assert_eq!(left, Vec::<String>::new(), "left on the shelf");
    if mode == "pod-shelf" {
        assert!(stdout.contains("ok pause, connect resumes it with its files"));
    }
}

/// The files under `dir`, as paths relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read the shelf").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_on_agent_sandbox_claims_pauses_and_resumes() {
    run_script("claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_on_plain_pods_with_a_shelf_pauses_and_resumes() {
    run_script("pod-shelf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_on_plain_pods_is_refused_pause_and_runs_on() {
    run_script("pod").await;
}

/// Configurations the server refuses before it listens, each naming what is wrong: a shelf in
/// agentSandbox mode (which keeps a paused workspace in its claim), an unreadable or invalid
/// configuration file, an API server that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_kubernetes_configurations_stop_the_server_before_it_listens() {
    let cluster = cluster().await;
    let dir = tempfile::tempdir().expect("a temporary dir");
    let claim = config_file(dir.path(), "refused", "claim");
    let invalid = dir.path().join("invalid.yaml");
    std::fs::write(
        &invalid,
        "namespace: sk-test\nowner: NOT_A_NAME\nmode:\n  agentSandbox:\n    warmPool: pool\n",
    )
    .unwrap();
    let shelf = format!("file://{}", dir.path().display());
    let url = cluster.url();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--kubernetes".into(),
                claim.display().to_string(),
                "--kube-server".into(),
                url.clone(),
                "--snapshots".into(),
                shelf,
            ],
            "a shelf is for pod mode",
        ),
        (
            vec![
                "--kubernetes".into(),
                claim.display().to_string(),
                "--kube-server".into(),
                url.clone(),
                "--fleet".into(),
                "--fleet-store".into(),
                "host=127.0.0.1 port=1 user=x".into(),
            ],
            "--fleet-store is for replicas on hosts of their own",
        ),
        (
            vec![
                "--kubernetes".into(),
                dir.path().join("missing.yaml").display().to_string(),
                "--kube-server".into(),
                url.clone(),
            ],
            "missing.yaml",
        ),
        (
            vec![
                "--kubernetes".into(),
                invalid.display().to_string(),
                "--kube-server".into(),
                url,
            ],
            "invalid owner name",
        ),
        (
            vec![
                "--kubernetes".into(),
                claim.display().to_string(),
                "--kube-server".into(),
                "http://127.0.0.1:9".into(),
            ],
            "the Kubernetes backend",
        ),
    ];
    for (flags, says) in cases {
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("timeout")
                .arg("60")
                .arg(env!("CARGO_BIN_EXE_sandkeeperd"))
                .args(["--listen", "127.0.0.1:0", "--api-key", "t:k"])
                .args(&flags)
                .output()
                .expect("run sandkeeperd")
        })
        .await
        .expect("the thread");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(!stdout.contains("listening"), "{stdout}");
        assert!(stderr.contains(says), "{says:?} in:\n{stderr}");
    }
}
