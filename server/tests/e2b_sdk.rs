//! The official Python `e2b` SDK, unmodified, against the binary: create, commands with
//! streamed output, files, pause and resume, timeouts into pause, another team's sandbox, a bad
//! key, kill (`py/e2b_smoke.py`); and the README's Python block, as it is written there.
//!
//! The SDK is installed from PyPI into a venv under the target directory, once (reused while
//! it holds the pinned version). When it cannot be installed the test fails, saying so: it is
//! never skipped.

mod common;

use std::path::Path;

use common::{run_sdk_script, sdk_python, Server, E2B_VERSION, KEY_B};

#[test]
fn the_unmodified_python_sdk_works_against_sandkeeperd() {
    let server = Server::start(&[]);
    let steps = [
        "create",
        "streamed on_stdout",
        "files.write/read",
        "commands see the workspace at /home/user",
        "files.list",
        "entry details: mode, permissions, owner, time, symlink target",
        "another team: NotFound",
        "bad key: AuthenticationException",
        "pause, connect resumes it with its files",
        "timeout expires into pause, resumes, expires again, resumes again",
        "kill of a paused sandbox",
        "kill",
        "async: create, streamed run, files, kill",
    ];
    let stdout = run_sdk_script(
        300,
        &server.url,
        "e2b_smoke.py",
        &[("OTHER_TEAM_KEY", KEY_B)],
        &steps,
    );
    assert!(stdout.contains(&format!("e2b {E2B_VERSION}")), "{stdout}");
}

/// The README's Python block (between its `readme-e2b` markers), run as it is written: it
/// creates, runs a command, pauses and resumes, and prints what it says it prints.
#[test]
fn the_readmes_python_block_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("the README");
    let block = readme
        .split("<!-- readme-e2b-begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- readme-e2b-end -->").next())
        .expect("the README's readme-e2b markers");
    let code = block
        .trim()
        .strip_prefix("```python")
        .and_then(|c| c.strip_suffix("```"))
        .expect("a python block between the markers");
    assert_eq!(
        code.trim().lines().count(),
        5,
        "the README promises five lines"
    );
    let server = Server::start(&[]);
    let out = sdk_python(120, &server.url)
        .args(["-c", code])
        .output()
        .expect("run the README's block");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the README's block failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "hello\n\nkept across the pause\n");
}
