//! Directory watches through the official Python `e2b` SDK, unmodified, against the binary
//! (`py/e2b_watch.py`): `watch_dir` then `files.write` gives a create and a write of the file,
//! named relative to the directory (asked for with `get_new_events` until it is there, within a
//! bound: the server polls); a rewrite of another size a write, a remove a remove; a recursive
//! watch sees into subdirectories, one that is not does not; a missing directory raises
//! `NotFoundException`, a file `InvalidArgumentException`; `stop` ends a watch; a watcher id is
//! not found in another sandbox; a pause ends a watch (the resumed sandbox watches anew); a
//! watcher of a killed sandbox ends; the async `watch_dir` streams events to `on_event` and
//! calls `on_exit` when its sandbox is killed.
//!
//! The SDK's venv is the one `e2b_sdk.rs` uses (`common::venv_python`): when it cannot be
//! installed the test fails, saying so; it is never skipped.

mod common;

use common::{run_sdk_script, Server};

#[test]
fn the_python_sdk_watches_a_directory() {
    let server = Server::start(&[]);
    let steps = [
        "watch: a written file is created then written, named relative to the directory",
        "watch: a rewrite of another size is a write",
        "watch: a rewrite of the same size is a write, a chmod a chmod",
        "watch: a removed file is removed",
        "watch: events asked for right after the change are there",
        "watch: a watch that is not recursive does not see into a subdirectory",
        "watch: stop ends the watch",
        "watch: a recursive watch sees files in subdirectories, old and new",
        "watch: a missing directory raises NotFoundException",
        "watch: a file raises InvalidArgumentException",
        "watch: a pause ends a watch, and the resumed sandbox watches anew",
        "watch: a watcher id is not found in another sandbox",
        "watch: a watcher of a killed sandbox ends",
        "watch: async watch_dir streams the create and the remove to on_event",
        "watch: an async watch of a killed sandbox ends (on_exit)",
    ];
    run_sdk_script(240, &server.url, "e2b_watch.py", &[], &steps);
}
