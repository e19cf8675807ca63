//! LocalBackend end to end: real directories, real files, real processes.
#![cfg(not(loom))]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Config, Event, PathName, SandboxId, SessionId, Settlement, Version,
};
use sandkeeper_tokio::local::{LocalConfig, RunError};
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend, Notice, Released};

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_sessions_leave_no_sandbox_and_every_log_is_there_or_reported() {
    let root = root("e2e");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let config = KeeperConfig {
        notice_capacity: 1 << 16,
        ..KeeperConfig::with_core(Config::default())
    };
    let keeper = Keeper::new(config, backend).unwrap();
    let mut notices = keeper.subscribe();

    const SESSIONS: usize = 24;
    const CALLS: usize = 3;
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let keeper = keeper.clone();
        tasks.push(tokio::spawn(async move {
            let session = sid(&format!("s{s}"));
            let mut log = String::new();
            let mut flushed: Vec<(Version, String)> = Vec::new();
            for c in 0..CALLS {
                let call = CallId::new(format!("s{s}-c{c}")).unwrap();
                let guard = keeper
                    .acquire(CallSpec::new(call, session.clone()))
                    .await
                    .unwrap();
                assert_eq!(keeper.resolve(&session).unwrap(), guard.sandbox());
                for turn in 0..3 {
                    log.push_str(&format!("{{\"call\":{c},\"turn\":{turn}}}\n"));
                    let v = keeper
                        .flush(&session, &PathName::session_log(), log.clone().into_bytes())
                        .unwrap();
                    flushed.push((v, log.clone()));
                }
                let out = keeper
                    .backend()
                    .run(guard.sandbox(), &["printf", "%s", "a; rm -rf / $(x)"], None)
                    .await
                    .unwrap();
                assert_eq!(
                    out.stdout, b"a; rm -rf / $(x)",
                    "argv reaches the program as is"
                );
                assert_eq!(guard.release().await, Released::Completed);
            }
            (session, flushed)
        }));
    }
    let mut flushed = BTreeMap::new();
    for t in tasks {
        let (session, versions) = t.await.unwrap();
        flushed.insert(session, versions);
    }
    let report = keeper.close(Duration::from_secs(5)).await;
    assert!(report.unconfirmed.is_empty(), "{report:?}");
    keeper.check_invariants().unwrap();

    // No sandbox directory remains.
    assert_eq!(
        keeper.backend().sandbox_dirs_present().unwrap(),
        Vec::<PathBuf>::new()
    );

    // Every flushed version settled exactly once.
    let mut settled: BTreeMap<(SessionId, Version), Settlement> = BTreeMap::new();
    while let Ok(notice) = notices.try_recv() {
        if let Notice::Event(Event::Settled {
            session,
            version,
            outcome,
            ..
        }) = notice
        {
            assert!(
                settled.insert((session, version), outcome).is_none(),
                "settled twice"
            );
        }
    }
    let total: usize = flushed.values().map(Vec::len).sum();
    assert_eq!(settled.len(), total);

    // Each key keeps exactly one snapshot, its latest: every Stop renamed the workspace to a
    // snapshot and the key's next Start took it back, so the files travel along the key's
    // sandboxes and nothing is left behind. A session's snapshot holds the newest version
    // uploaded into any of its sandboxes.
    let mut newest: BTreeMap<SessionId, Version> = BTreeMap::new();
    for ((session, version), outcome) in &settled {
        if let Settlement::Uploaded { .. } = outcome {
            let slot = newest.entry(session.clone()).or_insert(*version);
            *slot = (*slot).max(*version);
        }
    }
    assert!(!newest.is_empty());
    let snapshots: Vec<PathBuf> = std::fs::read_dir(keeper.backend().snapshots_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        snapshots.len(),
        SESSIONS,
        "one snapshot per key: {snapshots:?}"
    );
    let mut seen = 0;
    for snapshot in &snapshots {
        let name = snapshot.file_name().unwrap().to_string_lossy();
        let record = keeper
            .backend()
            .snapshot_record(&sandkeeper::Snapshot::new(name))
            .unwrap()
            .expect("recorded");
        let key = record.taken_from.key.as_str();
        let session = sid(key.strip_prefix("session:").unwrap_or(key));
        let Some(version) = newest.get(&session) else {
            continue;
        };
        let file = snapshot
            .join(".sandkeeper")
            .join(session.as_str())
            .join("session.log");
        let on_disk = std::fs::read_to_string(&file).unwrap();
        let expected = &flushed[&session]
            .iter()
            .find(|(v, _)| v == version)
            .unwrap()
            .1;
        assert_eq!(&on_disk, expected, "{}", file.display());
        seen += 1;
    }
    assert_eq!(
        seen,
        newest.len(),
        "every session with an upload has its snapshot"
    );
    for (session, versions) in &flushed {
        let (last, _) = versions.last().unwrap();
        let outcome = &settled[&(session.clone(), *last)];
        assert!(
            matches!(
                outcome,
                Settlement::Uploaded { .. } | Settlement::Dropped { .. }
            ),
            "{session} v{last}: {outcome:?}"
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_directory_removed_from_outside_is_reported_as_a_death() {
    let root = root("death");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let keeper = Keeper::new(KeeperConfig::default(), backend).unwrap();
    let session = sid("s");
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("c").unwrap(), session.clone()))
        .await
        .unwrap();
    let dir = keeper.backend().sandbox_dir(guard.sandbox());
    assert!(dir.is_dir());
    std::fs::remove_dir_all(&dir).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.is_lost());
    assert!(keeper.resolve(&session).is_err());
    assert_eq!(keeper.stats().deaths, 1);
    assert_eq!(guard.release().await, Released::Completed);
    keeper.close(Duration::from_secs(1)).await;
    keeper.check_invariants().unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_is_argv_only_runs_in_the_sandbox_and_refuses_unknown_sandboxes() {
    let root = root("run");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let keeper = Keeper::new(KeeperConfig::default(), backend).unwrap();
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("c").unwrap(), sid("s")))
        .await
        .unwrap();
    let x = guard.sandbox();
    let b = keeper.backend();
    let out = b.run(x, &["pwd"], None).await.unwrap();
    assert_eq!(out.code, Some(0));
    let pwd = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        PathBuf::from(pwd.trim()).canonicalize().unwrap(),
        b.sandbox_dir(x).canonicalize().unwrap()
    );
    let out = b.run(x, &["ls", "-a", "; echo pwned"], None).await.unwrap();
    assert_ne!(
        out.code,
        Some(0),
        "the odd name is one argument, a file that is not there"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("pwned"));
    assert!(matches!(
        b.run(x, &[] as &[&str], None).await,
        Err(RunError::EmptyArgv)
    ));
    assert!(matches!(
        b.run(SandboxId(99), &["true"], None).await,
        Err(RunError::NoSandbox(_))
    ));
    drop(guard);
    keeper.close(Duration::from_secs(1)).await;
    assert!(matches!(
        keeper.backend().run(x, &["true"], None).await,
        Err(RunError::NoSandbox(_))
    ));
    assert!(keeper.backend().sandbox_dirs_present().unwrap().is_empty());
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_kills_a_process_at_its_timeout() {
    // Under the paused clock the timeout elapses as soon as the runtime is idle: no wall-clock
    // wait, and `sleep 30` is killed.
    let root = root("run-timeout");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let keeper = Keeper::new(KeeperConfig::default(), backend).unwrap();
    let guard = keeper
        .acquire(CallSpec::new(CallId::new("c").unwrap(), sid("s")))
        .await
        .unwrap();
    let slow = keeper
        .backend()
        .run(
            guard.sandbox(),
            &["sleep", "30"],
            Some(Duration::from_millis(100)),
        )
        .await;
    assert!(matches!(slow, Err(RunError::Timeout(_))), "{slow:?}");
    drop(guard);
    keeper.close(Duration::from_secs(1)).await;
    std::fs::remove_dir_all(&root).unwrap();
}

/// The main job's workload under `Suspend` (`harness --suspend`): every sandbox is suspended at
/// its last release and none is shut down (no deaths injected); each suspended one keeps its
/// directory, every other check of the workload holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_under_suspend_keeps_exactly_the_suspended_sandboxes() {
    use sandkeeper_tokio::workload::{self, WorkloadOptions};

    let options = WorkloadOptions {
        sessions: 8,
        users: 3,
        calls: 3,
        concurrency: 4,
        death_rate: 0.0,
        suspend: true,
        quiet: true,
        ..WorkloadOptions::default()
    };
    let backend = LocalBackend::new(LocalConfig::new(root("suspend"))).unwrap();
    let summary = workload::run(backend, &options).await.unwrap();
    assert!(summary.ok(), "{:?}", summary.failures);
    assert!(summary.stats.suspended >= 1, "{:?}", summary.stats);
    assert_eq!(summary.stats.shutdowns_ordered, 0, "{:?}", summary.stats);
    assert_eq!(summary.stats.calls_released, 24);
}
