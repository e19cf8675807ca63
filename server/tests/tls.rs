//! `--tls-cert` and `--tls-key`: the binary serving HTTPS with a self-signed certificate made
//! here (rcgen) for `localhost` and 127.0.0.1. A sandbox made, reached through envd and killed
//! over HTTPS; nothing answered in the clear; a client that connects and says nothing holds no
//! one up (and is closed after the handshake timeout); bad flags and files refused before
//! listening, naming the problem; SIGTERM kills every sandbox and exits with a handshake under
//! way; the unmodified Python SDK over HTTPS (`py/e2b_tls.py`),
//! trusting the certificate through `SSL_CERT_FILE`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{left_on_disk, sdk_python, Server, E2B_VERSION, KEY_A};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// A self-signed certificate and its key, as PEM files in a temporary directory.
struct Cert {
    dir: tempfile::TempDir,
    pem: String,
}

impl Cert {
    fn new() -> Cert {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let made = rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let pem = made.cert.pem();
        std::fs::write(dir.path().join("cert.pem"), &pem).expect("write cert.pem");
        std::fs::write(dir.path().join("key.pem"), made.key_pair.serialize_pem())
            .expect("write key.pem");
        Cert { dir, pem }
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// The server started with this certificate.
    fn serve(&self) -> Server {
        let (cert, key) = (self.cert(), self.key());
        let s = Server::start(&[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ]);
        assert!(s.url.starts_with("https://127.0.0.1:"), "{}", s.url);
        s
    }

    /// A client trusting this certificate only.
    fn client(&self) -> Client {
        let root = reqwest::Certificate::from_pem(self.pem.as_bytes()).expect("the cert");
        Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(root)
            .timeout(Duration::from_secs(60))
            .build()
            .expect("a client")
    }
}

/// `host:port` of an `https://` URL.
fn host_port(url: &str) -> &str {
    url.strip_prefix("https://").expect("an https URL")
}

#[tokio::test]
async fn a_sandbox_over_https_rest_and_envd() {
    let cert = Cert::new();
    let s = cert.serve();
    let c = cert.client();
    let created = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"templateID": "base", "timeout": 60}))
        .send()
        .await
        .expect("create over HTTPS");
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(created.version(), reqwest::Version::HTTP_11);
    let created: Value = created.json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let health = c
        .get(format!("{}/health", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .expect("envd health over HTTPS");
    assert_eq!(health.status(), StatusCode::NO_CONTENT);
    let killed = c
        .delete(format!("{}/sandboxes/{id}", s.url))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .expect("kill over HTTPS");
    assert_eq!(killed.status(), StatusCode::NO_CONTENT);
    let gone = c
        .get(format!("{}/health", s.url))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn nothing_is_answered_in_the_clear() {
    let cert = Cert::new();
    let s = cert.serve();
    // A plain HTTP request on the TLS port: whatever comes back is no HTTP answer.
    let mut raw = TcpStream::connect(host_port(&s.url)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    raw.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "answered in the clear: {:?}",
        String::from_utf8_lossy(&answer)
    );
    // reqwest speaking http:// to it fails.
    let clear = s.url.replacen("https://", "http://", 1);
    let plain = Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let r = plain.get(format!("{clear}/metrics")).send().await;
    assert!(r.is_err(), "a plain HTTP request was answered: {r:?}");
    // And HTTPS is still served.
    let r = cert.client().get(format!("{}/metrics", s.url)).send().await;
    assert_eq!(
        r.expect("HTTPS after the clear ones").status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_silent_client_holds_no_one_up() {
    let cert = Cert::new();
    let s = cert.serve();
    // Connected, never a byte: its handshake waits on it.
    let mut silent = TcpStream::connect(host_port(&s.url)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let c = cert.client();
    // Well within the 10 s handshake timeout: served beside the silent one, not after it.
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            c.get(format!("{}/metrics", s.url)).send(),
        )
        .await
        .expect("an HTTPS request waited behind a silent client");
        assert_eq!(r.unwrap().status(), StatusCode::OK);
    }
    // The silent one is closed at the handshake timeout (10 s), not kept forever.
    #[allow(clippy::disallowed_methods)] // a test of a real process's timing reads the clock
    let started = Instant::now();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = silent.read(&mut buf);
    assert!(
        matches!(n, Ok(0))
            || n.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent connection was not closed: {n:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_over_tls_kills_every_sandbox_and_exits() {
    let cert = Cert::new();
    let mut s = cert.serve();
    let c = cert.client();
    let created = c
        .post(format!("{}/v2/sandboxes", s.url))
        .header("x-api-key", KEY_A)
        .json(&json!({"templateID": "base", "timeout": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<Value>().await.unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let before = left_on_disk(s.root());
    assert!(!before.is_empty(), "the sandbox {id} is not on disk");
    // A handshake under way (a client that says nothing) does not hold the exit up: within
    // 8 s, less than the 10 s the handshake would wait.
    let _silent = TcpStream::connect(host_port(&s.url)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let status = tokio::task::block_in_place(|| s.terminate(8));
    let status = status.expect("sandkeeperd still ran 8 s after SIGTERM");
    assert!(status.success(), "{status}");
    let left = left_on_disk(s.root());
    assert!(left.is_empty(), "left on disk after SIGTERM: {left:?}");
}

/// Runs the binary with `args` (bounded: a binary that started listening would be killed at
/// 20 s, status 124); its exit status and stderr.
fn refused(args: &[&str]) -> (std::process::ExitStatus, String) {
    let root = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_sandkeeperd"))
        .args(["--listen", "127.0.0.1:0", "--api-key", "team-a:k", "--root"])
        .arg(root.path())
        .args(args)
        .output()
        .expect("run sandkeeperd");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("listening"),
        "it listened with {args:?}: {stdout}"
    );
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn bad_tls_flags_and_files_are_refused_before_listening() {
    let cert = Cert::new();
    let (c, k) = (cert.cert(), cert.key());
    // One without the other.
    let (status, err) = refused(&["--tls-cert", path(&c)]);
    assert!(!status.success() && status.code() != Some(124), "{status}");
    assert!(err.contains("--tls-key"), "{err}");
    let (status, err) = refused(&["--tls-key", path(&k)]);
    assert!(!status.success() && status.code() != Some(124), "{status}");
    assert!(err.contains("--tls-cert"), "{err}");
    // A key file that is not PEM.
    let not_pem = cert.dir.path().join("not-pem.key");
    std::fs::write(&not_pem, "this is not a key\n").unwrap();
    let (status, err) = refused(&["--tls-cert", path(&c), "--tls-key", path(&not_pem)]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(path(&not_pem)) && err.contains("no private key"),
        "{err}"
    );
    // A certificate file that is missing, and one holding a key only.
    let missing = cert.dir.path().join("missing.pem");
    let (status, err) = refused(&["--tls-cert", path(&missing), "--tls-key", path(&k)]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(path(&missing)) && err.contains("--tls-cert"),
        "{err}"
    );
    let (status, err) = refused(&["--tls-cert", path(&k), "--tls-key", path(&k)]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("no certificate"), "{err}");
    // A key that is not the certificate's.
    let other = Cert::new();
    let (status, err) = refused(&["--tls-cert", path(&c), "--tls-key", path(&other.key())]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("--tls-key") && err.contains(path(&other.key())),
        "{err}"
    );
}

#[test]
fn the_unmodified_python_sdk_over_https() {
    let cert = Cert::new();
    let s = cert.serve();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/e2b_tls.py");
    let out = sdk_python(180, &s.url)
        .arg(&script)
        // The SDK's transport adds the system's certificates; SSL_CERT_FILE names them.
        .env("SSL_CERT_FILE", cert.cert())
        .env_remove("SSL_CERT_DIR")
        .output()
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK over HTTPS failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("e2b {E2B_VERSION}")), "{stdout}");
    assert!(stdout.contains("all steps passed"), "{stdout}");
}
