//! The mirror: flushed versions coalesce, one upload is in flight per session and path,
//! transient failures are retried with doubling backoff within the upload timeout of the
//! version's first attempt, holds delay a drain, a flush while starting waits for the sandbox,
//! and every version settles exactly once (uploaded, superseded or dropped, with its reason),
//! per session. Races R5, R6, R9 and R13 (`docs/design.md`, "The races") are here.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::*;

fn up(core: &mut Lifecycle) -> (UploadId, Version) {
    loop {
        match core.poll_command() {
            Some(Command::Upload {
                upload, version, ..
            }) => return (upload, version),
            Some(_) => continue,
            None => panic!("no upload ordered"),
        }
    }
}

/// A transient failure is retried only if the retry would begin strictly before the version's
/// upload timeout (counted from its first attempt) runs out.
fn fail_first_attempt_at(at: Duration) -> (Vec<Command>, Vec<Event>) {
    let mut core = Lifecycle::new(Config {
        upload_timeout: Duration::from_secs(10),
        retry_backoff: Duration::from_secs(1),
        ..Config::default()
    })
    .unwrap();
    let (_, x) = start_call(&mut core, "a", "s");
    let t0 = Instant::ZERO;
    core.handle_start_ok(t0, x).unwrap();
    let s = SessionId::new("s").unwrap();
    core.flush(t0, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    events(&mut core);
    let t = Instant::from_millis(at.as_millis() as u64);
    core.handle_upload_failed(t, upload, UploadFailure::Transient)
        .unwrap();
    (commands(&mut core), events(&mut core))
}

/// Holds: draining waits for holds like uploads, until unhold or the drain deadline; `unhold`
/// without a hold is `NotHeld`; a session with nothing live cannot hold.
#[test]
fn holds_delay_drain_until_unhold_or_deadline() {
    let mut h = Script::default_config(); // drain 3 s
    assert_eq!(
        h.hold("s"),
        Err(Error::NoActiveSandbox {
            session: session("s")
        })
    );
    assert_eq!(
        h.unhold("s"),
        Err(Error::NotHeld {
            session: session("s")
        })
    );
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap();
    h.hold("s").unwrap();
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.expect_events(&[]);
    h.advance(secs(1));
    h.unhold("s").unwrap();
    h.quiet(); // one hold left
    h.unhold("s").unwrap();
    h.expect_events(&[released("a")]);
    h.expect_commands(&[stop(x)]);

    // Never let go: the drain deadline ends the wait.
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap();
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]);
    h.advance(ms(2999));
    h.quiet();
    h.advance(ms(1));
    h.expect_commands(&[stop(x)]);
    h.expect_events(&[released("a")]);
    assert_eq!(h.core.stats().drain_deadlines, 1);
    h.unhold("s").unwrap(); // the late unhold is accepted and changes nothing else
    h.quiet();
}

// ----------------------------------------------------------------------------------------------
// Mirror

/// Coalescing: a newer flush supersedes the pending one (`Superseded { by }`); the in-flight one
/// is not touched; versions reach the sandbox in increasing order.
#[test]
fn mirror_coalesces_pending_versions() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    assert_eq!(h.flush("s", &log(), "v1"), 1);
    let u1 = h.expect_upload("s", &log(), 1, x);
    assert_eq!(h.flush("s", &log(), "v2"), 2);
    h.quiet();
    assert_eq!(h.flush("s", &log(), "v3"), 3);
    h.expect_events(&[superseded("s", &log(), 2, 3)]);
    assert_eq!(h.flush("s", &log(), "v4"), 4);
    h.expect_events(&[superseded("s", &log(), 3, 4)]);
    h.expect_commands(&[]);
    h.upload_ok(u1);
    h.expect_events(&[uploaded("s", &log(), 1, x)]);
    let up = h.take_upload();
    assert_eq!(
        (up.version, up.payload.as_bytes()),
        (Version(4), &b"v4"[..])
    );
    h.upload_ok(up.upload);
    h.expect_events(&[uploaded("s", &log(), 4, x), mirror_settled("s")]);
    assert_eq!(h.core.stats().versions_superseded, 2);
}

/// At most one upload in flight per (session, path); different paths and sessions go in
/// parallel; versions count per (session, path).
#[test]
fn one_upload_in_flight_per_session_path() {
    let mut h = Script::with(|c| c.scope = Scope::Agent);
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.take_events();
    h.flush("sa", &log(), "1");
    h.expect_upload("sa", &log(), 1, x);
    h.flush("sa", &path("memory"), "1");
    h.expect_upload("sa", &path("memory"), 1, x);
    h.flush("sb", &log(), "1");
    h.expect_upload("sb", &log(), 1, x);
    assert_eq!(h.flush("sa", &log(), "2"), 2);
    h.expect_commands(&[]); // behind its path's upload
    assert_eq!(h.uploads.len(), 3);
    assert_eq!(h.flush("sb", &log(), "2"), 2);
    assert_eq!(h.flush("sa", &path("memory"), "2"), 2);
    h.expect_commands(&[]);
}

/// A transient failure retries the version after 100 ms, 200 ms, 400 ms (doubling), then
/// drops it `upload-failed`. Each attempt has its own `upload_timeout` (documented: the
/// timeout bounds one attempt, and `upload_retries` bounds the number of attempts).
#[test]
fn transient_upload_failure_retries_with_backoff_then_drops() {
    let mut h = Script::default_config(); // 3 retries, 100 ms
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let mut u = h.expect_upload("s", &log(), 1, x);
    for backoff in [100, 200, 400] {
        h.upload_failed(u, UploadFailure::Transient);
        h.quiet();
        assert_eq!(h.next_deadline_in(), Some(ms(backoff)));
        h.advance(ms(backoff - 1));
        h.quiet();
        h.advance(ms(1));
        u = h.expect_upload("s", &log(), 1, x);
    }
    h.upload_failed(u, UploadFailure::Transient);
    h.expect_events(&[
        dropped("s", &log(), 1, DropReason::UploadFailed),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);
    assert_eq!(h.core.stats().upload_retries, 3);

    // The upload timeout bounds all attempts of one version together: a retry keeps the first
    // attempt's deadline, and a failure so late that the backoff would end past it is final.
    h.flush("s", &log(), "late");
    let u = h.expect_upload("s", &log(), 2, x);
    h.wait(ms(1800));
    h.upload_failed(u, UploadFailure::Transient);
    h.advance(ms(100));
    let u = h.expect_upload("s", &log(), 2, x);
    assert_eq!(h.next_deadline_in(), Some(ms(100)));
    h.advance(ms(100));
    h.expect_commands(&[cancel(u, x)]);
    h.expect_events(&[
        dropped("s", &log(), 2, DropReason::UploadTimeout),
        mirror_settled("s"),
    ]);
    h.flush("s", &log(), "too-late");
    let u = h.expect_upload("s", &log(), 3, x);
    h.wait(ms(1950));
    h.upload_failed(u, UploadFailure::Transient);
    h.expect_events(&[
        dropped("s", &log(), 3, DropReason::UploadFailed),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[]);

    // A newer version waiting when the attempt fails: the failed one is superseded, the newer
    // one goes out at once.
    h.flush("s", &log(), "v4");
    let u4 = h.expect_upload("s", &log(), 4, x);
    h.flush("s", &log(), "v5");
    h.upload_failed(u4, UploadFailure::Transient);
    h.expect_events(&[superseded("s", &log(), 4, 5)]);
    h.expect_upload("s", &log(), 5, x);
}

/// An attempt unanswered for `upload_timeout` is cancelled and its version dropped
/// `upload-timeout`; the path's next version goes out.
#[test]
fn upload_timeout_drops_the_version() {
    let mut h = Script::default_config(); // upload 2 s
    let x = h.ready_call("a", "s");
    h.flush("s", &log(), "v1");
    let u1 = h.expect_upload("s", &log(), 1, x);
    h.advance(ms(1999));
    h.quiet();
    h.advance(ms(1));
    h.expect_commands(&[cancel(u1, x)]);
    h.expect_events(&[
        dropped("s", &log(), 1, DropReason::UploadTimeout),
        mirror_settled("s"),
    ]);
    h.upload_ok(u1); // stale
    h.quiet();
}

/// A flush while the session's call is still starting waits for the sandbox, then goes to it;
/// if the start fails, it is dropped `no-sandbox`.
#[test]
fn flush_while_starting_waits_for_the_sandbox() {
    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.flush("s", &log(), "early");
    h.quiet();
    h.start_ok(x);
    h.expect_events(&[ready("a", x)]);
    h.expect_upload("s", &log(), 1, x);

    let mut h = Script::default_config();
    h.acquire("a", "s");
    let x = h.started();
    h.flush("s", &log(), "early");
    h.start_failed(x);
    h.expect_events(&[
        failed("a", ErrorKind::StartFailed),
        dropped("s", &log(), 1, DropReason::NoSandbox),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[shutdown(x)]);
}

/// `MirrorSettled` comes per session, when that session has nothing unsettled; another
/// session's unsettled work does not hold it back.
#[test]
fn mirror_settled_per_session() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "1");
    let ua = h.expect_upload("sa", &log(), 1, xa);
    h.flush("sb", &log(), "1");
    let ub = h.expect_upload("sb", &log(), 1, xb);
    assert!(!h.core.is_mirror_settled(&session("sa")));
    h.upload_ok(ub);
    h.expect_events(&[uploaded("sb", &log(), 1, xb), mirror_settled("sb")]);
    assert!(h.core.is_mirror_settled(&session("sb")));
    assert!(!h.core.is_mirror_settled(&session("sa")));
    h.upload_ok(ua);
    h.expect_events(&[uploaded("sa", &log(), 1, xa), mirror_settled("sa")]);
    // `MirrorSettled` marks the change from unsettled to settled: a flush that settles at once
    // (nowhere to go) emits none, and the getter says settled. A waiter checks the getter first.
    h.flush("nobody", &log(), "x");
    h.expect_events(&[dropped("nobody", &log(), 1, DropReason::NoSandbox)]);
    assert!(h.core.is_mirror_settled(&session("nobody")));
}

/// `CallReleased` waits for the released call's own session's mirror work in its sandbox, and
/// never for another session's (even one sharing the sandbox, with an upload hung).
#[test]
fn call_released_waits_for_its_own_sessions_mirror_only() {
    let mut h = Script::with(|c| {
        c.scope = Scope::Agent;
        c.upload_timeout = secs(600);
    });
    let x = h.ready_call("a", "sa");
    h.acquire("b", "sb");
    h.take_events();
    h.flush("sb", &log(), "hung");
    h.expect_upload("sb", &log(), 1, x);
    h.hold("sb").unwrap(); // and sb's writer holds
    h.release("a");
    h.expect_events(&[released("a")]); // sa had nothing pending: at once
    h.acquire("a2", "sa");
    h.take_events();
    h.flush("sa", &log(), "mine");
    let ua = h.expect_upload("sa", &log(), 1, x);
    h.release("a2");
    h.expect_events(&[]); // its own upload is in flight
    h.upload_ok(ua);
    h.expect_events(&[
        uploaded("sa", &log(), 1, x),
        released("a2"),
        mirror_settled("sa"),
    ]);
    assert!(!h.core.is_mirror_settled(&session("sb")));
    h.expect_commands(&[]); // b is still live on x
}

#[test]
fn retries_stop_at_the_upload_timeout_of_the_first_attempt() {
    let mut core = Lifecycle::new(Config {
        upload_timeout: Duration::from_millis(1000),
        upload_retries: 10,
        retry_backoff: Duration::from_millis(300),
        ..Config::default()
    })
    .unwrap();
    let (call, session) = (CallId::new("c").unwrap(), SessionId::new("s").unwrap());
    let log = PathName::session_log();
    core.acquire(Instant::ZERO, CallSpec::new(call, session.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(Instant::ZERO, sandbox).unwrap();
    core.flush(Instant::ZERO, &session, &log, Payload::new(b"x".to_vec()))
        .unwrap();
    let (first, v) = up(&mut core);
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(1000)));

    // Failure at 100 ms: retried after 300 ms.
    core.handle_upload_failed(Instant::from_millis(100), first, UploadFailure::Transient)
        .unwrap();
    assert_eq!(core.poll_command(), None);
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(400)));
    core.handle_timeout(Instant::from_millis(400)).unwrap();
    let (second, v2) = up(&mut core);
    assert_eq!(v2, v, "the same version is retried");
    // The retry's deadline is the first attempt's, not a fresh upload timeout.
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(1000)));

    // Failure at 500 ms: the next delay (600 ms) would end past 1000 ms, so the version fails.
    while core.poll_event().is_some() {}
    core.handle_upload_failed(Instant::from_millis(500), second, UploadFailure::Transient)
        .unwrap();
    let settled: Vec<Event> = std::iter::from_fn(|| core.poll_event()).collect();
    assert!(
        settled.contains(&Event::Settled {
            session: session.clone(),
            path: log.clone(),
            version: v,
            outcome: Settlement::Dropped {
                reason: DropReason::UploadFailed
            },
        }),
        "{settled:?}"
    );
    assert_eq!(core.stats().upload_retries, 1);
    assert!(core.is_mirror_settled(&session));
}

#[test]
fn a_retry_that_would_begin_at_the_timeout_is_not_made() {
    // Failed at 9 s; the retry would begin at 9 + 1 = 10 s, the timeout: dropped now.
    let (_, events) = fail_first_attempt_at(Duration::from_secs(9));
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Settled {
                outcome: Settlement::Dropped {
                    reason: DropReason::UploadFailed
                },
                ..
            }
        )),
        "{events:?}"
    );
}

#[test]
fn a_retry_that_begins_before_the_timeout_is_made() {
    // Failed at 8.999 s; the retry begins at 9.999 s, inside the window: nothing settles yet.
    let (_, events) = fail_first_attempt_at(Duration::from_millis(8_999));
    assert!(
        !events.iter().any(|e| matches!(e, Event::Settled { .. })),
        "{events:?}"
    );
}

#[test]
fn a_drain_waits_for_a_version_waiting_to_be_retried() {
    let t0 = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        retry_backoff: Duration::from_secs(1),
        ..Config::default()
    })
    .unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_start_ok(t0, x).unwrap();
    let s = SessionId::new("s").unwrap();
    core.flush(t0, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    core.handle_upload_failed(t0, upload, UploadFailure::Transient)
        .unwrap();
    // Nothing in flight; the version waits for its retry. The release drains and waits for it.
    core.release(t0, &a).unwrap();
    let cmds = commands(&mut core);
    assert!(
        cmds.iter().all(|c| !matches!(c, Command::Stop { .. })),
        "{cmds:?}"
    );
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Draining));
    let retry = core.poll_timeout().expect("the retry");
    core.handle_timeout(retry).unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no retry upload")
    };
    core.handle_upload_ok(retry, upload).unwrap();
    assert!(commands(&mut core).contains(&Command::Stop {
        sandbox: x,
        suspend: false,
        deadline: retry + Config::default().command_timeout,
        token: None,
    }));
    assert!(events(&mut core).iter().any(|e| matches!(
        e,
        Event::Settled {
            outcome: Settlement::Uploaded { .. },
            ..
        }
    )));
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

/// R5 mirror after release: A flushes, A releases, then the queued mirror runs. It must go into
/// A's sandbox (kept draining for it) and never into B's; a flush after A's sandbox stopped is
/// dropped with a reason, never routed elsewhere.
#[test]
fn r05_mirror_after_release() {
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.flush("sa", &log(), "v2"); // queued behind v1
    h.quiet();

    h.release("a");
    h.expect_commands(&[drain(xa, &["sa"])]); // no Stop: the mirror is not done
    h.expect_events(&[]); // the release completes when A's mirror has settled
    h.upload_ok(u1);
    h.expect_events(&[uploaded("sa", &log(), 1, xa)]);
    let u2 = h.expect_upload("sa", &log(), 2, xa); // the queued version runs, into A's sandbox
    h.upload_ok(u2);
    h.expect_events(&[
        uploaded("sa", &log(), 2, xa),
        released("a"),
        mirror_settled("sa"),
    ]);
    h.expect_commands(&[stop(xa)]);

    // A's sandbox is stopping: a late flush of A's session has nowhere to go and says so.
    assert_eq!(
        h.resolve("sa"),
        Err(Error::NoActiveSandbox {
            session: session("sa")
        })
    );
    h.flush("sa", &log(), "v3");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 3, DropReason::NoSandbox)]);
    // Nothing of A's session ever went to B's sandbox.
    assert!(!h.all_commands.iter().any(|c| matches!(c,
        Command::Upload { session, sandbox, .. } if session.as_str() == "sa" && *sandbox == xb)));
    h.stop_ok(xa, None);
    h.expect_commands(&[shutdown(xa)]);
}

/// R6 mirror into a dead sandbox. The null dereference is the driver's; the core's part: no
/// Upload is ever ordered after Stop, Shutdown or death; an upload still in flight when the
/// drain deadline passes or the sandbox dies is cancelled and its version settled dropped
/// (`drain-deadline`, `sandbox-gone`); its late answer is stale and changes nothing.
#[test]
fn r06_mirror_into_dead_sandbox() {
    // (a) Release stops the sandbox while an upload hangs: the drain deadline cuts it.
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.release("a");
    h.expect_commands(&[drain(xa, &["sa"])]);
    assert_eq!(h.next_deadline_in(), Some(secs(2))); // the upload timeout comes first
    h.flush("sa", &log(), "v2"); // pending behind the hung v1
    h.wait(ms(1500));
    h.run_to_next_deadline(); // upload timeout at 2 s: v1 dropped, v2 goes out, still into xa
    h.expect_commands(&[
        cancel(u1, xa),
        Command::Upload {
            upload: UploadId(1),
            sandbox: xa,
            session: session("sa"),
            path: log(),
            version: Version(2),
            payload: Payload::new(b"v2".to_vec()),
            deadline: Instant::ZERO, // compared apart (checked when drained)
            token: None,
        },
    ]);
    h.expect_events(&[dropped("sa", &log(), 1, DropReason::UploadTimeout)]);
    h.run_to_next_deadline(); // the drain deadline at 3 s
    assert_eq!(h.now, Instant::ZERO + secs(3));
    h.expect_commands(&[cancel(UploadId(1), xa), stop(xa)]);
    h.expect_events(&[
        dropped("sa", &log(), 2, DropReason::DrainDeadline),
        released("a"),
        mirror_settled("sa"),
    ]);
    // The late answers are stale: Ok, nothing changes, nothing is emitted.
    let stale = h.core.stats().stale_answers;
    let before = h.snapshot_json();
    h.upload_ok(u1);
    h.upload_ok(UploadId(1));
    h.quiet();
    assert_eq!(h.core.stats().stale_answers, stale + 2);
    let after = h.snapshot_json();
    assert_eq!(
        before.replace(&format!("\"stale_answers\":{stale}"), ""),
        after.replace(&format!("\"stale_answers\":{}", stale + 2), "")
    );
    // After Stop, and after Shutdown, a flush orders no Upload into it.
    h.flush("sa", &log(), "v3");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 3, DropReason::NoSandbox)]);
    h.stop_ok(xa, Some("snap"));
    h.expect_commands(&[persist(xa, Some("snap"))]);
    h.persist_ok(xa);
    h.expect_commands(&[shutdown(xa)]);
    h.flush("sa", &log(), "v4");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 4, DropReason::NoSandbox)]);

    // (b) The sandbox dies with an upload in flight.
    let mut h = Script::default_config();
    let xa = h.ready_call("a", "sa");
    h.flush("sa", &log(), "v1");
    let u1 = h.expect_upload("sa", &log(), 1, xa);
    h.died(xa);
    h.expect_commands(&[cancel(u1, xa), shutdown(xa)]);
    h.expect_events(&[
        workspace_lost(xa, session_key("sa")),
        lost("a", xa),
        dropped("sa", &log(), 1, DropReason::SandboxGone),
        mirror_settled("sa"),
    ]);
    assert_eq!(
        h.resolve("sa"),
        Err(Error::SandboxGone {
            session: session("sa"),
            sandbox: xa
        })
    );
    h.upload_ok(u1); // late success: stale, the version stays dropped
    h.quiet();
    h.flush("sa", &log(), "v2");
    h.expect_commands(&[]);
    h.expect_events(&[dropped("sa", &log(), 2, DropReason::SandboxGone)]);
    h.died(xa); // a second report: ignored, Shutdown stays ordered once
    h.quiet();
    h.release("a");
    h.expect_events(&[released("a")]);
    h.expect_commands(&[]);
    h.shutdown_ok(xa);
    h.quiet();
    assert!(h.core.is_quiescent());
}

/// R9 background write after release: a memory flush started at the end of a call runs after
/// the release. Its writer holds the session while the call is live; the release waits (drain)
/// for the hold, the write lands in the session's sandbox, then Stop follows.
#[test]
fn r09_background_write_after_release() {
    let mut h = Script::default_config();
    let x = h.ready_call("a", "s");
    h.hold("s").unwrap(); // the memory writer promises a write
    h.release("a");
    h.expect_commands(&[drain(x, &["s"])]); // no Stop yet: a write is promised
    h.expect_events(&[]);
    h.wait(secs(1));
    assert_eq!(h.resolve("s").ok(), None); // no live call ...
    let v = h.flush("s", &path("memory"), "remembered"); // ... but the write has a sandbox
    let u = h.expect_upload("s", &path("memory"), v, x);
    h.unhold("s").unwrap();
    h.quiet();
    h.upload_ok(u);
    h.expect_events(&[
        uploaded("s", &path("memory"), 1, x),
        released("a"),
        mirror_settled("s"),
    ]);
    h.expect_commands(&[stop(x)]);
}

/// R13 head-of-line: a hung upload for one session never stalls another session's mirror, its
/// release or its drain.
#[test]
fn r13_head_of_line() {
    let mut h = Script::with(|c| c.upload_timeout = secs(180));
    let xa = h.ready_call("a", "sa");
    let xb = h.ready_call("b", "sb");
    h.flush("sa", &log(), "big");
    let ua = h.expect_upload("sa", &log(), 1, xa); // a 3-minute upload
    h.flush("sb", &log(), "small");
    let ub = h.expect_upload("sb", &log(), 1, xb); // out at once, not behind A's
    h.upload_ok(ub);
    h.expect_events(&[uploaded("sb", &log(), 1, xb), mirror_settled("sb")]);
    h.flush("sb", &log(), "last");
    let ub = h.expect_upload("sb", &log(), 2, xb);
    h.release("b");
    h.expect_commands(&[drain(xb, &["sb"])]);
    h.upload_ok(ub);
    h.expect_events(&[
        uploaded("sb", &log(), 2, xb),
        released("b"),
        mirror_settled("sb"),
    ]);
    h.expect_commands(&[stop(xb)]); // B's drain is done while A's upload still hangs
    assert!(h.uploads.contains_key(&ua));
    assert!(!h.core.is_mirror_settled(&session("sa")));
    assert!(h.core.is_mirror_settled(&session("sb")));
    assert_eq!(h.now, Instant::ZERO);
}
