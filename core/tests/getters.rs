//! The counting getters (`live_calls`, `tracked_sandboxes`, `session_records`, `tracked_keys`),
//! `config`, `stats` and `is_quiescent` give exact values at every step of a call's life.
//! Drivers and the simulator build on them (quiescence ends a simulation's liveness phase), so a
//! getter that lied would hide leaks.
//!
//! `stats()` counts exactly: each counter moves by one for each thing it counts, on the input
//! that does it. Reports and the perf figures read these counters.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

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

/// Drains commands until the one `want` picks out, which it returns.
fn next_matching<T>(core: &mut Lifecycle, want: impl Fn(&Command) -> Option<T>) -> T {
    while let Some(cmd) = core.poll_command() {
        if let Some(x) = want(&cmd) {
            return x;
        }
    }
    panic!("the command never came")
}

fn stop_of(cmd: &Command) -> Option<SandboxId> {
    matches!(cmd, Command::Stop { .. }).then(|| cmd.sandbox())
}

fn persist_of(cmd: &Command) -> Option<SandboxId> {
    matches!(cmd, Command::Persist { .. }).then(|| cmd.sandbox())
}

fn shutdown_of(cmd: &Command) -> Option<SandboxId> {
    matches!(cmd, Command::Shutdown { .. }).then(|| cmd.sandbox())
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

#[test]
fn failures_are_counted_once_each() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();

    // A start that fails: its call fails, the sandbox is shut down to clean up.
    let (_, x0) = start_call(&mut core, "a", "s1");
    core.handle_start_failed(t, x0).unwrap();
    assert_eq!(core.stats().starts_failed, 1);
    assert_eq!(core.stats().calls_failed, 1);
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();

    // A stop that fails: ordered again; a second one ok, a third one never needed.
    let (b, x1) = start_call(&mut core, "b", "s2");
    core.handle_start_ok(t, x1).unwrap();
    core.release(t, &b).unwrap();
    let stopping = next_matching(&mut core, stop_of);
    core.handle_stop_failed(t, stopping).unwrap();
    assert_eq!(core.stats().stops_failed, 1);
    let again = next_matching(&mut core, stop_of);
    assert_eq!(again, stopping);
    core.handle_stop_ok(t, again, None).unwrap();
    assert_eq!(core.stats().stops_failed, 1);
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();

    // A persist that fails: ordered again, and ok.
    let (c, x2) = start_call(&mut core, "c", "s3");
    core.handle_start_ok(t, x2).unwrap();
    core.release(t, &c).unwrap();
    let stopping = next_matching(&mut core, stop_of);
    core.handle_stop_ok(t, stopping, Some(Snapshot::new("snap-1")))
        .unwrap();
    let persisting = next_matching(&mut core, persist_of);
    core.handle_persist_failed(t, persisting).unwrap();
    assert_eq!(core.stats().persists_failed, 1);
    let again = next_matching(&mut core, persist_of);
    core.handle_persist_ok(t, again).unwrap();
    assert_eq!(core.stats().persists_failed, 1);
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();

    // And a second of each: counters add, they do not saturate at one.
    let (_, x3) = start_call(&mut core, "d", "s4");
    core.handle_start_failed(t, x3).unwrap();
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();
    let (e, x4) = start_call(&mut core, "e", "s5");
    core.handle_start_ok(t, x4).unwrap();
    core.release(t, &e).unwrap();
    let stopping = next_matching(&mut core, stop_of);
    core.handle_stop_ok(t, stopping, Some(Snapshot::new("snap-2")))
        .unwrap();
    let persisting = next_matching(&mut core, persist_of);
    core.handle_persist_failed(t, persisting).unwrap();
    let again = next_matching(&mut core, persist_of);
    core.handle_persist_ok(t, again).unwrap();
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();
    let (f, x5) = start_call(&mut core, "f", "s6");
    core.handle_start_ok(t, x5).unwrap();
    core.release(t, &f).unwrap();
    let stopping = next_matching(&mut core, stop_of);
    core.handle_stop_failed(t, stopping).unwrap();
    let again = next_matching(&mut core, stop_of);
    core.handle_stop_ok(t, again, None).unwrap();
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();

    let stats = core.stats();
    assert_eq!(stats.calls_acquired, 6);
    assert_eq!(stats.starts_ordered, 6);
    assert_eq!(stats.starts_ok, 4);
    assert_eq!(stats.starts_failed, 2);
    assert_eq!(stats.calls_failed, 2);
    assert_eq!(stats.calls_ready, 4);
    assert_eq!(stats.calls_released, 4);
    assert_eq!(stats.stops_failed, 2);
    assert_eq!(stats.persists_failed, 2);
    assert_eq!(stats.shutdowns_ordered, 6);
    assert_eq!(stats.shutdowns_ok, 6);
    while core.poll_event().is_some() {}
    assert!(core.is_quiescent());
}

#[test]
fn deaths_and_stale_answers_are_counted_once_each() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, x0) = start_call(&mut core, "a", "s1");
    core.handle_start_ok(t, x0).unwrap();
    core.handle_died(t, x0).unwrap();
    assert_eq!(core.stats().deaths, 1);
    // A second report of the same death changes nothing.
    core.handle_died(t, x0).unwrap();
    assert_eq!(core.stats().deaths, 1);
    core.release(t, &a).unwrap();
    let down = next_matching(&mut core, shutdown_of);
    core.handle_shutdown_ok(t, down).unwrap();
    assert_eq!(core.tracked_sandboxes(), 0);
    let before = core.stats().stale_answers;
    // Reports about a sandbox the core has forgotten are stale answers, each counted.
    core.handle_died(t, x0).unwrap();
    assert_eq!(core.stats().stale_answers, before + 1);
    core.handle_died(t, x0).unwrap();
    assert_eq!(core.stats().stale_answers, before + 2);
    core.handle_start_ok(t, x0).unwrap();
    assert_eq!(core.stats().stale_answers, before + 3);
}

#[test]
fn calls_revoked_by_close_are_counted_each() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (_, x0) = start_call(&mut core, "a", "s1");
    core.handle_start_ok(t, x0).unwrap();
    let (_, x1) = start_call(&mut core, "b", "s2");
    core.handle_start_ok(t, x1).unwrap();
    core.close(t, std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(core.stats().calls_revoked, 0);
    let deadline = core.poll_timeout().expect("the close deadline");
    core.handle_timeout(deadline).unwrap();
    assert_eq!(core.stats().calls_revoked, 2);
}

#[test]
fn uploads_and_unconfirmed_shutdowns_are_counted_each() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (_, x0) = start_call(&mut core, "a", "s1");
    core.handle_start_ok(t, x0).unwrap();
    let s = SessionId::new("s1").unwrap();
    for _ in 0..2 {
        core.flush(t, &s, &PathName::session_log(), Payload::default())
            .unwrap();
        let Some(Command::Upload { upload, .. }) = core.poll_command() else {
            panic!("no upload")
        };
        core.handle_upload_ok(t, upload).unwrap();
    }
    assert_eq!(core.stats().versions_uploaded, 2);

    // Two sandboxes whose Shutdown fails: each is reported unconfirmed.
    let (_, x1) = start_call(&mut core, "b", "s2");
    core.handle_start_ok(t, x1).unwrap();
    core.close(t, std::time::Duration::from_secs(1)).unwrap();
    let deadline = core.poll_timeout().expect("the close deadline");
    core.handle_timeout(deadline).unwrap();
    for _ in 0..2 {
        let stopping = next_matching(&mut core, stop_of);
        core.handle_stop_ok(deadline, stopping, None).unwrap();
    }
    for _ in 0..2 {
        let down = next_matching(&mut core, shutdown_of);
        core.handle_shutdown_failed(deadline, down).unwrap();
    }
    assert_eq!(core.stats().shutdowns_unconfirmed, 2);
}

#[test]
fn dropped_versions_are_counted_each() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let s = SessionId::new("nowhere").unwrap();
    // No call, no sandbox: each version is dropped at once (no-sandbox).
    for _ in 0..3 {
        core.flush(t, &s, &PathName::session_log(), Payload::default())
            .unwrap();
    }
    assert_eq!(core.stats().versions_dropped, 3);
    assert_eq!(core.stats().versions_flushed, 3);
}
