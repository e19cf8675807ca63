//! A command's standard input through the official Python `e2b` SDK, unmodified, against the
//! binary (`py/e2b_stdin.py`): `cat` started in the background with `stdin=True` echoes what
//! `send_stdin` (and `stream_input`) sent, in order, and ends at `close_stdin`; an unknown pid raises the SDK's
//! `NotFoundException`; a command started without stdin, or one that ended, refuses input.
//!
//! The SDK's venv is the one `e2b_sdk.rs` uses (`common::venv_python`): when it cannot be
//! installed the test fails, saying so; it is never skipped.

mod common;

use common::{run_sdk_script, Server};

#[test]
fn the_python_sdk_feeds_and_closes_a_commands_stdin() {
    let server = Server::start(&[]);
    let steps = [
        "stdin: send_stdin twice, close_stdin, wait",
        "stdin: stream_input in pieces, then send_stdin, close_stdin",
        "stdin: an unknown pid raises NotFoundException",
        "stdin: a command started without stdin refuses input",
        "stdin: a command that ended refuses input",
    ];
    run_sdk_script(180, &server.url, "e2b_stdin.py", &[], &steps);
}
