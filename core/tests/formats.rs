//! What people read: ids, names, snapshots, specs and payloads display and debug as documented,
//! and the invariant checker reports a broken state by name.

use sandkeeper::*;

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
