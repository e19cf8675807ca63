//! Replicas on hosts of their own: two `sandkeeperd --fleet --fleet-store --snapshots`, each on
//! its own root, sharing a throwaway PostgreSQL (the fleet store and the sandbox table) and a
//! moto bucket (the shelf), all started here and stopped after. The unmodified Python SDK
//! makes a sandbox on one host and uses it through the other, pauses it through the other and
//! resumes it there (its workspace goes through the shelf), and kills it through the first
//! (`py/e2b_replicas.py`, as between replicas on one root). Then, against the binaries: a
//! rolling restart of a host pauses its sandbox onto the shelf, and the first envd request
//! through the other host resumes it there with its files; a host killed with SIGKILL is
//! answered 502 (naming it) while its lease lives; once it lapsed its sandbox shows paused,
//! a connect through the other host is refused (503: the workspace is on the dead host's disk
//! alone) and changes nothing, and the host restarted on its root continues it with the file
//! an upload was answered 200 for before the crash. Killed, nothing is left on either root.
//!
//! Real processes on the wall clock (a lease is 15 s): the waits are bounded polls.
// Real processes on the wall clock: a poll's bound is wall time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::hosts::Services;
use common::{
    create_sandbox, download, get_sandbox, kill_sandbox, left_on_disk, replicas_script, upload,
    Server, KEY_A,
};
use reqwest::{Client, StatusCode};
use sandkeeper_pg::throwaway::Throwaway;
use serde_json::{json, Value};

async fn details(c: &Client, s: &Server, id: &str) -> Value {
    let (status, body) = get_sandbox(c, &s.url, id, KEY_A).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn connect(c: &Client, s: &Server, id: &str) -> (StatusCode, String) {
    let r = c
        .post(format!("{}/sandboxes/{id}/connect", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"timeout": 120}))
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

/// The sandboxes' workspaces and kept snapshots under a host's `root` (its stores aside).
fn workspaces(root: &std::path::Path) -> Vec<String> {
    left_on_disk(root)
        .into_iter()
        .filter(|e| e != ".fleet" && e != ".sandkeeperd")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_move_between_hosts_through_the_shelf_and_wait_for_a_dead_host() {
    let shared = Services::start("hosts");
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, b) = (shared.host(root_a.path()), shared.host(root_b.path()));

    let left = replicas_script(240, &a.url, &b.url).await;
    let c = Client::new();
    let token = details(&c, &b, &left).await["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();

    // A rolling restart of a: its SIGTERM pauses the sandbox it runs (onto the shelf), and
    // the first envd request through b resumes it on b, its file there.
    assert!(a.terminate(60).is_some_and(|s| s.success()), "a's SIGTERM");
    let shelf = shared.shelf_store();
    let paused = shelf.list().await.unwrap();
    assert!(!paused.is_empty(), "a's SIGTERM put nothing on the shelf");
    let (status, bytes) = download(&c, &b.url, &left, &token, "/home/user/d.txt").await;
    assert_eq!(
        (status, bytes.as_slice()),
        (StatusCode::OK, &b"made on b"[..])
    );
    assert_eq!(details(&c, &b, &left).await["state"], "running");

    // a comes back; b dies with the sandbox on it, after an upload through a was answered 200.
    let a = shared.host(root_a.path());
    assert_eq!(
        upload(
            &c,
            &a.url,
            &left,
            &token,
            "/home/user/acked.bin",
            vec![7u8; 100_000]
        )
        .await,
        StatusCode::OK
    );
    // A second sandbox on b, to be killed while b is down.
    let (doomed, _) = create_sandbox(&c, &b.url, KEY_A, json!({"timeout": 300})).await;
    let mut b = b;
    let b_url = b.url.clone();
    b.kill9();
    let (status, body) = get_sandbox(&c, &a.url, &left, KEY_A).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains(&b_url), "{body}");
    // A bounded poll: b's lease (15 s) lapses on the wall clock.
    let mut paused = false;
    for _ in 0..80 {
        let (status, body) = get_sandbox(&c, &a.url, &left, KEY_A).await;
        if status == StatusCode::OK && body.contains("\"paused\"") {
            paused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(paused, "a never took the dead host's sandbox for paused");
    // Its workspace is on b's disk alone: a cannot resume it, and says so; nothing changes.
    let (status, body) = connect(&c, &a, &left).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(details(&c, &a, &left).await["state"], "paused");
    // A kill of the other through a is answered, and it is gone from the API at once; its
    // workspace, out of a's reach, is deleted once b is back (checked at the end).
    assert_eq!(
        kill_sandbox(&c, &a.url, &doomed, KEY_A).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        get_sandbox(&c, &a.url, &doomed, KEY_A).await.0,
        StatusCode::NOT_FOUND
    );

    // b comes back on its root and continues it, the acknowledged upload whole.
    let b = shared.host(root_b.path());
    let (status, body) = connect(&c, &b, &left).await;
    assert!(
        status.is_success(),
        "connect through the restarted b: {status} {body}"
    );
    let (status, bytes) = download(&c, &a.url, &left, &token, "/home/user/acked.bin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bytes, vec![7u8; 100_000], "the acknowledged upload");
    let (status, bytes) = download(&c, &a.url, &left, &token, "/home/user/d.txt").await;
    assert_eq!(
        (status, bytes.as_slice()),
        (StatusCode::OK, &b"made on b"[..])
    );

    // Killed through a: gone everywhere, nothing left on either root.
    assert_eq!(
        kill_sandbox(&c, &a.url, &left, KEY_A).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        get_sandbox(&c, &b.url, &left, KEY_A).await.0,
        StatusCode::NOT_FOUND
    );
    let listed = c
        .get(format!("{}/v2/sandboxes", b.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(listed.trim(), "[]", "listed after every kill");
    // A host keeps its own copy of each snapshot it put on the shelf until its fleet sweep
    // finds no key needs it, and the shelf's copies go by the sweeps too (docs/fleet-hosts.md):
    // a bounded poll of the sweeps' work.
    let began = std::time::Instant::now();
    loop {
        let on_shelf = shelf.list().await.unwrap();
        let (on_a, on_b) = (workspaces(root_a.path()), workspaces(root_b.path()));
        if on_a.is_empty() && on_b.is_empty() && on_shelf.is_empty() {
            break;
        }
        let names: Vec<_> = on_shelf.iter().map(|(n, _)| n.to_string()).collect();
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "left after every kill: on a {on_a:?}, on b {on_b:?}, on the shelf {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let table = shared.admin().await;
    let rows = table
        .query("SELECT id FROM sandkeeperd.sandbox", &[])
        .await
        .unwrap();
    assert!(rows.is_empty(), "records left in the table: {}", rows.len());
    let (mut a, mut b) = (a, b);
    assert!(a.terminate(60).is_some_and(|s| s.success()));
    assert!(b.terminate(60).is_some_and(|s| s.success()));
    assert_eq!(
        workspaces(root_a.path()),
        Vec::<String>::new(),
        "on a's root"
    );
    assert_eq!(
        workspaces(root_b.path()),
        Vec::<String>::new(),
        "on b's root"
    );
}

/// The sandbox table in PostgreSQL on its own: a change is a compare-and-set, so two hosts
/// (two connections) changing one record at once lose no change; ids that are not a
/// sandbox's are refused, a row that is not a record is skipped, and a team's running
/// sandboxes are counted by the records that name a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_table_loses_no_concurrent_change() {
    use sandkeeperd::durable::Record;
    use sandkeeperd::table::Change;
    use sandkeeperd::table_pg::PgTable;

    let pg = Throwaway::start().expect("a throwaway PostgreSQL");
    let off = sandkeeper_pg::StoreTls::Off;
    let a = PgTable::connect(&pg.config(), off.clone()).await.unwrap();
    let b = PgTable::connect(&pg.config(), off).await.unwrap();
    const ID: &str = "sbx0123456789abcdef0123";
    let record = common::paused_record(ID);
    a.put(&record).await.unwrap();
    let bump = |table: PgTable| async move {
        for _ in 0..100 {
            table
                .change(ID, |now| {
                    let mut now = now.expect("the record");
                    now.end_ms += 1;
                    (Change::Put(Box::new(now)), ())
                })
                .await
                .unwrap();
        }
    };
    tokio::join!(bump(a.clone()), bump(b.clone()));
    assert_eq!(
        b.get(ID).await.unwrap().unwrap().end_ms,
        200,
        "a change lost"
    );

    for bad in ["../etc", "sbx", "SBX0123456789ABCDEF0123", ""] {
        let e = a.get(bad).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad}: {e}");
        let e = a
            .put(&Record {
                id: bad.into(),
                ..record.clone()
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad}: {e}");
    }
    let (admin, connection) = pg.config().connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    admin
        .execute(
            "INSERT INTO sandkeeperd.sandbox VALUES ('sbxffffffffffffffffffff', '{\"id\": 1}')",
            &[],
        )
        .await
        .unwrap();
    let loaded: Vec<_> = a.load().await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(loaded, vec![ID.to_string()], "a row that is not a record");

    // A team's running sandboxes, as its limit counts them: those that name a replica.
    let replica = sandkeeperd::durable::Replica {
        incarnation: 1,
        url: "http://127.0.0.1:1".into(),
        host: Some("h".into()),
    };
    for (id, team, runs_on) in [
        ("sbx00000000000000000001", "team-a", Some(replica.clone())),
        ("sbx00000000000000000002", "team-a", Some(replica.clone())),
        ("sbx00000000000000000003", "team-b", Some(replica.clone())),
    ] {
        a.put(&Record {
            id: id.into(),
            team: team.into(),
            runs_on,
            ..record.clone()
        })
        .await
        .unwrap();
    }
    assert_eq!(
        a.running("team-a").await.unwrap(),
        2,
        "the paused one not counted"
    );
    assert_eq!(b.running("team-b").await.unwrap(), 1);
    assert_eq!(b.running("team-c").await.unwrap(), 0);
    for id in [
        "sbx00000000000000000001",
        "sbx00000000000000000002",
        "sbx00000000000000000003",
    ] {
        a.change(id, |_| (Change::Remove, ())).await.unwrap();
    }
    assert!(a.get("sbxffffffffffffffffffff").await.is_err());
    a.change(ID, |_| (Change::Remove, ())).await.unwrap();
    assert_eq!(b.get(ID).await.unwrap(), None);
}
