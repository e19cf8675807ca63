//! Lifecycle hooks: ordered by the core at their places, each bounded by its timeout. After a
//! start or resume, before any call is ready (a failure or timeout fails the calls with
//! `hook-failed` and the sandbox goes down unused); before a suspend or stop, after the drain
//! and before the Stop (a failure or timeout is reported and the way down goes on, a suspend
//! turned into a shutdown if so configured). A hook never outlives its sandbox's death.

mod support;
use sandkeeper::*;
use support::*;

fn hooks(release: ReleasePolicy, f: impl FnOnce(&mut Hooks)) -> Script {
    Script::with(|c| {
        c.release = release;
        f(&mut c.hooks);
    })
}

fn hook(x: SandboxId, point: HookPoint) -> Command {
    Command::Hook {
        sandbox: x,
        hook: point,
        deadline: Instant::ZERO,
        token: None,
    }
}

/// After start: the calls wait for the hook; once it succeeds they are ready.
#[test]
fn calls_are_ready_only_after_the_after_start_hook() {
    let mut h = hooks(ReleasePolicy::Shutdown, |k| k.after_start = Some(secs(5)));
    h.acquire("a", "s");
    let x = h.started();
    h.start_ok(x);
    h.expect_commands(&[hook(x, HookPoint::AfterStart)]);
    h.expect_events(&[]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Starting));
    assert_eq!(
        h.core.call_status(&call("a")),
        Some(CallStatus::Starting(x))
    );
    assert_eq!(h.core.stats().hooks_ordered, 1);
    h.input(Input::HookOk { sandbox: x }).unwrap();
    h.expect_events(&[ready("a", x)]);
    assert_eq!(h.core.stats().hooks_ok, 1);
    assert_eq!(h.core.stats().hooks_ordered, 1);
}

/// A failed after-start hook fails the call and takes the sandbox down unused; a late one too,
/// at its timeout (the driver drops the hook at its deadline by itself: no Abandon is needed).
#[test]
fn a_failed_or_late_after_start_hook_fails_the_start() {
    let mut h = hooks(ReleasePolicy::Shutdown, |k| k.after_start = Some(secs(5)));
    h.acquire("a", "s");
    let x = h.started();
    h.start_ok(x);
    h.take_commands();
    h.input(Input::HookFailed { sandbox: x }).unwrap();
    h.expect_events(&[
        Event::HookFailed {
            sandbox: x,
            hook: HookPoint::AfterStart,
            late: false,
        },
        failed("a", ErrorKind::HookFailed),
    ]);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);

    h.acquire("b", "s");
    let y = h.started();
    h.start_ok(y);
    h.take_commands();
    h.advance(secs(5));
    h.expect_events(&[
        Event::HookFailed {
            sandbox: y,
            hook: HookPoint::AfterStart,
            late: true,
        },
        failed("b", ErrorKind::HookFailed),
    ]);
    h.expect_commands(&[shutdown(y)]);
    assert_eq!(h.core.stats().hooks_late, 1);
    assert_eq!(h.core.stats().hooks_failed, 1);
}

/// A resume runs the after-resume hook, not the after-start one.
#[test]
fn a_resume_runs_the_after_resume_hook() {
    let mut h = hooks(ReleasePolicy::Suspend, |k| {
        k.after_start = Some(secs(5));
        k.after_resume = Some(secs(5));
    });
    h.acquire("a", "s");
    let x = h.started();
    h.start_ok(x);
    h.expect_commands(&[hook(x, HookPoint::AfterStart)]);
    h.input(Input::HookOk { sandbox: x }).unwrap();
    h.take_events();
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.stop_ok(x, Some("snap"));
    h.take_commands();
    h.persist_ok(x);
    h.acquire("b", "s");
    let y = h.started();
    h.start_ok(y);
    h.expect_commands(&[hook(y, HookPoint::AfterResume)]);
}

/// Before suspend: after the drain, before the Stop; the Stop waits for the hook.
#[test]
fn the_before_suspend_hook_runs_between_the_drain_and_the_stop() {
    let mut h = hooks(ReleasePolicy::Suspend, |k| k.before_suspend = Some(secs(5)));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), hook(x, HookPoint::BeforeSuspend)]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Stopping));
    // A call of the key now waits: the key's sandbox is on its way down.
    h.acquire("b", "s");
    h.quiet();
    h.input(Input::HookOk { sandbox: x }).unwrap();
    h.expect_commands(&[stop_to_suspend(x)]);
}

/// A failed before-suspend hook is reported and the suspension goes on; under
/// `SuspendHookFailure::Shutdown` the sandbox goes the Shutdown way instead.
#[test]
fn a_failed_before_suspend_hook_is_reported_and_the_way_down_goes_on() {
    for (policy, suspend) in [
        (SuspendHookFailure::Suspend, true),
        (SuspendHookFailure::Shutdown, false),
    ] {
        let mut h = hooks(ReleasePolicy::Suspend, |k| {
            k.before_suspend = Some(secs(5));
            k.on_suspend_failure = policy;
        });
        let x = h.ready_call("a", "s");
        h.release("a");
        h.take_events();
        h.take_commands();
        h.input(Input::HookFailed { sandbox: x }).unwrap();
        h.expect_events(&[Event::HookFailed {
            sandbox: x,
            hook: HookPoint::BeforeSuspend,
            late: false,
        }]);
        let stop = if suspend { stop_to_suspend(x) } else { stop(x) };
        h.expect_commands(&[stop]);
        h.stop_ok(x, Some("snap"));
        if suspend {
            h.expect_commands(&[persist_to_suspend(x, Some("snap"))]);
            h.persist_ok(x);
            assert_eq!(h.core.stats().suspended, 1);
        } else {
            h.expect_commands(&[persist(x, Some("snap"))]);
            h.persist_ok(x);
            h.expect_commands(&[shutdown(x)]);
        }
    }
}

/// A before-stop hook past its timeout is reported late and the Stop follows at the timeout.
#[test]
fn a_late_before_stop_hook_is_reported_and_the_stop_follows() {
    let mut h = hooks(ReleasePolicy::Shutdown, |k| k.before_stop = Some(secs(2)));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), hook(x, HookPoint::BeforeStop)]);
    h.advance(secs(1));
    h.quiet();
    h.advance(secs(1));
    h.expect_events(&[Event::HookFailed {
        sandbox: x,
        hook: HookPoint::BeforeStop,
        late: true,
    }]);
    h.expect_commands(&[stop(x)]);
    // The late answer is stale.
    h.input(Input::HookOk { sandbox: x }).unwrap();
    h.quiet();
    assert_eq!(h.core.stats().stale_answers, 1);
}

/// A sandbox that dies during its hook: the hook is abandoned and the sandbox shut down; no
/// further hook is ordered for it.
#[test]
fn a_death_during_a_hook_abandons_it() {
    let mut h = hooks(ReleasePolicy::Shutdown, |k| k.before_stop = Some(secs(5)));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.take_commands();
    h.died(x);
    h.expect_commands(&[abandon(x), shutdown(x)]);
}

/// A zero timeout is refused with the hook's name; a keeper-side check refuses hooks without
/// a runner (io-tokio).
#[test]
fn a_zero_hook_timeout_is_refused() {
    let config = Config {
        hooks: Hooks {
            before_stop: Some(secs(0)),
            ..Hooks::default()
        },
        ..Config::default()
    };
    assert!(matches!(
        Lifecycle::new(config),
        Err(Error::InvalidConfig {
            field: "hooks.before_stop",
            ..
        })
    ));
}

/// A sandbox whose every call ended while it started goes down when its start answers, with no
/// after-start hook: there is no call for the hook to prepare.
#[test]
fn a_sandbox_whose_calls_ended_while_it_started_is_not_hooked() {
    let mut h = hooks(ReleasePolicy::Shutdown, |k| k.after_start = Some(secs(5)));
    h.acquire("a", "s");
    let x = h.started();
    h.release("a");
    h.take_commands();
    h.take_events();
    h.start_ok(x);
    h.expect_commands(&[shutdown(x)]);
    assert_eq!(h.core.stats().hooks_ordered, 0);
    assert_eq!(h.core.stats().orphan_starts, 1);
}
