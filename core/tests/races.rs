//! The races R1–R13 (`docs/design.md`, "The races"), one named test
//! each, written as the interleaving that produced the production failure and asserting the
//! correct outcome: the exact commands, events, `resolve` answers and settlements.
//!
//! Where a race is partly about a driver (a null dereference, a liveness flag on a backend
//! object, a store closed under a writer), the test encodes the core's part of it: the decision
//! that makes the driver's failure impossible. The script (`support`) also checks the history
//! invariants on every step (no command after Shutdown, no Upload after Stop/Shutdown/death,
//! Persist only after Stop, one Shutdown per managed sandbox and none for an external one,
//! every version settled once).

mod support;

use sandkeeper::*;
use support::*;

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

/// R5 mirror after release: A flushes, A releases, then the queued mirror runs. It must go into
/// A's sandbox (kept draining for it) and never into B's; a flush after A's sandbox stopped is
/// dropped with a reason, never routed elsewhere.
#[test]
fn r05_mirror_after_release() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.flush("sa", &log(), "v2"); // queued behind v1
    h.quiet();

    h.release("a");
    h.expect_commands(&[drain(xa, &["sa"])]); // no Stop: the mirror is not done
    h.expect_events(&[]); // the release completes when A's mirror has settled
    h.upload_ok(u1);
    h.expect_events(&[uploaded("sa", &log(), 1, xa)]);
    let u2 = h.expect_upload("sa", &log(), 2, xa); // the queued version runs, into A's sandbox
    h.upload_ok(u2);
    h.expect_events(&[
        uploaded("sa", &log(), 2, xa),
        released("a"),
        mirror_settled("sa"),
    ]);
    h.expect_commands(&[stop(xa)]);

    // A's sandbox is stopping: a late flush of A's session has nowhere to go and says so.
    assert_eq!(
        h.resolve("sa"),
        Err(Error::NoActiveSandbox {
            session: session("sa")
        })
    );
    h.flush("sa", &log(), "v3");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 3, DropReason::NoSandbox)]);
    // Nothing of A's session ever went to B's sandbox.
    assert!(!h.all_commands.iter().any(|c| matches!(c,
        Command::Upload { session, sandbox, .. } if session.as_str() == "sa" && *sandbox == xb)));
    h.stop_ok(xa, None);
    h.expect_commands(&[shutdown(xa)]);
}

/// R6 mirror into a dead sandbox. The null dereference is the driver's; the core's part: no
/// Upload is ever ordered after Stop, Shutdown or death; an upload still in flight when the
/// drain deadline passes or the sandbox dies is cancelled and its version settled dropped
/// (`drain-deadline`, `sandbox-gone`); its late answer is stale and changes nothing.
#[test]
fn r06_mirror_into_dead_sandbox() {
    // (a) Release stops the sandbox while an upload hangs: the drain deadline cuts it.
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.release("a");
    h.expect_commands(&[drain(xa, &["sa"])]);
    assert_eq!(h.next_deadline_in(), Some(secs(2))); // the upload timeout comes first
    h.flush("sa", &log(), "v2"); // pending behind the hung v1
    h.wait(ms(1500));
    h.run_to_next_deadline(); // upload timeout at 2 s: v1 dropped, v2 goes out, still into xa
    h.expect_commands(&[
        cancel(u1, xa),
        Command::Upload {
            upload: UploadId(1),
            sandbox: xa,
            session: session("sa"),
            path: log(),
            version: Version(2),
            payload: Payload::new(b"v2".to_vec()),
            deadline: Instant::ZERO, // compared apart (checked when drained)
            token: None,
        },
    ]);
    h.expect_events(&[dropped("sa", &log(), 1, DropReason::UploadTimeout)]);
    h.run_to_next_deadline(); // the drain deadline at 3 s
    assert_eq!(h.now, Instant::ZERO + secs(3));
    h.expect_commands(&[cancel(UploadId(1), xa), stop(xa)]);
    h.expect_events(&[
        dropped("sa", &log(), 2, DropReason::DrainDeadline),
        released("a"),
        mirror_settled("sa"),
    ]);
    // The late answers are stale: Ok, nothing changes, nothing is emitted.
    let stale = h.core.stats().stale_answers;
    let before = h.snapshot_json();
    h.upload_ok(u1);
    h.upload_ok(UploadId(1));
    h.quiet();
    assert_eq!(h.core.stats().stale_answers, stale + 2);
    let after = h.snapshot_json();
    assert_eq!(
        before.replace(&format!("\"stale_answers\":{stale}"), ""),
        after.replace(&format!("\"stale_answers\":{}", stale + 2), "")
    );
    // After Stop, and after Shutdown, a flush orders no Upload into it.
    h.flush("sa", &log(), "v3");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 3, DropReason::NoSandbox)]);
    h.stop_ok(xa, Some("snap"));
    h.expect_commands(&[persist(xa, Some("snap"))]);
    h.persist_ok(xa);
    h.expect_commands(&[shutdown(xa)]);
    h.flush("sa", &log(), "v4");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 4, DropReason::NoSandbox)]);

    // (b) The sandbox dies with an upload in flight.
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.died(xa);
    h.expect_commands(&[cancel(u1, xa), shutdown(xa)]);
    h.expect_events(&[
        workspace_lost(xa, session_key("sa")),
        lost("a", xa),
        dropped("sa", &log(), 1, DropReason::SandboxGone),
        mirror_settled("sa"),
    ]);
    assert_eq!(
        h.resolve("sa"),
        Err(Error::SandboxGone {
            session: session("sa"),
            sandbox: xa
        })
    );
    h.upload_ok(u1); // late success: stale, the version stays dropped
    h.quiet();
    h.flush("sa", &log(), "v2");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 2, DropReason::SandboxGone)]);
    h.died(xa); // a second report: ignored, Shutdown stays ordered once
    h.quiet();
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[]);
    h.shutdown_ok(xa);
    h.quiet();
    assert!(h.core.is_quiescent());
}

/// R7 liveness flag lies: after a failed Stop, or a Shutdown, the sandbox is not running for
/// the core, whatever a backend object says: nothing resolves to it, nothing is uploaded into
/// it, and the next call of its key gets a new sandbox.
#[test]
fn r07_liveness_flag_lies() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.stop_failed(x);
    h.expect_commands(&[stop(x)]); // ordered again, not persisted
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Stopping));
    h.stop_failed(x);
    h.expect_commands(&[stop(x)]);
    h.stop_failed(x);
    // Every attempt failed: a sandbox that holds only its own call's work is shut down.
    h.expect_commands(&[shutdown(x)]); // no Persist after a failed Stop
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::ShuttingDown));
    assert_eq!(
        h.resolve("s"),
        Err(Error::NoActiveSandbox {
            session: session("s")
        })
    );
    h.flush("s", &log(), "v1");
    h.expect_events(&[dropped("s", &log(), 1, DropReason::NoSandbox)]);
    h.acquire("b", "s");
    let y = h.started();
    assert_ne!(x, y);
    h.shutdown_failed(x); // the backend may still hold it: said so, never ordered again
    h.expect_events(&[unconfirmed(x)]);
    assert_eq!(h.core.sandbox_state(x), None);
    h.start_ok(y);
    h.expect_events(&[ready("b", y)]);
    assert_eq!(h.resolve("s"), Ok(y));
    h.expect_commands(&[]);
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

/// R9 background write after release: a memory flush started at the end of a call runs after
/// the release. Its writer holds the session while the call is live; the release waits (drain)
/// for the hold, the write lands in the session's sandbox, then Stop follows.
#[test]
fn r09_background_write_after_release() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap(); // the memory writer promises a write
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]); // no Stop yet: a write is promised
    h.expect_events(&[]);
    h.wait(secs(1));
    assert_eq!(h.resolve("s").ok(), None); // no live call ...
    let v = h.flush("s", &path("memory"), "remembered"); // ... but the write has a sandbox
    let u = h.expect_upload("s", &path("memory"), v, x);
    h.unhold("s").unwrap();
    h.quiet();
    h.upload_ok(u);
    h.expect_events(&[
        uploaded("s", &path("memory"), 1, x),
        released("a"),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[stop(x)]);
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

/// R11 churn: the next call of a session must not wait for a pod that was deleted after the
/// previous call, nor lose its workspace. Kept warm, it reuses the sandbox; shut down, it waits
/// for the previous sandbox's persist and resumes from its snapshot.
#[test]
fn r11_churn() {
    let mut h = Script::with(|c| c.release = ReleasePolicy::KeepWarm { idle: secs(10) });
    let x = h.ready_call("a1", "s");
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_commands(&[]); // not deleted
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Idle));
    h.wait(secs(9));
    h.acquire("a2", "s");
    h.expect_events(&[ready("a2", x)]); // at once, same sandbox, no Start
    h.expect_commands(&[]);

    let mut h = Script::default_config();
    let x0 = h.ready_call("a1", "s");
    h.release("a1");
    h.expect_events(&[released("a1")]);
    h.expect_commands(&[drain(x0, &["s"]), stop(x0)]);
    h.acquire("a2", "s"); // the previous sandbox is still stopping
    h.quiet();
    assert_eq!(h.core.call_status(&call("a2")), Some(CallStatus::Waiting));
    h.stop_ok(x0, Some("workspace-1"));
    h.expect_commands(&[persist(x0, Some("workspace-1"))]);
    h.persist_ok(x0);
    let cmds = h.take_commands();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert_eq!(plain(&cmds[0]), shutdown(x0));
    let Command::Start {
        sandbox: x1,
        resume_from,
        resumes,
        ..
    } = &cmds[1]
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(resume_from.as_ref(), Some(&snap("workspace-1")));
    assert_eq!(
        *resumes,
        Some(x0),
        "the Start names the sandbox that persisted it"
    );
    h.start_ok(*x1);
    h.expect_events(&[ready("a2", *x1)]);
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

/// R13 head-of-line: a hung upload for one session never stalls another session's mirror, its
/// release or its drain.
#[test]
fn r13_head_of_line() {
    let mut h = Script::with(|c| c.upload_timeout = secs(180));
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "big");
    let ua = h.expect_upload("sa", &log(), 1, xa); // a 3-minute upload
    h.flush("sb", &log(), "small");
    let ub = h.expect_upload("sb", &log(), 1, xb); // out at once, not behind A's
    h.upload_ok(ub);
    h.expect_events(&[uploaded("sb", &log(), 1, xb), mirror_settled("sb")]);
    h.flush("sb", &log(), "last");
    let ub = h.expect_upload("sb", &log(), 2, xb);
    h.release("b");
    h.expect_commands(&[drain(xb, &["sb"])]);
    h.upload_ok(ub);
    h.expect_events(&[
        uploaded("sb", &log(), 2, xb),
        released("b"),
        mirror_settled("sb"),
    ]);
    h.expect_commands(&[stop(xb)]); // B's drain is done while A's upload still hangs
    assert!(h.uploads.contains_key(&ua));
    assert!(!h.core.is_mirror_settled(&session("sa")));
    assert!(h.core.is_mirror_settled(&session("sb")));
    assert_eq!(h.now, Instant::ZERO);
}
