//! A command's standard input through the official Python `e2b` SDK, unmodified, against the
//! binary (`py/e2b_stdin.py`): `cat` started in the background with `stdin=True` echoes what
//! `send_stdin` (and `stream_input`) sent, in order, and ends at `close_stdin`; an unknown pid raises the SDK's
//! `NotFoundException`; a command started without stdin, or one that ended, refuses input.
//!
//! The SDK's venv is the one `e2b_sdk.rs` uses (`common::venv_python`): when it cannot be
//! installed the test fails, saying so; it is never skipped.

mod common;

use std::path::Path;

use common::{sdk_python, Server};

#[test]
fn the_python_sdk_feeds_and_closes_a_commands_stdin() {
    let server = Server::start(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/e2b_stdin.py");
    let out = sdk_python(180, &server.url)
        .arg(&script)
        .output()
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for step in [
        "stdin: send_stdin twice, close_stdin, wait",
        "stdin: stream_input in pieces, then send_stdin, close_stdin",
        "stdin: an unknown pid raises NotFoundException",
        "stdin: a command started without stdin refuses input",
        "stdin: a command that ended refuses input",
    ] {
        assert!(
            stdout.contains(&format!("ok {step}")),
            "step {step:?} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("all steps passed"), "{stdout}");
}
