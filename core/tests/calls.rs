//! Calls: acquire and release, the five scopes and which calls share a sandbox, `Share` and
//! `Serialize` on one key and the waiters they queue, cancellation, starts and their failures,
//! `resolve`, admission of new calls and sessions, timers, and the typed errors of rejected
//! inputs (unknown answers, invalid names, limits). Races R1–R4 and R10 (`docs/design.md`,
//! "The races") are here, one named test each.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

fn ids(call: &str, session: &str) -> (CallId, SessionId) {
    (CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

// ----------------------------------------------------------------------------------------------
// Calls

/// Every call ends exactly once: a second release is `AlreadyReleased`, an unknown call is
/// `UnknownCall`, and neither changes anything (the serialised core is compared).
#[test]
fn release_twice_or_unknown_is_a_typed_error_without_state_change() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_commands();
    h.take_events();
    let before = h.snapshot_json();
    h.wait(secs(1)); // not even the core's clock moves on a rejected input
    assert_eq!(
        h.try_release("a"),
        Err(Error::AlreadyReleased { call: call("a") })
    );
    assert_eq!(
        h.try_release("nobody"),
        Err(Error::UnknownCall {
            call: call("nobody")
        })
    );
    assert_eq!(before, h.snapshot_json());
    h.quiet();
    // A call that failed has ended too.
    h.acquire("b", "s2");
    let y = h.started();
    h.start_failed(y);
    h.take_commands();
    h.expect_events(&[failed("b", ErrorKind::StartFailed)]);
    assert_eq!(
        h.try_release("b"),
        Err(Error::AlreadyReleased { call: call("b") })
    );
    // A live call's name is unique; after it ended it may be used again.
    h.acquire("c", "s3");
    let z = h.started();
    assert_eq!(
        h.try_acquire(spec("c", "s3")),
        Err(Error::DuplicateCall { call: call("c") })
    );
    h.start_ok(z);
    h.expect_events(&[ready("c", z)]);
    h.acquire("a", "s");
    assert_eq!(h.core.call_status(&call("a")), Some(CallStatus::Waiting)); // x still stopping
    assert_ne!(x, z);
}

/// Releasing a queued call ends it at once: `CallReleased`, no command, and it never becomes
/// ready when its key frees up.
#[test]
fn cancel_while_queued_ends_at_once() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    let x = h.ready_call("a1", "s");
    h.acquire("a2", "s");
    h.quiet();
    h.release("a2");
    h.expect_events(&[released("a2")]);
    h.expect_commands(&[]);
    assert_eq!(h.core.call_status(&call("a2")), None);
    assert_eq!(h.next_deadline_in(), None); // its wait timer is gone
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_down(x, &["s"]);
    assert!(h.core.is_quiescent());
}

/// Releasing a starting call ends it at once; the sandbox started only for it is shut down as
/// soon as its start answers (ok or failed), and nothing else is ordered for it.
#[test]
fn cancel_while_starting_shuts_down_the_start_when_it_completes() {
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[]); // Start is in flight: nothing can be ordered yet
    h.start_ok(x);
    h.expect_events(&[]); // no CallReady for an ended call
    h.expect_commands(&[shutdown(x)]);
    assert_eq!(h.core.stats().orphan_starts, 1);
    h.shutdown_ok(x);
    assert!(h.core.is_quiescent());

    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.release("a");
    h.expect_events(&[released("a")]);
    h.start_failed(x);
    h.expect_events(&[]); // the call has ended already: no CallFailed
    h.expect_commands(&[shutdown(x)]);

    // The start times out after the cancel: shut down then, once.
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.release("a");
    h.take_events();
    h.advance(secs(1));
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.expect_events(&[]);
    h.start_ok(x); // late: stale
    h.quiet();
}

/// With `Serialize`, cancelling the starting call hands its start to the next queued call of
/// the key (no second Start, no Shutdown); with `Share`, a second call on the starting sandbox
/// keeps it.
#[test]
fn cancel_while_starting_a_queued_call_takes_over_the_start() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    h.acquire("a1", "s");
    let x = h.started();
    h.acquire("a2", "s");
    h.quiet();
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_commands(&[]);
    assert_eq!(
        h.core.call_status(&call("a2")),
        Some(CallStatus::Starting(x))
    );
    h.start_ok(x);
    h.expect_events(&[ready("a2", x)]);
    h.expect_commands(&[]);

    let mut h = Script::default_config();
    h.acquire("a1", "s");
    let x = h.started();
    h.acquire("a2", "s");
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.start_ok(x);
    h.expect_events(&[ready("a2", x)]);
    h.expect_commands(&[]);
}

/// A call's opaque spec reaches Start untouched, with the call's key.
#[test]
fn opaque_spec_is_passed_to_start() {
    let mut h = Script::default_config();
    let text = "image=python:3.12 workspace=rw;odd chars: $(x) ../..";
    h.try_acquire(spec("a", "s").with_spec(Spec::new(text)))
        .unwrap();
    let start = h.take_start();
    assert_eq!(start.spec.as_str(), text);
    assert_eq!(start.key, Key::Session(session("s")));
    assert_eq!(start.resume_from, None);
}

// ----------------------------------------------------------------------------------------------
// Scopes and same-key policies

/// The five scopes: which calls share a sandbox, and the key each Start carries.
#[test]
fn all_five_scopes_decide_which_calls_share_a_sandbox() {
    // (a1 s1 u1), (a2 s1 u2), (a3 s2 u1), (a4 s3 u3): which share with a1?
    let calls = [
        ("a1", "s1", "u1"),
        ("a2", "s1", "u2"),
        ("a3", "s2", "u1"),
        ("a4", "s3", "u3"),
    ];
    let cases: [(Scope, [bool; 4]); 5] = [
        (Scope::Call, [true, false, false, false]),
        (Scope::Session, [true, true, false, false]),
        (Scope::User, [true, false, true, false]),
        (Scope::Agent, [true, true, true, true]),
        (Scope::Global, [true, true, true, true]),
    ];
    for (scope, shares) in cases {
        let mut h = Script::with(|c| c.scope = scope);
        let mut sandboxes = Vec::new();
        let mut keys = Vec::new();
        for (c, s, u) in calls {
            h.try_acquire(spec(c, s).with_user(user(u))).unwrap();
            for command in h.take_commands() {
                let Command::Start { sandbox, key, .. } = command else {
                    panic!("{command:?}")
                };
                h.start_ok(sandbox);
                keys.push(key);
            }
            let Some(Event::CallReady { sandbox, .. }) = h.take_events().pop() else {
                panic!("{scope:?}: {c} not ready")
            };
            sandboxes.push(sandbox);
        }
        let got: Vec<bool> = sandboxes.iter().map(|x| *x == sandboxes[0]).collect();
        assert_eq!(got, shares, "{scope:?}");
        let expected_first_key = match scope {
            Scope::Call => Key::Call(call("a1")),
            Scope::Session => Key::Session(session("s1")),
            Scope::User => Key::User(user("u1")),
            Scope::Agent => Key::Agent,
            Scope::Global => Key::Global,
        };
        assert_eq!(keys[0], expected_first_key, "{scope:?}");
    }
    // Scope User needs a user.
    let mut h = Script::with(|c| c.scope = Scope::User);
    assert_eq!(
        h.try_acquire(spec("a", "s")),
        Err(Error::MissingUser { call: call("a") })
    );
}

/// `Share`: the sandbox is reference counted; it goes down only after the last call released.
#[test]
fn share_is_refcounted_and_released_after_the_last_call() {
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "s1");
    h.acquire("b", "s2");
    h.acquire("c", "s3");
    h.expect_events(&[ready("b", x), ready("c", x)]);
    h.release("b");
    h.release("a");
    h.expect_events(&[released("b"), released("a")]);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Running));
    assert_eq!(h.resolve("s3"), Ok(x));
    h.release("c");
    h.expect_events(&[released("c")]);
    h.expect_down(x, &["s1", "s2", "s3"]);
}

/// `Serialize`: first in, first out; `max_waiters` bounds the queue (`QueueFull`); never two
/// live calls bound on one key.
#[test]
fn serialize_is_fifo_and_bounded() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize); // max_waiters 2
    let x = h.ready_call("a1", "s");
    h.acquire("a2", "s");
    h.acquire("a3", "s");
    let before = h.snapshot_json();
    assert_eq!(
        h.try_acquire(spec("a4", "s")),
        Err(Error::QueueFull {
            key: Key::Session(session("s")),
            max: 2
        })
    );
    assert_eq!(before, h.snapshot_json());
    // Another key is not affected by this key's queue.
    h.acquire("b", "other");
    let y = h.started();
    assert_ne!(x, y);
    h.quiet();
    h.release("a1");
    h.expect_events(&[ready("a2", x), released("a1")]);
    assert_eq!(h.core.call_status(&call("a3")), Some(CallStatus::Waiting));
    h.release("a2");
    h.expect_events(&[ready("a3", x), released("a2")]);
    h.expect_commands(&[]);
}

/// `Serialize`: a queued call fails with `wait-timeout` after `wait_timeout`, and has ended.
#[test]
fn serialize_wait_timeout() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize); // wait 4 s
    h.ready_call("a1", "s");
    h.wait(secs(1));
    h.acquire("a2", "s");
    h.advance(ms(3999));
    h.quiet();
    h.advance(ms(1));
    h.expect_events(&[failed("a2", ErrorKind::WaitTimeout)]);
    h.expect_commands(&[]);
    assert_eq!(
        h.try_release("a2"),
        Err(Error::AlreadyReleased { call: call("a2") })
    );
    assert!(h.core.call_status(&call("a1")).is_some());
}

/// Under `Share`, a call of a key whose previous sandbox is still stopping waits for its
/// persist (to resume from the new snapshot). That wait uses the key's queue: it is bounded by
/// `max_waiters` (`QueueFull`) and `wait_timeout` (`wait-timeout`), like a `Serialize` wait.
/// Documented as it is; see the report (a `Share` user may not expect a queue here).
#[test]
fn share_waits_for_a_retiring_sandbox_within_the_queue_limits() {
    let mut h = Script::default_config(); // max_waiters 2, wait 4 s, command 5 s
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.acquire("a2", "s");
    h.acquire("a3", "s");
    h.quiet();
    assert_eq!(
        h.try_acquire(spec("a4", "s")),
        Err(Error::QueueFull {
            key: Key::Session(session("s")),
            max: 2
        })
    );
    h.advance(secs(4)); // the Stop is still unanswered
    h.expect_events(&[
        failed("a2", ErrorKind::WaitTimeout),
        failed("a3", ErrorKind::WaitTimeout),
    ]);
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    // Answered in time, the waiters all share the one new sandbox.
    let mut h = Script::default_config();
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.take_events();
    h.take_commands();
    h.acquire("a2", "s");
    h.acquire("a3", "s");
    h.stop_ok(x, None);
    let cmds = h.take_commands();
    let Some(Command::Start { sandbox: y, .. }) = cmds.iter().find(|c| c.sandbox() != x) else {
        panic!("{cmds:?}")
    };
    assert_eq!(cmds.len(), 2, "{cmds:?}"); // Shutdown of x, one Start
    h.start_ok(*y);
    h.expect_events(&[ready("a2", *y), ready("a3", *y)]);
}

// ----------------------------------------------------------------------------------------------
// Ownership and release policies

/// An external sandbox is bound at once and never ordered to start, stop or shut down: not on
/// release, not on death, not at close.
#[test]
fn external_sandboxes_are_never_stopped_or_shut_down() {
    let mut h = Script::default_config();
    h.try_acquire(spec("a", "s").with_external(external("laptop")))
        .unwrap();
    let Some(Event::CallReady { sandbox: xe, .. }) = h.take_events().pop() else {
        panic!()
    };
    h.expect_commands(&[]);
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[drain(xe, &["s"])]);

    // Death: the call learns, nothing is ordered.
    h.try_acquire(spec("b", "s").with_external(external("laptop")))
        .unwrap();
    let Some(Event::CallReady { sandbox: ye, .. }) = h.take_events().pop() else {
        panic!()
    };
    h.died(ye);
    h.expect_events(&[lost("b", ye)]);
    h.expect_commands(&[]);
    h.release("b");
    h.expect_events(&[released("b")]);
    h.expect_commands(&[]);

    // Close with an external call live: revoked, drained, never shut down.
    h.try_acquire(spec("c", "s").with_external(external("laptop")))
        .unwrap();
    let Some(Event::CallReady { sandbox: ze, .. }) = h.take_events().pop() else {
        panic!()
    };
    h.close(secs(1)).unwrap();
    h.advance(secs(1));
    h.expect_commands(&[drain(ze, &["s"])]);
    h.expect_events(&[
        revoked("c"),
        Event::Closed {
            report: Box::new(CloseReport {
                revoked_calls: vec![call("c")],
                ..CloseReport::default()
            }),
        },
    ]);
    assert!(!h.all_commands.iter().any(|c| matches!(
        c,
        Command::Start { .. } | Command::Stop { .. } | Command::Shutdown { .. }
    )));
}

/// Calls naming one external sandbox share it even under `Serialize`: the application owns the
/// sandbox (and its concurrency), and no release of it can tear anything down (R10 cannot
/// happen). Documented as it is (`docs/design.md`'s invariant 8 reads "never two live calls on
/// one key", and the core exempts external keys on purpose).
#[test]
fn external_sandboxes_are_shared_even_under_serialize() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    h.try_acquire(spec("a", "s1").with_external(external("e")))
        .unwrap();
    h.try_acquire(spec("b", "s2").with_external(external("e")))
        .unwrap();
    let events = h.take_events();
    let [Event::CallReady { sandbox: xa, .. }, Event::CallReady { sandbox: xb, .. }] =
        events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!(xa, xb);
    h.expect_commands(&[]);
}

// ----------------------------------------------------------------------------------------------
// Start

/// A Start unanswered for `start_timeout` fails its calls with `start-timeout` and is shut
/// down; its late answer is stale.
#[test]
fn start_timeout() {
    let mut h = Script::default_config(); // start 1 s
    h.acquire("a", "s");
    let x = h.started();
    assert_eq!(h.next_deadline_in(), Some(secs(1)));
    h.advance(ms(999));
    h.quiet();
    h.advance(ms(1));
    h.expect_events(&[failed("a", ErrorKind::StartTimeout)]);
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.start_ok(x);
    h.quiet();
    assert_eq!(h.core.stats().starts_timed_out, 1);
}

/// A failed Start fails only the calls waiting on it and orders its Shutdown; other calls,
/// sandboxes and bindings are untouched.
#[test]
fn start_failure_fails_only_its_calls() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s1");
    h.acquire("b1", "s2");
    let y = h.started();
    h.acquire("b2", "s2"); // shares the starting sandbox
    h.acquire("c", "s3");
    let z = h.started();
    h.start_failed(y);
    h.expect_events(&[
        failed("b1", ErrorKind::StartFailed),
        failed("b2", ErrorKind::StartFailed),
    ]);
    h.expect_commands(&[shutdown(y)]);
    assert_eq!(h.core.call_status(&call("a")), Some(CallStatus::Ready(x)));
    assert_eq!(
        h.core.call_status(&call("c")),
        Some(CallStatus::Starting(z))
    );
    h.start_ok(z);
    h.expect_events(&[ready("c", z)]);
    // The failed key starts afresh for its next call.
    h.acquire("b3", "s2");
    let y2 = h.started();
    assert_ne!(y, y2);
}

/// Under `Serialize`, a call queued behind a start that fails was not waiting on that start:
/// it gets a Start of its own (and the failed sandbox is shut down).
#[test]
fn start_failure_does_not_fail_the_calls_queued_behind_it() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    h.acquire("a1", "s");
    let x = h.started();
    h.acquire("a2", "s");
    h.quiet();
    h.start_failed(x);
    h.expect_events(&[failed("a1", ErrorKind::StartFailed)]);
    let cmds = h.take_commands();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert!(cmds.iter().any(|c| plain(c) == shutdown(x)), "{cmds:?}");
    let Some(Command::Start { sandbox: y, .. }) = cmds.iter().find(|c| c.sandbox() != x) else {
        panic!("{cmds:?}")
    };
    h.start_ok(*y);
    h.expect_events(&[ready("a2", *y)]);
}

// ----------------------------------------------------------------------------------------------
// Session resolution, drain, holds

/// `resolve` answers a session's own sandbox or a typed error; never another session's.
#[test]
fn resolve_never_returns_another_sessions_sandbox() {
    let mut h = Script::default_config();
    assert_eq!(
        h.resolve("s"),
        Err(Error::NoActiveSandbox {
            session: session("s")
        })
    );
    let x = h.ready_call("other", "o");
    h.acquire("a", "s");
    h.started();
    // Starting: no sandbox yet, and never the other session's.
    assert_eq!(
        h.resolve("s"),
        Err(Error::NoActiveSandbox {
            session: session("s")
        })
    );
    assert_eq!(h.resolve("o"), Ok(x));
}

// ----------------------------------------------------------------------------------------------
// Timers

/// One timer table: `poll_timeout` gives the earliest deadline; `handle_timeout` before it
/// changes nothing; at it, only what is due fires; twice is harmless.
#[test]
fn timers_poll_timeout_and_early_handle_timeout() {
    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    assert_eq!(h.core.poll_timeout(), None);
    h.acquire("a", "s"); // start timeout 1 s
    let x = h.started();
    h.wait(ms(500));
    h.acquire("b", "s"); // wait timeout 4 s from 500 ms
    assert_eq!(h.core.poll_timeout(), Some(Instant::from_millis(1000)));
    let before = h.snapshot_json();
    h.advance(ms(400)); // early
    h.quiet();
    h.timeout(); // twice
    h.quiet();
    assert_eq!(h.core.poll_timeout(), Some(Instant::from_millis(1000)));
    // Only `now` moved.
    assert_eq!(
        before.replace("\"now\":500000000", ""),
        h.snapshot_json().replace("\"now\":900000000", "")
    );
    h.start_ok(x);
    h.take_events();
    assert_eq!(h.core.poll_timeout(), Some(Instant::from_millis(4500)));
    assert_eq!(h.run_to_next_deadline(), Instant::from_millis(4500));
    h.expect_events(&[failed("b", ErrorKind::WaitTimeout)]);
    h.timeout();
    h.quiet();
    assert_eq!(h.core.poll_timeout(), None);
    // Time never goes backwards: an earlier `now` counts as the latest.
    h.now = Instant::from_millis(10);
    h.release("a");
    assert_eq!(h.core.now(), Instant::from_millis(4500));
    h.expect_commands(&[drain(x, &["s"]), stop(x)]); // nothing to drain: Stop at once
    assert_eq!(
        h.core.poll_timeout(),
        Some(Instant::from_millis(4500) + secs(5)) // the Stop's command timeout
    );
}

// ----------------------------------------------------------------------------------------------
// Answers

/// An answer naming a sandbox or upload never handed out is a typed error that changes nothing
/// (`UnknownSandbox`, `UnknownUpload`); a duplicate or late answer is stale: `Ok`, nothing
/// changes but the stale-answer counter, nothing is emitted.
#[test]
fn unknown_answers_are_errors_and_duplicate_answers_are_stale() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    // The first id not handed out yet: the boundary of "handed out".
    let never = SandboxId(x.0 + 1);
    for input in [
        Input::StartOk { sandbox: never },
        Input::StartFailed { sandbox: never },
        Input::StopOk {
            sandbox: never,
            snapshot: None,
        },
        Input::StopFailed { sandbox: never },
        Input::PersistOk { sandbox: never },
        Input::PersistFailed { sandbox: never },
        Input::ShutdownOk { sandbox: never },
        Input::ShutdownFailed { sandbox: never },
        Input::Died { sandbox: never },
    ] {
        assert_eq!(
            h.input(input),
            Err(Error::UnknownSandbox { sandbox: never })
        );
    }
    for input in [
        Input::UploadOk {
            upload: UploadId(0),
        },
        Input::UploadFailed {
            upload: UploadId(0),
            failure: UploadFailure::Gone,
        },
    ] {
        assert_eq!(
            h.input(input),
            Err(Error::UnknownUpload {
                upload: UploadId(0)
            })
        );
    }
    h.quiet();
    // Duplicates and answers to commands never given for this sandbox: stale.
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    assert_eq!(h.core.stats().uploads_ordered, 1);
    let next = UploadId(u.0 + 1);
    assert_eq!(
        h.input(Input::UploadOk { upload: next }),
        Err(Error::UnknownUpload { upload: next })
    );
    h.upload_ok(u);
    h.take_events();
    let stale = h.core.stats().stale_answers;
    h.start_ok(x);
    h.start_failed(x);
    h.upload_ok(u);
    h.upload_failed(u, UploadFailure::Gone);
    h.stop_ok(x, Some("s"));
    h.persist_ok(x);
    h.shutdown_ok(x);
    h.quiet();
    assert_eq!(h.core.stats().stale_answers, stale + 7);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Running));
    assert_eq!(h.resolve("s"), Ok(x));
}

// ----------------------------------------------------------------------------------------------
// Names and limits

/// Names that could escape a directory or reach a shell are `InvalidName`, for every kind of
/// name, whether made directly or read from a trace.
#[test]
fn invalid_names_are_rejected() {
    let long = "a".repeat(MAX_NAME_LEN + 1);
    let bad = [
        "..",
        "a/b",
        "/",
        "a\0b",
        "",
        long.as_str(),
        ".",
        "-x",
        "a b",
    ];
    for name in bad {
        assert!(CallId::new(name).is_err(), "call {name:?}");
        assert!(SessionId::new(name).is_err(), "session {name:?}");
        assert!(UserId::new(name).is_err(), "user {name:?}");
        assert!(PathName::new(name).is_err(), "path {name:?}");
        assert!(ExternalId::new(name).is_err(), "external {name:?}");
        let err: Error = SessionId::new(name).unwrap_err().into();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
        let json = serde_json::json!({"input": "release", "call": name}).to_string();
        assert!(serde_json::from_str::<Input>(&json).is_err(), "{json}");
        let json =
            serde_json::json!({"input": "flush", "session": "s", "path": name, "payload": []})
                .to_string();
        assert!(serde_json::from_str::<Input>(&json).is_err(), "{json}");
    }
    let max = "a".repeat(MAX_NAME_LEN);
    assert!(PathName::new(&max).is_ok());
    let json = serde_json::json!({"input": "flush", "session": "s", "path": "p", "payload": []})
        .to_string();
    assert!(serde_json::from_str::<Input>(&json).is_ok());
}

/// Every limit is a typed `LimitExceeded` naming the limit, and changes nothing.
#[test]
fn limits_are_typed_errors() {
    let limit = |e: Result<(), Error>| match e {
        Err(Error::LimitExceeded { limit, max }) => (limit, max),
        other => panic!("{other:?}"),
    };
    let mut h = Script::with(|c| {
        c.limits.max_calls = 2;
        c.limits.max_sandboxes = 1;
        c.limits.max_paths_per_session = 1;
        c.limits.max_payload_bytes = 4;
        c.limits.max_holds_per_session = 1;
    });
    let x = h.ready_call("a", "s");
    assert_eq!(limit(h.try_acquire(spec("b", "s2"))), ("max_sandboxes", 1));
    h.acquire("b", "s"); // same key: no new sandbox
    h.take_events();
    assert_eq!(limit(h.try_acquire(spec("c", "s"))), ("max_calls", 2));
    assert_eq!(
        limit(h.try_flush("s", &log(), "12345").map(|_| ())),
        ("max_payload_bytes", 4)
    );
    h.flush("s", &log(), "1234");
    h.expect_upload("s", &log(), 1, x);
    assert_eq!(
        limit(h.try_flush("s", &path("other"), "1").map(|_| ())),
        ("max_paths_per_session", 1)
    );
    h.hold("s").unwrap();
    assert_eq!(limit(h.hold("s")), ("max_holds_per_session", 1));

    let mut h = Script::with(|c| c.limits.max_active_sessions = 1);
    h.ready_call("a", "s");
    assert_eq!(
        limit(h.try_acquire(spec("b", "s2"))),
        ("max_active_sessions", 1)
    );
    h.acquire("c", "s");
    // An invalid configuration is refused at construction.
    let mut bad = config();
    bad.limits.max_calls = 0;
    assert!(matches!(
        Lifecycle::new(bad),
        Err(Error::InvalidConfig { .. })
    ));
    let mut bad = config();
    bad.drain_deadline = Duration::ZERO;
    assert!(matches!(
        Lifecycle::new(bad),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn idle_session_records_leave_room_for_active_ones() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        limits: Limits {
            max_active_sessions: 2,
            ..Limits::default()
        },
        ..Config::default()
    })
    .unwrap();
    let log = PathName::session_log();
    // Three idle records: flushed with no sandbox anywhere, settled (dropped) at once.
    for name in ["idle-1", "idle-2", "idle-3"] {
        let s = SessionId::new(name).unwrap();
        core.flush(t, &s, &log, Payload::default()).unwrap();
    }
    while core.poll_event().is_some() {}
    assert_eq!(core.session_records(), 3);

    // Two active sessions fit beside them...
    let (a, s) = ids("a", "s");
    let (b, u) = ids("b", "u");
    core.acquire(t, CallSpec::new(a, s)).unwrap();
    core.acquire(t, CallSpec::new(b, u)).unwrap();
    // ...a third does not, for a call or for a flush.
    let (c, v) = ids("c", "v");
    let limit = Error::LimitExceeded {
        limit: "max_active_sessions",
        max: 2,
    };
    assert_eq!(
        core.acquire(t, CallSpec::new(c, v.clone())),
        Err(limit.clone())
    );
    assert_eq!(core.flush(t, &v, &log, Payload::default()), Err(limit));
    // An idle session becomes active again only within the limit, but its own record exists:
    // a flush of an existing record is not a new session.
    let idle = SessionId::new("idle-1").unwrap();
    assert!(core.flush(t, &idle, &log, Payload::default()).is_ok());
}

#[test]
fn serialize_reuses_a_warm_sandbox_without_queueing() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        same_key: SameKey::Serialize,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(60),
        },
        ..Config::default()
    })
    .unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a.clone(), s.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.release(t, &a).unwrap();
    while core.poll_command().is_some() {}
    assert_eq!(core.sandbox_state(sandbox), Some(SandboxState::Idle));

    // The key has a warm sandbox and no bound call: the next call takes it at once.
    let (b, _) = ids("b", "s");
    core.acquire(t, CallSpec::new(b.clone(), s)).unwrap();
    assert_eq!(core.call_status(&b), Some(CallStatus::Ready(sandbox)));
    assert_eq!(core.poll_command(), None);
}

#[test]
fn during_close_a_session_whose_call_is_still_starting_may_flush() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a, s.clone())).unwrap();
    core.close(t, Duration::from_secs(10)).unwrap();
    // Its sandbox is coming (the call is live until the close deadline): the write is taken.
    assert!(core
        .flush(t, &s, &PathName::session_log(), Payload::default())
        .is_ok());
    // A session with nothing live or coming is refused.
    let other = SessionId::new("other").unwrap();
    assert_eq!(
        core.flush(t, &other, &PathName::session_log(), Payload::default()),
        Err(Error::Closed { what: "flush" })
    );
}

/// R1 single slot: calls A and B on one agent; B's acquire must not overwrite A's binding, A's
/// file operations go to A's sandbox, A's release tears down only A's sandbox, and B keeps its
/// own. (Scope `Call`: one sandbox per call, the production harness's setting.)
#[test]
fn r01_single_slot() {
    let mut h = Script::with(|c| c.scope = Scope::Call);
    h.acquire("a", "sa");
    let xa = h.started();
    h.acquire("b", "sb");
    let xb = h.started();
    assert_ne!(xa, xb);
    h.start_ok(xa);
    h.expect_events(&[ready("a", xa)]);
    h.start_ok(xb);
    h.expect_events(&[ready("b", xb)]);

    // B's acquire did not move A: A's context-free work and mirror go to A's sandbox.
    assert_eq!(h.resolve("sa"), Ok(xa));
    assert_eq!(h.resolve("sb"), Ok(xb));
    h.flush("sa", &log(), "a's log");
    let u = h.expect_upload("sa", &log(), 1, xa);
    h.upload_ok(u);
    h.expect_events(&[uploaded("sa", &log(), 1, xa), mirror_settled("sa")]);

    // A's release tears down A's sandbox, and nothing names B's.
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_down(xa, &["sa"]);
    assert!(h
        .all_commands
        .iter()
        .all(|c| c.sandbox() != xb || matches!(c, Command::Start { .. })));

    // B is still bound to its own sandbox: no "No active sandbox".
    assert_eq!(h.core.call_status(&call("b")), Some(CallStatus::Ready(xb)));
    assert_eq!(h.resolve("sb"), Ok(xb));
    h.flush("sb", &log(), "b's log");
    let u = h.expect_upload("sb", &log(), 1, xb);
    h.upload_ok(u);
    h.expect_events(&[uploaded("sb", &log(), 1, xb), mirror_settled("sb")]);
    h.release("b");
    h.expect_events(&[released("b")]);
    h.expect_down(xb, &["sb"]);
    h.assert_all_shut_down();
    assert!(h.core.is_quiescent());
}

/// R2 fallback emptied: A acquires, B acquires, B releases first; A's context-free write
/// (message bus) must still find A's sandbox.
#[test]
fn r02_fallback_emptied() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.release("b");
    h.expect_events(&[released("b")]);
    h.expect_down(xb, &["sb"]);

    // A is running: its context-free write resolves to its own sandbox.
    assert_eq!(h.resolve("sa"), Ok(xa));
    h.flush("sa", &path("bus"), "message");
    let u = h.expect_upload("sa", &path("bus"), 1, xa);
    h.upload_ok(u);
    h.expect_events(&[uploaded("sa", &path("bus"), 1, xa), mirror_settled("sa")]);
    // And B's session, with no live call, has nothing: never A's sandbox.
    assert_eq!(
        h.resolve("sb"),
        Err(Error::NoActiveSandbox {
            session: session("sb")
        })
    );
    h.quiet();
}

/// R3 fallback misroutes: with A and B live (B bound last), a context-free write for A's
/// session lands in A's sandbox, never in "the most recent binding". Also with one shared
/// sandbox for the agent: a session with no live call gets no sandbox at all.
#[test]
fn r03_fallback_misroutes() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    assert_eq!(h.resolve("sa"), Ok(xa));
    assert_eq!(h.resolve("sb"), Ok(xb));
    h.flush("sa", &log(), "a1");
    h.expect_upload("sa", &log(), 1, xa);
    h.flush("sb", &log(), "b1");
    h.expect_upload("sb", &log(), 1, xb);
    assert_eq!(
        h.resolve("sc"),
        Err(Error::NoActiveSandbox {
            session: session("sc")
        })
    );
    // A session with no call: its flush is dropped, not routed to the latest binding.
    h.flush("sc", &log(), "c1");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sc", &log(), 1, DropReason::NoSandbox)]);

    // Scope Agent: one sandbox for the agent; still no agent-wide fallback for a session that
    // has no live call.
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.expect_events(&[ready("b", x)]);
    h.quiet();
    assert_eq!(h.resolve("sb"), Ok(x));
    assert_eq!(
        h.resolve("sc"),
        Err(Error::NoActiveSandbox {
            session: session("sc")
        })
    );
    h.flush("sc", &log(), "c1");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sc", &log(), 1, DropReason::NoSandbox)]);
}

/// R4 start failure clears others: A and C share an external sandbox; B's start fails; its
/// cleanup must touch only what B's start acquired, never A's binding. The external sandbox is
/// never stopped or shut down.
#[test]
fn r04_start_failure_clears_others() {
    let mut h = Script::default_config();
    h.try_acquire(spec("a", "sa").with_external(external("shared")))
        .unwrap();
    let Some(Event::CallReady { sandbox: xe, .. }) = h.events.front().cloned() else {
        panic!("A is ready at once on the external sandbox: {:?}", h.events);
    };
    h.expect_events(&[ready("a", xe)]);
    h.expect_commands(&[]);
    h.try_acquire(spec("c", "sc").with_external(external("shared")))
        .unwrap();
    h.expect_events(&[ready("c", xe)]);

    h.acquire("b", "sb");
    let xb = h.started();
    h.start_failed(xb);
    h.expect_events(&[failed("b", ErrorKind::StartFailed)]);
    h.expect_commands(&[shutdown(xb)]);

    // A's and C's bindings are untouched.
    assert_eq!(h.core.call_status(&call("a")), Some(CallStatus::Ready(xe)));
    assert_eq!(h.core.call_status(&call("c")), Some(CallStatus::Ready(xe)));
    assert_eq!(h.resolve("sa"), Ok(xe));
    assert_eq!(
        h.core.sandbox_ownership(xe),
        Some(&Ownership::External(external("shared")))
    );
    h.flush("sa", &log(), "a1");
    let u = h.expect_upload("sa", &log(), 1, xe);
    h.upload_ok(u);
    h.expect_events(&[uploaded("sa", &log(), 1, xe), mirror_settled("sa")]);
    h.shutdown_ok(xb);

    // Releasing both drains the external sandbox and unbinds it: no Stop, no Shutdown.
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[]);
    h.release("c");
    h.expect_events(&[released("c")]);
    h.expect_commands(&[drain(xe, &["sa", "sc"])]);
    assert_eq!(h.core.sandbox_state(xe), None);
    assert!(h.core.is_quiescent());
}

/// R10 same key in parallel: two calls of one user on one key. Under `Share` both are bound to
/// the one sandbox and the first release does not tear it down; under `Serialize` the second
/// waits and takes the same sandbox over when the first releases.
#[test]
fn r10_same_key_in_parallel() {
    let mut h = Script::with(|c| c.scope = Scope::User);
    h.try_acquire(spec("a1", "s1").with_user(user("u")))
        .unwrap();
    let x = h.started();
    h.try_acquire(spec("a2", "s2").with_user(user("u")))
        .unwrap();
    h.quiet(); // joins the starting sandbox: no second Start
    assert_eq!(
        h.core.call_status(&call("a2")),
        Some(CallStatus::Starting(x))
    );
    h.start_ok(x);
    h.expect_events(&[ready("a1", x), ready("a2", x)]);
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_commands(&[]); // the pod stays up under a2
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Running));
    assert_eq!(h.resolve("s2"), Ok(x));
    h.flush("s2", &log(), "v1");
    let u = h.expect_upload("s2", &log(), 1, x);
    h.upload_ok(u);
    h.expect_events(&[uploaded("s2", &log(), 1, x), mirror_settled("s2")]);
    h.release("a2");
    h.expect_events(&[released("a2")]);
    h.expect_down(x, &["s1", "s2"]);

    let mut h = Script::with(|c| {
        c.scope = Scope::User;
        c.same_key = SameKey::Serialize;
    });
    h.try_acquire(spec("a1", "s1").with_user(user("u")))
        .unwrap();
    let x = h.started();
    h.start_ok(x);
    h.expect_events(&[ready("a1", x)]);
    h.try_acquire(spec("a2", "s2").with_user(user("u")))
        .unwrap();
    h.quiet();
    assert_eq!(h.core.call_status(&call("a2")), Some(CallStatus::Waiting));
    h.release("a1");
    h.expect_events(&[ready("a2", x), released("a1")]);
    h.expect_commands(&[]); // no teardown under a2, and no new sandbox
    h.release("a2");
    h.expect_events(&[released("a2")]);
    h.expect_down(x, &["s1", "s2"]);
}

/// Cancelling a timer takes it out of the heap only when it is the very earliest entry: an
/// answered upload whose deadline equals another upload's leaves the other's timer in place,
/// and that upload still times out. Pins `Timers::cancel`'s test of the entry's sequence.
#[test]
fn an_answer_cancels_only_its_own_timer_among_equal_deadlines() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let t = Instant::ZERO;
    let log = PathName::session_log();
    ready_call(&mut core, "a", "s1");
    ready_call(&mut core, "b", "s2");
    core.flush(t, &sid("s1"), &log, Payload::default()).unwrap();
    core.flush(t, &sid("s2"), &log, Payload::default()).unwrap();
    let uploads: Vec<(UploadId, Instant)> = commands(&mut core)
        .into_iter()
        .filter_map(|c| match c {
            Command::Upload {
                upload, deadline, ..
            } => Some((upload, deadline)),
            _ => None,
        })
        .collect();
    let [(first, due), (second, due_too)] = uploads[..] else {
        panic!("two uploads ordered: {uploads:?}")
    };
    assert_eq!(due, due_too, "both bounded by the same instant");
    // The second answers: its timer goes; the first's, at the same instant and set earlier,
    // is the heap's top and must stay.
    core.handle_upload_ok(t, second).unwrap();
    events(&mut core);
    assert_eq!(core.poll_timeout(), Some(due));
    core.handle_timeout(due).unwrap();
    assert!(commands(&mut core).contains(&Command::CancelUpload {
        upload: first,
        sandbox: core.resolve(&sid("s1")).unwrap(),
    }));
    assert!(events(&mut core).iter().any(|e| matches!(
        e,
        Event::Settled {
            session,
            outcome: Settlement::Dropped {
                reason: DropReason::UploadTimeout
            },
            ..
        } if *session == sid("s1")
    )));
}
