//! Operations: the application's own work in a session's sandbox, entered and left. Entering
//! names the session's own sandbox (never another session's), a draining sandbox waits for
//! the work in it up to the drain deadline, a sandbox ordered to stop is never entered, and
//! entering and leaving order nothing by themselves.

mod support;
use sandkeeper::*;
use support::*;

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
