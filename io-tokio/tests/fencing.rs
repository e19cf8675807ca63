//! Fleet mode's fencing at the local backend: a change under a token older than the newest its
//! sandbox, or any sandbox of its key, has seen is refused with `FailureClass::Fenced`, and
//! nothing changes (the directory and its files stay as they were).
#![cfg(not(loom))]

use std::path::PathBuf;

use sandkeeper::{Key, PathName, Payload, SandboxId, SessionId, Spec, Token, UploadId, Version};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{
    Backend, FailureClass, LocalBackend, StartRequest, StopRequest, UploadRequest,
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
