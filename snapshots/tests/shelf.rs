//! The local backend with object storage as its shelf (`io-tokio`'s `local/shelf.rs`): two
//! backends on separate roots stand for two hosts, one `file://` store for the bucket (the real
//! `object_store` file-system store; the S3 path is the same code, tested against moto in
//! `moto.rs` and in the two-host test of `sandkeeper-pg`). Each test drives the backends' own
//! commands as the core orders them.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sandkeeper::{DiscardReason, Key, SandboxId, SessionId, Snapshot, Spec, Token};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotError, SnapshotName, SnapshotsConfig};
use sandkeeper_tokio::local::shelf::{ArchiveSource, Shelf, ShelfError, ShelfFuture};
use sandkeeper_tokio::local::{Isolation, LocalConfig};
use sandkeeper_tokio::{
    AdoptRequest, Backend, DiscardRequest, FailureClass, LocalBackend, PersistRequest,
    StartRequest, StopRequest,
};
use tokio::sync::mpsc;

/// A fresh directory for one test.
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sk-shelf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The bucket: object storage on the file system under `dir`.
fn bucket(dir: &Path) -> Arc<ObjectSnapshots> {
    std::fs::create_dir_all(dir).unwrap();
    let url = format!("file://{}", dir.display());
    Arc::new(ObjectSnapshots::open(&url, SnapshotsConfig::default()).unwrap())
}

/// A host: a backend on its own root, with `shelf`.
fn host(root: PathBuf, shelf: Option<Arc<dyn Shelf>>) -> LocalBackend {
    LocalBackend::new(LocalConfig {
        isolation: Isolation::Off,
        shelf,
        ..LocalConfig::new(root)
    })
    .unwrap()
}

fn key() -> Key {
    Key::Session(SessionId::new("s1").unwrap())
}

/// A sandbox id made by the process of incarnation `inc`.
fn sbx(inc: u64, n: u64) -> SandboxId {
    SandboxId(inc << 32 | n)
}

fn start(sandbox: SandboxId, resume_from: Option<Snapshot>) -> StartRequest {
    StartRequest {
        sandbox,
        key: key(),
        spec: Spec::new(""),
        resume_from,
        resumes: None,
        token: None,
    }
}

/// Starts `sandbox` on `host`, writes `work.txt` into its workspace (as a command would), and
/// stops it for suspension: the snapshot its Stop took.
async fn worked_and_stopped(host: &LocalBackend, sandbox: SandboxId, text: &str) -> Snapshot {
    host.start(start(sandbox, None)).await.unwrap();
    std::fs::write(host.sandbox_dir(sandbox).join("work.txt"), text).unwrap();
    let stop = StopRequest {
        sandbox,
        suspend: true,
        token: None,
    };
    host.stop(stop)
        .await
        .unwrap()
        .expect("a suspension's snapshot")
}

fn persist(sandbox: SandboxId, snapshot: &Snapshot) -> PersistRequest {
    PersistRequest {
        sandbox,
        snapshot: Some(snapshot.clone()),
        suspend: true,
        retain_until: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000_000)),
        token: None,
    }
}

fn name(snapshot: &Snapshot) -> SnapshotName {
    SnapshotName::from_snapshot(snapshot).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_suspended_on_one_host_resumes_on_another() {
    let dir = fresh("moves");
    let shelf = bucket(&dir.join("bucket"));
    let a = host(dir.join("a"), Some(shelf.clone()));
    let b = host(dir.join("b"), Some(shelf.clone()));
    let snapshot = worked_and_stopped(&a, sbx(1, 1), "written on a\n").await;
    a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap();

    // On the shelf, with its key and retention; and still on a's disk.
    let manifest = shelf.manifest(&name(&snapshot)).await.unwrap();
    assert_eq!(manifest.key.as_deref(), Some(key().to_string().as_str()));
    assert_eq!(manifest.retain_until, Some(4_000_000_000));
    let record = a.snapshot_record(&snapshot).unwrap().expect("recorded");
    assert!(record.persisted);

    // b resumes it: fetched from the shelf, whole.
    b.start(start(sbx(2, 1), Some(snapshot.clone())))
        .await
        .unwrap();
    let there = std::fs::read_to_string(b.sandbox_dir(sbx(2, 1)).join("work.txt")).unwrap();
    assert_eq!(there, "written on a\n");
    // A start never removes it from the shelf: another host may need it until the key's
    // record moves on (the fleet sweep removes it after).
    shelf.manifest(&name(&snapshot)).await.unwrap();
    // A Persist tried again (its answer lost) finds it there and succeeds.
    a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persist_answers_ok_only_once_the_snapshot_is_on_the_shelf() {
    let dir = fresh("persist");
    let flaky = Arc::new(Flaky::new(bucket(&dir.join("bucket"))));
    let a = host(dir.join("a"), Some(flaky.clone()));
    let snapshot = worked_and_stopped(&a, sbx(1, 1), "x").await;

    flaky.fail_next(1);
    let e = a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Transient, "{e}");
    assert!(e.message.contains("on the shelf"), "{e}");
    // Not recorded persisted, not on the shelf: a Shutdown would take it, the core salvages it.
    let record = a.snapshot_record(&snapshot).unwrap().expect("recorded");
    assert!(!record.persisted);
    let missing = flaky.inner.manifest(&name(&snapshot)).await.unwrap_err();
    assert!(
        matches!(missing, SnapshotError::NotFound { .. }),
        "{missing}"
    );

    // The next attempt puts it, then records it persisted.
    a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap();
    assert!(a.snapshot_record(&snapshot).unwrap().unwrap().persisted);
    flaky.inner.manifest(&name(&snapshot)).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_on_no_reachable_host_fails_the_start_and_leaves_nothing() {
    let dir = fresh("nowhere");
    let shelf = bucket(&dir.join("bucket"));
    let a = host(dir.join("a"), Some(shelf.clone()));
    let b = host(dir.join("b"), Some(shelf.clone()));
    // Stopped on a, never persisted: only on a's disk.
    let snapshot = worked_and_stopped(&a, sbx(1, 1), "only on a").await;

    let e = b
        .start(start(sbx(2, 1), Some(snapshot.clone())))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Fatal, "{e}");
    assert!(
        e.message.contains("neither on this host nor on the shelf"),
        "{e}"
    );
    // Nothing made on b: no directory, no record; a's copy untouched.
    assert!(!b.sandbox_dir(sbx(2, 1)).exists());
    assert!(b.sandbox_record(sbx(2, 1)).unwrap().is_none());
    assert!(a.snapshot_dirs_present().unwrap().len() == 1);

    // Without a shelf (one root holds everything) a missing snapshot is a fresh workspace.
    let alone = host(dir.join("alone"), None);
    alone
        .start(start(sbx(3, 1), Some(snapshot.clone())))
        .await
        .unwrap();
    assert!(!alone.sandbox_dir(sbx(3, 1)).join("work.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_that_fails_leaves_nothing_and_the_next_start_resumes() {
    let dir = fresh("fetch");
    let shelf = bucket(&dir.join("bucket"));
    let flaky = Arc::new(Flaky::new(shelf.clone()));
    let a = host(dir.join("a"), Some(shelf.clone()));
    let b = host(dir.join("b"), Some(flaky.clone()));
    let snapshot = worked_and_stopped(&a, sbx(1, 1), "kept").await;
    a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap();

    flaky.fail_next(1);
    let e = b
        .start(start(sbx(2, 1), Some(snapshot.clone())))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Transient, "{e}");
    assert!(!b.sandbox_dir(sbx(2, 1)).exists());
    assert!(b.sandbox_record(sbx(2, 1)).unwrap().is_none());

    b.start(start(sbx(2, 2), Some(snapshot.clone())))
        .await
        .unwrap();
    let there = std::fs::read_to_string(b.sandbox_dir(sbx(2, 2)).join("work.txt")).unwrap();
    assert_eq!(there, "kept");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopt_of_a_sandbox_on_another_host_is_elsewhere_never_gone() {
    let dir = fresh("adopt");
    let shelf = bucket(&dir.join("bucket"));
    let a = host(dir.join("a"), Some(shelf.clone()));
    let b = host(dir.join("b"), Some(shelf.clone()));
    a.start(start(sbx(1, 1), None)).await.unwrap();
    let adopt = AdoptRequest {
        sandbox: sbx(1, 1),
        key: key(),
        token: Token(2),
    };
    let e = b.adopt(adopt.clone()).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Elsewhere, "{e}");
    assert!(a.sandbox_dir(sbx(1, 1)).is_dir());
    // Its own host adopts it.
    a.adopt(adopt.clone()).await.unwrap();

    // One root of its own, no shelf: not there is gone.
    let alone = host(dir.join("alone"), None);
    let e = alone.adopt(adopt).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Gone, "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_removes_the_snapshot_here_and_on_the_shelf() {
    let dir = fresh("discard");
    let shelf = bucket(&dir.join("bucket"));
    let a = host(dir.join("a"), Some(shelf.clone()));
    let b = host(dir.join("b"), Some(shelf.clone()));
    let snapshot = worked_and_stopped(&a, sbx(1, 1), "x").await;
    a.persist(persist(sbx(1, 1), &snapshot)).await.unwrap();
    let discard = DiscardRequest {
        sandbox: sbx(1, 1),
        key: key(),
        snapshot: snapshot.clone(),
        reason: DiscardReason::Superseded,
        token: None,
    };
    // From another host: the shelf's copy goes (a's own copy is a's sweep's).
    b.discard(discard.clone()).await.unwrap();
    let missing = shelf.manifest(&name(&snapshot)).await.unwrap_err();
    assert!(
        matches!(missing, SnapshotError::NotFound { .. }),
        "{missing}"
    );
    // On its own host: the local copy and its record too; again, nothing left to do.
    a.discard(discard.clone()).await.unwrap();
    assert!(a.snapshot_dirs_present().unwrap().is_empty());
    assert!(a.snapshot_record(&snapshot).unwrap().is_none());
    a.discard(discard).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fleet_on_a_root_with_a_shelf_must_hand_keys_over_suspended() {
    let dir = fresh("handover");
    let shelf = bucket(&dir.join("bucket"));
    let host_root = host(dir.join("a"), Some(shelf));
    let alone = host(dir.join("alone"), None);
    let fleet = |handover| sandkeeper::Config {
        fleet: Some(sandkeeper::Fleet {
            handover,
            ..sandkeeper::Fleet::default()
        }),
        ..sandkeeper::Config::default()
    };
    let e = host_root
        .check_config(&fleet(sandkeeper::Handover::Warm))
        .unwrap_err();
    assert!(e.contains("Handover::Suspended"), "{e}");
    host_root
        .check_config(&fleet(sandkeeper::Handover::Suspended))
        .unwrap();
    alone
        .check_config(&fleet(sandkeeper::Handover::Warm))
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The real shelf, with failures injected at its boundary: the next `n` operations fail as a
/// store that answers 503 past its retries does (`Unavailable`), doing nothing.
#[derive(Debug)]
struct Flaky {
    inner: Arc<ObjectSnapshots>,
    failures: AtomicU32,
}

impl Flaky {
    fn new(inner: Arc<ObjectSnapshots>) -> Self {
        Flaky {
            inner,
            failures: AtomicU32::new(0),
        }
    }

    fn fail_next(&self, n: u32) {
        self.failures.store(n, Ordering::SeqCst);
    }

    fn failing(&self) -> Result<(), ShelfError> {
        let left = self.failures.load(Ordering::SeqCst);
        if left == 0 {
            return Ok(());
        }
        self.failures.store(left - 1, Ordering::SeqCst);
        Err(ShelfError::Unavailable("injected: 503 Slow Down".into()))
    }
}

impl Shelf for Flaky {
    fn put<'a>(
        &'a self,
        dir: &'a Path,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.failing()?;
            self.inner.put(dir, snapshot, key, retain_until).await
        })
    }

    fn fetch<'a>(&'a self, snapshot: &'a Snapshot, target: &'a Path) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.failing()?;
            self.inner.fetch(snapshot, target).await
        })
    }

    fn remove<'a>(&'a self, snapshot: &'a Snapshot) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.failing()?;
            self.inner.remove(snapshot).await
        })
    }

    fn put_archive<'a>(
        &'a self,
        archive: ArchiveSource,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.failing()?;
            self.inner
                .put_archive(archive, snapshot, key, retain_until)
                .await
        })
    }

    fn fetch_archive<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        to: mpsc::Sender<Bytes>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.failing()?;
            Shelf::fetch_archive(&*self.inner, snapshot, to).await
        })
    }
}
