//! Fleet mode's sweep on Kubernetes (`K8sStore::sweep`), against the loopback API: what a live
//! process made, what a live owner's key holds and what a record names stay; what a dead
//! process left that nothing names goes; a claim a record names as its snapshot goes when the
//! record's retention ended, and the record stops naming it; a claim the controller suspended
//! for inactivity is judged as one its keeper suspended.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use k8s_loopback::resources::{PODS, SANDBOX_CLAIMS};
use sandkeeper::{Key, SandboxId, SessionId, Snapshot, Spec, Token};
use sandkeeper_k8s::K8sStore;
use sandkeeper_tokio::store::Swept;
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

/// A claim the controller suspended for inactivity (its pod deleted, `operatingMode` left
/// `Running`) is judged as a claim its keeper suspended (by mode, without a retention, as the
/// core suspends a sandbox whose instance was lost) is in the same place, never as a running
/// sandbox whose pod is gone. Of a dead process, with its key's owner gone too: both stay while
/// the key's record names their sandbox (warm: the next owner adopts it), however long; both
/// stay, named by nothing, until their `shutdownTime`, which the sweep reads as their
/// retention; and both go at the same sweep once it passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_controller_suspended_is_swept_as_one_its_keeper_suspended() {
    let server = server().await;
    let backend = connect(&server, claim_config("maker")).await;
    let store = K8sStore::new(
        cluster(&server, claim_config("sweeper")),
        Duration::from_secs(10),
    );
    // The wall clock, on which the backend sets a claim's `shutdownTime`.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    let t0 = now - Duration::from_secs(100);
    let dead = FleetStore::register(&store).await.unwrap();
    FleetStore::renew(&store, dead, 1, t0).await.unwrap();
    // Each key's sandbox: suspended by the controller (or by its keeper), named by the key's
    // record (or not).
    let cases = [
        ("keeper-named", false, true),
        ("controller-named", true, true),
        ("keeper-unnamed", false, false),
        ("controller-unnamed", true, false),
    ];
    let mut claims = std::collections::BTreeMap::new();
    for (n, (k, by_controller, named)) in (1..).zip(cases) {
        let x = id(dead, n);
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
        let h = backend.handle(x).unwrap();
        if named {
            let Claim::Claimed(token, _) = FleetStore::claim(&store, key(k), dead, 1, t0)
                .await
                .unwrap()
            else {
                panic!("claimed")
            };
            let warm = StoredRecord {
                snapshot: None,
                warm: Some(x),
            };
            assert!(FleetStore::release(&store, key(k), dead, token, warm, t0)
                .await
                .unwrap());
        }
        if by_controller {
            auto_suspend(&server, h.sandbox_name.as_deref().unwrap(), &h.pod).await;
        } else {
            // What a Persist that suspends does (its retention unset: the claim keeps the
            // `shutdownTime` backstop it was made with).
            backend.cluster().suspend_sandbox(&h).await.unwrap();
        }
        claims.insert(k, h.object);
    }
    let there = |k: &str| server.store().get(&SANDBOX_CLAIMS, NS, &claims[k]).is_ok();

    assert_eq!(
        FleetStore::sweep(&store, now).await.unwrap(),
        Swept::default(),
        "all four kept"
    );
    for (k, ..) in cases {
        assert!(there(k), "{k} kept");
    }
    // Past their `shutdownTime` (made a day on, `maxLifetimeSecs`; judged a lease later).
    let past = now + Duration::from_secs(24 * 3600 + 600);
    assert_eq!(
        FleetStore::sweep(&store, past).await.unwrap(),
        Swept {
            sandboxes: 0,
            snapshots: 2,
            unrecorded: 0
        },
        "the two suspended claims nothing names, as snapshots"
    );
    for (k, _, named) in cases {
        assert_eq!(there(k), named, "{k}");
    }
}
