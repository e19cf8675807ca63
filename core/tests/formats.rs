//! What people read: ids, names, snapshots, specs and payloads display and debug as documented,
//! and the invariant checker reports a broken state by name; a rejected name is echoed in its
//! error, cut to at most 200 bytes on a character boundary.
//!
//! What programs read: inputs, commands, events and a whole serialised core round-trip through
//! serde, and a core restored from its serialised form continues identically.

mod support;

use sandkeeper::*;
use support::*;

#[test]
fn ids_and_values_display_and_debug_as_documented() {
    assert_eq!(SandboxId(7).to_string(), "sbx-7");
    assert_eq!(UploadId(3).to_string(), "upl-3");
    assert_eq!(Version(2).to_string(), "v2");
    let snapshot = Snapshot::new("vol/snap-1");
    assert_eq!(snapshot.as_str(), "vol/snap-1");
    assert_eq!(format!("{snapshot:?}"), "\"vol/snap-1\"");
    let spec = Spec::new("{\"image\":\"python\"}");
    assert_eq!(spec.as_str(), "{\"image\":\"python\"}");
    assert_eq!(format!("{spec:?}"), "\"{\\\"image\\\":\\\"python\\\"}\"");
    let payload = Payload::new(b"abc".to_vec());
    assert_eq!(payload.len(), 3);
    assert!(!payload.is_empty());
    assert!(Payload::default().is_empty());
    assert_eq!(format!("{payload:?}"), "Payload(3 bytes)");
    assert_eq!(
        Key::Session(SessionId::new("s1").unwrap()).to_string(),
        "session:s1"
    );
    // Fleet mode's ids, as logs and the store's answers name them.
    assert_eq!(Token(4).to_string(), "token-4");
    assert_eq!(RenewalId(1).to_string(), "renewal-1");
    assert_eq!(ClaimId(2).to_string(), "claim-2");
    assert_eq!(ReleaseId(3).to_string(), "release-3");
    assert_eq!(RecordingId(5).to_string(), "recording-5");
}

#[test]
fn the_empty_spec_is_the_default_and_every_spec_serialises_as_its_text() {
    assert_eq!(Spec::new(""), Spec::default());
    assert_eq!(Spec::default().as_str(), "");
    assert_eq!(format!("{:?}", Spec::default()), "\"\"");
    assert_ne!(Spec::new("python"), Spec::default());
    for text in [
        "",
        "python",
        "{\"image\":\"ghcr.io/acme/agent-sandbox:v1.2.3\"}",
    ] {
        let json = serde_json::to_string(&Spec::new(text)).unwrap();
        assert_eq!(json, serde_json::to_string(text).unwrap());
        let back: Spec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.as_str(), text);
        assert_eq!(back, Spec::new(text));
    }
}

#[test]
fn a_key_record_is_empty_only_when_it_keeps_nothing() {
    assert!(KeyRecord::default().is_empty());
    let warm = KeyRecord {
        warm: Some(SandboxId(7)),
        ..KeyRecord::default()
    };
    assert!(!warm.is_empty());
    let snapshot = KeyRecord {
        snapshot: Some(RecordedSnapshot {
            snapshot: Snapshot::new("snap-1"),
            by: SandboxId(7),
            retain_until: None,
        }),
        ..KeyRecord::default()
    };
    assert!(!snapshot.is_empty());
}

#[test]
fn the_checker_names_what_a_broken_state_breaks() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let t = Instant::ZERO;
    core.acquire(
        t,
        CallSpec::new(CallId::new("c").unwrap(), SessionId::new("s").unwrap()),
    )
    .unwrap();
    assert_eq!(core.check_invariants(), Ok(()));

    // A state read back from a trace whose key count was tampered with.
    let mut state: serde_json::Value = serde_json::to_value(&core).unwrap();
    // The slot of key session:s, the first place of the key table (place 0 is its sentinel).
    assert_eq!(state["keys"]["records"][1]["value"]["key"], "session:s");
    state["keys"]["records"][1]["value"]["bound"] = serde_json::json!(2);
    let broken: Lifecycle = serde_json::from_value(state).unwrap();
    let violation = broken.check_invariants().unwrap_err();
    assert_eq!(violation.invariant, "key-counts");
    assert_eq!(
        violation.to_string(),
        format!("invariant key-counts broken: {}", violation.detail)
    );
    assert!(violation.detail.contains("session:s"), "{violation}");
}

#[test]
fn a_short_rejected_name_is_shown_whole() {
    let e = SessionId::new("bad name").unwrap_err();
    assert_eq!(e.name, "bad name");
}

#[test]
fn a_long_rejected_name_is_shown_cut_to_200_bytes() {
    let long = "a".repeat(250);
    let e = SessionId::new(&long).unwrap_err();
    assert_eq!(e.name, "a".repeat(200));
    // Exactly 200 bytes: shown whole (still too long to be a name).
    let e = SessionId::new("b".repeat(200)).unwrap_err();
    assert_eq!(e.name.len(), 200);
}

#[test]
fn the_cut_never_splits_a_character() {
    // 199 ASCII bytes, then a two-byte character across the 200-byte mark.
    let name = format!("{}é{}", "a".repeat(199), "b".repeat(100));
    let e = CallId::new(&name).unwrap_err();
    assert_eq!(e.name, "a".repeat(199));
}

// ----------------------------------------------------------------------------------------------
// Serde

/// Every input, command and event survives a JSON round trip.
#[test]
fn inputs_commands_and_events_round_trip() {
    let mut h = Script::default_config();
    h.try_acquire(
        spec("a", "s")
            .with_user(user("u"))
            .with_spec(Spec::new("img")),
    )
    .unwrap();
    let x = h.started();
    h.start_ok(x);
    h.flush("s", &log(), "payload \u{0} bytes");
    let u = h.take_upload().upload;
    h.upload_failed(u, UploadFailure::Transient);
    h.hold("s").unwrap();
    h.release("a");
    h.unhold("s").unwrap();
    h.advance(secs(1));
    h.advance(secs(3));
    h.stop_ok(x, Some("snap"));
    h.persist_failed(x);
    h.shutdown_failed(x);
    h.acquire("b", "s");
    h.advance(secs(1));
    h.try_acquire(spec("e", "s").with_external(external("ext")))
        .unwrap();
    let ext = h.core.call_status(&call("e")).unwrap();
    let CallStatus::Ready(xe) = ext else { panic!() };
    h.died(xe);
    h.close(secs(1)).unwrap();
    h.advance(secs(100));
    h.take_commands();
    h.take_events();
    let mut commands = std::collections::BTreeSet::new();
    for c in &h.all_commands {
        let json = serde_json::to_string(c).unwrap();
        commands.insert(json.split('"').nth(3).unwrap().to_string());
        assert_eq!(&serde_json::from_str::<Command>(&json).unwrap(), c);
    }
    let mut events = std::collections::BTreeSet::new();
    for e in &h.all_events {
        let json = serde_json::to_string(e).unwrap();
        events.insert(json.split('"').nth(3).unwrap().to_string());
        assert_eq!(&serde_json::from_str::<Event>(&json).unwrap(), e);
    }
    let mut inputs = std::collections::BTreeSet::new();
    for (at, i) in &h.trace {
        let json = serde_json::to_string(&(at, i)).unwrap();
        inputs.insert(
            serde_json::to_value(i).unwrap()["input"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        assert_eq!(
            &serde_json::from_str::<(Instant, Input)>(&json).unwrap(),
            &(*at, i.clone())
        );
    }
    // The round trips covered most kinds (the rest are covered elsewhere).
    assert!(commands.len() >= 6, "{commands:?}");
    assert!(events.len() >= 7, "{events:?}");
    assert!(inputs.len() >= 12, "{inputs:?}");
}

/// Every variant of `Input`, `Command` and `Event`, made by hand, survives a JSON round trip.
#[test]
fn every_variant_round_trips() {
    fn round_trip<T>(values: &[T])
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        for v in values {
            let json = serde_json::to_string(v).unwrap();
            assert_eq!(&serde_json::from_str::<T>(&json).unwrap(), v, "{json}");
        }
    }
    let x = SandboxId(7);
    let u = UploadId(3);
    let payload = Payload::new(vec![0u8, 1, 255]);
    round_trip(&[
        Input::Acquire(
            spec("a", "s")
                .with_user(user("u"))
                .with_external(external("e"))
                .with_spec(Spec::new("img")),
        ),
        Input::Release {
            call: call("a"),
            way: None,
        },
        Input::Flush {
            session: session("s"),
            path: log(),
            payload: payload.clone(),
        },
        Input::Hold {
            session: session("s"),
        },
        Input::Unhold {
            session: session("s"),
        },
        Input::Close { deadline: ms(1500) },
        Input::StartOk { sandbox: x },
        Input::StartFailed { sandbox: x },
        Input::UploadOk { upload: u },
        Input::UploadFailed {
            upload: u,
            failure: UploadFailure::Transient,
        },
        Input::UploadFailed {
            upload: u,
            failure: UploadFailure::Gone,
        },
        Input::StopOk {
            sandbox: x,
            snapshot: Some(snap("z")),
        },
        Input::StopOk {
            sandbox: x,
            snapshot: None,
        },
        Input::StopFailed { sandbox: x },
        Input::PersistOk { sandbox: x },
        Input::PersistFailed { sandbox: x },
        Input::ShutdownOk { sandbox: x },
        Input::ShutdownFailed { sandbox: x },
        Input::Died { sandbox: x },
        Input::Timeout,
    ]);
    let keys = [
        Key::Call(call("c")),
        Key::Session(session("s")),
        Key::User(user("u")),
        Key::Agent,
        Key::Global,
        Key::External(external("e")),
    ];
    round_trip(&keys);
    let mut commands: Vec<Command> = keys
        .iter()
        .map(|key| Command::Start {
            sandbox: x,
            key: key.clone(),
            spec: Spec::new("spec"),
            resume_from: Some(snap("r")),
            resumes: Some(SandboxId(0)),
            deadline: Instant::from_millis(1500),
            token: None,
        })
        .collect();
    commands.extend([
        Command::Upload {
            upload: u,
            sandbox: x,
            session: session("s"),
            path: log(),
            version: Version(2),
            payload,
            deadline: Instant::from_millis(2500),
            token: None,
        },
        Command::CancelUpload {
            upload: u,
            sandbox: x,
        },
        drain(x, &["s", "t"]),
        stop(x),
        stop_to_suspend(x),
        persist(x, Some("p")),
        persist(x, None),
        persist_to_suspend(x, Some("p")),
        shutdown(x),
        abandon(x),
    ]);
    round_trip(&commands);
    let mut events = vec![
        ready("a", x),
        failed("a", ErrorKind::WaitTimeout),
        released("a"),
        revoked("a"),
        lost("a", x),
        uploaded("s", &log(), 1, x),
        superseded("s", &log(), 1, 2),
        mirror_settled("s"),
        unconfirmed(x),
        Event::Closed {
            report: Box::new(CloseReport {
                revoked_calls: vec![call("a")],
                refused_waiters: vec![call("b")],
                dropped_versions: vec![(session("s"), log(), Version(1))],
                revoked_holds: vec![(session("s"), 2)],
                shut_down: 3,
                suspended: vec![x],
                unconfirmed: vec![SandboxId(8)],
                retained: vec![],
            }),
        },
    ];
    for reason in [
        DropReason::SandboxGone,
        DropReason::DrainDeadline,
        DropReason::Closed,
        DropReason::NoSandbox,
        DropReason::UploadFailed,
        DropReason::UploadTimeout,
    ] {
        events.push(dropped("s", &log(), 1, reason));
    }
    round_trip(&events);
    // Errors serialise (for traces), with their kind.
    let json = serde_json::to_value(Error::QueueFull {
        key: Key::Agent,
        max: 2,
    })
    .unwrap();
    assert_eq!(json["QueueFull"]["key"], "agent");
}

/// The whole core survives a JSON round trip mid-run: the copy continues exactly as the
/// original (same commands, events, answers, timers and state).
#[test]
fn lifecycle_round_trip_continues_identically() {
    let mut h = Script::with(|c| {
        c.release = ReleasePolicy::KeepWarm { idle: secs(10) };
        c.same_key = SameKey::Serialize;
    });
    let x = h.ready_call("a", "s");
    h.acquire("q", "s");
    h.flush("s", &log(), "v1");
    let u1 = h.take_upload().upload;
    h.flush("s", &log(), "v2");
    h.hold("s").unwrap();
    h.acquire("b", "t");
    let y = h.started();
    h.wait(ms(700));
    h.take_events();

    let json = serde_json::to_string(&h.core).unwrap();
    let copy: Lifecycle = serde_json::from_str(&json).unwrap();
    copy.check_invariants().unwrap();
    let mut twin = h.twin(copy);
    assert_eq!(
        serde_json::to_value(&h.core).unwrap(),
        serde_json::to_value(&twin.core).unwrap()
    );

    let rest = vec![
        (ms(0), Input::UploadOk { upload: u1 }),
        (ms(10), Input::StartOk { sandbox: y }),
        (
            ms(10),
            Input::Release {
                call: call("a"),
                way: None,
            },
        ),
        (
            ms(10),
            Input::Unhold {
                session: session("s"),
            },
        ),
        (ms(5000), Input::Timeout),
        (
            ms(0),
            Input::Release {
                call: call("q"),
                way: None,
            },
        ),
        (
            ms(0),
            Input::Release {
                call: call("b"),
                way: None,
            },
        ),
        (
            ms(0),
            Input::Release {
                call: call("b"),
                way: None,
            },
        ),
        (ms(20_000), Input::Timeout),
        (ms(0), Input::Close { deadline: secs(1) }),
        (
            ms(0),
            Input::StopOk {
                sandbox: x,
                snapshot: Some(snap("z")),
            },
        ),
        (
            ms(0),
            Input::StopOk {
                sandbox: y,
                snapshot: None,
            },
        ),
    ];
    for (d, input) in rest {
        h.wait(d);
        twin.wait(d);
        let a = h.input(input.clone());
        let b = twin.input(input.clone());
        assert_eq!(a, b, "{input:?}");
        assert_eq!(h.take_commands(), twin.take_commands(), "{input:?}");
        assert_eq!(h.take_events(), twin.take_events(), "{input:?}");
        assert_eq!(h.core.poll_timeout(), twin.core.poll_timeout());
        assert_eq!(h.resolve("s"), twin.resolve("s"));
        assert_eq!(h.core.stats(), twin.core.stats());
        assert_eq!(
            serde_json::to_value(&h.core).unwrap(),
            serde_json::to_value(&twin.core).unwrap()
        );
    }
    assert!(h.all_commands.len() > 8);
}
