//! Snapshots of stopped sandboxes' workspaces in object storage (S3, GCS, Azure, a local file
//! system), through the `object_store` crate and one URL.
//!
//! [`ObjectSnapshots`] owns the snapshots under one prefix of one store. A snapshot is two
//! objects under `<prefix>/<name>/`, its name `sbx-<n>-<instance>` ([`SnapshotName`]):
//!
//! ```text
//! <prefix>/sbx-<n>-<instance>/data-<upload>.tar   the workspace as a tar, written first
//! <prefix>/sbx-<n>-<instance>/manifest.json       the Manifest, written last, create-only
//! ```
//!
//! - [`ObjectSnapshots::upload`] streams the workspace as a tar (packed on a blocking thread,
//!   one chunk at a time) into a data object unique to the upload (one PUT when small, a
//!   multipart upload once it outgrows a part), then writes the manifest with a create-only
//!   put (`PutMode::Create`: `If-None-Match: *` on S3). The manifest's presence is what makes
//!   a snapshot exist and complete; a late writer's create fails, it removes its own data
//!   object, and the snapshot it found is never replaced.
//! - [`ObjectSnapshots::download`] reads the manifest, streams the data object into a staging
//!   directory beside the target (unpacked on a blocking thread), checks every entry, every
//!   file's size and hash against the manifest, and only then renames the staging
//!   directory to the target: the target is whole or absent.
//! - [`ObjectSnapshots::discard`] removes a snapshot's objects, the manifest last.
//! - [`ObjectSnapshots::expired`] names the snapshots whose recorded retention passed at the
//!   caller's `now`, for the fleet sweep.
//!
//! It is the local backend's [`Shelf`](sandkeeper_tokio::local::shelf::Shelf) (`shelf.rs`): a
//! Persist uploads the stopped workspace, a Start on another host downloads it, a Discard
//! discards it; the backend's snapshot names (`sbx-<n>-<instance>`) are this crate's names, and
//! the manifest names the key, for the fleet sweep. [`moto`] starts a throwaway S3-compatible
//! server for tests. `docs/snapshots.md` says more: the manifest, the conditional writes, the
//! failure cases; `docs/fleet-hosts.md`, the fleet across hosts it serves.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod manifest;
pub mod moto;
mod name;
mod open;
mod pack;
mod repack;
mod shelf;
mod transfer;
mod unpack;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use tokio::sync::{mpsc, oneshot};

pub use error::SnapshotError;
pub use manifest::{Entry, EntryKind, Manifest, Skipped, MANIFEST_FORMAT};
pub use name::SnapshotName;
pub use object_store;
pub use repack::{MAX_ENTRIES, MAX_PATH, MAX_TRAILING};

use pack::{pack, ChunkSink, Packed};
use transfer::DataWriter;
use unpack::{unpack, ChunkSource};

/// The manifest's object name under a snapshot's prefix.
const MANIFEST: &str = "manifest.json";

/// Chunks in flight between the packer or unpacker and the store (each [`pack::CHUNK`] bytes).
const CHUNKS_IN_FLIGHT: usize = 4;

/// How snapshots are written and what the store client does.
#[derive(Clone, Debug)]
pub struct SnapshotsConfig {
    /// The size of a multipart upload's parts, and the size up to which a data object is one
    /// PUT. S3 requires at least 5 MiB for every part but the last.
    pub part_size: usize,
    /// Parts uploaded at once.
    pub max_concurrency: usize,
    /// `object_store`'s retry policy for every request (server errors, 429, timeouts,
    /// connection failures, a download cut midway).
    pub retry: RetryConfig,
    /// Store options, `object_store`'s configuration keys (e.g. `endpoint`,
    /// `access_key_id`, `allow_http`, `conditional_put`), applied after the environment's.
    pub options: Vec<(String, String)>,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        SnapshotsConfig {
            part_size: 16 << 20,
            max_concurrency: 4,
            retry: RetryConfig::default(),
            options: Vec::new(),
        }
    }
}

/// The snapshots under one prefix of one object store. Cheap to clone; shares the store's
/// client.
#[derive(Clone, Debug)]
pub struct ObjectSnapshots {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    config: SnapshotsConfig,
}

impl ObjectSnapshots {
    /// The snapshots at `url`: `s3://bucket/prefix` (endpoint and credentials from the
    /// `AWS_*` environment or `config.options`), `gs://bucket/prefix`,
    /// `az://container/prefix`, `file:///path` (an existing directory), or `memory://` (for
    /// tests: nothing outlives the value).
    pub fn open(url: &str, config: SnapshotsConfig) -> Result<Self, SnapshotError> {
        let (store, prefix) = open::store_at(url, &config.options, &config.retry)?;
        Ok(ObjectSnapshots {
            store,
            prefix,
            config,
        })
    }

    /// The snapshots under `prefix` of a store the caller built.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: ObjectPath, config: SnapshotsConfig) -> Self {
        ObjectSnapshots {
            store,
            prefix,
            config,
        }
    }

    /// The store, for callers that need it directly (tests, figures).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The object name of `file` under the snapshot `name`.
    pub fn object_path(&self, name: &SnapshotName, file: &str) -> ObjectPath {
        self.prefix.child(name.to_string()).child(file)
    }

    /// Uploads the workspace directory `workspace` as the snapshot `name`, kept until
    /// `retain_until` (`None`: until discarded). The workspace must be stopped: a file that
    /// changes while it is read fails the upload. Symbolic links are recorded as links and
    /// never followed; FIFOs, sockets and devices are skipped and listed in the manifest.
    ///
    /// On success the snapshot exists and is complete. On failure no manifest names this
    /// upload's data (its data object is removed where that is safe; see `docs/snapshots.md`).
    pub async fn upload(
        &self,
        workspace: &Path,
        name: &SnapshotName,
        retain_until: Option<SystemTime>,
    ) -> Result<Manifest, SnapshotError> {
        self.upload_for(workspace, name, None, retain_until).await
    }

    /// [`upload`](Self::upload), its manifest naming the `key` whose sandbox the workspace was
    /// taken from (what a fleet sweep judges the snapshot by).
    pub async fn upload_for(
        &self,
        workspace: &Path,
        name: &SnapshotName,
        key: Option<&str>,
        retain_until: Option<SystemTime>,
    ) -> Result<Manifest, SnapshotError> {
        let (data, data_path) = self.new_data_object(name).await?;
        let workspace = workspace.to_path_buf();
        let packer = move |sink| pack(&workspace, sink);
        let packed = self.upload_data(packer, &data_path).await?;
        let manifest = new_manifest(name, data, packed, key, retain_until);
        self.publish(name, &manifest, &data_path).await?;
        Ok(manifest)
    }

    /// Uploads the workspace `archive` streams as the snapshot `name`, as
    /// [`upload_for`](Self::upload_for) does a directory. The archive is a tar made where this
    /// host cannot look (inside a sandbox), so it is hostile input: it is repacked entry by
    /// entry into this crate's archive, never unpacked here; what a snapshot cannot hold is
    /// skipped and listed in the manifest (the `repack` module says what). The manifest is
    /// written only once `finished` says the archive's maker finished: a maker that failed,
    /// or went away without a word, leaves no snapshot.
    pub async fn upload_archive(
        &self,
        archive: mpsc::Receiver<Bytes>,
        finished: oneshot::Receiver<Result<(), String>>,
        name: &SnapshotName,
        key: Option<&str>,
        retain_until: Option<SystemTime>,
    ) -> Result<Manifest, SnapshotError> {
        let (data, data_path) = self.new_data_object(name).await?;
        let (to_repacker, from_archive) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let forwarder = tokio::spawn(forward_archive(archive, to_repacker));
        let packer = move |sink| repack::repack(ChunkSource::new(from_archive), sink);
        let uploaded = self.upload_data(packer, &data_path).await;
        // Ended with the archive, or to end now: the repacker read it to its end or failed.
        forwarder.abort();
        let maker = match finished.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(why),
            Err(_) => Err("its maker went away without saying it finished".to_string()),
        };
        let packed = match (uploaded, maker) {
            (Ok(packed), Ok(())) => packed,
            (Ok(_), Err(why)) => {
                // No manifest names the data: removing it is safe.
                let _ = self.store.delete(&data_path).await;
                return Err(SnapshotError::Source(why));
            }
            // The maker's failure explains a tar cut short better than the cut does.
            (Err(SnapshotError::Local(_)), Err(why)) => return Err(SnapshotError::Source(why)),
            (Err(SnapshotError::Local(e)), Ok(())) => {
                return Err(SnapshotError::Source(format!("not a whole tar: {e}")))
            }
            (Err(e), _) => return Err(e),
        };
        let manifest = new_manifest(name, data, packed, key, retain_until);
        self.publish(name, &manifest, &data_path).await?;
        Ok(manifest)
    }

    /// The name and path of a new upload's data object under `name`, once no manifest is
    /// there (`AlreadyExists` otherwise: the usual case of a late writer costs no transfer).
    async fn new_data_object(
        &self,
        name: &SnapshotName,
    ) -> Result<(String, ObjectPath), SnapshotError> {
        if self.exists(&self.object_path(name, MANIFEST)).await? {
            return Err(SnapshotError::AlreadyExists {
                name: name.to_string(),
            });
        }
        let data = format!("data-{}.tar", upload_id()?);
        let path = self.object_path(name, &data);
        Ok((data, path))
    }

    /// Packs into the data object at `data_path` with `packer` (on a blocking thread); on
    /// failure nothing is left there.
    async fn upload_data(
        &self,
        packer: impl FnOnce(ChunkSink) -> std::io::Result<Packed> + Send + 'static,
        data_path: &ObjectPath,
    ) -> Result<Packed, SnapshotError> {
        let (to_uploader, mut from_packer) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let packer = tokio::task::spawn_blocking(move || packer(ChunkSink::new(to_uploader)));
        let mut writer =
            DataWriter::new(self.store.clone(), data_path.clone(), self.config.part_size);
        let mut store_failure = None;
        while let Some(chunk) = from_packer.recv().await {
            if let Err(e) = writer.put(chunk, self.config.max_concurrency).await {
                store_failure = Some(e);
                break;
            }
        }
        // The packer stops at its next chunk once nobody takes them.
        drop(from_packer);
        let packed = packer.await.map_err(|e| SnapshotError::Local(e.into()));
        let failure = match (store_failure, packed) {
            (None, Ok(Ok(packed))) => {
                return match writer.finish().await {
                    Ok(()) => Ok(packed),
                    Err(e) => {
                        // A completion that failed may still have made the object; no manifest
                        // names it, so removing it is safe.
                        let _ = self.store.delete(data_path).await;
                        Err(SnapshotError::store(e))
                    }
                };
            }
            (Some(e), _) => SnapshotError::store(e),
            (None, Ok(Err(e))) => SnapshotError::Local(e),
            (None, Err(e)) => e,
        };
        writer.abort().await;
        Err(failure)
    }

    /// Writes the manifest, create-only where the store offers it. A put whose answer was lost
    /// is settled by reading the manifest back: the snapshot is ours if it names our data.
    async fn publish(
        &self,
        name: &SnapshotName,
        manifest: &Manifest,
        data_path: &ObjectPath,
    ) -> Result<(), SnapshotError> {
        let manifest_path = self.object_path(name, MANIFEST);
        let json = serde_json::to_vec_pretty(manifest)
            .map_err(|e| SnapshotError::Local(std::io::Error::other(e)))?;
        let payload = PutPayload::from(json);
        let create = PutOptions::from(PutMode::Create);
        let put_error = match self
            .store
            .put_opts(&manifest_path, payload.clone(), create)
            .await
        {
            Ok(_) => return Ok(()),
            Err(object_store::Error::NotImplemented) => {
                // No conditional put here: check, then put. A writer racing in that window
                // could replace the manifest (docs/snapshots.md).
                if !self.exists(&manifest_path).await? {
                    return match self.store.put(&manifest_path, payload).await {
                        Ok(_) => Ok(()),
                        Err(e) => Err(SnapshotError::store(e)),
                    };
                }
                object_store::Error::AlreadyExists {
                    path: manifest_path.to_string(),
                    source: "found before the put".into(),
                }
            }
            Err(e) => e,
        };
        match self.manifest(name).await {
            Ok(stored) if stored.data == manifest.data => Ok(()),
            Ok(_) | Err(SnapshotError::Corrupt { .. }) => {
                // Another writer's snapshot: ours is not the snapshot, and nothing names its data.
                let _ = self.store.delete(data_path).await;
                Err(SnapshotError::AlreadyExists {
                    name: name.to_string(),
                })
            }
            // The manifest may yet land from a put still in flight, so the data stays (an
            // orphan `discard` removes) rather than risk a manifest naming nothing.
            Err(_) => Err(SnapshotError::store(put_error)),
        }
    }

    /// The manifest of the snapshot `name`.
    pub async fn manifest(&self, name: &SnapshotName) -> Result<Manifest, SnapshotError> {
        let path = self.object_path(name, MANIFEST);
        let got = match self.store.get(&path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(SnapshotError::NotFound {
                    name: name.to_string(),
                })
            }
            Err(e) => return Err(SnapshotError::store(e)),
        };
        let bytes = got.bytes().await.map_err(SnapshotError::store)?;
        Manifest::from_json(&name.to_string(), &bytes)
    }

    /// Downloads the snapshot `name` into `target`, which must not exist, and returns its
    /// manifest. On any failure `target` is absent and nothing is left beside it.
    pub async fn download(
        &self,
        name: &SnapshotName,
        target: &Path,
    ) -> Result<Manifest, SnapshotError> {
        let manifest = self.manifest(name).await?;
        let exists = tokio::fs::symlink_metadata(target).await.is_ok();
        if exists {
            return Err(SnapshotError::TargetExists {
                path: target.display().to_string(),
            });
        }
        let data_path = self.object_path(name, &manifest.data);
        let got = match self.store.get(&data_path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(SnapshotError::corrupt(name, "the data object is missing"))
            }
            Err(e) => return Err(SnapshotError::store(e)),
        };
        if got.meta.size != manifest.data_size {
            let why = format!(
                "the data object is {} bytes, the manifest says {}",
                got.meta.size, manifest.data_size
            );
            return Err(SnapshotError::corrupt(name, why));
        }
        let (to_unpacker, from_downloader) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let staging = format!(".{}.unpack-{}", target_name(target)?, upload_id()?);
        let unpacker = {
            let manifest = manifest.clone();
            let target = target.to_path_buf();
            tokio::task::spawn_blocking(move || {
                unpack(
                    ChunkSource::new(from_downloader),
                    &manifest,
                    &target,
                    &staging,
                )
            })
        };
        forward(got.into_stream(), &to_unpacker).await;
        drop(to_unpacker);
        unpacker
            .await
            .map_err(|e| SnapshotError::Local(e.into()))??;
        Ok(manifest)
    }

    /// Streams the data object of the snapshot `name` into `to`, and returns its manifest once
    /// every byte went and the whole matched the manifest's size and hash. On an error what
    /// was sent is not the snapshot: the receiver throws it away. A manifest without a data
    /// hash (written before it was recorded) is refused, as nothing could check the stream.
    pub async fn fetch_archive(
        &self,
        name: &SnapshotName,
        to: mpsc::Sender<Bytes>,
    ) -> Result<Manifest, SnapshotError> {
        let manifest = self.manifest(name).await?;
        let Some(want) = manifest.data_hash.clone() else {
            let why = "the manifest records no data hash (written by an older version)";
            return Err(SnapshotError::corrupt(name, why));
        };
        let data_path = self.object_path(name, &manifest.data);
        let got = match self.store.get(&data_path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(SnapshotError::corrupt(name, "the data object is missing"))
            }
            Err(e) => return Err(SnapshotError::store(e)),
        };
        let mut stream = got.into_stream();
        let mut hasher = blake3::Hasher::new();
        let mut sent = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(SnapshotError::store)?;
            sent += chunk.len() as u64;
            if sent > manifest.data_size {
                return Err(SnapshotError::corrupt(name, "the data object is too long"));
            }
            hasher.update(&chunk);
            to.send(chunk)
                .await
                .map_err(|_| SnapshotError::ReceiverGone)?;
        }
        let got = hasher.finalize().to_hex().to_string();
        if sent != manifest.data_size || got != want {
            let why = format!(
                "the data object ({sent} bytes) differs from the manifest's ({} bytes)",
                manifest.data_size
            );
            return Err(SnapshotError::corrupt(name, why));
        }
        Ok(manifest)
    }

    /// Removes the snapshot `name`: every object under its name (an earlier failed upload's
    /// data too), the manifest last, so a discard cut short is finished by the next.
    pub async fn discard(&self, name: &SnapshotName) -> Result<(), SnapshotError> {
        let under = self.prefix.child(name.to_string());
        let manifest_path = self.object_path(name, MANIFEST);
        let mut listed = self.store.list(Some(&under));
        let mut found_manifest = false;
        let mut found_any = false;
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(SnapshotError::store)?;
            found_any = true;
            if meta.location == manifest_path {
                found_manifest = true;
                continue;
            }
            delete_present(&*self.store, &meta.location).await?;
        }
        if found_manifest {
            delete_present(&*self.store, &manifest_path).await?;
        }
        if !found_any {
            return Err(SnapshotError::NotFound {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// The snapshots whose recorded retention passed at `now` (the caller's clock), for the
    /// fleet sweep to discard. A snapshot without retention is kept until discarded; a
    /// manifest that does not parse, or an object not named as this crate names snapshots, is
    /// left alone (it is not this crate's to judge).
    pub async fn expired(&self, now: SystemTime) -> Result<Vec<SnapshotName>, SnapshotError> {
        let listed = self.list().await?;
        Ok(listed
            .into_iter()
            .filter(|(_, manifest)| manifest.expired_at(now))
            .map(|(name, _)| name)
            .collect())
    }

    /// Every complete snapshot under the prefix with its manifest, by name: a GET per
    /// snapshot. A manifest that does not parse, or that vanished since the listing, and an
    /// object not named as this crate names snapshots, are left out.
    pub async fn list(&self) -> Result<Vec<(SnapshotName, Manifest)>, SnapshotError> {
        let mut found = Vec::new();
        let mut listed = self.store.list(Some(&self.prefix));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(SnapshotError::store)?;
            let Some(name) = self.snapshot_of_manifest(&meta.location) else {
                continue;
            };
            match self.manifest(&name).await {
                Ok(manifest) => found.push((name, manifest)),
                Err(SnapshotError::Corrupt { .. } | SnapshotError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }

    /// The snapshot whose manifest is at `location`, if it is one.
    fn snapshot_of_manifest(&self, location: &ObjectPath) -> Option<SnapshotName> {
        let mut parts: Vec<_> = location.prefix_match(&self.prefix)?.collect();
        if parts.len() != 2 || parts[1].as_ref() != MANIFEST {
            return None;
        }
        parts.truncate(1);
        SnapshotName::parse(parts[0].as_ref()).ok()
    }

    async fn exists(&self, path: &ObjectPath) -> Result<bool, SnapshotError> {
        match self.store.head(path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(SnapshotError::store(e)),
        }
    }
}

/// Hands the data object's stream to the unpacker in batches of about [`pack::CHUNK`] bytes,
/// then its failure if it fails. Stops early when the unpacker stopped (its error says why).
async fn forward(
    mut stream: futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    to_unpacker: &mpsc::Sender<unpack::Delivery>,
) {
    let mut batch = Vec::new();
    let mut batched = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                let _ = to_unpacker.send(Ok(batch)).await;
                let _ = to_unpacker.send(Err(e)).await;
                return;
            }
        };
        batched += chunk.len();
        batch.push(chunk);
        if batched >= pack::CHUNK {
            batched = 0;
            if to_unpacker
                .send(Ok(std::mem::take(&mut batch)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let _ = to_unpacker.send(Ok(batch)).await;
}

/// Hands a streamed archive's chunks to the repacker, one at a time.
async fn forward_archive(mut archive: mpsc::Receiver<Bytes>, to: mpsc::Sender<unpack::Delivery>) {
    while let Some(chunk) = archive.recv().await {
        if to.send(Ok(vec![chunk])).await.is_err() {
            return;
        }
    }
}

/// The manifest of a snapshot whose data object `data` holds `packed`.
fn new_manifest(
    name: &SnapshotName,
    data: String,
    packed: Packed,
    key: Option<&str>,
    retain_until: Option<SystemTime>,
) -> Manifest {
    Manifest {
        format: MANIFEST_FORMAT,
        name: name.to_string(),
        data,
        data_size: packed.size,
        data_hash: Some(packed.hash),
        retain_until: retain_until.map(unix_seconds),
        key: key.map(str::to_string),
        entries: packed.entries,
        skipped: packed.skipped,
    }
}

/// Deletes `path`, already gone counting as deleted.
async fn delete_present(store: &dyn ObjectStore, path: &ObjectPath) -> Result<(), SnapshotError> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(SnapshotError::store(e)),
    }
}

/// A random name for one upload's data object or one download's staging directory.
fn upload_id() -> Result<String, SnapshotError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| SnapshotError::Local(std::io::Error::other(e.to_string())))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn target_name(target: &Path) -> Result<String, SnapshotError> {
    target
        .file_name()
        .and_then(|name| name.to_str())
        .map(str::to_string)
        .ok_or_else(|| {
            SnapshotError::Local(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a download target is a path ending in a UTF-8 name",
            ))
        })
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkeeper::SandboxId;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_round_trips_through_memory_and_is_written_once() {
        let snapshots = ObjectSnapshots::open("memory://", SnapshotsConfig::default()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        std::fs::create_dir_all(work.join("a/b")).unwrap();
        std::fs::write(work.join("a/b/c"), b"contents").unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", work.join("a/out")).unwrap();
        let name = SnapshotName::new(SandboxId(3), "mem").unwrap();

        let manifest = snapshots.upload(&work, &name, None).await.unwrap();
        let paths: Vec<_> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b", "a/out", "a/b/c"]);
        assert_eq!(manifest.file_bytes(), 8);
        let again = snapshots.upload(&work, &name, None).await;
        assert!(matches!(again, Err(SnapshotError::AlreadyExists { .. })));

        let back = tmp.path().join("back");
        assert_eq!(snapshots.download(&name, &back).await.unwrap(), manifest);
        assert_eq!(std::fs::read(back.join("a/b/c")).unwrap(), b"contents");
        let link = std::fs::read_link(back.join("a/out")).unwrap();
        assert_eq!(link, Path::new("../../etc/passwd"));

        let missing = SnapshotName::new(SandboxId(4), "mem").unwrap();
        let got = snapshots.download(&missing, &tmp.path().join("none")).await;
        assert!(matches!(got, Err(SnapshotError::NotFound { .. })));
        let not_a_dir = snapshots.upload(&work.join("a/b/c"), &missing, None).await;
        assert!(matches!(not_a_dir, Err(SnapshotError::Local(_))));
        assert!(matches!(
            snapshots.manifest(&missing).await,
            Err(SnapshotError::NotFound { .. })
        ));
    }
}
