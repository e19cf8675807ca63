//! A local root swept through a PostgreSQL store: a host's keeper runs its `LocalBackend` under
//! a PostgreSQL fleet store and gives the store the root's inventory
//! ([`LocalRootInventory`]). A real backend makes the root (its sandboxes, its kept snapshot, its
//! records in `<root>/.meta/`), a real throwaway cluster keeps the leases and records, and
//! [`PgStore::sweep`] removes what no live process holds, keeps the rest, and never acts on what
//! a workspace says or links to.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use sandkeeper::{Key, SandboxId, Snapshot, Spec};
use sandkeeper_pg::{LocalRootInventory, PgError, PgStore};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::store::{unix_ms, Claim, StoredRecord, StoredSnapshot, Swept};
use sandkeeper_tokio::{Backend, LocalBackend, PersistRequest, StartRequest, StopRequest};

/// A fresh directory of this test's own under the system's temporary directory.
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sk-pg-root-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fleet sandbox id: the incarnation in the high half.
fn id(incarnation: u32, n: u64) -> SandboxId {
    SandboxId(u64::from(incarnation) << 32 | n)
}

fn start(sandbox: SandboxId, key: &Key) -> StartRequest {
    StartRequest {
        sandbox,
        key: key.clone(),
        spec: Spec::new(""),
        resume_from: None,
        resumes: None,
        token: None,
    }
}

fn sandbox_record(root: &Path, sandbox: SandboxId) -> PathBuf {
    root.join(format!(".meta/sandboxes/sbx-{}.json", sandbox.0))
}

fn snapshot_dir(root: &Path, snapshot: &Snapshot) -> PathBuf {
    root.join(".snapshots").join(snapshot.as_str())
}

async fn claimed(store: &PgStore, k: &Key, inc: u32, secs: u64) -> sandkeeper::Token {
    match store.claim(k, inc, 1, at(secs)).await.unwrap() {
        Claim::Claimed(token, _) => token,
        Claim::Busy => panic!("{k} busy"),
    }
}

/// A dead process's sandbox goes (its record after it); a live process's stays; a snapshot its
/// key's record names stays until that retention ends, then goes and leaves the record; a
/// directory without a keeper record stays, even with a forged `.meta/` of its own inside saying
/// a dead process made it for a key nobody owns; and a link planted in a swept workspace is
/// removed, never followed (what it points to outside the root is untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_root_is_swept_through_the_postgres_store_by_its_keeper_records() {
    let cluster = cluster();
    let root = fresh("swept");
    let outside = fresh("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"not the sandbox's").unwrap();
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let store = store(&cluster)
        .await
        .with_inventory(Arc::new(LocalRootInventory::new(&root)));
    let (live, dead) = (
        store.register().await.unwrap(),
        store.register().await.unwrap(),
    );
    let [owned, orphaned, kept] = ["owned", "orphaned", "kept"].map(key);

    // The dead process renewed once, at 0 (its lease ended at 10), and started two sandboxes:
    // one still in place when it died, one stopped and persisted as its key's snapshot, kept
    // until 1,000 by the record it released the key with.
    store.renew(dead, 1, at(0)).await.unwrap();
    claimed(&store, &orphaned, dead, 0).await;
    let leaked = id(dead, 1);
    backend.start(start(leaked, &orphaned)).await.unwrap();
    let leaked_dir = backend.sandbox_dir(leaked);
    std::os::unix::fs::symlink(&outside, leaked_dir.join("escape")).unwrap();
    let stopped = id(dead, 2);
    let token = claimed(&store, &kept, dead, 0).await;
    backend.start(start(stopped, &kept)).await.unwrap();
    let request = StopRequest {
        sandbox: stopped,
        suspend: true,
        token: None,
    };
    let snapshot = backend.stop(request).await.unwrap().expect("a snapshot");
    let persist = PersistRequest {
        sandbox: stopped,
        snapshot: Some(snapshot.clone()),
        suspend: true,
        retain_until: Some(at(1_000)),
        token: None,
    };
    backend.persist(persist).await.unwrap();
    backend.shutdown(stopped, None).await.unwrap();
    let record = StoredRecord {
        snapshot: Some(StoredSnapshot {
            snapshot: snapshot.clone(),
            by: stopped,
            retain_until_ms: Some(unix_ms(at(1_000))),
        }),
        warm: None,
    };
    assert!(store
        .release(&kept, dead, token, &record, at(0))
        .await
        .unwrap());

    // The live process renews at 100 and runs a sandbox of a key it owns.
    store.renew(live, 1, at(100)).await.unwrap();
    claimed(&store, &owned, live, 100).await;
    let running = id(live, 1);
    backend.start(start(running, &owned)).await.unwrap();

    // Made by hand (no keeper record), with a forged record inside its own workspace naming it
    // a dead process's sandbox of a key nobody owns: judged by that, it would be swept.
    let unrecorded = id(dead, 7);
    let unrecorded_dir = root.join(format!("sbx-{}", unrecorded.0));
    let forged = serde_json::json!({
        "sandbox": unrecorded.0, "key": "session:orphaned", "spec": null, "resumed_from": null,
    });
    std::fs::create_dir_all(unrecorded_dir.join(".meta/sandboxes")).unwrap();
    std::fs::write(
        sandbox_record(&unrecorded_dir, unrecorded),
        forged.to_string(),
    )
    .unwrap();

    // Judged a lease (10 s) before 105: the live lease (to 110) holds, the dead one does not.
    let swept = store.sweep(at(105)).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 1,
            snapshots: 0,
            unrecorded: 0
        }
    );
    assert!(!leaked_dir.exists(), "the dead process's sandbox is swept");
    assert!(
        !sandbox_record(&root, leaked).exists(),
        "its record goes after it"
    );
    assert_eq!(
        std::fs::read(outside.join("precious")).ok().as_deref(),
        Some(&b"not the sandbox's"[..]),
        "a link in the swept workspace is removed, never followed"
    );
    assert!(backend.sandbox_dir(running).is_dir(), "a live process's");
    assert!(sandbox_record(&root, running).exists());
    assert!(snapshot_dir(&root, &snapshot).is_dir(), "retained to 1,000");
    assert!(unrecorded_dir.is_dir(), "no keeper record: kept");
    let trash: Vec<_> = std::fs::read_dir(root.join(".fleet/trash"))
        .unwrap()
        .collect();
    assert!(trash.is_empty(), "the trash is emptied: {trash:?}");

    // Past the retention (and a lease): the snapshot goes, dropped from its key's record first.
    let swept = store.sweep(at(1_020)).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 1,
            snapshots: 1,
            unrecorded: 1
        },
        "the live process's lease ended too by now"
    );
    assert!(!snapshot_dir(&root, &snapshot).exists());
    assert!(!root
        .join(format!(".meta/snapshots/{}.json", snapshot.as_str()))
        .exists());
    let entries = store.entries().await.unwrap();
    let entry = entries.iter().find(|e| e.key == kept.to_string()).unwrap();
    assert_eq!(entry.record, StoredRecord::default(), "unrecorded");
    assert!(unrecorded_dir.is_dir(), "still kept");
    drop(backend);
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&outside);
}

/// A record in `<root>/.meta/` that is not one stops the sweep with the store's typed error
/// naming it; nothing is removed on a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_a_typed_error_naming_it() {
    let cluster = cluster();
    let root = fresh("malformed");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let store = store(&cluster)
        .await
        .with_inventory(Arc::new(LocalRootInventory::new(&root)));
    let dead = store.register().await.unwrap();
    store.renew(dead, 1, at(0)).await.unwrap();
    let sandbox = id(dead, 1);
    backend.start(start(sandbox, &key("k"))).await.unwrap();
    let record = sandbox_record(&root, sandbox);
    std::fs::write(&record, b"{ not a record").unwrap();

    let e = store.sweep(at(100)).await.unwrap_err();
    assert!(matches!(e, PgError::Inventory(_)), "{e:?}");
    let source = std::error::Error::source(&e).map(ToString::to_string);
    assert!(
        source
            .as_deref()
            .is_some_and(|s| s.contains(&record.display().to_string())),
        "{e}: {source:?}"
    );
    assert!(backend.sandbox_dir(sandbox).is_dir(), "nothing removed");
    drop(backend);
    let _ = std::fs::remove_dir_all(&root);
}
