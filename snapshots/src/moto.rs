//! A throwaway S3-compatible server for tests and local trials: moto (`moto[server]` from
//! PyPI) on a free loopback port, started by [`Moto::start`] and killed when dropped. moto
//! comes from the Python found on the path, or from a venv this module makes under the target
//! directory with `pip install 'moto[server]'`. For tests: it panics, saying what is missing,
//! where Python, pip or moto cannot be had. `docs/snapshots.md` says what moto does not model.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server and the bucket a test made in it.
pub struct Moto {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
    /// The bucket made at its start.
    pub bucket: String,
}

impl Moto {
    /// Starts moto and makes the bucket `bucket`.
    pub fn start(bucket: &str) -> Moto {
        let python = python_with_moto();
        let port = free_port();
        let child = Command::new(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting moto with {}: {e}", python.display()));
        let moto = Moto {
            child,
            port,
            bucket: bucket.to_string(),
        };
        moto.wait_until_listening();
        moto.http("PUT", &format!("/{bucket}"));
        moto
    }

    /// The `s3://` URL of `prefix` in the bucket.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// The store options ([`SnapshotsConfig::options`](crate::SnapshotsConfig::options)) for
    /// reaching moto at `port` (moto's own, or a proxy's).
    pub fn options(port: u16) -> Vec<(String, String)> {
        [
            ("endpoint", format!("http://127.0.0.1:{port}")),
            ("allow_http", "true".to_string()),
            ("access_key_id", "test".to_string()),
            ("secret_access_key", "test".to_string()),
            ("region", "us-east-1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The same options as `AWS_*` environment variables, for a process that opens the store
    /// from its URL alone (`ObjectSnapshots::open` reads them).
    pub fn environment(&self) -> Vec<(String, String)> {
        Self::options(self.port)
            .into_iter()
            .map(|(k, v)| (format!("AWS_{}", k.to_uppercase()), v))
            .collect()
    }

    /// Polls until moto accepts a connection. Bounded (60 s): moto imports a large package
    /// before it listens, seconds on a loaded machine, and says nothing when it is ready.
    // A test driver may read the clock: the bound on a real process's start is wall time.
    #[allow(clippy::disallowed_methods)]
    fn wait_until_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One plain HTTP request to moto (no body); panics unless it answers 2xx.
    fn http(&self, method: &str, path: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes()).expect("write to moto");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read from moto");
        assert!(answer.starts_with("HTTP/1.1 2"), "moto answered {answer}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (bound, then released for moto to take).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address").port()
}

/// A Python that imports `moto.server`: the path's `python3`, or a venv under the target
/// directory with moto installed into it.
fn python_with_moto() -> PathBuf {
    let system = PathBuf::from("python3");
    if imports_moto(&system) {
        return system;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let venv = target.join("moto-venv");
    let python = venv.join("bin/python");
    if imports_moto(&python) {
        return python;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap_or_else(|e| panic!("these tests need python3 to run moto, and it is missing: {e}"));
    assert!(made.success(), "python3 -m venv {} failed", venv.display());
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "moto[server]"])
        .status()
        .unwrap_or_else(|e| panic!("these tests need pip to install moto, and it is missing: {e}"));
    assert!(installed.success(), "pip install 'moto[server]' failed");
    assert!(imports_moto(&python), "moto installed but does not import");
    python
}

fn imports_moto(python: &PathBuf) -> bool {
    Command::new(python)
        .args(["-c", "import moto.server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
