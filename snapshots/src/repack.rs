//! Repacking a tar made inside a sandbox (a pod's `tar -c`) into this crate's archive, on a
//! blocking thread: the input is hostile, so nothing of it is trusted but what is checked here,
//! and nothing of it touches this host's file system.
//!
//! Every input entry becomes one entry of the output, written afresh by this crate (its path,
//! type, permission bits, time and contents; nothing else of the input header survives), or is
//! skipped and listed in the manifest with why:
//! - a path that is not UTF-8, not `/`-separated normal components (after the leading `./`
//!   that `tar -c -C dir .` writes), longer than [`MAX_PATH`], made already, or whose parent
//!   is not a directory of the output (so no entry ever lands through a link or outside);
//! - a hard link (its contents are kept once, at the path it links to), a FIFO, a device, or
//!   anything else but a directory, a regular file or a symbolic link.
//!
//! An input that is not a tar, or that ends inside an entry, fails the repack; so does one of
//! more than [`MAX_ENTRIES`] entries (the manifest is held in memory).

use std::collections::HashSet;
use std::io::{self, Read};

use tar::EntryType;

use crate::manifest::{Entry, EntryKind};
use crate::pack::{header_of, Archive, ChunkSink, HashingReader, Packed};

/// The most entries a repacked archive may have.
pub const MAX_ENTRIES: usize = 1 << 20;

/// The longest path a repacked entry may have, in bytes.
pub const MAX_PATH: usize = 4096;

/// The most bytes read after the end-of-archive blocks (`tar` pads an archive to its record
/// size, 10 KiB by default): read to the input's end, so its maker is never cut off.
pub const MAX_TRAILING: u64 = 1 << 20;

/// Repacks the tar `input` into `sink`, reading `input` to its end. An error of kind
/// `BrokenPipe` means the uploader stopped taking chunks (its own error is the one to report).
pub(crate) fn repack(mut input: impl Read, sink: ChunkSink) -> io::Result<Packed> {
    let mut out = Repacked {
        archive: Archive::new(sink),
        paths: HashSet::new(),
        dirs: HashSet::new(),
    };
    {
        let mut tar = tar::Archive::new(&mut input);
        for entry in tar.entries()? {
            let entry = entry?;
            if out.paths.len() + out.archive.skipped.len() >= MAX_ENTRIES {
                let why = format!("the workspace has more than {MAX_ENTRIES} entries");
                return Err(io::Error::new(io::ErrorKind::InvalidData, why));
            }
            out.add(entry)?;
        }
    }
    let trailing = io::copy(&mut (&mut input).take(MAX_TRAILING + 1), &mut io::sink())?;
    if trailing > MAX_TRAILING {
        let why = format!("more than {MAX_TRAILING} bytes after the end of the archive");
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    out.archive.finish()
}

/// The output so far, and what it holds.
struct Repacked {
    archive: Archive,
    /// Every path written.
    paths: HashSet<String>,
    /// The directories written: the only parents an entry may have.
    dirs: HashSet<String>,
}

impl Repacked {
    /// Writes `entry` to the output, or lists it as skipped.
    fn add<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> io::Result<()> {
        let raw = entry.path_bytes().into_owned();
        let Some(path) = self.checked_path(&raw) else {
            return Ok(());
        };
        let header = entry.header();
        let mode = header.mode().map_or(0o644, |mode| mode & 0o777);
        let mtime = header.mtime().unwrap_or(0);
        match header.entry_type() {
            EntryType::Directory => {
                let mut header = header_of(EntryType::Directory, mode, mtime);
                self.archive
                    .builder
                    .append_data(&mut header, &path, io::empty())?;
                self.written(path.clone(), EntryKind::Dir { mode });
                self.dirs.insert(path);
            }
            EntryType::Regular | EntryType::Continuous => {
                let size = entry.size();
                let mut header = header_of(EntryType::Regular, mode, mtime);
                header.set_size(size);
                let mut contents = HashingReader::new((&mut entry).take(size));
                self.archive
                    .builder
                    .append_data(&mut header, &path, &mut contents)?;
                let (read, hash) = contents.finish();
                if read != size {
                    let why = format!("the archive ends inside {path:?}");
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, why));
                }
                let kind = EntryKind::File {
                    mode,
                    size,
                    mtime,
                    hash,
                };
                self.written(path, kind);
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                let Ok(target) = String::from_utf8(target) else {
                    self.archive.skip(path, "a link whose target is not UTF-8");
                    return Ok(());
                };
                let mut header = header_of(EntryType::Symlink, 0o777, mtime);
                self.archive
                    .builder
                    .append_link(&mut header, &path, &target)?;
                self.written(path, EntryKind::Symlink { target });
            }
            EntryType::Link => {
                let to = String::from_utf8_lossy(&entry.link_name_bytes().unwrap_or_default())
                    .into_owned();
                let why = format!("a hard link (its contents are kept at {to:?})");
                self.archive.skip(path, &why);
            }
            other => {
                let why = match other {
                    EntryType::Fifo => "a FIFO".to_string(),
                    EntryType::Char | EntryType::Block => "a device".to_string(),
                    other => format!("a tar entry of type {other:?}"),
                };
                self.archive.skip(path, &why);
            }
        }
        Ok(())
    }

    /// The entry's path, once it is one this output may hold; otherwise listed as skipped and
    /// `None`. The root itself (`.`, `./`) is neither.
    fn checked_path(&mut self, raw: &[u8]) -> Option<String> {
        let lossy = || {
            String::from_utf8_lossy(raw)
                .chars()
                .take(MAX_PATH)
                .collect()
        };
        let Ok(text) = std::str::from_utf8(raw) else {
            self.archive.skip(lossy(), "a name that is not UTF-8");
            return None;
        };
        let mut path = text;
        while let Some(rest) = path.strip_prefix("./") {
            path = rest;
        }
        let path = path.trim_end_matches('/');
        if path.is_empty() || path == "." {
            return None;
        }
        let why = if path.len() > MAX_PATH {
            "a path longer than 4096 bytes"
        } else if !path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
        {
            "not a plain relative path (it could escape)"
        } else if self.paths.contains(path) {
            "twice in the archive"
        } else if path
            .rsplit_once('/')
            .is_some_and(|(parent, _)| !self.dirs.contains(parent))
        {
            "not inside a directory of the archive"
        } else {
            return Some(path.to_string());
        };
        self.archive.skip(lossy(), why);
        None
    }

    fn written(&mut self, path: String, kind: EntryKind) {
        self.paths.insert(path.clone());
        self.archive.entries.push(Entry { path, kind });
    }
}
