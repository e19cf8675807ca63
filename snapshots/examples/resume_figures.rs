//! The resume figures: what a key's resume costs on the local backend when its snapshot is on
//! this host (a rename) against when it is on the shelf, in a moto S3 bucket on the loopback (a
//! download and unpack into the new sandbox's directory), for workspaces of 1 MB and 100 MB;
//! and what a Persist costs without and with the shelf (the upload it waits for). Each figure is
//! the median of several rounds, alternated in one run.
//!
//!     cargo run --release -p sandkeeper-snapshots --example resume_figures [-- ROUNDS]
//!
//! Prints `name value unit` lines.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandkeeper::{Key, SandboxId, SessionId, Snapshot, Spec};
use sandkeeper_snapshots::moto::Moto;
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotsConfig};
use sandkeeper_tokio::local::shelf::Shelf;
use sandkeeper_tokio::local::{Isolation, LocalConfig};
use sandkeeper_tokio::{Backend, LocalBackend, PersistRequest, StartRequest, StopRequest};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let moto = Moto::start("resume");
    let config = SnapshotsConfig {
        options: Moto::options(moto.port),
        ..SnapshotsConfig::default()
    };
    let shelf: Arc<dyn Shelf> =
        Arc::new(ObjectSnapshots::open(&moto.url("snaps"), config).unwrap());
    // The roots on the disk the figures are about (`SANDKEEPER_FIGURES_DIR`, else the OS
    // temporary directory).
    let tmp = match std::env::var_os("SANDKEEPER_FIGURES_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let host = |name: &str, shelf: Option<Arc<dyn Shelf>>| {
        LocalBackend::new(LocalConfig {
            isolation: Isolation::Off,
            shelf,
            ..LocalConfig::new(tmp.path().join(name))
        })
        .unwrap()
    };
    let alone = host("alone", None);
    let (a, b) = (host("a", Some(shelf.clone())), host("b", Some(shelf)));

    for (size, (label, files)) in [("1mb", 1usize), ("100mb", 100)].into_iter().enumerate() {
        let mut rows = Vec::new();
        for round in 0..rounds {
            let n = size as u64 * 1_000 + round * 2;
            // This host: Persist marks the snapshot kept; the resume renames it.
            let (snapshot, persist_local) = suspended(&alone, sbx(1, n), files).await;
            let resume_local = timed(async {
                alone.start(start(sbx(1, n + 1), &snapshot)).await.unwrap();
            })
            .await;
            // Another host: Persist uploads it; the resume on b fetches it from the shelf.
            let (snapshot, persist_shelf) = suspended(&a, sbx(2, n), files).await;
            let resume_shelf = timed(async {
                b.start(start(sbx(3, n), &snapshot)).await.unwrap();
            })
            .await;
            let row = [persist_local, persist_shelf, resume_local, resume_shelf];
            eprintln!("{label} round {round}: {row:?}");
            rows.push(row);
        }
        let median = |i: usize| {
            let mut v: Vec<f64> = rows.iter().map(|r| r[i].as_secs_f64() * 1e3).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!("resume.persist_local_ms_{label} {:.2} ms", median(0));
        println!("resume.persist_shelf_ms_{label} {:.2} ms", median(1));
        println!("resume.local_ms_{label} {:.2} ms", median(2));
        println!("resume.shelf_ms_{label} {:.2} ms", median(3));
    }
}

fn sbx(inc: u64, n: u64) -> SandboxId {
    SandboxId(inc << 32 | n)
}

fn key() -> Key {
    Key::Session(SessionId::new("figures").unwrap())
}

fn start(sandbox: SandboxId, resume_from: &Snapshot) -> StartRequest {
    StartRequest {
        sandbox,
        key: key(),
        spec: Spec::new(""),
        resume_from: Some(resume_from.clone()),
        resumes: None,
        token: None,
    }
}

/// Starts `sandbox` on `host` with `files` files of 1 MiB, stops it to suspend and persists it:
/// the snapshot, and how long the Persist took.
async fn suspended(host: &LocalBackend, sandbox: SandboxId, files: usize) -> (Snapshot, Duration) {
    let request = StartRequest {
        resume_from: None,
        ..start(sandbox, &Snapshot::new("none"))
    };
    host.start(request).await.unwrap();
    fill(&host.sandbox_dir(sandbox), files);
    let stop = StopRequest {
        sandbox,
        suspend: true,
        token: None,
    };
    let snapshot = host.stop(stop).await.unwrap().unwrap();
    let persist = PersistRequest {
        sandbox,
        snapshot: Some(snapshot.clone()),
        suspend: true,
        retain_until: None,
        token: None,
    };
    let took = timed(async {
        host.persist(persist).await.unwrap();
    })
    .await;
    (snapshot, took)
}

fn fill(dir: &Path, files: usize) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for i in 0..files {
        let bytes: Vec<u8> = (0..1usize << 20)
            .map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(7919)) as u8)
            .collect();
        std::fs::write(dir.join(format!("src/file-{i:03}.bin")), bytes).unwrap();
    }
}

// A figures program reads the clock: what it measures is wall time.
#[allow(clippy::disallowed_methods)]
async fn timed(work: impl std::future::Future<Output = ()>) -> Duration {
    let start = Instant::now();
    work.await;
    start.elapsed()
}
