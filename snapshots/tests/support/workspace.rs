//! Workspaces to snapshot, and a comparison of two trees that never follows a link.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// Fills `dir` (which exists) with: nested directories, a 0-byte file, an executable, a link
/// inside, a link pointing outside (`/etc/hostname`), a dangling link, a FIFO (skipped), and,
/// when `large` is non-zero, a file of `large` bytes.
pub fn fill(dir: &Path, large: usize) {
    fs::create_dir_all(dir.join("src/deep/er")).unwrap();
    fs::create_dir(dir.join("empty-dir")).unwrap();
    fs::write(dir.join("README"), b"hello\n").unwrap();
    fs::write(dir.join("src/empty"), b"").unwrap();
    fs::write(dir.join("src/deep/er/main.rs"), b"fn main() {}\n").unwrap();
    fs::write(dir.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(dir.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("src/deep/er/main.rs", dir.join("main-link")).unwrap();
    symlink("/etc/hostname", dir.join("outside-link")).unwrap();
    symlink("../../nowhere", dir.join("src/dangling")).unwrap();
    let made = Command::new("mkfifo")
        .arg(dir.join("pipe"))
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    if large > 0 {
        fs::write(dir.join("src/large.bin"), pattern(large)).unwrap();
    }
}

/// `len` bytes that differ from part to part (so a part swapped or repeated is noticed).
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 20) as u8)
        .collect()
}

/// Asserts `got` holds what `want` held, FIFOs and other special files aside (a snapshot
/// skips them): the same directories, files (contents and permission bits) and links
/// (targets).
pub fn assert_same(want: &Path, got: &Path) {
    assert_eq!(listing(want), listing(got));
}

/// Every entry under `dir`, sorted, described without following links.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in fs::read_dir(root.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let path = format!("{rel}{}", entry.file_name().to_str().unwrap());
        let meta = fs::symlink_metadata(root.join(&path)).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            out.push(format!("dir {path} {mode:o}"));
            walk(root, &format!("{path}/"), out);
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(root.join(&path)).unwrap();
            out.push(format!("link {path} -> {}", target.display()));
        } else if meta.is_file() {
            let hash = blake3::hash(&fs::read(root.join(&path)).unwrap());
            out.push(format!("file {path} {mode:o} {} {hash}", meta.len()));
        }
    }
}

/// The names in `dir` (to see that nothing was left beside a download target).
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
