//! The snapshot figures: a snapshot of a 100 MB workspace (100 files of 1 MiB and one of 0
//! bytes) uploaded to and downloaded from a moto S3 server on the loopback, against
//! `object_store`'s own multipart put and get of the same bytes to the same server, alternated
//! over several rounds in one run.
//!
//!     cargo run --release -p sandkeeper-snapshots --example snapshot_figures [-- ROUNDS]
//!
//! Prints `name value unit` lines; the ratios are the raw operation's time over the snapshot's
//! (1.0: as fast as a bare put or get; the goal is ≥ 0.8), each the median of the rounds. A
//! download makes files on disk, so its figure compares it with a raw get written to one file
//! on the same disk; the raw get into memory (the body read and dropped) is printed beside it.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};
use sandkeeper::SandboxId;
use sandkeeper_snapshots::moto;
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotName, SnapshotsConfig};

const FILES: usize = 100;
const FILE_SIZE: usize = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let moto = moto::Moto::start("figures");
    let config = SnapshotsConfig {
        options: moto::Moto::options(moto.port),
        ..SnapshotsConfig::default()
    };
    let snapshots = ObjectSnapshots::open(&moto.url("snaps"), config.clone()).unwrap();
    let store = snapshots.store().clone();
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let files = make_workspace(&work);

    let mut rows: Vec<Round> = Vec::new();
    for round in 0..rounds {
        let raw = ObjectPath::from(format!("raw/round-{round}"));
        let name = SnapshotName::new(SandboxId(round as u64), "figures").unwrap();
        let put = timed(raw_put(&store, &raw, &files, &config)).await;
        let upload = timed(async {
            snapshots.upload(&work, &name, None).await.unwrap();
        })
        .await;
        let get = timed(raw_get(&store, &raw)).await;
        let raw_file = tmp.path().join(format!("raw-{round}"));
        let get_to_file = timed(raw_get_to_file(&store, &raw, &raw_file)).await;
        fs::remove_file(&raw_file).unwrap();
        let target = tmp.path().join(format!("back-{round}"));
        let download = timed(async {
            snapshots.download(&name, &target).await.unwrap();
        })
        .await;
        fs::remove_dir_all(&target).unwrap();
        let row = Round {
            put,
            upload,
            get,
            get_to_file,
            download,
        };
        eprintln!("round {round}: {row:?}");
        rows.push(row);
    }
    let median = |f: &dyn Fn(&Round) -> f64| median_f64(rows.iter().map(f).collect());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("snapshots.raw_put_ms {:.0} ms", median(&|r| ms(r.put)));
    println!("snapshots.upload_ms {:.0} ms", median(&|r| ms(r.upload)));
    println!("snapshots.raw_get_ms {:.0} ms", median(&|r| ms(r.get)));
    println!(
        "snapshots.raw_get_to_file_ms {:.0} ms",
        median(&|r| ms(r.get_to_file))
    );
    println!(
        "snapshots.download_ms {:.0} ms",
        median(&|r| ms(r.download))
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let up = median(&|r| ratio(r.put, r.upload));
    let down = median(&|r| ratio(r.get_to_file, r.download));
    let down_memory = median(&|r| ratio(r.get, r.download));
    println!(
        "snapshots.upload_vs_raw_put {up:.2} x # goal >= 0.8: {}",
        verdict(up)
    );
    println!(
        "snapshots.download_vs_raw_get {down:.2} x # goal >= 0.8: {}",
        verdict(down)
    );
    println!("snapshots.download_vs_raw_get_into_memory {down_memory:.2} x");
}

/// One round's times.
#[derive(Debug)]
struct Round {
    put: Duration,
    upload: Duration,
    get: Duration,
    get_to_file: Duration,
    download: Duration,
}

/// Writes the workspace; its files' bytes, for the raw put.
fn make_workspace(work: &Path) -> Vec<Vec<u8>> {
    fs::create_dir_all(work.join("src")).unwrap();
    fs::write(work.join("src/empty"), b"").unwrap();
    let mut files = Vec::new();
    for i in 0..FILES {
        let bytes: Vec<u8> = (0..FILE_SIZE)
            .map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(7919)) as u8)
            .collect();
        fs::write(work.join(format!("src/file-{i:03}.bin")), &bytes).unwrap();
        files.push(bytes);
    }
    files
}

/// `object_store`'s own multipart put of the files' bytes, in the snapshots' part size and
/// concurrency.
async fn raw_put(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    files: &[Vec<u8>],
    config: &SnapshotsConfig,
) {
    let upload = store.put_multipart(path).await.unwrap();
    let mut writer = WriteMultipart::new_with_chunk_size(upload, config.part_size);
    for file in files {
        writer
            .wait_for_capacity(config.max_concurrency)
            .await
            .unwrap();
        writer.write(file);
    }
    writer.finish().await.unwrap();
}

/// `object_store`'s own get, the body read to its end.
async fn raw_get(store: &Arc<dyn ObjectStore>, path: &ObjectPath) {
    let mut stream = store.get(path).await.unwrap().into_stream();
    let mut total = 0;
    while let Some(chunk) = stream.next().await {
        total += chunk.unwrap().len();
    }
    assert_eq!(total, FILES * FILE_SIZE);
}

/// `object_store`'s own get written to one file: the body streamed into a 1 MiB buffered
/// tokio file, as a caller saving an object would.
async fn raw_get_to_file(store: &Arc<dyn ObjectStore>, path: &ObjectPath, file: &Path) {
    use tokio::io::AsyncWriteExt;
    let file = tokio::fs::File::create(file).await.unwrap();
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut stream = store.get(path).await.unwrap().into_stream();
    while let Some(chunk) = stream.next().await {
        file.write_all(&chunk.unwrap()).await.unwrap();
    }
    file.shutdown().await.unwrap();
}

// A figures program reads the clock: what it measures is wall time.
#[allow(clippy::disallowed_methods)]
async fn timed(work: impl std::future::Future<Output = ()>) -> Duration {
    let start = Instant::now();
    work.await;
    start.elapsed()
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn verdict(ratio: f64) -> &'static str {
    if ratio >= 0.8 {
        "met"
    } else {
        "missed"
    }
}
