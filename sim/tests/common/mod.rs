//! What the scenario tests share: running a scenario's text, the files of one of the crate's
//! folders, and the checks of a line-numbered error, a failed expectation and steps that print
//! back as their lines. A failed check names the test's line (`track_caller`).

use std::path::Path;

use sim::scenario::{parse, run_scenario, ParseError, Scenario, Verdict};

/// Parses `text`, which must parse, and runs it.
#[track_caller]
pub fn run_text(text: &str) -> Verdict {
    let scenario = parse(text).expect("parses");
    run_scenario(&scenario, None)
}

/// The names of the files in the crate's folder `dir` (`scenarios`, `canaries`).
#[track_caller]
pub fn file_names(dir: &str) -> Vec<String> {
    std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
        .unwrap_or_else(|e| panic!("{dir} dir: {e}"))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// The error `text` gave, at `got` with `message`, is at `line` and mentions `needle`.
#[track_caller]
pub fn assert_error_at(text: &str, got: usize, message: &str, line: usize, needle: &str) {
    assert_eq!(got, line, "{text:?}: {message}");
    assert!(
        message.contains(needle),
        "{text:?}: `{message}` does not mention `{needle}`"
    );
}

/// `text` does not parse: the error is at `line` and mentions `needle`. Returns it.
#[track_caller]
pub fn assert_malformed(text: &str, line: usize, needle: &str) -> ParseError {
    let err = parse(text).expect_err(text);
    assert_error_at(text, err.line, &err.message, line, needle);
    err
}

/// `text` runs to a failed expectation at `line`.
#[track_caller]
pub fn assert_expectation_fails_at(text: &str, line: usize) {
    match run_text(text) {
        Verdict::Fail { line: got, failure } => {
            assert_eq!(got, line);
            assert_eq!(failure.invariant, "expectation");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// The lines `head` (a header, or nothing) and `s`'s steps as they print parse again to the same
/// steps. Returns what they parse to, for the caller to compare the header.
#[track_caller]
pub fn assert_prints_back(s: &Scenario, head: Vec<String>) -> Scenario {
    let mut back = head;
    back.extend(s.steps.iter().map(|(_, st)| st.to_string()));
    let again = parse(&back.join("\n")).expect("reparses");
    assert_eq!(
        s.steps.iter().map(|(_, s)| s).collect::<Vec<_>>(),
        again.steps.iter().map(|(_, s)| s).collect::<Vec<_>>()
    );
    again
}
