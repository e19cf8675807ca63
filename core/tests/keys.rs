//! Keys and what the core remembers of them: a key keeps its snapshot and the next call resumes
//! from it, a draining sandbox is revived by its key's next call, keys are forgotten when nothing
//! needs them, idle session records are bounded (the one idle the longest is forgotten first), and
//! the memory of ended calls is exactly as long as configured. Race R11 (`docs/design.md`, "The
//! races") is here.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

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

/// A core that keeps at most `max` idle session records.
fn core_with(max: usize) -> Lifecycle {
    Lifecycle::new(Config {
        limits: Limits {
            max_idle_sessions: max,
            ..Limits::default()
        },
        ..Config::default()
    })
    .unwrap()
}

/// Flushes `s` with no sandbox anywhere: the version is dropped at once and the record is idle.
fn idle_flush(core: &mut Lifecycle, s: &SessionId) {
    core.flush(
        Instant::ZERO,
        s,
        &PathName::session_log(),
        Payload::default(),
    )
    .unwrap();
    while core.poll_event().is_some() {}
}

fn remembered(core: &Lifecycle, s: &SessionId) -> bool {
    core.last_version(s, &PathName::session_log()).is_some()
}

/// Snapshots are kept per key (the latest persisted one) and handed to the next Start of that
/// key only, which takes it: the key keeps no copy, so a sandbox that resumed and then failed
/// to persist leaves the key nothing (its next Start is fresh), as on Kubernetes, where a
/// resume takes over the suspended claim itself.
#[test]
fn snapshot_is_kept_per_key_and_resumed() {
    let mut h = Script::default_config();
    let x = h.ready_call("a1", "s1");
    h.release("a1");
    h.take_events();
    h.expect_commands(&[drain(x, &["s1"]), stop(x)]);
    h.stop_ok(x, Some("s1-snap-1"));
    h.expect_commands(&[persist(x, Some("s1-snap-1"))]);
    h.persist_ok(x);
    h.expect_commands(&[shutdown(x)]);
    h.shutdown_ok(x);

    // Another key does not get it.
    h.acquire("b", "s2");
    assert_eq!(h.take_start().resume_from, None);

    // The key's next Start does.
    h.acquire("a2", "s1");
    let start = h.take_start();
    assert_eq!(start.resume_from, Some(snap("s1-snap-1")));
    let y = start.sandbox;
    h.start_ok(y);
    h.take_events();
    // Up: what the start left of the snapshot it took goes.
    h.expect_commands(&[taken(x, "s1", "s1-snap-1")]);
    h.release("a2");
    h.take_events();
    h.expect_commands(&[drain(y, &["s1"]), stop(y)]);
    h.stop_ok(y, Some("s1-snap-2"));
    h.expect_commands(&[persist(y, Some("s1-snap-2"))]);
    // y's start took snap-1, so snap-2 is the key's only copy: a Persist that keeps failing
    // is ordered again, then salvaged (the key keeps snap-2, nothing is shut down) and the
    // application is told; the key's next call resumes it.
    for _ in 1..WAY_DOWN_ATTEMPTS {
        h.persist_failed(y);
        h.expect_commands(&[persist(y, Some("s1-snap-2"))]);
    }
    h.take_events();
    h.persist_failed(y);
    h.expect_commands(&[]);
    h.expect_events(&[Event::WayDownFailed {
        sandbox: y,
        key: Key::Session(session("s1")),
        kept: Some(snap("s1-snap-2")),
    }]);
    h.acquire("a3", "s1");
    assert_eq!(h.take_start().resume_from, Some(snap("s1-snap-2")));
}

/// A call that arrives while its key's previous sandbox is still stopping waits (no Start),
/// then starts from the snapshot that Stop produced, not an older one.
#[test]
fn a_call_arriving_while_the_previous_sandbox_stops_resumes_from_its_new_snapshot() {
    let mut h = Script::default_config();
    // An older snapshot of the key exists.
    let x0 = h.ready_call("a0", "s");
    h.release("a0");
    h.take_events();
    h.take_commands();
    h.stop_ok(x0, Some("old"));
    h.persist_ok(x0);
    h.take_commands();
    h.shutdown_ok(x0);

    h.acquire("a1", "s");
    let x1 = h.take_start();
    assert_eq!(x1.resume_from, Some(snap("old")));
    let x1 = x1.sandbox;
    h.start_ok(x1);
    h.take_events();
    assert!(matches!(
        h.take_commands().as_slice(),
        [Command::Discard {
            reason: DiscardReason::Taken,
            ..
        }]
    ));
    h.release("a1");
    h.take_events();
    h.expect_commands(&[drain(x1, &["s"]), stop(x1)]);
    h.acquire("a2", "s");
    h.quiet(); // waits: its workspace is being saved
    assert_eq!(h.core.call_status(&call("a2")), Some(CallStatus::Waiting));
    h.stop_ok(x1, Some("new"));
    h.expect_commands(&[persist(x1, Some("new"))]);
    h.persist_ok(x1);
    let cmds = h.take_commands();
    assert_eq!(plain(&cmds[0]), shutdown(x1));
    let [_, Command::Start { resume_from, .. }] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!(resume_from, &Some(snap("new")));
}

/// A draining sandbox is revived by the next call of its key instead of being replaced: no
/// Start, no Stop; the released call's release still completes only when its mirror work in
/// that sandbox has settled.
#[test]
fn a_draining_sandbox_is_revived_by_the_next_call_of_its_key() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u = h.expect_upload("s", &log(), 1, x);
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.acquire("a2", "s");
    h.expect_events(&[ready("a2", x)]);
    h.expect_commands(&[]);
    assert_eq!(h.core.sandbox_state(x), Some(SandboxState::Running));
    assert_eq!(h.next_deadline_in(), Some(secs(2))); // only the upload's: no drain deadline
    h.upload_ok(u);
    h.expect_events(&[
        uploaded("s", &log(), 1, x),
        released("a"),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);
}

/// Idle session records are bounded (`max_idle_sessions`): the oldest is forgotten, and, as
/// documented on the limit, its next flush starts again at version 1.
#[test]
fn idle_session_records_are_bounded() {
    let mut h = Script::with(|c| c.limits.max_idle_sessions = 1);
    h.flush("s1", &log(), "x");
    h.flush("s1", &log(), "x");
    assert_eq!(
        h.core.last_version(&session("s1"), &log()),
        Some(Version(2))
    );
    h.flush("s2", &log(), "x");
    assert_eq!(h.core.session_records(), 1);
    assert_eq!(h.core.stats().sessions_forgotten, 1);
    assert_eq!(h.core.last_version(&session("s1"), &log()), None);
    assert_eq!(h.flush("s1", &log(), "x"), 1);
    h.take_events();
    // A session with a live call is never forgotten.
    let x = h.ready_call("a", "s3");
    h.flush("s3", &log(), "x");
    h.expect_upload("s3", &log(), 1, x);
    for i in 0..5 {
        h.flush(&format!("idle{i}"), &log(), "x");
    }
    assert_eq!(
        h.core.last_version(&session("s3"), &log()),
        Some(Version(1))
    );
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

/// With room for one ended call, the memory never holds two names: it is cleared in one pass
/// whenever it reaches twice its capacity. Pins the batch eviction of `EndedCalls::remember`.
#[test]
fn the_memory_of_one_ended_call_never_holds_two_names() {
    let mut core = Lifecycle::new(Config {
        scope: Scope::Call,
        limits: Limits {
            remembered_ended_calls: 1,
            ..Limits::default()
        },
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    for i in 0..20 {
        let c = format!("c{i}");
        core.acquire(t, CallSpec::new(id(&c), sid("s"))).unwrap();
        core.release(t, &id(&c)).unwrap();
        while let Some(command) = core.poll_command() {
            if let Command::Start { sandbox, .. } = command {
                core.handle_start_ok(t, sandbox).unwrap();
            }
        }
        let kept = serde_json::to_value(&core).unwrap()["calls"]["ended"]["index"]
            .as_object()
            .unwrap()
            .len();
        assert!(kept < 2, "{kept} ended names kept after {c}");
        assert!(matches!(
            core.release(t, &id(&c)),
            Err(Error::AlreadyReleased { .. })
        ));
        if i > 0 {
            let before = format!("c{}", i - 1);
            assert!(matches!(
                core.release(t, &id(&before)),
                Err(Error::UnknownCall { .. })
            ));
        }
    }
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

#[test]
fn the_record_idle_the_longest_is_forgotten_first() {
    let mut core = core_with(2);
    let (a, b, c) = (session("a"), session("b"), session("c"));
    idle_flush(&mut core, &a);
    idle_flush(&mut core, &b);
    // a is active again for a moment: its idleness now starts after b's.
    idle_flush(&mut core, &a);
    assert_eq!(core.session_records(), 2);
    idle_flush(&mut core, &c);
    assert_eq!(core.session_records(), 2);
    assert_eq!(core.stats().sessions_forgotten, 1);
    assert!(!remembered(&core, &b), "b was idle the longest");
    assert!(remembered(&core, &a));
    assert!(remembered(&core, &c));
    // a's numbering went on (version 2); a forgotten record starts again at 1.
    assert_eq!(
        core.last_version(&a, &PathName::session_log()),
        Some(Version(2))
    );
    idle_flush(&mut core, &b);
    assert_eq!(
        core.last_version(&b, &PathName::session_log()),
        Some(Version(1))
    );
}

#[test]
fn many_stale_queue_entries_never_forget_the_wrong_record() {
    let mut core = core_with(3);
    let (a, b) = (session("a"), session("b"));
    idle_flush(&mut core, &a);
    // b goes idle, active, idle ... 500 times: 500 queue entries, one of them current. The queue
    // is compacted on the way (it may hold at most twice the records plus 64).
    for _ in 0..500 {
        idle_flush(&mut core, &b);
    }
    assert_eq!(core.session_records(), 2);
    assert_eq!(core.stats().sessions_forgotten, 0);
    // The idle queue was compacted: at most twice the idle records plus 64 entries.
    let queue = serde_json::to_value(&core).unwrap()["sessions"]["idle"]["queue"]
        .as_array()
        .unwrap()
        .len();
    assert!(queue <= 2 * 2 + 64, "{queue} entries in the idle queue");
    // Two more records: the limit is passed by one, and the oldest idle record is a.
    idle_flush(&mut core, &session("c"));
    idle_flush(&mut core, &session("d"));
    assert_eq!(core.session_records(), 3);
    assert_eq!(core.stats().sessions_forgotten, 1);
    assert!(!remembered(&core, &a));
    assert!(remembered(&core, &b));
    // Then b, idle since before c and d.
    idle_flush(&mut core, &session("e"));
    assert_eq!(core.stats().sessions_forgotten, 2);
    assert!(!remembered(&core, &b));
    assert_eq!(core.session_records(), 3);
}

#[test]
fn a_record_with_a_live_call_is_never_forgotten() {
    let mut core = core_with(1);
    let t = Instant::ZERO;
    let (a, b, c) = (session("a"), session("b"), session("c"));
    idle_flush(&mut core, &a);
    // a gets a live call: no longer idle, whatever its place in the queue.
    core.acquire(t, CallSpec::new(CallId::new("call").unwrap(), a.clone()))
        .unwrap();
    idle_flush(&mut core, &b);
    idle_flush(&mut core, &c);
    assert!(remembered(&core, &a), "a is active");
    assert!(!remembered(&core, &b));
    assert!(remembered(&core, &c));
    assert_eq!(core.stats().sessions_forgotten, 1);
}

#[test]
fn an_idle_record_keeps_no_boxed_work() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let s = session("s");
    let call = CallId::new("call").unwrap();
    core.acquire(t, CallSpec::new(call.clone(), s.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.flush(t, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    core.handle_upload_ok(t, upload).unwrap();
    core.release(t, &call).unwrap();
    while let Some(cmd) = core.poll_command() {
        match cmd {
            Command::Stop { sandbox, .. } => core.handle_stop_ok(t, sandbox, None).unwrap(),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
            _ => {}
        }
    }
    let state = serde_json::to_value(&core).unwrap();
    // The record of session s in the session table (a slab of {value, version} places).
    let record = state["sessions"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|place| &place["value"])
        .find(|record| record["id"] == "s")
        .expect("the record of s is kept");
    assert!(record["live"].is_null(), "{record}");
    assert!(record["paths"][0]["work"].is_null(), "{record}");
    assert_eq!(record["paths"][0]["last"], 1);
}
