//! Fleet mode's fencing at the local backend: a change under a token older than the newest its
//! sandbox, or any sandbox of its key, has seen is refused with `FailureClass::Fenced`, and
//! nothing changes (the directory and its files stay as they were). And the adoption of a
//! sandbox whose owner stopped it and crashed before its key's record said so, and the start
//! from a snapshot that a crashed owner's start had already taken.
#![cfg(not(loom))]

use std::path::PathBuf;

use sandkeeper::{
    Key, PathName, Payload, SandboxId, SessionId, Snapshot, Spec, Token, UploadId, Version,
};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{
    AdoptRequest, Backend, FailureClass, LocalBackend, PersistRequest, StartRequest, StopRequest,
    UploadRequest,
};

fn root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("sk-fencing-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

/// Every file under `dir`, with its bytes, in path order.
fn contents(dir: &std::path::Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}

fn start(sandbox: SandboxId, key: &Key, token: u64) -> StartRequest {
    StartRequest {
        sandbox,
        key: key.clone(),
        spec: Spec::new(""),
        resume_from: None,
        resumes: None,
        token: Some(Token(token)),
    }
}

fn upload(sandbox: SandboxId, version: u64, token: u64) -> UploadRequest {
    UploadRequest {
        upload: UploadId(version),
        sandbox,
        session: SessionId::new("s").unwrap(),
        path: PathName::session_log(),
        version: Version(version),
        payload: Payload::new(format!("v{version}").into_bytes()),
        token: Some(Token(token)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_refused_on_its_own_sandbox_and_on_a_new_one_of_the_key() {
    let root = root("stale");
    let backend = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let key = Key::Session(SessionId::new("s").unwrap());
    let (old, new) = (SandboxId(1 << 32), SandboxId(2 << 32));
    backend.start(start(old, &key, 3)).await.unwrap();
    backend.upload(upload(old, 1, 3)).await.unwrap();
    // The key's next owner (token 4) starts its own sandbox of the key.
    backend.start(start(new, &key, 4)).await.unwrap();
    // The stale owner (token 3): its upload, stop and shutdown of its own sandbox, and a start
    // of another sandbox of the key, are all refused.
    let before = contents(&backend.sandbox_dir(old));
    assert!(!before.is_empty());
    let e = backend.upload(upload(old, 2, 3)).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Fenced, "{e}");
    let e = backend
        .stop(StopRequest {
            sandbox: old,
            suspend: true,
            token: Some(Token(3)),
        })
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Fenced, "{e}");
    let e = backend.shutdown(old, Some(Token(3))).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Fenced, "{e}");
    let e = backend
        .start(start(SandboxId(1 << 32 | 1), &key, 3))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Fenced, "{e}");
    assert_eq!(
        contents(&backend.sandbox_dir(old)),
        before,
        "nothing written, nothing removed"
    );
    assert!(!backend.sandbox_dir(SandboxId(1 << 32 | 1)).exists());
    // The owner's token works, and a key no process owns is not checked.
    backend.upload(upload(new, 1, 4)).await.unwrap();
    let mut free = upload(SandboxId(7), 1, 0);
    free.token = None;
    let other = Key::Session(SessionId::new("t").unwrap());
    let mut unfenced = start(SandboxId(7), &other, 0);
    unfenced.token = None;
    backend.start(unfenced).await.unwrap();
    backend.upload(free).await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// Starts `x` under token 1, uploads version 1 and suspends it: its snapshot.
async fn started_and_suspended(backend: &LocalBackend, x: SandboxId, key: &Key) -> Snapshot {
    backend.start(start(x, key, 1)).await.unwrap();
    backend.upload(upload(x, 1, 1)).await.unwrap();
    backend
        .stop(StopRequest {
            sandbox: x,
            suspend: true,
            token: Some(Token(1)),
        })
        .await
        .unwrap()
        .expect("a suspension keeps a snapshot")
}

/// An owner stopped its sandbox (suspending it: the workspace renamed to its snapshot,
/// persisted) and crashed before the key's record said so: the record still names the
/// sandbox. The next owner's adoption takes the workspace back, whole, as a live sandbox; a
/// sandbox with neither a directory nor a snapshot of its own is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_a_sandbox_its_crashed_owner_had_stopped_takes_its_workspace_back() {
    let root = root("stopped-adopt");
    let key = Key::Session(SessionId::new("s").unwrap());
    let x = SandboxId(1 << 32 | 1);
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let snapshot = started_and_suspended(&first, x, &key).await;
    first
        .persist(PersistRequest {
            sandbox: x,
            snapshot: Some(snapshot),
            suspend: true,
            retain_until: Some(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(4_000_000_000),
            ),
            token: Some(Token(1)),
        })
        .await
        .unwrap();
    assert!(!first.sandbox_dir(x).exists());
    assert_eq!(first.snapshot_dirs_present().unwrap().len(), 1);
    drop(first); // crashed before writing the record

    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    second
        .adopt(AdoptRequest {
            sandbox: x,
            key: key.clone(),
            token: Token(2),
        })
        .await
        .unwrap();
    let log = second.session_file(x, &SessionId::new("s").unwrap(), &PathName::session_log());
    assert_eq!(std::fs::read(&log).unwrap(), b"v1");
    assert!(second.snapshot_dirs_present().unwrap().is_empty());
    let meta = second.sandbox_dir(x).join(".sandkeeper");
    assert!(!meta.join("persisted").exists() && !meta.join("expires").exists());
    // It is live again: the new owner uploads into it.
    second.upload(upload(x, 2, 2)).await.unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), b"v2");

    let e = second
        .adopt(AdoptRequest {
            sandbox: SandboxId(1 << 32 | 2),
            key,
            token: Token(3),
        })
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Gone, "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

/// An owner started a sandbox from the key's snapshot (the start takes it: a rename), uploaded
/// into it, and crashed before the key's record named the new sandbox: the record still names
/// the snapshot. The next owner's start from that snapshot continues the workspace the crashed
/// start took, with what was uploaded there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_from_a_snapshot_a_crashed_start_took_continues_its_workspace() {
    let root = root("taken-resume");
    let key = Key::Session(SessionId::new("s").unwrap());
    let (x, y, z) = (
        SandboxId(1 << 32 | 1),
        SandboxId(2 << 32 | 1),
        SandboxId(3 << 32 | 1),
    );
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let snapshot = started_and_suspended(&first, x, &key).await;
    let resuming = |sandbox, token| StartRequest {
        resume_from: Some(snapshot.clone()),
        resumes: Some(x),
        ..start(sandbox, &key, token)
    };
    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    second.start(resuming(y, 2)).await.unwrap();
    second.upload(upload(y, 2, 2)).await.unwrap();
    drop(second); // crashed before the record named `y`

    let third = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    third.start(resuming(z, 3)).await.unwrap();
    let log = third.session_file(z, &SessionId::new("s").unwrap(), &PathName::session_log());
    assert_eq!(std::fs::read(&log).unwrap(), b"v2");
    assert!(!third.sandbox_dir(y).exists());
    let record = third.sandbox_record(z).unwrap().expect("recorded");
    assert_eq!(record.resumed_from.as_deref(), Some(snapshot.as_str()));
    assert_eq!(
        third.sandbox_record(y).unwrap(),
        None,
        "gone with its directory"
    );
    // A sandbox this backend runs is never taken: with nothing else left of the snapshot, a
    // start from it begins afresh.
    let w = SandboxId(3 << 32 | 2);
    third.start(resuming(w, 3)).await.unwrap();
    assert!(!third
        .session_file(w, &SessionId::new("s").unwrap(), &PathName::session_log())
        .exists());
    let _ = std::fs::remove_dir_all(&root);
}

/// The application's own work in a sandbox is fenced like the keeper's commands: once another
/// process (another backend on the same root) adopted the sandbox under a newer token, this
/// process's write, removal and command are refused (`OpError::Fenced`), even though its
/// backend still runs the sandbox (it never learnt of the takeover), and the workspace keeps
/// what the new owner wrote. Reads stay allowed (they change nothing). Without the check the
/// stale write replaced the new owner's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_process_s_operations_change_nothing_after_a_takeover() {
    use sandkeeper_tokio::ops::ExecRequest;
    use sandkeeper_tokio::{ExecOptions, OpError, SandboxOps, WorkPath};
    let root = root("stale-ops");
    let stale = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let next = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    let key = Key::Session(SessionId::new("s").unwrap());
    let x = SandboxId(1 << 32);
    stale.start(start(x, &key, 3)).await.unwrap();
    let path = || WorkPath::new("turns.txt").unwrap();
    stale.write(x, path(), b"turn 1\n".to_vec()).await.unwrap();
    next.adopt(AdoptRequest {
        sandbox: x,
        key: key.clone(),
        token: Token(4),
    })
    .await
    .unwrap();
    next.write(x, path(), b"turn 1\nturn 2\n".to_vec())
        .await
        .unwrap();

    let refused = stale.write(x, path(), b"stale\n".to_vec()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = stale.remove(x, path()).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    let touch = ExecRequest::new(
        vec!["touch".into(), "stale-was-here".into()],
        ExecOptions::default(),
    )
    .unwrap();
    let refused = stale.exec(x, touch).await;
    assert!(
        matches!(refused, Err(OpError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(
        stale.read(x, path(), 1 << 10).await.unwrap(),
        b"turn 1\nturn 2\n"
    );
    assert!(!next
        .exists(x, WorkPath::new("stale-was-here").unwrap())
        .await
        .unwrap());
    std::fs::remove_dir_all(&root).unwrap();
}
