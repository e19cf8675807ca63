//! Operations on the local backend, end to end: real processes and real files through a call's
//! guard and a session's work handle, and every refusal typed.
#![cfg(not(loom))]

use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SandboxState, SessionId};
use sandkeeper_tokio::local::{Isolation, LocalConfig};
use sandkeeper_tokio::{
    CallGuard, EntryKind, ExecOptions, Keeper, KeeperConfig, LocalBackend, OpError,
};

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-ops-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn keeper(name: &str, core: Config) -> Keeper<LocalBackend> {
    keeper_with(name, core, Isolation::Auto)
}

fn keeper_with(name: &str, core: Config, isolation: Isolation) -> Keeper<LocalBackend> {
    let config = LocalConfig {
        isolation,
        ..LocalConfig::new(root(name))
    };
    let backend = LocalBackend::new(config).unwrap();
    Keeper::new(KeeperConfig::with_core(core), backend).unwrap()
}

/// Both isolations this machine has: process groups only, and bubblewrap where it works.
const ISOLATIONS: [Isolation; 2] = [Isolation::Off, Isolation::Auto];

async fn call(k: &Keeper<LocalBackend>, c: &str, s: &str) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new(c).unwrap(),
        SessionId::new(s).unwrap(),
    ))
    .await
    .unwrap()
}

/// A command runs in the call's workspace with argv only, stdin given, and nothing of the
/// host's environment: exactly the allowlist and the request's own variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_in_the_workspace_with_a_cleared_environment() {
    for isolation in ISOLATIONS {
        exec_in_the_workspace(isolation).await;
    }
}

async fn exec_in_the_workspace(isolation: Isolation) {
    let k = keeper_with(&format!("exec-{isolation:?}"), Config::default(), isolation);
    let g = call(&k, "c", "s").await;
    let w = g.work();
    let out = w
        .exec(
            ["printf", "%s|%s", "a; rm -rf / $(x)", "b"],
            ExecOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.success(), &out.stdout[..]),
        (true, &b"a; rm -rf / $(x)|b"[..])
    );
    let pwd = w.exec(["pwd"], ExecOptions::default()).await.unwrap();
    let dir = k.backend().sandbox_dir(g.sandbox());
    assert_eq!(
        String::from_utf8_lossy(&pwd.stdout).trim(),
        dir.to_str().unwrap()
    );

    // The test process has CARGO_* and more in its environment; none of it reaches the tool.
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    let env = w
        .exec(
            ["env"],
            ExecOptions {
                env: vec![("TOOL_TOKEN".into(), "t0k".into())],
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    let mut names: Vec<String> = String::from_utf8_lossy(&env.stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "HOME",
            "LANG",
            "PATH",
            "PWD",
            "SANDKEEPER_SANDBOX",
            "TOOL_TOKEN"
        ]
    );

    let cat = w
        .exec(
            ["cat"],
            ExecOptions {
                stdin: b"from stdin".to_vec(),
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cat.stdout, b"from stdin");
    let failing = w.exec(["false"], ExecOptions::default()).await.unwrap();
    assert_eq!(failing.code, Some(1));
    assert!(matches!(
        w.exec(Vec::<String>::new(), ExecOptions::default()).await,
        Err(OpError::EmptyArgv)
    ));
    assert!(matches!(
        w.exec(
            ["true"],
            ExecOptions {
                env: vec![("A=B".into(), "x".into())],
                ..ExecOptions::default()
            }
        )
        .await,
        Err(OpError::InvalidEnv { .. })
    ));
    assert!(matches!(
        w.exec(["no-such-program-here"], ExecOptions::default())
            .await,
        Err(OpError::Spawn { .. })
    ));
    g.release().await;
}

/// A timed-out command is killed with what it started: its grandchild is dead too. Output
/// beyond the cap is read and dropped, and said to be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_the_whole_group_and_output_is_capped() {
    for isolation in ISOLATIONS {
        timeout_and_cap(isolation).await;
    }
}

async fn timeout_and_cap(isolation: Isolation) {
    let k = keeper_with(
        &format!("timeout-{isolation:?}"),
        Config::default(),
        isolation,
    );
    let g = call(&k, "c", "s").await;
    let w = g.work();
    // The grandchild is found by a mark in its argv (its pid inside a PID namespace would
    // name another process out here).
    let mark = format!("{}.{}", 30 + std::process::id() % 1000, std::process::id());
    let script = format!("sleep {mark} & wait");
    let timed_out = w
        .exec(
            ["sh", "-c", script.as_str()],
            ExecOptions {
                timeout: Some(Duration::from_millis(500)),
                ..ExecOptions::default()
            },
        )
        .await;
    assert!(
        matches!(timed_out, Err(OpError::Timeout { .. })),
        "{timed_out:?}"
    );
    let running: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("sleep ") && c.contains(&mark))
        .collect();
    assert!(
        running.is_empty(),
        "outlived the timed-out exec: {running:?}"
    );

    let big = w
        .exec(
            ["head", "-c", "100000", "/dev/zero"],
            ExecOptions {
                output_cap: 1000,
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (big.stdout.len(), big.truncated, big.code),
        (1000, true, Some(0))
    );
    let small = w
        .exec(["echo", "hi"], ExecOptions::default())
        .await
        .unwrap();
    assert!(!small.truncated);
    g.release().await;
}

/// Files: atomic write (parents made, no temporary left), read, list, exists, remove; bad
/// paths, paths out through a symlink, the keeper's own directory and oversized reads are
/// refused with their typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_confined_to_the_workspace() {
    let k = keeper("files", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    w.write("notes/today.md", "hello").await.unwrap();
    w.write("notes/today.md", "hello again").await.unwrap();
    assert_eq!(w.read("notes/today.md").await.unwrap(), b"hello again");
    let listed = w.list("notes").await.unwrap();
    assert_eq!(listed.len(), 1, "no temporary file left: {listed:?}");
    assert_eq!(
        (listed[0].name.as_str(), listed[0].kind, listed[0].size),
        ("today.md", EntryKind::File, 11)
    );
    let root = w.list(".").await.unwrap();
    assert!(root
        .iter()
        .any(|e| e.name == "notes" && e.kind == EntryKind::Dir));
    assert!(w.exists("notes/today.md").await.unwrap());
    assert!(!w.exists("notes/tomorrow.md").await.unwrap());
    assert!(matches!(
        w.read("notes/tomorrow.md").await,
        Err(OpError::NotFound { .. })
    ));
    assert!(matches!(
        w.read_capped("notes/today.md", 5).await,
        Err(OpError::TooLarge { cap: 5, .. })
    ));
    w.remove("notes").await.unwrap();
    assert!(!w.exists("notes").await.unwrap());

    for bad in ["/etc/passwd", "../x", "a/../../b", "a\0b", ""] {
        assert!(
            matches!(w.read(bad).await, Err(OpError::InvalidPath { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(w.write(bad, "x").await, Err(OpError::InvalidPath { .. })),
            "{bad:?}"
        );
    }
    assert!(matches!(
        w.write(".sandkeeper/s/x", "x").await,
        Err(OpError::InvalidPath { .. })
    ));
    assert!(matches!(
        w.remove(".").await,
        Err(OpError::InvalidPath { .. })
    ));

    // A symlink planted in the workspace that leads out is refused, not followed.
    let dir = k.backend().sandbox_dir(g.sandbox());
    std::os::unix::fs::symlink("/etc", dir.join("out")).unwrap();
    assert!(matches!(
        w.read("out/passwd").await,
        Err(OpError::Escapes { .. })
    ));
    let r = w.write("out/evil", "x").await;
    assert!(matches!(r, Err(OpError::Escapes { .. })), "{r:?}");
    assert!(matches!(w.list("out").await, Err(OpError::Escapes { .. })));
    // Listed, the link is the link: its own target as written, its own mode and owner, nothing
    // of /etc's.
    std::fs::write(dir.join("f"), "four").unwrap();
    std::fs::set_permissions(
        dir.join("f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let listed = w.list(".").await.unwrap();
    let link = listed.iter().find(|e| e.name == "out").unwrap();
    assert_eq!(link.kind, EntryKind::Symlink);
    assert_eq!(link.meta.link_target.as_deref(), Some("/etc"));
    assert_eq!(link.meta.mode, Some(0o777), "a link's own bits: {link:?}");
    let file = listed.iter().find(|e| e.name == "f").unwrap();
    let host = std::fs::metadata(dir.join("f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(file.meta.mode, Some(0o640));
    assert_eq!(
        (file.meta.uid, file.meta.gid),
        (Some(host.uid()), Some(host.gid()))
    );
    assert_eq!(file.meta.modified, Some(host.modified().unwrap()));
    assert_eq!(file.meta.link_target, None);
    assert!(matches!(
        w.exec(
            ["pwd"],
            ExecOptions {
                cwd: sandkeeper_tokio::WorkPath::new("out").unwrap(),
                ..ExecOptions::default()
            }
        )
        .await,
        Err(OpError::Escapes { .. })
    ));
    g.release().await;
}

/// A session's work taken after its call's release, while the sandbox drains, runs in the
/// session's own sandbox and keeps it from stopping until the work is dropped; then the
/// session has no sandbox its work may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_work_keeps_a_draining_sandbox_until_dropped() {
    let k = keeper("session", Config::default());
    let s = SessionId::new("s").unwrap();
    let other = call(&k, "o", "other").await;
    let g = call(&k, "c", "s").await;
    let x = g.sandbox();
    k.hold(&s).unwrap();
    drop(g);
    let work = k.session_work(&s).unwrap();
    assert_eq!(work.sandbox(), x);
    assert_ne!(work.sandbox(), other.sandbox());
    k.unhold(&s).unwrap();
    assert_eq!(
        k.sandbox_state(x),
        Some(SandboxState::Draining),
        "the work keeps it"
    );
    work.write("memory.md", "remembered").await.unwrap();
    assert_eq!(
        std::fs::read(k.backend().sandbox_dir(x).join("memory.md")).unwrap(),
        b"remembered"
    );
    work.leave().unwrap();
    assert_ne!(k.sandbox_state(x), Some(SandboxState::Draining));
    assert!(matches!(
        k.session_work(&s),
        Err(OpError::NoActiveSandbox { .. })
    ));
    other.release().await;
}

/// Past the drain deadline the sandbox stops anyway; the work's next operation is refused
/// before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_in_a_sandbox_ordered_to_stop_is_refused() {
    let core = Config {
        drain_deadline: Duration::from_millis(50),
        ..Config::default()
    };
    let k = keeper("deadline", core);
    let s = SessionId::new("s").unwrap();
    let g = call(&k, "c", "s").await;
    let x = g.sandbox();
    let work = k.session_work(&s).unwrap();
    drop(g);
    // The core's timer orders the Stop at the deadline; nothing is announced for it, so the
    // test yields until the state shows it (bounded).
    tokio::time::timeout(Duration::from_secs(10), async {
        while k.sandbox_state(x) == Some(SandboxState::Draining)
            || k.sandbox_state(x) == Some(SandboxState::Running)
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("stopped at the drain deadline");
    let refused = work.exec(["touch", "late"], ExecOptions::default()).await;
    assert!(
        matches!(
            refused,
            Err(OpError::NoActiveSandbox { .. } | OpError::SandboxGone { .. })
        ),
        "{refused:?}"
    );
    assert!(!k.backend().sandbox_dir(x).join("late").exists());
}

/// Work that finds its sandbox gone (its workspace removed from outside) answers
/// `SandboxGone`, and the keeper learns of the death: the call is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_that_finds_its_sandbox_gone_reports_the_death() {
    let k = keeper("death", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    std::fs::remove_dir_all(k.backend().sandbox_dir(g.sandbox())).unwrap();
    let r = w.exec(["true"], ExecOptions::default()).await;
    assert!(matches!(r, Err(OpError::SandboxGone { .. })), "{r:?}");
    assert!(g.is_lost(), "the keeper knows");
    assert!(matches!(
        w.read("x").await,
        Err(OpError::SandboxGone { .. })
    ));
    g.release().await;
}

/// Under bubblewrap (required when `SANDKEEPER_REQUIRE_BWRAP` is set, as `.ci/run` sets it), a
/// command sees no other sandbox, cannot write outside its own workspace, and has no network
/// but loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_keeps_other_sandboxes_the_host_and_the_network_out() {
    let required = std::env::var_os("SANDKEEPER_REQUIRE_BWRAP").is_some();
    let isolation = if required {
        Isolation::Require
    } else {
        Isolation::Auto
    };
    let k = keeper_with("bwrap", Config::default(), isolation);
    if !k.backend().isolation().is_bubblewrap() {
        eprintln!("skipped: {}", k.backend().isolation());
        return;
    }
    let a = call(&k, "a", "sa").await;
    let b = call(&k, "b", "sb").await;
    let b_dir = k.backend().sandbox_dir(b.sandbox());
    b.work().write("secret.txt", "b's").await.unwrap();
    let w = a.work();
    let peek = w
        .exec(
            ["cat", b_dir.join("secret.txt").to_str().unwrap()],
            ExecOptions::default(),
        )
        .await
        .unwrap();
    assert!(!peek.success() && peek.stdout.is_empty(), "{peek:?}");
    let escape = format!("/etc/sandkeeper-escape-{}", std::process::id());
    let touch = w
        .exec(["touch", escape.as_str()], ExecOptions::default())
        .await
        .unwrap();
    assert!(!touch.success());
    assert!(!std::path::Path::new(&escape).exists());
    let own = w
        .exec(
            ["sh", "-c", "echo mine > \"$HOME/own.txt\""],
            ExecOptions::default(),
        )
        .await
        .unwrap();
    assert!(own.success(), "{own:?}");
    assert_eq!(w.read("own.txt").await.unwrap(), b"mine\n");
    let net = w
        .exec(["cat", "/proc/net/dev"], ExecOptions::default())
        .await
        .unwrap();
    let interfaces: Vec<String> = String::from_utf8_lossy(&net.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|i| i.trim().to_string()))
        .collect();
    assert_eq!(interfaces, ["lo"]);
    a.release().await;
    b.release().await;
}

/// Many sessions at once, each running real processes that write its own session id into its
/// workspace, through its call's guard and through its session work after the call: every
/// workspace ends with only its own session's files, and all of them. (Sandboxes are kept warm
/// so their workspaces can be read at the end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_only_ever_write_into_their_own_workspace() {
    let core = Config {
        release: sandkeeper::ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(600),
        },
        ..Config::default()
    };
    let k = keeper("many", core);
    const SESSIONS: usize = 16;
    const CALLS: usize = 3;
    let mut tasks = Vec::new();
    for n in 0..SESSIONS {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let s = format!("s{n}");
            let session = SessionId::new(&s).unwrap();
            let mut written = Vec::new();
            for c in 0..CALLS {
                let g = call(&k, &format!("{s}-c{c}"), &s).await;
                let file = format!("by-{s}-{c}");
                let out = g
                    .work()
                    .exec(
                        [
                            "sh",
                            "-c",
                            "printf %s \"$1\" > \"$2\"",
                            "sh",
                            s.as_str(),
                            file.as_str(),
                        ],
                        ExecOptions::default(),
                    )
                    .await
                    .unwrap();
                assert!(out.success(), "{out:?}");
                written.push((g.sandbox(), file));
                drop(g);
                let later = k.session_work(&session).unwrap();
                let file = format!("later-{s}-{c}");
                later.write(&file, s.as_str()).await.unwrap();
                written.push((later.sandbox(), file));
            }
            (s, written)
        }));
    }
    let mut dirs = std::collections::BTreeMap::new();
    for t in tasks {
        let (s, written) = t.await.unwrap();
        for (x, file) in written {
            let dir = k.backend().sandbox_dir(x);
            assert_eq!(std::fs::read_to_string(dir.join(&file)).unwrap(), s);
            dirs.entry(dir)
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(s.clone());
        }
    }
    assert_eq!(dirs.len(), SESSIONS, "one warm sandbox per session");
    for (dir, sessions) in &dirs {
        assert_eq!(
            sessions.len(),
            1,
            "{} was written by {sessions:?}",
            dir.display()
        );
        let s = sessions.iter().next().unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("by-") || n.starts_with("later-"))
            .collect();
        names.sort();
        assert_eq!(names.len(), 2 * CALLS, "{names:?}");
        for n in names {
            assert!(n.contains(&format!("-{s}-")), "{n} in {s}'s workspace");
            assert_eq!(std::fs::read_to_string(dir.join(&n)).unwrap(), *s);
        }
    }
    let report = k.close(Duration::from_secs(5)).await;
    assert!(report.unconfirmed.is_empty(), "{report:?}");
}

/// A long command's output arrives while it runs: the first line is received before the
/// command is told (through a file the test writes) that it may end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_commands_output_streams_while_it_runs() {
    let k = keeper("stream", Config::default());
    let g = call(&k, "c", "s").await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let work = g.work();
    let script = "echo started; while [ ! -e go ]; do sleep 0.01; done; echo done >&2";
    let running = work.exec_streaming(["sh", "-c", script], ExecOptions::default(), tx);
    let watcher = async {
        let first = rx.recv().await;
        assert_eq!(
            first,
            Some(sandkeeper_tokio::Chunk::Stdout(b"started\n".to_vec()))
        );
        // Only now may the command end.
        g.work().write("go", "").await.unwrap();
        let mut rest = Vec::new();
        while let Some(c) = rx.recv().await {
            rest.push(c);
        }
        rest
    };
    let (out, rest) = tokio::join!(running, watcher);
    let out = out.unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice()),
        (&b"started\n"[..], &b"done\n"[..])
    );
    assert_eq!(rest, [sandkeeper_tokio::Chunk::Stderr(b"done\n".to_vec())]);
    g.release().await;
}
