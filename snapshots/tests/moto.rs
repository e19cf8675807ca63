//! Snapshots against a real S3-compatible server: moto, started by each test and stopped after.

mod support;

use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use object_store::{PutMode, PutOptions};
use sandkeeper::SandboxId;
use sandkeeper_snapshots::moto::Moto;
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotError, SnapshotName};
use support::workspace::{assert_same, fill, names_in};
use support::{test_config, PART};

fn snapshots(moto: &Moto) -> ObjectSnapshots {
    ObjectSnapshots::open(&moto.url("snaps"), test_config(Moto::options(moto.port))).unwrap()
}

fn name(n: u64) -> SnapshotName {
    SnapshotName::new(SandboxId(n), "19a2f0c").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_empty_nested_linked_and_multipart_workspaces() {
    let moto = Moto::start("round-trips");
    let snapshots = snapshots(&moto);
    let tmp = tempfile::tempdir().unwrap();

    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let manifest = snapshots.upload(&empty, &name(1), None).await.unwrap();
    assert!(manifest.entries.is_empty() && manifest.skipped.is_empty());
    snapshots
        .download(&name(1), &tmp.path().join("empty-back"))
        .await
        .unwrap();
    assert_same(&empty, &tmp.path().join("empty-back"));

    // Two full parts and a partial third: a multipart upload.
    let full = tmp.path().join("full");
    fs::create_dir(&full).unwrap();
    fill(&full, 2 * PART + 12345);
    let manifest = snapshots.upload(&full, &name(2), None).await.unwrap();
    let skipped: Vec<_> = manifest.skipped.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(skipped, ["pipe"]);
    assert!(manifest
        .entries
        .iter()
        .any(|e| e.path == "outside-link" && matches!(&e.kind, sandkeeper_snapshots::EntryKind::Symlink { target } if target == "/etc/hostname")));
    let data = snapshots.object_path(&name(2), &manifest.data);
    let meta = snapshots.store().head(&data).await.unwrap();
    let etag = meta.e_tag.unwrap_or_default();
    assert!(
        etag.trim_matches('"').ends_with("-3"),
        "not a 3-part upload: {etag}"
    );

    let back = tmp.path().join("full-back");
    snapshots.download(&name(2), &back).await.unwrap();
    assert_same(&full, &back);
    assert!(!back.join("pipe").exists());
    // The outside link came back as a link, pointing where it pointed.
    assert_eq!(
        fs::read_link(back.join("outside-link")).unwrap(),
        std::path::Path::new("/etc/hostname")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_upload_under_the_same_name_is_refused() {
    let moto = Moto::start("twice");
    let snapshots = snapshots(&moto);
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    fs::create_dir(&first).unwrap();
    fs::create_dir(&second).unwrap();
    fs::write(first.join("who"), b"first").unwrap();
    fs::write(second.join("who"), b"second").unwrap();

    snapshots.upload(&first, &name(1), None).await.unwrap();
    let again = snapshots.upload(&second, &name(1), None).await;
    assert!(
        matches!(again, Err(SnapshotError::AlreadyExists { .. })),
        "{again:?}"
    );

    // moto honours `If-None-Match: *` on PUT: a create over the manifest is refused.
    let manifest = snapshots.object_path(&name(1), "manifest.json");
    let create = snapshots
        .store()
        .put_opts(&manifest, "x".into(), PutOptions::from(PutMode::Create))
        .await;
    assert!(
        matches!(create, Err(object_store::Error::AlreadyExists { .. })),
        "{create:?}"
    );

    // Two writers at once, both past the existence check: the conditional put decides, and
    // the loser leaves nothing behind.
    let two = name(2);
    let (a, b) = tokio::join!(
        snapshots.upload(&first, &two, None),
        snapshots.upload(&second, &two, None)
    );
    let winner = match (&a, &b) {
        (Ok(_), Err(SnapshotError::AlreadyExists { .. })) => "first",
        (Err(SnapshotError::AlreadyExists { .. }), Ok(_)) => "second",
        _ => panic!("not exactly one winner: {a:?} {b:?}"),
    };
    let back = tmp.path().join("back");
    snapshots.download(&name(2), &back).await.unwrap();
    assert_eq!(fs::read(back.join("who")).unwrap(), winner.as_bytes());
    let under = object_store::path::Path::from("snaps/sbx-2-19a2f0c");
    let objects: Vec<_> = snapshots.store().list(Some(&under)).collect().await;
    assert_eq!(
        objects.len(),
        2,
        "not the manifest and the winner's data only: {objects:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_or_truncated_object_is_detected_and_nothing_is_left() {
    let moto = Moto::start("corrupt");
    let snapshots = snapshots(&moto);
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fill(&work, 100_000);
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

    // One byte flipped inside the large file's contents: same size, different hash.
    let mut altered = original.to_vec();
    altered[original.len() / 2] ^= 1;
    snapshots.store().put(&data, altered.into()).await.unwrap();
    let got = snapshots.download(&name(1), &downloads.join("a")).await;
    assert!(matches!(got, Err(SnapshotError::Corrupt { .. })), "{got:?}");
    assert!(
        names_in(&downloads).is_empty(),
        "left {:?}",
        names_in(&downloads)
    );

    // Cut short.
    let truncated = original.slice(..original.len() - 700);
    snapshots
        .store()
        .put(&data, truncated.into())
        .await
        .unwrap();
    let got = snapshots.download(&name(1), &downloads.join("b")).await;
    assert!(matches!(got, Err(SnapshotError::Corrupt { .. })), "{got:?}");
    assert!(
        names_in(&downloads).is_empty(),
        "left {:?}",
        names_in(&downloads)
    );

    // The original back: the same download succeeds.
    snapshots.store().put(&data, original.into()).await.unwrap();
    snapshots
        .download(&name(1), &downloads.join("c"))
        .await
        .unwrap();
    assert_same(&work, &downloads.join("c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_names_expired_snapshots_and_discard_removes_them() {
    let moto = Moto::start("retention");
    let snapshots = snapshots(&moto);
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("f"), b"x").unwrap();
    let t = |secs| UNIX_EPOCH + Duration::from_secs(secs);
    snapshots
        .upload(tmp.path(), &name(1), Some(t(1_000)))
        .await
        .unwrap();
    snapshots
        .upload(tmp.path(), &name(2), Some(t(2_000)))
        .await
        .unwrap();
    snapshots.upload(tmp.path(), &name(3), None).await.unwrap();

    assert!(snapshots.expired(t(999)).await.unwrap().is_empty());
    assert_eq!(snapshots.expired(t(1_000)).await.unwrap(), [name(1)]);
    assert_eq!(
        snapshots.expired(t(5_000)).await.unwrap(),
        [name(1), name(2)]
    );
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(u32::MAX as u64);
    assert_eq!(snapshots.expired(far).await.unwrap(), [name(1), name(2)]);

    snapshots.discard(&name(1)).await.unwrap();
    assert!(matches!(
        snapshots.manifest(&name(1)).await,
        Err(SnapshotError::NotFound { .. })
    ));
    assert!(matches!(
        snapshots.discard(&name(1)).await,
        Err(SnapshotError::NotFound { .. })
    ));
    assert_eq!(snapshots.expired(t(5_000)).await.unwrap(), [name(2)]);
    let got = snapshots.download(&name(1), &tmp.path().join("back")).await;
    assert!(
        matches!(got, Err(SnapshotError::NotFound { .. })),
        "{got:?}"
    );
}
