//! Fleet mode on the local backend: two keepers (two processes of one fleet, here in one test
//! process on tokio's paused clock) over one root directory, each with its own backend and its
//! own handle on the one store under `<root>/.fleet`. A session's next call lands on the other
//! keeper; the key is handed over with its warm sandbox, which the new owner adopts.
#![cfg(not(loom))]

use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Config, Fleet, PathName, ReleasePolicy, SandboxId, SandboxState, Scope,
    SessionId, Snapshot,
};
use sandkeeper_tokio::local::meta::{record_sandbox, record_snapshot, SnapshotRecord, StartedFor};
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{FaultBackend, Keeper, KeeperConfig, KeeperError, LocalBackend};

/// What the keeper records of a sandbox of `key` (a session) it started, resuming `from`.
fn started_for(sandbox: SandboxId, key: &str, from: Option<&str>) -> StartedFor {
    StartedFor {
        sandbox: sandbox.0,
        key: format!("session:{key}"),
        spec: Some(String::new()),
        resumed_from: from.map(str::to_string),
    }
}

fn root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("sk-fleet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn fleet_config(release: ReleasePolicy) -> KeeperConfig {
    KeeperConfig::with_core(Config {
        scope: Scope::Session,
        release,
        fleet: Some(Fleet::default()),
        ..Config::default()
    })
}

fn call(name: &str, session: &str) -> CallSpec {
    CallSpec::new(CallId::new(name).unwrap(), SessionId::new(session).unwrap())
}

async fn keeper(root: &std::path::Path, release: ReleasePolicy) -> Keeper<LocalBackend> {
    let backend = LocalBackend::new(LocalConfig::new(root)).unwrap();
    let store = LocalStore::open(root, Fleet::default().lease).unwrap();
    Keeper::fleet(fleet_config(release), backend, store)
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_session_moves_to_another_keeper_with_its_warm_sandbox() {
    let root = root("handoff");
    let warm = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(600),
    };
    let a = keeper(&root, warm).await;
    let b = keeper(&root, warm).await;
    let session = SessionId::new("s1").unwrap();
    let log = PathName::session_log();

    // The first call is A's: A claims the key and starts the sandbox.
    let first = a.acquire(call("c1", "s1")).await.unwrap();
    let sandbox = first.sandbox();
    a.flush(&session, &log, b"turn 1\n".to_vec()).unwrap();
    first.release().await;
    assert_eq!(a.sandbox_state(sandbox), Some(SandboxState::Idle));
    let file = a.backend().session_file(sandbox, &session, &log);
    assert_eq!(std::fs::read(&file).unwrap(), b"turn 1\n");

    // The next call lands on B: B's want reaches A at A's next renewal, A drains and hands the
    // warm sandbox over, B adopts it. Same sandbox, same workspace, no second start.
    let second = b.acquire(call("c2", "s1")).await.unwrap();
    assert_eq!(second.sandbox(), sandbox, "B adopted A's warm sandbox");
    assert_eq!(a.sandbox_state(sandbox), None, "A forgot the sandbox");
    assert_eq!(std::fs::read(&file).unwrap(), b"turn 1\n");
    b.flush(&session, &log, b"turn 1\nturn 2\n".to_vec())
        .unwrap();
    second.release().await;
    assert_eq!(std::fs::read(&file).unwrap(), b"turn 1\nturn 2\n");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.handovers, sb.adoptions_ordered),
        (1, 1),
        "{sa:?} {sb:?}"
    );
    assert_eq!(sb.starts_ordered, 0, "B started nothing: {sb:?}");

    // And back to A, which adopts it in turn.
    let third = a.acquire(call("c3", "s1")).await.unwrap();
    assert_eq!(third.sandbox(), sandbox);
    third.release().await;

    // Closing both releases the key; the sandbox is shut down by its last owner.
    let report_b = b.close(Duration::from_secs(10)).await;
    let report_a = a.close(Duration::from_secs(10)).await;
    for report in [&report_a, &report_b] {
        assert!(
            report.revoked_calls.is_empty()
                && report.dropped_versions.is_empty()
                && report.unconfirmed.is_empty(),
            "{report:?}"
        );
    }
    assert_eq!(report_a.shut_down + report_b.shut_down, 1);
    assert!(!a.backend().sandbox_dir(sandbox).exists());
    let store = LocalStore::open(&root, Fleet::default().lease).unwrap();
    let entries = store.entries().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].owner, None, "{entries:?}");
    assert!(a.check_invariants().is_ok() && b.check_invariants().is_ok());
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn fleet_mode_is_refused_without_a_store_or_on_a_backend_without_fencing() {
    let config = fleet_config(ReleasePolicy::Shutdown);
    // A keeper without a store would lose its lease and fence every key: refused.
    let e = Keeper::new(config.clone(), FaultBackend::reliable()).err();
    assert!(
        matches!(&e, Some(KeeperError::Unsupported(why)) if why.contains("Keeper::fleet")),
        "{e:?}"
    );
    let root = root("refused");
    let store = LocalStore::open(&root, Fleet::default().lease).unwrap();
    // A backend that checks no token cannot be shared by a fleet.
    let e = Keeper::fleet(config, FaultBackend::reliable(), store.clone())
        .await
        .err();
    assert!(
        matches!(&e, Some(KeeperError::Unsupported(why)) if why.contains("FaultBackend")),
        "{e:?}"
    );
    // Keeper::fleet without the lease timing.
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let e = Keeper::fleet(KeeperConfig::default(), backend, store)
        .await
        .err();
    assert!(
        matches!(&e, Some(KeeperError::Unsupported(why)) if why.contains("config.core.fleet")),
        "{e:?}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// A keeper that crashes (dropped without close: no more renewals, nothing released) while it
/// owns a session: the key's record, written while it owned the key, lets the next keeper
/// continue once the crashed one's lease has expired. A warm sandbox is adopted; a suspended
/// one is resumed from its snapshot. Either way the session's workspace survives the crash.
#[tokio::test(start_paused = true)]
async fn a_crashed_keeper_s_sessions_continue_on_another_from_their_records() {
    let root = root("crash");
    let warm = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(600),
    };
    let a = keeper(&root, warm).await;
    let log = PathName::session_log();
    // s2's sandbox goes down and keeps its workspace as a snapshot; then s1's stays warm.
    let snapshot_of_s2 = {
        let s2 = SessionId::new("s2").unwrap();
        let guard = a.acquire(call("c2", "s2")).await.unwrap();
        let sandbox = guard.sandbox();
        guard
            .work()
            .write("notes.txt", b"s2 notes".to_vec())
            .await
            .unwrap();
        a.flush(&s2, &log, b"s2 turn 1\n".to_vec()).unwrap();
        guard.release().await;
        // Idle past the warm tier: down, with a snapshot (the backend keeps snapshots).
        tokio::time::sleep(Duration::from_secs(601)).await;
        assert_eq!(a.sandbox_state(sandbox), None);
        sandbox
    };
    let s1 = SessionId::new("s1").unwrap();
    let first = a.acquire(call("c1", "s1")).await.unwrap();
    let warm_sandbox = first.sandbox();
    a.flush(&s1, &log, b"s1 turn 1\n".to_vec()).unwrap();
    first.release().await;
    let before = a.stats();
    assert!(before.records_ok >= 2, "{before:?}");
    // What the crash leaves that no record names (a start that never finished, say): the next
    // keeper's sweep removes it once the crashed one's lease is over (and a lease more).
    let orphan_id = SandboxId((warm_sandbox.0 >> 32) << 32 | 99);
    let orphan = root.join(format!("sbx-{}", orphan_id.0));
    record_sandbox(&root, orphan_id, &started_for(orphan_id, "gone", None)).unwrap();
    std::fs::create_dir_all(&orphan).unwrap();
    // The crash: no close, no release, no more renewals.
    drop(a);

    let b = keeper(&root, warm).await;
    let started = tokio::time::Instant::now();
    let second = b.acquire(call("c3", "s1")).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "the crashed keeper's lease had to expire first ({waited:?})"
    );
    assert_eq!(second.sandbox(), warm_sandbox, "adopted, not started again");
    let file = b.backend().session_file(warm_sandbox, &s1, &log);
    assert_eq!(std::fs::read(&file).unwrap(), b"s1 turn 1\n");
    second.release().await;

    let third = b.acquire(call("c4", "s2")).await.unwrap();
    assert_ne!(third.sandbox(), snapshot_of_s2);
    let notes = b.backend().sandbox_dir(third.sandbox()).join("notes.txt");
    assert_eq!(
        std::fs::read(&notes).unwrap(),
        b"s2 notes",
        "resumed from the snapshot"
    );
    third.release().await;
    let stats = b.stats();
    assert_eq!(
        (stats.adoptions_ordered, stats.starts_ordered),
        (1, 1),
        "{stats:?}"
    );
    // B sweeps every minute: the orphan goes; what the records named was continued, not swept.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(!orphan.exists(), "swept: {}", orphan.display());
    assert_eq!(b.swept().sandboxes, 1, "{:?}", b.swept());
    assert!(b.backend().sandbox_dir(warm_sandbox).exists());
    b.close(Duration::from_secs(10)).await;
    std::fs::remove_dir_all(&root).unwrap();
}

/// The fleet sweep of a local root, object by object: what a live process holds, what a key's
/// record names (until the record's retention), and a snapshot within its own expiry stay;
/// what a dead process left that nothing names goes, and a record whose snapshot's retention
/// ended no longer names it.
#[test]
fn the_fleet_sweep_removes_only_what_nothing_live_or_recorded_needs() {
    use sandkeeper::{Key, Token};
    use sandkeeper_tokio::store::Swept;
    use sandkeeper_tokio::store::{Claim, StoredRecord, StoredSnapshot};
    use std::time::{SystemTime, UNIX_EPOCH};

    let root = root("sweep");
    let store = LocalStore::open(&root, Duration::from_secs(10)).unwrap();
    let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let now = t0 + Duration::from_secs(100);
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let dead = store.register().unwrap();
    store.renew(dead, 1, t0).unwrap();
    let live = store.register().unwrap();
    store.renew(live, 1, now).unwrap();
    let key = |s: &str| Key::Session(SessionId::new(s).unwrap());
    let id = |inc: u32, n: u64| SandboxId(u64::from(inc) << 32 | n);
    // The keeper's record first, then the directory, as the backend makes them.
    let make_from = |dir: PathBuf, key: &str, expires: Option<SystemTime>, from: Option<&str>| {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let rest = name.strip_prefix("sbx-").unwrap();
        let by = SandboxId(rest.split('-').next().unwrap().parse().unwrap());
        let started = started_for(by, key, from);
        if dir.parent().unwrap().ends_with(".snapshots") {
            let record = SnapshotRecord {
                taken_from: started,
                persisted: true,
                expires: expires.map(|at| at.duration_since(UNIX_EPOCH).unwrap().as_secs()),
            };
            record_snapshot(&root, &Snapshot::new(name), &record).unwrap();
        } else {
            record_sandbox(&root, by, &started).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
    };
    let make =
        |dir: PathBuf, key: &str, expires: Option<SystemTime>| make_from(dir, key, expires, None);
    let sandbox = |x: SandboxId| root.join(format!("sbx-{}", x.0));
    let snapshot = |x: SandboxId| root.join(".snapshots").join(format!("sbx-{}-old", x.0));
    // The dead process owned `a` and `h`, `i`; it released them with their records.
    let release = |k: &str, record: StoredRecord| {
        let Claim::Claimed(token, _) = store.claim(&key(k), dead, 1, t0).unwrap() else {
            panic!("claimed")
        };
        assert!(store.release(&key(k), dead, token, record, t0).unwrap());
    };
    let recorded = |x: SandboxId, until: SystemTime| StoredRecord {
        snapshot: Some(StoredSnapshot {
            snapshot: Snapshot::new(format!("sbx-{}-old", x.0)),
            by: x,
            retain_until_ms: Some(ms(until)),
        }),
        warm: None,
    };
    make(sandbox(id(dead, 1)), "a", None);
    release(
        "a",
        StoredRecord {
            snapshot: None,
            warm: Some(id(dead, 1)),
        },
    );
    make(sandbox(id(dead, 2)), "b", None); // nothing names it: swept
    make(sandbox(id(live, 1)), "c", None); // its maker lives
    make(sandbox(id(dead, 3)), "e", None); // its key's owner lives
    assert!(matches!(
        store.claim(&key("e"), live, 1, now).unwrap(),
        Claim::Claimed(Token(_), _)
    ));
    make(
        snapshot(id(dead, 4)),
        "f",
        Some(now + Duration::from_secs(100)),
    ); // within its expiry
    make(snapshot(id(dead, 5)), "g", None); // no record, no expiry: swept
    make(snapshot(id(dead, 6)), "h", None);
    // Its retention ended (the sweep judges a lease, 10 s, later than a claim would).
    release("h", recorded(id(dead, 6), now - Duration::from_secs(11)));
    // Within a lease of its retention's end: kept, for a sweeper whose clock runs ahead.
    make(snapshot(id(dead, 8)), "j", None);
    release("j", recorded(id(dead, 8), now - Duration::from_secs(5)));
    make(snapshot(id(dead, 7)), "i", None);
    release("i", recorded(id(dead, 7), now + Duration::from_secs(3_600)));
    // A single keeper's (incarnation 0).
    make(root.join("sbx-5"), "z", None);
    // Started from `i`'s recorded snapshot by an owner that crashed before the record named
    // it: kept for the key's next start. One started from a snapshot no record names goes.
    make_from(
        sandbox(id(dead, 10)),
        "i",
        None,
        Some(&format!("sbx-{}-old", id(dead, 7).0)),
    );
    make_from(sandbox(id(dead, 11)), "i", None, Some("sbx-1-gone"));
    // Made by the sandbox `k`'s record names: its owner stopped it and crashed before
    // recording the stop; the next owner's adoption takes it back.
    make(snapshot(id(dead, 9)), "k", None);
    release(
        "k",
        StoredRecord {
            snapshot: None,
            warm: Some(id(dead, 9)),
        },
    );

    let swept = store.sweep(now).unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 2,
            snapshots: 2,
            unrecorded: 1
        }
    );
    let gone = [
        sandbox(id(dead, 2)),
        sandbox(id(dead, 11)),
        snapshot(id(dead, 5)),
        snapshot(id(dead, 6)),
    ];
    for path in &gone {
        assert!(!path.exists(), "{} should be swept", path.display());
        // Its record with it.
        let name = path.file_name().unwrap().to_string_lossy();
        let kind = if name.matches('-').count() > 1 {
            "snapshots"
        } else {
            "sandboxes"
        };
        let record = root.join(".meta").join(kind).join(format!("{name}.json"));
        assert!(!record.exists(), "{} should be gone", record.display());
    }
    let kept = [
        sandbox(id(dead, 1)),
        sandbox(id(live, 1)),
        sandbox(id(dead, 3)),
        snapshot(id(dead, 4)),
        snapshot(id(dead, 7)),
        snapshot(id(dead, 8)),
        snapshot(id(dead, 9)),
        sandbox(id(dead, 10)),
        root.join("sbx-5"),
    ];
    for path in &kept {
        assert!(path.exists(), "{} should be kept", path.display());
    }
    let entries = store.entries().unwrap();
    let record = |k: &str| {
        entries
            .iter()
            .find(|e| e.key == format!("session:{k}"))
            .unwrap()
            .record
            .clone()
    };
    assert_eq!(
        record("h").snapshot,
        None,
        "no record names a swept snapshot"
    );
    assert!(record("i").snapshot.is_some());
    assert_eq!(record("a").warm, Some(id(dead, 1)));
    // Sweeping again removes nothing more; an hour on (and a lease), `i`'s retention ended
    // too, and `f`'s own expiry.
    assert_eq!(store.sweep(now).unwrap(), Swept::default());
    let later = store.sweep(now + Duration::from_secs(3_611)).unwrap();
    assert_eq!((later.snapshots, later.unrecorded), (3, 2), "{later:?}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The local store keeps the contract every fleet store keeps (the checks the Kubernetes store
/// runs too, against the loopback API).
#[tokio::test]
async fn the_local_store_keeps_the_fleet_store_contract() {
    let root = root("contract");
    let store = LocalStore::open(&root, Duration::from_secs(10)).unwrap();
    sandkeeper_tokio::store::contract::check_all(&store, Duration::from_secs(10))
        .await
        .unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Hooks in fleet mode: the after-start hook runs where the sandbox starts, not again where it
/// is adopted (its first owner ran it); a fleet configuration with hook timeouts and no hooks
/// is refused, as a single keeper's is.
#[tokio::test(start_paused = true)]
async fn a_fleet_keeper_runs_hooks_once_per_sandbox_and_refuses_timeouts_without_them() {
    use sandkeeper::{HookPoint, Hooks};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    let root = root("hooks");
    let mut config = fleet_config(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(600),
    });
    config.core.hooks = Hooks {
        after_start: Some(Duration::from_secs(5)),
        ..Hooks::default()
    };
    let store = || LocalStore::open(&root, Fleet::default().lease).unwrap();
    let backend = || LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let refused = Keeper::fleet(config.clone(), backend(), store())
        .await
        .err();
    assert!(
        matches!(&refused, Some(KeeperError::Unsupported(why)) if why.contains("hook")),
        "{refused:?}"
    );
    let ran = Arc::new(AtomicU32::new(0));
    let keeper = |ran: Arc<AtomicU32>| {
        Keeper::fleet_with_hooks(config.clone(), backend(), store(), move |point, work| {
            let ran = ran.clone();
            async move {
                assert_eq!(point, HookPoint::AfterStart);
                ran.fetch_add(1, Ordering::SeqCst);
                work.write("hooked.txt", b"yes".to_vec())
                    .await
                    .map_err(|e| e.to_string())
            }
        })
    };
    let a = keeper(ran.clone()).await.unwrap();
    let b = keeper(ran.clone()).await.unwrap();
    let first = a.acquire(call("c1", "s1")).await.unwrap();
    let sandbox = first.sandbox();
    first.release().await;
    let second = b.acquire(call("c2", "s1")).await.unwrap();
    assert_eq!(second.sandbox(), sandbox, "adopted");
    assert_eq!(second.work().read("hooked.txt").await.unwrap(), b"yes");
    second.release().await;
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the hook ran once, where the sandbox started"
    );
    b.close(Duration::from_secs(10)).await;
    a.close(Duration::from_secs(10)).await;
    std::fs::remove_dir_all(&root).unwrap();
}
