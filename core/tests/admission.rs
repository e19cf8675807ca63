//! Admission of new calls and sessions: `max_active_sessions` counts active session records
//! only (idle ones do not hold a place), and under `Serialize` a call whose key has no bound
//! call goes straight to the key's warm sandbox instead of queueing.

use std::time::Duration;

use sandkeeper::*;

fn ids(call: &str, session: &str) -> (CallId, SessionId) {
    (CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

#[test]
fn idle_session_records_leave_room_for_active_ones() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        limits: Limits {
            max_active_sessions: 2,
            ..Limits::default()
        },
        ..Config::default()
    })
    .unwrap();
    let log = PathName::session_log();
    // Three idle records: flushed with no sandbox anywhere, settled (dropped) at once.
    for name in ["idle-1", "idle-2", "idle-3"] {
        let s = SessionId::new(name).unwrap();
        core.flush(t, &s, &log, Payload::default()).unwrap();
    }
    while core.poll_event().is_some() {}
    assert_eq!(core.session_records(), 3);

    // Two active sessions fit beside them...
    let (a, s) = ids("a", "s");
    let (b, u) = ids("b", "u");
    core.acquire(t, CallSpec::new(a, s)).unwrap();
    core.acquire(t, CallSpec::new(b, u)).unwrap();
    // ...a third does not, for a call or for a flush.
    let (c, v) = ids("c", "v");
    let limit = Error::LimitExceeded {
        limit: "max_active_sessions",
        max: 2,
    };
    assert_eq!(
        core.acquire(t, CallSpec::new(c, v.clone())),
        Err(limit.clone())
    );
    assert_eq!(core.flush(t, &v, &log, Payload::default()), Err(limit));
    // An idle session becomes active again only within the limit, but its own record exists:
    // a flush of an existing record is not a new session.
    let idle = SessionId::new("idle-1").unwrap();
    assert!(core.flush(t, &idle, &log, Payload::default()).is_ok());
}

#[test]
fn serialize_reuses_a_warm_sandbox_without_queueing() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        same_key: SameKey::Serialize,
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(60),
        },
        ..Config::default()
    })
    .unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a.clone(), s.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    core.release(t, &a).unwrap();
    while core.poll_command().is_some() {}
    assert_eq!(core.sandbox_state(sandbox), Some(SandboxState::Idle));

    // The key has a warm sandbox and no bound call: the next call takes it at once.
    let (b, _) = ids("b", "s");
    core.acquire(t, CallSpec::new(b.clone(), s)).unwrap();
    assert_eq!(core.call_status(&b), Some(CallStatus::Ready(sandbox)));
    assert_eq!(core.poll_command(), None);
}

#[test]
fn during_close_a_session_whose_call_is_still_starting_may_flush() {
    let t = Instant::ZERO;
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(t, CallSpec::new(a, s.clone())).unwrap();
    core.close(t, Duration::from_secs(10)).unwrap();
    // Its sandbox is coming (the call is live until the close deadline): the write is taken.
    assert!(core
        .flush(t, &s, &PathName::session_log(), Payload::default())
        .is_ok());
    // A session with nothing live or coming is refused.
    let other = SessionId::new("other").unwrap();
    assert_eq!(
        core.flush(t, &other, &PathName::session_log(), Payload::default()),
        Err(Error::Closed { what: "flush" })
    );
}
