//! The server binary as the tests run it: started on a free port with a fresh root, killed on
//! drop.

#![allow(dead_code)] // each test file uses a part of it

pub mod hosts;
pub mod k8s;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

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
    /// Starts it with two teams (a, b) and the extra flags, on the local backend under a fresh
    /// root.
    pub fn start(extra: &[&str]) -> Server {
        let root = tempfile::tempdir().expect("a temporary root");
        let path = root.path().to_str().expect("a UTF-8 root").to_string();
        Self::spawn(root, &[&["--root", &path][..], extra].concat())
    }

    /// Starts it with two teams (a, b) on the backend the flags name (`--kubernetes ...`);
    /// [`root`](Self::root) is then an empty directory, which no flag names.
    pub fn start_on(backend: &[&str]) -> Server {
        Self::spawn(tempfile::tempdir().expect("a temporary dir"), backend)
    }

    /// Starts it as [`start_on`](Self::start_on) does, with the variables `env` set.
    pub fn start_on_env(flags: &[&str], env: &[(String, String)]) -> Server {
        let mut command = Self::command(flags);
        command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::inherit());
        Self::started(tempfile::tempdir().expect("a temporary dir"), command)
    }

    /// Starts it as [`start`](Self::start) does, logging at `filter` (`RUST_LOG`) into `log`.
    pub fn start_logging(filter: &str, log: &Path) -> Server {
        let root = tempfile::tempdir().expect("a temporary root");
        let path = root.path().to_str().expect("a UTF-8 root").to_string();
        let file = std::fs::File::create(log).expect("the log file");
        let mut command = Self::command(&["--root", &path]);
        command.env("RUST_LOG", filter).stderr(file);
        Self::started(root, command)
    }

    fn spawn(root: tempfile::TempDir, flags: &[&str]) -> Server {
        let mut command = Self::command(flags);
        command.stderr(Stdio::inherit());
        Self::started(root, command)
    }

    fn command(flags: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandkeeperd"));
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(flags)
            .args(["--api-key", &format!("team-a:{KEY_A}")])
            .args(["--api-key", &format!("team-b:{KEY_B}")])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped());
        command
    }

    fn started(root: tempfile::TempDir, mut command: Command) -> Server {
        let mut child = command.spawn().expect("start sandkeeperd");
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

    /// Kills it with SIGKILL (no shutdown of any kind) and reaps it.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// Sends the signal `sig` (`-STOP`, `-CONT`, ...) to it.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args([sig, &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill {sig} {pid}");
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

/// The SDK version the survey (`/work/e2b-protocol.md` at the time) was made from.
pub const E2B_VERSION: &str = "2.63.0";

/// Runs `cmd` under `timeout(1)` for at most `secs` seconds.
pub fn bounded(secs: u32, cmd: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(secs.to_string())
        .arg(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", cmd.display()))
}

/// The venv's python, with the pinned SDK installed (once per test binary: its tests share
/// it; cargo runs the binaries one after another, so they share it too).
pub fn venv_python() -> PathBuf {
    static MADE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = MADE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2b-venv");
    let python = venv.join("bin/python");
    let check =
        format!("import importlib.metadata as m; assert m.version('e2b') == '{E2B_VERSION}'");
    if python.exists() && bounded(60, &python, &["-c", &check]).status.success() {
        return python;
    }
    let made = bounded(
        120,
        Path::new("python3"),
        &["-m", "venv", venv.to_str().unwrap()],
    );
    assert!(
        made.status.success(),
        "python3 -m venv failed (install python3-venv): {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let pip = venv.join("bin/pip");
    let spec = format!("e2b=={E2B_VERSION}");
    let installed = bounded(
        600,
        &pip,
        &["install", "-q", "--disable-pip-version-check", &spec],
    );
    assert!(
        installed.status.success(),
        "pip install {spec} failed (PyPI unreachable?); this test needs the real SDK:\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    python
}

/// The entries under a local backend's `root` but its bookkeeping (`.meta`, `.tokens`, an empty
/// `.snapshots`): sandbox directories and kept snapshots.
pub fn left_on_disk(root: &std::path::Path) -> Vec<String> {
    let mut left = Vec::new();
    for entry in std::fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        match name.as_str() {
            ".meta" | ".tokens" => {}
            ".snapshots" => left.extend(
                std::fs::read_dir(entry.path())
                    .unwrap()
                    .map(|e| format!(".snapshots/{:?}", e.unwrap().file_name())),
            ),
            _ => left.push(name),
        }
    }
    left
}

/// The venv's `python`, bounded by `secs` seconds, with the unmodified SDK pointed at the server
/// at `url` as team A (`E2B_API_URL` and `E2B_SANDBOX_URL` that origin, `E2B_API_KEY`, and no
/// `E2B_DEBUG` or `E2B_DOMAIN`, which would send it elsewhere). Arguments follow.
pub fn sdk_python(secs: u32, url: &str) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string())
        .arg(venv_python())
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("E2B_API_KEY", KEY_A)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN");
    c
}

/// Runs the SDK script `tests/py/<script>` against the server at `url` (as [`sdk_python`],
/// bounded by `secs`) with `env` set; asserts it exited 0 and printed `ok <step>` for each of
/// `steps`, then `all steps passed`. Answers what it printed.
pub fn run_sdk_script(
    secs: u32,
    url: &str,
    script: &str,
    env: &[(&str, &str)],
    steps: &[&str],
) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let out = sdk_python(secs, url)
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK script {script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for step in steps {
        assert!(
            stdout.contains(&format!("ok {step}")),
            "step {step:?} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("all steps passed"), "{stdout}");
    stdout
}

/// Creates a sandbox on the server at `url` as the team of `key`, with the create's `body`:
/// its id and envd access token (panics unless it answered 201).
pub async fn create_sandbox(
    c: &reqwest::Client,
    url: &str,
    key: &str,
    body: serde_json::Value,
) -> (String, String) {
    let r = c
        .post(format!("{url}/v2/sandboxes"))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let v: serde_json::Value = r.json().await.unwrap();
    (
        v["sandboxID"].as_str().unwrap().into(),
        v["envdAccessToken"].as_str().unwrap().into(),
    )
}

/// A sandbox's file through envd at the server at `url` (`GET /files`, its headers): the
/// status and the bytes.
pub async fn download(
    c: &reqwest::Client,
    url: &str,
    id: &str,
    token: &str,
    path: &str,
) -> (reqwest::StatusCode, Vec<u8>) {
    let r = c
        .get(format!("{url}/files?path={path}"))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .send()
        .await
        .unwrap();
    (r.status(), r.bytes().await.unwrap().to_vec())
}

/// `GET /sandboxes/{id}` at the server at `url` as the team of `key`: the status and the body.
pub async fn get_sandbox(
    c: &reqwest::Client,
    url: &str,
    id: &str,
    key: &str,
) -> (reqwest::StatusCode, String) {
    let r = c
        .get(format!("{url}/sandboxes/{id}"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

/// Runs `py/e2b_replicas.py` (bounded by `secs`) with the SDK's objects pointed at the
/// replicas at `url_a` and `url_b`, on a blocking task; asserts its steps passed. Answers the
/// id of the sandbox it left running on a.
pub async fn replicas_script(secs: u32, url_a: &str, url_b: &str) -> String {
    let (ua, ub) = (url_a.to_string(), url_b.to_string());
    let out = tokio::task::spawn_blocking(move || {
        run_sdk_script(
            secs,
            &ua,
            "e2b_replicas.py",
            &[("URL_A", &ua), ("URL_B", &ub)],
            &[
                "made on a, used through b",
                "paused through b, resumed on b",
                "killed through a while on b",
                "made on b, paused and resumed through a",
            ],
        )
    })
    .await
    .expect("the script's task");
    out.lines()
        .find_map(|l| l.strip_prefix("left running "))
        .expect("the script names the sandbox it left")
        .to_string()
}

/// `DELETE /sandboxes/{id}` at the server at `url` as the team of `key`: the status.
pub async fn kill_sandbox(
    c: &reqwest::Client,
    url: &str,
    id: &str,
    key: &str,
) -> reqwest::StatusCode {
    c.delete(format!("{url}/sandboxes/{id}"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .status()
}

/// `POST /files?path=` of `body` (octet-stream) into sandbox `id` through envd at the server
/// at `url`: the status.
pub async fn upload(
    c: &reqwest::Client,
    url: &str,
    id: &str,
    token: &str,
    path: &str,
    body: Vec<u8>,
) -> reqwest::StatusCode {
    c.post(format!("{url}/files?path={path}"))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
}

/// Whether the server at `url` shows the sandbox `id` paused within `polls` polls, 500 ms
/// apart (a bounded poll of real processes: a lease lapses on the wall clock). Each request is
/// bounded by 2 s: it may be forwarded to a replica that is stopped.
pub async fn shows_paused(c: &reqwest::Client, url: &str, id: &str, polls: u32) -> bool {
    for _ in 0..polls {
        let r = c
            .get(format!("{url}/sandboxes/{id}"))
            .header("x-api-key", KEY_A)
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await;
        if let Ok(r) = r {
            let ok = r.status() == reqwest::StatusCode::OK;
            if ok && r.text().await.unwrap_or_default().contains("\"paused\"") {
                return true;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    false
}

/// A paused sandbox's record of team A, as the tests of the tables write one.
pub fn paused_record(id: &str) -> sandkeeperd::durable::Record {
    sandkeeperd::durable::Record {
        id: id.into(),
        team: "team-a".into(),
        template: "base".into(),
        metadata: Default::default(),
        env: vec![],
        session: id.into(),
        token: "ab".repeat(32),
        started_ms: 1,
        auto_pause: false,
        runs_on: None,
        end_ms: 0,
        interrupted: false,
        paused_ms: 0,
        killing: false,
        held_on: None,
    }
}
