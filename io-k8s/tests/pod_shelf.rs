//! Pod mode suspending through a shelf (`K8sBackend::with_shelf`), through the io-tokio driver
//! against the loopback API (its pods run their execs as local processes in a directory per
//! pod, which stays when the pod is deleted, as a volume would; a new sandbox's pod has a
//! directory of its own, so nothing carries over but through the shelf) and a real `file://`
//! object store:
//! - the last release streams the workspace out of the pod onto the shelf and deletes the pod;
//!   the next call of the key gets a new pod with the workspace back: files, the session log,
//!   a link kept as a link; a FIFO is listed as skipped;
//! - a put that fails every time leaves the pod (the salvaged snapshot's only copy), and the
//!   next call takes the workspace from that pod through the shelf, then deletes it; once the
//!   new sandbox is up, the core discards what the start left of the snapshot (`taken`): the
//!   shelf's copy goes;
//! - a snapshot damaged on the shelf fails the start (the new pod deleted), and the next call
//!   after it is mended resumes it: nothing lost;
//! - agentSandbox mode refuses a shelf; pod mode with one serves `Suspend`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::*;
use k8s_loopback::resources::PODS;
use k8s_loopback::Loopback;
use sandkeeper::{CallId, CallSpec, Config, PathName, ReleasePolicy, SessionId, Snapshot};
use sandkeeper_k8s::{K8sBackend, K8sError};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotName, SnapshotsConfig};
use sandkeeper_tokio::local::shelf::{ArchiveSource, Shelf, ShelfError, ShelfFuture};
use sandkeeper_tokio::{Backend, CallGuard, Keeper, KeeperConfig};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

/// A shelf on a real `file://` store whose puts fail while `failing_puts` is above zero.
#[derive(Debug)]
struct Flaky {
    inner: ObjectSnapshots,
    failing_puts: AtomicU32,
}

impl Flaky {
    fn put_fails(&self) -> Result<(), ShelfError> {
        let left = self.failing_puts.load(Ordering::SeqCst);
        if left == 0 {
            return Ok(());
        }
        self.failing_puts.store(left - 1, Ordering::SeqCst);
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
            self.put_fails()?;
            self.inner.put(dir, snapshot, key, retain_until).await
        })
    }

    fn fetch<'a>(&'a self, snapshot: &'a Snapshot, target: &'a Path) -> ShelfFuture<'a, ()> {
        self.inner.fetch(snapshot, target)
    }

    fn remove<'a>(&'a self, snapshot: &'a Snapshot) -> ShelfFuture<'a, ()> {
        self.inner.remove(snapshot)
    }

    fn put_archive<'a>(
        &'a self,
        archive: ArchiveSource,
        snapshot: &'a Snapshot,
        key: &'a str,
        retain_until: Option<SystemTime>,
    ) -> ShelfFuture<'a, ()> {
        Box::pin(async move {
            self.put_fails()?;
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
        Shelf::fetch_archive(&self.inner, snapshot, to)
    }
}

/// A bucket in a temporary directory.
struct Bucket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    shelf: Arc<Flaky>,
}

fn bucket() -> Bucket {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let url = format!("file://{}", path.display());
    let inner = ObjectSnapshots::open(&url, SnapshotsConfig::default()).unwrap();
    let shelf = Arc::new(Flaky {
        inner,
        failing_puts: AtomicU32::new(0),
    });
    Bucket {
        _dir: dir,
        path,
        shelf,
    }
}

async fn shelving_keeper(server: &Loopback, owner: &str, shelf: Arc<Flaky>) -> Keeper<K8sBackend> {
    let backend = connect(server, pod_config(owner)).await.with_shelf(shelf);
    let core = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    Keeper::new(KeeperConfig::with_core(core), backend).unwrap()
}

async fn call(
    keeper: &Keeper<K8sBackend>,
    name: &str,
    session: &SessionId,
) -> CallGuard<K8sBackend> {
    tokio::time::timeout(
        WAIT,
        keeper.acquire(CallSpec::new(CallId::new(name).unwrap(), session.clone())),
    )
    .await
    .expect("acquired in time")
    .unwrap()
}

/// Runs `argv` in the pod of the call's sandbox (no shell).
async fn run_in(
    keeper: &Keeper<K8sBackend>,
    guard: &CallGuard<K8sBackend>,
    argv: &[&str],
) -> Result<(), K8sError> {
    let h = keeper.backend().handle(guard.sandbox()).expect("started");
    keeper
        .backend()
        .cluster()
        .exec_with_stdin(
            &h.pod,
            argv.iter().map(|a| a.to_string()).collect(),
            Vec::new(),
        )
        .await
}

/// Polls the core's counters until `done` holds (no event marks a finished way down; bounded).
async fn stats_until(
    keeper: &Keeper<K8sBackend>,
    what: &str,
    done: impl Fn(&sandkeeper::Stats) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        while !done(&keeper.stats()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never: {what}: {:?}", keeper.stats()));
}

/// Closes the keeper (bounded), then its backend.
async fn close(keeper: &Keeper<K8sBackend>) {
    tokio::time::timeout(WAIT, keeper.close(Duration::from_secs(10)))
        .await
        .unwrap();
    keeper.backend().close().await.unwrap();
}

fn pod_exists(server: &Loopback, pod: &str) -> bool {
    server.store().get(&PODS, NS, pod).is_ok()
}

/// The first call's work: a directory made in the pod, a link out of the workspace, a FIFO,
/// and the session log through the mirror.
async fn first_work(
    keeper: &Keeper<K8sBackend>,
    guard: &CallGuard<K8sBackend>,
    session: &SessionId,
) {
    run_in(keeper, guard, &["mkdir", "-p", "/workspace/made-in-call-1"])
        .await
        .unwrap();
    run_in(
        keeper,
        guard,
        &["ln", "-s", "/etc", "/workspace/made-in-call-1/etc-link"],
    )
    .await
    .unwrap();
    run_in(keeper, guard, &["mkfifo", "/workspace/made-in-call-1/pipe"])
        .await
        .unwrap();
    keeper
        .flush(
            session,
            &PathName::session_log(),
            b"{\"turn\":1}\n".to_vec(),
        )
        .unwrap();
    tokio::time::timeout(WAIT, keeper.mirror_settled(session))
        .await
        .unwrap();
}

/// The second call sees the first call's work.
async fn sees_first_work(
    keeper: &Keeper<K8sBackend>,
    guard: &CallGuard<K8sBackend>,
    server: &Loopback,
    session: &SessionId,
) {
    run_in(keeper, guard, &["test", "-d", "/workspace/made-in-call-1"])
        .await
        .expect("the directory came back");
    run_in(
        keeper,
        guard,
        &["test", "-L", "/workspace/made-in-call-1/etc-link"],
    )
    .await
    .expect("the link came back as a link");
    let h = keeper.backend().handle(guard.sandbox()).unwrap();
    let log = server.pod_path(
        NS,
        &h.pod,
        &format!("/workspace/{}/session.log", session.as_str()),
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        b"{\"turn\":1}\n",
        "{}",
        log.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_pod_goes_to_the_shelf_and_the_next_call_gets_its_workspace_back() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let server = server().await;
    let bucket = bucket();
    let keeper = shelving_keeper(&server, "shelf-a", bucket.shelf.clone()).await;
    let session = SessionId::new("s1").unwrap();

    let first = call(&keeper, "c1", &session).await;
    let first_sandbox = first.sandbox();
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first_work(&keeper, &first, &session).await;
    first.release().await;
    stats_until(&keeper, "suspended", |s| s.suspended >= 1).await;
    assert!(
        !pod_exists(&server, &h1.pod),
        "the pod is deleted once shelved"
    );

    let name = SnapshotName::new(first_sandbox, "shelf-a").unwrap();
    let manifest = bucket.shelf.inner.manifest(&name).await.unwrap();
    let key = manifest.key.clone().unwrap_or_default();
    assert!(key.contains("s1"), "the manifest names the key: {key:?}");
    let paths: Vec<_> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"made-in-call-1/etc-link"), "{paths:?}");
    assert!(paths.contains(&"s1/session.log"), "{paths:?}");
    assert!(
        manifest
            .skipped
            .iter()
            .any(|s| s.path == "made-in-call-1/pipe" && s.why == "a FIFO"),
        "{:?}",
        manifest.skipped
    );

    let second = call(&keeper, "c2", &session).await;
    assert_ne!(second.sandbox(), first_sandbox);
    sees_first_work(&keeper, &second, &server, &session).await;
    let stats = keeper.stats();
    assert_eq!(stats.deaths, 0, "a suspension is no death: {stats:?}");
    assert_eq!(stats.shutdowns_ordered, 0, "{stats:?}");
    second.release().await;
    stats_until(&keeper, "suspended again", |s| s.suspended >= 2).await;
    close(&keeper).await;
    assert!(
        owned_by(&server, "shelf-a").is_empty(),
        "{:?}",
        owned_by(&server, "shelf-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_always_fails_leaves_the_pod_and_the_next_call_takes_the_workspace_from_it() {
    let server = server().await;
    let bucket = bucket();
    let keeper = shelving_keeper(&server, "shelf-b", bucket.shelf.clone()).await;
    let session = SessionId::new("s1").unwrap();

    let first = call(&keeper, "c1", &session).await;
    let first_sandbox = first.sandbox();
    let h1 = keeper.backend().handle(first.sandbox()).unwrap();
    first_work(&keeper, &first, &session).await;
    bucket.shelf.failing_puts.store(1000, Ordering::SeqCst);
    first.release().await;
    stats_until(&keeper, "every Persist failed", |s| s.left_as_is >= 1).await;
    assert!(keeper.stats().persists_failed >= 3);
    assert!(
        pod_exists(&server, &h1.pod),
        "the salvaged snapshot's pod is its only copy"
    );
    let name = SnapshotName::new(first_sandbox, "shelf-b").unwrap();
    assert!(
        bucket.shelf.inner.manifest(&name).await.is_err(),
        "nothing on the shelf"
    );

    bucket.shelf.failing_puts.store(0, Ordering::SeqCst);
    let second = call(&keeper, "c2", &session).await;
    sees_first_work(&keeper, &second, &server, &session).await;
    assert!(
        !pod_exists(&server, &h1.pod),
        "taken through the shelf, the old pod is deleted"
    );
    // Put on the shelf to be resumed, then discarded as taken once the new sandbox is up: the
    // Discard runs beside the call, so this polls the bucket (bounded: 30 s).
    tokio::time::timeout(WAIT, async {
        while bucket.shelf.inner.manifest(&name).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("what the start left on the shelf is discarded once its sandbox is up");
    assert!(keeper.stats().discards >= 1);
    sees_first_work(&keeper, &second, &server, &session).await;
    second.release().await;
    close(&keeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_damaged_on_the_shelf_fails_the_start_and_resumes_once_mended() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let server = server().await;
    let bucket = bucket();
    let keeper = shelving_keeper(&server, "shelf-c", bucket.shelf.clone()).await;
    let session = SessionId::new("s1").unwrap();

    let first = call(&keeper, "c1", &session).await;
    let first_sandbox = first.sandbox();
    first_work(&keeper, &first, &session).await;
    first.release().await;
    stats_until(&keeper, "suspended", |s| s.suspended >= 1).await;

    let name = SnapshotName::new(first_sandbox, "shelf-c").unwrap();
    let manifest = bucket.shelf.inner.manifest(&name).await.unwrap();
    let data = bucket.path.join(name.to_string()).join(&manifest.data);
    let good = std::fs::read(&data).unwrap();
    let mut bad = good.clone();
    bad[700] ^= 0xff;
    std::fs::write(&data, &bad).unwrap();

    let pods_before = server.store().all(&PODS).len();
    let refused = tokio::time::timeout(
        WAIT,
        keeper.acquire(CallSpec::new(CallId::new("c2").unwrap(), session.clone())),
    )
    .await
    .expect("answered in time");
    assert!(refused.is_err(), "a damaged snapshot is never a workspace");
    assert_eq!(
        server.store().all(&PODS).len(),
        pods_before,
        "the new pod was deleted"
    );

    std::fs::write(&data, &good).unwrap();
    let third = call(&keeper, "c3", &session).await;
    sees_first_work(&keeper, &third, &server, &session).await;
    third.release().await;
    close(&keeper).await;
}

#[tokio::test]
async fn pod_mode_with_a_shelf_serves_suspend_and_agent_sandbox_mode_refuses_one() {
    let server = server().await;
    let bucket = bucket();
    let suspend = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    let pods = connect(&server, pod_config("shelf-d"))
        .await
        .with_shelf(bucket.shelf.clone());
    assert_eq!(pods.check_config(&suspend), Ok(()));
    pods.close().await.unwrap();
    let claims = connect(&server, claim_config("shelf-e"))
        .await
        .with_shelf(bucket.shelf.clone());
    let why = claims.check_config(&Config::default()).unwrap_err();
    assert!(why.contains("a shelf is for pod mode"), "{why}");
    claims.close().await.unwrap();
}
