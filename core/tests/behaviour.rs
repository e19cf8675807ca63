//! One test per behaviour of issue 2 ("What the core must do"), each one that would fail
//! without the behaviour. The script (`support`) drains after every input, checks the core's
//! invariants and the history invariants, and checks that every rejected input left the
//! serialised core unchanged.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

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

/// `KeepWarm`: the next call of the key reuses the idle sandbox; after `idle` without a call it
/// goes down; the idle timer restarts from the last release.
#[test]
fn keep_warm_reuses_then_idles_out() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Idle));
    assert_eq!(h.next_deadline_in(), Some(secs(10)));
    h.advance(secs(9));
    h.acquire("a2", "s");
    h.expect_events(&[ready("a2", x)]);
    h.expect_commands(&[]);
    assert_eq!(h.core.stats().revivals, 1);
    assert_eq!(h.next_deadline_in(), None); // running: no idle timer
    h.advance(secs(5));
    h.release("a2");
    h.take_events();
    h.advance(ms(9999));
    h.quiet();
    h.advance(ms(1));
    h.expect_down(x, &["s"]);
    // A different key never takes a warm sandbox.
    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a1", "s1");
    h.release("a1");
    h.take_events();
    h.acquire("b", "s2");
    assert_ne!(h.started(), x);
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

/// `Suspend`: drain (the mirror finishes first), Stop, Persist, and no Shutdown; the core forgets
/// the sandbox and the next call of the key resumes from its snapshot.
#[test]
fn suspend_drains_stops_persists_and_does_not_shut_down() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::Suspend);
    let x = h.ready_call("a1", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a1");
    h.expect_commands(&[drain(x, &["s"])]);
    h.upload_ok(u);
    h.take_events();
    h.expect_commands(&[stop_to_suspend(x)]);
    h.stop_ok(x, Some("susp-1"));
    h.expect_commands(&[persist_to_suspend(x, Some("susp-1"))]);
    h.persist_ok(x);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), None);
    assert_eq!(h.core.stats().suspended, 1);
    assert!(!h.was_shut_down(x));
    h.acquire("a2", "s");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("susp-1")));
    // Without a snapshot, Suspend still persists (the backend keeps the sandbox).
    let mut h = Script::with(|c| c.release = ReleasePolicy::Suspend);
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, None);
    h.expect_commands(&[persist_to_suspend(x, None)]);
}

/// The way down is Drain → Stop → Persist → Shutdown, each waiting for the one before.
#[test]
fn order_on_release_is_drain_stop_persist_shutdown() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Draining));
    h.upload_ok(u);
    h.take_events();
    h.expect_commands(&[stop(x)]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Stopping));
    h.stop_ok(x, Some("snap"));
    h.expect_commands(&[persist(x, Some("snap"))]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Persisting));
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::ShuttingDown));
    h.shutdown_ok(x);
    assert_eq!(h.core.sandbox_state(x), None);
    let kinds: Vec<&str> = h
        .all_commands
        .iter()
        .filter(|c| c.sandbox() == x)
        .map(Command::name)
        .collect();
    assert_eq!(
        kinds,
        ["start", "upload", "drain", "stop", "persist", "shutdown"]
    );
}

/// Snapshots are kept per key (the latest persisted one) and handed to the next Start of that
/// key only, which takes it: the key keeps no copy, so a sandbox that resumed and then failed
/// to persist leaves the key nothing (its next Start is fresh), as on Kubernetes, where a
/// resume takes over the suspended claim itself.
#[test]
fn snapshot_is_kept_per_key_and_resumed() {
    let mut h = Script::default_config();
    let x = h.ready_call("a1", "s1");
    h.release("a1");
    h.take_events();
    h.expect_commands(&[drain(x, &["s1"]), stop(x)]);
    h.stop_ok(x, Some("s1-snap-1"));
    h.expect_commands(&[persist(x, Some("s1-snap-1"))]);
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);

    // Another key does not get it.
    h.acquire("b", "s2");
    assert_eq!(h.take_start().resume_from, None);

    // The key's next Start does.
    h.acquire("a2", "s1");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("s1-snap-1")));
    let y = start.sandbox;
    h.start_ok(y);
    h.take_events();
    h.release("a2");
    h.take_events();
    h.expect_commands(&[drain(y, &["s1"]), stop(y)]);
    h.stop_ok(y, Some("s1-snap-2"));
    h.expect_commands(&[persist(y, Some("s1-snap-2"))]);
    // y's start took snap-1, so snap-2 is the key's only copy: a Persist that keeps failing
    // is ordered again, then salvaged (the key keeps snap-2, nothing is shut down) and the
    // application is told; the key's next call resumes it.
    for _ in 1..WAY_DOWN_ATTEMPTS {
        h.persist_failed(y);
        h.expect_commands(&[persist(y, Some("s1-snap-2"))]);
    }
    h.take_events();
    h.persist_failed(y);
    h.expect_commands(&[]);
    h.expect_events(&[Event::WayDownFailed {
        sandbox: y,
        key: Key::Session(session("s1")),
        kept: Some(snap("s1-snap-2")),
    }]);
    h.acquire("a3", "s1");
    assert_eq!(h.take_start().resume_from, Some(snap("s1-snap-2")));
}

/// A call that arrives while its key's previous sandbox is still stopping waits (no Start),
/// then starts from the snapshot that Stop produced, not an older one.
#[test]
fn a_call_arriving_while_the_previous_sandbox_stops_resumes_from_its_new_snapshot() {
    let mut h = Script::default_config();
    // An older snapshot of the key exists.
    let x0 = h.ready_call("a0", "s");
    h.release("a0");
    h.take_events();
    h.take_commands();
    h.stop_ok(x0, Some("old"));
    h.persist_ok(x0);
    h.take_commands();
    h.shutdown_ok(x0);

    h.acquire("a1", "s");
    let x1 = h.take_start();
    assert_eq!(x1.resume_from, Some(snap("old")));
    let x1 = x1.sandbox;
    h.start_ok(x1);
    h.take_events();
    h.release("a1");
    h.take_events();
    h.expect_commands(&[drain(x1, &["s"]), stop(x1)]);
    h.acquire("a2", "s");
    h.quiet(); // waits: its workspace is being saved
    assert_eq!(h.core.call_status(&call("a2")), Some(CallStatus::Waiting));
    h.stop_ok(x1, Some("new"));
    h.expect_commands(&[persist(x1, Some("new"))]);
    h.persist_ok(x1);
    let cmds = h.take_commands();
    assert_eq!(plain(&cmds[0]), shutdown(x1));
    let [_, Command::Start { resume_from, .. }] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!(resume_from, &Some(snap("new")));
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
// Deaths

/// A death: bound calls get `SandboxLost`, `resolve` answers `SandboxGone`, pending and
/// in-flight versions are dropped `sandbox-gone`, late answers are stale, Shutdown is ordered
/// exactly once.
#[test]
fn death_of_a_running_sandbox() {
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.expect_events(&[ready("b", x)]);
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, x);
    h.flush("sa", &log(), "v2"); // pending
    h.died(x);
    h.expect_events(&[
        workspace_lost(x, Key::Agent),
        lost("a", x),
        lost("b", x),
        dropped("sa", &log(), 1, DropReason::SandboxGone),
        dropped("sa", &log(), 2, DropReason::SandboxGone),
        mirror_settled("sa"),
    ]);
    h.expect_commands(&[cancel(u1, x), shutdown(x)]);
    assert_eq!(h.core.call_status(&call("a")), Some(CallStatus::Lost(x)));
    assert_eq!(
        h.resolve("sb"),
        Err(Error::SandboxGone {
            session: session("sb"),
            sandbox: x
        })
    );
    h.upload_ok(u1);
    h.died(x);
    h.quiet();
    h.release("a");
    h.release("b");
    h.expect_events(&[released("a"), released("b")]);
    h.expect_commands(&[]);
    h.shutdown_ok(x);
    h.quiet();
    assert!(h.core.is_quiescent());
    assert_eq!(h.core.stats().shutdowns_ordered, 1);
}

/// After its sandbox died, a key's next call gets a new sandbox (never the dead one), while the
/// lost call stays live, bound to the dead one, until it is released. Under `Serialize` the
/// next call waits for the lost call's release (never two live calls on one key).
#[test]
fn after_a_death_the_next_call_of_the_key_gets_a_new_sandbox() {
    let mut h = Script::default_config();
    let x = h.ready_call("a1", "s");
    h.died(x);
    h.expect_events(&[workspace_lost(x, session_key("s")), lost("a1", x)]);
    h.expect_commands(&[shutdown(x)]);
    h.acquire("a2", "s");
    let y = h.started();
    assert_ne!(x, y);
    h.start_ok(y);
    h.expect_events(&[ready("a2", y)]);
    assert_eq!(h.core.call_status(&call("a1")), Some(CallStatus::Lost(x)));
    assert_eq!(h.resolve("s"), Ok(y)); // the live one, not the dead one
    h.flush("s", &log(), "v1");
    h.expect_upload("s", &log(), 1, y);

    let mut h = Script::with(|c| c.same_key = SameKey::Serialize);
    let x = h.ready_call("a1", "s");
    h.acquire("a2", "s");
    h.died(x);
    h.expect_events(&[workspace_lost(x, session_key("s")), lost("a1", x)]);
    h.expect_commands(&[shutdown(x)]);
    assert_eq!(h.core.call_status(&call("a2")), Some(CallStatus::Waiting));
    h.release("a1");
    h.expect_events(&[released("a1")]);
    let y = h.started();
    assert_ne!(x, y);
}

/// Death while starting fails the calls with `sandbox-gone`; death while stopping makes the
/// Stop's answer stale (nothing persisted) and orders the one Shutdown; death after Shutdown
/// was ordered orders nothing more; an upload answered `Gone` is a death.
#[test]
fn deaths_in_every_state() {
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.died(x);
    h.expect_events(&[failed("a", ErrorKind::SandboxGone)]);
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.start_ok(x); // stale
    h.quiet();

    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.died(x);
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.expect_events(&[workspace_lost(x, session_key("s"))]);
    h.stop_ok(x, Some("snap")); // stale: no Persist after death
    h.quiet();
    h.died(x);
    h.quiet();

    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.take_commands();
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    h.died(x);
    h.quiet(); // Shutdown was ordered already: once
    h.shutdown_ok(x);
    assert!(h.core.is_quiescent());

    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.upload_failed(u, UploadFailure::Gone);
    h.expect_events(&[
        dropped("s", &log(), 1, DropReason::SandboxGone),
        workspace_lost(x, session_key("s")),
        lost("a", x),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[shutdown(x)]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Dead));
}

/// A death ends a drain: the released call's release completes, its mirror work is dropped
/// `sandbox-gone`; a warm sandbox that dies is shut down and the next call starts afresh.
#[test]
fn death_while_draining_or_warm() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.expect_events(&[]);
    h.died(x);
    h.expect_commands(&[cancel(u, x), shutdown(x)]);
    h.expect_events(&[
        workspace_lost(x, session_key("s")),
        dropped("s", &log(), 1, DropReason::SandboxGone),
        released("a"),
        mirror_settled("s"),
    ]);

    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.died(x);
    h.expect_commands(&[shutdown(x)]);
    // A warm sandbox's loss is told too: no call would hear of it otherwise.
    h.expect_events(&[workspace_lost(x, session_key("s"))]);
    assert_eq!(h.next_deadline_in(), Some(secs(5))); // the Shutdown's, not the idle timer
    h.acquire("b", "s");
    let y = h.started();
    assert_ne!(x, y);
}

/// Stop, Persist and Shutdown unanswered for `command_timeout`: a Stop or Persist that times
/// out counts as failed (Shutdown follows, nothing persisted); a Shutdown that times out is
/// reported unconfirmed and never ordered again.
#[test]
fn command_timeouts() {
    let mut h = Script::default_config(); // command 5 s
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.advance(secs(5));
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.stop_ok(x, Some("late")); // stale
    h.quiet();
    h.advance(secs(5));
    h.expect_events(&[unconfirmed(x)]);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), None);
    assert_eq!(h.core.poll_timeout(), None);
    h.shutdown_ok(x); // late: stale
    h.quiet();

    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.take_commands();
    h.stop_ok(x, Some("snap"));
    h.expect_commands(&[persist(x, Some("snap"))]);
    // An unanswered Persist is given up as a failed one: the snapshot the Stop took is
    // salvaged for the key, the sandbox left as it is (no Abandon, no Shutdown).
    h.advance(secs(5));
    h.expect_commands(&[]);
    h.expect_events(&[Event::WayDownFailed {
        sandbox: x,
        key: Key::Session(session("s")),
        kept: Some(snap("snap")),
    }]);
    h.persist_ok(x); // late: stale
    h.quiet();
    h.acquire("b", "s");
    assert_eq!(h.take_start().resume_from, Some(snap("snap")));
}

/// A draining sandbox is revived by the next call of its key instead of being replaced: no
/// Start, no Stop; the released call's release still completes only when its mirror work in
/// that sandbox has settled.
#[test]
fn a_draining_sandbox_is_revived_by_the_next_call_of_its_key() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.acquire("a2", "s");
    h.expect_events(&[ready("a2", x)]);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Running));
    assert_eq!(h.next_deadline_in(), Some(secs(2))); // only the upload's: no drain deadline
    h.upload_ok(u);
    h.expect_events(&[
        uploaded("s", &log(), 1, x),
        released("a"),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);
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

/// The Drain command names the draining sandbox and every session whose mirror targets it.
#[test]
fn drain_command_names_the_sandbox_and_its_sessions() {
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.acquire("c", "sc");
    h.take_events();
    h.release("c");
    h.release("a");
    h.release("b");
    h.take_events();
    h.expect_commands(&[drain(x, &["sa", "sb", "sc"]), stop(x)]);
}

/// Holds: draining waits for holds like uploads, until unhold or the drain deadline; `unhold`
/// without a hold is `NotHeld`; a session with nothing live cannot hold.
#[test]
fn holds_delay_drain_until_unhold_or_deadline() {
    let mut h = Script::default_config(); // drain 3 s
    assert_eq!(
        h.hold("s"),
        Err(Error::NoActiveSandbox {
            session: session("s")
        })
    );
    assert_eq!(
        h.unhold("s"),
        Err(Error::NotHeld {
            session: session("s")
        })
    );
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap();
    h.hold("s").unwrap();
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.expect_events(&[]);
    h.advance(secs(1));
    h.unhold("s").unwrap();
    h.quiet(); // one hold left
    h.unhold("s").unwrap();
    h.expect_events(&[released("a")]);
    h.expect_commands(&[stop(x)]);

    // Never let go: the drain deadline ends the wait.
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap();
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.advance(ms(2999));
    h.quiet();
    h.advance(ms(1));
    h.expect_commands(&[stop(x)]);
    h.expect_events(&[released("a")]);
    assert_eq!(h.core.stats().drain_deadlines, 1);
    h.unhold("s").unwrap(); // the late unhold is accepted and changes nothing else
    h.quiet();
}

// ----------------------------------------------------------------------------------------------
// Mirror

/// Coalescing: a newer flush supersedes the pending one (`Superseded { by }`); the in-flight one
/// is not touched; versions reach the sandbox in increasing order.
#[test]
fn mirror_coalesces_pending_versions() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    assert_eq!(h.flush("s", &log(), "v1"), 1);
    let u1 = h.expect_upload("s", &log(), 1, x);
    assert_eq!(h.flush("s", &log(), "v2"), 2);
    h.quiet();
    assert_eq!(h.flush("s", &log(), "v3"), 3);
    h.expect_events(&[superseded("s", &log(), 2, 3)]);
    assert_eq!(h.flush("s", &log(), "v4"), 4);
    h.expect_events(&[superseded("s", &log(), 3, 4)]);
    h.expect_commands(&[]);
    h.upload_ok(u1);
    h.expect_events(&[uploaded("s", &log(), 1, x)]);
    let up = h.take_upload();
    assert_eq!(
        (up.version, up.payload.as_bytes()),
        (Version(4), &b"v4"[..])
    );
    h.upload_ok(up.upload);
    h.expect_events(&[uploaded("s", &log(), 4, x), mirror_settled("s")]);
    assert_eq!(h.core.stats().versions_superseded, 2);
}

/// At most one upload in flight per (session, path); different paths and sessions go in
/// parallel; versions count per (session, path).
#[test]
fn one_upload_in_flight_per_session_path() {
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.take_events();
    h.flush("sa", &log(), "1");
    h.expect_upload("sa", &log(), 1, x);
    h.flush("sa", &path("memory"), "1");
    h.expect_upload("sa", &path("memory"), 1, x);
    h.flush("sb", &log(), "1");
    h.expect_upload("sb", &log(), 1, x);
    assert_eq!(h.flush("sa", &log(), "2"), 2);
    h.expect_commands(&[]); // behind its path's upload
    assert_eq!(h.uploads.len(), 3);
    assert_eq!(h.flush("sb", &log(), "2"), 2);
    assert_eq!(h.flush("sa", &path("memory"), "2"), 2);
    h.expect_commands(&[]);
}

/// A transient failure retries the version after 100 ms, 200 ms, 400 ms (doubling), then
/// drops it `upload-failed`. Each attempt has its own `upload_timeout` (documented: the
/// timeout bounds one attempt, and `upload_retries` bounds the number of attempts).
#[test]
fn transient_upload_failure_retries_with_backoff_then_drops() {
    let mut h = Script::default_config(); // 3 retries, 100 ms
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let mut u = h.expect_upload("s", &log(), 1, x);
    for backoff in [100, 200, 400] {
        h.upload_failed(u, UploadFailure::Transient);
        h.quiet();
        assert_eq!(h.next_deadline_in(), Some(ms(backoff)));
        h.advance(ms(backoff - 1));
        h.quiet();
        h.advance(ms(1));
        u = h.expect_upload("s", &log(), 1, x);
    }
    h.upload_failed(u, UploadFailure::Transient);
    h.expect_events(&[
        dropped("s", &log(), 1, DropReason::UploadFailed),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);
    assert_eq!(h.core.stats().upload_retries, 3);

    // The upload timeout bounds all attempts of one version together: a retry keeps the first
    // attempt's deadline, and a failure so late that the backoff would end past it is final.
    h.flush("s", &log(), "late");
    let u = h.expect_upload("s", &log(), 2, x);
    h.wait(ms(1800));
    h.upload_failed(u, UploadFailure::Transient);
    h.advance(ms(100));
    let u = h.expect_upload("s", &log(), 2, x);
    assert_eq!(h.next_deadline_in(), Some(ms(100)));
    h.advance(ms(100));
    h.expect_commands(&[cancel(u, x)]);
    h.expect_events(&[
        dropped("s", &log(), 2, DropReason::UploadTimeout),
        mirror_settled("s"),
    ]);
    h.flush("s", &log(), "too-late");
    let u = h.expect_upload("s", &log(), 3, x);
    h.wait(ms(1950));
    h.upload_failed(u, UploadFailure::Transient);
    h.expect_events(&[
        dropped("s", &log(), 3, DropReason::UploadFailed),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);

    // A newer version waiting when the attempt fails: the failed one is superseded, the newer
    // one goes out at once.
    h.flush("s", &log(), "v4");
    let u4 = h.expect_upload("s", &log(), 4, x);
    h.flush("s", &log(), "v5");
    h.upload_failed(u4, UploadFailure::Transient);
    h.expect_events(&[superseded("s", &log(), 4, 5)]);
    h.expect_upload("s", &log(), 5, x);
}

/// An attempt unanswered for `upload_timeout` is cancelled and its version dropped
/// `upload-timeout`; the path's next version goes out.
#[test]
fn upload_timeout_drops_the_version() {
    let mut h = Script::default_config(); // upload 2 s
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u1 = h.expect_upload("s", &log(), 1, x);
    h.advance(ms(1999));
    h.quiet();
    h.advance(ms(1));
    h.expect_commands(&[cancel(u1, x)]);
    h.expect_events(&[
        dropped("s", &log(), 1, DropReason::UploadTimeout),
        mirror_settled("s"),
    ]);
    h.upload_ok(u1); // stale
    h.quiet();
}

/// A flush while the session's call is still starting waits for the sandbox, then goes to it;
/// if the start fails, it is dropped `no-sandbox`.
#[test]
fn flush_while_starting_waits_for_the_sandbox() {
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.flush("s", &log(), "early");
    h.quiet();
    h.start_ok(x);
    h.expect_events(&[ready("a", x)]);
    h.expect_upload("s", &log(), 1, x);

    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.flush("s", &log(), "early");
    h.start_failed(x);
    h.expect_events(&[
        failed("a", ErrorKind::StartFailed),
        dropped("s", &log(), 1, DropReason::NoSandbox),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[shutdown(x)]);
}

/// `MirrorSettled` comes per session, when that session has nothing unsettled; another
/// session's unsettled work does not hold it back.
#[test]
fn mirror_settled_per_session() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "1");
    let ua = h.expect_upload("sa", &log(), 1, xa);
    h.flush("sb", &log(), "1");
    let ub = h.expect_upload("sb", &log(), 1, xb);
    assert!(!h.core.is_mirror_settled(&session("sa")));
    h.upload_ok(ub);
    h.expect_events(&[uploaded("sb", &log(), 1, xb), mirror_settled("sb")]);
    assert!(h.core.is_mirror_settled(&session("sb")));
    assert!(!h.core.is_mirror_settled(&session("sa")));
    h.upload_ok(ua);
    h.expect_events(&[uploaded("sa", &log(), 1, xa), mirror_settled("sa")]);
    // `MirrorSettled` marks the change from unsettled to settled: a flush that settles at once
    // (nowhere to go) emits none, and the getter says settled. A waiter checks the getter first.
    h.flush("nobody", &log(), "x");
    h.expect_events(&[dropped("nobody", &log(), 1, DropReason::NoSandbox)]);
    assert!(h.core.is_mirror_settled(&session("nobody")));
}

/// `CallReleased` waits for the released call's own session's mirror work in its sandbox, and
/// never for another session's (even one sharing the sandbox, with an upload hung).
#[test]
fn call_released_waits_for_its_own_sessions_mirror_only() {
    let mut h = Script::with(|c| {
        c.scope = Scope::Agent;
        c.upload_timeout = secs(600);
    });
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.take_events();
    h.flush("sb", &log(), "hung");
    h.expect_upload("sb", &log(), 1, x);
    h.hold("sb").unwrap(); // and sb's writer holds
    h.release("a");
    h.expect_events(&[released("a")]); // sa had nothing pending: at once
    h.acquire("a2", "sa");
    h.take_events();
    h.flush("sa", &log(), "mine");
    let ua = h.expect_upload("sa", &log(), 1, x);
    h.release("a2");
    h.expect_events(&[]); // its own upload is in flight
    h.upload_ok(ua);
    h.expect_events(&[
        uploaded("sa", &log(), 1, x),
        released("a2"),
        mirror_settled("sa"),
    ]);
    assert!(!h.core.is_mirror_settled(&session("sb")));
    h.expect_commands(&[]); // b is still live on x
}

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
        Input::Release { call: call("a") },
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

/// Idle session records are bounded (`max_idle_sessions`): the oldest is forgotten, and, as
/// documented on the limit, its next flush starts again at version 1.
#[test]
fn idle_session_records_are_bounded() {
    let mut h = Script::with(|c| c.limits.max_idle_sessions = 1);
    h.flush("s1", &log(), "x");
    h.flush("s1", &log(), "x");
    assert_eq!(
        h.core.last_version(&session("s1"), &log()),
        Some(Version(2))
    );
    h.flush("s2", &log(), "x");
    assert_eq!(h.core.session_records(), 1);
    assert_eq!(h.core.stats().sessions_forgotten, 1);
    assert_eq!(h.core.last_version(&session("s1"), &log()), None);
    assert_eq!(h.flush("s1", &log(), "x"), 1);
    h.take_events();
    // A session with a live call is never forgotten.
    let x = h.ready_call("a", "s3");
    h.flush("s3", &log(), "x");
    h.expect_upload("s3", &log(), 1, x);
    for i in 0..5 {
        h.flush(&format!("idle{i}"), &log(), "x");
    }
    assert_eq!(
        h.core.last_version(&session("s3"), &log()),
        Some(Version(1))
    );
}

// ----------------------------------------------------------------------------------------------
// Serde

/// Every input, command and event survives a JSON round trip.
#[test]
fn inputs_commands_and_events_round_trip() {
    let mut h = Script::default_config();
    h.try_acquire(
        spec("a", "s")
            .with_user(user("u"))
            .with_spec(Spec::new("img")),
    )
    .unwrap();
    let x = h.started();
    h.start_ok(x);
    h.flush("s", &log(), "payload \u{0} bytes");
    let u = h.take_upload().upload;
    h.upload_failed(u, UploadFailure::Transient);
    h.hold("s").unwrap();
    h.release("a");
    h.unhold("s").unwrap();
    h.advance(secs(1));
    h.advance(secs(3));
    h.stop_ok(x, Some("snap"));
    h.persist_failed(x);
    h.shutdown_failed(x);
    h.acquire("b", "s");
    h.advance(secs(1));
    h.try_acquire(spec("e", "s").with_external(external("ext")))
        .unwrap();
    let ext = h.core.call_status(&call("e")).unwrap();
    let CallStatus::Ready(xe) = ext else { panic!() };
    h.died(xe);
    h.close(secs(1)).unwrap();
    h.advance(secs(100));
    h.take_commands();
    h.take_events();
    let mut commands = std::collections::BTreeSet::new();
    for c in &h.all_commands {
        let json = serde_json::to_string(c).unwrap();
        commands.insert(json.split('"').nth(3).unwrap().to_string());
        assert_eq!(&serde_json::from_str::<Command>(&json).unwrap(), c);
    }
    let mut events = std::collections::BTreeSet::new();
    for e in &h.all_events {
        let json = serde_json::to_string(e).unwrap();
        events.insert(json.split('"').nth(3).unwrap().to_string());
        assert_eq!(&serde_json::from_str::<Event>(&json).unwrap(), e);
    }
    let mut inputs = std::collections::BTreeSet::new();
    for (at, i) in &h.trace {
        let json = serde_json::to_string(&(at, i)).unwrap();
        inputs.insert(
            serde_json::to_value(i).unwrap()["input"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        assert_eq!(
            &serde_json::from_str::<(Instant, Input)>(&json).unwrap(),
            &(*at, i.clone())
        );
    }
    // The round trips covered most kinds (the rest are covered elsewhere).
    assert!(commands.len() >= 6, "{commands:?}");
    assert!(events.len() >= 7, "{events:?}");
    assert!(inputs.len() >= 12, "{inputs:?}");
}

/// Every variant of `Input`, `Command` and `Event`, made by hand, survives a JSON round trip.
#[test]
fn every_variant_round_trips() {
    fn round_trip<T>(values: &[T])
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        for v in values {
            let json = serde_json::to_string(v).unwrap();
            assert_eq!(&serde_json::from_str::<T>(&json).unwrap(), v, "{json}");
        }
    }
    let x = SandboxId(7);
    let u = UploadId(3);
    let payload = Payload::new(vec![0u8, 1, 255]);
    round_trip(&[
        Input::Acquire(
            spec("a", "s")
                .with_user(user("u"))
                .with_external(external("e"))
                .with_spec(Spec::new("img")),
        ),
        Input::Release { call: call("a") },
        Input::Flush {
            session: session("s"),
            path: log(),
            payload: payload.clone(),
        },
        Input::Hold {
            session: session("s"),
        },
        Input::Unhold {
            session: session("s"),
        },
        Input::Close { deadline: ms(1500) },
        Input::StartOk { sandbox: x },
        Input::StartFailed { sandbox: x },
        Input::UploadOk { upload: u },
        Input::UploadFailed {
            upload: u,
            failure: UploadFailure::Transient,
        },
        Input::UploadFailed {
            upload: u,
            failure: UploadFailure::Gone,
        },
        Input::StopOk {
            sandbox: x,
            snapshot: Some(snap("z")),
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
    ]);
    let keys = [
        Key::Call(call("c")),
        Key::Session(session("s")),
        Key::User(user("u")),
        Key::Agent,
        Key::Global,
        Key::External(external("e")),
    ];
    round_trip(&keys);
    let mut commands: Vec<Command> = keys
        .iter()
        .map(|key| Command::Start {
            sandbox: x,
            key: key.clone(),
            spec: Spec::new("spec"),
            resume_from: Some(snap("r")),
            resumes: Some(SandboxId(0)),
            deadline: Instant::from_millis(1500),
            token: None,
        })
        .collect();
    commands.extend([
        Command::Upload {
            upload: u,
            sandbox: x,
            session: session("s"),
            path: log(),
            version: Version(2),
            payload,
            deadline: Instant::from_millis(2500),
            token: None,
        },
        Command::CancelUpload {
            upload: u,
            sandbox: x,
        },
        drain(x, &["s", "t"]),
        stop(x),
        stop_to_suspend(x),
        persist(x, Some("p")),
        persist(x, None),
        persist_to_suspend(x, Some("p")),
        shutdown(x),
        abandon(x),
    ]);
    round_trip(&commands);
    let mut events = vec![
        ready("a", x),
        failed("a", ErrorKind::WaitTimeout),
        released("a"),
        revoked("a"),
        lost("a", x),
        uploaded("s", &log(), 1, x),
        superseded("s", &log(), 1, 2),
        mirror_settled("s"),
        unconfirmed(x),
        Event::Closed {
            report: Box::new(CloseReport {
                revoked_calls: vec![call("a")],
                refused_waiters: vec![call("b")],
                dropped_versions: vec![(session("s"), log(), Version(1))],
                revoked_holds: vec![(session("s"), 2)],
                shut_down: 3,
                suspended: vec![x],
                unconfirmed: vec![SandboxId(8)],
                retained: vec![],
            }),
        },
    ];
    for reason in [
        DropReason::SandboxGone,
        DropReason::DrainDeadline,
        DropReason::Closed,
        DropReason::NoSandbox,
        DropReason::UploadFailed,
        DropReason::UploadTimeout,
    ] {
        events.push(dropped("s", &log(), 1, reason));
    }
    round_trip(&events);
    // Errors serialise (for traces), with their kind.
    let json = serde_json::to_value(Error::QueueFull {
        key: Key::Agent,
        max: 2,
    })
    .unwrap();
    assert_eq!(json["QueueFull"]["key"], "agent");
}

/// The whole core survives a JSON round trip mid-run: the copy continues exactly as the
/// original (same commands, events, answers, timers and state).
#[test]
fn lifecycle_round_trip_continues_identically() {
    let mut h = Script::with(|c| {
        c.release = ReleasePolicy::KeepWarm { idle: secs(10) };
        c.same_key = SameKey::Serialize;
    });
    let x = h.ready_call("a", "s");
    h.acquire("q", "s");
    h.flush("s", &log(), "v1");
    let u1 = h.take_upload().upload;
    h.flush("s", &log(), "v2");
    h.hold("s").unwrap();
    h.acquire("b", "t");
    let y = h.started();
    h.wait(ms(700));
    h.take_events();

    let json = serde_json::to_string(&h.core).unwrap();
    let copy: Lifecycle = serde_json::from_str(&json).unwrap();
    copy.check_invariants().unwrap();
    let mut twin = h.twin(copy);
    assert_eq!(
        serde_json::to_value(&h.core).unwrap(),
        serde_json::to_value(&twin.core).unwrap()
    );

    let rest = vec![
        (ms(0), Input::UploadOk { upload: u1 }),
        (ms(10), Input::StartOk { sandbox: y }),
        (ms(10), Input::Release { call: call("a") }),
        (
            ms(10),
            Input::Unhold {
                session: session("s"),
            },
        ),
        (ms(5000), Input::Timeout),
        (ms(0), Input::Release { call: call("q") }),
        (ms(0), Input::Release { call: call("b") }),
        (ms(0), Input::Release { call: call("b") }),
        (ms(20_000), Input::Timeout),
        (ms(0), Input::Close { deadline: secs(1) }),
        (
            ms(0),
            Input::StopOk {
                sandbox: x,
                snapshot: Some(snap("z")),
            },
        ),
        (
            ms(0),
            Input::StopOk {
                sandbox: y,
                snapshot: None,
            },
        ),
    ];
    for (d, input) in rest {
        h.wait(d);
        twin.wait(d);
        let a = h.input(input.clone());
        let b = twin.input(input.clone());
        assert_eq!(a, b, "{input:?}");
        assert_eq!(h.take_commands(), twin.take_commands(), "{input:?}");
        assert_eq!(h.take_events(), twin.take_events(), "{input:?}");
        assert_eq!(h.core.poll_timeout(), twin.core.poll_timeout());
        assert_eq!(h.resolve("s"), twin.resolve("s"));
        assert_eq!(h.core.stats(), twin.core.stats());
        assert_eq!(
            serde_json::to_value(&h.core).unwrap(),
            serde_json::to_value(&twin.core).unwrap()
        );
    }
    assert!(h.all_commands.len() > 8);
}
