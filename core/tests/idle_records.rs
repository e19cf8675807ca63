//! Idle session records: past `max_idle_sessions` the record idle the longest is forgotten
//! (counted in `sessions_forgotten`); a record that became active again and idle again counts
//! from its latest idleness; stale queue entries never forget a record; an idle record keeps no
//! boxed work (it is the common case, a million of them must stay small).

use sandkeeper::*;

fn session(name: &str) -> SessionId {
    SessionId::new(name).unwrap()
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
