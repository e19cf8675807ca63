//! The sandkeeper core behind plain std threads: no async runtime at all.
//!
//! Run it with `cargo run -p sandkeeper-shell --example std_threads`.
//!
//! What an embedder writes is here, in four pieces:
//!
//! - a **backend** of its own: each sandbox is a directory under a temporary root (Start =
//!   mkdir, Upload = write the session's file atomically, Stop and Persist = nothing, Shutdown =
//!   remove the directory);
//! - an **executor** ([`DirExecutor`]) that hands the core's commands to threads: lifecycle
//!   commands to one worker thread (so one sandbox's commands run in the core's order), each
//!   upload to a thread of its own (so no upload waits behind another);
//! - a **timer thread** that calls `Shared::timeout` at the core's deadlines;
//! - the **application**: four session threads. Three acquire a call, flush three versions of
//!   their session log and wait for their mirror to settle; the fourth's sandbox directory is
//!   deleted from outside while its call is live, and the main thread reports the death.
//!   Then the main thread closes, and checks the outcome.
//!
//! Every wait is ordered by channels, never by sleeping, so the outcome is the same on every
//! run; it panics (exits non-zero) if an assertion fails.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Command, Config, DropReason, Error, Event, Input, Instant, Lifecycle,
    PathName, Payload, SandboxId, SessionId, Settlement, StoreCommand, UploadFailure, Version,
};
use sandkeeper_shell::{CallTicket, Executor, KeeperError, Released, Shared};

/// The shell, with our executor.
type Shell = Shared<DirExecutor>;

/// Runs the core's commands on std threads. Its methods are called with the core's lock held,
/// so each only hands work to a thread or a channel and returns at once.
struct DirExecutor {
    /// Our clock's origin: the core's `Instant` is the time elapsed since it.
    origin: std::time::Instant,
    /// Where the sandbox directories live.
    root: PathBuf,
    /// Start, Stop, Persist and Shutdown, to the lifecycle worker, in the core's order.
    lifecycle: Sender<Command>,
    /// Wakes the timer thread: the core's next deadline changed.
    wake_timer: Sender<()>,
    /// Every settlement the core reported, as (session, version, outcome).
    settled: Mutex<Vec<(SessionId, Version, Settlement)>>,
}

impl Executor for DirExecutor {
    fn now(&self) -> Instant {
        let nanos = self.origin.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn execute(&self, shared: &Arc<Shell>, command: Command) {
        match command {
            // Each upload on a thread of its own. It holds a weak handle: threads never keep
            // the shell alive.
            Command::Upload {
                upload,
                sandbox,
                session,
                path,
                payload,
                ..
            } => {
                let dir = self.root.join(sandbox.to_string());
                let shell = Arc::downgrade(shared);
                thread::spawn(move || {
                    let input = match write_atomically(&dir, &format!("{session}.{path}"), &payload)
                    {
                        Ok(()) => Input::UploadOk { upload },
                        // No directory: the sandbox is gone (the core treats it as a death).
                        Err(_) => Input::UploadFailed {
                            upload,
                            failure: UploadFailure::Gone,
                        },
                    };
                    if let Some(shell) = shell.upgrade() {
                        shell.answer(input);
                    }
                });
            }
            // Our operations take microseconds, so there is nothing to cancel or abandon; an
            // answer that comes after the core stopped waiting is stale, and ignored. A real
            // backend would also drop each operation at its `deadline`.
            Command::CancelUpload { .. } | Command::Abandon { .. } | Command::Drain { .. } => {}
            // The worker lives as long as the shell, so this send cannot fail.
            lifecycle => drop(self.lifecycle.send(lifecycle)),
        }
    }

    fn store(&self, _: &Arc<Shell>, command: StoreCommand) {
        // One process: the core runs without `Config::fleet`, and orders store work only in
        // fleet mode. An executor for a fleet runs each on its own and answers it.
        unreachable!("store work without fleet mode: {command:?}");
    }

    fn observe(&self, event: &Event) {
        if let Event::Settled {
            session,
            version,
            outcome,
            ..
        } = event
        {
            let record = (session.clone(), *version, outcome.clone());
            self.settled.lock().unwrap().push(record);
        }
    }

    fn rearm(&self, _deadline: Option<Instant>) {
        // The timer may have ended after close: then nobody needs waking.
        let _ = self.wake_timer.send(());
    }
}

/// Writes `name` into `dir` all or nothing: a temporary file, then a rename over the final one.
/// Never creates `dir`: a sandbox that is gone stays gone.
fn write_atomically(dir: &Path, name: &str, payload: &Payload) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let temporary = dir.join(format!(".{name}.{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    fs::write(&temporary, payload.as_bytes())?;
    fs::rename(&temporary, dir.join(name))
}

/// The lifecycle worker: runs Start, Stop, Persist and Shutdown one after the other, in the
/// order the core ordered them, and answers each. Reports every finished shutdown on `done`.
/// Ends when the shell (and with it the executor's sender) is gone.
fn lifecycle_worker(
    shell: Weak<Shell>,
    root: PathBuf,
    commands: Receiver<Command>,
    done: Sender<SandboxId>,
) {
    for command in commands {
        let sandbox = command.sandbox();
        let dir = root.join(sandbox.to_string());
        let answer = match command {
            Command::Start { .. } => match fs::create_dir(&dir) {
                Ok(()) => Input::StartOk { sandbox },
                Err(_) => Input::StartFailed { sandbox },
            },
            Command::Stop { .. } => Input::StopOk {
                sandbox,
                snapshot: None,
            },
            Command::Persist { .. } => Input::PersistOk { sandbox },
            Command::Shutdown { .. } => match fs::remove_dir_all(&dir) {
                Ok(()) => Input::ShutdownOk { sandbox },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Input::ShutdownOk { sandbox },
                Err(_) => Input::ShutdownFailed { sandbox },
            },
            other => unreachable!("{} is not a lifecycle command", other.name()),
        };
        let shutdown = matches!(answer, Input::ShutdownOk { .. });
        let Some(shell) = shell.upgrade() else { return };
        shell.answer(answer); // never inside an Executor method: here, on our own thread
        if shutdown {
            let _ = done.send(sandbox);
        }
    }
}

/// The timer thread: fires the core's deadlines. It checks the clock against the next deadline
/// before sleeping, sleeps until then or until `rearm` wakes it, and ends after close.
fn timer(shell: Weak<Shell>, wake: Receiver<()>) {
    loop {
        let Some(strong) = shell.upgrade() else {
            return;
        };
        if strong.is_closed() {
            return;
        }
        let (now, next) = (strong.executor().now(), strong.next_deadline());
        let sleep = match next {
            Some(at) if at <= now => {
                strong.timeout();
                continue;
            }
            Some(at) => Some(at.saturating_duration_since(now)),
            None => None,
        };
        drop(strong); // never sleep holding the shell
        let gone = match sleep {
            Some(duration) => wake.recv_timeout(duration) == Err(RecvTimeoutError::Disconnected),
            None => wake.recv().is_err(),
        };
        if gone {
            return;
        }
    }
}

/// What a session thread hands back: the versions it flushed.
type Flushed = Vec<(SessionId, Version)>;

/// One session's work: acquires call `c{n}` for session `s{n}`, flushes `versions` versions of
/// its log, waits for its mirror to settle and checks that its sandbox holds the last one.
/// Returns what it flushed and the ready call, still live.
fn session_work(shell: &Arc<Shell>, n: u32, versions: u32) -> (Flushed, CallTicket<DirExecutor>) {
    let session = SessionId::new(format!("s{n}")).unwrap();
    let spec = CallSpec::new(CallId::new(format!("c{n}")).unwrap(), session.clone());
    // A blocking wait: the worker thread runs the Start and answers StartOk.
    let ticket = shell.acquire(spec).unwrap().wait().expect("ready");
    let mut flushed = Vec::new();
    for v in 1..=versions {
        let payload = Payload::new(format!("{session} version {v}\n").into_bytes());
        let version = shell
            .flush(&session, &PathName::session_log(), payload)
            .unwrap();
        flushed.push((session.clone(), version));
    }
    shell.mirror_settled(&session).wait();
    let dir = shell.executor().root.join(ticket.sandbox().to_string());
    let content = fs::read_to_string(dir.join(format!("{session}.session.log"))).unwrap();
    assert_eq!(content, format!("{session} version {versions}\n"));
    (flushed, ticket)
}

/// Runs the whole example; panics if an assertion fails.
pub fn main() {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("sandkeeper-std-{}-{run}", std::process::id()));
    fs::create_dir_all(&root).unwrap();

    // 1. The shell around the core, then the threads that serve it, with weak handles.
    let (lifecycle, commands) = mpsc::channel();
    let (wake_timer, wake) = mpsc::channel();
    let (shutdown_done, shutdowns) = mpsc::channel();
    #[allow(clippy::disallowed_methods)] // a driver owns the clock: this is its origin
    let origin = std::time::Instant::now();
    let settled = Mutex::default();
    let executor = DirExecutor {
        origin,
        root: root.clone(),
        lifecycle,
        wake_timer,
        settled,
    };
    let shell = Shared::new(Lifecycle::new(Config::default()).unwrap(), executor);
    let (weak, dir) = (Arc::downgrade(&shell), root.clone());
    let worker = thread::spawn(move || lifecycle_worker(weak, dir, commands, shutdown_done));
    let weak = Arc::downgrade(&shell);
    let timer = thread::spawn(move || timer(weak, wake));

    // 2. The sessions, a thread each. Sessions 1 and 2 release their calls (the core then
    //    drains, stops and shuts their sandboxes down).
    let mut done = Vec::new();
    for n in [1, 2] {
        let shell = shell.clone();
        done.push(thread::spawn(move || {
            let (flushed, ticket) = session_work(&shell, n, 3);
            assert_eq!(ticket.release().wait(), Some(Released::Completed));
            flushed
        }));
    }
    // Session 4's sandbox dies under its live call.
    let (doomed, doomed_rx) = mpsc::channel();
    let (dead, dead_rx) = mpsc::channel();
    let shell4 = shell.clone();
    done.push(thread::spawn(move || {
        let (mut flushed, ticket) = session_work(&shell4, 4, 1);
        doomed.send(ticket.sandbox()).unwrap();
        dead_rx.recv().unwrap();
        let session = SessionId::new("s4").unwrap();
        assert!(ticket.is_lost(), "the call saw SandboxLost");
        let resolved = shell4.resolve(&session);
        assert!(matches!(
            resolved,
            Err(KeeperError::Core(Error::SandboxGone { .. }))
        ));
        // A flush after the death is accepted and settles at once: dropped, sandbox-gone.
        let payload = Payload::new(b"too late\n".to_vec());
        let version = shell4
            .flush(&session, &PathName::session_log(), payload)
            .unwrap();
        flushed.push((session.clone(), version));
        shell4.mirror_settled(&session).wait();
        assert_eq!(ticket.release().wait(), Some(Released::Completed));
        flushed
    }));
    // Session 3 keeps its call until close has revoked it.
    let (ready, ready_rx) = mpsc::channel();
    let (closed, closed_rx) = mpsc::channel();
    let shell3 = shell.clone();
    let s3 = thread::spawn(move || {
        let (flushed, ticket) = session_work(&shell3, 3, 3);
        ready.send(()).unwrap();
        closed_rx.recv().unwrap();
        assert_eq!(ticket.release().wait(), Some(Released::Closed));
        flushed
    });

    // 3. The death: someone deletes session 4's directory; we notice and tell the core.
    let gone = doomed_rx.recv().unwrap();
    fs::remove_dir_all(root.join(gone.to_string())).unwrap();
    shell.answer(Input::Died { sandbox: gone });
    dead.send(()).unwrap();

    // 4. Once sessions 1, 2 and 4 are done and their sandboxes shut down, and session 3 is
    //    ready, close: session 3's call is revoked at the deadline, its sandbox shut down.
    let mut flushed: Flushed = done.into_iter().flat_map(|t| t.join().unwrap()).collect();
    ready_rx.recv().unwrap();
    let patience = Duration::from_secs(30); // only a failure waits this long
    let mut shut: Vec<SandboxId> = (0..3)
        .map(|_| shutdowns.recv_timeout(patience).unwrap())
        .collect();
    let report = shell
        .close(Duration::from_millis(200))
        .wait()
        .expect("a report");
    closed.send(()).unwrap();
    flushed.extend(s3.join().unwrap());
    shut.push(shutdowns.recv_timeout(patience).unwrap());

    // 5. The outcome.
    assert_eq!(report.revoked_calls, [CallId::new("c3").unwrap()]);
    assert_eq!(report.shut_down, 1, "{report:?}");
    assert!(report.refused_waiters.is_empty() && report.dropped_versions.is_empty());
    assert!(report.unconfirmed.is_empty() && report.revoked_holds.is_empty());
    // Four shutdowns, of four different sandboxes, the dead one's included.
    assert!(shut.contains(&gone));
    shut.sort();
    shut.dedup();
    assert_eq!(shut.len(), 4, "a sandbox was shut down twice");
    // Every flushed version settled exactly once; only session 4's late one was dropped.
    let mut outcomes = BTreeMap::new();
    for (session, version, outcome) in shell.executor().settled.lock().unwrap().iter() {
        let first = outcomes.insert((session.clone(), *version), outcome.clone());
        assert!(first.is_none(), "{session} {version} settled twice");
    }
    flushed.sort();
    assert!(outcomes.keys().eq(flushed.iter()), "settled: {outcomes:?}");
    let late = (SessionId::new("s4").unwrap(), Version(2));
    for (key, outcome) in &outcomes {
        let expected = (key == &late).then_some(DropReason::SandboxGone);
        match outcome {
            Settlement::Dropped { reason } => assert_eq!(Some(*reason), expected),
            _ => assert_eq!(None, expected, "{key:?}: {outcome:?}"),
        }
    }
    let tally = shell.tally();
    assert_eq!(tally.sandboxes_lost, 1);
    assert_eq!((tally.calls_released, tally.calls_revoked), (3, 1));
    shell.check_invariants().unwrap();
    assert_eq!(shell.release_refusals(), 0);
    assert!(
        fs::read_dir(&root).unwrap().next().is_none(),
        "a sandbox directory is left"
    );

    // 6. Drop the last handle: the worker's and the timer's channels close, and they end.
    drop(shell);
    worker.join().unwrap();
    timer.join().unwrap();
    fs::remove_dir(&root).unwrap();
    println!(
        "std_threads: {} versions settled exactly once; {report:?}",
        outcomes.len()
    );
}
