//! Bookkeeping that only shows over time: keys are forgotten when nothing needs them, and the
//! memory of ended calls is exactly as long as configured.

use std::time::Duration;

use sandkeeper::*;

fn ids(call: &str, session: &str) -> (CallId, SessionId) {
    (CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

/// Runs one call through its whole life, answering every command.
fn call_cycle(core: &mut Lifecycle, call: &CallId, session: &SessionId, t: Instant) {
    core.acquire(t, CallSpec::new(call.clone(), session.clone()))
        .unwrap();
    answer_all(core, t);
    core.release(t, call).unwrap();
    answer_all(core, t);
}

fn answer_all(core: &mut Lifecycle, t: Instant) {
    while let Some(cmd) = core.poll_command() {
        match cmd {
            Command::Start { sandbox, .. } => core.handle_start_ok(t, sandbox).unwrap(),
            Command::Upload { upload, .. } => core.handle_upload_ok(t, upload).unwrap(),
            Command::Stop { sandbox, .. } => core.handle_stop_ok(t, sandbox, None).unwrap(),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Hook { .. }
            | Command::Abandon { .. } => {}
            Command::Adopt { .. } | Command::Relinquish { .. } => panic!("no fleet here: {cmd:?}"),
        }
    }
    while core.poll_event().is_some() {}
}

#[test]
fn keys_are_forgotten_when_nothing_needs_them() {
    let mut core = Lifecycle::new(Config {
        scope: Scope::Call,
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    for i in 0..50 {
        let (c, s) = ids(&format!("c{i}"), "s");
        call_cycle(&mut core, &c, &s, t);
    }
    assert_eq!(core.tracked_keys(), 0, "per-call keys must not pile up");
    assert_eq!(core.tracked_sandboxes(), 0);
    assert!(core.is_quiescent());

    // A session key that persisted a snapshot is kept: its next Start resumes from it.
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (c, s) = ids("c", "s");
    core.acquire(t, CallSpec::new(c.clone(), s.clone()))
        .unwrap();
    answer_all(&mut core, t);
    core.release(t, &c).unwrap();
    while let Some(cmd) = core.poll_command() {
        match cmd {
            Command::Stop { sandbox, .. } => core
                .handle_stop_ok(t, sandbox, Some(Snapshot::new("snap")))
                .unwrap(),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            _ => {}
        }
    }
    assert_eq!(core.tracked_keys(), 1);
}

#[test]
fn ended_calls_are_remembered_exactly_as_long_as_configured() {
    let capacity = 3;
    let mut core = Lifecycle::new(Config {
        scope: Scope::Call,
        limits: Limits {
            remembered_ended_calls: capacity,
            ..Limits::default()
        },
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    let (a, s) = ids("a", "s");
    call_cycle(&mut core, &a, &s, t);
    for i in 0..capacity - 1 {
        let (c, _) = ids(&format!("c{i}"), "s");
        call_cycle(&mut core, &c, &s, t);
    }
    // `a` is the oldest of exactly `capacity` ended calls: still remembered.
    assert!(matches!(
        core.release(t, &a),
        Err(Error::AlreadyReleased { .. })
    ));
    // One more ended call pushes it out.
    let (d, _) = ids("d", "s");
    call_cycle(&mut core, &d, &s, t);
    assert!(matches!(
        core.release(t, &a),
        Err(Error::UnknownCall { .. })
    ));

    // A name used again is remembered from its latest end, even when its older entry falls
    // out of the memory afterwards.
    let (e, _) = ids("e", "s");
    call_cycle(&mut core, &e, &s, t);
    call_cycle(&mut core, &e, &s, t);
    for i in 0..capacity - 2 {
        let (c, _) = ids(&format!("f{i}"), "s");
        call_cycle(&mut core, &c, &s, t);
    }
    // Ended, newest first: f.., e (second), e (first, now the oldest entry).
    let (g, _) = ids("g", "s");
    call_cycle(&mut core, &g, &s, t);
    assert!(
        matches!(core.release(t, &e), Err(Error::AlreadyReleased { .. })),
        "the first entry of `e` fell out, its second one must still answer"
    );
    // The memory is bounded: many more ended calls keep at most twice the capacity of names.
    for i in 0..50 {
        let (c, _) = ids(&format!("h{i}"), "s");
        call_cycle(&mut core, &c, &s, t);
    }
    let kept = serde_json::to_value(&core).unwrap()["calls"]["ended"]["index"]
        .as_object()
        .unwrap()
        .len();
    assert!(kept < 2 * capacity, "{kept} ended names kept");
    let _ = Duration::ZERO;
}

/// Close moves on before its deadline only when nothing is left to drain: a hold that keeps a
/// draining sandbox busy, or a start still unanswered, keeps it in its first phase.
#[test]
fn close_waits_for_holds_and_starts_until_its_deadline() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (c, s) = ids("c", "s");
    core.acquire(t, CallSpec::new(c.clone(), s.clone()))
        .unwrap();
    answer_all(&mut core, t);
    core.hold(t, &s).unwrap();
    core.release(t, &c).unwrap();
    core.close(t, Duration::from_secs(10)).unwrap();
    let commands: Vec<Command> = std::iter::from_fn(|| core.poll_command()).collect();
    assert!(
        commands.iter().all(|c| matches!(c, Command::Drain { .. })),
        "the hold keeps the sandbox draining: {commands:?}"
    );
    // The writer submits its last write and lets go: it is uploaded, then the sandbox goes down.
    let v = core
        .flush(
            Instant::from_millis(10),
            &s,
            &PathName::session_log(),
            Payload::default(),
        )
        .unwrap();
    core.unhold(Instant::from_millis(10), &s).unwrap();
    let mut uploaded = false;
    while let Some(cmd) = core.poll_command() {
        if let Command::Upload {
            upload, version, ..
        } = cmd
        {
            assert_eq!(version, v);
            core.handle_upload_ok(Instant::from_millis(20), upload)
                .unwrap();
            uploaded = true;
        }
    }
    assert!(uploaded);
    let events: Vec<Event> = std::iter::from_fn(|| core.poll_event()).collect();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            Event::Settled {
                outcome: Settlement::Dropped { .. },
                ..
            }
        )),
        "{events:?}"
    );

    // A start still unanswered at close keeps close in its first phase as well.
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (c, s) = ids("c", "s");
    core.acquire(t, CallSpec::new(c.clone(), s)).unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.release(t, &c).unwrap();
    core.close(t, Duration::from_secs(10)).unwrap();
    assert_eq!(
        core.poll_command(),
        None,
        "no Shutdown before the start answers or the deadline"
    );
    core.handle_start_ok(Instant::from_millis(5), sandbox)
        .unwrap();
    assert_eq!(
        core.poll_command(),
        Some(Command::Shutdown {
            sandbox,
            deadline: Instant::from_millis(5) + core.config().command_timeout,
            token: None,
        })
    );
}
