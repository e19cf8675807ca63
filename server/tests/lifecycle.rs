//! A sandbox's end: kill kills its commands and waits for them, uploads racing a kill either
//! land or are refused whole, kill leaves nothing on disk, and the timeout kills.

mod common;

use std::time::Duration;

use common::{left_on_disk, Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn create(c: &Client, s: &Server, timeout: u64) -> (String, String) {
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"timeout": timeout}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    (
        v["sandboxID"].as_str().unwrap().into(),
        v["envdAccessToken"].as_str().unwrap().into(),
    )
}

/// A Connect envelope around `json`.
fn envelope(json: &Value) -> Vec<u8> {
    let body = json.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Reads a command's stream to its end, which must be broken off (no end event, no
/// end-of-stream envelope): how E2B's streams end when their sandbox goes, which the SDKs
/// answer by probing `/health`.
async fn assert_broken_off(stream: &mut reqwest::Response) {
    let mut rest = Vec::new();
    loop {
        match stream.chunk().await {
            Ok(Some(chunk)) => rest.extend_from_slice(&chunk),
            Ok(None) => panic!(
                "the stream ended cleanly: {}",
                String::from_utf8_lossy(&rest)
            ),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(
        !text.contains("\"end\""),
        "an end event in a killed sandbox's stream: {text}"
    );
}

/// Waits until the root holds no sandbox directory and no snapshot. Kill answers once the
/// keeper call is released; the keeper's Stop and Shutdown of the sandbox follow on their own,
/// so this is a bounded poll of the real backend's directory: up to 15 s.
async fn nothing_left_on_disk(s: &Server) {
    for _ in 0..300 {
        if left_on_disk(s.root()).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "left on disk 15 s after the kill: {:?}",
        left_on_disk(s.root())
    );
}

#[tokio::test]
async fn kill_breaks_off_running_commands_first_and_leaves_nothing_on_disk() {
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s, 60).await;
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo started; sleep 60"]}, "stdin": false});
    let mut stream = c
        .post(format!("{}/process.Process/Start", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    // Read until the command said it started (its output came through the stream).
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("c3RhcnRlZA") {
        let chunk = stream
            .chunk()
            .await
            .unwrap()
            .expect("the stream ended before the output");
        got.extend_from_slice(&chunk);
    }
    let kill = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send();
    // Bounded: the command would sleep 60 s; kill must end it, not wait it out.
    let r = tokio::time::timeout(Duration::from_secs(20), kill)
        .await
        .expect("kill waited for the sleep")
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_broken_off(&mut stream).await;
    nothing_left_on_disk(&s).await;
}

#[tokio::test]
async fn uploads_racing_a_kill_land_whole_or_are_refused() {
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s, 60).await;
    let upload = |i: usize| {
        c.post(format!("{}/files?path=/home/user/f{i}.txt", s.url))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
            .header("content-type", "application/octet-stream")
            .body(vec![b'a'; 64 * 1024])
            .send()
    };
    let uploads: Vec<_> = (0..16).map(upload).collect();
    let kill = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send();
    let (answers, killed) = tokio::join!(futures_util::future::join_all(uploads), kill);
    assert_eq!(killed.unwrap().status(), StatusCode::NO_CONTENT);
    for a in answers {
        let status = a.unwrap().status();
        assert!(
            status == StatusCode::OK || status == StatusCode::BAD_GATEWAY,
            "{status}"
        );
    }
    nothing_left_on_disk(&s).await;
}

#[tokio::test]
async fn the_timeout_kills_the_sandbox() {
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, _) = create(&c, &s, 1).await;
    let r = c
        .get(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["state"], "running");
    // A bounded poll of the real server, whose timer runs on the wall clock: up to 15 s.
    for _ in 0..150 {
        let r = c
            .get(format!("{}/sandboxes/{id}", s.url))
            .header("x-api-key", KEY_A)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::NOT_FOUND {
            nothing_left_on_disk(&s).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sandbox outlived its 1 s timeout by 15 s");
}

#[tokio::test]
async fn a_named_session_is_shared_within_a_team_and_never_across_teams() {
    let s = Server::start(&[]);
    let c = Client::new();
    let make = |key: &'static str| {
        c.post(format!("{}/v2/sandboxes", s.url))
            .header("x-api-key", key)
            .json(&json!({"metadata": {"sandkeeper.session": "s1"}}))
            .send()
    };
    let sandbox = |r: Value| {
        (
            r["sandboxID"].as_str().unwrap().to_string(),
            r["envdAccessToken"].as_str().unwrap().to_string(),
        )
    };
    let a1 = sandbox(make(KEY_A).await.unwrap().json().await.unwrap());
    let a2 = sandbox(make(KEY_A).await.unwrap().json().await.unwrap());
    let b1 = sandbox(make(common::KEY_B).await.unwrap().json().await.unwrap());
    let r = c
        .post(format!("{}/files?path=/home/user/shared.txt", s.url))
        .header("e2b-sandbox-id", &a1.0)
        .header("x-access-token", &a1.1)
        .header("content-type", "application/octet-stream")
        .body("from a1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let read = |(id, token): &(String, String)| {
        c.get(format!("{}/files?path=/home/user/shared.txt", s.url))
            .header("e2b-sandbox-id", id)
            .header("x-access-token", token)
            .send()
    };
    let r = read(&a2).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "team a's two sandboxes share session s1"
    );
    assert_eq!(r.text().await.unwrap(), "from a1");
    let r = read(&b1).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "team b's session s1 is its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_kills_every_sandbox_and_ends_open_streams() {
    let mut s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s, 600).await;
    let start =
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo started; sleep 600"]}});
    let mut stream = c
        .post(format!("{}/process.Process/Start", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("c3RhcnRlZA") {
        let chunk = stream
            .chunk()
            .await
            .unwrap()
            .expect("the stream ended before the output");
        got.extend_from_slice(&chunk);
    }
    let status = tokio::task::block_in_place(|| s.terminate(20));
    let status =
        status.expect("sandkeeperd still ran 20 s after SIGTERM (an open stream held it?)");
    assert!(status.success(), "{status}");
    assert_broken_off(&mut stream).await;
    nothing_left_on_disk(&s).await;
}
