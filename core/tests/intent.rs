//! Commands that carry their intent: what a driver used to infer from the release policy or
//! from the order of commands, the core now says. Deadlines in every command that wants an
//! answer (checked for every drained command by the support's `Script`), `suspend` on Stop and
//! Persist, `resumes` on a Start, `Abandon` before a Shutdown that cuts an outstanding command,
//! and the loss of a running instance: the suspension's own doing while suspending, and a
//! suspension of the sandbox in place (its workspace kept) while it is up.

mod support;
use sandkeeper::*;
use support::*;

fn suspending() -> Script {
    Script::with(|c| c.release = ReleasePolicy::Suspend)
}

/// Suspends the session `s`'s sandbox (call `c`) with snapshot `snapshot`; returns it.
fn suspend(h: &mut Script, c: &str, snapshot: &str) -> SandboxId {
    let x = h.ready_call(c, "s");
    h.release(c);
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, Some(snapshot));
    h.expect_commands(&[persist_to_suspend(x, Some(snapshot))]);
    h.persist_ok(x);
    h.take_events();
    h.quiet();
    assert_eq!(
        h.core.sandbox_state(x),
        None,
        "a suspended sandbox is forgotten"
    );
    x
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

#[test]
fn a_resumed_start_names_the_sandbox_it_continues() {
    let mut h = suspending();
    let x0 = suspend(&mut h, "a", "claim-1");
    h.acquire("b", "s");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("claim-1")));
    assert_eq!(start.resumes, Some(x0));
    h.start_ok(start.sandbox);
    h.take_events();
    // Suspended again: the next incarnation continues the latest one, not the first.
    h.release("b");
    h.take_commands();
    h.stop_ok(start.sandbox, Some("claim-1"));
    h.take_commands();
    h.persist_ok(start.sandbox);
    h.take_events();
    h.acquire("c", "s");
    let again = h.take_start();
    assert_eq!(again.resumes, Some(start.sandbox));
    // A fresh key resumes nothing.
    h.acquire("d", "t");
    let fresh = h.take_start();
    assert_eq!((fresh.resume_from, fresh.resumes), (None, None));
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

/// Found by the simulator's time bounds (seed 55445 of 100,000): a version whose retry came due
/// while its session had no sandbox up (its sandbox died, the next one still starting) was later
/// ordered into the new sandbox with its deadline already past. Its window is its first
/// attempt's upload timeout: once that has closed it is dropped, never ordered.
#[test]
fn a_version_whose_window_closed_while_it_waited_is_dropped_not_ordered() {
    let mut h = Script::with(|c| {
        c.start_timeout = secs(10);
        c.wait_timeout = secs(10);
        c.same_key = SameKey::Serialize;
    });
    let x0 = h.ready_call("a", "s");
    h.acquire("b", "s"); // queued behind a: a sandbox of the session is coming
    h.flush("s", &log(), "v1");
    let u1 = h.expect_upload("s", &log(), 1, x0);
    h.upload_failed(u1, UploadFailure::Transient); // retried after the backoff
    h.died(x0);
    h.release("a");
    let x1 = h
        .take_commands()
        .iter()
        .find_map(|c| matches!(c, Command::Start { .. }).then(|| c.sandbox()))
        .expect("b's sandbox starts; v1 waits for it");
    h.take_events();
    h.advance(secs(3)); // the retry came due with nowhere to go; the window (2 s) closed
    h.quiet();
    h.start_ok(x1);
    assert!(
        h.take_commands()
            .iter()
            .all(|c| !matches!(c, Command::Upload { .. })),
        "no upload with a past deadline"
    );
    let events = h.take_events();
    assert!(
        events.contains(&dropped("s", &log(), 1, DropReason::UploadTimeout)),
        "{events:?}"
    );
    h.assert_all_settled();
}
