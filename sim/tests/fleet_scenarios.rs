//! Fleet scenarios: a `fleet` line, steps that name their replica (`[r0] ...`), the store's and
//! the backend's answers, the replicas' fate. Bad fleet lines are line-numbered errors; steps
//! the world cannot take as written are errors of the scenario at their line; expectations are
//! checked, not assumed; steps print back as the lines they came from.

use std::path::Path;

use sim::scenario::{config_line, fleet_line_text, parse, run_scenario, Verdict};

mod common;
use common::{
    assert_error_at, assert_expectation_fails_at, assert_malformed, assert_prints_back, file_names,
    run_text,
};

#[test]
fn the_fleet_behaviours_have_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let names = file_names("scenarios");
    for pinned in [
        "fleet-handoff-warm.scn",
        "fleet-crash-adopt.scn",
        "fleet-crash-resume.scn",
        "fleet-lapse-fences.scn",
        "fleet-backend-refuses-old-token.scn",
    ] {
        assert!(names.iter().any(|n| n == pinned), "no {pinned}");
        let text = std::fs::read_to_string(dir.join(pinned)).expect("readable");
        let scenario = parse(&text).expect("parses");
        assert!(scenario.fleet.is_some(), "{pinned} declares no fleet");
    }
}

#[test]
fn malformed_fleet_lines_are_named() {
    let cases: &[(&str, usize, &str)] = &[
        ("[r0] acquire a session=s1\n", 1, "no fleet"),
        (
            "fleet replicas=2\n[r2] acquire a session=s1\n",
            2,
            "unknown replica r2",
        ),
        (
            "fleet replicas=2\n[rx] acquire a session=s1\n",
            2,
            "invalid replica",
        ),
        ("fleet replicas=2\n[r0]\n", 2, "expected a step"),
        (
            "fleet replicas=2\nacquire a session=s1\n",
            2,
            "on one replica",
        ),
        ("fleet replicas=2\nstart-ok @a\n", 2, "on one replica"),
        ("fleet replicas=2\n[r0] advance 1s\n", 2, "whole fleet"),
        ("fleet replicas=2\n[r0] frobnicate\n", 2, "unknown step"),
        ("fleet replicas=2\nfrobnicate\n", 2, "unknown step"),
        ("fleet replicas=2\n[r0] claimed\n", 2, "key"),
        (
            "fleet replicas=2\n[r0] claimed call:c1\n",
            2,
            "never a fleet key",
        ),
        (
            "fleet replicas=2\n[r0] recorded session:a/b\n",
            2,
            "invalid session name",
        ),
        ("fleet replicas=2\n[r0] renewed id=x\n", 2, "integer"),
        (
            "fleet replicas=2 drift=1,2,3\n",
            1,
            "3 clocks for 2 replicas",
        ),
        ("fleet replicas=2 drift=fast,0\n", 1, "invalid drift"),
        ("fleet replicas=0\n", 1, "1 to 64"),
        ("fleet lease=5s\n", 1, "replicas="),
        (
            "fleet replicas=2 lease=2s margin=2s\n",
            1,
            "invalid fleet timing",
        ),
        ("fleet replicas=2 store=sideways\n", 1, "store link"),
        ("fleet replicas=2 colour=red\n", 1, "unknown key"),
        ("fleet replicas=2\n[r0] store sideways\n", 2, "store link"),
        (
            "fleet replicas=2\nexpect owner session:s1 r5\n",
            2,
            "unknown replica r5",
        ),
        (
            "fleet replicas=2\nexpect owner session:s1 someone\n",
            2,
            "invalid owner",
        ),
        ("fleet replicas=2\nexpect ready a\n", 2, "about one replica"),
        (
            "fleet replicas=2\n[r0] expect owner session:s1 r0\n",
            2,
            "about the store",
        ),
        (
            "fleet replicas=2\n[r0] expect fenced session:s1 reason=bored\n",
            2,
            "reason",
        ),
        (
            "fleet replicas=2\n[r0] expect token session:s1 many\n",
            2,
            "integer",
        ),
        (
            "fleet replicas=2\n[r0] start-ok @a after=5\n",
            2,
            "duration",
        ),
        (
            "fleet replicas=2\n[r0] start-ok @a after=5s after=1s\n",
            2,
            "twice",
        ),
        ("fleet replicas=2\n[r0] fenced a\n", 2, "@<call>"),
        ("fleet replicas=2\n[r0] instance-gone a\n", 2, "@<call>"),
        (
            "fleet replicas=2\n[r0] restart drift=fast\n",
            2,
            "invalid drift",
        ),
        ("fleet replicas=2\n[r0] pause\n", 2, "duration"),
        ("fleet replicas=2\n[r0] crash now\n", 2, "unexpected word"),
        (
            "acquire a session=s1\nfleet replicas=2\n",
            2,
            "before the first step",
        ),
        ("fleet replicas=2\nfleet replicas=2\n", 2, "twice"),
        (
            "fleet replicas=2\n[r0] config scope=user\n",
            2,
            "whole fleet",
        ),
        ("fleet replicas=2 events=sometimes\n", 1, "on-advance"),
        ("fleet replicas=2 backend-fencing=maybe\n", 1, "on or off"),
        ("fleet replicas=2 calm-after=soon\n", 1, "duration"),
        ("fleet replicas=2\n[r0] renewed run=first\n", 2, "integer"),
        (
            "fleet replicas=2\n[r0] fenced @a sideways\n",
            2,
            "refused command",
        ),
        ("fleet replicas=2\nadvance 5ps\n", 2, "duration"),
        ("fleet replicas=2\nadvance 5s at-target=all\n", 2, "integer"),
        // Finer than a millisecond only in a fleet.
        ("advance 5ns\n", 1, "duration"),
    ];
    for (text, line, needle) in cases {
        assert_malformed(text, *line, needle);
    }
}

#[test]
fn a_file_without_a_fleet_line_keeps_its_meaning() {
    // Fleet words are unknown steps in one process, as before.
    for verb in [
        "crash",
        "pause 1s",
        "claimed session:s1",
        "sweep",
        "fenced @a",
    ] {
        let err = parse(&format!("{verb}\n")).expect_err(verb);
        assert!(err.message.contains("unknown step"), "{verb}: {err}");
    }
    let s = parse("acquire a session=s1\nstart-ok @a\n").expect("parses");
    assert!(s.fleet.is_none());
    assert_eq!(
        run_text("acquire a session=s1\nstart-ok @a\n"),
        Verdict::Pass
    );
}

/// Steps the world cannot take as written are errors of the scenario, at their line.
#[test]
fn impossible_steps_are_errors_of_the_scenario() {
    let head = "config scope=session release=keep-warm:30s\nfleet replicas=2\n";
    let cases: &[(&str, usize, &str)] = &[
        // r1 ordered nothing for a's sandbox.
        (
            "[r0] acquire a session=s1\n[r1] start-ok @a\n",
            4,
            "ordered no",
        ),
        // Nobody acquired z.
        ("[r0] start-ok @z\n", 3, "no replica acquired z"),
        // A call's name is the fleet's.
        (
            "[r0] acquire a session=s1\n[r1] acquire a session=s2\n",
            4,
            "acquired on r0",
        ),
        // The backend has seen no newer token: it would not refuse.
        ("[r0] acquire a session=s1\n[r0] fenced @a\n", 4, "accepts"),
        // A crashed replica takes no input; only a crashed one restarts.
        ("[r0] crash\n[r0] acquire a session=s1\n", 4, "crashed"),
        ("[r0] restart\n", 3, "did not crash"),
        ("[r0] pause 5s\n[r0] flush s1\n", 4, "paused"),
        // r0 started once: there is no third run of it.
        (
            "[r0] acquire a session=s1\n[r0] start-ok @a run=2\n",
            4,
            "run=0 is its first",
        ),
        // With the store link `auto`, nothing waits for a store answer.
        (
            "[r0] acquire a session=s1\n[r0] claimed session:s1\n",
            4,
            "no claim",
        ),
        // Time runs event by event: an hour at a time at most.
        ("advance 2h\n", 3, "duration"),
        ("advance 7200s\n", 3, "longest"),
    ];
    for (steps, line, needle) in cases {
        let text = format!("{head}{steps}");
        match parse(&text) {
            Err(e) => assert_error_at(&text, e.line, &e.message, *line, needle),
            Ok(s) => match run_scenario(&s, None) {
                Verdict::Misuse { line: l, message } => {
                    assert_error_at(&text, l, &message, *line, needle)
                }
                other => panic!("{text:?}: expected an error of the scenario, got {other:?}"),
            },
        }
    }
}

#[test]
fn a_wrong_fleet_expectation_fails_at_its_line() {
    let text = "config scope=session\nfleet replicas=2\n[r0] acquire a session=s1\n\
                [r0] start-ok @a\nexpect owner session:s1 r1\n";
    assert_expectation_fails_at(text, 5);
    let text = "config scope=session\nfleet replicas=2\n[r0] acquire a session=s1\n\
                [r0] start-ok @a\n[r1] expect ready a\n";
    assert!(matches!(run_text(text), Verdict::Fail { line: 5, .. }));
}

/// With the store link `hold`, every piece of store work waits for its answer; an answer the
/// store would not give is an error of the scenario, and changes nothing.
#[test]
fn held_store_work_is_answered_by_its_steps() {
    let text = "config scope=session release=shutdown\n\
                fleet replicas=2 store=hold\n\
                [r0] renewed\n\
                [r1] renewed id=0\n\
                [r0] acquire a session=s1\n\
                [r0] expect waiting a\n\
                [r0] claimed session:s1 after=20ms\n\
                [r0] expect waiting a\n\
                advance 20ms\n\
                [r0] start-ok @a\n\
                [r0] expect waiting a\n\
                [r0] recorded session:s1\n\
                [r0] expect ready a\n\
                expect record session:s1 warm=@a\n\
                [r1] acquire b session=s1\n\
                [r1] claim-busy session:s1\n\
                [r0] release a\n\
                [r0] stop-ok @a snapshot=snap1\n\
                [r0] persist-ok @a\n\
                expect record session:s1 warm=@a\n\
                [r0] recorded session:s1\n\
                expect record session:s1 warm=none snapshot=snap1\n\
                [r0] shutdown-ok @a\n\
                expect owner session:s1 r0 token=1\n\
                [r0] expect relinquish @a\n";
    let verdict = run_text(text);
    // The sandbox went down, shut down: nothing was relinquished.
    assert!(
        matches!(&verdict, Verdict::Fail { line: 25, .. }),
        "{verdict:?}"
    );
    let text = text.replace("[r0] expect relinquish @a\n", "[r0] expect shutdown @a\n");
    assert_eq!(run_text(&text), Verdict::Pass);
    // The store grants the claim: `claim-busy` is not what it answers.
    let wrong = "config scope=session\nfleet replicas=2 store=hold\n[r0] renewed\n\
                 [r0] acquire a session=s1\n[r0] claim-busy session:s1\n";
    assert!(
        matches!(run_text(wrong), Verdict::Misuse { line: 5, .. }),
        "{:?}",
        run_text(wrong)
    );
    // A store error is always an answer the store may give.
    let failed =
        "config scope=session wait-timeout=2s\nfleet replicas=2 store=hold\n[r0] renewed\n\
                  [r0] acquire a session=s1\n[r0] claim-failed session:s1\n[r0] expect waiting a\n";
    assert_eq!(run_text(failed), Verdict::Pass);
}

#[test]
fn fleet_steps_print_back_as_the_lines_they_came_from() {
    let text = "config scope=session release=keep-warm:30s\n\
                fleet replicas=3 lease=12s renew-every=4s margin=3s claim-retry=250ms drift=0,+20000,-300 store=hold calm-after=60s events=on-advance backend-fencing=off\n\
                [r0] acquire a session=s1 user=u1\n[r0] flush s1 path=p bytes=3\n\
                [r0] start-ok @a after=15ms\n[r0] stop-ok @a snapshot=x after=1s\n\
                [r0] upload-fail @a gone\n[r1] fenced @a\n[r1] fenced @a stop run=0 after=3ms\n[r2] die @a\n\
                [r0] start-ok @a run=2\nadvance 1500ns at-target=2\nadvance 2s at-target=0\nadvance 1500us\n\
                [r0] renewed id=4 after=30ms\n[r1] claimed session:s1\n[r1] claim-busy user:u1 id=2\n\
                [r1] record-failed session:s1 id=3 run=1 after=12ms\n\
                [r2] record-fenced agent\n[r2] released global after=2s\n\
                [r0] store down\n[r1] pause 12s\n[r2] crash\n[r2] restart drift=-5\n[r2] restart\n\
                [r1] sweep\n[r1] settle\n[r1] settle @a\nsettle\nadvance 3s\n\
                [r0] expect lost a\n[r0] expect claim session:s1\n[r0] expect token session:s1 2\n\
                [r0] expect token session:s1 none\n[r0] expect adopt @a\n[r0] expect relinquish @a\n\
                [r0] expect fenced session:s1\n[r0] expect fenced user:u1 reason=refused\n\
                expect owner session:s1 r2 token=3\nexpect owner agent none\n\
                expect record session:s1 warm=@a snapshot=none\nexpect record global\n\
                [r1] expect ready a\n[r0] expect uploaded s1 version=1 into=@a\n";
    let s = parse(text).expect("parses");
    let spec = s.fleet.clone().expect("a fleet");
    let head = vec![
        config_line(&s.config, s.close_deadline),
        fleet_line_text(&spec, &s.config.fleet.expect("timing")),
    ];
    let again = assert_prints_back(&s, head);
    assert_eq!(again.fleet, s.fleet);
    assert_eq!(again.config.fleet, s.config.fleet);
}
