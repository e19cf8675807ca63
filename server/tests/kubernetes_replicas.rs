//! Replicas on Kubernetes: two `sandkeeperd --kubernetes FILE --fleet` on one namespace of the
//! loopback API server (each with its own `owner`), sharing the fleet store and the sandbox
//! table in the namespace's Leases. The unmodified Python SDK makes a sandbox on one and uses
//! it through the other, pauses it through the other and resumes it there (the key handed
//! over between the replicas' keepers: the claim adopted), and kills it through the first
//! (`py/e2b_replicas.py`, as between replicas on one root). Then a replica killed with SIGKILL
//! while it runs a sandbox: the other answers 502 naming it while its lease lives, then shows
//! the sandbox paused (interrupted), and the first envd request through it continues it there,
//! its pod adopted with an upload answered 200 before the crash. Killed, nothing of the
//! sandboxes is left in the cluster, their table Leases included.
//!
//! What the loopback does not model (io-k8s/loopback's docs): images (the argv runs on this
//! host), scheduling, and real volumes (a pod's directory stays on disk).
// Real processes on the wall clock: a poll's bound is wall time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::k8s::{cluster, config_file, NS};
use common::{download, get_sandbox, kill_sandbox, replicas_script, upload, Server, KEY_A};
use k8s_loopback::resources::{ALL, LEASES};
use k8s_loopback::Loopback;
use reqwest::{Client, StatusCode};
use sandkeeper_k8s::names::OWNER;
use serde_json::Value;

/// A replica on the loopback at `url`, with the configuration `file` (its own owner).
fn replica(file: &std::path::Path, url: &str) -> Server {
    Server::start_on(&[
        "--kubernetes",
        file.to_str().expect("a UTF-8 path"),
        "--kube-server",
        url,
        "--fleet",
    ])
}

/// The sandbox table's Leases in the namespace, by name.
fn table(cluster: &Loopback) -> Vec<String> {
    cluster
        .store()
        .all(&LEASES)
        .iter()
        .filter_map(|l| l["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("sandkeeperd-sbx"))
        .map(String::from)
        .collect()
}

/// The pods and claims either owner labelled, as `<plural>/<name>`.
fn sandboxes_of(cluster: &Loopback, owners: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for rt in ALL {
        if rt.plural != "pods" && rt.plural != "sandboxclaims" {
            continue;
        }
        for o in cluster.store().all(rt) {
            let owner = o.pointer("/metadata/labels").and_then(|l| l.get(OWNER));
            if owner
                .and_then(Value::as_str)
                .is_some_and(|w| owners.contains(&w))
            {
                let name = o["metadata"]["name"].as_str().unwrap_or("");
                out.push(format!("{}/{name}", rt.plural));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_namespace_answer_for_each_others_sandboxes() {
    let cluster = cluster().await;
    let dir = tempfile::tempdir().expect("a temporary dir");
    let (file_a, file_b) = (
        config_file(dir.path(), "replica-a", "claim"),
        config_file(dir.path(), "replica-b", "claim"),
    );
    let url = cluster.url();
    let mut a = replica(&file_a, &url);
    let b = replica(&file_b, &url);

    let left = replicas_script(240, &a.url, &b.url).await;
    assert_eq!(
        table(&cluster),
        vec![format!("sandkeeperd-{left}")],
        "the table holds the sandbox left running, and nothing of the killed"
    );

    // a dies holding the sandbox, after an upload through b was answered 200.
    let c = Client::new();
    let (status, body) = get_sandbox(&c, &b.url, &left, KEY_A).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = serde_json::from_str::<Value>(&body).unwrap()["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        upload(
            &c,
            &b.url,
            &left,
            &token,
            "/home/user/acked.bin",
            vec![5u8; 70_000]
        )
        .await,
        StatusCode::OK
    );
    let a_url = a.url.clone();
    a.kill9();
    let (status, body) = get_sandbox(&c, &b.url, &left, KEY_A).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains(&a_url), "{body}");
    // A bounded poll: a's lease (15 s) lapses on the wall clock.
    let mut paused = false;
    for _ in 0..80 {
        let (status, body) = get_sandbox(&c, &b.url, &left, KEY_A).await;
        if status == StatusCode::OK && body.contains("\"paused\"") {
            paused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(paused, "b never took the dead replica's sandbox for paused");
    let (status, bytes) = download(&c, &b.url, &left, &token, "/home/user/acked.bin").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(
        bytes,
        vec![5u8; 70_000],
        "the upload answered 200 before the crash"
    );
    let (status, body) = get_sandbox(&c, &b.url, &left, KEY_A).await;
    assert!(
        status == StatusCode::OK && body.contains("\"running\""),
        "{body}"
    );

    assert_eq!(
        kill_sandbox(&c, &b.url, &left, KEY_A).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        table(&cluster),
        Vec::<String>::new(),
        "the table after the kill"
    );
    // The claims and pods of the killed sandboxes go (a pod's deletion is graceful: a bounded
    // poll).
    let began = std::time::Instant::now();
    loop {
        let left = sandboxes_of(&cluster, &["replica-a", "replica-b"]);
        let running: Vec<_> = left
            .iter()
            .filter(|o| {
                let name = o.split('/').nth(1).unwrap_or("");
                cluster
                    .store()
                    .get(
                        if o.starts_with("pods/") {
                            &k8s_loopback::resources::PODS
                        } else {
                            &k8s_loopback::resources::SANDBOX_CLAIMS
                        },
                        NS,
                        name,
                    )
                    .is_ok_and(|o| o.pointer("/metadata/deletionTimestamp").is_none())
            })
            .collect();
        if running.is_empty() {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "left after the kills: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A replica's SIGTERM with nothing running ends it cleanly.
    let mut b = b;
    let status = tokio::task::spawn_blocking(move || b.terminate(30))
        .await
        .expect("the terminate thread");
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// The sandbox table in the namespace's Leases on its own: a change is a read and a write
/// under the read's `resourceVersion`, so two replicas (two clients) changing one record at
/// once lose no change; a removal is conditional the same way; ids that are not a sandbox's
/// are refused; a table Lease that holds no record is skipped; a team's running sandboxes are
/// those whose record names a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_table_loses_no_concurrent_change() {
    use sandkeeperd::durable::{Record, Replica};
    use sandkeeperd::table::Change;
    use sandkeeperd::table_k8s::{K8sTable, L_TABLE};

    let cluster = cluster().await;
    let client = || {
        let config = kube::Config::new(cluster.url().parse().expect("the loopback's URL"));
        sandkeeper_k8s::Cluster::make_client(config).expect("a client")
    };
    let (a, b) = (K8sTable::new(client(), NS), K8sTable::new(client(), NS));
    const ID: &str = "sbx0123456789abcdef0123";
    let record = common::paused_record(ID);
    a.put(&record).await.unwrap();
    let bump = |table: K8sTable| async move {
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
    }
    cluster
        .store()
        .create(
            &LEASES,
            NS,
            serde_json::json!({"metadata": {"name": "sandkeeperd-sbxffffffffffffffffffff",
                "labels": {L_TABLE: "sandbox"}}}),
        )
        .unwrap();
    let loaded: Vec<_> = a.load().await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(loaded, vec![ID.to_string()], "a Lease that holds no record");

    let replica = Replica {
        incarnation: 1,
        url: "http://127.0.0.1:1".into(),
        host: None,
    };
    a.put(&Record {
        id: "sbx00000000000000000001".into(),
        runs_on: Some(replica),
        ..record.clone()
    })
    .await
    .unwrap();
    assert_eq!(
        a.running("team-a").await.unwrap(),
        1,
        "the paused one not counted"
    );
    assert_eq!(a.running("team-b").await.unwrap(), 0);

    // Removals racing changes: each removal happens once, on what it read.
    let (removed, changed) = tokio::join!(
        a.change(ID, |now| (Change::Remove, now.is_some())),
        b.change(ID, |now| match now {
            Some(mut r) => {
                r.end_ms += 1;
                (Change::Put(Box::new(r)), true)
            }
            None => (Change::Keep, false),
        })
    );
    assert!(removed.unwrap(), "the removal found it");
    let left = b.get(ID).await.unwrap();
    // Either the change came first and the removal removed what it wrote, or the removal
    // came first and the change found nothing: never a change written over a removal.
    assert_eq!(left, None, "changed first: {changed:?}");
}
