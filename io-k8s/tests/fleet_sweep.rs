//! Fleet mode's sweep on Kubernetes (`K8sStore::sweep`), against the loopback API: what a live
//! process made, what a live owner's key holds and what a record names stay; what a dead
//! process left that nothing names goes; a claim a record names as its snapshot goes when the
//! record's retention ended, and the record stops naming it.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS};
use sandkeeper::{Key, SandboxId, SessionId, Snapshot, Spec, Token};
use sandkeeper_k8s::K8sStore;
use sandkeeper_tokio::local::store::Swept;
use sandkeeper_tokio::store::{Claim, FleetStore, StoredRecord, StoredSnapshot};
use sandkeeper_tokio::{Backend, StartRequest};

fn key(name: &str) -> Key {
    Key::Session(SessionId::new(name).unwrap())
}

fn id(inc: u32, n: u64) -> SandboxId {
    SandboxId(u64::from(inc) << 32 | n)
}

#[tokio::test]
async fn the_kubernetes_sweep_removes_only_what_nothing_live_or_recorded_needs() {
    let server = server().await;
    let backend = connect(&server, pod_config("maker")).await;
    let store = K8sStore::new(
        cluster(&server, pod_config("sweeper")),
        Duration::from_secs(10),
    );
    let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let now = t0 + Duration::from_secs(100);
    let dead = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, dead, 1, t0).await.unwrap();
    let live = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, live, 1, now).await.unwrap();
    let start = |x: SandboxId, k: &str| {
        let request = StartRequest {
            sandbox: x,
            key: key(k),
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            token: None,
        };
        let backend = &backend;
        async move { backend.start(request).await.unwrap() }
    };
    let claimed = |k: &str, inc: u32, at| {
        let store = store.clone();
        let k = key(k);
        async move {
            match FleetStore::claim(&store, k, inc, 1, at).await.unwrap() {
                Claim::Claimed(token, _) => token,
                Claim::Busy => panic!("busy"),
            }
        }
    };
    // `a`: the dead process released it, handing its pod over warm.
    start(id(dead, 1), "a").await;
    let token = claimed("a", dead, t0).await;
    let warm = StoredRecord {
        snapshot: None,
        warm: Some(id(dead, 1)),
    };
    assert!(FleetStore::release(&store, key("a"), dead, token, warm, t0)
        .await
        .unwrap());
    start(id(dead, 2), "b").await; // nothing names it: swept
    start(id(live, 1), "c").await; // its maker lives
    start(id(dead, 3), "e").await; // its key's owner lives
    claimed("e", live, now).await;
    start(SandboxId(5), "z").await; // a single keeper's (incarnation 0)

    let swept = FleetStore::sweep(&store, now).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 1,
            snapshots: 0,
            unrecorded: 0
        }
    );
    let pods = |x: SandboxId| {
        server
            .store()
            .all(&PODS)
            .into_iter()
            .filter(|p| {
                p.pointer("/metadata/labels/sandkeeper.sandbox.users.io~1sandbox")
                    .and_then(|v| v.as_str())
                    == Some(&x.0.to_string())
            })
            .count()
    };
    assert_eq!(pods(id(dead, 2)), 0, "swept");
    for x in [id(dead, 1), id(live, 1), id(dead, 3), SandboxId(5)] {
        assert_eq!(pods(x), 1, "{x} kept");
    }
    assert_eq!(
        FleetStore::sweep(&store, now).await.unwrap(),
        Swept::default()
    );
}

#[tokio::test]
async fn a_recorded_claim_goes_when_its_retention_ends_and_the_record_lets_go_of_it() {
    let server = server().await;
    let backend = connect(&server, claim_config("maker")).await;
    let store = K8sStore::new(
        cluster(&server, claim_config("sweeper")),
        Duration::from_secs(10),
    );
    let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let dead = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, dead, 1, t0).await.unwrap();
    let x = id(dead, 1);
    backend
        .start(StartRequest {
            sandbox: x,
            key: key("s"),
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            token: Some(Token(1)),
        })
        .await
        .unwrap();
    let claim = backend.handle(x).unwrap().object;
    let Claim::Claimed(token, _) = FleetStore::claim(&store, key("s"), dead, 1, t0)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let until = t0 + Duration::from_secs(60);
    let record = StoredRecord {
        snapshot: Some(StoredSnapshot {
            snapshot: Snapshot::new(claim.clone()),
            by: x,
            retain_until_ms: Some(until.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64),
        }),
        warm: None,
    };
    assert!(
        FleetStore::release(&store, key("s"), dead, token, record, t0)
            .await
            .unwrap()
    );
    // Within the retention (judged a lease, 10 s, back): kept.
    let kept = FleetStore::sweep(&store, until + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(kept, Swept::default());
    assert!(server.store().get(&SANDBOX_CLAIMS, NS, &claim).is_ok());
    let swept = FleetStore::sweep(&store, until + Duration::from_secs(11))
        .await
        .unwrap();
    assert_eq!(swept.unrecorded, 1, "{swept:?}");
    assert!(
        server.store().get(&SANDBOX_CLAIMS, NS, &claim).is_err(),
        "deleted"
    );
    let Claim::Claimed(_, record) = FleetStore::claim(&store, key("s"), dead, 1, until)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    assert_eq!(
        record,
        StoredRecord::default(),
        "the record no longer names it"
    );
}

/// The controller's own auto-suspension (its pod deleted, `operatingMode` left `Running`)
/// makes no snapshot of a claim: the sweep judges it as the sandbox it is. A claim whose
/// crashed owner's key record names it (warm) stays, however long it stays suspended (the
/// controller set no retention); one nothing names goes like any sandbox a dead process left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_controller_suspended_stays_while_its_keys_record_names_it() {
    use k8s_loopback::resources::SANDBOXES;
    let server = server().await;
    let backend = connect(&server, claim_config("maker")).await;
    let store = K8sStore::new(
        cluster(&server, claim_config("sweeper")),
        Duration::from_secs(10),
    );
    let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let dead = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, dead, 1, t0).await.unwrap();
    let (named, unnamed) = (id(dead, 1), id(dead, 2));
    let mut claims = vec![];
    for (x, k) in [(named, "w"), (unnamed, "u")] {
        backend
            .start(StartRequest {
                sandbox: x,
                key: key(k),
                spec: Spec::new(""),
                resume_from: None,
                resumes: None,
                token: Some(Token(1)),
            })
            .await
            .unwrap();
        claims.push(backend.handle(x).unwrap());
    }
    let Claim::Claimed(token, _) = FleetStore::claim(&store, key("w"), dead, 1, t0)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let warm = StoredRecord {
        snapshot: None,
        warm: Some(named),
    };
    assert!(FleetStore::release(&store, key("w"), dead, token, warm, t0)
        .await
        .unwrap());

    server.enable_auto_suspension(true);
    for h in &claims {
        let sb = h.sandbox_name.clone().unwrap();
        server
            .store()
            .modify(&SANDBOXES, NS, &sb, |s| {
                s["spec"]["autoSuspension"] = serde_json::json!({"inactivityTimeoutSeconds": 60});
            })
            .unwrap();
        until(&server, "the activity is noted", || {
            server
                .store()
                .get(&SANDBOXES, NS, &sb)
                .is_ok_and(|s| s.pointer("/status/lastActivityTime").is_some())
        })
        .await;
    }
    server.advance_clock(Duration::from_secs(61));
    until(&server, "the controller suspended both", || {
        claims
            .iter()
            .all(|h| server.store().get(&PODS, NS, &h.pod).is_err())
    })
    .await;

    let now = t0 + Duration::from_secs(100);
    let swept = FleetStore::sweep(&store, now).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 1,
            snapshots: 0,
            unrecorded: 0
        }
    );
    assert!(server
        .store()
        .get(&SANDBOX_CLAIMS, NS, &claims[0].object)
        .is_ok());
    assert!(server
        .store()
        .get(&SANDBOX_CLAIMS, NS, &claims[1].object)
        .is_err());
    let a_year_on = now + Duration::from_secs(365 * 24 * 3600);
    assert_eq!(
        FleetStore::sweep(&store, a_year_on).await.unwrap(),
        Swept::default(),
        "named by its key's record: kept"
    );
    assert!(server
        .store()
        .get(&SANDBOX_CLAIMS, NS, &claims[0].object)
        .is_ok());
}
