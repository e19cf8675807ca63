//! `/metrics` scraped during and after a sandbox's life: its create, a command, uploads, a
//! pause and a resume, its kill.

mod common;

use common::{Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// The value of the sample `name` (with its labels, as written) in a scrape.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_a_sandboxs_life() {
    let s = Server::start(&["--max-upload-bytes", "16"]);
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
    let scrape = || async {
        let r = c.get(format!("{}/metrics", s.url)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.text().await.unwrap()
    };
    let during = scrape().await;
    assert_eq!(
        sample(&during, "sandkeeperd_sandboxes"),
        Some(1.0),
        "{during}"
    );
    for body in ["small", "far more than sixteen bytes"] {
        c.post(format!("{}/files?path=/home/user/x", s.url))
            .header("e2b-sandbox-id", id)
            .header("x-access-token", token)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .unwrap();
    }
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-c", "true"]}}).to_string();
    let mut envelope = vec![0u8];
    envelope.extend_from_slice(&u32::try_from(start.len()).unwrap().to_be_bytes());
    envelope.extend_from_slice(start.as_bytes());
    let streamed = c
        .post(format!("{}/process.Process/Start", s.url))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", "application/connect+json")
        .body(envelope)
        .send()
        .await
        .unwrap();
    streamed.bytes().await.unwrap(); // to its end
    let post = |path: String| {
        c.post(format!("{}/sandboxes/{id}/{path}", s.url))
            .header("x-api-key", KEY_A)
            .json(&json!({}))
            .send()
    };
    assert_eq!(
        post("pause".into()).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let paused = scrape().await;
    assert_eq!(sample(&paused, "sandkeeperd_paused"), Some(1.0), "{paused}");
    assert_eq!(
        sample(&paused, "sandkeeperd_sandboxes"),
        Some(0.0),
        "{paused}"
    );
    assert_eq!(
        post("connect".into()).await.unwrap().status(),
        StatusCode::CREATED
    );
    let r = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let after = scrape().await;
    let local = |name: &str, outcome: &str| {
        sample(
            &after,
            &format!("sandkeeperd_{name}{{backend=\"local\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        sample(&after, "sandkeeperd_sandboxes"),
        Some(0.0),
        "{after}"
    );
    assert_eq!(local("creates_total", "ok"), Some(1.0), "{after}");
    assert_eq!(local("kills_total", "api"), Some(1.0), "{after}");
    assert_eq!(local("uploads_total", "ok"), Some(1.0), "{after}");
    assert_eq!(local("uploads_total", "too-large"), Some(1.0), "{after}");
    assert_eq!(local("commands_total", "exited"), Some(1.0), "{after}");
    assert_eq!(local("create_seconds_count", "ok"), Some(1.0), "{after}");
    assert_eq!(local("kill_seconds_count", "api"), Some(1.0), "{after}");
    assert_eq!(local("pause_seconds_count", "api"), Some(1.0), "{after}");
    assert_eq!(local("resume_seconds_count", "ok"), Some(1.0), "{after}");
    assert_eq!(sample(&after, "sandkeeperd_paused"), Some(0.0), "{after}");
    assert!(!after.contains(id), "no sandbox id in the metrics");
}
