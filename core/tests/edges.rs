//! Edges that mutation testing (cargo-mutants over the core) showed no other test pinned: each
//! test names the guard it holds in place.

use std::time::Duration;

use sandkeeper::*;

fn id(c: &str) -> CallId {
    CallId::new(c).unwrap()
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

fn events(core: &mut Lifecycle) -> Vec<Event> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

/// Acquires `c` for `s` and answers its Start: the call is ready on the returned sandbox.
fn ready_call(core: &mut Lifecycle, c: &str, s: &str) -> SandboxId {
    core.acquire(Instant::ZERO, CallSpec::new(id(c), sid(s)))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start for {c}")
    };
    core.handle_start_ok(Instant::ZERO, sandbox).unwrap();
    assert!(events(core).contains(&Event::CallReady {
        call: id(c),
        sandbox
    }));
    sandbox
}

/// Close's first phase lasts while a call is live, even one whose sandbox died (so no sandbox
/// is up): the call is revoked at the deadline, not at once. Pins `close_progress`'s "a call or
/// an upload is live" guard.
#[test]
fn close_waits_for_a_live_call_on_a_dead_sandbox() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let t = Instant::ZERO;
    let x = ready_call(&mut core, "a", "s");
    core.handle_died(t, x).unwrap();
    assert_eq!(
        events(&mut core),
        vec![
            Event::WorkspaceLost {
                sandbox: x,
                key: Key::Session(SessionId::new("s").unwrap())
            },
            Event::SandboxLost {
                call: id("a"),
                sandbox: x
            }
        ]
    );
    for command in commands(&mut core) {
        if let Command::Shutdown { sandbox, .. } = command {
            core.handle_shutdown_ok(t, sandbox).unwrap();
        }
    }
    assert_eq!(core.call_status(&id("a")), Some(CallStatus::Lost(x)));

    let deadline = Duration::from_secs(10);
    core.close(t, deadline).unwrap();
    assert!(
        events(&mut core).is_empty(),
        "nothing is revoked before the deadline"
    );
    assert_eq!(core.call_status(&id("a")), Some(CallStatus::Lost(x)));
    assert_eq!(core.poll_timeout(), Some(t + deadline));

    core.handle_timeout(t + deadline).unwrap();
    let after = events(&mut core);
    assert!(
        after.contains(&Event::CallRevoked { call: id("a") }),
        "{after:?}"
    );
}

/// A session's mirror never goes to the sandbox of an earlier call of the session that was
/// released while another of its calls had a sandbox up: once that other sandbox died, the
/// mirror has nowhere to go (its live call is lost), and after that call ends neither. Pins the
/// linger rule of `end_call` ("no other ready call with a sandbox up, and this sandbox accepts
/// uploads").
#[test]
fn the_mirror_does_not_linger_on_a_sandbox_released_while_another_was_up() {
    let mut core = Lifecycle::new(Config {
        scope: Scope::Call,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(60),
        },
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    let x = ready_call(&mut core, "a", "s");
    let y = ready_call(&mut core, "b", "s");
    core.release(t, &id("a")).unwrap();
    // a's sandbox is kept warm: it still accepts uploads.
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Idle));
    core.handle_died(t, y).unwrap();
    let _ = (commands(&mut core), events(&mut core));

    // b is live but lost: its session has no sandbox that may be used.
    let flush_goes_nowhere = |core: &mut Lifecycle, reason: DropReason| {
        let v = core
            .flush(t, &sid("s"), &PathName::session_log(), Payload::default())
            .unwrap();
        assert!(
            !commands(core)
                .iter()
                .any(|c| matches!(c, Command::Upload { .. })),
            "no upload into {x}, the warm sandbox of a call released while another was up"
        );
        assert!(events(core).contains(&Event::Settled {
            session: sid("s"),
            path: PathName::session_log(),
            version: v,
            outcome: Settlement::Dropped { reason },
        }));
    };
    flush_goes_nowhere(&mut core, DropReason::SandboxGone);
    core.release(t, &id("b")).unwrap();
    let _ = (commands(&mut core), events(&mut core));
    flush_goes_nowhere(&mut core, DropReason::NoSandbox);
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Idle));
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

/// Close leaves nothing behind: no key (not even one kept for its snapshot), no session record
/// (not even an idle one), and the invariant check says so.
#[test]
fn close_forgets_keys_and_session_records() {
    let mut core = Lifecycle::new(Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    })
    .unwrap();
    let t = Instant::ZERO;
    ready_call(&mut core, "a", "s");
    core.release(t, &id("a")).unwrap();
    while let Some(command) = core.poll_command() {
        match command {
            Command::Stop { sandbox, .. } => core
                .handle_stop_ok(t, sandbox, Some(Snapshot::new("snap")))
                .unwrap(),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
            _ => {}
        }
    }
    // Suspended: the key is kept for its snapshot, the session's record for its versions.
    assert_eq!((core.tracked_keys(), core.session_records()), (1, 1));
    assert_eq!(core.tracked_sandboxes(), 0);
    core.close(t, Duration::from_secs(1)).unwrap();
    assert!(core.is_closed());
    assert_eq!((core.tracked_keys(), core.session_records()), (0, 0));
    core.check_invariants().unwrap();
}

/// Cancelling a timer takes it out of the heap only when it is the very earliest entry: an
/// answered upload whose deadline equals another upload's leaves the other's timer in place,
/// and that upload still times out. Pins `Timers::cancel`'s test of the entry's sequence.
#[test]
fn an_answer_cancels_only_its_own_timer_among_equal_deadlines() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let t = Instant::ZERO;
    let log = PathName::session_log();
    ready_call(&mut core, "a", "s1");
    ready_call(&mut core, "b", "s2");
    core.flush(t, &sid("s1"), &log, Payload::default()).unwrap();
    core.flush(t, &sid("s2"), &log, Payload::default()).unwrap();
    let uploads: Vec<(UploadId, Instant)> = commands(&mut core)
        .into_iter()
        .filter_map(|c| match c {
            Command::Upload {
                upload, deadline, ..
            } => Some((upload, deadline)),
            _ => None,
        })
        .collect();
    let [(first, due), (second, due_too)] = uploads[..] else {
        panic!("two uploads ordered: {uploads:?}")
    };
    assert_eq!(due, due_too, "both bounded by the same instant");
    // The second answers: its timer goes; the first's, at the same instant and set earlier,
    // is the heap's top and must stay.
    core.handle_upload_ok(t, second).unwrap();
    events(&mut core);
    assert_eq!(core.poll_timeout(), Some(due));
    core.handle_timeout(due).unwrap();
    assert!(commands(&mut core).contains(&Command::CancelUpload {
        upload: first,
        sandbox: core.resolve(&sid("s1")).unwrap(),
    }));
    assert!(events(&mut core).iter().any(|e| matches!(
        e,
        Event::Settled {
            session,
            outcome: Settlement::Dropped {
                reason: DropReason::UploadTimeout
            },
            ..
        } if *session == sid("s1")
    )));
}
