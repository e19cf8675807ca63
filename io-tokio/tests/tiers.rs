//! Release tiers on the local backend: a warm hit binds the live sandbox, a suspension renames
//! the workspace to a snapshot that records its expiry, a resume renames it back (the same
//! files, not copies), the retention's end discards it, and a backend made on the same root
//! later sweeps what expired and keeps the rest.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandkeeper::{CallId, CallSpec, Config, ReleasePolicy, SessionId, Tiers, WayDown};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend, Released};

fn root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("sk-tiers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn spec(call: &str) -> CallSpec {
    CallSpec::new(CallId::new(call).unwrap(), SessionId::new("s").unwrap())
}

fn snapshots(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    found
}

fn tiered(idle: u64, retain: u64) -> KeeperConfig {
    KeeperConfig::with_core(Config {
        release: ReleasePolicy::Tiered(Tiers {
            idle: Duration::from_secs(idle),
            then: WayDown::Suspend,
            retain: Some(Duration::from_secs(retain)),
        }),
        ..Config::default()
    })
}

#[tokio::test(start_paused = true)]
async fn warm_then_suspended_by_rename_then_resumed_then_discarded() {
    let root = root("ladder");
    #[allow(clippy::disallowed_methods)] // the expiry is on the wall clock, as the backend's
    let wall_at_start = SystemTime::now();
    let start = tokio::time::Instant::now();
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let keeper = Keeper::new(tiered(10, 60), backend).unwrap();
    let snapshot_dir = keeper.backend().snapshots_dir();

    // A call writes into its workspace.
    let guard = keeper.acquire(spec("c1")).await.unwrap();
    let first = guard.sandbox();
    guard
        .work()
        .write("data/big.bin", vec![7u8; 1 << 20])
        .await
        .unwrap();
    let inode = std::fs::metadata(keeper.backend().sandbox_dir(first).join("data/big.bin"))
        .unwrap()
        .ino();
    assert_eq!(guard.release().await, Released::Completed);

    // Back within the warm tier: the same live sandbox, no start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let guard = keeper.acquire(spec("c2")).await.unwrap();
    assert_eq!(guard.sandbox(), first);
    assert_eq!(keeper.stats().revivals, 1);
    assert_eq!(keeper.stats().starts_ordered, 1);
    assert_eq!(guard.release().await, Released::Completed);

    // Idle past the tier: suspended. The workspace was renamed, not copied: it exists once.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(keeper.stats().suspended, 1);
    assert!(!keeper.backend().sandbox_dir(first).exists());
    assert_eq!(
        keeper.backend().running(),
        0,
        "a suspended sandbox no longer runs"
    );
    let kept = snapshots(&snapshot_dir);
    assert_eq!(kept.len(), 1, "{kept:?}");
    // What is kept, and until when, is the keeper's record, outside the workspace.
    let kept_name = sandkeeper::Snapshot::new(kept[0].file_name().unwrap().to_string_lossy());
    let record = keeper
        .backend()
        .snapshot_record(&kept_name)
        .unwrap()
        .unwrap();
    assert!(record.persisted);
    assert!(!kept[0].join(".sandkeeper/persisted").exists());
    let expires = record.expires.unwrap();
    // The keeper maps its clock to the wall clock from one reading at its start, so on
    // tokio's paused clock the wall clock it records moves with virtual time.
    let now = (wall_at_start + start.elapsed())
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The retention (60 s) from the Persist's deadline (the command timeout, 30 s): never
    // earlier than the core's own discard, at most a command timeout later.
    assert!(
        expires >= now + 60 && expires <= now + 92,
        "expires {expires}, now {now}"
    );
    assert_eq!(
        std::fs::metadata(kept[0].join("data/big.bin"))
            .unwrap()
            .ino(),
        inode,
        "the snapshot is the workspace itself"
    );

    // Back within the retention: resumed into a new sandbox, which takes the snapshot (the same
    // file, renamed back), and the markers of a kept snapshot are gone from it.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let guard = keeper.acquire(spec("c3")).await.unwrap();
    let second = guard.sandbox();
    assert_ne!(second, first);
    assert_eq!(keeper.stats().resumes_ordered, 1);
    let dir = keeper.backend().sandbox_dir(second);
    assert_eq!(
        std::fs::metadata(dir.join("data/big.bin")).unwrap().ino(),
        inode
    );
    assert!(!dir.join(".sandkeeper/persisted").exists());
    assert!(!dir.join(".sandkeeper/expires").exists());
    assert_eq!(keeper.backend().snapshot_record(&kept_name).unwrap(), None);
    assert!(snapshots(&snapshot_dir).is_empty(), "the start took it");
    // Once up, the core discards what the start left of it (`taken`): nothing, here.
    assert_eq!(keeper.stats().discards, 1);
    assert_eq!(guard.release().await, Released::Completed);

    // Suspended again, then nobody comes back: the retention's end discards it.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(keeper.stats().suspended, 2);
    assert_eq!(snapshots(&snapshot_dir).len(), 1);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(keeper.stats().discards, 1, "not before the retention ends");
    assert_eq!(snapshots(&snapshot_dir).len(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(keeper.stats().discards, 2);
    assert!(snapshots(&snapshot_dir).is_empty());

    // After the retention: a fresh workspace.
    let guard = keeper.acquire(spec("c4")).await.unwrap();
    assert!(!guard.work().exists("data/big.bin").await.unwrap());
    assert_eq!(keeper.stats().resumes_ordered, 1);
    assert_eq!(guard.release().await, Released::Completed);
    keeper.close(Duration::from_secs(1)).await;
    keeper.check_invariants().unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// A keeper that crashed leaves its suspended workspaces with their expiry recorded: the next
/// backend on the root removes those whose retention ended, with their records, and keeps the
/// others (and those kept without a retention), no earlier. A snapshot an older keeper kept
/// (its expiry inside the workspace, no record) is kept: never judged from its workspace.
#[test]
fn the_sweep_removes_expired_snapshots_and_keeps_the_rest() {
    use sandkeeper_tokio::local::meta::{record_snapshot, snapshot_record, SnapshotRecord};
    let root = root("sweep");
    let snaps = root.join(".snapshots");
    let kept_until = |name: &str, expires: Option<u64>| {
        let record = SnapshotRecord {
            taken_from: sandkeeper_tokio::local::meta::StartedFor {
                sandbox: 1,
                key: "session:s".into(),
                spec: None,
                resumed_from: None,
            },
            persisted: true,
            expires,
        };
        record_snapshot(&root, &sandkeeper::Snapshot::new(name), &record).unwrap();
        std::fs::create_dir_all(snaps.join(name)).unwrap();
    };
    #[allow(clippy::disallowed_methods)] // the expiries are on the wall clock
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    kept_until("sbx-1-old", Some(now - 10));
    kept_until("sbx-2-old", Some(now + 3_600));
    kept_until("sbx-3-old", None);
    let legacy = snaps.join("sbx-4-old/.sandkeeper");
    std::fs::create_dir_all(&legacy).unwrap();
    std::fs::write(legacy.join("persisted"), "persisted\n").unwrap();
    std::fs::write(legacy.join("expires"), format!("{}\n", now - 10)).unwrap();
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let left: Vec<String> = snapshots(&snaps)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["sbx-2-old", "sbx-3-old", "sbx-4-old"]);
    let gone = sandkeeper::Snapshot::new("sbx-1-old");
    assert_eq!(
        snapshot_record(&root, &gone).unwrap(),
        None,
        "its record with it"
    );
    // An hour on, the second one goes too; the one without an expiry stays, and the older
    // keeper's.
    let later = SystemTime::UNIX_EPOCH + Duration::from_secs(now + 3_600);
    assert_eq!(backend.sweep_expired(later).unwrap(), 1);
    assert_eq!(snapshots(&snaps).len(), 2);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Hooks on the local backend: the after-start hook writes into the workspace before the call
/// is ready (the call reads it), the before-suspend hook writes before the Stop (the snapshot
/// holds it); an after-start hook that fails fails its call with `hook-failed`, and its
/// sandbox's directory is gone. A configuration with hook timeouts and no hooks is refused.
#[tokio::test(start_paused = true)]
async fn hooks_run_in_the_sandbox_at_their_places() {
    use sandkeeper::{ErrorKind, HookPoint, Hooks};
    use sandkeeper_tokio::KeeperError;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let root = root("hooks");
    let config = || {
        KeeperConfig::with_core(Config {
            release: ReleasePolicy::Suspend,
            hooks: Hooks {
                after_start: Some(Duration::from_secs(5)),
                before_suspend: Some(Duration::from_secs(5)),
                ..Hooks::default()
            },
            ..Config::default()
        })
    };
    let refused = Keeper::new(
        config(),
        LocalBackend::new(LocalConfig::new(&root)).unwrap(),
    );
    assert!(
        matches!(&refused, Err(KeeperError::Unsupported(why)) if why.contains("with_hooks")),
        "{:?}",
        refused.err()
    );

    let fail_next = Arc::new(AtomicBool::new(false));
    let keeper = Keeper::with_hooks(
        config(),
        LocalBackend::new(LocalConfig::new(&root)).unwrap(),
        {
            let fail_next = fail_next.clone();
            move |point, work| {
                let fail = fail_next.swap(false, Ordering::SeqCst);
                async move {
                    if fail {
                        return Err("credential service unreachable".to_string());
                    }
                    let what = match point {
                        HookPoint::AfterStart => "credentials/token",
                        HookPoint::BeforeSuspend => "checkpoint",
                        other => return Err(format!("unexpected {other:?}")),
                    };
                    work.write(what, format!("{}", work.sandbox().0))
                        .await
                        .map_err(|e| e.to_string())
                }
            }
        },
    )
    .unwrap();
    let guard = keeper.acquire(spec("c1")).await.unwrap();
    let x = guard.sandbox();
    assert_eq!(
        guard.work().read("credentials/token").await.unwrap(),
        x.0.to_string().into_bytes()
    );
    assert_eq!(guard.release().await, Released::Completed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(keeper.stats().suspended, 1);
    let kept = snapshots(&keeper.backend().snapshots_dir());
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].join("checkpoint").exists(),
        "written before the Stop"
    );

    // A failing after-start hook (a second session: a fresh start) fails its call.
    fail_next.store(true, Ordering::SeqCst);
    let failed = keeper
        .acquire(CallSpec::new(
            CallId::new("c2").unwrap(),
            SessionId::new("t").unwrap(),
        ))
        .await;
    let Err(KeeperError::CallFailed { error, .. }) = failed else {
        panic!("{failed:?}");
    };
    assert_eq!(error, ErrorKind::HookFailed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(keeper.backend().sandbox_dirs_present().unwrap().is_empty());
    assert_eq!(keeper.stats().hooks_failed, 1);
    assert_eq!(keeper.tally().hooks_failed.get("after-start"), Some(&1));
    keeper.close(Duration::from_secs(1)).await;
    keeper.check_invariants().unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Waits until the keeper forgot `sandbox` (its way down ended: `Keeper::sandbox_down`). A
/// completed release says the session's mirror settled, not that the Stop and Persist or
/// Shutdown ran: those are real renames and removals, bounded here by ten seconds (far above
/// their milliseconds).
async fn gone(keeper: &Keeper<LocalBackend>, sandbox: sandkeeper::SandboxId) {
    tokio::time::timeout(Duration::from_secs(10), keeper.sandbox_down(sandbox))
        .await
        .unwrap_or_else(|_| panic!("{sandbox} still tracked after ten seconds"));
    assert_eq!(keeper.sandbox_state(sandbox), None);
}

/// `release_as`, what sandkeeperd's pause and kill are: under the default policy (shut down at
/// the last release, no snapshots), a release asking `Suspend` keeps the workspace for the
/// key's next call, which resumes it with its files; a release asking `Shutdown` of that
/// resumed sandbox deletes it, and the key's next call starts empty.
#[tokio::test]
async fn release_as_pauses_and_kills_whatever_the_policy() {
    let root = root("release-as");
    let config = LocalConfig {
        snapshots: false,
        ..LocalConfig::new(&root)
    };
    let backend = LocalBackend::new(config).unwrap();
    let keeper = Keeper::new(KeeperConfig::default(), backend).unwrap();
    let snapshot_dir = keeper.backend().snapshots_dir();

    let guard = keeper.acquire(spec("c1")).await.unwrap();
    let first = guard.sandbox();
    guard
        .work()
        .write("notes.txt", b"kept".to_vec())
        .await
        .unwrap();
    assert_eq!(
        guard.release_as(WayDown::Suspend).await,
        Released::Completed
    );
    gone(&keeper, first).await;
    assert_eq!(keeper.stats().suspended, 1);
    assert!(!keeper.backend().sandbox_dir(first).exists());
    assert_eq!(
        snapshots(&snapshot_dir).len(),
        1,
        "the paused workspace is kept"
    );

    let guard = keeper.acquire(spec("c2")).await.unwrap();
    let resumed = guard.sandbox();
    assert_ne!(resumed, first);
    assert_eq!(keeper.stats().resumes_ordered, 1);
    assert_eq!(guard.work().read("notes.txt").await.unwrap(), b"kept");
    assert_eq!(
        guard.release_as(WayDown::Shutdown).await,
        Released::Completed
    );
    gone(&keeper, resumed).await;
    assert!(!keeper.backend().sandbox_dir(resumed).exists());
    assert!(snapshots(&snapshot_dir).is_empty(), "a kill keeps nothing");

    let guard = keeper.acquire(spec("c3")).await.unwrap();
    assert!(
        guard.work().read("notes.txt").await.is_err(),
        "fresh after a kill"
    );
    assert_eq!(guard.release().await, Released::Completed);
    keeper.close(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&root);
}
