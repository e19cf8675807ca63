//! Release tiers and hooks.
//!
//! Release tiers: warm for `idle`, then down the way the policy names (Suspend or Shutdown),
//! then the key's snapshot kept for `retain` and discarded. A call while warm binds at once; a
//! call while suspending waits and resumes; a call during the retention resumes and takes the
//! snapshot (no discard follows); after the retention it starts fresh. `KeepWarm` reuses a warm
//! sandbox and idles it out.
//!
//! Lifecycle hooks: ordered by the core at their places, each bounded by its timeout. After a
//! start or resume, before any call is ready (a failure or timeout fails the calls with
//! `hook-failed` and the sandbox goes down unused); before a suspend or stop, after the drain
//! and before the Stop (a failure or timeout is reported and the way down goes on, a suspend
//! turned into a shutdown if so configured). A hook never outlives its sandbox's death.

mod support;

use sandkeeper::*;
use support::*;

fn tiers(idle: u64, then: WayDown, retain: Option<u64>) -> Script {
    Script::with(|c| {
        c.release = ReleasePolicy::Tiered(Tiers {
            idle: secs(idle),
            then,
            retain: retain.map(secs),
        })
    })
}

/// Takes the commands of a suspension after the warm tier: Drain, Stop, Persist; returns the
/// Persist's `retain_until`.
#[track_caller]
fn suspend(h: &mut Script, x: SandboxId, session: &str, snapshot: &str) -> Option<Instant> {
    h.expect_commands(&[drain(x, &[session]), stop_to_suspend(x)]);
    h.stop_ok(x, Some(snapshot));
    let retain_until = match h.take_commands().as_slice() {
        [Command::Persist {
            sandbox,
            snapshot: Some(s),
            suspend: true,
            retain_until,
            deadline,
            token: _,
        }] => {
            assert_eq!((*sandbox, s.as_str()), (x, snapshot));
            // The backend's own expiry is never earlier than the core's.
            if let Some(until) = retain_until {
                assert!(*until >= *deadline);
            }
            *retain_until
        }
        other => panic!("expected one suspending Persist, got {other:?}"),
    };
    h.persist_ok(x);
    retain_until
}

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

/// The whole ladder: warm (a call binds at once), then suspended after `idle`, then discarded
/// after `retain`; the key is forgotten and the next call starts fresh.
#[test]
fn warm_then_suspended_then_discarded() {
    let mut h = tiers(60, WayDown::Suspend, Some(3_600));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.expect_events(&[released("a")]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Idle));
    h.quiet();

    // Back within the idle time: the warm sandbox, no Start.
    h.advance(secs(59));
    h.quiet();
    h.acquire("b", "s");
    h.expect_events(&[ready("b", x)]);
    h.release("b");
    h.expect_events(&[released("b")]);

    // Idle for the whole tier: suspended.
    h.advance(secs(60));
    let until = suspend(&mut h, x, "s", "snap-x");
    assert_eq!(h.core.stats().suspended, 1);
    assert!(until.is_some(), "a retention reaches the backend");
    assert_eq!(h.core.tracked_keys(), 1, "the key keeps its snapshot");

    // The retention passes: the core orders the snapshot discarded and forgets the key.
    assert_eq!(h.next_deadline_in(), Some(secs(3_600)));
    h.advance(secs(3_600));
    h.expect_commands(&[Command::Discard {
        sandbox: x,
        key: Key::Session(session("s")),
        snapshot: snap("snap-x"),
        reason: DiscardReason::Retention,
        token: None,
    }]);
    assert_eq!(h.core.stats().discards, 1);
    assert_eq!(h.core.tracked_keys(), 0);
    assert!(h.core.is_quiescent());

    // After the retention: a fresh start.
    h.acquire("c", "s");
    let start = h.take_start();
    assert_eq!((start.resume_from, start.resumes), (None, None));
}

/// A call during the retention resumes the snapshot and takes it: its retention ends there, and
/// no Discard ever names it.
#[test]
fn a_call_during_the_retention_resumes_and_takes_the_snapshot() {
    let mut h = tiers(10, WayDown::Suspend, Some(100));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.advance(secs(10));
    suspend(&mut h, x, "s", "snap-x");

    h.advance(secs(99));
    h.quiet();
    h.acquire("b", "s");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("snap-x")));
    assert_eq!(start.resumes, Some(x));
    assert_eq!(h.core.stats().resumes_ordered, 1);
    h.start_ok(start.sandbox);
    h.expect_events(&[ready("b", start.sandbox)]);
    // Up: what the start left of the snapshot goes (a copy on a shelf; nothing on a backend
    // whose start moved or reused it), once.
    h.expect_commands(&[taken(x, "s", "snap-x")]);

    // Past the old retention: nothing more is discarded (the new sandbox owns the workspace).
    h.advance(secs(50));
    h.quiet();
    assert_eq!(h.core.stats().discards, 1);
}

/// A call that comes while the key's sandbox is being suspended waits for the suspension to
/// end, then resumes from it.
#[test]
fn a_call_while_suspending_waits_and_resumes() {
    let mut h = tiers(10, WayDown::Suspend, Some(100));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.advance(secs(10));
    h.expect_commands(&[drain(x, &["s"]), stop_to_suspend(x)]);
    h.acquire("b", "s");
    h.quiet(); // waits: no Start while the key's sandbox stops
    h.stop_ok(x, Some("snap-x"));
    assert!(matches!(
        h.take_commands().as_slice(),
        [Command::Persist { suspend: true, .. }]
    ));
    h.persist_ok(x);
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("snap-x")));
    h.start_ok(start.sandbox);
    h.expect_events(&[ready("b", start.sandbox)]);
    h.expect_commands(&[taken(x, "s", "snap-x")]);
    assert_eq!(h.core.stats().discards, 1);
}

/// The Shutdown way keeps the snapshot its Stop took for the retention, then discards it,
/// naming the sandbox that was shut down (the one command that may).
#[test]
fn the_shutdown_way_keeps_the_snapshot_for_the_retention() {
    let mut h = tiers(0, WayDown::Shutdown, Some(30));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.stop_ok(x, Some("snap-x"));
    match h.take_commands().as_slice() {
        [Command::Persist {
            suspend: false,
            retain_until: Some(_),
            ..
        }] => {}
        other => panic!("expected a Persist with a retention, got {other:?}"),
    }
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);
    h.advance(secs(30));
    h.expect_commands(&[Command::Discard {
        sandbox: x,
        key: Key::Session(session("s")),
        snapshot: snap("snap-x"),
        reason: DiscardReason::Retention,
        token: None,
    }]);
    assert_eq!(h.core.tracked_keys(), 0);
}

/// Without a retention the snapshot is kept until the key's next start (today's `Suspend`), and
/// the named policies are their tiers.
#[test]
fn the_named_policies_are_tiers() {
    assert_eq!(
        ReleasePolicy::Suspend.tiers(),
        Tiers {
            idle: secs(0),
            then: WayDown::Suspend,
            retain: None
        }
    );
    assert_eq!(
        ReleasePolicy::KeepWarm { idle: secs(5) }.tiers(),
        Tiers {
            idle: secs(5),
            then: WayDown::Shutdown,
            retain: None
        }
    );
    assert!(!ReleasePolicy::Shutdown.suspends());

    let mut h = tiers(0, WayDown::Suspend, None);
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    assert_eq!(suspend(&mut h, x, "s", "snap-x"), None);
    assert_eq!(h.next_deadline_in(), None, "no retention timer");
    h.wait(secs(1_000_000));
    h.acquire("b", "s");
    assert_eq!(h.take_start().resume_from, Some(snap("snap-x")));
}

/// Close suspends warm sandboxes (the way down the policy names) and leaves retained snapshots
/// to the backend's own expiry: no Discard at close.
#[test]
fn close_suspends_the_warm_and_leaves_retention_to_the_backend() {
    let mut h = tiers(60, WayDown::Suspend, Some(100));
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.close(secs(5)).unwrap();
    let until = suspend(&mut h, x, "s", "snap-x");
    assert!(until.is_some());
    assert!(h.core.is_closed());
    assert_eq!(h.core.stats().discards, 0);
    // The close report names the snapshot left behind and the end of its retention (the
    // core's own: never later than the one the Persist gave the backend).
    let report = h
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            Event::Closed { report } => Some(report),
            _ => None,
        })
        .expect("closed");
    match report.retained.as_slice() {
        [Retained {
            key,
            snapshot,
            until: Some(end),
        }] => {
            assert_eq!(
                (key.to_string().as_str(), snapshot.as_str()),
                ("session:s", "snap-x")
            );
            assert!(*end <= until.unwrap(), "{end:?} {until:?}");
        }
        other => panic!("one retained snapshot: {other:?}"),
    }
}

/// A zero retention is refused with the field's name.
#[test]
fn a_zero_retention_is_refused() {
    let config = Config {
        release: ReleasePolicy::Tiered(Tiers {
            idle: secs(1),
            then: WayDown::Suspend,
            retain: Some(secs(0)),
        }),
        ..Config::default()
    };
    assert!(matches!(
        Lifecycle::new(config),
        Err(Error::InvalidConfig {
            field: "release.tiered.retain",
            ..
        })
    ));
}

/// A call's own key never starts again: the snapshot its Stop took is discarded at once, so a
/// scope of `Call` with snapshots keeps nothing.
#[test]
fn a_calls_own_key_keeps_no_snapshot() {
    let mut h = Script::with(|c| c.scope = Scope::Call);
    let x = h.ready_call("a", "s");
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    h.stop_ok(x, Some("snap-x"));
    h.expect_commands(&[persist(x, Some("snap-x"))]);
    h.persist_ok(x);
    h.expect_commands(&[
        Command::Discard {
            sandbox: x,
            key: Key::Call(call("a")),
            snapshot: snap("snap-x"),
            reason: DiscardReason::Unused,
            token: None,
        },
        shutdown(x),
    ]);
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

/// `release_as`: a release that asks a way down skips the warm tier and goes that way,
/// whatever the policy says: a pause under a policy that shuts down keeps the sandbox
/// suspended for the key's next start, and a kill of the resumed sandbox under a policy that
/// suspends shuts it down, its workspace let go.
#[test]
fn a_release_that_asks_a_way_goes_that_way_at_once() {
    let mut h = tiers(60, WayDown::Shutdown, None);
    let x = h.ready_call("a", "s");
    h.release_as("a", WayDown::Suspend).unwrap();
    h.expect_events(&[released("a")]);
    // No warm tier: the drain and the suspending Stop come at once.
    suspend(&mut h, x, "s", "snap-x");
    h.quiet();

    h.acquire("b", "s");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("snap-x")));
    h.start_ok(start.sandbox);
    h.expect_events(&[ready("b", start.sandbox)]);
    h.expect_commands(&[taken(x, "s", "snap-x")]);

    let y = start.sandbox;
    h.release_as("b", WayDown::Shutdown).unwrap();
    h.expect_events(&[released("b")]);
    h.expect_commands(&[drain(y, &["s"]), stop(y)]);
    h.stop_ok(y, None);
    h.expect_commands(&[shutdown(y)]);
    h.shutdown_ok(y);
    h.quiet();
    assert_eq!(h.core.stats().discards, 1);
}

/// The last release decides: a call that asked a way while another call of the key was still
/// bound asks nothing once that one releases plainly (the policy's warm tier applies), and a
/// plain release after an asked one is the policy's again.
#[test]
fn the_last_release_decides_the_way_down() {
    let mut h = Script::with(|c| {
        c.scope = Scope::Session;
        c.same_key = SameKey::Share;
        c.release = ReleasePolicy::Tiered(Tiers {
            idle: secs(10),
            then: WayDown::Suspend,
            retain: None,
        });
    });
    let x = h.ready_call("a", "s");
    h.acquire("b", "s");
    h.expect_events(&[ready("b", x)]);
    h.release_as("a", WayDown::Shutdown).unwrap();
    h.take_events();
    h.quiet(); // "b" still holds it
    h.release("b");
    h.take_events();
    h.quiet(); // warm, as the policy says: the plain release was the last
    h.advance(secs(10));
    suspend(&mut h, x, "s", "snap-x");
}

/// Asking a way of a call that is not live is refused as `release` refuses it, and changes
/// nothing.
#[test]
fn release_as_refuses_what_release_refuses() {
    let mut h = tiers(0, WayDown::Shutdown, None);
    let x = h.ready_call("a", "s");
    assert!(matches!(
        h.release_as("nobody", WayDown::Suspend),
        Err(Error::UnknownCall { .. })
    ));
    h.release("a");
    h.take_events();
    h.expect_commands(&[drain(x, &["s"]), stop(x)]);
    assert!(matches!(
        h.release_as("a", WayDown::Suspend),
        Err(Error::AlreadyReleased { .. })
    ));
    h.quiet();
}
