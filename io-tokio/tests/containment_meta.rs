//! The keeper's metadata is never a command's to forge (issue 31, item 4, its last part).
//!
//! A command may write anything in its workspace, `.sandkeeper/` included. Here the test plays
//! the command: it forges, deletes or rewrites what an older keeper kept there
//! (`.sandkeeper/sandbox.json`, `persisted`, `expires`), then lets the keeper do its own work (a
//! resume, an adoption, a Stop and Persist, the fleet sweep, the retention sweep) and checks that
//! it decided from its own records, outside every workspace (`<root>/.meta/`), and not from the
//! forgery.
//!
//! Each test is an attack that did harm before the metadata moved out of the workspace (what
//! harm is in its docs), except two, which held already and must keep holding.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{Key, SandboxId, SessionId, Snapshot, Spec, Token};
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::store::{Claim, StoredRecord, StoredSnapshot};
use sandkeeper_tokio::{
    AdoptRequest, Backend, LocalBackend, PersistRequest, StartRequest, StopRequest,
};

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sk-meta-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn key(name: &str) -> Key {
    Key::Session(SessionId::new(name).unwrap())
}

fn start(sandbox: SandboxId, key: &Key, resume_from: Option<Snapshot>) -> StartRequest {
    StartRequest {
        sandbox,
        key: key.clone(),
        spec: Spec::new(""),
        resume_from,
        resumes: None,
        token: None,
    }
}

fn stop(sandbox: SandboxId) -> StopRequest {
    StopRequest {
        sandbox,
        suspend: true,
        token: None,
    }
}

fn persist(
    sandbox: SandboxId,
    snapshot: &Snapshot,
    retain_until: Option<SystemTime>,
) -> PersistRequest {
    PersistRequest {
        sandbox,
        snapshot: Some(snapshot.clone()),
        suspend: true,
        retain_until,
        token: None,
    }
}

/// What the command writes: its workspace's `.sandkeeper/sandbox.json`, as it likes.
fn forge_info(workspace: &Path, info: serde_json::Value) {
    let meta = workspace.join(".sandkeeper");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(meta.join("sandbox.json"), info.to_string()).unwrap();
}

/// A fleet id: the incarnation in the high half.
fn id(incarnation: u32, n: u64) -> SandboxId {
    SandboxId(u64::from(incarnation) << 32 | n)
}

/// A fleet store on `root` with a process (incarnation) whose lease ended long before `now`,
/// and one whose lease holds at `now`.
struct Fleet {
    store: LocalStore,
    dead: u32,
    live: u32,
    /// When the dead process last renewed.
    then: SystemTime,
    /// When the sweep runs.
    now: SystemTime,
}

impl Fleet {
    fn open(root: &Path) -> Fleet {
        let store = LocalStore::open(root, Duration::from_secs(10)).unwrap();
        // Close to the wall clock: metadata written by this test is never an hour old.
        #[allow(clippy::disallowed_methods)]
        let now = SystemTime::now();
        let then = now - Duration::from_secs(100);
        let dead = store.register().unwrap();
        store.renew(dead, 1, then).unwrap();
        let live = store.register().unwrap();
        store.renew(live, 1, now).unwrap();
        Fleet {
            store,
            dead,
            live,
            then,
            now,
        }
    }

    /// The dead process owned `key` and released it with `record`.
    fn released(&self, key: &Key, record: StoredRecord) {
        let Claim::Claimed(token, _) = self.store.claim(key, self.dead, 1, self.then).unwrap()
        else {
            panic!("the key is free")
        };
        assert!(self
            .store
            .release(key, self.dead, token, record, self.then)
            .unwrap());
    }
}

/// Harm before: a start resuming a key's snapshot that is missing (expired, removed) looks for
/// a sandbox directory whose `sandbox.json` says a crashed start of the key took it, and takes
/// that directory. A command forging both `resumed_from` *and the key* handed its own workspace
/// (its files, its planted programs) to the victim key's start: the victim resumed the
/// attacker's workspace, and the attacker's sandbox lost its own, while it ran in another
/// process of the fleet. Now the start goes by the keeper's own record of what each sandbox was
/// started for, which the command cannot reach: the victim starts fresh, the attacker keeps its
/// workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_forging_another_keys_resume_is_not_handed_to_that_key() {
    let root = fresh("handed");
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let evil = SandboxId(5);
    first.start(start(evil, &key("evil"), None)).await.unwrap();
    let workspace = first.sandbox_dir(evil);
    std::fs::write(workspace.join("planted"), b"for the victim").unwrap();
    let missing = Snapshot::new("sbx-1-0");
    forge_info(
        &workspace,
        serde_json::json!({
            "sandbox": 5,
            "key": "session:victim",
            "spec": "",
            "resumed_from": missing.as_str(),
        }),
    );

    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let victim = SandboxId(6);
    second
        .start(start(victim, &key("victim"), Some(missing)))
        .await
        .unwrap();
    assert!(
        !second.sandbox_dir(victim).join("planted").exists(),
        "the victim starts with a fresh workspace"
    );
    assert_eq!(
        std::fs::read(workspace.join("planted")).unwrap(),
        b"for the victim",
        "the attacker's workspace stays where it ran"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Harm before: the fleet sweep took a sandbox's key from its `sandbox.json`. A command of a
/// sandbox whose process died forged a key owned by a live process (or one whose record names a
/// snapshot it says it took), and the sweep kept its directory for as long as that other key
/// lived: a dead sandbox leaked, beyond every lease. Now the key is the keeper's record: swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_key_does_not_keep_a_dead_sandbox_from_the_fleet_sweep() {
    let root = fresh("kept");
    let fleet = Fleet::open(&root);
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let leaked = id(fleet.dead, 1);
    backend.start(start(leaked, &key("a"), None)).await.unwrap();
    let workspace = backend.sandbox_dir(leaked);
    // A key a live process owns.
    assert!(matches!(
        fleet
            .store
            .claim(&key("busy"), fleet.live, 1, fleet.now)
            .unwrap(),
        Claim::Claimed(..)
    ));
    forge_info(
        &workspace,
        serde_json::json!({"sandbox": leaked.0, "key": "session:busy"}),
    );
    drop(backend); // its process crashed

    let swept = fleet.store.sweep(fleet.now).unwrap();
    assert!(!workspace.exists(), "swept ({swept:?})");
    let _ = std::fs::remove_dir_all(&root);
}

/// Harm before: an owner started a key's sandbox from the snapshot the key's record names (the
/// start takes it: a rename) and crashed before the record named the new sandbox; the sweep
/// keeps that sandbox, since the snapshot *is* its workspace now, because its `sandbox.json`
/// says it took the snapshot. A command in it rewrote `sandbox.json` without `resumed_from`,
/// and the sweep removed the key's whole history, which its next start would have continued.
/// Now the sweep reads what the start recorded: kept, and the next start continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_resume_does_not_lose_a_keys_history_to_the_fleet_sweep() {
    let root = fresh("history");
    let fleet = Fleet::open(&root);
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let k = key("k");
    let (x, y) = (id(fleet.dead, 1), id(fleet.dead, 2));
    backend.start(start(x, &k, None)).await.unwrap();
    std::fs::write(backend.sandbox_dir(x).join("work"), b"a day's work").unwrap();
    let snapshot = backend.stop(stop(x)).await.unwrap().unwrap();
    backend.persist(persist(x, &snapshot, None)).await.unwrap();
    backend.shutdown(x, None).await.unwrap();
    fleet.released(
        &k,
        StoredRecord {
            snapshot: Some(StoredSnapshot {
                snapshot: snapshot.clone(),
                by: x,
                retain_until_ms: None,
            }),
            warm: None,
        },
    );
    backend
        .start(start(y, &k, Some(snapshot.clone())))
        .await
        .unwrap();
    let workspace = backend.sandbox_dir(y);
    forge_info(
        &workspace,
        serde_json::json!({"sandbox": y.0, "key": "session:k"}),
    );
    drop(backend); // crashed before the record named `y`

    fleet.store.sweep(fleet.now).unwrap();
    assert_eq!(
        std::fs::read(workspace.join("work")).unwrap(),
        b"a day's work",
        "the key's history is kept for its next start"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Harm before: a snapshot carried its workspace's `sandbox.json` as the command last left it
/// (Stop clears a forged `persisted` and `expires`, never `sandbox.json`), and the fleet sweep
/// took the snapshot's key from it. A command forging another key had the snapshot its own key
/// keeps until its next start (a Persist without retention) swept at once: the record of the
/// real key was not looked at, and no expiry was recorded. Now the key is the keeper's: kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_key_does_not_get_a_kept_snapshot_swept() {
    let root = fresh("retained");
    let fleet = Fleet::open(&root);
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let k = key("k");
    let x = id(fleet.dead, 1);
    backend.start(start(x, &k, None)).await.unwrap();
    forge_info(
        &backend.sandbox_dir(x),
        serde_json::json!({"sandbox": x.0, "key": "session:nobody"}),
    );
    let snapshot = backend.stop(stop(x)).await.unwrap().unwrap();
    backend.persist(persist(x, &snapshot, None)).await.unwrap();
    backend.shutdown(x, None).await.unwrap();
    fleet.released(
        &k,
        StoredRecord {
            snapshot: Some(StoredSnapshot {
                snapshot: snapshot.clone(),
                by: x,
                retain_until_ms: None,
            }),
            warm: None,
        },
    );
    drop(backend);

    fleet.store.sweep(fleet.now).unwrap();
    assert!(
        backend_snapshot(&root, &snapshot).exists(),
        "kept until its key's next start"
    );
    let _ = std::fs::remove_dir_all(&root);
}

fn backend_snapshot(root: &Path, snapshot: &Snapshot) -> PathBuf {
    root.join(".snapshots").join(snapshot.as_str())
}

/// Harm before: an adoption of a sandbox whose owner stopped it and crashed before its key's
/// record said so finds the stopped workspace by its `sandbox.json` naming the sandbox. A
/// command forging another sandbox number there before the stop made the adoption answer that
/// the sandbox is gone: the key lost its workspace. Now the adoption goes by the keeper's record
/// of the snapshot: taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sandbox_number_does_not_hide_a_stopped_workspace_from_adoption() {
    let root = fresh("adopt-stopped");
    let k = key("k");
    let x = id(1, 1);
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    first.start(start(x, &k, None)).await.unwrap();
    std::fs::write(first.sandbox_dir(x).join("work"), b"mine").unwrap();
    forge_info(
        &first.sandbox_dir(x),
        serde_json::json!({"sandbox": 999, "key": "session:k"}),
    );
    let snapshot = first.stop(stop(x)).await.unwrap().unwrap();
    first.persist(persist(x, &snapshot, None)).await.unwrap();
    drop(first); // crashed before the record said it stopped

    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    second
        .adopt(AdoptRequest {
            sandbox: x,
            key: k,
            token: Token(2),
        })
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(second.sandbox_dir(x).join("work")).unwrap(),
        b"mine"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Harm before: an adoption took a live sandbox's directory for up only if its `sandbox.json`
/// was there. A command that removed it (`rm -r .sandkeeper`) had its sandbox answered as gone
/// when its owner crashed and the next owner adopted it: the key lost its workspace. Now up is
/// the directory the keeper's record says it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_sandbox_json_does_not_make_adoption_lose_a_live_sandbox() {
    let root = fresh("adopt-live");
    let k = key("k");
    let x = id(1, 1);
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    first.start(start(x, &k, None)).await.unwrap();
    std::fs::write(first.sandbox_dir(x).join("work"), b"mine").unwrap();
    std::fs::remove_dir_all(first.sandbox_dir(x).join(".sandkeeper")).unwrap();
    drop(first); // crashed

    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    second
        .adopt(AdoptRequest {
            sandbox: x,
            key: k,
            token: Token(2),
        })
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(second.sandbox_dir(x).join("work")).unwrap(),
        b"mine"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Held before, and holds: markers a command wrote in its live workspace decide nothing about
/// what is kept. A forged `persisted` does not keep a snapshot no Persist kept (Shutdown removes
/// it), and a forged early `expires` does not get a snapshot with a long retention swept by the
/// backend's retention sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_forged_in_a_live_workspace_neither_keep_nor_expire_a_snapshot() {
    let root = fresh("markers");
    let b = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let (x, y) = (SandboxId(1), SandboxId(2));
    b.start(start(x, &key("a"), None)).await.unwrap();
    let meta = b.sandbox_dir(x).join(".sandkeeper");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(meta.join("persisted"), b"persisted\n").unwrap();
    let unkept = b.stop(stop(x)).await.unwrap().unwrap();
    b.shutdown(x, None).await.unwrap();
    assert!(
        !backend_snapshot(&root, &unkept).exists(),
        "no Persist kept it"
    );

    b.start(start(y, &key("b"), None)).await.unwrap();
    let meta = b.sandbox_dir(y).join(".sandkeeper");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(meta.join("expires"), b"1\n").unwrap();
    let kept = b.stop(stop(y)).await.unwrap().unwrap();
    let until = UNIX_EPOCH + Duration::from_secs(4_000_000_000);
    b.persist(persist(y, &kept, Some(until))).await.unwrap();
    assert_eq!(
        b.sweep_expired(UNIX_EPOCH + Duration::from_secs(10))
            .unwrap(),
        0
    );
    assert!(backend_snapshot(&root, &kept).exists());
    // Its own retention, once ended, does remove it.
    assert_eq!(b.sweep_expired(until).unwrap(), 1);
    assert!(!backend_snapshot(&root, &kept).exists());
    let _ = std::fs::remove_dir_all(&root);
}

/// Harm before: Stop clears the markers of the workspace before it becomes the snapshot, but
/// the snapshot is the same directory, and what still writes in it after (a process outliving
/// its Stop: the mount follows the renamed directory) decided the retention: an `expires` of 1
/// written after the Persist had the retention sweep remove a snapshot retained for years, and
/// a `persisted` written after Stop kept one no Persist kept. Now neither file is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_written_into_a_snapshot_after_its_stop_decide_nothing() {
    let root = fresh("late-markers");
    let b = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let (x, y) = (SandboxId(1), SandboxId(2));
    b.start(start(x, &key("a"), None)).await.unwrap();
    let unkept = b.stop(stop(x)).await.unwrap().unwrap();
    let inside = backend_snapshot(&root, &unkept).join(".sandkeeper");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::write(inside.join("persisted"), b"persisted\n").unwrap();
    b.shutdown(x, None).await.unwrap();
    assert!(
        !backend_snapshot(&root, &unkept).exists(),
        "no Persist kept it"
    );

    b.start(start(y, &key("b"), None)).await.unwrap();
    let kept = b.stop(stop(y)).await.unwrap().unwrap();
    let until = UNIX_EPOCH + Duration::from_secs(4_000_000_000);
    b.persist(persist(y, &kept, Some(until))).await.unwrap();
    let inside = backend_snapshot(&root, &kept).join(".sandkeeper");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::write(inside.join("expires"), b"1\n").unwrap();
    assert_eq!(
        b.sweep_expired(UNIX_EPOCH + Duration::from_secs(10))
            .unwrap(),
        0
    );
    assert!(
        backend_snapshot(&root, &kept).exists(),
        "retained until its own expiry"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Held before, and holds: a forged `sandbox.json` naming the command's own key and a missing
/// snapshot of another key does not hand its workspace to that other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_resume_of_its_own_key_is_not_handed_to_another_key() {
    let root = fresh("own-key");
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let evil = SandboxId(5);
    first.start(start(evil, &key("evil"), None)).await.unwrap();
    let workspace = first.sandbox_dir(evil);
    std::fs::write(workspace.join("planted"), b"for the victim").unwrap();
    let missing = Snapshot::new("sbx-1-0");
    forge_info(
        &workspace,
        serde_json::json!({"sandbox": 5, "key": "session:evil", "resumed_from": missing.as_str()}),
    );
    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let victim = SandboxId(6);
    second
        .start(start(victim, &key("victim"), Some(missing)))
        .await
        .unwrap();
    assert!(!second.sandbox_dir(victim).join("planted").exists());
    assert!(workspace.join("planted").exists());
    let _ = std::fs::remove_dir_all(&root);
}

// ---------------------------------------------------------------------------------------------
// Roots made by an older keeper (its metadata inside the workspace), records left by a crash,
// records that are not records.

/// A root an older keeper made has its metadata inside the workspaces and no records. None of
/// it is trusted: the fleet sweep keeps a dead process's sandbox and snapshot that have no
/// record, whatever their workspace says (a `sandbox.json` naming a key nothing owns, an
/// `expires` long past), rather than judge them from what a command could have written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_roots_objects_are_never_judged_from_their_workspace() {
    let root = fresh("older-root");
    let fleet = Fleet::open(&root);
    let sandbox = root.join(format!("sbx-{}", id(fleet.dead, 1).0));
    forge_info(
        &sandbox,
        serde_json::json!({"sandbox": id(fleet.dead, 1).0, "key": "session:nobody"}),
    );
    let snapshot = root
        .join(".snapshots")
        .join(format!("sbx-{}-old", id(fleet.dead, 2).0));
    forge_info(
        &snapshot,
        serde_json::json!({"sandbox": id(fleet.dead, 2).0, "key": "session:nobody"}),
    );
    std::fs::write(snapshot.join(".sandkeeper/expires"), b"1\n").unwrap();
    std::fs::write(snapshot.join(".sandkeeper/persisted"), b"persisted\n").unwrap();

    let swept = fleet.store.sweep(fleet.now).unwrap();
    assert_eq!(swept, Default::default());
    assert!(sandbox.exists() && snapshot.exists());
    let _ = std::fs::remove_dir_all(&root);
}

/// An older root's live sandbox (no record) is adopted, and recorded from the adopting owner's
/// own request (the key its record names), not from its workspace's `sandbox.json`, which may
/// name another key. A sandbox recorded for another key is not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_records_an_older_roots_sandbox_and_refuses_another_keys() {
    let root = fresh("adopt-older");
    let x = id(1, 1);
    let dir = root.join(format!("sbx-{}", x.0));
    forge_info(
        &dir,
        serde_json::json!({"sandbox": x.0, "key": "session:other"}),
    );
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    backend
        .adopt(AdoptRequest {
            sandbox: x,
            key: key("k"),
            token: Token(2),
        })
        .await
        .unwrap();
    let record = backend.sandbox_record(x).unwrap().expect("recorded now");
    assert_eq!(record.key, "session:k");
    assert_eq!(record.resumed_from, None);

    let y = id(1, 2);
    backend.start(start(y, &key("a"), None)).await.unwrap();
    let other = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let refused = other
        .adopt(AdoptRequest {
            sandbox: y,
            key: key("b"),
            token: Token(3),
        })
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("session:a"), "{refused}");
    assert_eq!(backend.sandbox_record(y).unwrap().unwrap().key, "session:a");
    let _ = std::fs::remove_dir_all(&root);
}

/// A record whose directory is gone (a crash between the two) is cleared by the fleet sweep
/// once it is an hour old, never before; a record beside its directory stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_crash_left_are_cleared_once_old() {
    let root = fresh("orphans");
    let fleet = Fleet::open(&root);
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let (x, y) = (id(fleet.live, 1), id(fleet.live, 2));
    backend.start(start(x, &key("a"), None)).await.unwrap();
    backend.start(start(y, &key("b"), None)).await.unwrap();
    // The crash: `y`'s directory went, its record did not.
    std::fs::remove_dir_all(backend.sandbox_dir(y)).unwrap();
    fleet.store.sweep(fleet.now).unwrap();
    assert!(backend.sandbox_record(y).unwrap().is_some(), "young: kept");
    fleet
        .store
        .renew(fleet.live, 1, fleet.now + Duration::from_secs(7_200))
        .unwrap();
    fleet
        .store
        .sweep(fleet.now + Duration::from_secs(7_200))
        .unwrap();
    assert_eq!(backend.sandbox_record(y).unwrap(), None);
    assert!(backend.sandbox_record(x).unwrap().is_some());
    assert!(backend.sandbox_dir(x).exists());
    let _ = std::fs::remove_dir_all(&root);
}

/// A record that is not one is an error naming it, never a guess: the retention sweep of a new
/// backend and the fleet sweep both refuse to go on past it, and a resume too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_an_error_naming_it() {
    let root = fresh("malformed");
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let x = SandboxId(1);
    first.start(start(x, &key("a"), None)).await.unwrap();
    let snapshot = first.stop(stop(x)).await.unwrap().unwrap();
    first.persist(persist(x, &snapshot, None)).await.unwrap();
    let record = root
        .join(".meta/snapshots")
        .join(format!("{}.json", snapshot.as_str()));
    std::fs::write(&record, b"{\"taken_from\": 7}").unwrap();

    let e = LocalBackend::new(LocalConfig::new(&root))
        .err()
        .expect("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains(&record.display().to_string()), "{e}");
    let e = first
        .persist(persist(x, &snapshot, None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");

    let fleet = LocalStore::open(&root, Duration::from_secs(10)).unwrap();
    #[allow(clippy::disallowed_methods)]
    let e = fleet.sweep(SystemTime::now()).unwrap_err();
    assert!(e.to_string().contains(&record.display().to_string()), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
