//! Lifecycle hooks (`--hooks`) over HTTP against the binary: each runs inside the sandbox at
//! its transition, in order (after the start, before a pause's stop, after the resume, before
//! a kill's stop), `/metrics` counts them, a failing after-start hook fails the create (503,
//! nothing made) and a bad hook file stops the server before it listens.

mod common;

use std::io::Write;
use std::process::Command;

use common::{Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// A hook file with `hooks` (JSON), kept until dropped.
fn hook_file(hooks: &Value) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(hooks.to_string().as_bytes()).unwrap();
    file
}

/// A hook appending `word` to the workspace's `.hooklog`.
fn appends(word: &str) -> Value {
    json!({"argv": ["sh", "-c", format!("echo {word} >> .hooklog")], "timeout_secs": 10})
}

async fn hooklog(c: &Client, s: &Server, id: &str, token: &str) -> String {
    let r = c
        .get(format!("{}/files?path=.hooklog", s.url))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

async fn scrape(c: &Client, s: &Server) -> String {
    c.get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn hooks_counted(text: &str, point: &str, outcome: &str) -> Option<f64> {
    let name = format!(
        "sandkeeperd_hooks_total{{backend=\"local\",point=\"{point}\",outcome=\"{outcome}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&name)?.parse().ok())
}

#[tokio::test]
async fn hooks_run_in_the_sandbox_at_each_transition_in_order() {
    let file = hook_file(&json!({
        "after_start": appends("start"),
        "after_resume": appends("resume"),
        "before_suspend": appends("suspend"),
        "before_stop": appends("stop"),
    }));
    let s = Server::start(&["--hooks", file.path().to_str().unwrap()]);
    let c = Client::new();
    let created: Value = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sandboxID"].as_str().unwrap();
    let token = created["envdAccessToken"].as_str().unwrap();
    assert_eq!(hooklog(&c, &s, id, token).await, "start\n");

    let post = |what: &str| {
        c.post(format!("{}/sandboxes/{id}/{what}", s.url))
            .header("x-api-key", KEY_A)
            .json(&json!({}))
            .send()
    };
    assert_eq!(
        post("pause").await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(post("connect").await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(hooklog(&c, &s, id, token).await, "start\nsuspend\nresume\n");

    let killed = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    // The before-stop hook runs after the kill's release, on the keeper's way down: a bounded
    // poll of the metrics, up to 15 s (it takes milliseconds).
    let mut text = String::new();
    for _ in 0..300 {
        text = scrape(&c, &s).await;
        if hooks_counted(&text, "before-stop", "ok") == Some(1.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for point in [
        "after-start",
        "before-suspend",
        "after-resume",
        "before-stop",
    ] {
        assert_eq!(
            hooks_counted(&text, point, "ok"),
            Some(1.0),
            "{point}:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_failing_after_start_hook_fails_the_create_and_makes_nothing() {
    let file = hook_file(&json!({
        "after_start": {"argv": ["sh", "-c", "echo no credentials >&2; exit 3"], "timeout_secs": 10},
    }));
    let s = Server::start(&[
        "--hooks",
        file.path().to_str().unwrap(),
        "--sandboxes-per-team",
        "1",
    ]);
    let c = Client::new();
    for _ in 0..2 {
        // Twice: the first failure gave the team's one place back.
        let r = c
            .post(format!("{}/v2/sandboxes", s.url))
            .header("x-api-key", KEY_A)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let listed: Value = c
        .get(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));
    let text = scrape(&c, &s).await;
    assert_eq!(
        hooks_counted(&text, "after-start", "failed"),
        Some(2.0),
        "{text}"
    );
}

#[test]
fn a_bad_hook_file_stops_the_server_before_it_listens() {
    for (hooks, says) in [
        (
            json!({"after_start": {"argv": [], "timeout_secs": 5}}),
            "names no program",
        ),
        (
            json!({"after_pause": {"argv": ["true"], "timeout_secs": 5}}),
            "unknown field",
        ),
    ] {
        let file = hook_file(&hooks);
        let root = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sandkeeperd"))
            .args(["--listen", "127.0.0.1:0", "--root"])
            .arg(root.path())
            .args(["--api-key", &format!("team-a:{KEY_A}")])
            .arg("--hooks")
            .arg(file.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stdout}");
        assert!(!stdout.contains("listening"), "{stdout}");
        assert!(
            stderr.contains(says) && stderr.contains("--hooks"),
            "{stderr}"
        );
    }
}
