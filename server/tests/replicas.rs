//! Replicas: two `sandkeeperd --fleet` on one root, each answering for every sandbox. The
//! unmodified Python SDK makes a sandbox on one and uses it through the other (files, a
//! streamed command, processes, list, get), pauses it through the other, resumes it there (the
//! first replica's keeper hands the key over) and kills it through the first
//! (`py/e2b_replicas.py`). Then, against the binaries: another team's key is answered 404
//! through the other replica; a request already forwarded is answered where it lands, never
//! forwarded again; a replica killed with SIGKILL is answered 502 (naming it) while its lease
//! lives; once it lapsed, b answers for its sandboxes as paused, a connect through b continues
//! one with the file an upload through b was answered 200 for before the crash, and the first
//! envd request for the other resumes it on b with its file. Killed, nothing of them is left
//! on the root.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    create_sandbox, get_sandbox, kill_sandbox, left_on_disk, replicas_script, Server, KEY_A, KEY_B,
};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

fn replica(root: &Path) -> Server {
    Server::start_on(&["--root", root.to_str().expect("a UTF-8 root"), "--fleet"])
}

async fn create(c: &Client, s: &Server) -> String {
    create_sandbox(c, &s.url, KEY_A, json!({"timeout": 120}))
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_answers_for_any_sandbox_and_continues_a_dead_ones() {
    let root = tempfile::tempdir().unwrap();
    let (mut a, b) = (replica(root.path()), replica(root.path()));
    let left = replicas_script(180, &a.url, &b.url).await;

    let c = Client::new();
    // It runs on a (resumed there); b answers for it, a's team only.
    let (status, body) = get_sandbox(&c, &b.url, &left, KEY_A).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"running\""), "{body}");
    let (status, _) = get_sandbox(&c, &b.url, &left, KEY_B).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another team through b");
    // A request marked as forwarded is answered where it lands: b does not run it.
    let r = c
        .get(format!("{}/sandboxes/{left}", b.url))
        .header("x-api-key", KEY_A)
        .header("x-sandkeeperd-forwarded-by", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "forwarded twice");

    // a dies with a sandbox on it, after an upload through b was answered 200: b says so
    // (502, naming a) while a's lease lives; then b answers for it as paused, and a connect
    // through b continues it with the file. The sandbox the script left on a too.
    let on_a = create(&c, &a).await;
    let token = details(&c, &b, &on_a).await["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let uploaded = c
        .post(format!("{}/files?path=/home/user/acked.bin", b.url))
        .header("e2b-sandbox-id", &on_a)
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body(vec![7u8; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), StatusCode::OK);
    let a_url = a.url.clone();
    a.kill9();
    let (status, body) = get_sandbox(&c, &b.url, &on_a, KEY_A).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains(&a_url), "{body}");
    // A bounded poll of real processes: a's lease (15 s) lapses on the wall clock.
    let mut paused = false;
    for _ in 0..60 {
        let (status, body) = get_sandbox(&c, &b.url, &on_a, KEY_A).await;
        if status == StatusCode::OK && body.contains("\"paused\"") {
            paused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(paused, "b never took a dead replica's sandbox for paused");
    let r = c
        .post(format!("{}/sandboxes/{on_a}/connect", b.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"timeout": 60}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let back = c
        .get(format!("{}/files?path=/home/user/acked.bin", b.url))
        .header("e2b-sandbox-id", &on_a)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(back.status(), StatusCode::OK);
    assert_eq!(back.bytes().await.unwrap().to_vec(), vec![7u8; 100_000]);
    // The one the script left: the first envd request resumes it on b, its file there.
    let left_token = details(&c, &b, &left).await["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let read = c
        .get(format!("{}/files?path=/home/user/d.txt", b.url))
        .header("e2b-sandbox-id", &left)
        .header("x-access-token", &left_token)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.text().await.unwrap(), "made on b");
    assert_eq!(details(&c, &b, &left).await["state"], "running");
    for id in [&on_a, &left] {
        assert_eq!(
            kill_sandbox(&c, &b.url, id, KEY_A).await,
            StatusCode::NO_CONTENT
        );
    }
    let mut b = b;
    assert!(b.terminate(30).is_some_and(|s| s.success()));
    let left_over: Vec<_> = left_on_disk(root.path())
        .into_iter()
        .filter(|n| n != ".fleet" && n != ".sandkeeperd")
        .collect();
    assert_eq!(left_over, Vec::<String>::new(), "killed, yet on disk");
    let records: Vec<_> = std::fs::read_dir(root.path().join(".sandkeeperd/sandboxes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(records, Vec::<String>::new(), "records of killed sandboxes");
}

async fn details(c: &Client, s: &Server, id: &str) -> Value {
    let (status, body) = get_sandbox(c, &s.url, id, KEY_A).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Runs the binary with `flags`, expecting it to refuse them before listening: its standard
/// error. Bounded by `timeout` (20 s): a server that starts instead is ended and the test fails.
fn refused(flags: &[&str]) -> String {
    let root = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_sandkeeperd"))
        .args(["--listen", "127.0.0.1:0", "--root"])
        .arg(root.path())
        .args(["--api-key", &format!("team-a:{KEY_A}")])
        .args(flags)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("listening"), "it started: {stdout}");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_replica_and_host_flags_stop_the_server_naming_them() {
    for bad in [
        "ftp://127.0.0.1:9",
        "http://",
        "127.0.0.1:9",
        "http://h:1/path",
    ] {
        let err = refused(&["--fleet", "--advertise", bad]);
        assert!(err.contains(&format!("--advertise {bad}")), "{bad}: {err}");
    }
    let err = refused(&["--advertise", "http://127.0.0.1:9"]);
    assert!(err.contains("--fleet"), "{err}");
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let err = refused(&[
        "--fleet",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(err.contains("--fleet with --tls"), "{err}");
    // Replicas on hosts of their own: the shelf is needed, and is for them (or pod mode) only;
    // a store that does not parse, cannot be reached or whose CA file is missing is named.
    std::fs::create_dir(dir.path().join("shelf")).unwrap();
    let shelf = format!("file://{}", dir.path().join("shelf").display());
    let err = refused(&["--fleet", "--fleet-store", "host=127.0.0.1 port=1 user=x"]);
    assert!(err.contains("--fleet-store needs --snapshots"), "{err}");
    let err = refused(&["--snapshots", &shelf]);
    assert!(err.contains("--snapshots is for"), "{err}");
    let err = refused(&[
        "--fleet-store",
        "host=127.0.0.1 port=1 user=x",
        "--snapshots",
        &shelf,
    ]);
    assert!(err.contains("--fleet"), "{err}");
    let err = refused(&[
        "--fleet",
        "--fleet-store",
        "postgres://[bad",
        "--snapshots",
        &shelf,
    ]);
    assert!(err.contains("--fleet-store \"postgres://[bad\""), "{err}");
    let unreachable = "host=127.0.0.1 port=1 user=x dbname=y";
    let err = refused(&[
        "--fleet",
        "--fleet-store",
        unreachable,
        "--snapshots",
        &shelf,
    ]);
    assert!(err.contains("--fleet-store: "), "{err}");
    let err = refused(&[
        "--fleet",
        "--fleet-store",
        unreachable,
        "--fleet-store-ca",
        "/nonexistent/ca.pem",
        "--snapshots",
        &shelf,
    ]);
    assert!(
        err.contains("--fleet-store-ca /nonexistent/ca.pem"),
        "{err}"
    );
}

/// Two connects of one paused sandbox, through two replicas at once, five rounds: one replica
/// takes it (the table's lock) and answers 201, the other's connect is answered 200 from there
/// (forwarded, before or after losing the race); it then runs on one replica, which both name,
/// with its file, and the root holds one workspace of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_racing_through_two_replicas_resume_a_sandbox_once() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (replica(root.path()), replica(root.path()));
    let c = Client::new();
    let id = create(&c, &a).await;
    let token = details(&c, &a, &id).await["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let up = c
        .post(format!("{}/files?path=/home/user/kept.txt", a.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body("kept")
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), StatusCode::OK);
    for round in 0..5 {
        let paused = c
            .post(format!("{}/sandboxes/{id}/pause", b.url))
            .header("x-api-key", KEY_A)
            .send()
            .await
            .unwrap();
        assert_eq!(paused.status(), StatusCode::NO_CONTENT, "round {round}");
        let connect = |s: &Server| {
            let (c, url, id) = (c.clone(), s.url.clone(), id.clone());
            async move {
                c.post(format!("{url}/sandboxes/{id}/connect"))
                    .header("x-api-key", KEY_A)
                    .json(&json!({"timeout": 120}))
                    .send()
                    .await
                    .unwrap()
                    .status()
            }
        };
        let (ra, rb) = tokio::join!(connect(&a), connect(&b));
        // One resumed it (201), the other found it running (200), its request sent there.
        let mut got = [ra, rb];
        got.sort();
        assert_eq!(
            got,
            [StatusCode::OK, StatusCode::CREATED],
            "round {round}: {ra} {rb}"
        );
        // Both name one replica, and the sandbox answers with its file through both.
        let record: Value = serde_json::from_slice(
            &std::fs::read(
                root.path()
                    .join(format!(".sandkeeperd/sandboxes/{id}.json")),
            )
            .unwrap(),
        )
        .unwrap();
        let runs_on = record["runs_on"]["url"].as_str().unwrap().to_string();
        assert!(runs_on == a.url || runs_on == b.url, "{record}");
        for s in [&a, &b] {
            assert_eq!(
                details(&c, s, &id).await["state"],
                "running",
                "round {round}"
            );
            let read = c
                .get(format!("{}/files?path=/home/user/kept.txt", s.url))
                .header("e2b-sandbox-id", &id)
                .header("x-access-token", &token)
                .send()
                .await
                .unwrap();
            assert_eq!(read.status(), StatusCode::OK, "round {round}");
            assert_eq!(read.text().await.unwrap(), "kept", "round {round}");
        }
        // One workspace of it on the root: the sandboxes' directories, not counting the
        // bookkeeping (and the snapshots, which the resume consumed).
        let workspaces: Vec<_> = left_on_disk(root.path())
            .into_iter()
            .filter(|n| n.starts_with("sbx-"))
            .collect();
        assert_eq!(workspaces.len(), 1, "round {round}: {workspaces:?}");
    }
}

/// A signed `/files` URL (the SDKs' `upload_url()` and `download_url()`) names no sandbox:
/// any replica answers it, sending it to the replica that runs the sandbox whose access token
/// made the signature. A signature no sandbox made, or made for the other operation, is 401
/// through either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_url_is_answered_through_any_replica() {
    use sandkeeperd::envd::signed::{signature, Operation};
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (replica(root.path()), replica(root.path()));
    let c = Client::new();
    let (id, token) = create_sandbox(&c, &a.url, KEY_A, json!({"timeout": 120})).await;
    let path = "/home/user/signed.txt";
    let signed = |op, sig: Option<String>| {
        let sig = sig.unwrap_or_else(|| signature(path, op, "user", &token, None));
        [
            ("path", path.to_string()),
            ("username", "user".to_string()),
            ("signature", sig),
        ]
    };
    let r = c
        .post(format!("{}/files", b.url))
        .query(&signed(Operation::Write, None))
        .header("content-type", "application/octet-stream")
        .body("written through b, signed")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    for s in [&a, &b] {
        let r = c
            .get(format!("{}/files", s.url))
            .query(&signed(Operation::Read, None))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.text().await.unwrap(), "written through b, signed");
    }
    // The read signature for a write, a forged one: refused through both.
    let read_sig = signature(path, Operation::Read, "user", &token, None);
    let forged = signature(path, Operation::Read, "user", &"0".repeat(64), None);
    for s in [&a, &b] {
        let r = c
            .post(format!("{}/files", s.url))
            .query(&signed(Operation::Write, Some(read_sig.clone())))
            .header("content-type", "application/octet-stream")
            .body("not written")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{}", s.url);
        let r = c
            .get(format!("{}/files", s.url))
            .query(&signed(Operation::Read, Some(forged.clone())))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{}", s.url);
    }
    assert_eq!(
        kill_sandbox(&c, &b.url, &id, KEY_A).await,
        StatusCode::NO_CONTENT
    );
}

/// A create through `url` as team A: its status, and its id if it was made.
async fn try_create(c: &Client, url: &str, key: &str) -> (StatusCode, Option<String>) {
    let r = c
        .post(format!("{url}/v2/sandboxes"))
        .header("x-api-key", key)
        .json(&json!({"timeout": 120}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (status, v["sandboxID"].as_str().map(String::from))
}

/// A team's limit of running sandboxes holds across the replicas (the table counts them):
/// with a limit of three, ten creates at once spread over two replicas make at most three
/// (before: three on each replica, six), and the table lists exactly those made; with three
/// running, a create through either replica is refused (429); a paused one does not count,
/// and its connect while three others run is refused (429) and leaves it paused; another team
/// is not affected. Killed, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_limit_holds_across_the_replicas() {
    let root = tempfile::tempdir().unwrap();
    let flags = [
        "--root",
        root.path().to_str().unwrap(),
        "--fleet",
        "--sandboxes-per-team",
        "3",
    ];
    let (a, b) = (Server::start_on(&flags), Server::start_on(&flags));
    let c = Client::new();
    let creates = (0..10).map(|i| {
        let url = if i % 2 == 0 { &a.url } else { &b.url };
        try_create(&c, url, KEY_A)
    });
    let answers = futures_util::future::join_all(creates).await;
    let mut made: Vec<String> = answers.iter().filter_map(|(_, id)| id.clone()).collect();
    assert!(
        answers
            .iter()
            .all(|(s, _)| *s == StatusCode::CREATED || *s == StatusCode::TOO_MANY_REQUESTS),
        "{answers:?}"
    );
    assert!(made.len() <= 3, "made past the limit: {answers:?}");
    // Two creates racing for the last place may both be refused: filled up one at a time.
    for url in [&a.url, &b.url, &a.url].iter().cycle().take(3) {
        if made.len() < 3 {
            let (status, id) = try_create(&c, url, KEY_A).await;
            assert_eq!(status, StatusCode::CREATED, "{made:?}");
            made.push(id.unwrap());
        }
    }
    let listed = |url: String| {
        let c = c.clone();
        async move {
            let v: Value = c
                .get(format!("{url}/v2/sandboxes"))
                .header("x-api-key", KEY_A)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let mut ids: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["sandboxID"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    made.sort();
    assert_eq!(listed(a.url.clone()).await, made, "what a lists");
    for url in [&a.url, &b.url] {
        assert_eq!(
            try_create(&c, url, KEY_A).await.0,
            StatusCode::TOO_MANY_REQUESTS,
            "a fourth through {url}"
        );
    }
    // A paused one does not count; its connect while three others run is refused.
    let r = c
        .post(format!("{}/sandboxes/{}/pause", b.url, made[0]))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, fourth) = try_create(&c, &a.url, KEY_A).await;
    assert_eq!(status, StatusCode::CREATED);
    for url in [&a.url, &b.url] {
        let r = c
            .post(format!("{url}/sandboxes/{}/connect", made[0]))
            .header("x-api-key", KEY_A)
            .json(&json!({"timeout": 60}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "connect via {url}"
        );
        assert_eq!(details(&c, &b, &made[0]).await["state"], "paused");
    }
    assert_eq!(
        try_create(&c, &b.url, KEY_B).await.0,
        StatusCode::CREATED,
        "another team"
    );
    made.push(fourth.unwrap());
    for id in &made {
        assert_eq!(
            kill_sandbox(&c, &a.url, id, KEY_A).await,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(listed(b.url.clone()).await, Vec::<String>::new());
}
