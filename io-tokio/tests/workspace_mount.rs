//! A workspace mount (`LocalConfig::workspace_mount`): commands see their workspace at one
//! fixed path, `/home/user` here, in both bubblewrap modes (one per sandbox, through the
//! sandbox's init; one per command), and never its host path; files written through the
//! backend and by commands are the same files; a bad path, or a mount without bubblewrap, is
//! refused at construction.
//!
//! Tests that need bubblewrap skip (saying so) where it does not work, and fail instead when
//! `SANDKEEPER_REQUIRE_BWRAP` is set, as `.ci/run` sets it (as `containment.rs` does).
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Isolation, LocalConfig, Namespaces, WorkspaceMountError};
use sandkeeper_tokio::WorkPath;
use sandkeeper_tokio::{CallGuard, ExecOptions, ExecOutput, Keeper, KeeperConfig, LocalBackend};

/// Where the commands of these tests see their workspace.
const MOUNT: &str = "/home/user";

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-mnt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn required() -> bool {
    std::env::var_os("SANDKEEPER_REQUIRE_BWRAP").is_some()
}

/// A keeper whose sandboxes see their workspace at [`MOUNT`], with one bubblewrap per sandbox
/// or per command as `namespaces` asks; `None` (the test skips, saying why) where that mode
/// does not work here and `SANDKEEPER_REQUIRE_BWRAP` is unset.
fn mounted(name: &str, namespaces: Namespaces) -> Option<Keeper<LocalBackend>> {
    let config = LocalConfig {
        isolation: if required() {
            Isolation::Require
        } else {
            Isolation::Auto
        },
        namespaces,
        workspace_mount: Some(PathBuf::from(MOUNT)),
        ..LocalConfig::new(root(&format!("{name}-{namespaces:?}")))
    };
    let backend = match LocalBackend::new(config) {
        Ok(backend) => backend,
        // Bubblewrap does not work here (`Auto` fell back): the mount is refused.
        Err(e) if !required() => {
            eprintln!("skipped: {e}");
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    let per_sandbox = backend.isolation().init().is_some();
    if per_sandbox != (namespaces == Namespaces::PerSandbox) {
        // No init found: one per command, which the other run of the test covers.
        assert!(!required(), "{}", backend.isolation());
        eprintln!("skipped: {}", backend.isolation());
        return None;
    }
    assert_eq!(backend.workspace_mount(), Some(Path::new(MOUNT)));
    Some(Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap())
}

/// Both bubblewrap modes.
const MODES: [Namespaces; 2] = [Namespaces::PerSandbox, Namespaces::PerCommand];

async fn call(k: &Keeper<LocalBackend>, c: &str) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new(c).unwrap(),
        SessionId::new(format!("s-{c}")).unwrap(),
    ))
    .await
    .unwrap()
}

async fn sh_in(g: &CallGuard<LocalBackend>, cwd: &str, script: &str) -> ExecOutput {
    let options = ExecOptions {
        cwd: WorkPath::new(cwd).unwrap(),
        ..ExecOptions::default()
    };
    g.work().exec(["sh", "-c", script], options).await.unwrap()
}

async fn sh(g: &CallGuard<LocalBackend>, script: &str) -> ExecOutput {
    sh_in(g, ".", script).await
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn done(k: Keeper<LocalBackend>, guards: Vec<CallGuard<LocalBackend>>) {
    for g in guards {
        g.release().await;
    }
    let root = k.backend().root().to_path_buf();
    k.close(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(root);
}

/// A command starts in the mount, with `HOME` and `PWD` naming it; without the mount all three
/// were the workspace's host path under the keeper's root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pwd_home_and_pwd_variable_name_the_mount() {
    for mode in MODES {
        let Some(k) = mounted("pwd", mode) else {
            continue;
        };
        let g = call(&k, "a").await;
        let out = sh(&g, "pwd; echo \"$HOME\"; echo \"$PWD\"").await;
        assert_eq!(
            text(&out.stdout),
            format!("{MOUNT}\n{MOUNT}\n{MOUNT}\n"),
            "{mode:?}: {out:?}"
        );
        done(k, vec![g]).await;
    }
}

/// A file written through the backend is at the mount for a command, and one a command wrote
/// at the mount is read back through the backend: the same workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_the_same_through_the_backend_and_at_the_mount() {
    for mode in MODES {
        let Some(k) = mounted("files", mode) else {
            continue;
        };
        let g = call(&k, "a").await;
        g.work()
            .write("a.txt", "through the backend")
            .await
            .unwrap();
        let out = sh(&g, &format!("cat {MOUNT}/a.txt")).await;
        assert_eq!(
            text(&out.stdout),
            "through the backend",
            "{mode:?}: {out:?}"
        );
        let out = sh(&g, &format!("printf by-a-command > {MOUNT}/x")).await;
        assert!(out.success(), "{mode:?}: {out:?}");
        assert_eq!(
            g.work().read("x").await.unwrap(),
            b"by-a-command",
            "{mode:?}"
        );
        done(k, vec![g]).await;
    }
}

/// A working directory in the workspace is under the mount (`pwd` and `PWD`), and a program
/// named relative to it, or by its path under the mount, runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cwd_and_a_relative_program_are_under_the_mount() {
    for mode in MODES {
        let Some(k) = mounted("cwd", mode) else {
            continue;
        };
        let g = call(&k, "a").await;
        g.work()
            .write("sub/dir/script.sh", "#!/bin/sh\necho ran in \"$(pwd)\"\n")
            .await
            .unwrap();
        assert!(sh(&g, "chmod +x sub/dir/script.sh").await.success());
        let out = sh_in(&g, "sub/dir", "pwd; echo \"$PWD\"").await;
        assert_eq!(
            text(&out.stdout),
            format!("{MOUNT}/sub/dir\n{MOUNT}/sub/dir\n"),
            "{mode:?}: {out:?}"
        );
        let options = ExecOptions {
            cwd: WorkPath::new("sub/dir").unwrap(),
            ..ExecOptions::default()
        };
        let out = g.work().exec(["./script.sh"], options).await.unwrap();
        assert_eq!(
            text(&out.stdout),
            format!("ran in {MOUNT}/sub/dir\n"),
            "{mode:?}: {out:?}"
        );
        let by_path = format!("{MOUNT}/sub/dir/script.sh");
        let out = g
            .work()
            .exec([by_path.as_str()], ExecOptions::default())
            .await
            .unwrap();
        assert_eq!(
            text(&out.stdout),
            format!("ran in {MOUNT}\n"),
            "{mode:?}: {out:?}"
        );
        done(k, vec![g]).await;
    }
}

/// Neither the workspace's host path, nor the keeper's root, nor another sandbox's directory
/// is there inside (without the mount the first is where a command runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_path_and_no_other_sandbox_is_visible() {
    for mode in MODES {
        let Some(k) = mounted("hidden", mode) else {
            continue;
        };
        let a = call(&k, "a").await;
        let b = call(&k, "b").await;
        assert_ne!(a.sandbox(), b.sandbox());
        b.work().write("secret.txt", "b's").await.unwrap();
        let own = k.backend().sandbox_dir(a.sandbox());
        let other = k.backend().sandbox_dir(b.sandbox());
        assert_eq!(k.backend().workspace_seen(a.sandbox()), Path::new(MOUNT));
        for hidden in [&own, &other, &other.join("secret.txt")] {
            let out = sh(&a, &format!("ls -d '{}'", hidden.display())).await;
            assert!(
                !out.success(),
                "{mode:?}: {} is visible: {out:?}",
                hidden.display()
            );
        }
        let out = sh(&a, &format!("ls -d '{}'", k.backend().root().display())).await;
        assert!(!out.success(), "{mode:?}: the root is visible: {out:?}");
        let out = sh(&a, &format!("cat {MOUNT}/secret.txt")).await;
        assert!(
            !out.success(),
            "{mode:?}: b's file in a's workspace: {out:?}"
        );
        done(k, vec![a, b]).await;
    }
}

/// The error inside `LocalBackend::new`'s, if it is a refused mount.
fn mount_error(config: LocalConfig) -> Option<WorkspaceMountError> {
    let e = LocalBackend::new(config).err()?;
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    e.into_inner()?
        .downcast::<WorkspaceMountError>()
        .ok()
        .map(|e| *e)
}

/// A path that is not absolute, not plain, `/`, or on the sandbox's system paths is refused,
/// before anything is made.
#[test]
fn a_bad_mount_is_refused() {
    for (bad, why) in [
        ("home/user", "relative"),
        ("/home/user/", "trailing /"),
        ("/home/../user", ".."),
        ("/", "root"),
        ("/usr/ws", "under /usr"),
        ("/tmp", "/tmp"),
        ("/etc", "/etc"),
        ("/proc/ws", "/proc"),
    ] {
        let root = root("bad");
        let config = LocalConfig {
            workspace_mount: Some(PathBuf::from(bad)),
            ..LocalConfig::new(&root)
        };
        let e = mount_error(config);
        assert!(e.is_some(), "{bad} ({why}) was taken");
        assert!(!root.exists(), "{bad}: the root was made");
    }
}

/// Without bubblewrap nothing can show the workspace at the mount: the backend is refused,
/// saying how to run without one, rather than running commands at the host path.
#[test]
fn a_mount_without_bubblewrap_is_refused() {
    let config = LocalConfig {
        isolation: Isolation::Off,
        workspace_mount: Some(PathBuf::from(MOUNT)),
        ..LocalConfig::new(root("off"))
    };
    let e = mount_error(config).expect("refused");
    assert!(
        matches!(&e, WorkspaceMountError::NotIsolated { path, .. } if path == Path::new(MOUNT)),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("leave the workspace mount unset"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(root("off"));
    // Unset, the same configuration runs as before, at the host path.
    let backend = LocalBackend::new(LocalConfig {
        isolation: Isolation::Off,
        ..LocalConfig::new(root("off"))
    })
    .unwrap();
    assert_eq!(backend.workspace_mount(), None);
    let _ = std::fs::remove_dir_all(root("off"));
}
