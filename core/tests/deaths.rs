//! Deaths and lost instances: a sandbox that dies in any state (starting, running, draining,
//! warm, shutting down), what it is left in and what its calls get; the next call of its key gets
//! a new sandbox; a failed start is shut down once to clean up; the loss of a running instance is
//! the suspension's own doing while suspending, and otherwise a suspension in place (the
//! workspace kept), never a death. Race R7 (`docs/design.md`, "The races") is here.

mod support;

use sandkeeper::*;
use support::*;

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

#[test]
fn a_failed_start_is_shut_down_once_to_clean_up() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_start_failed(Instant::ZERO, x).unwrap();
    // Not dead: the backend may hold something of it, so it is shut down, once.
    assert_eq!(core.sandbox_state(x), Some(SandboxState::ShuttingDown));
    // The start answered, so nothing is abandoned.
    let deadline = Instant::ZERO + Config::default().command_timeout;
    assert_eq!(
        commands(&mut core),
        vec![Command::Shutdown {
            sandbox: x,
            deadline,
            token: None,
        }]
    );
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: a,
        error: ErrorKind::StartFailed,
    }));
}

#[test]
fn a_death_while_starting_is_dead_and_shut_down_once() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_died(Instant::ZERO, x).unwrap();
    // Dead for the core (the backend said so), and still one Shutdown to free what is left.
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Dead));
    // The start is abandoned (its answer is no longer awaited) and the Shutdown runs at once.
    let deadline = Instant::ZERO + Config::default().command_timeout;
    assert_eq!(
        commands(&mut core),
        vec![
            Command::Abandon { sandbox: x },
            Command::Shutdown {
                sandbox: x,
                deadline,
                token: None,
            }
        ]
    );
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: a,
        error: ErrorKind::SandboxGone,
    }));
    // A second report changes nothing.
    core.handle_died(Instant::ZERO, x).unwrap();
    assert_eq!(commands(&mut core), vec![]);
}

/// A sandbox that dies while its Shutdown is outstanding keeps the Shutdown's deadline: with no
/// answer, the Shutdown is reported unconfirmed at its deadline. Pins `died`'s "a Shutdown's
/// deadline stays" guard.
#[test]
fn a_death_during_shutdown_keeps_the_shutdown_deadline() {
    let config = Config::default();
    let mut core = Lifecycle::new(config.clone()).unwrap();
    let t = Instant::ZERO;
    let x = ready_call(&mut core, "a", "s");
    core.release(t, &id("a")).unwrap();
    let mut stopped = false;
    while let Some(command) = core.poll_command() {
        if let Command::Stop { sandbox, .. } = command {
            core.handle_stop_ok(t, sandbox, None).unwrap();
            stopped = true;
        }
    }
    assert!(stopped);
    assert_eq!(core.sandbox_state(x), Some(SandboxState::ShuttingDown));
    let deadline = t + config.command_timeout;
    assert_eq!(core.poll_timeout(), Some(deadline));

    core.handle_died(t, x).unwrap();
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Dead));
    assert_eq!(core.poll_timeout(), Some(deadline));
    let _ = events(&mut core);
    core.handle_timeout(deadline).unwrap();
    assert_eq!(
        events(&mut core),
        vec![Event::ShutdownUnconfirmed { sandbox: x }]
    );
    assert_eq!(core.sandbox_state(x), None);
}

/// The race of issue #5, decided by the core: the Delete of the suspended pod reaches the
/// driver after the claim was resumed as a new sandbox. It names the old incarnation, which the
/// core no longer tracks: stale, whether reported as a death or as a lost instance.
#[test]
fn a_late_loss_of_the_old_incarnation_is_no_death_of_the_resumed_sandbox() {
    let mut h = suspending();
    let x0 = suspend(&mut h, "a", "claim-1");
    h.acquire("b", "s");
    let x1 = h.take_start().sandbox;
    h.start_ok(x1);
    h.expect_events(&[ready("b", x1)]);
    h.expect_commands(&[taken(x0, "s", "claim-1")]);
    let stale = h.core.stats().stale_answers;
    h.instance_gone(x0);
    h.died(x0);
    h.quiet();
    assert_eq!(h.core.stats().stale_answers, stale + 2, "two stale reports");
    assert_eq!(h.core.sandbox_state(x1), Some(SandboxState::Running));
    assert_eq!(h.core.call_status(&call("b")), Some(CallStatus::Ready(x1)));
    assert_eq!(h.core.stats().deaths, 0);
    assert_eq!(h.resolve("s"), Ok(x1));
    // A real loss of the resumed incarnation's instance is no death either: its call is
    // told, and at its release it is suspended again (its workspace is the key's history).
    h.instance_gone(x1);
    h.expect_events(&[lost("b", x1)]);
    h.quiet();
    assert_eq!(h.core.stats().deaths, 0);
    h.release("b");
    h.take_events();
    h.expect_commands(&[stop_to_suspend(x1)]);
}

#[test]
fn losing_the_instance_while_suspending_is_the_suspensions_doing() {
    let mut h = suspending();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.take_events();
    h.instance_gone(x); // a backend that removes the instance at Stop
    h.quiet();
    h.stop_ok(x, Some("claim"));
    h.expect_commands(&[persist_to_suspend(x, Some("claim"))]);
    h.instance_gone(x); // the pod the suspension deletes
    h.quiet();
    assert_eq!(h.core.stats().instance_losses_suspending, 2);
    assert_eq!(h.core.stats().deaths, 0);
    h.persist_ok(x);
    h.take_events();
    h.quiet();
    assert_eq!(h.core.stats().suspended, 1);

    // The whole sandbox lost while suspending is a death: Persist is abandoned, Shutdown
    // cleans up, and the key keeps no snapshot of it.
    let mut h = suspending();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_commands();
    h.stop_ok(x, Some("claim"));
    h.take_commands();
    h.died(x);
    h.expect_commands(&[abandon(x), shutdown(x)]);
    h.shutdown_ok(x);
    h.take_events();
    h.acquire("b", "s");
    assert_eq!(h.take_start().resume_from, None);
}

#[test]
fn losing_the_instance_on_the_way_or_while_starting_is_no_death() {
    // On the way down (Shutdown policy), its Stop outstanding: the Stop acts on the
    // workspace, and its answer decides.
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.take_events();
    h.instance_gone(x);
    h.quiet();
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Stopping));
    h.stop_ok(x, Some("ws"));
    h.expect_commands(&[persist(x, Some("ws"))]);
    assert_eq!(h.core.stats().deaths, 0);

    // While starting: its start failed (a fresh one is abandoned and shut down).
    let mut h = suspending();
    h.acquire("a", "s");
    let x = h.started();
    h.instance_gone(x);
    h.expect_events(&[failed("a", ErrorKind::StartFailed)]);
    h.expect_commands(&[abandon(x), shutdown(x)]);
    assert_eq!(h.core.stats().deaths, 0);
}

/// An instance lost while its sandbox runs calls (a pod evicted, drained off its node): the
/// workspace stays. The calls are told, no call binds to it again, and at the last release it
/// is suspended (no drain, no before-hook: nothing runs), whatever the policy; the key's next
/// call resumes the same workspace. A second report changes nothing.
#[test]
fn losing_the_instance_of_a_running_sandbox_keeps_its_workspace() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.instance_gone(x);
    h.expect_events(&[lost("a", x)]);
    h.quiet();
    assert_eq!(h.core.call_status(&call("a")), Some(CallStatus::Lost(x)));
    assert!(h.resolve("s").is_err(), "no work goes into a lost instance");
    h.instance_gone(x);
    h.quiet();
    // A call of the same key waits for it, as for a sandbox on its way down.
    h.acquire("b", "s");
    h.quiet();
    assert_eq!(h.core.call_status(&call("b")), Some(CallStatus::Waiting));
    h.release("a");
    h.take_events();
    h.expect_commands(&[stop_to_suspend(x)]);
    h.stop_ok(x, Some("ws"));
    h.expect_commands(&[persist_to_suspend(x, Some("ws"))]);
    h.persist_ok(x);
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("ws")));
    assert_eq!(start.resumes, Some(x));
    assert_eq!(h.core.stats().deaths, 0);
    assert_eq!(h.core.stats().instance_losses_kept, 1);
}

/// A warm sandbox's instance lost: suspended at once.
#[test]
fn losing_the_instance_of_a_warm_sandbox_suspends_it_at_once() {
    let mut h = Script::with(|c| {
        c.release = ReleasePolicy::KeepWarm {
            idle: std::time::Duration::from_secs(60),
        }
    });
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.quiet();
    h.instance_gone(x);
    h.expect_commands(&[stop_to_suspend(x)]);
    h.stop_ok(x, Some("ws"));
    h.expect_commands(&[persist_to_suspend(x, Some("ws"))]);
    h.persist_ok(x);
    h.take_events();
    h.acquire("b", "s");
    assert_eq!(h.take_start().resume_from, Some(snap("ws")));
}

#[test]
fn instance_gone_errors_change_nothing() {
    let mut h = Script::default_config();
    let before = h.snapshot_json();
    let e = h.input(Input::InstanceGone {
        sandbox: SandboxId(9),
    });
    assert_eq!(
        e,
        Err(Error::UnknownSandbox {
            sandbox: SandboxId(9)
        })
    );
    assert_eq!(h.snapshot_json(), before);
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
