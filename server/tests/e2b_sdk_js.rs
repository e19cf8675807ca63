//! The official npm `e2b` SDK, unmodified, against the binary: create, commands with streamed
//! output, files, another team's sandbox, a bad key, kill (`js/e2b_smoke.mjs`).
//!
//! The SDK is installed from the npm registry under the target directory, once (reused while it
//! holds the pinned version). When Node.js is missing or the install fails, the test fails,
//! saying so: it is never skipped.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, KEY_A, KEY_B};

/// The SDK version the survey was made from.
const E2B_VERSION: &str = "2.51.0";

/// The version of the SDK installed under `dir`, if any.
fn installed(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("node_modules/e2b/package.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["version"].as_str().map(str::to_string)
}

/// `node_modules` with the pinned SDK.
fn node_modules() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2b-node");
    if installed(&dir).as_deref() == Some(E2B_VERSION) {
        return dir.join("node_modules");
    }
    std::fs::create_dir_all(&dir).expect("the SDK's directory");
    let spec = format!("e2b@{E2B_VERSION}");
    let out = Command::new("timeout")
        .args([
            "600",
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--silent",
            &spec,
        ])
        .current_dir(&dir)
        .output()
        .expect("run npm (install Node.js >= 20.18 with npm: the SDK needs it)");
    assert!(
        out.status.success() && installed(&dir).as_deref() == Some(E2B_VERSION),
        "npm install {spec} failed (the npm registry unreachable?); this test needs the real SDK:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("node_modules")
}

#[test]
fn the_unmodified_npm_sdk_works_against_sandkeeperd() {
    let modules = node_modules();
    let server = Server::start(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/e2b_smoke.mjs");
    let out = Command::new("timeout")
        .arg("300")
        .arg("node")
        .arg(&script)
        .env("E2B_NODE_MODULES", &modules)
        .env("E2B_API_URL", &server.url)
        .env("E2B_SANDBOX_URL", &server.url)
        .env("E2B_API_KEY", KEY_A)
        .env("OTHER_TEAM_KEY", KEY_B)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains(&format!("e2b {E2B_VERSION}")), "{stdout}");
    for step in [
        "create",
        "streamed onStdout",
        "files.write/read/list",
        "another team: NotFound",
        "bad key: AuthenticationError",
        "kill",
    ] {
        assert!(
            stdout.contains(&format!("ok {step}")),
            "step {step:?} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("all steps passed"), "{stdout}");
}
