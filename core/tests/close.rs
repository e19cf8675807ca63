//! Close: live calls finish and new work is refused; at the deadline what is left is revoked and
//! reported; suspended and unconfirmed sandboxes are reported after the second deadline; warm
//! sandboxes are shut down; keys and session records are forgotten; after `Closed` every input is
//! rejected. Race R8 (`docs/design.md`, "The races") is here.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

// ----------------------------------------------------------------------------------------------
// Close

/// Close: `Closed` for acquire and for a second close; queued calls fail `closed`; flushes
/// refused for sessions with nothing live; live calls may flush and end; close completes as soon
/// as everything drained and shut down, before its deadline.
#[test]
fn close_lets_live_calls_finish_and_refuses_new_work() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    let x = h.ready_call("a", "s");
    h.acquire("q", "s"); // queued
    let y = h.ready_call("b", "sb");
    h.release("b");
    h.take_events();
    h.expect_commands(&[drain(y, &["sb"]), stop(y)]);
    h.close(secs(60)).unwrap();
    h.expect_events(&[failed("q", ErrorKind::Closed)]);
    h.expect_commands(&[]);
    assert_eq!(
        h.try_acquire(spec("n", "new")),
        Err(Error::Closed { what: "acquire" })
    );
    assert_eq!(h.close(secs(1)), Err(Error::Closed { what: "close" }));
    assert_eq!(
        h.try_flush("sb", &log(), "x"),
        Err(Error::Closed { what: "flush" })
    );
    assert_eq!(
        h.try_flush("never", &log(), "x"),
        Err(Error::Closed { what: "flush" })
    );
    // The live call flushes and ends; its mirror drains.
    h.wait(secs(1));
    h.flush("s", &log(), "last words");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    // The draining sandbox's session may still flush: it has somewhere to go.
    assert_eq!(h.flush("s", &log(), "after release"), 2);
    h.upload_ok(u);
    h.expect_events(&[uploaded("s", &log(), 1, x)]);
    let u2 = h.expect_upload("s", &log(), 2, x);
    h.upload_ok(u2);
    h.expect_events(&[
        uploaded("s", &log(), 2, x),
        released("a"),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[stop(x)]);
    h.stop_ok(x, None);
    h.stop_ok(y, None);
    h.expect_commands(&[shutdown(x), shutdown(y)]);
    h.shutdown_ok(x);
    h.quiet();
    h.shutdown_ok(y);
    h.expect_events(&[Event::Closed {
        report: Box::new(CloseReport {
            refused_waiters: vec![call("q")],
            shut_down: 2,
            ..CloseReport::default()
        }),
    }]);
    assert_eq!(h.now, Instant::ZERO + secs(1));
    h.assert_all_settled();
    h.assert_all_shut_down();
}

/// Close at its deadline revokes live calls (`CallRevoked`), holds, and unsettled versions
/// (`closed`), cuts drains and starts, and reports all of it in `Closed { report }`.
#[test]
fn close_revokes_what_is_left_at_the_deadline_and_reports_it() {
    let mut h = Script::with(|c| {
        c.upload_timeout = secs(600);
        c.start_timeout = secs(600);
        c.scope = Scope::Call;
    });
    let x = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, x);
    h.flush("sa", &log(), "v2");
    h.hold("sa").unwrap();
    h.acquire("b", "sb"); // still starting at the deadline
    let y = h.started();
    h.close(secs(2)).unwrap();
    h.quiet();
    h.advance(secs(2));
    h.expect_events(&[
        revoked("a"),
        revoked("b"),
        dropped("sa", &log(), 1, DropReason::Closed),
        dropped("sa", &log(), 2, DropReason::Closed),
        mirror_settled("sa"),
    ]);
    h.expect_commands(&[
        drain(x, &["sa"]),
        cancel(u1, x),
        stop(x),
        abandon(y),
        shutdown(y),
    ]);
    h.start_ok(y); // stale: it was shut down
    h.quiet();
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(y);
    h.shutdown_ok(x);
    h.expect_events(&[Event::Closed {
        report: Box::new(CloseReport {
            revoked_calls: vec![call("a"), call("b")],
            refused_waiters: vec![],
            dropped_versions: vec![
                (session("sa"), log(), Version(1)),
                (session("sa"), log(), Version(2)),
            ],
            revoked_holds: vec![(session("sa"), 1)],
            shut_down: 2,
            suspended: vec![],
            unconfirmed: vec![],
            retained: vec![],
        }),
    }]);
    h.assert_all_settled();
    h.assert_all_shut_down();
}

/// Close under `Suspend` reports the suspended sandboxes; one whose Shutdown is never answered
/// is reported unconfirmed after the second deadline (`close_grace`).
#[test]
fn close_reports_suspended_and_unconfirmed_after_the_second_deadline() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::Suspend); // grace 6 s
    let x = h.ready_call("a", "s");
    h.close(secs(1)).unwrap();
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, Some("snap"));
    h.expect_commands(&[persist_to_suspend(x, Some("snap"))]);
    h.persist_ok(x);
    h.expect_commands(&[]);
    h.expect_events(&[Event::Closed {
        report: Box::new(CloseReport {
            suspended: vec![x],
            // Kept until the key's next start: no retention.
            retained: vec![Retained {
                key: Key::Session(session("s")),
                snapshot: Snapshot::new("snap"),
                until: None,
            }],
            ..CloseReport::default()
        }),
    }]);

    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.close(secs(1)).unwrap();
    h.release("a");
    h.take_events();
    h.take_commands();
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    // The shutdown hangs. Revoked at once (nothing left to drain), the grace is 6 s; the
    // command timeout (5 s) reports it unconfirmed first.
    h.advance(secs(5));
    h.expect_events(&[
        unconfirmed(x),
        Event::Closed {
            report: Box::new(CloseReport {
                unconfirmed: vec![x],
                ..CloseReport::default()
            }),
        },
    ]);
    assert!(h.core.is_closed());

    // With a longer command timeout, the second deadline cuts the wait.
    let mut h = Script::with(|c| c.command_timeout = secs(60));
    let x = h.ready_call("a", "s");
    h.close(secs(1)).unwrap();
    h.release("a");
    h.take_events();
    h.take_commands();
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    h.advance(ms(5999));
    h.quiet();
    h.advance(ms(1));
    h.expect_events(&[
        unconfirmed(x),
        Event::Closed {
            report: Box::new(CloseReport {
                unconfirmed: vec![x],
                ..CloseReport::default()
            }),
        },
    ]);
    assert!(matches!(
        h.input(Input::ShutdownOk { sandbox: x }),
        Err(Error::Closed { .. })
    ));
}

/// After `Closed`: every input is rejected with `Closed`, `poll_timeout` is `None`, no command
/// or event ever comes.
#[test]
fn after_closed_every_input_is_rejected() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.close(secs(1)).unwrap();
    h.advance(secs(1));
    h.take_events();
    h.take_commands();
    h.stop_ok(x, None);
    h.take_commands();
    h.shutdown_ok(x);
    assert!(matches!(h.take_events().pop(), Some(Event::Closed { .. })));
    assert!(h.core.is_closed());
    assert_eq!(h.core.poll_timeout(), None);
    let inputs = vec![
        Input::Acquire(spec("b", "s")),
        Input::Release {
            call: call("a"),
            way: None,
        },
        Input::Flush {
            session: session("s"),
            path: log(),
            payload: Payload::default(),
        },
        Input::Hold {
            session: session("s"),
        },
        Input::Unhold {
            session: session("s"),
        },
        Input::Enter {
            session: session("s"),
        },
        Input::Leave { sandbox: x },
        Input::Close { deadline: secs(1) },
        Input::StartOk { sandbox: x },
        Input::StartFailed { sandbox: x },
        Input::UploadOk { upload: u },
        Input::UploadFailed {
            upload: u,
            failure: UploadFailure::Transient,
        },
        Input::StopOk {
            sandbox: x,
            snapshot: None,
        },
        Input::StopFailed { sandbox: x },
        Input::PersistOk { sandbox: x },
        Input::PersistFailed { sandbox: x },
        Input::ShutdownOk { sandbox: x },
        Input::ShutdownFailed { sandbox: x },
        Input::Died { sandbox: x },
        Input::Timeout,
    ];
    assert_eq!(inputs.len(), 20);
    for input in inputs {
        h.wait(secs(100));
        let got = h.input(input.clone());
        assert_eq!(
            got.map_err(|e| e.kind()),
            Err(ErrorKind::Closed),
            "{input:?}"
        );
        h.quiet();
        assert_eq!(h.core.poll_timeout(), None);
    }
    assert!(matches!(h.resolve("s"), Err(Error::Closed { .. })));
}

/// `KeepWarm`: warm sandboxes are shut down at close.
#[test]
fn keep_warm_sandboxes_are_shut_down_at_close() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.take_events();
    h.close(secs(60)).unwrap();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);
    h.expect_events(&[Event::Closed {
        report: Box::new(CloseReport {
            shut_down: 1,
            ..CloseReport::default()
        }),
    }]);
    assert_eq!(h.now, Instant::ZERO); // close did not wait for its deadline
}

/// Close's first phase lasts while a call is live, even one whose sandbox died (so no sandbox
/// is up): the call is revoked at the deadline, not at once. Pins `close_progress`'s "a call or
/// an upload is live" guard.
#[test]
fn close_waits_for_a_live_call_on_a_dead_sandbox() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let t = Instant::ZERO;
    let x = ready_call(&mut core, "a", "s");
    core.handle_died(t, x).unwrap();
    assert_eq!(
        events(&mut core),
        vec![
            Event::WorkspaceLost {
                sandbox: x,
                key: Key::Session(SessionId::new("s").unwrap())
            },
            Event::SandboxLost {
                call: id("a"),
                sandbox: x
            }
        ]
    );
    for command in commands(&mut core) {
        if let Command::Shutdown { sandbox, .. } = command {
            core.handle_shutdown_ok(t, sandbox).unwrap();
        }
    }
    assert_eq!(core.call_status(&id("a")), Some(CallStatus::Lost(x)));

    let deadline = Duration::from_secs(10);
    core.close(t, deadline).unwrap();
    assert!(
        events(&mut core).is_empty(),
        "nothing is revoked before the deadline"
    );
    assert_eq!(core.call_status(&id("a")), Some(CallStatus::Lost(x)));
    assert_eq!(core.poll_timeout(), Some(t + deadline));

    core.handle_timeout(t + deadline).unwrap();
    let after = events(&mut core);
    assert!(
        after.contains(&Event::CallRevoked { call: id("a") }),
        "{after:?}"
    );
}

/// Close leaves nothing behind: no key (not even one kept for its snapshot), no session record
/// (not even an idle one), and the invariant check says so.
#[test]
fn close_forgets_keys_and_session_records() {
    let mut core = Lifecycle::new(Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    ready_call(&mut core, "a", "s");
    core.release(t, &id("a")).unwrap();
    while let Some(command) = core.poll_command() {
        match command {
            Command::Stop { sandbox, .. } => core
                .handle_stop_ok(t, sandbox, Some(Snapshot::new("snap")))
                .unwrap(),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
            _ => {}
        }
    }
    // Suspended: the key is kept for its snapshot, the session's record for its versions.
    assert_eq!((core.tracked_keys(), core.session_records()), (1, 1));
    assert_eq!(core.tracked_sandboxes(), 0);
    core.close(t, Duration::from_secs(1)).unwrap();
    assert!(core.is_closed());
    assert_eq!((core.tracked_keys(), core.session_records()), (0, 0));
    core.check_invariants().unwrap();
}

/// R8 close vs late write: a mirror job queued before close, or submitted after it, never
/// writes once close has returned: during close only sessions with a live call may flush; at
/// the deadline what is left is cancelled and dropped (`closed`, named in the report); after
/// `Closed` every input, late answers included, is refused and no command is emitted.
#[test]
fn r08_close_vs_late_write() {
    let mut h = Script::with(|c| c.upload_timeout = secs(60));
    let xa = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa); // hangs
    h.close(secs(1)).unwrap();
    h.quiet();
    // A session with no live call may not start new work after close began.
    assert_eq!(
        h.try_flush("sb", &log(), "late"),
        Err(Error::Closed { what: "flush" })
    );
    // A's call is live: it may still flush (queued behind v1).
    assert_eq!(h.flush("sa", &log(), "v2"), 2);
    h.quiet();
    h.advance(secs(1)); // the close deadline
    h.expect_commands(&[drain(xa, &["sa"]), cancel(u1, xa), stop(xa)]);
    h.expect_events(&[
        revoked("a"),
        dropped("sa", &log(), 1, DropReason::Closed),
        dropped("sa", &log(), 2, DropReason::Closed),
        mirror_settled("sa"),
    ]);
    h.stop_ok(xa, None);
    h.expect_commands(&[shutdown(xa)]);
    h.shutdown_ok(xa);
    h.expect_commands(&[]);
    h.expect_events(&[Event::Closed {
        report: Box::new(CloseReport {
            revoked_calls: vec![call("a")],
            dropped_versions: vec![
                (session("sa"), log(), Version(1)),
                (session("sa"), log(), Version(2)),
            ],
            shut_down: 1,
            ..CloseReport::default()
        }),
    }]);
    // After Closed: the late upload answer, a late flush, anything: refused, nothing emitted.
    assert!(matches!(
        h.input(Input::UploadOk { upload: u1 }),
        Err(Error::Closed { .. })
    ));
    assert!(matches!(
        h.try_flush("sa", &log(), "v3"),
        Err(Error::Closed { .. })
    ));
    h.quiet();
    assert_eq!(h.core.poll_timeout(), None);
    h.assert_all_settled();
}
