//! `--fleet`: sandboxes outlive the server. Against the binary, on one root: a server ended by
//! SIGTERM, and one killed with SIGKILL right after a pause was answered, are followed by a new
//! server on the same root, which lists the paused sandbox as paused and resumes it (the same
//! id and access token) with every file its uploads were answered 200 for. The sandbox that
//! was running when its server ended is shown paused, and the first envd request for it
//! resumes it with its file (after a SIGKILL, once the dead server's lease ran out). Sandboxes
//! killed after the restart (resumed and paused again, never resumed, continued) leave nothing
//! on disk.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{create_sandbox, download, left_on_disk, Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

fn fleet_server(root: &Path) -> Server {
    Server::start_on(&["--root", root.to_str().expect("a UTF-8 root"), "--fleet"])
}

async fn create(c: &Client, s: &Server) -> (String, String) {
    let body = json!({"timeout": 120, "metadata": {"who": "restart"}});
    create_sandbox(c, &s.url, KEY_A, body).await
}

fn content(i: usize) -> Vec<u8> {
    (0..32 * 1024)
        .map(|n| ((n * 17 + i * 13) % 251) as u8)
        .collect()
}

async fn upload(c: &Client, s: &Server, id: &str, token: &str, i: usize) -> StatusCode {
    c.post(format!("{}/files?path=/home/user/f{i}", s.url))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", "application/octet-stream")
        .body(content(i))
        .send()
        .await
        .unwrap()
        .status()
}

async fn post(c: &Client, s: &Server, path: &str, body: &str) -> StatusCode {
    c.post(format!("{}/sandboxes/{path}", s.url))
        .header("x-api-key", KEY_A)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
}

async fn detail(c: &Client, s: &Server, id: &str) -> (StatusCode, Value) {
    let r = c
        .get(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// What a server left under the root: sandboxes and kept snapshots (the stores' own
/// directories aside).
fn left(root: &Path) -> Vec<String> {
    left_on_disk(root)
        .into_iter()
        .filter(|e| e != ".fleet" && e != ".sandkeeperd")
        .collect()
}

/// Pauses a sandbox with two files; creates a running one beside it, with a third. Answers
/// both, with their tokens.
async fn paused_and_running(c: &Client, s: &Server) -> ((String, String), (String, String)) {
    let (p, p_token) = create(c, s).await;
    for i in [1, 2] {
        assert_eq!(upload(c, s, &p, &p_token, i).await, StatusCode::OK);
    }
    let (r, r_token) = create(c, s).await;
    assert_eq!(upload(c, s, &r, &r_token, 3).await, StatusCode::OK);
    assert_eq!(
        post(c, s, &format!("{p}/pause"), "").await,
        StatusCode::NO_CONTENT
    );
    ((p, p_token), (r, r_token))
}

/// The next server resumes `p` with its files and token.
async fn resumed_after_restart(c: &Client, s: &Server, p: &str, p_token: &str) {
    let (status, d) = detail(c, s, p).await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["state"], "paused", "{d}");
    assert_eq!(d["metadata"]["who"], "restart", "{d}");
    assert_eq!(
        post(c, s, &format!("{p}/connect"), r#"{"timeout": 60}"#).await,
        StatusCode::CREATED
    );
    for i in [1, 2] {
        let (status, bytes) = download(c, &s.url, p, p_token, &format!("/home/user/f{i}")).await;
        assert_eq!(status, StatusCode::OK, "file {i} after the restart");
        assert!(bytes == content(i), "file {i} whole after the restart");
    }
}

/// The next server continues `r`, which ran when its server ended: the API shows it paused
/// (interrupted), and the first envd request resumes it, its file there.
async fn continued_after_restart(c: &Client, s: &Server, r: &str, r_token: &str) {
    let (status, d) = detail(c, s, r).await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["state"], "paused", "{d}");
    // A request without its token does not wake it.
    let wrong = "0".repeat(r_token.len());
    assert_eq!(
        download(c, &s.url, r, &wrong, "/home/user/f3").await.0,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(detail(c, s, r).await.1["state"], "paused");
    let (status, bytes) = download(c, &s.url, r, r_token, "/home/user/f3").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the running sandbox's file after the restart"
    );
    assert!(bytes == content(3), "its file whole after the restart");
    assert_eq!(detail(c, s, r).await.1["state"], "running");
}

#[tokio::test]
async fn a_paused_sandbox_outlives_a_sigterm_and_is_resumed_by_the_next_server() {
    let root = tempfile::tempdir().unwrap();
    let c = Client::new();
    let mut first = fleet_server(root.path());
    let ((p, p_token), (r, r_token)) = paused_and_running(&c, &first).await;
    let (q, _) = create(&c, &first).await;
    assert_eq!(
        post(&c, &first, &format!("{q}/pause"), "").await,
        StatusCode::NO_CONTENT
    );
    assert!(first.terminate(30).is_some_and(|st| st.success()));

    let mut second = fleet_server(root.path());
    resumed_after_restart(&c, &second, &p, &p_token).await;
    continued_after_restart(&c, &second, &r, &r_token).await;
    // Killed while paused, never resumed here: its workspace, in the store's record of its
    // key, goes too.
    assert_eq!(detail(&c, &second, &q).await.1["state"], "paused");
    let killed = c
        .delete(format!("{}/sandboxes/{q}", second.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    // Paused again and killed while paused: nothing of it stays.
    assert_eq!(
        post(&c, &second, &format!("{p}/pause"), "").await,
        StatusCode::NO_CONTENT
    );
    let killed = c
        .delete(format!("{}/sandboxes/{p}", second.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    assert_eq!(detail(&c, &second, &p).await.0, StatusCode::NOT_FOUND);
    let killed = c
        .delete(format!("{}/sandboxes/{r}", second.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    assert!(second.terminate(30).is_some_and(|st| st.success()));
    assert_eq!(left(root.path()), Vec::<String>::new());

    // A third server finds nothing to take back.
    let third = fleet_server(root.path());
    assert_eq!(detail(&c, &third, &p).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_paused_sandbox_outlives_a_sigkill_right_after_its_pause_was_answered() {
    let root = tempfile::tempdir().unwrap();
    let c = Client::new();
    let mut first = fleet_server(root.path());
    let ((p, p_token), (r, r_token)) = paused_and_running(&c, &first).await;
    first.kill9();

    let second = fleet_server(root.path());
    // The dead server's lease runs out before its keys can be claimed (15 s): the resume
    // waits for it, bounded by the client's 120 s.
    let c = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    resumed_after_restart(&c, &second, &p, &p_token).await;
    // The running one, once the dead server's lease ran out (the resume above waited for it).
    continued_after_restart(&c, &second, &r, &r_token).await;
}
