//! Unpacking a snapshot's archive, on a blocking thread, into a staging directory beside the
//! target, renamed to the target only once every entry and the whole archive agreed with the
//! manifest: the target is made whole or not at all.
//!
//! Every entry must be the manifest's next one, its path `/`-separated normal components whose
//! parent is a directory this unpack made (so nothing is ever written through a link, and no
//! entry lands outside the staging directory), its header must agree with the manifest (kind,
//! mode, time, size, link target), each file's contents must hash to the manifest's hash, and
//! the archive's size must be the manifest's. Links are made as links with
//! the recorded target, wherever it points, and never followed.

use std::collections::{HashSet, VecDeque};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use tar::EntryType;
use tokio::sync::mpsc;

use crate::manifest::{Entry, EntryKind, Manifest};
use crate::SnapshotError;

/// What the downloader hands the unpacker: the data object's next chunks (about
/// [`crate::pack::CHUNK`] bytes together, so the two threads meet once a chunk rather than once
/// a network read), or the store's failure.
pub(crate) type Delivery = Result<Vec<Bytes>, object_store::Error>;

/// The blocking end of the pipe from the downloader, read as a stream of bytes.
pub(crate) struct ChunkSource {
    from_downloader: mpsc::Receiver<Delivery>,
    pending: VecDeque<Bytes>,
    current: Bytes,
}

impl ChunkSource {
    pub(crate) fn new(from_downloader: mpsc::Receiver<Delivery>) -> Self {
        ChunkSource {
            from_downloader,
            pending: VecDeque::new(),
            current: Bytes::new(),
        }
    }
}

impl Read for ChunkSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if let Some(next) = self.pending.pop_front() {
                self.current = next;
                continue;
            }
            match self.from_downloader.blocking_recv() {
                Some(Ok(chunks)) => self.pending.extend(chunks),
                Some(Err(store)) => return Err(io::Error::other(store)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// A reader that counts what passes through it.
struct CountingReader<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Unpacks `source` as the snapshot `manifest` describes into `target`, which must not exist.
pub(crate) fn unpack(
    source: ChunkSource,
    manifest: &Manifest,
    target: &Path,
    staging_name: &str,
) -> Result<(), SnapshotError> {
    let parent = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let staging = parent.join(staging_name);
    fs::create_dir(&staging).map_err(SnapshotError::Local)?;
    let result = unpack_into(source, manifest, &staging).and_then(|()| {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &staging,
            rustix::fs::CWD,
            target,
            rustix::fs::RenameFlags::NOREPLACE,
        )
        .map_err(|e| match e {
            rustix::io::Errno::EXIST => SnapshotError::TargetExists {
                path: target.display().to_string(),
            },
            e => SnapshotError::Local(e.into()),
        })
    });
    if result.is_err() {
        // `remove_dir_all` never follows a link, so a link the archive made is removed, not
        // what it points to.
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

/// Unpacks into `staging`, checking everything against the manifest.
fn unpack_into(
    source: ChunkSource,
    manifest: &Manifest,
    staging: &Path,
) -> Result<(), SnapshotError> {
    let name = manifest.name.as_str();
    let mut reader = CountingReader {
        inner: source,
        read: 0,
    };
    let mut made = Made::default();
    let mut expected = manifest.entries.iter();
    {
        let mut archive = tar::Archive::new(&mut reader);
        let entries = archive.entries().map_err(|e| read_failure(name, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| read_failure(name, e))?;
            let Some(want) = expected.next() else {
                return Err(SnapshotError::corrupt(
                    name,
                    "more entries than the manifest",
                ));
            };
            made.add(name, entry, want, staging)?;
        }
    }
    if let Some(missing) = expected.next() {
        let why = format!("the archive ends before {:?}", missing.path);
        return Err(SnapshotError::corrupt(name, why));
    }
    // The end-of-archive blocks: the object must end where the manifest says.
    io::copy(&mut reader, &mut io::sink()).map_err(|e| read_failure(name, e))?;
    if reader.read != manifest.data_size {
        let why = format!(
            "the archive is {} bytes, the manifest says {}",
            reader.read, manifest.data_size
        );
        return Err(SnapshotError::corrupt(name, why));
    }
    made.set_dir_modes(staging)
}

/// What this unpack has made so far, and the buffer it copies files through.
#[derive(Default)]
struct Made {
    /// The copy buffer (one per unpack: files are copied one at a time).
    buffer: Vec<u8>,
    /// Every path made, so none is made twice.
    paths: HashSet<String>,
    /// The directories made (real directories: the only parents an entry may have).
    dirs: HashSet<String>,
    /// The directories' permission bits, applied last (a read-only directory would refuse its
    /// children).
    dir_modes: Vec<(String, u32)>,
}

impl Made {
    /// Makes `entry`, which must be the manifest's `want`.
    fn add<R: Read>(
        &mut self,
        name: &str,
        mut entry: tar::Entry<'_, R>,
        want: &Entry,
        staging: &Path,
    ) -> Result<(), SnapshotError> {
        let path = std::str::from_utf8(&entry.path_bytes())
            .map(str::to_string)
            .map_err(|_| SnapshotError::corrupt(name, "an entry's path is not UTF-8"))?;
        if path != want.path {
            let why = format!("entry {path:?} where the manifest has {:?}", want.path);
            return Err(SnapshotError::corrupt(name, why));
        }
        self.check_path(name, &path)?;
        let full = staging.join(&path);
        let kind = entry.header().entry_type();
        let header_mode = entry.header().mode().ok().map(|mode| mode & 0o777);
        let mode_wanted = match &want.kind {
            EntryKind::Dir { mode } | EntryKind::File { mode, .. } => Some(*mode),
            EntryKind::Symlink { .. } => None,
        };
        if mode_wanted.is_some_and(|mode| header_mode != Some(mode)) {
            let why = format!("{path:?}'s mode differs from the manifest's");
            return Err(SnapshotError::corrupt(name, why));
        }
        match (&want.kind, kind) {
            (EntryKind::Dir { mode }, EntryType::Directory) => {
                fs::create_dir(&full).map_err(SnapshotError::Local)?;
                self.dirs.insert(path.clone());
                self.dir_modes.push((path.clone(), *mode));
            }
            (
                EntryKind::File {
                    mode,
                    size,
                    mtime,
                    hash,
                },
                EntryType::Regular,
            ) => {
                if entry.header().mtime().ok() != Some(*mtime) {
                    let why = format!("{path:?}'s time differs from the manifest's");
                    return Err(SnapshotError::corrupt(name, why));
                }
                if self.buffer.is_empty() {
                    self.buffer = vec![0u8; COPY_BUFFER];
                }
                let copy = Copy {
                    buffer: &mut self.buffer,
                    mode: *mode,
                    mtime: *mtime,
                };
                let (read, got) = write_file(name, &mut entry, &full, copy)?;
                if read != *size || got != *hash {
                    let why = format!("{path:?} differs from the manifest's {size} bytes");
                    return Err(SnapshotError::corrupt(name, why));
                }
            }
            (EntryKind::Symlink { target }, EntryType::Symlink) => {
                let link = entry.link_name_bytes().unwrap_or_default();
                if link.as_ref() != target.as_bytes() {
                    let why = format!("link {path:?} differs from the manifest's");
                    return Err(SnapshotError::corrupt(name, why));
                }
                std::os::unix::fs::symlink(target, &full).map_err(SnapshotError::Local)?;
            }
            (_, kind) => {
                let why = format!(
                    "{path:?} is a {kind:?} entry, the manifest says {:?}",
                    want.kind
                );
                return Err(SnapshotError::corrupt(name, why));
            }
        }
        self.paths.insert(path);
        Ok(())
    }

    /// Refuses a path that is not `/`-separated normal components, was made already, or whose
    /// parent is not a directory this unpack made.
    fn check_path(&self, name: &str, path: &str) -> Result<(), SnapshotError> {
        let normal = !path.is_empty()
            && path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
        if !normal {
            let why = format!("entry {path:?} is not a plain relative path (it could escape)");
            return Err(SnapshotError::corrupt(name, why));
        }
        if self.paths.contains(path) {
            return Err(SnapshotError::corrupt(
                name,
                format!("entry {path:?} twice"),
            ));
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !self.dirs.contains(parent) {
                let why = format!("entry {path:?} is not inside a directory of the archive");
                return Err(SnapshotError::corrupt(name, why));
            }
        }
        Ok(())
    }

    fn set_dir_modes(&self, staging: &Path) -> Result<(), SnapshotError> {
        for (path, mode) in self.dir_modes.iter().rev() {
            fs::set_permissions(staging.join(path), fs::Permissions::from_mode(*mode))
                .map_err(SnapshotError::Local)?;
        }
        Ok(())
    }
}

/// The size of the buffer files are copied through (large, so a file of a MiB is one write).
const COPY_BUFFER: usize = 64 << 10;

/// How to write one file: through which buffer, with what permission bits and time.
struct Copy<'a> {
    buffer: &'a mut [u8],
    mode: u32,
    mtime: u64,
}

/// Writes a new file at `full` from `contents`; the bytes read and their hash.
fn write_file(
    name: &str,
    contents: &mut impl Read,
    full: &Path,
    copy: Copy<'_>,
) -> Result<(u64, String), SnapshotError> {
    let Copy {
        buffer,
        mode,
        mtime,
    } = copy;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(full)
        .map_err(SnapshotError::Local)?;
    let mut hasher = blake3::Hasher::new();
    let mut read = 0u64;
    loop {
        let n = read_full(contents, buffer).map_err(|e| read_failure(name, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        read += n as u64;
        file.write_all(&buffer[..n]).map_err(SnapshotError::Local)?;
    }
    file.set_permissions(fs::Permissions::from_mode(mode & 0o777))
        .map_err(SnapshotError::Local)?;
    file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime))
        .map_err(SnapshotError::Local)?;
    Ok((read, hasher.finalize().to_hex().to_string()))
}

/// Reads until `buffer` is full or the reader ends; the bytes read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A failure reading the archive: the store's, when the downloader passed one on; otherwise
/// the archive is not what it should be.
fn read_failure(name: &str, error: io::Error) -> SnapshotError {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<object_store::Error>())
    {
        if let Some(inner) = error.into_inner() {
            if let Ok(store) = inner.downcast::<object_store::Error>() {
                return SnapshotError::store(*store);
            }
        }
        return SnapshotError::corrupt(name, "a store failure");
    }
    SnapshotError::corrupt(name, format!("reading the archive: {error}"))
}
