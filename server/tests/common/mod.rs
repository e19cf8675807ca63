//! The server binary as the tests run it: started on a free port with a fresh root, killed on
//! drop.

#![allow(dead_code)] // each test file uses a part of it

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Team A's key, and team B's.
pub const KEY_A: &str = "key-of-team-a";
pub const KEY_B: &str = "key-of-team-b";

/// A running `sandkeeperd`.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    root: tempfile::TempDir,
}

impl Server {
    /// Starts it with two teams (a, b) and the extra flags.
    pub fn start(extra: &[&str]) -> Server {
        let root = tempfile::tempdir().expect("a temporary root");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandkeeperd"))
            .args(["--listen", "127.0.0.1:0", "--root"])
            .arg(root.path())
            .args(["--api-key", &format!("team-a:{KEY_A}")])
            .args(["--api-key", &format!("team-b:{KEY_B}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sandkeeperd");
        // The first line names the address once it listens; EOF (it died) ends the read.
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        let url = line
            .trim()
            .strip_prefix("sandkeeperd listening on ")
            .unwrap_or_else(|| panic!("sandkeeperd did not start: {line:?}"))
            .to_string();
        Server { child, url, root }
    }

    /// Sends SIGTERM and waits, up to `secs` seconds, for the exit: its status, or `None`.
    pub fn terminate(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        // A bounded poll of a real process's exit: every 50 ms up to `secs`.
        for _ in 0..secs * 20 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    /// The local backend's root.
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
