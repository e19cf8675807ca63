//! The error paths, over HTTP against the binary: a missing or bad key, another team's
//! sandbox, oversize bodies and uploads, malformed JSON, unknown sandboxes and paths, limits,
//! unsupported operations. Each answer is in the shape the SDKs read.

mod common;

use common::{Server, KEY_A, KEY_B};
use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};

async fn body(r: Response) -> (StatusCode, Value) {
    let status = r.status();
    let text = r.text().await.expect("a body");
    let json = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    (status, json)
}

/// Creates a sandbox for `key`: its id and access token.
async fn create(c: &Client, s: &Server, key: &str) -> (String, String) {
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", key)
        .json(&json!({"templateID": "base", "timeout": 60}))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    (
        v["sandboxID"].as_str().unwrap().to_string(),
        v["envdAccessToken"].as_str().unwrap().to_string(),
    )
}

fn envd(c: &Client, s: &Server, path: &str, id: &str, token: &str) -> reqwest::RequestBuilder {
    c.post(format!("{}{path}", s.url))
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
        .header("x-access-token", token)
}

#[tokio::test]
async fn a_missing_or_bad_key_is_401_in_e2b_shape_and_creates_nothing() {
    let s = Server::start(&[]);
    let c = Client::new();
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(v["code"], 401);
    assert!(v["message"].as_str().unwrap().contains("missing API key"));
    for path in ["/v2/sandboxes", "/sandboxes", "/sandboxes/sbx0"] {
        let r = c
            .get(format!("{}{path}", s.url))
            .header("x-api-key", "wrong")
            .send()
            .await
            .unwrap();
        let (status, v) = body(r).await;
        assert_eq!(
            (status, v["code"].as_u64()),
            (StatusCode::UNAUTHORIZED, Some(401)),
            "{path}"
        );
    }
    let r = c
        .get(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(
        body(r).await.1,
        json!([]),
        "the refused create made nothing"
    );
}

#[tokio::test]
async fn another_teams_sandbox_answers_exactly_as_an_unknown_one() {
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s, KEY_A).await;
    let (_, token_b) = create(&c, &s, KEY_B).await;
    let unknown = "sbx00000000000000000000";
    let strip = |v: Value, id: &str| v.to_string().replace(id, "ID");
    for (method, suffix, payload) in [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/timeout", Some(json!({"timeout": 30}))),
        ("POST", "/connect", Some(json!({}))),
        ("POST", "/pause", Some(json!({}))),
    ] {
        let mut answers = Vec::new();
        for target in [id.as_str(), unknown] {
            let url = format!("{}/sandboxes/{target}{suffix}", s.url);
            let mut req = c
                .request(method.parse().unwrap(), url)
                .header("x-api-key", KEY_B);
            if let Some(p) = &payload {
                req = req.json(p);
            }
            let (status, v) = body(req.send().await.unwrap()).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {suffix}: {v}");
            answers.push(strip(v, target));
        }
        assert_eq!(answers[0], answers[1], "{method} {suffix}");
    }
    let listed = c
        .get(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_B)
        .send()
        .await
        .unwrap();
    let listed = body(listed).await.1;
    assert!(
        !listed.to_string().contains(&id),
        "team b lists team a's sandbox: {listed}"
    );
    // envd: team b's own token, or none, for team a's sandbox: as an unknown sandbox (502).
    for (target, tok) in [
        (id.as_str(), token_b.as_str()),
        (id.as_str(), ""),
        (unknown, token.as_str()),
    ] {
        let r = envd(&c, &s, "/filesystem.Filesystem/ListDir", target, tok)
            .json(&json!({"path": "/home/user"}))
            .send()
            .await
            .unwrap();
        let (status, v) = body(r).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{v}");
        assert_eq!(v["message"], "The sandbox was not found");
        assert_eq!(v["code"], 502);
    }
    // The sandbox is untouched, and its own token works.
    let r = envd(&c, &s, "/filesystem.Filesystem/ListDir", &id, &token)
        .json(&json!({"path": "/home/user"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn oversize_bodies_and_uploads_are_413_and_write_nothing() {
    let s = Server::start(&["--max-upload-bytes", "1024", "--max-body-bytes", "4096"]);
    let c = Client::new();
    let (id, token) = create(&c, &s, KEY_A).await;
    let big = vec![b'x'; 2048];
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(big.clone()).file_name("/home/user/big.txt"),
    );
    let r = envd(&c, &s, "/files?path=/home/user/big.txt", &id, &token)
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some(413)),
        "{v}"
    );
    let r = envd(&c, &s, "/files?path=/home/user/big.txt", &id, &token)
        .header("content-type", "application/octet-stream")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let r = c
        .get(format!("{}/files?path=/home/user/big.txt", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404)),
        "nothing was written: {v}"
    );
    // A gzip body under the bound that inflates past it: 413, nothing written.
    let mut zipped = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut zipped, &[0u8; 64 * 1024]).unwrap();
    let zipped = zipped.finish().unwrap();
    assert!(zipped.len() < 1024, "{}", zipped.len());
    let r = envd(&c, &s, "/files?path=/home/user/bomb.bin", &id, &token)
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(zipped)
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    let r = c
        .get(format!("{}/files?path=/home/user/bomb.bin", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::NOT_FOUND);
    // A JSON body over its bound, chunked or not.
    let huge = json!({"templateID": "base", "metadata": {"k": "v".repeat(8000)}});
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    let chunks =
        futures_util::stream::iter(vec![Ok::<_, std::io::Error>(huge.to_string().into_bytes())]);
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn malformed_or_invalid_requests_are_400_and_change_nothing() {
    let s = Server::start(&[]);
    let c = Client::new();
    let post = |path: &str, raw: &str| {
        c.post(format!("{}{path}", s.url))
            .header("x-api-key", KEY_A)
            .header("content-type", "application/json")
            .body(raw.to_string())
            .send()
    };
    for raw in [
        "{not json",
        r#"{"timeout": "soon"}"#,
        r#"{"timeout": -1}"#,
        r#"{"templateID": "a b"}"#,
        r#"{"envVars": {"1BAD": "x"}}"#,
        r#"{"metadata": {"sandkeeper.session": "../x"}}"#,
        r#"{"autoPause": true, "autoPauseMemory": true}"#,
        r#"{"autoPause": true, "autoResume": {"enabled": true}}"#,
        r#"{"network": {"allowOut": []}}"#,
    ] {
        let (status, v) = body(post("/v2/sandboxes", raw).await.unwrap()).await;
        assert_eq!(
            (status, v["code"].as_u64()),
            (StatusCode::BAD_REQUEST, Some(400)),
            "{raw}: {v}"
        );
    }
    let listed = c
        .get(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(body(listed).await.1, json!([]));
    let (id, token) = create(&c, &s, KEY_A).await;
    let (status, _) = body(
        post(&format!("/sandboxes/{id}/timeout"), "{")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // envd: a malformed RPC body and a path outside the workspace are invalid_argument.
    for raw in [
        "{",
        r#"{"path": "/etc/passwd"}"#,
        r#"{"path": "/home/user/../../etc"}"#,
    ] {
        let r = envd(&c, &s, "/filesystem.Filesystem/Stat", &id, &token)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let (status, v) = body(r).await;
        assert_eq!(
            (status, v["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_argument")),
            "{raw}: {v}"
        );
    }
}

#[tokio::test]
async fn unsupported_and_unknown_are_answered_plainly() {
    let s = Server::start(&["--sandboxes-per-team", "1"]);
    let c = Client::new();
    let (id, token) = create(&c, &s, KEY_A).await;
    let r = c
        .post(format!("{}/sandboxes/{id}/fork", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::NOT_IMPLEMENTED, Some(501)),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("not supported"));
    let r = c
        .post(format!("{}/v3/templates", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::NOT_IMPLEMENTED);
    let r = c
        .put(format!("{}/v2/sandboxes", s.url))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::METHOD_NOT_ALLOWED, Some(405))
    );
    let r = c
        .get(format!("{}/no/such/path", s.url))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404))
    );
    let r = envd(&c, &s, "/process.Process/Update", &id, &token)
        .json(&json!({"process": {"pid": 1}}))
        .send()
        .await
        .unwrap();
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("unimplemented")),
        "{v}"
    );
    // The team's limit: 429 that the SDK is told not to retry; nothing created.
    let r = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers().get("should-retry").map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::TOO_MANY_REQUESTS, Some(429)),
        "{v}"
    );
    // Killed: gone for the REST API (404) and for envd (502).
    let r = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::NOT_FOUND);
    let r = c
        .get(format!("{}/health", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(body(r).await.0, StatusCode::BAD_GATEWAY);
    // And the slot is free again.
    create(&c, &s, KEY_A).await;
}

#[tokio::test]
async fn a_client_killed_mid_upload_writes_nothing_and_the_sandbox_goes_on() {
    use tokio::io::AsyncWriteExt;
    let s = Server::start(&[]);
    let c = Client::new();
    let (id, token) = create(&c, &s, KEY_A).await;
    let addr = s.url.strip_prefix("http://").unwrap();
    for content_type in [
        "application/octet-stream",
        "multipart/form-data; boundary=XyZ",
    ] {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /files?path=/home/user/partial.bin HTTP/1.1\r\nhost: {addr}\r\ne2b-sandbox-id: {id}\r\n\
             x-access-token: {token}\r\ncontent-type: {content_type}\r\ncontent-length: 1048576\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut part = b"--XyZ\r\ncontent-disposition: form-data; name=\"file\"; filename=\"partial.bin\"\r\n\r\n".to_vec();
        part.resize(64 * 1024, b'p');
        tcp.write_all(&part).await.unwrap();
        drop(tcp); // the client dies a sixteenth of the way in
    }
    // The server read the dead connections to their end (or will): nothing was written, and
    // the sandbox goes on taking work.
    let r = c
        .post(format!("{}/files?path=/home/user/after.txt", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body("after")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let list = envd(&c, &s, "/filesystem.Filesystem/ListDir", &id, &token)
        .json(&json!({"path": "/home/user"}))
        .send()
        .await
        .unwrap();
    let (_, v) = body(list).await;
    let names: Vec<_> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"after.txt".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("partial")),
        "a dead client's upload was written: {names:?}"
    );
}

#[tokio::test]
async fn concurrent_creates_past_the_team_limit_are_refused_whole() {
    let s = Server::start(&["--sandboxes-per-team", "3"]);
    let c = Client::new();
    let creates = (0..10).map(|_| {
        c.post(format!("{}/v2/sandboxes", s.url))
            .header("x-api-key", KEY_A)
            .json(&json!({}))
            .send()
    });
    let answers = futures_util::future::join_all(creates).await;
    let statuses: Vec<_> = answers.into_iter().map(|r| r.unwrap().status()).collect();
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((created, refused), (3, 7), "{statuses:?}");
    let r = c
        .get(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(
        body(r).await.1.as_array().map(Vec::len),
        Some(3),
        "the refused made nothing"
    );
}

#[tokio::test]
async fn a_team_over_its_request_rate_gets_429_and_other_teams_do_not() {
    // One request a second, a burst of two. Ten requests in a row meet a refusal unless they
    // take about eight seconds, so a slow machine does not make this flaky.
    let s = Server::start(&["--requests-per-second", "1"]);
    let c = Client::new();
    let list = |key: &'static str| {
        c.get(format!("{}/v2/sandboxes", s.url))
            .header("x-api-key", key)
            .send()
    };
    let (id, token) = create(&c, &s, KEY_A).await;
    let mut refused = None;
    for _ in 0..10 {
        let r = list(KEY_A).await.unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = refused.expect("ten requests at once within a rate of one a second");
    assert_eq!(
        r.headers().get("should-retry").map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    let (status, v) = body(r).await;
    assert_eq!(
        (status, v["code"].as_u64()),
        (StatusCode::TOO_MANY_REQUESTS, Some(429)),
        "{v}"
    );
    let mut envd_refused = false;
    for _ in 0..10 {
        let r = envd(&c, &s, "/filesystem.Filesystem/ListDir", &id, &token)
            .json(&json!({"path": "/home/user"}))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            envd_refused = true;
            break;
        }
    }
    assert!(envd_refused, "envd requests count for the team too");
    assert_eq!(
        list(KEY_B).await.unwrap().status(),
        StatusCode::OK,
        "team b has its own rate"
    );
}
