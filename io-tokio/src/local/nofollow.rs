//! File work inside a workspace that never goes through a link: the keeper's own (the session
//! mirrors it uploads) and the application's operations (`ops.rs`). The keeper's metadata is
//! not in a workspace at all (`meta.rs`).
//!
//! A workspace is its commands' to change. Any name in it, `.sandkeeper/` and everything in it
//! included, may be a link a command planted (to another sandbox, to a host file, to the
//! keeper's own directory), a FIFO, a device. So every step here goes through a directory
//! handle, one path component at a time:
//!
//! - a directory is opened with `O_DIRECTORY | O_NOFOLLOW` (a link in any component is refused
//!   as [`Refused::Link`], never followed);
//! - a file is written as a new file (`O_CREAT | O_EXCL | O_NOFOLLOW`) under a short random name
//!   (`.sk-<16 hex>`, 20 bytes, so a target name of 255 bytes still works) in the target's own
//!   directory handle, synced, then renamed over the target within that handle: a link at the
//!   target's name is replaced, never written through;
//! - a file is read only when `fstat` on the opened handle says it is a regular file, opened
//!   with `O_NONBLOCK` (opening a FIFO never waits for a writer) and read up to a cap;
//! - the keeper's own directories ([`claim_dir`]) are the keeper's: anything else found at
//!   their name (a link, a file) is removed (never followed) and the directory made.
//!
//! Refusals travel inside an [`io::Error`] as a [`Refused`] ([`refusal`] finds it), so each
//! caller's error mapping types them: an operation's `OpError`, the backend's `BackendError`.
//! Everything here blocks: callers run it on a blocking thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why the keeper refused to act on a name in a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It is a symbolic link, which is never followed.
    Link,
    /// It is not a regular file (a directory, a FIFO, a socket, a device).
    NotAFile,
    /// It is not a directory where one was meant.
    NotADirectory,
    /// It is larger than the cap (the cap).
    TooLarge(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Link => f.write_str("a symbolic link (never followed)"),
            Refused::NotAFile => f.write_str("not a regular file"),
            Refused::NotADirectory => f.write_str("not a directory"),
            Refused::TooLarge(cap) => write!(f, "larger than {cap} bytes"),
        }
    }
}

impl std::error::Error for Refused {}

impl From<Refused> for io::Error {
    fn from(r: Refused) -> Self {
        let kind = match r {
            Refused::TooLarge(_) => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, r)
    }
}

/// The refusal `e` carries, if it is one.
pub(crate) fn refusal(e: &io::Error) -> Option<Refused> {
    e.get_ref()?.downcast_ref::<Refused>().copied()
}

/// How a directory is opened: never through a link, never waiting.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC
}

/// What an open of a directory that failed with `e` met at `name` in `dir`: a link, something
/// that is not a directory, or the error itself.
fn classify_dir(dir: BorrowedFd<'_>, name: impl AsRef<Path>, e: Errno) -> io::Error {
    if e != Errno::LOOP && e != Errno::NOTDIR {
        return e.into();
    }
    match rfs::statat(dir, name.as_ref(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => Refused::Link.into(),
        Ok(_) => Refused::NotADirectory.into(),
        Err(e) => e.into(),
    }
}

/// Opens the directory at `path`, a path the keeper itself names (a sandbox or snapshot
/// directory under its root). Its last component is not followed; the components above it are
/// the configured root's.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    rfs::open(path, dir_flags(), Mode::empty()).map_err(|e| classify_dir(rfs::CWD, path, e))
}

/// Opens the directory `name` (one component) in `dir`, never through a link.
pub(crate) fn open_subdir(dir: impl AsFd, name: &str) -> io::Result<OwnedFd> {
    let dir = dir.as_fd();
    rfs::openat(dir, name, dir_flags(), Mode::empty()).map_err(|e| classify_dir(dir, name, e))
}

/// Opens the directory `rel` beneath `dir` (components separated by `/`; `.` is `dir` itself),
/// one component at a time, never through a link; with `make`, making missing ones.
pub(crate) fn open_beneath(dir: impl AsFd, rel: &str, make: bool) -> io::Result<OwnedFd> {
    let mut at = rfs::openat(dir.as_fd(), ".", dir_flags(), Mode::empty())?;
    if rel == "." || rel.is_empty() {
        return Ok(at);
    }
    for part in rel.split('/') {
        at = match open_subdir(&at, part) {
            Err(e) if make && e.kind() == io::ErrorKind::NotFound => {
                match rfs::mkdirat(&at, part, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open_subdir(&at, part)?
            }
            r => r?,
        };
    }
    Ok(at)
}

/// The keeper's own directory `name` in `dir` (`.sandkeeper`, a session's directory in it),
/// made if missing. Anything else at its name (a link, a file, a FIFO a command put there) is
/// removed, never followed, and the directory made: what the keeper writes lands in its own
/// directory, and nowhere else.
pub(crate) fn claim_dir(dir: impl AsFd, name: &str) -> io::Result<OwnedFd> {
    let dir = dir.as_fd();
    // Bounded: a command that keeps replacing it gets a refusal, not a loop.
    for _ in 0..4 {
        match open_subdir(dir, name) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match rfs::mkdirat(dir, name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if matches!(refusal(&e), Some(Refused::Link | Refused::NotADirectory)) => {
                tracing::warn!(
                    name,
                    "something other than the keeper's directory was at its name: removed"
                );
                match rfs::unlinkat(dir, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(Refused::NotADirectory.into())
}

/// A fresh temporary name: `.sk-<16 hex>`, 20 bytes (a target's name may have 255). Random per
/// process and counted, so concurrent writers never share one; a name taken (or planted) is
/// never used, as the file is made with `O_EXCL`.
fn temporary_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    format!(".sk-{:016x}", h.finish())
}

/// Writes `bytes` as the file `name` in `dir`, atomically: a new temporary file in `dir` (made
/// with `O_EXCL | O_NOFOLLOW`), synced, then renamed over `name` within `dir`. A reader sees the
/// old file or the new one, never a part; a link at `name` is replaced, never written through.
/// A directory at `name` is [`Refused::NotAFile`].
pub(crate) fn write_file(dir: impl AsFd, name: &str, bytes: &[u8]) -> io::Result<()> {
    let dir = dir.as_fd();
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut made = None;
    for _ in 0..16 {
        let tmp = temporary_name();
        match rfs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o666)) {
            Ok(fd) => {
                made = Some((tmp, fd));
                break;
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let Some((tmp, fd)) = made else {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free temporary name",
        ));
    };
    let written = (|| {
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        rfs::renameat(dir, tmp.as_str(), dir, name).map_err(|e| match e {
            Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => Refused::NotAFile.into(),
            e => io::Error::from(e),
        })
    })();
    if written.is_err() {
        let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    written
}

/// Reads the regular file `name` in `dir`, at most `cap` bytes ([`Refused::TooLarge`] beyond):
/// a link is [`Refused::Link`], anything but a regular file [`Refused::NotAFile`], and nothing
/// waits (a FIFO is refused at once).
pub(crate) fn read_file(dir: impl AsFd, name: &str, cap: usize) -> io::Result<Vec<u8>> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rfs::openat(dir.as_fd(), name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => return Err(Refused::Link.into()),
        Err(e) => return Err(e.into()),
    };
    read_opened(fd, cap)
}

/// Reads an opened handle if it is a regular file, at most `cap` bytes.
pub(crate) fn read_opened(fd: OwnedFd, cap: usize) -> io::Result<Vec<u8>> {
    let st = rfs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Refused::NotAFile.into());
    }
    // One byte past the cap tells a file over it; saturating, so `usize::MAX` reads it all.
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    File::from(fd).take(limit).read_to_end(&mut out)?;
    if out.len() > cap {
        return Err(Refused::TooLarge(cap).into());
    }
    Ok(out)
}

/// What is at `name` in `dir`, not following a link; `None` when nothing is.
pub(crate) fn kind_at(dir: impl AsFd, name: &str) -> io::Result<Option<FileType>> {
    match rfs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sk-nofollow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn temporary_names_are_short_and_distinct() {
        let a = temporary_name();
        let b = temporary_name();
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
    }

    #[test]
    fn links_are_refused_and_replaced_never_followed() {
        let dir = scratch("links");
        let outside = scratch("links-outside");
        std::fs::write(outside.join("f"), b"host").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("d")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), dir.join("f")).unwrap();
        let fd = open_dir(&dir).unwrap();
        let e = open_beneath(&fd, "d", false).unwrap_err();
        assert_eq!(refusal(&e), Some(Refused::Link));
        let e = read_file(&fd, "f", 100).unwrap_err();
        assert_eq!(refusal(&e), Some(Refused::Link));
        write_file(&fd, "f", b"mine").unwrap();
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"host");
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"mine");
        let claimed = claim_dir(&fd, "d").unwrap();
        write_file(&claimed, "x", b"x").unwrap();
        assert!(!outside.join("x").exists());
        assert!(dir.join("d/x").is_file());
        let e = open_beneath(&fd, "f/g", true).unwrap_err();
        assert_eq!(refusal(&e), Some(Refused::NotADirectory));
        let e = read_file(&fd, "d", 100).unwrap_err();
        assert_eq!(refusal(&e), Some(Refused::NotAFile));
        let e = write_file(&fd, "d", b"x").unwrap_err();
        assert_eq!(refusal(&e), Some(Refused::NotAFile));
    }
}
