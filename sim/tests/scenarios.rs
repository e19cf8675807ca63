//! Every scenario under `sim/scenarios/` passes; scenarios with wrong expectations fail; bad
//! scenario text gives line-numbered errors.

use std::path::Path;

use sim::scenario::{parse, run_scenario, Verdict};

mod common;
use common::{
    assert_expectation_fails_at, assert_malformed, assert_prints_back, file_names, run_text,
};

#[test]
fn every_scenario_in_the_corpus_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("scenarios dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "scn"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 13,
        "expected a scenario per race, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable");
        let verdict = match parse(&text) {
            Ok(s) => run_scenario(&s, None),
            Err(e) => {
                failures.push(format!("{}: malformed: {e}", f.display()));
                continue;
            }
        };
        if verdict != Verdict::Pass {
            failures.push(format!("{}: {verdict:?}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_race_has_a_scenario() {
    let names = file_names("scenarios");
    for n in 1..=13 {
        let prefix = format!("r{n:02}-");
        assert!(
            names.iter().any(|f| f.starts_with(&prefix)),
            "no scenario for R{n}"
        );
    }
}

#[test]
fn a_wrong_expectation_fails_at_its_line() {
    let text = "config scope=session\nacquire a session=s1\nstart-ok @a\nexpect waiting a\n";
    assert_expectation_fails_at(text, 4);
}

#[test]
fn a_wrong_resolve_expectation_fails() {
    let text = "acquire a session=s1\nstart-ok @a\nacquire b session=s2\nstart-ok @b\nresolve s1 expect=@b\n";
    assert!(matches!(run_text(text), Verdict::Fail { line: 5, .. }));
}

#[test]
fn answering_a_command_never_ordered_is_an_error_of_the_scenario() {
    let text = "acquire a session=s1\nstart-ok @a\nstart-ok @a\n";
    assert!(matches!(run_text(text), Verdict::Misuse { line: 3, .. }));
    let text = "acquire a session=s1\nupload-ok @a\n";
    assert!(matches!(run_text(text), Verdict::Misuse { line: 2, .. }));
    let text = "release a\nstart-ok @a\n";
    assert!(matches!(run_text(text), Verdict::Misuse { line: 2, .. }));
}

#[test]
fn liveness_after_the_last_line_requires_settled_versions_and_no_waiting_call() {
    // Settling answers the start and the upload: passes.
    assert_eq!(run_text("acquire a session=s1\nflush s1\n"), Verdict::Pass);
    // A call that waits forever behind a live one fails liveness? No: it times out (failed).
    let text = "config same-key=serialize scope=agent wait-timeout=1s\nacquire a session=s1\nacquire b session=s2\n";
    assert_eq!(run_text(text), Verdict::Pass);
}

#[test]
fn malformed_lines_are_named() {
    let cases: &[(&str, usize, &str)] = &[
        ("acquire a\n", 1, "session"),
        ("# c\n\nfrobnicate x\n", 3, "unknown step"),
        (
            "acquire a session=s1\nconfig scope=call\n",
            2,
            "before the first step",
        ),
        ("config scope=galaxy\n", 1, "scope"),
        ("config release=keep-warm:5\n", 1, "duration"),
        ("advance 5m\n", 1, "duration"),
        ("advance\n", 1, "duration"),
        ("start-ok a\n", 1, "@<call>"),
        ("acquire a/b session=s1\n", 1, "invalid call name"),
        ("acquire a session=s1 colour=red\n", 1, "unknown key"),
        ("acquire a session=s1 session=s2\n", 1, "twice"),
        ("expect failed a error=bogus\n", 1, "unknown kind"),
        ("expect uploaded s1 into=@a\n", 1, "version"),
        ("expect nothing\n", 1, "unknown expectation"),
        ("resolve s1\n", 1, "expect="),
        ("resolve s1 expect=maybe\n", 1, "expect="),
        ("upload-fail @a soon\n", 1, "gone"),
        ("release a b\n", 1, "unexpected word"),
        ("config drain=0ms\n", 1, "invalid configuration"),
        ("flush s1 bytes=lots\n", 1, "integer"),
    ];
    for (text, line, needle) in cases {
        let err = assert_malformed(text, *line, needle);
        assert!(err.to_string().starts_with(&format!("line {line}:")));
    }
}

/// A name that fits the grammar but that the core refuses is a rejected input, not a malformed
/// line: `expect failed` (acquire) and `expect error` (other steps) check it, and nothing
/// changes.
#[test]
fn names_the_core_refuses_are_rejected_steps() {
    let long = "n".repeat(sandkeeper::MAX_NAME_LEN + 1);
    let text = format!(
        "acquire .. session=s1\nexpect failed .. error=invalid-name\n\
acquire a session=.\nexpect failed a error=invalid-name\n\
acquire b session=s1 user={long}\nexpect failed b error=invalid-name\n\
flush ..\nexpect error invalid-name\nflush s1 path=..\nexpect error invalid-name\n\
release ..\nexpect error invalid-name\nhold .\nexpect error invalid-name\n\
resolve .. expect=none\nexpect error invalid-name\n\
acquire a session=s1\nstart-ok @a\nexpect ready a\n"
    );
    let s = parse(&text).expect("refused names are not malformed lines");
    assert!(s
        .steps
        .iter()
        .any(|(_, st)| matches!(st, sim::step::Step::Refused { .. })));
    assert_eq!(run_text(&text), Verdict::Pass);
    // The expectation is checked, not assumed: a refused acquire did not fail otherwise.
    let wrong = "acquire a session=..\nexpect failed a error=queue-full\n";
    assert!(
        matches!(run_text(wrong), Verdict::Fail { line: 2, .. }),
        "{:?}",
        run_text(wrong)
    );
    let wrong = "flush ..\nexpect error closed\n";
    assert!(matches!(run_text(wrong), Verdict::Fail { line: 2, .. }));
}

#[test]
fn steps_print_back_as_the_lines_they_came_from() {
    let text = "config scope=session\nacquire a session=s1 user=u1 external=e1\nrelease a\nflush s1 path=p bytes=3\n\
resolve s1 expect=@a\nhold s1\nunhold s1\nclose deadline=2s\nadvance 250ms\nstop-ok @a snapshot=x\nupload-fail @a gone\n\
settle @a\nexpect uploaded s1 path=p version=2 into=@a\nexpect dropped s1 version=1 reason=superseded\nexpect resumed @a from=x\n";
    assert_prints_back(&parse(text).expect("parses"), Vec::new());
}

#[test]
fn every_race_has_a_canary_patch() {
    let names = file_names("canaries");
    assert!(names.iter().any(|n| n == "run.sh"));
    for n in 1..=13 {
        let prefix = format!("r{n:02}-");
        assert!(
            names
                .iter()
                .any(|f| f.starts_with(&prefix) && f.ends_with(".patch")),
            "no canary for R{n}"
        );
    }
}
