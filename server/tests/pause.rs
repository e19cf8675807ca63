//! Pause and resume over HTTP against the binary: what was acknowledged before or during a
//! pause is there after the resume, whole; the edges answer as the SDKs expect (409 for a
//! second pause or a resume of a running sandbox, 502 for envd traffic to a paused one, 404
//! for another team's); a paused sandbox does not count against its team's limit; a kill of a
//! paused sandbox leaves nothing on disk, nor does a paused sandbox past its retention.

mod common;

use std::time::Duration;

use common::{create_sandbox, download, left_on_disk, Server, KEY_A, KEY_B};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn create(c: &Client, s: &Server) -> (String, String) {
    create_sandbox(c, &s.url, KEY_A, json!({"timeout": 120})).await
}

async fn rest(c: &Client, s: &Server, key: &str, path: &str, body: &str) -> StatusCode {
    c.post(format!("{}/sandboxes/{path}", s.url))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
}

/// The content of upload `i`: its own bytes, so a file holding another's, or a part, shows.
fn content(i: usize) -> Vec<u8> {
    (0..64 * 1024)
        .map(|n| ((n * 31 + i * 7) % 251) as u8)
        .collect()
}

fn upload(
    c: &Client,
    s: &Server,
    id: &str,
    token: &str,
    i: usize,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    c.post(format!("{}/files?path=/home/user/up/f{i}", s.url))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", "application/octet-stream")
        .body(content(i))
        .send()
}

/// The nothing-lost property across a pause: every upload the server answered 200 (before the
/// pause, or racing it) is in the resumed sandbox, whole; the others were refused whole (502,
/// the sandbox unreachable) and left nothing.
#[tokio::test]
async fn what_was_acknowledged_before_or_during_a_pause_is_there_after_the_resume() {
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s).await;
    let (status, _) = {
        let r = upload(&c, &s, &id, &token, 1000).await.unwrap();
        (r.status(), ())
    };
    assert_eq!(status, StatusCode::OK);

    let uploads: Vec<_> = (0..32).map(|i| upload(&c, &s, &id, &token, i)).collect();
    let pause_path = format!("{id}/pause");
    let pause = rest(&c, &s, KEY_A, &pause_path, "{}");
    let (answers, paused) = tokio::join!(futures_util::future::join_all(uploads), pause);
    assert_eq!(paused, StatusCode::NO_CONTENT);
    let mut acknowledged = vec![1000];
    for (i, a) in answers.into_iter().enumerate() {
        match a.unwrap().status() {
            StatusCode::OK => acknowledged.push(i),
            StatusCode::BAD_GATEWAY => {}
            other => panic!("upload {i}: {other}"),
        }
    }
    println!(
        "{} of 32 racing uploads acknowledged",
        acknowledged.len() - 1
    );

    let r = c
        .post(format!("{}/sandboxes/{id}/connect", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"timeout": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "connect resumes a paused sandbox"
    );
    for i in 0..32 {
        let (status, bytes) =
            download(&c, &s.url, &id, &token, &format!("/home/user/up/f{i}")).await;
        if acknowledged.contains(&i) {
            assert_eq!(status, StatusCode::OK, "acknowledged upload {i} lost");
            assert!(bytes == content(i), "acknowledged upload {i} not whole");
        } else if status == StatusCode::OK {
            // Refused to the client, yet landed: only whole.
            assert!(bytes == content(i), "a refused upload {i} landed in part");
        }
    }
    let (status, bytes) = download(&c, &s.url, &id, &token, "/home/user/up/f1000").await;
    assert_eq!((status, bytes == content(1000)), (StatusCode::OK, true));
}

#[tokio::test]
async fn pause_and_resume_answer_their_edges() {
    let s = Server::start(&["--sandboxes-per-team", "1"]);
    let c = Client::new();
    let (id, token) = create(&c, &s).await;

    // Malformed: refused, and nothing changes (it still runs).
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/pause"), "{").await,
        StatusCode::BAD_REQUEST
    );
    // Another team's: as an unknown one.
    assert_eq!(
        rest(&c, &s, KEY_B, &format!("{id}/pause"), "{}").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        rest(&c, &s, KEY_A, "sbx00000000000000000000/pause", "{}").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/resume"), "{}").await,
        StatusCode::CONFLICT
    );
    let health = |c: &Client| {
        c.get(format!("{}/health", s.url))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
            .send()
    };
    assert_eq!(health(&c).await.unwrap().status(), StatusCode::NO_CONTENT);

    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/pause"), "{}").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/pause"), "{}").await,
        StatusCode::CONFLICT
    );
    assert_eq!(health(&c).await.unwrap().status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        rest(&c, &s, KEY_B, &format!("{id}/connect"), "{}").await,
        StatusCode::NOT_FOUND
    );
    let info: Value = c
        .get(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["state"], "paused");

    // A paused sandbox does not count against the team's limit (1): another can be created,
    // and while that one runs the paused one cannot be resumed.
    let (other, _) = create(&c, &s).await;
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/connect"), "{}").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let killed = c
        .delete(format!("{}/sandboxes/{other}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/resume"), "{}").await,
        StatusCode::CREATED
    );
    assert_eq!(health(&c).await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/connect"), "{}").await,
        StatusCode::OK
    );

    // Paused again, then killed: resumed to be let go, and nothing stays on disk.
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/pause"), "{}").await,
        StatusCode::NO_CONTENT
    );
    let killed = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{id}/connect"), "{}").await,
        StatusCode::NOT_FOUND
    );
    // The keeper's Stop and Shutdown follow the released call on their own: a bounded poll of
    // the real directory, up to 15 s.
    for _ in 0..300 {
        if left_on_disk(s.root()).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "left on disk after the kill of a paused sandbox: {:?}",
        left_on_disk(s.root())
    );
}

/// A sandbox created with `autoPause` and killed before its timeout: its timer, which still
/// runs to the deadline, finds it gone and pauses nothing (before, it tried, and counted a
/// refused pause).
#[tokio::test]
async fn a_killed_sandbox_is_not_paused_by_its_timeout() {
    let s = Server::start(&[]);
    let c = Client::new();
    let created: Value = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"timeout": 1, "autoPause": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sandboxID"].as_str().unwrap();
    let killed = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    // An absence shows only after the deadline: wait past the 1 s timeout (real time: the
    // server's timer is the binary's own).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = c
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("sandkeeperd_pause_seconds_count"), "{text}");
}

/// `--paused-retention-secs`: a paused sandbox is killed once its retention passes, its
/// workspace deleted (nothing on disk, a kill counted with reason `retention`); one resumed
/// before then runs on with its file.
#[tokio::test]
async fn a_paused_sandbox_is_killed_past_its_retention_unless_resumed() {
    let s = Server::start(&["--paused-retention-secs", "1"]);
    let c = Client::new();
    // B is paused first and resumed at once; A is paused after it, so A's retention ends
    // after B's would have.
    let (b, b_token) = create(&c, &s).await;
    assert!(upload(&c, &s, &b, &b_token, 1)
        .await
        .unwrap()
        .status()
        .is_success());
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{b}/pause"), "").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{b}/resume"), "{}").await,
        StatusCode::CREATED
    );
    let (a, a_token) = create(&c, &s).await;
    assert!(upload(&c, &s, &a, &a_token, 2)
        .await
        .unwrap()
        .status()
        .is_success());
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{a}/pause"), "").await,
        StatusCode::NO_CONTENT
    );

    // The server's own timer, on real time: polled every 50 ms, bounded at 30 s (far above the
    // 1 s retention).
    let get = |id: String| {
        c.get(format!("{}/sandboxes/{id}", s.url))
            .header("x-api-key", KEY_A)
            .send()
    };
    let mut gone = false;
    for _ in 0..600 {
        if get(a.clone()).await.unwrap().status() == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "a paused sandbox outlived its retention");
    assert_eq!(
        rest(&c, &s, KEY_A, &format!("{a}/resume"), "{}").await,
        StatusCode::NOT_FOUND
    );

    let detail: Value = get(b.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(detail["state"], "running", "{detail}");
    let (status, bytes) = download(&c, &s.url, &b, &b_token, "/home/user/up/f1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bytes, content(1));

    let text = c
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"sandkeeperd_kills_total{backend="local",outcome="retention"} 1"#),
        "{text}"
    );
    // A's kept workspace is deleted (B's was taken by its resume): no snapshot is left. The
    // table lets A go before the keeper's discard runs: a bounded poll, up to 15 s.
    let snapshots = || {
        left_on_disk(s.root())
            .into_iter()
            .filter(|e| e.starts_with(".snapshots"))
            .collect::<Vec<_>>()
    };
    for _ in 0..300 {
        if snapshots().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(snapshots(), Vec::<String>::new());
    assert_eq!(rest_delete(&c, &s, &b).await, StatusCode::NO_CONTENT);
    // The keeper's Stop and Shutdown follow the released call on their own: a bounded poll of
    // the real directory, up to 15 s.
    for _ in 0..300 {
        if left_on_disk(s.root()).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("left on disk: {:?}", left_on_disk(s.root()));
}

async fn rest_delete(c: &Client, s: &Server, id: &str) -> StatusCode {
    c.delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap()
        .status()
}
