//! Snapshots through a fault proxy in front of moto: server errors (500, 503), slow answers,
//! and transfers cut midway, at every request of an upload and of a download. An upload either
//! completes (its manifest present, the snapshot whole) or leaves no manifest; a download
//! either makes the whole target or leaves nothing beside it.

mod support;

use std::fs;
use std::path::Path;
use std::time::Duration;

use sandkeeper::SandboxId;
use sandkeeper_snapshots::moto::Moto;
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotError, SnapshotName};
use support::fault_proxy::{Fault, FaultProxy};
use support::workspace::{assert_same, fill, names_in};
use support::{test_config, PART};

fn name(n: u64) -> SnapshotName {
    SnapshotName::new(SandboxId(n), "faults").unwrap()
}

/// The snapshots as seen directly (to check) and through the proxy (connection pool off, so
/// each request is one connection the proxy can number).
async fn setup(moto: &Moto) -> (ObjectSnapshots, ObjectSnapshots, FaultProxy) {
    let direct =
        ObjectSnapshots::open(&moto.url("snaps"), test_config(Moto::options(moto.port))).unwrap();
    let proxy = FaultProxy::start(moto.port).await;
    let mut options = Moto::options(proxy.port);
    options.push(("pool_max_idle_per_host".to_string(), "0".to_string()));
    options.push(("timeout".to_string(), "10s".to_string()));
    let via = ObjectSnapshots::open(&moto.url("snaps"), test_config(options)).unwrap();
    (direct, via, proxy)
}

/// What the store holds for `name` agrees with what the upload said: `Ok` means the manifest
/// is there and the snapshot downloads whole; an error means no manifest.
async fn assert_upload_outcome(
    direct: &ObjectSnapshots,
    name: &SnapshotName,
    got: &Result<sandkeeper_snapshots::Manifest, SnapshotError>,
    work: &Path,
    scratch: &Path,
) {
    match (got, direct.manifest(name).await) {
        (Ok(_), Ok(_)) => {
            let back = scratch.join(name.to_string());
            direct.download(name, &back).await.unwrap();
            assert_same(work, &back);
        }
        (Err(_), Err(SnapshotError::NotFound { .. })) => {}
        (got, stored) => panic!("{name}: the upload said {got:?}, the store holds {stored:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_through_faults_complete_or_leave_no_manifest() {
    let moto = Moto::start("upload-faults");
    let (direct, via, proxy) = setup(&moto).await;
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fill(&work, 2 * PART + 1000);
    let scratch = tmp.path().join("scratch");
    fs::create_dir(&scratch).unwrap();

    proxy.plan(Vec::new());
    via.upload(&work, &name(0), None).await.unwrap();
    let requests = proxy.connections();
    assert!(requests >= 6, "a 3-part upload took {requests} requests");

    let faults = [
        Fault::Status(500),
        Fault::Status(503),
        Fault::Delay(Duration::from_millis(200)),
        Fault::CutRequest(3 << 20),
        Fault::CutResponse(0),
    ];
    let mut n = 1;
    for fault in faults {
        for at in 0..requests {
            n += 1;
            proxy.plan(vec![(at, fault)]);
            let got = via.upload(&work, &name(n), None).await;
            assert_upload_outcome(&direct, &name(n), &got, &work, &scratch).await;
            if matches!(fault, Fault::Status(_) | Fault::Delay(_)) {
                // object_store retries server errors; a slow answer is only slow.
                assert!(got.is_ok(), "{fault:?} at request {at}: {got:?}");
            }
        }
    }

    // Every request from the second on failing: retries run out, and no manifest is written.
    n += 1;
    proxy.plan((1..200).map(|at| (at, Fault::Status(503))).collect());
    let got = via.upload(&work, &name(n), None).await;
    assert!(matches!(&got, Err(e) if e.is_retryable()), "{got:?}");
    assert_upload_outcome(&direct, &name(n), &got, &work, &scratch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_through_faults_are_whole_or_absent() {
    let moto = Moto::start("download-faults");
    let (direct, via, proxy) = setup(&moto).await;
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fill(&work, 2 * PART + 1000);
    direct.upload(&work, &name(1), None).await.unwrap();
    let downloads = tmp.path().join("downloads");
    fs::create_dir(&downloads).unwrap();

    proxy.plan(Vec::new());
    via.download(&name(1), &downloads.join("clean"))
        .await
        .unwrap();
    let requests = proxy.connections();
    fs::remove_dir_all(downloads.join("clean")).unwrap();

    let faults = [
        Fault::Status(500),
        Fault::Status(503),
        Fault::Delay(Duration::from_millis(200)),
        Fault::CutResponse(100),
        Fault::CutResponse(3 << 20),
    ];
    for (i, fault) in faults.into_iter().enumerate() {
        for at in 0..requests {
            proxy.plan(vec![(at, fault)]);
            let target = downloads.join(format!("t{i}-{at}"));
            let got = via.download(&name(1), &target).await;
            // object_store retries server errors, and a body cut midway from where it broke.
            assert!(got.is_ok(), "{fault:?} at request {at}: {got:?}");
            assert_same(&work, &target);
            fs::remove_dir_all(&target).unwrap();
            assert!(
                names_in(&downloads).is_empty(),
                "left {:?}",
                names_in(&downloads)
            );
        }
    }

    // A cut at 3 MiB resumes from there (even on every attempt, each gets further); so: the
    // data cut at 3 MiB, then every request answered 503. The download fails after files were
    // unpacked into its staging directory, and nothing is left.
    let mut plan = vec![(1, Fault::CutResponse(3 << 20))];
    plan.extend((2..200).map(|at| (at, Fault::Status(503))));
    proxy.plan(plan);
    let got = via.download(&name(1), &downloads.join("cut")).await;
    assert!(matches!(&got, Err(SnapshotError::Store { .. })), "{got:?}");
    assert!(
        names_in(&downloads).is_empty(),
        "left {:?}",
        names_in(&downloads)
    );
}
