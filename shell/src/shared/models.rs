//! Loom models of the shared-state layer: the real [`Shared`], [`PendingCall`], [`CallTicket`]
//! and signals, on loom's mutex, with the real core inside; threads play the application, the
//! backend and the timer. Run:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
//!     cargo test -p sandkeeper-shell --release --lib models -- --nocapture
//! ```
//!
//! Each model prints a line `loom model NAME: N iterations (...)` (CI greps for it).

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::AtomicBool;
use loom::thread;
use sandkeeper::{
    CallId, CallSpec, Command, Config, Event, Input, Instant, Lifecycle, PathName, Payload,
    SessionId, StoreCommand,
};

use super::{Executor, Shared};
use crate::error::Released;

/// The executor of the models: records commands (in the core's order) for the backend thread,
/// and reads a clock the timer thread moves. Its std locks are taken only for a push or a take,
/// with no loom operation inside, so they never block a loom thread.
#[derive(Default)]
struct Recorder {
    now: AtomicU64,
    pending: StdMutex<Vec<Command>>,
    history: StdMutex<Vec<Command>>,
    events: StdMutex<Vec<Event>>,
    /// Store work (the models run one process: none is ever ordered).
    store: StdMutex<Vec<StoreCommand>>,
}

impl Executor for Recorder {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.now.load(Ordering::SeqCst))
    }

    fn execute(&self, _shared: &std::sync::Arc<Shared<Self>>, command: Command) {
        self.history.lock().unwrap().push(command.clone());
        self.pending.lock().unwrap().push(command);
    }

    fn store(&self, _shared: &std::sync::Arc<Shared<Self>>, command: StoreCommand) {
        self.store.lock().unwrap().push(command);
    }

    fn observe(&self, event: &Event) {
        self.events.lock().unwrap().push(event.clone());
    }

    fn rearm(&self, _deadline: Option<Instant>) {}
}

type Model = std::sync::Arc<Shared<Recorder>>;

fn new_model() -> Model {
    Shared::new(
        Lifecycle::new(Config::default()).unwrap(),
        Recorder::default(),
    )
}

fn spec(call: &str, session: &str) -> CallSpec {
    CallSpec::new(CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

fn session() -> SessionId {
    SessionId::new("s").unwrap()
}

/// The backend: answers every command recorded so far with success. Returns how many.
fn answer_pending(shared: &Model) -> usize {
    let commands = std::mem::take(&mut *shared.executor().pending.lock().unwrap());
    for command in &commands {
        let input = match command {
            Command::Start { sandbox, .. } => Input::StartOk { sandbox: *sandbox },
            Command::Upload { upload, .. } => Input::UploadOk { upload: *upload },
            Command::Stop { sandbox, .. } => Input::StopOk {
                sandbox: *sandbox,
                snapshot: None,
            },
            Command::Persist { sandbox, .. } => Input::PersistOk { sandbox: *sandbox },
            Command::Shutdown { sandbox, .. } => Input::ShutdownOk { sandbox: *sandbox },
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Hook { .. }
            | Command::Abandon { .. } => continue,
            Command::Adopt { .. } | Command::Relinquish { .. } => {
                unreachable!("the models configure no fleet: {command:?}")
            }
        };
        Shared::answer(shared, input);
    }
    commands.len()
}

/// Answers until `done` is set, yielding to the other threads between rounds; with `tick`, it
/// is the timer too: each round moves the clock a second on and fires due deadlines.
fn serve_until(shared: &Model, done: &AtomicBool, tick: bool) {
    loop {
        answer_pending(shared);
        if tick {
            shared
                .executor()
                .now
                .fetch_add(Duration::from_secs(1).as_nanos() as u64, Ordering::SeqCst);
            Shared::timeout(shared);
        }
        if done.load(loom::sync::atomic::Ordering::SeqCst) {
            break;
        }
        thread::yield_now();
    }
    while answer_pending(shared) > 0 {}
}

fn shutdowns(shared: &Model) -> usize {
    let history = shared.executor().history.lock().unwrap();
    history
        .iter()
        .filter(|c| matches!(c, Command::Shutdown { .. }))
        .count()
}

/// Checks what every model must end with: invariants, every call ended exactly once, every
/// flushed version settled exactly once, nothing executed after `Closed`.
fn check_end(shared: &Model) {
    shared.check_invariants().unwrap();
    let stats = shared.stats();
    assert_eq!(
        stats.calls_acquired,
        stats.calls_released + stats.calls_failed + stats.calls_revoked,
        "every call ends exactly once: {stats:?}"
    );
    assert_eq!(
        shared.release_refusals(),
        0,
        "no second release was attempted"
    );
    let tally = shared.tally();
    assert_eq!(
        tally.settled_total(),
        stats.versions_flushed,
        "every version settles once"
    );
}

fn run(name: &str, model: impl Fn() + Sync + Send + 'static) {
    let iterations = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    let counted = move || {
        counter.fetch_add(1, Ordering::SeqCst);
        model();
    };
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(counted);
    let n = iterations.load(Ordering::SeqCst);
    println!(
        "loom model {name}: {n} iterations (preemption bound {:?})",
        builder.preemption_bound
    );
}

/// No lost wake-up: the acquire's waiter sees the backend's StartOk whichever runs first, and
/// the release's waiter sees CallReleased while a flush races it.
#[test]
fn acquire_ready_release_and_flush_race_without_a_lost_wake_up() {
    run("acquire_ready_release_and_flush", || {
        let shared = new_model();
        let pending = Shared::acquire(&shared, spec("a", "s")).unwrap();
        let done = std::sync::Arc::new(AtomicBool::new(false));

        let waiter = {
            let done = done.clone();
            thread::spawn(move || {
                // The blocking waits of plain threads (loom's `block_on` under the shim).
                let ticket = pending.wait().expect("ready");
                let outcome = ticket.release().wait();
                done.store(true, loom::sync::atomic::Ordering::SeqCst);
                outcome
            })
        };
        let flusher = {
            let shared = shared.clone();
            thread::spawn(move || {
                let payload = Payload::new(b"x".to_vec());
                Shared::flush(&shared, &session(), &PathName::session_log(), payload).unwrap();
            })
        };
        serve_until(&shared, &done, false);
        assert_eq!(waiter.join().unwrap(), Some(Released::Completed));
        flusher.join().unwrap();
        while answer_pending(&shared) > 0 {}
        check_end(&shared);
        assert_eq!(shutdowns(&shared), 1);
        assert!(shared.with_core(|c| c.is_mirror_settled(&session())));
    });
}

/// Exactly-once release on drop: the acquire future is dropped after one poll while the
/// backend's StartOk races it; whichever wins (the pending call or the ready ticket) releases
/// the call once, and its sandbox is shut down once.
#[test]
fn a_dropped_acquire_or_guard_releases_exactly_once() {
    run("dropped_acquire_releases_once", || {
        let shared = new_model();
        let pending = Shared::acquire(&shared, spec("a", "s")).unwrap();
        let canceller = thread::spawn(move || {
            let mut ready = Box::pin(pending.ready());
            let polled = block_on(std::future::poll_fn(|cx| {
                std::task::Poll::Ready(ready.as_mut().poll(cx))
            }));
            // Ready or not, drop it: a ticket releases on drop, a pending call too.
            drop(polled);
            drop(ready);
        });
        let backend = {
            let shared = shared.clone();
            thread::spawn(move || {
                answer_pending(&shared);
            })
        };
        canceller.join().unwrap();
        backend.join().unwrap();
        while answer_pending(&shared) > 0 {}
        check_end(&shared);
        assert_eq!(shared.stats().calls_released, 1);
        assert_eq!(shutdowns(&shared), 1);
        assert_eq!(shared.with_core(|c| c.live_calls()), 0);
    });
}

/// Nothing is accepted after close: an acquire racing close is either accepted before close
/// began (and then ends, released by its dropped future) or refused with `Closed`; close
/// completes, wakes its waiter, and nothing is executed after `Closed`.
#[test]
fn an_acquire_racing_close_is_accepted_before_or_refused_after() {
    run("acquire_vs_close", || {
        let shared = new_model();
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let caller = {
            let shared = shared.clone();
            thread::spawn(move || match Shared::acquire(&shared, spec("a", "s")) {
                Ok(pending) => {
                    drop(pending);
                    true
                }
                Err(e) => {
                    assert!(
                        matches!(
                            e,
                            crate::KeeperError::Core(sandkeeper::Error::Closed { .. })
                        ),
                        "{e:?}"
                    );
                    false
                }
            })
        };
        let closer = {
            let shared = shared.clone();
            let done = done.clone();
            thread::spawn(move || {
                let report = block_on(Shared::close(&shared, Duration::from_secs(1)));
                done.store(true, loom::sync::atomic::Ordering::SeqCst);
                report.expect("a report")
            })
        };
        serve_until(&shared, &done, false);
        let accepted = caller.join().unwrap();
        let report = closer.join().unwrap();
        assert!(shared.is_closed());
        // Shutdowns acknowledged during close are in the report; one may have come before.
        assert!(report.shut_down as usize <= shutdowns(&shared));
        assert_eq!(shutdowns(&shared), usize::from(accepted));
        check_end(&shared);
        // After close, every input is refused and nothing more is executed.
        let before = shared.executor().history.lock().unwrap().len();
        assert!(Shared::acquire(&shared, spec("b", "s")).is_err());
        assert_eq!(shared.executor().history.lock().unwrap().len(), before);
    });
}

/// A guard dropped while close revokes at its deadline: the call ends exactly once (released
/// or revoked, never both), close completes, and the timer thread's deadline wakes close.
#[test]
fn a_guard_drop_racing_close_revocation_ends_the_call_once() {
    run("guard_drop_vs_close_revoke", || {
        let shared = new_model();
        let pending = Shared::acquire(&shared, spec("a", "s")).unwrap();
        answer_pending(&shared);
        let ticket = block_on(pending.ready()).expect("ready");
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let dropper = thread::spawn(move || drop(ticket));
        let closer = {
            let shared = shared.clone();
            let done = done.clone();
            thread::spawn(move || {
                let report = block_on(Shared::close(&shared, Duration::from_secs(1)));
                done.store(true, loom::sync::atomic::Ordering::SeqCst);
                report.expect("a report")
            })
        };
        // The backend and the timer: the close deadline passes while the drop races.
        serve_until(&shared, &done, true);
        dropper.join().unwrap();
        let report = closer.join().unwrap();
        let stats = shared.stats();
        assert_eq!(stats.calls_released + stats.calls_revoked, 1);
        assert_eq!(report.revoked_calls.len() as u64, stats.calls_revoked);
        check_end(&shared);
        assert_eq!(shutdowns(&shared), 1);
    });
}
