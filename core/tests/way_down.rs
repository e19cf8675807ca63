//! The way down of a sandbox: Drain, Stop, Persist, Shutdown in that order, each with its
//! deadline from the instant of the order; Stop and Persist say whether they suspend; `Abandon`
//! comes exactly when a Shutdown cuts an outstanding command; command timeouts. Operations (the
//! application's own work in a session's sandbox) are here too: entering names the session's own
//! sandbox, a draining sandbox waits for the work in it up to the drain deadline, a sandbox
//! ordered to stop is never entered, and entering and leaving order nothing by themselves. Race
//! R12 (`docs/design.md`, "The races") is here.

mod support;

use sandkeeper::*;
use support::*;

type Outputs = Vec<(Vec<Command>, Vec<Event>)>;

/// Applies `f`, then (with `work`) enters the session's sandbox and leaves it at once, and
/// records the outputs.
fn step(h: &mut Script, outputs: &mut Outputs, work: bool, f: impl FnOnce(&mut Script)) {
    f(h);
    if work {
        if let Ok(x) = h.enter("s") {
            h.leave(x).unwrap();
        }
    }
    outputs.push((h.take_commands(), h.take_events()));
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

#[test]
fn deadlines_are_the_configured_timeouts_from_the_instant_of_the_order() {
    let mut h = Script::default_config();
    h.advance(ms(700));
    h.acquire("a", "s");
    let cmds = h.take_commands();
    assert_eq!(
        cmds[0].deadline(),
        Some(Instant::ZERO + ms(700) + h.core.config().start_timeout)
    );
    let x = cmds[0].sandbox();
    h.start_ok(x);
    h.take_events();
    h.flush("s", &log(), "v1");
    let up = h.take_commands();
    assert_eq!(
        up[0].deadline(),
        Some(h.now + h.core.config().upload_timeout)
    );
    // A retry keeps its version's deadline: the attempts of a version end within the upload
    // timeout of its first attempt.
    let first = up[0].deadline();
    let Command::Upload { upload, .. } = up[0] else {
        panic!("{up:?}")
    };
    h.advance(ms(300));
    h.upload_failed(upload, UploadFailure::Transient);
    h.run_to_next_deadline();
    let retry = h.take_commands();
    assert!(matches!(retry[0], Command::Upload { .. }), "{retry:?}");
    assert_eq!(retry[0].deadline(), first);
    // Commands that want no answer carry none.
    assert_eq!(abandon(x).deadline(), None);
    assert_eq!(drain(x, &["s"]).deadline(), None);
}

#[test]
fn stop_and_persist_say_whether_they_suspend() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.stop_ok(x, Some("snap"));
    h.expect_commands(&[persist(x, Some("snap"))]);
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);

    let mut h = suspending();
    suspend(&mut h, "a", "claim-1");
}

/// Every way the core stops awaiting a Start, Stop or Persist without its answer orders
/// `Abandon` right before the Shutdown; a Start that answered is not abandoned.
#[test]
fn abandon_comes_exactly_when_an_outstanding_command_is_cut() {
    // Start timeout.
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.run_to_next_deadline();
    h.take_events();
    h.expect_commands(&[abandon(x), shutdown(x)]);
    // Start failed: answered, nothing to abandon.
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.start_failed(x);
    h.take_events();
    h.expect_commands(&[shutdown(x)]);
    // Stop timeout (a fresh sandbox, under the Shutdown way: nothing of its key's history).
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_commands();
    h.run_to_next_deadline();
    h.expect_commands(&[abandon(x), shutdown(x)]);
    // A Shutdown that times out is reported unconfirmed, never abandoned (nothing follows it).
    h.run_to_next_deadline();
    h.take_events();
    h.expect_commands(&[]);
    assert_eq!(h.core.stats().abandoned, 1);
    // A Persist timeout with the Stop's snapshot is given up without an Abandon: the
    // snapshot is salvaged and no Shutdown follows (see `command_timeouts`).
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_commands();
    h.stop_ok(x, Some("snap"));
    h.take_commands();
    h.run_to_next_deadline();
    h.expect_commands(&[]);
    assert_eq!(h.core.stats().abandoned, 0);
}

/// R12 persist before stop: the order on release is Drain → Stop → Persist → Shutdown; Persist
/// waits for the Stop acknowledgement (and its snapshot), and a failed Stop persists nothing.
#[test]
fn r12_persist_before_stop() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.wait(secs(1));
    h.timeout();
    h.expect_commands(&[]); // no Persist while Stop is unanswered
    h.stop_ok(x, Some("snap-1"));
    h.expect_commands(&[persist(x, Some("snap-1"))]);
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);

    // Suspend: Drain → Stop → Persist, no Shutdown.
    let mut h = Script::with(|c| c.release = ReleasePolicy::Suspend);
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, Some("snap-1"));
    h.expect_commands(&[persist_to_suspend(x, Some("snap-1"))]);
    h.persist_ok(x);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), None);

    // A failed Stop: nothing is persisted; ordered again; when every attempt failed, a
    // sandbox being suspended (its key's history) is left to the backend as it is, never shut
    // down, and the application is told.
    let mut h = Script::with(|c| c.release = ReleasePolicy::Suspend);
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    for _ in 1..WAY_DOWN_ATTEMPTS {
        h.stop_failed(x);
        h.expect_commands(&[stop_to_suspend(x)]);
    }
    h.take_events();
    h.stop_failed(x);
    h.expect_commands(&[]);
    h.expect_events(&[Event::WayDownFailed {
        sandbox: x,
        key: Key::Session(session("s")),
        kept: None,
    }]);
    assert_eq!(h.core.sandbox_state(x), None);
    assert_eq!(h.core.stats().left_as_is, 1);
}

/// The session's live call's sandbox, never another session's; none without a call.
#[test]
fn enter_names_the_sessions_own_sandbox() {
    let mut h = Script::default_config();
    let a = h.ready_call("a", "s1");
    let b = h.ready_call("b", "s2");
    assert_ne!(a, b);
    assert_eq!(h.enter("s1"), Ok(a));
    assert_eq!(h.enter("s2"), Ok(b));
    assert_eq!(h.core.operations_in(a), Some(1));
    assert!(matches!(
        h.enter("nobody"),
        Err(Error::NoActiveSandbox { .. })
    ));
    h.leave(a).unwrap();
    h.leave(b).unwrap();
    assert_eq!(h.core.operations_in(a), Some(0));
    h.quiet();
}

/// Work entered while the call is live keeps the drain that follows its release from ending:
/// Stop comes when the work leaves.
#[test]
fn a_drain_waits_for_the_work_in_its_sandbox() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    assert_eq!(h.enter("s"), Ok(x));
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.expect_events(&[released("a")]);
    h.advance(ms(2999));
    h.quiet();
    h.leave(x).unwrap();
    h.expect_commands(&[stop(x)]);
}

/// After the release, while the sandbox drains (a hold keeps it), the session's work may still
/// enter it; once the hold goes, the work alone keeps the drain.
#[test]
fn a_draining_sandbox_is_entered_after_the_release() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap();
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    assert_eq!(h.enter("s"), Ok(x));
    h.unhold("s").unwrap();
    h.expect_events(&[released("a")]);
    h.quiet();
    h.leave(x).unwrap();
    h.expect_commands(&[stop(x)]);
}

/// The drain deadline bounds the wait: the sandbox stops with the work still in it, is never
/// entered again, and the late leave is taken.
#[test]
fn the_drain_deadline_stops_a_sandbox_with_work_in_it() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    assert_eq!(h.enter("s"), Ok(x));
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.advance(secs(3));
    h.expect_commands(&[stop(x)]);
    assert!(matches!(h.enter("s"), Err(Error::NoActiveSandbox { .. })));
    h.leave(x).unwrap();
    h.stop_ok(x, None);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);
    assert_eq!(h.core.sandbox_state(x), None, "forgotten");
    assert_eq!(
        h.leave(x),
        Ok(()),
        "a forgotten sandbox has nothing to let go"
    );
}

/// A warm sandbox is entered after its call's release; when its idle time ends it drains, and
/// the drain waits for the work.
#[test]
fn a_warm_sandbox_is_entered_and_its_drain_waits() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_events(&[released("a")]);
    h.quiet();
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Idle));
    assert_eq!(h.enter("s"), Ok(x));
    h.advance(secs(10));
    h.expect_commands(&[drain(x, &["s"])]);
    h.leave(x).unwrap();
    h.expect_commands(&[stop(x)]);
}

/// Bad input changes nothing: a leave without an enter, an id never handed out, past the
/// limit, after close.
#[test]
fn bad_enters_and_leaves_are_typed_errors() {
    let mut h = Script::with(|c| c.limits.max_operations_per_sandbox = 2);
    let x = h.ready_call("a", "s");
    assert!(matches!(h.leave(x), Err(Error::NotEntered { sandbox }) if sandbox == x));
    assert!(matches!(
        h.leave(SandboxId(999)),
        Err(Error::UnknownSandbox { .. })
    ));
    h.enter("s").unwrap();
    h.enter("s").unwrap();
    assert!(matches!(
        h.enter("s"),
        Err(Error::LimitExceeded {
            limit: "max_operations_per_sandbox",
            max: 2
        })
    ));
    h.leave(x).unwrap();
    h.leave(x).unwrap();
    assert_eq!(h.leave(x).map_err(|e| e.kind()), Err(ErrorKind::NotEntered));
}

/// Entering and leaving at once, around every input of a call's life, leaves the commands and
/// events exactly as without them: work only delays a drain's end, it orders nothing.
#[test]
fn entering_and_leaving_at_once_changes_no_output() {
    let run = |work: bool| {
        let mut h = Script::default_config();
        let mut out = Outputs::new();
        step(&mut h, &mut out, work, |h| h.acquire("a", "s"));
        let x = out[0]
            .0
            .iter()
            .find_map(|c| match c {
                Command::Start { sandbox, .. } => Some(*sandbox),
                _ => None,
            })
            .expect("a start");
        step(&mut h, &mut out, work, |h| h.start_ok(x));
        step(&mut h, &mut out, work, |h| {
            h.flush("s", &log(), "v1");
        });
        step(&mut h, &mut out, work, |h| h.release("a"));
        let uploads: Vec<UploadId> = out
            .iter()
            .flat_map(|(c, _)| c)
            .filter_map(|c| match c {
                Command::Upload { upload, .. } => Some(*upload),
                _ => None,
            })
            .collect();
        for u in uploads {
            step(&mut h, &mut out, work, |h| h.upload_ok(u));
        }
        step(&mut h, &mut out, work, |h| h.stop_ok(x, None));
        step(&mut h, &mut out, work, |h| h.shutdown_ok(x));
        out
    };
    let plain = run(false);
    assert!(plain
        .iter()
        .any(|(c, _)| c.iter().any(|c| matches!(c, Command::Stop { .. }))));
    assert_eq!(run(true), plain);
}

/// The limit on entered work is 1,024 by default, and a serialised configuration written before
/// the limit existed (without the field) reads with that default.
#[test]
fn the_limit_on_entered_work_defaults_to_1024() {
    let limits = sandkeeper::Limits::default();
    assert_eq!(limits.max_operations_per_sandbox, 1024);
    let mut older = serde_json::to_value(&limits).unwrap();
    older
        .as_object_mut()
        .unwrap()
        .remove("max_operations_per_sandbox");
    let read: sandkeeper::Limits = serde_json::from_value(older).unwrap();
    assert_eq!(read.max_operations_per_sandbox, 1024);
}
