//! The application's own work in a pod, through the keeper, against the loopback API (whose
//! exec runs the argv as a real process in the pod's directory): commands, files, the working
//! directory's confinement, and a pod deleted under the work.

mod common;

use std::time::Duration;

use common::*;
use k8s_loopback::resources::PODS;
use k8s_loopback::store::Propagation;
use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_k8s::K8sBackend;
use sandkeeper_tokio::{CallGuard, EntryKind, ExecOptions, Keeper, KeeperConfig, OpError};

async fn keeper(server: &k8s_loopback::Loopback, owner: &str) -> Keeper<K8sBackend> {
    let backend = connect(server, claim_config(owner)).await;
    Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap()
}

async fn call(k: &Keeper<K8sBackend>, c: &str, s: &str) -> CallGuard<K8sBackend> {
    tokio::time::timeout(
        Duration::from_secs(20),
        k.acquire(CallSpec::new(
            CallId::new(c).unwrap(),
            SessionId::new(s).unwrap(),
        )),
    )
    .await
    .expect("ready in time")
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_and_files_run_in_the_calls_pod_and_stay_in_its_workspace() {
    let server = server().await;
    let k = keeper(&server, "worker").await;
    let a = call(&k, "a", "sa").await;
    let b = call(&k, "b", "sb").await;
    let pod_a = k.backend().handle(a.sandbox()).unwrap().pod;
    let w = a.work();

    // Files: written atomically with parents, read, listed, tested, removed.
    w.write("notes/today.md", "hello").await.unwrap();
    w.write("notes/today.md", "hello again").await.unwrap();
    assert_eq!(w.read("notes/today.md").await.unwrap(), b"hello again");
    assert_eq!(
        std::fs::read(server.pod_path(NS, &pod_a, "/workspace/notes/today.md")).unwrap(),
        b"hello again"
    );
    let listed = w.list("notes").await.unwrap();
    assert_eq!(listed.len(), 1, "no temporary left: {listed:?}");
    assert_eq!(
        (listed[0].name.as_str(), listed[0].kind, listed[0].size),
        ("today.md", EntryKind::File, 11)
    );
    assert!(w.exists("notes/today.md").await.unwrap());
    assert!(!w.exists("notes/nope").await.unwrap());
    assert!(matches!(
        w.read("notes/nope").await,
        Err(OpError::NotFound { .. })
    ));
    assert!(matches!(
        w.read_capped("notes/today.md", 4).await,
        Err(OpError::TooLarge { cap: 4, .. })
    ));
    w.remove("notes").await.unwrap();
    assert!(!w.exists("notes").await.unwrap());
    assert!(matches!(
        w.remove("notes").await,
        Err(OpError::NotFound { .. })
    ));
    assert!(
        !b.work().exists("notes").await.unwrap(),
        "b's pod is another"
    );

    // Commands: argv only, in the working directory (or one in it), no inherited environment.
    w.write("sub/x", "1").await.unwrap();
    let out = w
        .exec(
            ["printf", "%s|%s", "a; rm -rf / $(x)", "b"],
            ExecOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, b"a; rm -rf / $(x)|b");
    let ls = w
        .exec(
            ["ls"],
            ExecOptions {
                cwd: sandkeeper_tokio::WorkPath::new("sub").unwrap(),
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ls.stdout, b"x\n");
    let env = w
        .exec(
            ["env"],
            ExecOptions {
                env: vec![("TOOL".into(), "1".into())],
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
        ["HOME", "LANG", "PATH", "SANDKEEPER_SANDBOX", "TOOL"]
    );
    let cat = w
        .exec(
            ["cat"],
            ExecOptions {
                stdin: b"in".to_vec(),
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cat.stdout, b"in");
    assert_eq!(
        w.exec(["false"], ExecOptions::default())
            .await
            .unwrap()
            .code,
        Some(1)
    );
    assert!(matches!(
        w.exec(["no-such-program"], ExecOptions::default()).await,
        Err(OpError::Spawn { .. })
    ));
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
    assert_eq!((big.stdout.len(), big.truncated), (1000, true));
    let slow = w
        .exec(
            ["sleep", "30"],
            ExecOptions {
                timeout: Some(Duration::from_secs(1)),
                ..ExecOptions::default()
            },
        )
        .await;
    assert!(matches!(slow, Err(OpError::Timeout { .. })), "{slow:?}");

    // A symlink planted in the workspace that leads out is refused before anything runs.
    std::os::unix::fs::symlink("/etc", server.pod_path(NS, &pod_a, "/workspace/out")).unwrap();
    assert!(matches!(
        w.read("out/passwd").await,
        Err(OpError::Escapes { .. })
    ));
    assert!(matches!(
        w.write("out/x", "x").await,
        Err(OpError::Escapes { .. })
    ));
    assert!(matches!(
        w.exec(
            ["ls"],
            ExecOptions {
                cwd: sandkeeper_tokio::WorkPath::new("out").unwrap(),
                ..ExecOptions::default()
            }
        )
        .await,
        Err(OpError::Escapes { .. })
    ));
    a.release().await;
    b.release().await;
    tokio::time::timeout(Duration::from_secs(20), k.close(Duration::from_secs(10)))
        .await
        .unwrap();
}

/// The pod is deleted under the call: the next operation is `SandboxGone`, and the keeper
/// knows the sandbox lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_in_a_deleted_pod_is_sandbox_gone() {
    let server = server().await;
    let k = keeper(&server, "worker-d").await;
    let a = call(&k, "a", "s").await;
    let pod = k.backend().handle(a.sandbox()).unwrap().pod;
    // The controllers stay paused, so no pod comes back under the same name.
    server.pause_controllers(true);
    server
        .store()
        .delete_with_grace(&PODS, NS, &pod, Propagation::Background, None, Some(0))
        .unwrap();
    let r = a.work().exec(["true"], ExecOptions::default()).await;
    assert!(matches!(r, Err(OpError::SandboxGone { .. })), "{r:?}");
    tokio::time::timeout(Duration::from_secs(10), async {
        while !a.is_lost() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the keeper learns of the loss");
    server.pause_controllers(false);
    a.release().await;
}

/// Many sessions at once, each running real processes in its pod that write its own session
/// name, through its call's guard and its session work after the call: every pod's
/// workspace ends with only its own session's files, and all of them. (Sandboxes are kept warm
/// so their workspaces can be read at the end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_only_ever_write_into_their_own_pod() {
    let server = server().await;
    let backend = connect(&server, claim_config("worker-many")).await;
    let core = Config {
        release: sandkeeper::ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(600),
        },
        ..Config::default()
    };
    let k = Keeper::new(KeeperConfig::with_core(core), backend).unwrap();
    const SESSIONS: usize = 6;
    const CALLS: usize = 2;
    let mut tasks = Vec::new();
    for n in 0..SESSIONS {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let s = format!("s{n}");
            let session = SessionId::new(&s).unwrap();
            let mut pods = std::collections::BTreeSet::new();
            for c in 0..CALLS {
                let g = call(&k, &format!("{s}-c{c}"), &s).await;
                pods.insert(k.backend().handle(g.sandbox()).unwrap().pod);
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
                drop(g);
                let later = k.session_work(&session).unwrap();
                later
                    .write(&format!("later-{s}-{c}"), s.as_str())
                    .await
                    .unwrap();
            }
            (s, pods)
        }));
    }
    let mut seen_pods = std::collections::BTreeSet::new();
    for t in tasks {
        let (s, pods) = t.await.unwrap();
        assert_eq!(
            pods.len(),
            1,
            "{s}'s calls share its warm sandbox: {pods:?}"
        );
        let pod = pods.into_iter().next().unwrap();
        assert!(seen_pods.insert(pod.clone()), "{pod} served two sessions");
        let dir = server.pod_path(NS, &pod, "/workspace");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("by-") || n.starts_with("later-"))
            .collect();
        names.sort();
        assert_eq!(names.len(), 2 * CALLS, "{names:?}");
        for n in names {
            assert!(n.contains(&format!("-{s}-")), "{n} in {s}'s pod");
            assert_eq!(std::fs::read_to_string(dir.join(&n)).unwrap(), s);
        }
    }
    tokio::time::timeout(Duration::from_secs(20), k.close(Duration::from_secs(10)))
        .await
        .unwrap();
}

/// A long command's output arrives while it runs in the pod: the first line is received
/// before the command is told (through a file written by the call's work) that it may end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_commands_output_streams_from_the_pod_while_it_runs() {
    let server = server().await;
    let k = keeper(&server, "worker-stream").await;
    let g = call(&k, "a", "s").await;
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
        g.work().write("go", "").await.unwrap();
        let mut rest = Vec::new();
        while let Some(c) = rx.recv().await {
            rest.push(c);
        }
        rest
    };
    let (out, rest) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(running, watcher)
    })
    .await
    .expect("in time");
    let out = out.unwrap();
    assert_eq!(out.stdout, b"started\n");
    assert_eq!(rest, [sandkeeper_tokio::Chunk::Stderr(b"done\n".to_vec())]);
    g.release().await;
}

/// A file name of 255 bytes (the longest a file system takes) is written: the write's temporary
/// beside it has a short name of its own (before, it was the target's name with a suffix, too
/// long for the file system), and none is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_of_255_bytes_is_written_in_a_pod() {
    let server = server().await;
    let k = keeper(&server, "worker").await;
    let g = call(&k, "a", "sa").await;
    let w = g.work();
    let name = "n".repeat(255);
    w.write(&format!("d/{name}"), "long").await.unwrap();
    assert_eq!(w.read(&format!("d/{name}")).await.unwrap(), b"long");
    let listed = w.list("d").await.unwrap();
    assert_eq!(listed.len(), 1, "no temporary left: {listed:?}");
    g.release().await;
    k.close(Duration::from_secs(10)).await;
}
