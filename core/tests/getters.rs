//! The counting getters (`live_calls`, `tracked_sandboxes`, `session_records`, `tracked_keys`),
//! `config`, `stats` and `is_quiescent` give exact values at every step of a call's life.
//! Drivers and the simulator build on them (quiescence ends a simulation's liveness phase), so a
//! getter that lied would hide leaks.

use std::time::Duration;

use sandkeeper::*;

fn ids(call: &str, session: &str) -> (CallId, SessionId) {
    (CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

/// (live calls, tracked sandboxes, session records, tracked keys)
fn counts(core: &Lifecycle) -> (usize, usize, usize, usize) {
    (
        core.live_calls(),
        core.tracked_sandboxes(),
        core.session_records(),
        core.tracked_keys(),
    )
}

fn drain_commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

#[test]
fn config_is_the_one_given() {
    let config = Config {
        scope: Scope::User,
        same_key: SameKey::Serialize,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(7),
        },
        max_waiters: 3,
        ..Config::default()
    };
    let core = Lifecycle::new(config.clone()).unwrap();
    assert_eq!(core.config(), &config);
    assert_ne!(core.config(), &Config::default());
}

#[test]
fn counts_and_quiescence_through_two_calls() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    assert!(core.is_quiescent());
    assert_eq!(counts(&core), (0, 0, 0, 0));

    let (a, s) = ids("a", "s");
    let (b, u) = ids("b", "u");
    core.acquire(t, CallSpec::new(a.clone(), s.clone()))
        .unwrap();
    assert_eq!(counts(&core), (1, 1, 1, 1));
    core.acquire(t, CallSpec::new(b.clone(), u.clone()))
        .unwrap();
    assert_eq!(counts(&core), (2, 2, 2, 2));
    assert!(!core.is_quiescent());

    for cmd in drain_commands(&mut core) {
        let Command::Start { sandbox, .. } = cmd else {
            panic!("only starts: {cmd:?}")
        };
        core.handle_start_ok(t, sandbox).unwrap();
    }
    assert_eq!(core.stats().starts_ok, 2);
    assert_eq!(counts(&core), (2, 2, 2, 2));

    core.release(t, &a).unwrap();
    // a's sandbox is on its way down; the call is gone, its session record stays.
    assert_eq!(core.live_calls(), 1);
    assert_eq!(core.tracked_sandboxes(), 2);
    assert_eq!(core.session_records(), 2);
    for cmd in drain_commands(&mut core) {
        match cmd {
            Command::Stop { sandbox, .. } => core.handle_stop_ok(t, sandbox, None).unwrap(),
            Command::Drain { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for cmd in drain_commands(&mut core) {
        match cmd {
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(counts(&core), (1, 1, 2, 1));

    core.release(t, &b).unwrap();
    while let Some(cmd) = core.poll_command() {
        match cmd {
            Command::Stop { sandbox, .. } => core.handle_stop_ok(t, sandbox, None).unwrap(),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            Command::Drain { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(counts(&core), (0, 0, 2, 0));
    // Everything is down, but the events are not drained yet: not quiescent.
    assert!(!core.is_quiescent());
    while core.poll_event().is_some() {}
    assert!(core.is_quiescent());
}

#[test]
fn a_warm_sandbox_alone_is_not_quiescent() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(60),
        },
        ..Config::default()
    })
    .unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a.clone(), s)).unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.release(t, &a).unwrap();
    while core.poll_command().is_some() {}
    while core.poll_event().is_some() {}
    // No call, no command, no event: only the warm sandbox and its idle timer.
    assert_eq!(core.live_calls(), 0);
    assert_eq!(core.tracked_sandboxes(), 1);
    assert_eq!(core.sandbox_state(sandbox), Some(SandboxState::Idle));
    assert!(!core.is_quiescent());
}

#[test]
fn an_upload_in_flight_alone_is_not_quiescent() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a, s.clone())).unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.flush(t, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    assert!(matches!(core.poll_command(), Some(Command::Upload { .. })));
    while core.poll_event().is_some() {}
    assert!(!core.is_quiescent());
}
