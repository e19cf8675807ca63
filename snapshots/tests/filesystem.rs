//! Snapshots in a local file system store (`file://`), and hostile archives refused.

mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use sandkeeper::SandboxId;
use sandkeeper_snapshots::{
    Entry, EntryKind, Manifest, ObjectSnapshots, SnapshotError, SnapshotName, MANIFEST_FORMAT,
};
use support::test_config;
use support::workspace::{assert_same, fill, names_in};

fn name(n: u64) -> SnapshotName {
    SnapshotName::new(SandboxId(n), "fs1").unwrap()
}

fn open(store: &Path) -> ObjectSnapshots {
    let url = format!("file://{}", store.display());
    ObjectSnapshots::open(&url, test_config(Vec::new())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_round_trips_refuses_a_second_upload_and_sweeps() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fill(&work, 6 << 20);

    let retain = UNIX_EPOCH + Duration::from_secs(10_000);
    let manifest = snapshots
        .upload(&work, &name(1), Some(retain))
        .await
        .unwrap();
    assert_eq!(manifest.retain_until, Some(10_000));
    assert!(store.join("sbx-1-fs1/manifest.json").is_file());
    let again = snapshots.upload(&work, &name(1), None).await;
    assert!(
        matches!(again, Err(SnapshotError::AlreadyExists { .. })),
        "{again:?}"
    );

    let back = tmp.path().join("back");
    snapshots.download(&name(1), &back).await.unwrap();
    assert_same(&work, &back);
    let onto = snapshots.download(&name(1), &back).await;
    assert!(
        matches!(onto, Err(SnapshotError::TargetExists { .. })),
        "{onto:?}"
    );

    let later = UNIX_EPOCH + Duration::from_secs(10_000);
    assert_eq!(snapshots.expired(later).await.unwrap(), [name(1)]);
    snapshots.discard(&name(1)).await.unwrap();
    assert!(snapshots.expired(later).await.unwrap().is_empty());
}

/// Stores a crafted archive (`tar` of raw headers, so nothing checks its paths) as the
/// snapshot `name`, with a manifest that agrees with it in every byte.
async fn plant(snapshots: &ObjectSnapshots, name: &SnapshotName, entries: &[(&str, Planted)]) {
    let mut archive = tar::Builder::new(Vec::new());
    let mut listed = Vec::new();
    for (path, what) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_mode(0o644);
        let (kind, data): (EntryKind, &[u8]) = match what {
            Planted::File(data) => {
                header.set_entry_type(tar::EntryType::Regular);
                let hash = blake3::hash(data).to_hex().to_string();
                let size = data.len() as u64;
                (
                    EntryKind::File {
                        mode: 0o644,
                        size,
                        mtime: 0,
                        hash,
                    },
                    data,
                )
            }
            Planted::Link(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_link_name(target).unwrap();
                (
                    EntryKind::Symlink {
                        target: target.to_string(),
                    },
                    b"",
                )
            }
        };
        header.set_size(data.len() as u64);
        header.set_cksum();
        archive.append(&header, data).unwrap();
        listed.push(Entry {
            path: path.to_string(),
            kind,
        });
    }
    let bytes = archive.into_inner().unwrap();
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        name: name.to_string(),
        data: "data-planted.tar".to_string(),
        data_size: bytes.len() as u64,
        data_hash: Some(blake3::hash(&bytes).to_hex().to_string()),
        retain_until: None,
        key: None,
        entries: listed,
        skipped: Vec::new(),
    };
    let store = snapshots.store();
    store
        .put(
            &snapshots.object_path(name, "data-planted.tar"),
            bytes.into(),
        )
        .await
        .unwrap();
    let json = serde_json::to_vec(&manifest).unwrap();
    store
        .put(&snapshots.object_path(name, "manifest.json"), json.into())
        .await
        .unwrap();
}

enum Planted {
    File(&'static [u8]),
    Link(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_archive_is_refused_and_writes_nothing_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let downloads = tmp.path().join("downloads");
    fs::create_dir(&downloads).unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let outside_link: &'static str = Box::leak(outside.display().to_string().into_boxed_str());

    let hostile: Vec<Vec<(&str, Planted)>> = vec![
        vec![("../x", Planted::File(b"escaped"))],
        vec![("ok/../../x", Planted::File(b"escaped"))],
        vec![("/tmp/sandkeeper-snapshots-abs-x", Planted::File(b"escaped"))],
        // A link out, then a file through it.
        vec![
            ("link", Planted::Link(outside_link)),
            ("link/evil", Planted::File(b"escaped")),
        ],
        // The same path twice: a link, then a file over it.
        vec![
            ("twice", Planted::Link(outside_link)),
            ("twice", Planted::File(b"escaped")),
        ],
    ];
    for (n, entries) in hostile.iter().enumerate() {
        let name = name(100 + n as u64);
        plant(&snapshots, &name, entries).await;
        let target = downloads.join(format!("t{n}"));
        let got = snapshots.download(&name, &target).await;
        assert!(
            matches!(got, Err(SnapshotError::Corrupt { .. })),
            "{n}: {got:?}"
        );
        assert!(
            names_in(&downloads).is_empty(),
            "{n}: left {:?}",
            names_in(&downloads)
        );
        assert!(names_in(&outside).is_empty(), "{n}: wrote outside");
        assert!(
            !tmp.path().join("x").exists()
                && !Path::new("/tmp/sandkeeper-snapshots-abs-x").exists()
        );
    }

    // The planting is sound: a harmless archive planted the same way unpacks.
    let fine = name(99);
    plant(
        &snapshots,
        &fine,
        &[
            ("a", Planted::File(b"fine")),
            ("l", Planted::Link(outside_link)),
        ],
    )
    .await;
    snapshots
        .download(&fine, &downloads.join("fine"))
        .await
        .unwrap();
    assert_eq!(fs::read(downloads.join("fine/a")).unwrap(), b"fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_altered_with_a_valid_checksum_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    fs::create_dir(&store).unwrap();
    let snapshots = open(&store);
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fs::write(work.join("a"), b"first").unwrap();
    fs::write(work.join("b"), b"second").unwrap();
    let manifest = snapshots.upload(&work, &name(1), None).await.unwrap();
    let data = snapshots.object_path(&name(1), &manifest.data);
    let original = snapshots
        .store()
        .get(&data)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let downloads = tmp.path().join("downloads");
    fs::create_dir(&downloads).unwrap();

    // The first entry's time, then its mode, each changed with the header's checksum made
    // right again: only the manifest can tell.
    let alterations: [fn(&mut tar::Header); 2] = [
        |h| h.set_mtime(h.mtime().unwrap() + 1),
        |h| h.set_mode(0o777),
    ];
    for (n, alter) in alterations.iter().enumerate() {
        let mut bytes = original.to_vec();
        let mut header = tar::Header::from_byte_slice(&bytes[..512]).clone();
        alter(&mut header);
        header.set_cksum();
        bytes[..512].copy_from_slice(header.as_bytes());
        snapshots.store().put(&data, bytes.into()).await.unwrap();
        let got = snapshots
            .download(&name(1), &downloads.join(format!("t{n}")))
            .await;
        assert!(
            matches!(got, Err(SnapshotError::Corrupt { .. })),
            "{n}: {got:?}"
        );
        assert!(
            names_in(&downloads).is_empty(),
            "{n}: left {:?}",
            names_in(&downloads)
        );
    }
}
