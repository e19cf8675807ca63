//! The keeper never acts through a command's files (issue 31, item 4), and an operation's error
//! says what the caller can do (item 5).
//!
//! A command may create anything in its workspace, `.sandkeeper/` included: links to another
//! sandbox or to a host file, links to the keeper's own directory, FIFOs. Here the test plays
//! the command (it plants what a command could plant, with the keeper's user) and then lets the
//! keeper do its own work: an upload, a persist, a resume, an operation. Nothing may land
//! outside the sandbox, no host file may change, the keeper's directory may not change through
//! an operation, and nothing may block.
#![cfg(not(loom))]

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandkeeper::{
    CallId, CallSpec, Config, Key, PathName, Payload, SandboxId, SandboxState, SessionId, Snapshot,
    Spec, UploadId, Version,
};
use sandkeeper_tokio::local::{Isolation, LocalConfig};
use sandkeeper_tokio::ops::WorkPath;
use sandkeeper_tokio::{
    Backend, CallGuard, ExecOptions, Keeper, KeeperConfig, LocalBackend, OpError, OpErrorClass,
    PersistRequest, StartRequest, StopRequest, UploadRequest,
};

/// A fresh directory for one test (a keeper root, or a "host" directory outside it).
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sk-contain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A host directory outside every keeper root, holding one file with known bytes.
fn host(name: &str) -> (PathBuf, PathBuf) {
    let dir = fresh(&format!("{name}-host"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("precious");
    std::fs::write(&file, b"the host's own bytes\n").unwrap();
    (dir, file)
}

/// Every name in `dir` (not recursive), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn start(sandbox: u64, key: &str, resume_from: Option<Snapshot>) -> StartRequest {
    StartRequest {
        sandbox: SandboxId(sandbox),
        key: Key::Session(SessionId::new(key).unwrap()),
        spec: Spec::new(""),
        resume_from,
        resumes: None,
        token: None,
    }
}

fn upload(sandbox: u64, session: &str, bytes: &str) -> UploadRequest {
    UploadRequest {
        upload: UploadId(1),
        sandbox: SandboxId(sandbox),
        session: SessionId::new(session).unwrap(),
        path: PathName::session_log(),
        version: Version(1),
        payload: Payload::new(bytes.as_bytes().to_vec()),
        token: None,
    }
}

fn stop(sandbox: u64) -> StopRequest {
    StopRequest {
        sandbox: SandboxId(sandbox),
        suspend: true,
        token: None,
    }
}

fn persist(sandbox: u64, snapshot: Snapshot) -> PersistRequest {
    PersistRequest {
        sandbox: SandboxId(sandbox),
        snapshot: Some(snapshot),
        suspend: true,
        retain_until: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000_000)),
        token: None,
    }
}

fn backend(name: &str) -> LocalBackend {
    LocalBackend::new(LocalConfig::new(fresh(name))).unwrap()
}

fn keeper(name: &str, core: Config) -> Keeper<LocalBackend> {
    let config = LocalConfig {
        isolation: Isolation::Off,
        ..LocalConfig::new(fresh(name))
    };
    Keeper::new(
        KeeperConfig::with_core(core),
        LocalBackend::new(config).unwrap(),
    )
    .unwrap()
}

async fn call(k: &Keeper<LocalBackend>, c: &str, s: &str) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new(c).unwrap(),
        SessionId::new(s).unwrap(),
    ))
    .await
    .unwrap()
}

/// Finding: a link a command planted at `.sandkeeper/<session>` (to another sandbox's session
/// directory) made session A's log land in sandbox B. The upload now lands in A's own session
/// directory (the planted link is taken away, never followed), and B is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_never_follows_a_link_planted_at_the_session_directory() {
    let b = backend("session-link");
    b.start(start(1, "a", None)).await.unwrap();
    b.start(start(2, "b", None)).await.unwrap();
    b.upload(upload(2, "sb", "b's log\n")).await.unwrap();
    let b_session = b.sandbox_dir(SandboxId(2)).join(".sandkeeper/sb");
    let before = names(&b_session);

    // A's command: `.sandkeeper/sa` -> B's session directory.
    let a_meta = b.sandbox_dir(SandboxId(1)).join(".sandkeeper");
    symlink(&b_session, a_meta.join("sa")).unwrap();
    let landed = b.upload(upload(1, "sa", "a's log\n")).await;

    assert_eq!(names(&b_session), before, "nothing of A's landed in B");
    assert_eq!(
        std::fs::read(b_session.join("session.log")).unwrap(),
        b"b's log\n"
    );
    // Contained: the log is in A's own session directory, a real one now.
    landed.unwrap();
    let own = a_meta.join("sa");
    assert!(!own.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read(own.join("session.log")).unwrap(),
        b"a's log\n"
    );
}

/// Finding, one level up: `.sandkeeper` itself is a link a command planted (to a host
/// directory). The upload lands nowhere outside the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_never_follows_a_link_planted_at_the_keepers_directory() {
    let b = backend("meta-link");
    let (outside, precious) = host("meta-link");
    b.start(start(1, "a", None)).await.unwrap();
    let meta = b.sandbox_dir(SandboxId(1)).join(".sandkeeper");
    std::fs::remove_dir_all(&meta).unwrap();
    symlink(&outside, &meta).unwrap();

    let landed = b.upload(upload(1, "sa", "a's log\n")).await;
    assert_eq!(names(&outside), ["precious"], "nothing landed outside");
    assert_eq!(std::fs::read(&precious).unwrap(), b"the host's own bytes\n");
    landed.unwrap();
    assert!(!meta.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read(meta.join("sa/session.log")).unwrap(),
        b"a's log\n"
    );
}

/// Finding: a link planted at `.sandkeeper/persisted` (and at the temporary name the keeper
/// used to write it through) overwrote a host file with `persisted\n`. After a persist the host
/// file is unchanged: the keeper writes no marker in the workspace any more, what is kept is in
/// its own record (`<root>/.meta/`), and what the command planted is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persist_never_writes_through_a_planted_marker_link() {
    let b = backend("persisted-link");
    let (outside, precious) = host("persisted-link");
    b.start(start(1, "a", None)).await.unwrap();
    let meta = b.sandbox_dir(SandboxId(1)).join(".sandkeeper");
    for name in [
        "persisted",
        "expires",
        ".persisted.upl-18446744073709551615.tmp",
        ".expires.upl-18446744073709551615.tmp",
    ] {
        symlink(&precious, meta.join(name)).unwrap();
    }
    let snapshot = b.stop(stop(1)).await.unwrap().expect("a snapshot");
    b.persist(persist(1, snapshot.clone())).await.unwrap();

    assert_eq!(std::fs::read(&precious).unwrap(), b"the host's own bytes\n");
    assert_eq!(names(&outside), ["precious"]);
    let kept = b
        .snapshots_dir()
        .join(snapshot.as_str())
        .join(".sandkeeper");
    for marker in ["persisted", "expires"] {
        let m = kept.join(marker).symlink_metadata().unwrap();
        assert!(
            m.file_type().is_symlink(),
            "{marker} is the command's, untouched"
        );
    }
    let record = b.snapshot_record(&snapshot).unwrap().expect("recorded");
    assert!(record.persisted);
    assert_eq!(record.expires, Some(4_000_000_000));
}

/// Finding: a resume wrote `sandbox.json` into a host file through a link planted in the
/// snapshot (at `sandbox.json` and at its temporary name). The host file is unchanged after
/// the resume: what the resumed sandbox was started for is the keeper's record, outside the
/// workspace, and the planted links are left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_never_writes_sandbox_json_through_a_planted_link() {
    let b = backend("resume-link");
    let (outside, precious) = host("resume-link");
    b.start(start(1, "a", None)).await.unwrap();
    let meta = b.sandbox_dir(SandboxId(1)).join(".sandkeeper");
    for name in ["sandbox.json", ".sandbox.json.upl-18446744073709551615.tmp"] {
        symlink(&precious, meta.join(name)).unwrap();
    }
    let snapshot = b.stop(stop(1)).await.unwrap().expect("a snapshot");
    b.persist(persist(1, snapshot.clone())).await.unwrap();
    b.start(start(2, "a", Some(snapshot.clone())))
        .await
        .unwrap();

    assert_eq!(std::fs::read(&precious).unwrap(), b"the host's own bytes\n");
    assert_eq!(names(&outside), ["precious"]);
    let info = b.sandbox_dir(SandboxId(2)).join(".sandkeeper/sandbox.json");
    assert!(info.symlink_metadata().unwrap().file_type().is_symlink());
    let record = b.sandbox_record(SandboxId(2)).unwrap().expect("recorded");
    assert_eq!(record.sandbox, 2);
    assert_eq!(record.resumed_from.as_deref(), Some(snapshot.as_str()));
}

/// Finding: through an inner link to `.sandkeeper` (`ln -s .sandkeeper k`), `write("k/x")` and
/// `remove("k/...")` changed the keeper's own directory. Both are refused now (`Escapes`: an
/// operation never goes through a link), and the keeper's directory is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_link_to_the_keepers_directory_is_refused_for_write_and_remove() {
    let k = keeper("inner-link", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    let made = w
        .exec(["ln", "-s", ".sandkeeper", "k"], ExecOptions::default())
        .await
        .unwrap();
    assert!(made.success(), "{made:?}");
    let meta = k.backend().sandbox_dir(g.sandbox()).join(".sandkeeper");
    // A mirror there (as an upload leaves one), which no operation may change.
    std::fs::create_dir_all(meta.join("s")).unwrap();
    std::fs::write(meta.join("s/session.log"), b"mirrored\n").unwrap();
    let before = names(&meta);
    assert_eq!(before, ["s"]);

    let wrote = w.write("k/x", "planted").await;
    assert!(matches!(wrote, Err(OpError::Escapes { .. })), "{wrote:?}");
    let removed = w.remove("k/s/session.log").await;
    assert!(
        matches!(removed, Err(OpError::Escapes { .. })),
        "{removed:?}"
    );
    let deeper = w.write("k/s/session.log", "forged").await;
    assert!(matches!(deeper, Err(OpError::Escapes { .. })), "{deeper:?}");
    assert_eq!(names(&meta), before, "the keeper's directory is unchanged");
    assert!(!meta.join("x").exists());

    // The link itself is the application's: it may remove it (not what it points to).
    w.remove("k").await.unwrap();
    assert_eq!(names(&meta), before);
    g.release().await;
}

/// A command's working directory is checked as every operation's path is: never through a
/// link, even one that stays inside the workspace (`Escapes`); a real directory is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_never_takes_its_working_directory_through_a_link() {
    let k = keeper("exec-cwd-link", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    w.write("d/file", "x").await.unwrap();
    let made = w
        .exec(["ln", "-s", "d", "l"], ExecOptions::default())
        .await
        .unwrap();
    assert!(made.success(), "{made:?}");
    let through = |cwd: &str| ExecOptions {
        cwd: WorkPath::new(cwd).unwrap(),
        ..ExecOptions::default()
    };
    let linked = w.exec(["ls"], through("l")).await;
    assert!(matches!(linked, Err(OpError::Escapes { .. })), "{linked:?}");
    let real = w.exec(["ls"], through("d")).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&real.stdout).trim(), "file");
    g.release().await;
}

/// Finding: reading a FIFO a command made never returned and held the runtime up. The read now
/// answers `NotAFile` at once, and an operation in another sandbox meanwhile completes.
///
/// Bound: 10 s for what takes milliseconds; the bound only turns a hang into a failure on a
/// loaded 2-core machine. Whatever happens, the test then opens the FIFO for writing, which
/// frees a reader stuck in it, so that a failure ends the test instead of hanging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_fifo_answers_promptly_and_blocks_no_other_work() {
    const BOUND: Duration = Duration::from_secs(10);
    let k = keeper("fifo", Config::default());
    let a = call(&k, "a", "sa").await;
    let b = call(&k, "b", "sb").await;
    let made = a
        .work()
        .exec(["mkfifo", "f"], ExecOptions::default())
        .await
        .unwrap();
    assert!(made.success(), "{made:?}");
    let fifo = k.backend().sandbox_dir(a.sandbox()).join("f");

    let (aw, bw) = (a.work(), b.work());
    let reading = tokio::time::timeout(BOUND, aw.read("f"));
    let other = tokio::time::timeout(BOUND, async {
        bw.write("notes", "b's").await?;
        bw.exec(["true"], ExecOptions::default()).await?;
        bw.read("notes").await
    });
    let (read, other) = tokio::join!(reading, other);
    // Frees a reader stuck in the FIFO (none when the read refused it).
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags_nonblocking()
        .open(&fifo);
    let read = read.expect("the read of a FIFO answers within the bound");
    assert!(matches!(read, Err(OpError::NotAFile { .. })), "{read:?}");
    assert_eq!(other.expect("other work completes").unwrap(), b"b's");
    a.release().await;
    b.release().await;
}

/// Opening a FIFO for writing without blocking (no reader: an error, ignored).
trait NonBlocking {
    fn custom_flags_nonblocking(&mut self) -> &mut Self;
}

impl NonBlocking for std::fs::OpenOptions {
    fn custom_flags_nonblocking(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK on Linux.
        self.custom_flags(0o4000)
    }
}

/// Finding: `read_capped(path, usize::MAX)` answered `Ok("")` in release builds (the cap plus
/// one overflowed). It reads the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_capped_with_the_largest_cap_reads_the_file() {
    let k = keeper("cap-max", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    w.write("f", "all of it").await.unwrap();
    assert_eq!(w.read_capped("f", usize::MAX).await.unwrap(), b"all of it");
    assert_eq!(w.read_capped("f", 9).await.unwrap(), b"all of it");
    assert!(matches!(
        w.read_capped("f", 8).await,
        Err(OpError::TooLarge { cap: 8, .. })
    ));
    g.release().await;
}

/// Finding: a 255-byte name is valid but could not be written (the temporary name beside it was
/// longer than NAME_MAX). It is written, read back and listed, at the root and in a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_of_255_bytes_is_written() {
    let k = keeper("long-name", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    let name = "n".repeat(255);
    for path in [name.clone(), format!("d/{name}")] {
        w.write(&path, "long").await.unwrap();
        assert_eq!(w.read(&path).await.unwrap(), b"long");
    }
    let listed = w.list("d").await.unwrap();
    assert_eq!(listed.len(), 1, "no temporary left: {listed:?}");
    assert_eq!(listed[0].name, name);
    g.release().await;
}

/// Finding: `read(".")` was an untyped backend error. Reading a directory is `NotAFile`, refused
/// input (not retryable); listing a file is `NotADirectory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_directory_is_not_a_file() {
    let k = keeper("read-dir", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    w.write("d/f", "x").await.unwrap();
    for dir in [".", "d"] {
        let r = w.read(dir).await;
        assert!(matches!(r, Err(OpError::NotAFile { .. })), "{dir}: {r:?}");
        let e = r.unwrap_err();
        assert_eq!(e.class(), OpErrorClass::Refused);
        assert!(!e.is_retryable());
    }
    let r = w.list("d/f").await;
    assert!(matches!(r, Err(OpError::NotADirectory { .. })), "{r:?}");
    let r = w.write("d/f/g", "x").await;
    assert!(matches!(r, Err(OpError::NotADirectory { .. })), "{r:?}");
    g.release().await;
}

/// Finding: one situation, the sandbox going away under the work, answered `NoActiveSandbox`,
/// `SandboxGone`, `Stopped`, `Backend { what: "call" }` or `Spawn` by timing. Each timing that
/// can be brought about here answers `SandboxGone`, class `Gone`, not retryable:
/// - a session's sandbox ordered to stop (past the drain deadline) before the operation;
/// - a call's sandbox removed from outside before the keeper knows (each operation);
/// - a call's sandbox the keeper knows dead;
/// - a call whose keeper closed under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_going_away_answers_sandbox_gone_whatever_the_timing() {
    fn gone<T: std::fmt::Debug>(what: &str, r: Result<T, OpError>) {
        match r {
            Err(e @ OpError::SandboxGone { .. }) => {
                assert_eq!(e.class(), OpErrorClass::Gone, "{what}");
                assert!(!e.is_retryable(), "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }

    // A session's sandbox ordered to stop.
    let core = Config {
        drain_deadline: Duration::from_millis(50),
        ..Config::default()
    };
    let k = keeper("gone-session", core);
    let s = SessionId::new("s").unwrap();
    let g = call(&k, "c", "s").await;
    let x = g.sandbox();
    let work = k.session_work(&s).unwrap();
    drop(g);
    // The core's timer orders the Stop at the drain deadline; nothing announces it, so the
    // test yields until the state shows it (bounded: 10 s for 50 ms).
    tokio::time::timeout(Duration::from_secs(10), async {
        while matches!(
            k.sandbox_state(x),
            Some(SandboxState::Draining | SandboxState::Running)
        ) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("stopped at the drain deadline");
    gone(
        "session exec",
        work.exec(["true"], ExecOptions::default()).await,
    );
    gone("session read", work.read("x").await);
    drop(work);

    // A call's sandbox removed from outside, each operation before the keeper knows.
    let k = keeper("gone-call", Config::default());
    let g = call(&k, "c", "s").await;
    let w = g.work();
    w.write("x", "1").await.unwrap();
    std::fs::remove_dir_all(k.backend().sandbox_dir(g.sandbox())).unwrap();
    gone("read", w.read("x").await);
    gone("write", w.write("y", "2").await);
    gone("list", w.list(".").await);
    gone("exists", w.exists("x").await);
    gone("remove", w.remove("x").await);
    gone("exec", w.exec(["true"], ExecOptions::default()).await);
    assert!(g.is_lost(), "the keeper learnt of the death");
    gone("read once known", w.read("x").await);
    g.release().await;

    // A call whose keeper closed under it.
    let k = keeper("gone-closed", Config::default());
    let g = call(&k, "c", "s").await;
    let _ = k.close(Duration::from_millis(10)).await;
    gone("after close", g.work().read("x").await);
}

/// The taxonomy: each error's class and whether a retry may help, one answer per situation.
#[test]
fn every_error_has_one_class_and_only_transient_ones_are_retryable() {
    let x = SandboxId(1);
    let cases = [
        (
            OpError::SandboxGone {
                sandbox: x,
                why: String::new(),
            },
            OpErrorClass::Gone,
        ),
        (OpError::Stopped { sandbox: x }, OpErrorClass::Gone),
        (
            OpError::Fenced {
                sandbox: x,
                why: String::new(),
            },
            OpErrorClass::Gone,
        ),
        (
            OpError::NoActiveSandbox {
                session: SessionId::new("s").unwrap(),
            },
            OpErrorClass::Unbound,
        ),
        (
            OpError::Backend {
                what: "file",
                error: String::new(),
            },
            OpErrorClass::Retryable,
        ),
        (
            OpError::InvalidPath {
                path: String::new(),
                why: "",
            },
            OpErrorClass::Refused,
        ),
        (
            OpError::Escapes {
                path: String::new(),
            },
            OpErrorClass::Refused,
        ),
        (
            OpError::NotFound {
                path: String::new(),
            },
            OpErrorClass::Refused,
        ),
        (
            OpError::NotAFile {
                path: String::new(),
            },
            OpErrorClass::Refused,
        ),
        (
            OpError::NotADirectory {
                path: String::new(),
            },
            OpErrorClass::Refused,
        ),
        (OpError::EmptyArgv, OpErrorClass::Refused),
        (
            OpError::Spawn {
                program: String::new(),
                error: String::new(),
            },
            OpErrorClass::Refused,
        ),
        (
            OpError::TooLarge {
                path: String::new(),
                cap: 1,
            },
            OpErrorClass::Limit,
        ),
        (
            OpError::Timeout {
                after: Duration::from_secs(1),
            },
            OpErrorClass::Limit,
        ),
        (
            OpError::Keeper(sandkeeper_tokio::KeeperError::Closed),
            OpErrorClass::Gone,
        ),
    ];
    for (e, class) in cases {
        assert_eq!(e.class(), class, "{e:?}");
        assert_eq!(e.is_retryable(), class == OpErrorClass::Retryable, "{e:?}");
    }
}

/// What held before and must keep holding: a link out of the workspace is refused for every
/// file operation; the keeper's directory stays unwritable by name; a plain write, read, list
/// and remove work; a link inside the workspace is listed as a link and never followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_out_stay_refused_and_plain_files_keep_working() {
    let k = keeper("kept", Config::default());
    let (outside, precious) = host("kept");
    let g = call(&k, "c", "s").await;
    let w = g.work();
    let dir = k.backend().sandbox_dir(g.sandbox());
    symlink(&outside, dir.join("out")).unwrap();
    symlink(&precious, dir.join("file-out")).unwrap();
    for r in [
        w.read("out/precious").await.map(|_| ()),
        w.read("file-out").await.map(|_| ()),
        w.write("out/new", "x").await,
        w.list("out").await.map(|_| ()),
        w.exists("out/precious").await.map(|_| ()),
        w.remove("out/precious").await,
    ] {
        assert!(matches!(r, Err(OpError::Escapes { .. })), "{r:?}");
    }
    assert_eq!(names(&outside), ["precious"]);
    assert_eq!(std::fs::read(&precious).unwrap(), b"the host's own bytes\n");
    // Writing at the link's own name replaces the link, never the file it names.
    w.write("file-out", "mine").await.unwrap();
    assert_eq!(std::fs::read(&precious).unwrap(), b"the host's own bytes\n");
    assert_eq!(w.read("file-out").await.unwrap(), b"mine");
    assert!(matches!(
        w.write(".sandkeeper/x", "x").await,
        Err(OpError::InvalidPath { .. })
    ));
    w.write("a/b/c", "deep").await.unwrap();
    assert_eq!(w.read("a/b/c").await.unwrap(), b"deep");
    assert!(w.exists("a/b").await.unwrap());
    assert!(!w.exists("a/z").await.unwrap());
    assert!(matches!(w.read("a/z").await, Err(OpError::NotFound { .. })));
    let listed = w.list(".").await.unwrap();
    assert!(listed
        .iter()
        .any(|e| e.name == "out" && e.kind == sandkeeper_tokio::EntryKind::Symlink));
    w.remove("a").await.unwrap();
    assert!(!w.exists("a").await.unwrap());
    w.remove("out").await.unwrap();
    assert_eq!(
        names(&outside),
        ["precious"],
        "removing the link kept its target"
    );
    g.release().await;
}

/// What held before and must keep holding: an upload, a stop, a persist and a resume with no
/// planted file leave the session's log where the layout says, and the keeper's records in
/// `<root>/.meta/`, none in the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepers_own_files_keep_their_places() {
    let b = backend("places");
    b.start(start(1, "a", None)).await.unwrap();
    b.upload(upload(1, "sa", "v1\n")).await.unwrap();
    b.upload(upload(1, "sa", "v2\n")).await.unwrap();
    let session = b.sandbox_dir(SandboxId(1)).join(".sandkeeper/sa");
    assert_eq!(names(&session), ["session.log"], "no temporary left");
    assert_eq!(std::fs::read(session.join("session.log")).unwrap(), b"v2\n");
    let snapshot = b.stop(stop(1)).await.unwrap().unwrap();
    b.persist(persist(1, snapshot.clone())).await.unwrap();
    let kept = b
        .snapshots_dir()
        .join(snapshot.as_str())
        .join(".sandkeeper");
    assert_eq!(names(&kept), ["sa"], "no temporary, no marker");
    assert!(b.snapshot_record(&snapshot).unwrap().unwrap().persisted);
    assert_eq!(
        b.sandbox_record(SandboxId(1)).unwrap(),
        None,
        "gone with its directory"
    );
    b.start(start(2, "a", Some(snapshot.clone())))
        .await
        .unwrap();
    let meta = b.sandbox_dir(SandboxId(2)).join(".sandkeeper");
    assert_eq!(names(&meta), ["sa"]);
    assert_eq!(
        b.snapshot_record(&snapshot).unwrap(),
        None,
        "taken by the start"
    );
    let root = b.root();
    assert_eq!(names(&root.join(".meta/sandboxes")), ["sbx-2.json"]);
    assert!(names(&root.join(".meta/snapshots")).is_empty());
    assert_eq!(std::fs::read(meta.join("sa/session.log")).unwrap(), b"v2\n");
}

/// The keeper never reads a workspace's old metadata names: FIFOs a command made at
/// `.sandkeeper/expires`, `persisted` and `sandbox.json` of a kept snapshot neither hold up the
/// sweep a new backend runs on the root nor a resume of that snapshot, and the snapshot is
/// kept (its record's retention has not ended).
///
/// Bound: 10 s for what takes milliseconds, on a thread of its own so that a hang fails the
/// test; then the test opens each FIFO for writing, which frees a reader stuck in it.
#[test]
fn the_keepers_own_reads_never_wait_on_a_planted_fifo() {
    let root = fresh("meta-fifo");
    let snapshot = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let b = LocalBackend::new(LocalConfig::new(&root)).unwrap();
        rt.block_on(async {
            b.start(start(1, "a", None)).await.unwrap();
            let snapshot = b.stop(stop(1)).await.unwrap().unwrap();
            b.persist(persist(1, snapshot.clone())).await.unwrap();
            snapshot
        })
    };
    let meta = root
        .join(".snapshots")
        .join(snapshot.as_str())
        .join(".sandkeeper");
    let fifos = [
        meta.join("expires"),
        meta.join("persisted"),
        meta.join("sandbox.json"),
    ];
    for fifo in &fifos {
        let made = std::process::Command::new("mkfifo")
            .arg(fifo)
            .status()
            .unwrap();
        assert!(made.success());
    }

    let (tx, rx) = std::sync::mpsc::channel();
    let worker_root = root.clone();
    let taken = snapshot.clone();
    std::thread::spawn(move || {
        // A new backend sweeps the root at construction; then the key's next start resumes.
        let b = LocalBackend::new(LocalConfig::new(&worker_root)).map_err(|e| e.to_string());
        let resumed = b.map(|b| {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(b.start(start(2, "a", Some(taken))))
                .map_err(|e| e.to_string())
        });
        let _ = tx.send(resumed);
    });
    let answered = rx.recv_timeout(Duration::from_secs(10));
    for fifo in &fifos {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags_nonblocking()
            .open(fifo);
    }
    let resumed = answered.expect("the sweep and the resume answer within the bound");
    resumed.unwrap().unwrap();
    let record = sandkeeper_tokio::local::meta::sandbox_record(&root, SandboxId(2))
        .unwrap()
        .expect("recorded");
    assert_eq!(
        record.resumed_from.as_deref(),
        Some(snapshot.as_str()),
        "the start was for the snapshot"
    );
    use std::os::unix::fs::FileTypeExt;
    let taken = root
        .join("sbx-2/.sandkeeper/expires")
        .symlink_metadata()
        .unwrap();
    assert!(
        taken.file_type().is_fifo(),
        "the sweep kept the snapshot, and the start took it (the command's FIFO with it)"
    );
}

/// A command can write its own workspace's `sandbox.json`. Forging there that its sandbox took
/// another key's snapshot (`resumed_from`) does not hand its workspace to that key's next start
/// when the snapshot is missing (expired, removed): the start that looks for a crashed start's
/// taking checks the key too, and starts fresh; the forger's workspace stays where it was.
/// (Two backends on one root, as two processes of a fleet: the forger's sandbox is not among
/// the second one's own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sandbox_json_does_not_hand_a_workspace_to_another_key() {
    let root = fresh("forged-info");
    let first = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    first.start(start(5, "evil", None)).await.unwrap();
    let evil = first.sandbox_dir(SandboxId(5));
    std::fs::write(evil.join("planted"), b"for the victim").unwrap();
    let missing = Snapshot::new("sbx-1-0");
    let forged = serde_json::json!({
        "sandbox": 5,
        "key": "session:evil",
        "spec": "",
        "resumed_from": missing.as_str(),
    });
    std::fs::write(evil.join(".sandkeeper/sandbox.json"), forged.to_string()).unwrap();

    let second = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    second
        .start(start(6, "victim", Some(missing)))
        .await
        .unwrap();
    let victim = second.sandbox_dir(SandboxId(6));
    assert!(!victim.join("planted").exists(), "a fresh workspace");
    assert_eq!(
        std::fs::read(evil.join("planted")).unwrap(),
        b"for the victim",
        "the forger's workspace stays its own"
    );
}

/// `SandboxOps::went_away`, which `SandboxWork` asks after a failure the sandbox's going away
/// may explain (a program that could not start in a removed directory): nothing while the
/// sandbox is there, `SandboxGone` once its workspace was removed or for a sandbox the backend
/// does not run, `Stopped` once stopped (which `SandboxWork` answers as `SandboxGone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn went_away_tells_a_sandbox_there_from_one_gone() {
    use sandkeeper_tokio::SandboxOps;
    let b = backend("went-away");
    b.start(start(1, "a", None)).await.unwrap();
    b.start(start(2, "b", None)).await.unwrap();
    assert_eq!(b.went_away(SandboxId(1)).await, None);
    std::fs::remove_dir_all(b.sandbox_dir(SandboxId(1))).unwrap();
    assert!(matches!(
        b.went_away(SandboxId(1)).await,
        Some(OpError::SandboxGone { .. })
    ));
    b.stop(stop(2)).await.unwrap();
    assert_eq!(
        b.went_away(SandboxId(2)).await,
        Some(OpError::Stopped {
            sandbox: SandboxId(2)
        })
    );
    assert!(matches!(
        b.went_away(SandboxId(99)).await,
        Some(OpError::SandboxGone { .. })
    ));
}

/// Markers a command wrote in its live workspace do not decide what is kept: a forged
/// `persisted` does not keep a snapshot no Persist kept (Shutdown removes it), and a forged,
/// early `expires` does not get a snapshot Persist kept without a retention swept. Stop clears
/// both before the workspace becomes the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_a_command_forged_decide_nothing() {
    let root = fresh("forged-markers");
    let b = LocalBackend::new(LocalConfig::new(&root)).unwrap();
    // A forged `persisted`, no Persist: the snapshot goes with the sandbox.
    b.start(start(1, "a", None)).await.unwrap();
    let meta = b.sandbox_dir(SandboxId(1)).join(".sandkeeper");
    std::fs::write(meta.join("persisted"), b"persisted\n").unwrap();
    let unkept = b.stop(stop(1)).await.unwrap().unwrap();
    b.shutdown(SandboxId(1), None).await.unwrap();
    assert!(
        !b.snapshots_dir().join(unkept.as_str()).exists(),
        "no Persist kept it"
    );

    // A forged expiry in the past, then a Persist without retention: kept by the next sweep.
    b.start(start(2, "b", None)).await.unwrap();
    let meta = b.sandbox_dir(SandboxId(2)).join(".sandkeeper");
    std::fs::write(meta.join("expires"), b"0\n").unwrap();
    let kept = b.stop(stop(2)).await.unwrap().unwrap();
    let mut request = persist(2, kept.clone());
    request.retain_until = None;
    b.persist(request).await.unwrap();
    let swept = b.sweep_expired(SystemTime::UNIX_EPOCH + Duration::from_secs(1));
    assert_eq!(swept.unwrap(), 0);
    assert!(b.snapshots_dir().join(kept.as_str()).exists());
}
