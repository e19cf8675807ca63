//! A main job's process as a test (or a script) drives it: spawned with its standard output read
//! through one buffer, the incarnation line a fleet process prints first, its output once it
//! ended; and the bounded poll with which a test of real processes waits for what they write.
//! A test aid: it panics, saying what went wrong, where a test would fail.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::Duration;

/// A main job's process, its standard output read through one buffer.
pub struct HarnessChild {
    /// The process (to signal, kill or poll).
    pub child: Child,
    out: BufReader<ChildStdout>,
}

impl HarnessChild {
    /// Spawns `cmd` with its standard output and error piped. Panics if it does not start.
    pub fn spawn(mut cmd: Command) -> HarnessChild {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?} does not start: {e}"));
        let out = BufReader::new(child.stdout.take().expect("piped"));
        HarnessChild { child, out }
    }

    /// The incarnation a fleet process prints on its first line
    /// (`fleet replica <name>: incarnation <n>`).
    pub fn incarnation(&mut self) -> u32 {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("its standard output");
        line.trim()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no incarnation line: {line:?}"))
    }

    /// The rest of its standard output and its standard error, once it ended.
    pub fn output(&mut self) -> String {
        let mut stdout = String::new();
        let _ = self.out.read_to_string(&mut stdout);
        let mut stderr = String::new();
        if let Some(err) = self.child.stderr.as_mut() {
            let _ = err.read_to_string(&mut stderr);
        }
        format!("{stdout}\n{stderr}")
    }

    /// The rest of its standard output, once it exited successfully (panics with its output
    /// and error otherwise).
    pub fn succeeded(mut self) -> String {
        let mut stdout = String::new();
        self.out
            .read_to_string(&mut stdout)
            .expect("its standard output");
        let Output { status, stderr, .. } = self.child.wait_with_output().expect("it ends");
        assert!(
            status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&stderr)
        );
        stdout
    }
}

/// Runs `cmd` to its end: its standard output, once it exited successfully (panics with its
/// output and error otherwise). For a main job's one-shot runs (`--verify`, a short workload).
pub fn ran(mut cmd: Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} does not run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The numbers of a printed summary's `fleet` row (panics when it has none).
pub fn fleet_row(summary: &str) -> std::collections::BTreeMap<String, u64> {
    super::Summary::figures_of(summary, "fleet")
        .unwrap_or_else(|| panic!("no fleet row: {summary}"))
}

/// The lines in the file at `path` (0 when it is not there yet): how far a process's ledger got.
pub fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Polls `done` every 5 ms, at most 24,000 times (two minutes), panicking with `what`. Real
/// processes run on the wall clock, so waiting for what they write takes wall time; the poll
/// is bounded and never a fixed sleep standing in for an event.
pub fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..24_000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{what}");
}
