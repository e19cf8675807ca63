//! `--workspace-path`: commands see their sandbox's workspace at `/home/user` by default, where
//! the file API's paths are (an uploaded file is `cat`-able there, `pwd` names it); `host`
//! runs them at the workspace's host path under the root; without bubblewrap, or with a path
//! that cannot be used, the server does not start, and says how to opt out.

mod common;

use std::process::{Command, Stdio};

use base64::Engine as _;
use common::{create_sandbox, Server, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn create(c: &Client, s: &Server) -> (String, String) {
    create_sandbox(c, &s.url, KEY_A, json!({"timeout": 60})).await
}

/// A Connect envelope around `json`.
fn envelope(json: &Value) -> Vec<u8> {
    let body = json.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Uploads `a.txt` through the file API at `/home/user/a.txt`, then runs `script` and returns
/// its whole stream (the output is in it, base64).
async fn upload_then_run(s: &Server, script: &str) -> String {
    let c = Client::new();
    let (id, token) = create(&c, s).await;
    let r = c
        .post(format!("{}/files?path=/home/user/a.txt", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body("uploaded")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let start = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "stdin": false});
    let r = c
        .post(format!("{}/process.Process/Start", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .header("content-type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let stream = r.bytes().await.unwrap();
    String::from_utf8_lossy(&stream).into_owned()
}

/// The stream holds one write of `text` to standard output.
fn wrote(stream: &str, text: &str) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
    stream.contains(&format!("\"stdout\":\"{b64}\""))
}

/// One write: the working directory, `HOME`, and the uploaded file read at `/home/user`.
const SCRIPT: &str = "printf '%s|%s|%s' \"$(pwd)\" \"$HOME\" \"$(cat /home/user/a.txt)\"";

#[tokio::test]
async fn by_default_commands_see_the_workspace_at_home_user() {
    let s = Server::start(&[]);
    let stream = upload_then_run(&s, SCRIPT).await;
    assert!(wrote(&stream, "/home/user|/home/user|uploaded"), "{stream}");
}

#[tokio::test]
async fn host_runs_commands_at_the_workspaces_host_path() {
    let s = Server::start(&["--workspace-path", "host"]);
    let stream = upload_then_run(&s, "printf '%s' \"$(pwd)\"").await;
    let root = s.root().to_string_lossy().into_owned();
    let pwd = stream
        .split("\"stdout\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter_map(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect::<String>();
    assert!(pwd.starts_with(&root), "{pwd} not under {root}: {stream}");
}

/// Runs the binary with `extra` flags and `PATH` set to `path`, expecting it not to start:
/// its standard error. Bounded: a server that does start prints that it listens (read here,
/// then it is killed and the test fails) rather than running on.
fn refused(extra: &[&str], path: &str) -> String {
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandkeeperd"))
        .args(["--listen", "127.0.0.1:0", "--root"])
        .arg(root.path())
        .args(["--api-key", &format!("team-a:{KEY_A}")])
        .args(extra)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its first line, or nothing once it exited.
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    if line.contains("listening") {
        let _ = child.kill();
        let _ = child.wait();
        panic!("it started: {line}");
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{line}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Without bubblewrap (none on `PATH`) the default `/home/user` cannot be honoured: the server
/// does not start, naming the opt-out; with it, the server starts.
#[test]
fn without_bubblewrap_the_server_does_not_start_and_names_the_opt_out() {
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    let stderr = refused(&[], path);
    assert!(
        stderr.contains("needs bubblewrap") && stderr.contains("--workspace-path host"),
        "{stderr}"
    );
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandkeeperd"))
        .args(["--listen", "127.0.0.1:0", "--root"])
        .arg(root.path())
        .args(["--api-key", &format!("team-a:{KEY_A}")])
        .args(["--workspace-path", "host"])
        .env("PATH", path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("listening"), "{line:?}");
}

/// A path that cannot be a workspace mount stops the server before it listens.
#[test]
fn a_bad_workspace_path_stops_the_server() {
    let path = std::env::var("PATH").unwrap_or_default();
    for bad in ["home/user", "/usr/ws", "/"] {
        let stderr = refused(&["--workspace-path", bad], &path);
        assert!(
            stderr.contains("workspace mount") && stderr.contains("--workspace-path host"),
            "{bad}: {stderr}"
        );
    }
}
