//! Packing a workspace into the snapshot's archive, on a blocking thread: a walk that never
//! follows a link, writing a tar into chunks handed to the uploader as they fill, so the
//! workspace is never held in memory; hashing every file on the way.

use std::fs::{self, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use tar::{EntryType, Header};
use tokio::sync::mpsc;

use crate::manifest::{Entry, EntryKind, Skipped};

/// The size of the chunks handed to the uploader.
pub(crate) const CHUNK: usize = 1 << 20;

/// What packing a workspace produced, for its manifest.
pub(crate) struct Packed {
    pub(crate) entries: Vec<Entry>,
    pub(crate) skipped: Vec<Skipped>,
    pub(crate) size: u64,
    /// BLAKE3 of the whole archive, hex.
    pub(crate) hash: String,
}

/// Writes the archive of `workspace` into `sink`. An error of kind `BrokenPipe` means the
/// uploader stopped taking chunks (its own error is the one to report).
pub(crate) fn pack(workspace: &Path, sink: ChunkSink) -> io::Result<Packed> {
    let root = fs::symlink_metadata(workspace)?;
    if !root.is_dir() {
        let why = "a workspace is a directory, not a link or a file";
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    let mut archive = Archive::new(sink);
    // Directories still to list, relative to the workspace; each was added before it is listed.
    let mut pending = vec![String::new()];
    while let Some(dir) = pending.pop() {
        let mut children = Vec::new();
        for child in fs::read_dir(workspace.join(&dir))? {
            children.push(child?.file_name());
        }
        children.sort();
        let mut subdirs = Vec::new();
        for child in children {
            let Some(child) = child.to_str() else {
                let path = format!("{dir}{}", child.to_string_lossy());
                archive.skip(path, "a name that is not UTF-8");
                continue;
            };
            let path = format!("{dir}{child}");
            if archive.add(workspace, &path)? {
                subdirs.push(format!("{path}/"));
            }
        }
        pending.extend(subdirs.into_iter().rev());
    }
    archive.finish()
}

/// The archive being written and the manifest's entries so far.
pub(crate) struct Archive {
    pub(crate) builder: tar::Builder<HashingWriter<ChunkSink>>,
    pub(crate) entries: Vec<Entry>,
    pub(crate) skipped: Vec<Skipped>,
}

impl Archive {
    /// An empty archive written into `sink`.
    pub(crate) fn new(sink: ChunkSink) -> Self {
        Archive {
            builder: tar::Builder::new(HashingWriter::new(sink)),
            entries: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Writes the end-of-archive blocks and hands over the last chunk.
    pub(crate) fn finish(self) -> io::Result<Packed> {
        let writer = self.builder.into_inner()?;
        let (sink, size, hash) = writer.finish();
        sink.finish()?;
        Ok(Packed {
            entries: self.entries,
            skipped: self.skipped,
            size,
            hash,
        })
    }

    /// Adds the entry at `path` (relative to `workspace`); true when it is a directory whose
    /// children come next.
    fn add(&mut self, workspace: &Path, path: &str) -> io::Result<bool> {
        let full = workspace.join(path);
        let meta = fs::symlink_metadata(&full)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            let mode = meta.permissions().mode() & 0o777;
            let mut header = header(EntryType::Directory, mode, &meta);
            self.builder.append_data(&mut header, path, io::empty())?;
            self.entries.push(Entry {
                path: path.to_string(),
                kind: EntryKind::Dir { mode },
            });
            return Ok(true);
        }
        if kind.is_symlink() {
            let target = fs::read_link(&full)?;
            let Some(target) = target.to_str() else {
                self.skip(path.to_string(), "a link whose target is not UTF-8");
                return Ok(false);
            };
            let mut header = header(EntryType::Symlink, 0o777, &meta);
            self.builder.append_link(&mut header, path, target)?;
            self.entries.push(Entry {
                path: path.to_string(),
                kind: EntryKind::Symlink {
                    target: target.to_string(),
                },
            });
            return Ok(false);
        }
        if kind.is_file() {
            self.add_file(&full, path, &meta)?;
            return Ok(false);
        }
        let why = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        self.skip(path.to_string(), why);
        Ok(false)
    }

    /// Adds the regular file at `full`, opened without following a link or waiting, and
    /// checked to be the regular file of the size the walk saw.
    fn add_file(&mut self, full: &Path, path: &str, seen: &Metadata) -> io::Result<()> {
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits() as i32)
            .open(full)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() != seen.len() {
            return Err(changed(path));
        }
        let mode = meta.permissions().mode() & 0o777;
        let size = meta.len();
        let mut header = header(EntryType::Regular, mode, &meta);
        header.set_size(size);
        let mut contents = HashingReader::new(file.take(size));
        self.builder.append_data(&mut header, path, &mut contents)?;
        let (read, hash) = contents.finish();
        if read != size {
            return Err(changed(path));
        }
        self.entries.push(Entry {
            path: path.to_string(),
            kind: EntryKind::File {
                mode,
                size,
                mtime: header.mtime().unwrap_or(0),
                hash,
            },
        });
        Ok(())
    }

    pub(crate) fn skip(&mut self, path: String, why: &str) {
        self.skipped.push(Skipped {
            path,
            why: why.to_string(),
        });
    }
}

/// The error for a file that changed while it was packed (a workspace is stopped when it is
/// snapshotted, so something outside the keeper wrote to it).
fn changed(path: &str) -> io::Error {
    io::Error::other(format!("{path} changed while the snapshot was taken"))
}

/// A tar header for an entry: its type, permission bits and modification time.
fn header(kind: EntryType, mode: u32, meta: &Metadata) -> Header {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    header_of(kind, mode, mtime)
}

/// A tar header of this crate's archives: the type, permission bits and modification time,
/// size 0 (a file's is set after).
pub(crate) fn header_of(kind: EntryType, mode: u32, mtime: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(0);
    header.set_mtime(mtime);
    header
}

/// The blocking end of the pipe to the uploader: collects the archive into [`CHUNK`]-sized
/// chunks and hands each over as it fills (waiting while the uploader is [`CHUNK`]s behind).
pub(crate) struct ChunkSink {
    to_uploader: mpsc::Sender<Bytes>,
    filling: Vec<u8>,
}

impl ChunkSink {
    pub(crate) fn new(to_uploader: mpsc::Sender<Bytes>) -> Self {
        ChunkSink {
            to_uploader,
            filling: Vec::with_capacity(CHUNK),
        }
    }

    fn hand_over(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.filling, Vec::with_capacity(CHUNK));
        self.to_uploader
            .blocking_send(Bytes::from(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the uploader stopped"))
    }

    /// Hands over the last, partly filled chunk.
    fn finish(mut self) -> io::Result<()> {
        if self.filling.is_empty() {
            return Ok(());
        }
        self.hand_over()
    }
}

impl Write for ChunkSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.filling.len();
        let taken = buf.len().min(room);
        self.filling.extend_from_slice(&buf[..taken]);
        if self.filling.len() == CHUNK {
            self.hand_over()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A writer that counts and hashes what passes through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    written: u64,
    hasher: blake3::Hasher,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            written: 0,
            hasher: blake3::Hasher::new(),
        }
    }

    /// The writer, the bytes written and their hash, hex.
    fn finish(self) -> (W, u64, String) {
        let hash = self.hasher.finalize().to_hex().to_string();
        (self.inner, self.written, hash)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: blake3::Hasher,
    read: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: blake3::Hasher::new(),
            read: 0,
        }
    }

    /// The bytes read and their hash, hex.
    pub(crate) fn finish(self) -> (u64, String) {
        (self.read, self.hasher.finalize().to_hex().to_string())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}
