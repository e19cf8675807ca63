//! The main job's temporary root: removed after a run whose checks all passed, kept with
//! `--keep` (and said where). Runs the real `harness` binary, small, in a temporary directory of
//! its own (`TMPDIR`), so what it leaves is all that directory holds.

use std::path::Path;
use std::process::Command;

use sandkeeper_tokio::workload::child::ran;

/// Runs a small harness with `TMPDIR=dir` and `extra` arguments: its standard output.
fn harness(dir: &Path, extra: &[&str]) -> String {
    let mut harness = Command::new(env!("CARGO_BIN_EXE_harness"));
    harness
        .args(["--sessions", "2", "--users", "1", "--calls", "1", "--quiet"])
        .args(extra)
        .env("TMPDIR", dir);
    ran(harness)
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_successful_run_removes_its_temporary_root_unless_kept() {
    let dir = std::env::temp_dir().join(format!("harness-root-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = harness(&dir, &[]);
    assert!(out.contains("removed "), "{out}");
    assert_eq!(entries(&dir), Vec::<String>::new(), "{out}");

    let out = harness(&dir, &["--keep"]);
    let kept = entries(&dir);
    assert_eq!(kept.len(), 1, "one root kept: {kept:?}");
    let said = format!("files kept in {}", dir.join(&kept[0]).display());
    assert!(out.contains(&said), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
