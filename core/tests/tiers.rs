//! Release tiers: warm for `idle`, then down the way the policy names (Suspend or Shutdown),
//! then the key's snapshot kept for `retain` and discarded. A call while warm binds at once; a
//! call while suspending waits and resumes; a call during the retention resumes and takes the
//! snapshot (no discard follows); after the retention it starts fresh.

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

    // Past the old retention: nothing is discarded (the new sandbox owns the workspace).
    h.advance(secs(50));
    h.quiet();
    assert_eq!(h.core.stats().discards, 0);
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
    assert_eq!(h.core.stats().discards, 0);
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
