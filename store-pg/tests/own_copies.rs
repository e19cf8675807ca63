//! A host's copy of a snapshot another host resumed from the shelf is swept by its own maker,
//! while it lives ([`PgStore::sweep_own`] over a [`HostInventory`]): two real `LocalBackend`s
//! on roots of their own (two hosts), a real `file://` shelf, a real throwaway PostgreSQL.
//! Before, the copy stayed on the persisting host for as long as its process lived (one
//! workspace left per key moved); the plain sweep still keeps it. It is kept while the key's
//! record names it and while the maker's core holds it; the shelf's copy and the resumed
//! sandbox stay.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use sandkeeper::{Key, SandboxId, Snapshot, Spec};
use sandkeeper_pg::{HostInventory, LocalRootInventory, PgStore, ShelfInventory};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotName, SnapshotsConfig};
use sandkeeper_tokio::local::shelf::Shelf;
use sandkeeper_tokio::local::{Isolation, LocalConfig};
use sandkeeper_tokio::store::{Claim, OwnSnapshots, StoredRecord, StoredSnapshot, Swept};
use sandkeeper_tokio::{Backend, LocalBackend, PersistRequest, StartRequest, StopRequest};

/// A fresh directory of this test's own under the system's temporary directory.
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sk-pg-own-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fleet sandbox id: the incarnation in the high half.
fn id(incarnation: u32, n: u64) -> SandboxId {
    SandboxId(u64::from(incarnation) << 32 | n)
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

fn host(root: &Path, shelf: Arc<dyn Shelf>) -> LocalBackend {
    LocalBackend::new(LocalConfig {
        isolation: Isolation::Off,
        shelf: Some(shelf),
        ..LocalConfig::new(root)
    })
    .unwrap()
}

async fn claimed(
    store: &PgStore,
    k: &Key,
    inc: u32,
    secs: u64,
) -> (sandkeeper::Token, StoredRecord) {
    match store.claim(k, inc, 1, at(secs)).await.unwrap() {
        Claim::Claimed(token, record) => (token, record),
        Claim::Busy => panic!("{k} busy"),
    }
}

fn own(incarnation: u32, holds: bool) -> OwnSnapshots {
    OwnSnapshots {
        incarnation,
        holds: Arc::new(move |_: &Snapshot| holds),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maker_sweeps_its_copy_of_a_snapshot_another_host_resumed_and_nothing_else() {
    let cluster = cluster();
    let (root_a, root_b, bucket) = (fresh("a"), fresh("b"), fresh("bucket"));
    std::fs::create_dir_all(&bucket).unwrap();
    let url = format!("file://{}", bucket.display());
    let shelf = Arc::new(ObjectSnapshots::open(&url, SnapshotsConfig::default()).unwrap());
    let (a_backend, b_backend) = (host(&root_a, shelf.clone()), host(&root_b, shelf.clone()));
    let inventory = HostInventory::new(
        vec![Arc::new(LocalRootInventory::new(&root_a))],
        ShelfInventory::new(shelf.clone()),
    );
    let store = store(&cluster).await.with_inventory(Arc::new(inventory));
    let (a, b) = (
        store.register().await.unwrap(),
        store.register().await.unwrap(),
    );
    let k = key("moved");

    // Host a runs the key, suspends it to the shelf (and keeps its copy), and lets the key go
    // with the snapshot in its record.
    store.renew(a, 1, at(0)).await.unwrap();
    let (token, _) = claimed(&store, &k, a, 0).await;
    let ran = id(a, 1);
    a_backend.start(start(ran, &k, None)).await.unwrap();
    std::fs::write(a_backend.sandbox_dir(ran).join("turn-1"), b"acknowledged").unwrap();
    let stop = StopRequest {
        sandbox: ran,
        suspend: true,
        token: None,
    };
    let snapshot = a_backend.stop(stop).await.unwrap().expect("a snapshot");
    let persist = PersistRequest {
        sandbox: ran,
        snapshot: Some(snapshot.clone()),
        suspend: true,
        retain_until: None,
        token: None,
    };
    a_backend.persist(persist).await.unwrap();
    let record = StoredRecord {
        snapshot: Some(StoredSnapshot {
            snapshot: snapshot.clone(),
            by: ran,
            retain_until_ms: None,
        }),
        warm: None,
    };
    assert!(store.release(&k, a, token, &record, at(0)).await.unwrap());
    let copy = root_a.join(".snapshots").join(snapshot.as_str());
    assert!(copy.is_dir());

    // Both live from here on (judged a lease, 10 s, before 105).
    store.renew(a, 1, at(100)).await.unwrap();
    store.renew(b, 1, at(100)).await.unwrap();
    let nothing = Swept::default();
    assert_eq!(
        store.sweep_own(at(105), &own(a, false)).await.unwrap(),
        nothing
    );
    assert!(copy.is_dir(), "the record names it: kept");

    // Host b takes the key, resumes the snapshot from the shelf and records its sandbox.
    let (token, got) = claimed(&store, &k, b, 100).await;
    assert_eq!(got, record);
    let resumed = id(b, 1);
    b_backend
        .start(start(resumed, &k, Some(snapshot.clone())))
        .await
        .unwrap();
    let warm = StoredRecord {
        snapshot: None,
        warm: Some(resumed),
    };
    assert!(store.record(&k, b, token, 1, &warm, at(100)).await.unwrap());

    // The plain sweep keeps host a's copy while a lives; so does a core that holds it.
    assert_eq!(store.sweep(at(105)).await.unwrap(), nothing);
    assert_eq!(
        store.sweep_own(at(105), &own(a, true)).await.unwrap(),
        nothing
    );
    // Another live process's sweep never judges a's copies by its own rule.
    assert_eq!(
        store.sweep_own(at(105), &own(b, false)).await.unwrap(),
        nothing
    );
    assert!(copy.is_dir());

    // Its maker, holding it no more: its copy goes, the shelf's stays, b's sandbox is whole.
    let swept = store.sweep_own(at(105), &own(a, false)).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 0,
            snapshots: 1,
            unrecorded: 0
        }
    );
    assert!(!copy.exists(), "host a's copy is swept");
    let name = SnapshotName::from_snapshot(&snapshot).unwrap();
    shelf.manifest(&name).await.expect("the shelf's copy stays");
    assert_eq!(
        std::fs::read(b_backend.sandbox_dir(resumed).join("turn-1")).unwrap(),
        b"acknowledged"
    );
    drop((a_backend, b_backend));
    for dir in [root_a, root_b, bucket] {
        let _ = std::fs::remove_dir_all(dir);
    }
}
