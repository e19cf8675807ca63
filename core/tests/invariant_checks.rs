//! The invariant checker is itself checked: a state that breaks an invariant, made by editing a
//! valid serialised core (no input sequence can make one while the core is right), must be
//! reported under that invariant's name. Without these, a check that went blind would pass every
//! other test: they only ever show it valid states.

use sandkeeper::*;
use serde_json::{json, Value};

fn ids(call: &str, session: &str) -> (CallId, SessionId) {
    (CallId::new(call).unwrap(), SessionId::new(session).unwrap())
}

/// A core with call `a` of session `s` starting on sandbox 0.
fn starting() -> Lifecycle {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, s) = ids("a", "s");
    core.acquire(Instant::ZERO, CallSpec::new(a, s)).unwrap();
    core
}

/// A core with call `a` of session `s` ready on sandbox 0.
fn running() -> Lifecycle {
    let mut core = starting();
    core.handle_start_ok(Instant::ZERO, SandboxId(0)).unwrap();
    core
}

/// `core` serialised, edited by `edit`, and read back.
fn corrupt(core: &Lifecycle, edit: impl FnOnce(&mut Value)) -> Lifecycle {
    let mut state = serde_json::to_value(core).unwrap();
    edit(&mut state);
    serde_json::from_value(state).expect("the edited state still parses")
}

/// The record of call `a`, the only call these cores ever had (the first place of the call
/// table; place 0 is the table's sentinel).
fn call_a(v: &mut Value) -> &mut Value {
    &mut v["calls"]["records"][1]["value"]
}

/// The record of session `s`, the only session these cores ever had.
fn session_s(v: &mut Value) -> &mut Value {
    &mut v["sessions"]["records"][1]["value"]
}

/// The record of sandbox 0, the only sandbox these cores ever had.
fn sandbox_0(v: &mut Value) -> &mut Value {
    &mut v["sandboxes"]["records"][1]["value"]
}

/// How records refer to sandbox 0 (the first place of its table).
fn sandbox_0_ref() -> Value {
    json!({ "idx": 1, "version": 1 })
}

/// How records refer to call `a`.
fn call_a_ref() -> Value {
    json!({ "idx": 1, "version": 1 })
}

fn broken(core: &Lifecycle) -> &'static str {
    core.check_invariants()
        .expect_err("the corrupted state must be reported")
        .invariant
}

#[test]
fn valid_states_pass() {
    starting().check_invariants().unwrap();
    running().check_invariants().unwrap();
    // And reading a valid state back keeps it valid: the edits below are the only change.
    corrupt(&running(), |_| {}).check_invariants().unwrap();
}

#[test]
fn a_ready_call_on_a_starting_sandbox_is_reported() {
    let core = corrupt(&starting(), |v| {
        call_a(v)["state"] = json!({ "Ready": sandbox_0_ref() });
        // The session agrees, so only the sandbox's view is wrong.
        session_s(v)["live"]["ready"] = json!([call_a_ref()]);
        session_s(v)["live"]["coming"] = json!(0);
    });
    assert_eq!(broken(&core), "bound-calls");
}

#[test]
fn a_starting_call_on_a_running_sandbox_is_reported() {
    let core = corrupt(&running(), |v| {
        call_a(v)["state"] = json!({ "Starting": sandbox_0_ref() });
        // The session agrees, so only the sandbox's view is wrong.
        session_s(v)["live"]["ready"] = json!([]);
        session_s(v)["live"]["coming"] = json!(1);
        session_s(v)["live"]["target"] = json!(null);
        sandbox_0(v)["targeting"] = json!("Empty");
    });
    assert_eq!(broken(&core), "bound-calls");
}

#[test]
fn a_call_on_a_sandbox_that_cannot_hold_calls_is_reported() {
    let core = corrupt(&running(), |v| {
        sandbox_0(v)["state"] =
            json!({ "stopping": { "suspend": false, "failures": 0, "awaits": "stop" } });
    });
    assert_eq!(broken(&core), "bound-calls");
}

#[test]
fn a_starting_sandbox_awaiting_nothing_is_reported() {
    let core = corrupt(&starting(), |v| {
        sandbox_0(v)["state"] = json!({ "starting": "answered" });
    });
    assert_eq!(broken(&core), "shutdown-once");
}

#[test]
fn a_deadline_missing_from_the_timer_table_is_reported() {
    let core = corrupt(&starting(), |v| {
        // The sandbox remembers a timer the table does not hold; the table still holds one
        // timer for one deadline, so only looking the deadline up can tell.
        sandbox_0(v)["deadline"]["seq"] = json!(7);
    });
    assert_eq!(broken(&core), "timers");
}

#[test]
fn a_name_index_that_misses_its_call_is_reported() {
    let core = corrupt(&starting(), |v| {
        // The name now points at a later generation of the call's place: a stale reference.
        v["calls"]["by_name"]["a"]["version"] = json!(3);
    });
    assert_eq!(broken(&core), "call-index");
}

#[test]
fn a_name_index_that_misses_its_session_is_reported() {
    let core = corrupt(&starting(), |v| {
        v["sessions"]["by_name"]["s"]["version"] = json!(3);
    });
    assert_eq!(broken(&core), "session-index");
}

#[test]
fn a_key_index_that_misses_its_slot_is_reported() {
    let core = corrupt(&starting(), |v| {
        v["keys"]["by_key"]["session:s"]["version"] = json!(3);
    });
    assert_eq!(broken(&core), "key-index");
}

#[test]
fn an_id_index_that_misses_its_sandbox_is_reported() {
    let core = corrupt(&starting(), |v| {
        v["sandboxes"]["by_id"]["0"]["version"] = json!(3);
    });
    assert_eq!(broken(&core), "sandbox-index");
}

#[test]
fn an_id_index_that_misses_its_upload_is_reported() {
    let mut core = running();
    let s = SessionId::new("s").unwrap();
    core.flush(
        Instant::ZERO,
        &s,
        &PathName::session_log(),
        Payload::default(),
    )
    .unwrap();
    core.check_invariants().unwrap();
    let core = corrupt(&core, |v| {
        v["uploads"]["by_id"]["0"]["version"] = json!(3);
    });
    assert_eq!(broken(&core), "upload-index");
}

/// A core whose call `a` of session `s` is ready and whose session log has an upload in flight.
fn uploading() -> Lifecycle {
    let mut core = running();
    let s = SessionId::new("s").unwrap();
    core.flush(
        Instant::ZERO,
        &s,
        &PathName::session_log(),
        Payload::default(),
    )
    .unwrap();
    core.check_invariants().unwrap();
    core
}

/// A core closed with nothing live: no call ever came.
fn closed() -> Lifecycle {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    core.close(Instant::ZERO, std::time::Duration::ZERO)
        .unwrap();
    assert!(core.is_closed());
    core.check_invariants().unwrap();
    core
}

#[test]
fn an_upload_its_sandbox_does_not_list_is_reported() {
    let core = corrupt(&uploading(), |v| {
        sandbox_0(v)["uploads"] = json!("Empty");
    });
    assert_eq!(broken(&core), "uploads");
}

#[test]
fn a_call_left_after_close_is_reported() {
    let live = serde_json::to_value(running()).unwrap();
    let core = corrupt(&closed(), |v| v["calls"] = live["calls"].clone());
    assert_eq!(broken(&core), "closed");
}

#[test]
fn an_upload_left_after_close_is_reported() {
    let live = serde_json::to_value(uploading()).unwrap();
    let core = corrupt(&closed(), |v| v["uploads"] = live["uploads"].clone());
    assert_eq!(broken(&core), "closed");
}

/// A live session stamped idle (and counted, so the count agrees): only looking at the record
/// itself can tell.
#[test]
fn a_live_session_stamped_idle_is_reported() {
    let core = corrupt(&running(), |v| {
        session_s(v)["idle_stamp"] = json!(1);
        v["sessions"]["idle"]["count"] = json!(1);
    });
    assert_eq!(broken(&core), "idle-count");
}

/// Two uploads in flight, each with its deadline in the table. The table is edited to hold the
/// first deadline twice and the second not at all: as many live entries as deadlines, so only
/// telling the entries apart can see that a deadline has none.
#[test]
fn a_deadline_in_the_table_twice_in_place_of_another_is_reported() {
    let mut core = uploading();
    let s = SessionId::new("s").unwrap();
    let notes = PathName::new("notes.md").unwrap();
    core.flush(Instant::ZERO, &s, &notes, Payload::default())
        .unwrap();
    core.check_invariants().unwrap();
    let core = corrupt(&core, |v| {
        let heap = &mut v["timers"]["heap"];
        assert_eq!(heap.as_array().unwrap().len(), 2, "two upload deadlines");
        heap[1] = heap[0].clone();
    });
    assert_eq!(broken(&core), "timers");
}

#[test]
fn a_bound_call_its_sandbox_does_not_list_is_reported() {
    let core = corrupt(&running(), |v| {
        sandbox_0(v)["bound"] = json!("Empty");
    });
    assert_eq!(broken(&core), "bound-calls");
}
