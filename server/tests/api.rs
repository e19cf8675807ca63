//! The REST API's older (v1) paths and the timeout family, over HTTP: create and connect on
//! both paths, refresh and connect only lengthen, set_timeout moves either way, the sandbox
//! metrics answer an empty list.

mod common;

use common::{Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn call(
    c: &Client,
    method: &str,
    url: String,
    payload: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = c
        .request(method.parse().unwrap(), url)
        .header("x-api-key", KEY_A);
    if let Some(p) = payload {
        req = req.json(&p);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn end_at(detail: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(detail["endAt"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn v1_paths_and_the_timeout_family() {
    let s = Server::start(&[]);
    let c = Client::new();
    let body =
        json!({"templateID": "base", "timeout": 100, "secure": true, "metadata": {"k": "v"}});
    let (status, created) = call(&c, "POST", format!("{}/sandboxes", s.url), Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_string();
    for key in ["templateID", "clientID", "envdVersion", "envdAccessToken"] {
        assert!(created[key].is_string(), "{key} in {created}");
    }
    let detail = || call(&c, "GET", format!("{}/sandboxes/{id}", s.url), None);
    let (status, d0) = detail().await;
    assert_eq!(status, StatusCode::OK);
    // The local backend's default limits: 2 cores, 2 GiB, a workspace of 8 GiB.
    assert_eq!(
        (
            d0["cpuCount"].as_u64(),
            d0["memoryMB"].as_u64(),
            d0["diskSizeMB"].as_u64()
        ),
        (Some(2), Some(2048), Some(8192)),
        "{d0}"
    );
    assert_eq!(
        (d0["state"].as_str(), d0["metadata"]["k"].as_str()),
        (Some("running"), Some("v"))
    );

    // Refresh and connect only lengthen.
    let (status, _) = call(
        &c,
        "POST",
        format!("{}/sandboxes/{id}/refreshes", s.url),
        Some(json!({"duration": 10})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, again) = call(
        &c,
        "POST",
        format!("{}/sandboxes/{id}/connect", s.url),
        Some(json!({"timeout": 10})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["envdAccessToken"], created["envdAccessToken"]);
    let (_, d1) = detail().await;
    assert_eq!(
        end_at(&d1),
        end_at(&d0),
        "a shorter refresh or connect changed the end"
    );
    let (status, _) = call(
        &c,
        "POST",
        format!("{}/v2/sandboxes/{id}/connect", s.url),
        Some(json!({"timeout": 1000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, d2) = detail().await;
    assert!(end_at(&d2) > end_at(&d1), "a longer connect lengthens");

    // set_timeout moves either way.
    let (status, _) = call(
        &c,
        "POST",
        format!("{}/sandboxes/{id}/timeout", s.url),
        Some(json!({"timeout": 20})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, d3) = detail().await;
    assert!(end_at(&d3) < end_at(&d1), "set_timeout shortens");

    let (status, m) = call(&c, "GET", format!("{}/sandboxes/{id}/metrics", s.url), None).await;
    assert_eq!((status, m), (StatusCode::OK, json!([])));
    let (status, listed) = call(&c, "GET", format!("{}/sandboxes", s.url), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed[0]["sandboxID"].as_str(), Some(id.as_str()));
    let (status, listed) = call(
        &c,
        "GET",
        format!("{}/v2/sandboxes?state=paused", s.url),
        None,
    )
    .await;
    assert_eq!(
        (status, listed),
        (StatusCode::OK, json!([])),
        "nothing is paused here"
    );
}
