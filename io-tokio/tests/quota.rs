//! A workspace's disk quota (issue 31, item 3): writes past it fail typed, a command that wrote
//! past it leaves the workspace refusing writes and commands until the caller made room, and the
//! count never follows a link a command planted.
//!
//! The quota is the keeper's own count, so these hold with and without bubblewrap, as root and
//! not: they run under whatever isolation works here.
#![cfg(not(loom))]

use std::path::PathBuf;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Limits, LocalConfig};
use sandkeeper_tokio::{
    CallGuard, ExecOptions, Keeper, KeeperConfig, LocalBackend, OpError, OpErrorClass,
};

const QUOTA: u64 = 1 << 20;

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-quota-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A keeper whose sandboxes' workspaces may take 1 MiB.
fn keeper(name: &str) -> Keeper<LocalBackend> {
    let config = LocalConfig {
        limits: Limits {
            workspace_bytes: Some(QUOTA),
            ..Limits::default()
        },
        ..LocalConfig::new(root(name))
    };
    let backend = LocalBackend::new(config).unwrap();
    Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap()
}

async fn call(k: &Keeper<LocalBackend>, c: &str) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new(c).unwrap(),
        SessionId::new(format!("s-{c}")).unwrap(),
    ))
    .await
    .unwrap()
}

fn over_quota<T: std::fmt::Debug>(r: Result<T, OpError>) -> bool {
    match r {
        Err(e @ OpError::QuotaExceeded { limit, .. }) => {
            assert_eq!(limit, QUOTA);
            assert_eq!(e.class(), OpErrorClass::Limit);
            true
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
}

/// A write that would take the workspace past its quota writes nothing and fails
/// `QuotaExceeded`; replacing a file counts only the new size; removing makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_the_quota_fails_typed_and_writes_nothing() {
    let k = keeper("write");
    let g = call(&k, "a").await;
    let w = g.work();
    w.write("a", vec![1u8; 600 << 10]).await.unwrap();
    assert!(over_quota(w.write("b", vec![1u8; 600 << 10]).await));
    assert!(!w.exists("b").await.unwrap(), "nothing written");
    w.write("a", vec![2u8; 900 << 10]).await.unwrap();
    w.remove("a").await.unwrap();
    w.write("b", vec![3u8; 900 << 10]).await.unwrap();
    g.release().await;
    k.close(std::time::Duration::from_secs(5)).await;
}

/// A command writes 2 MiB into a 1 MiB workspace. Nothing in the kernel counts its writes: it
/// ends on its own, or, with one bubblewrap per sandbox, the keeper's watch may kill it first
/// (`QuotaExceeded`, when a walk of the workspace happens while it runs). Once it ended the
/// workspace refuses writes and commands, typed, until a removal made room; reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_wrote_past_the_quota_leaves_the_workspace_refusing_until_room_is_made() {
    let k = keeper("command");
    let g = call(&k, "a").await;
    let w = g.work();
    let ran = w
        .exec(
            ["sh", "-c", "head -c 2097152 /dev/zero > big && echo wrote"],
            ExecOptions::default(),
        )
        .await;
    let whole = match ran {
        Ok(out) => {
            assert_eq!(out.stdout, b"wrote\n", "{out:?}");
            true
        }
        watched => !over_quota(watched),
    };
    assert!(over_quota(w.exec(["true"], ExecOptions::default()).await));
    assert!(over_quota(w.write("small", b"x".to_vec()).await));
    let big = w.read_capped("big", 4 << 20).await.unwrap().len();
    if whole {
        assert_eq!(big, 2 << 20);
    } else {
        // The count is of blocks, the keeper's own files included: near the quota at least.
        assert!(
            big as u64 > QUOTA - (64 << 10),
            "killed before it reached the quota: {big}"
        );
    }
    w.remove("big").await.unwrap();
    let out = w.exec(["true"], ExecOptions::default()).await.unwrap();
    assert_eq!(out.code, Some(0));
    w.write("small", b"x".to_vec()).await.unwrap();
    g.release().await;
    k.close(std::time::Duration::from_secs(5)).await;
}

/// The count never follows a link: a link a command planted to a large host directory (and to
/// the root) costs nothing, and the workspace stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_never_follows_a_planted_link() {
    let k = keeper("links");
    let host = root("links-host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("large"), vec![9u8; 4 << 20]).unwrap();
    let g = call(&k, "a").await;
    let w = g.work();
    let plant = format!("ln -s {} host && ln -s / slash", host.display());
    let out = w
        .exec(["sh", "-c", plant.as_str()], ExecOptions::default())
        .await
        .unwrap();
    assert_eq!(out.code, Some(0), "{out:?}");
    w.write("f", vec![1u8; 512 << 10]).await.unwrap();
    let out = w.exec(["true"], ExecOptions::default()).await.unwrap();
    assert_eq!(out.code, Some(0));
    g.release().await;
    k.close(std::time::Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&host);
}
