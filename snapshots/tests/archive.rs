//! Snapshots of workspaces streamed as tars from inside a sandbox (`upload_archive`,
//! `fetch_archive`): a real `tar -c` round trips; a hostile tar is repacked without ever
//! touching this host's file system, and what a snapshot cannot hold is skipped and listed; a
//! tar whose maker failed, went away or was cut leaves nothing; a fetch of a tampered snapshot
//! fails.

mod support;

use std::fs;
use std::path::Path;
use std::process::Command;

use bytes::Bytes;
use sandkeeper::SandboxId;
use sandkeeper_snapshots::{EntryKind, ObjectSnapshots, SnapshotError, SnapshotName};
use support::test_config;
use tokio::sync::{mpsc, oneshot};

fn name(n: u64) -> SnapshotName {
    SnapshotName::new(SandboxId(n), "pods").unwrap()
}

fn open(store: &Path) -> ObjectSnapshots {
    let url = format!("file://{}", store.display());
    ObjectSnapshots::open(&url, test_config(Vec::new())).unwrap()
}

/// Streams `tar` in small pieces and then says `verdict` (`None`: the maker goes away
/// unheard).
async fn upload(
    snapshots: &ObjectSnapshots,
    n: u64,
    tar: Vec<u8>,
    verdict: Option<Result<(), String>>,
) -> Result<sandkeeper_snapshots::Manifest, SnapshotError> {
    let (to, chunks) = mpsc::channel(4);
    let (said, finished) = oneshot::channel();
    let maker = tokio::spawn(async move {
        for piece in tar.chunks(1000) {
            if to.send(Bytes::copy_from_slice(piece)).await.is_err() {
                break;
            }
        }
        drop(to);
        if let Some(verdict) = verdict {
            let _ = said.send(verdict);
        }
    });
    let got = snapshots
        .upload_archive(chunks, finished, &name(n), Some("user:u1"), None)
        .await;
    maker.await.unwrap();
    got
}

/// Everything under the store, as paths relative to it.
fn stored(store: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![store.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for child in fs::read_dir(&dir).unwrap() {
            let path = child.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let rel = path.strip_prefix(store).unwrap();
                found.push(rel.display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// The bytes `fetch_archive` streams, or its error.
async fn fetch(snapshots: &ObjectSnapshots, n: u64) -> Result<Vec<u8>, SnapshotError> {
    let (to, mut from) = mpsc::channel::<Bytes>(4);
    let collect = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(chunk) = from.recv().await {
            all.extend_from_slice(&chunk);
        }
        all
    });
    let got = snapshots.fetch_archive(&name(n), to).await;
    let bytes = collect.await.unwrap();
    got.map(|_| bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_tar_of_a_workspace_round_trips_and_keeps_what_a_snapshot_can_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let work = tmp.path().join("work");
    fs::create_dir_all(work.join("s1/deep")).unwrap();
    fs::write(work.join("s1/notes.txt"), b"acknowledged").unwrap();
    fs::write(work.join("s1/deep/big.bin"), vec![7u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", work.join("s1/out")).unwrap();
    fs::hard_link(work.join("s1/notes.txt"), work.join("s1/again")).unwrap();
    let fifo = Command::new("mkfifo")
        .arg(work.join("s1/pipe"))
        .status()
        .unwrap();
    assert!(fifo.success());
    // The pod's command, as the Kubernetes backend runs it.
    let tar = Command::new("tar")
        .args(["-c", "-f", "-", "-C"])
        .arg(&work)
        .arg(".")
        .output()
        .unwrap();
    assert!(tar.status.success());

    let manifest = upload(&snapshots, 1, tar.stdout, Some(Ok(())))
        .await
        .unwrap();
    assert_eq!(manifest.key.as_deref(), Some("user:u1"));
    let paths: Vec<_> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    for want in ["s1", "s1/deep", "s1/deep/big.bin", "s1/out"] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    let names = ["s1/notes.txt", "s1/again"];
    assert_eq!(names.iter().filter(|n| paths.contains(n)).count(), 1);
    let link = manifest
        .entries
        .iter()
        .find(|e| e.path == "s1/out")
        .unwrap();
    assert!(
        matches!(&link.kind, EntryKind::Symlink { target } if target == "/etc/passwd"),
        "{link:?}"
    );
    let skipped: Vec<_> = manifest
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.why.as_str()))
        .collect();
    // GNU tar writes the second name of a file as a hard link to the first, whichever it met
    // first: one of the two is a file, the other skipped naming it.
    assert!(
        skipped
            .iter()
            .any(|(p, why)| names.contains(p) && why.starts_with("a hard link")),
        "{skipped:?}"
    );
    assert!(skipped.contains(&("s1/pipe", "a FIFO")), "{skipped:?}");
    assert_eq!(manifest.file_bytes(), (3 << 20) + 12);

    // Back on a host, checked entry by entry.
    let back = tmp.path().join("back");
    snapshots.download(&name(1), &back).await.unwrap();
    let kept = [back.join("s1/notes.txt"), back.join("s1/again")];
    assert!(kept
        .iter()
        .any(|p| fs::read(p).ok().as_deref() == Some(&b"acknowledged"[..])));
    assert_eq!(
        fs::read(back.join("s1/deep/big.bin")).unwrap().len(),
        3 << 20
    );
    assert_eq!(
        fs::read_link(back.join("s1/out")).unwrap(),
        Path::new("/etc/passwd")
    );

    // Streamed on, as into a new pod's `tar -x`.
    let streamed = fetch(&snapshots, 1).await.unwrap();
    assert_eq!(streamed.len() as u64, manifest.data_size);
    let into = tmp.path().join("into");
    fs::create_dir(&into).unwrap();
    let mut untar = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(&into)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    untar.stdin.take().unwrap().write_all(&streamed).unwrap();
    assert!(untar.wait().unwrap().success());
    assert_eq!(
        fs::read(into.join("s1/deep/big.bin")).unwrap(),
        vec![7u8; 3 << 20]
    );
}

/// A raw tar header block for `path` (written byte by byte, as a hostile tar would be: the
/// tar crate's own setters refuse such paths).
fn raw_header(path: &[u8], kind: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut block = [0u8; 512];
    block[..path.len()].copy_from_slice(path);
    block[100..107].copy_from_slice(b"0000644");
    block[108..115].copy_from_slice(b"0000000");
    block[116..123].copy_from_slice(b"0000000");
    block[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    block[136..147].copy_from_slice(b"00000000000");
    block[156] = kind;
    block[157..157 + link.len()].copy_from_slice(link);
    block[257..263].copy_from_slice(b"ustar\0");
    block[263..265].copy_from_slice(b"00");
    block[148..156].copy_from_slice(b"        ");
    let sum: u32 = block.iter().map(|b| u32::from(*b)).sum();
    block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    block
}

/// One entry of a hand-written tar: its path, type byte, contents and link target.
type RawEntry<'a> = (&'a [u8], u8, &'a [u8], &'a [u8]);

/// A tar of raw entries, ended as tar ends one.
fn hostile_tar(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut tar = Vec::new();
    for (path, kind, contents, link) in entries {
        tar.extend_from_slice(&raw_header(path, *kind, contents.len() as u64, link));
        tar.extend_from_slice(contents);
        let pad = (512 - contents.len() % 512) % 512;
        tar.extend(std::iter::repeat_n(0u8, pad));
    }
    tar.extend(std::iter::repeat_n(0u8, 1024));
    tar
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tar_is_repacked_without_touching_the_host_and_what_cannot_be_kept_is_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let escape = tmp.path().join("escape");
    let escape_text = format!("{}", escape.display());
    let tar = hostile_tar(&[
        (b"./", b'5', b"", b""),
        (b"../escape", b'0', b"out", b""),
        (escape_text.as_bytes(), b'0', b"abs", b""),
        (b"d/", b'5', b"", b""),
        (b"d/f", b'0', b"first", b""),
        (b"d/f", b'0', b"second", b""),
        (b"l", b'2', b"", escape_text.as_bytes()),
        (b"l/x", b'0', b"through the link", b""),
        (b"nodir/x", b'0', b"no parent", b""),
        (b"d/\xff", b'0', b"bad name", b""),
        (b"d/dev", b'3', b"", b""),
        (b"d/./../x", b'0', b"dots", b""),
    ]);
    let manifest = upload(&snapshots, 2, tar, Some(Ok(()))).await.unwrap();
    let paths: Vec<_> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["d", "d/f", "l"]);
    let why = |path: &str| {
        manifest
            .skipped
            .iter()
            .find(|s| s.path == path)
            .map(|s| s.why.clone())
            .unwrap_or_else(|| panic!("{path} not listed in {:?}", manifest.skipped))
    };
    assert!(why("../escape").contains("plain relative path"));
    assert!(why(&escape_text).contains("plain relative path"));
    assert_eq!(why("l/x"), "not inside a directory of the archive");
    assert_eq!(why("nodir/x"), "not inside a directory of the archive");
    assert_eq!(why("d/\u{fffd}"), "a name that is not UTF-8");
    assert_eq!(why("d/dev"), "a device");
    assert!(why("d/./../x").contains("plain relative path"));
    assert_eq!(manifest.skipped.len(), 8, "{:?}", manifest.skipped);
    // The first `d/f` is the one kept.
    let back = tmp.path().join("back");
    snapshots.download(&name(2), &back).await.unwrap();
    assert_eq!(fs::read(back.join("d/f")).unwrap(), b"first");
    assert!(!escape.exists(), "the repack wrote outside the store");
    assert_eq!(
        fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<std::collections::BTreeSet<_>>(),
        ["back", "store"].map(Into::into).into()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tar_whose_maker_failed_went_away_or_was_cut_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let whole = hostile_tar(&[
        (b"d/", b'5', b"", b""),
        (b"d/f", b'0', &[1u8; 5000], b""),
        (b"d/g", b'0', b"g", b""),
    ]);

    let failed = upload(&snapshots, 3, whole.clone(), Some(Err("exit 2".into()))).await;
    assert!(
        matches!(&failed, Err(SnapshotError::Source(why)) if why == "exit 2"),
        "{failed:?}"
    );
    let unheard = upload(&snapshots, 3, whole.clone(), None).await;
    assert!(
        matches!(&unheard, Err(SnapshotError::Source(why)) if why.contains("went away")),
        "{unheard:?}"
    );
    // Cut inside `d/f`'s contents, by a maker that says it finished.
    let cut = upload(&snapshots, 3, whole[..2048].to_vec(), Some(Ok(()))).await;
    assert!(
        matches!(&cut, Err(SnapshotError::Source(why)) if why.contains("not a whole tar")),
        "{cut:?}"
    );
    // Not a tar at all.
    let garbage = upload(&snapshots, 3, vec![0x41; 4096], Some(Ok(()))).await;
    assert!(
        matches!(&garbage, Err(SnapshotError::Source(_))),
        "{garbage:?}"
    );
    assert!(
        stored(&store).is_empty(),
        "left behind: {:?}",
        stored(&store)
    );
    assert!(snapshots.list().await.unwrap().is_empty());

    // The same tar whole is kept.
    upload(&snapshots, 3, whole, Some(Ok(()))).await.unwrap();
    assert_eq!(snapshots.list().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_of_a_tampered_or_unhashed_snapshot_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let tar = hostile_tar(&[(b"f", b'0', &[9u8; 2000], b"")]);
    let manifest = upload(&snapshots, 4, tar, Some(Ok(()))).await.unwrap();
    let data = store.join("sbx-4-pods").join(&manifest.data);
    let mut bytes = fs::read(&data).unwrap();
    assert_eq!(fetch(&snapshots, 4).await.unwrap(), bytes);

    // One byte of the file's contents changed: same size, another hash.
    bytes[600] ^= 1;
    fs::write(&data, &bytes).unwrap();
    let tampered = fetch(&snapshots, 4).await;
    assert!(
        matches!(&tampered, Err(SnapshotError::Corrupt { why, .. }) if why.contains("differs")),
        "{tampered:?}"
    );

    // A manifest written before data hashes were recorded.
    let manifest_path = store.join("sbx-4-pods/manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&fs::read(&manifest_path).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("data_hash");
    fs::write(&manifest_path, serde_json::to_vec(&json).unwrap()).unwrap();
    let unhashed = fetch(&snapshots, 4).await;
    assert!(
        matches!(&unhashed, Err(SnapshotError::Corrupt { why, .. }) if why.contains("no data hash")),
        "{unhashed:?}"
    );
    let missing = fetch(&snapshots, 5).await;
    assert!(
        matches!(&missing, Err(SnapshotError::NotFound { .. })),
        "{missing:?}"
    );
}
