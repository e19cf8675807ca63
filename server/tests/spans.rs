//! Every request runs in a `request` span (`src/request_span.rs`), read back from the log of
//! the binary at `RUST_LOG=sandkeeperd=debug`: REST and envd requests carry their method,
//! path, team and status, the work they do (a create) nests under them, and what a request
//! brings (a signed URL's query, a long path) is not written whole.

mod common;

use common::{Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

#[tokio::test]
async fn every_request_has_its_span() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sandkeeperd.log");
    let mut s = Server::start_logging("sandkeeperd=debug", &log);
    let c = Client::new();
    let created = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let created: Value = created.json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap();
    let token = created["envdAccessToken"].as_str().unwrap();
    let health = c
        .get(format!("{}/health", s.url))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::NO_CONTENT);
    let forged = c
        .get(format!(
            "{}/files?path=/home/user/a&signature=v1_SECRETSIGNATURE&signature_expiration=9999999999",
            s.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    let long = "z".repeat(4000);
    let nowhere = c
        .get(format!("{}/{long}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(nowhere.status(), StatusCode::NOT_FOUND);
    let killed = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    assert!(s.terminate(30).is_some_and(|st| st.success()));

    let text = std::fs::read_to_string(&log).unwrap();
    let has = |parts: &[&str]| text.lines().any(|l| parts.iter().all(|p| l.contains(p)));
    assert!(
        has(&[
            "request{method=POST path=\"/v2/sandboxes\"",
            "team=team-a",
            "status=201",
            "answered"
        ]),
        "{text}"
    );
    assert!(
        has(&[
            "request{method=POST path=\"/v2/sandboxes\"",
            "team=team-a",
            "}:create{"
        ]),
        "the create's own span nests in its request's:\n{text}"
    );
    assert!(
        has(&[
            "request{method=GET path=\"/health\"",
            &format!("sandbox=Some(\"{id}\")"),
            "team=team-a",
            "status=204"
        ]),
        "{text}"
    );
    assert!(
        has(&[
            "request{method=DELETE",
            &format!("path=\"/sandboxes/{id}\""),
            "status=204"
        ]),
        "{text}"
    );
    assert!(
        has(&["request{method=GET path=\"/files\"", "status=401"]),
        "{text}"
    );
    assert!(
        !text.contains("SECRETSIGNATURE"),
        "a signed URL's query was logged:\n{text}"
    );
    assert!(has(&["status=404", &"z".repeat(100)]), "{text}");
    assert!(
        !text.contains(&"z".repeat(200)),
        "a long path was logged whole"
    );
}
