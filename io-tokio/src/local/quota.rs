//! A workspace's disk quota ([`Limits::workspace_bytes`](super::Limits::workspace_bytes)): what
//! a sandbox's files may take on disk, counted by the keeper.
//!
//! The host file system may have no quota of its own (ext4 without project quotas, as on the
//! machines this was built on), and a per-sandbox file system would make a suspension a copy
//! rather than a rename. So the keeper counts: the blocks every entry of the workspace takes
//! (`st_blocks`, so a sparse file costs what it holds; a file with several links once), walked
//! without following a link (the walk never leaves the workspace, whatever a command planted).
//!
//! - An operation's write is admitted only if the workspace, with the file it replaces taken
//!   off and the new bytes on, stays within the quota: otherwise nothing is written and it fails
//!   [`OpError::QuotaExceeded`](crate::ops::OpError::QuotaExceeded).
//! - No kernel quota sees a command's writes (its single files are bounded by `RLIMIT_FSIZE`).
//!   With one bubblewrap per sandbox the keeper's watch (`limit_watch.rs`) counts the workspace
//!   while the sandbox has processes, and past the quota kills them all (a running command
//!   fails `QuotaExceeded`); with one per command, a command is not stopped while it writes.
//!   Once it ended, the workspace is counted again before the next write or command; while it
//!   is over the quota, writes and commands fail `QuotaExceeded`. Reads, lists and removals
//!   still work, so the caller can make room.
//!
//! Every command's admission counts the workspace afresh (one `fstatat` per entry). A write's
//! admission uses the count cached since, forgotten after anything that changes the workspace
//! behind the keeper's back (a command, a removal, a mirror upload); a process a command left
//! running in the sandbox's namespace is caught by the watch, which kills it once the workspace
//! is over its quota (it overshoots by what it writes in one interval of the watch). The
//! keeper's own writes (mirror uploads) are counted in the total but never refused; its records
//! of the sandbox live outside the workspace (`meta.rs`).

use std::collections::HashSet;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The deepest directory the walk descends into; a deeper tree counts as over any quota (a
/// command that nests directories this deep is not doing work a keeper should count).
const MAX_DEPTH: usize = 4096;

/// A write or command refused: the workspace takes (or would take) `used` bytes of `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
    /// Bytes the workspace takes, or would take with the write.
    pub(crate) used: u64,
    /// The quota.
    pub(crate) limit: u64,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the workspace would take {} bytes of its quota of {}",
            self.used, self.limit
        )
    }
}

impl std::error::Error for Exceeded {}

impl From<Exceeded> for io::Error {
    fn from(e: Exceeded) -> Self {
        io::Error::new(io::ErrorKind::QuotaExceeded, e)
    }
}

/// The quota refusal inside `e`, if that is what it carries.
pub(crate) fn exceeded(e: &io::Error) -> Option<Exceeded> {
    e.get_ref()?.downcast_ref::<Exceeded>().copied()
}

/// One sandbox's quota and its cached count.
#[derive(Debug)]
pub(crate) struct Quota {
    limit: Option<u64>,
    /// The bytes the workspace takes, when known (`None`: count again).
    used: Mutex<Option<u64>>,
}

impl Quota {
    /// A quota of `limit` bytes (`None`: unlimited, and nothing is ever counted).
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Quota {
            limit,
            used: Mutex::new(None),
        }
    }

    /// Something changed the workspace behind the keeper's back: count again next time.
    pub(crate) fn forget(&self) {
        *self.used.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A command may start in the workspace `ws`: it is within its quota, counted afresh (a
    /// process a command left running may have written since). Blocks (a walk).
    pub(crate) fn admit_command(&self, ws: impl AsFd) -> io::Result<()> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = None;
        let now = current(&mut used, ws)?;
        if now > limit {
            return Err(Exceeded { used: now, limit }.into());
        }
        Ok(())
    }

    /// Runs `write`, which replaces the file `name` in the directory `parent` of the workspace
    /// `ws` with `len` bytes, if the workspace stays within its quota with it; then counts the
    /// file as written. Blocks (a walk when the count is not known).
    pub(crate) fn admit_write(
        &self,
        ws: impl AsFd,
        parent: impl AsFd,
        name: &str,
        len: u64,
        write: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(limit) = self.limit else {
            return write();
        };
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let now = current(&mut used, ws)?;
        let old = taken(parent.as_fd(), name);
        let wanted = now.saturating_sub(old).saturating_add(len);
        if wanted > limit {
            return Err(Exceeded {
                used: wanted,
                limit,
            }
            .into());
        }
        let written = write();
        // What the new file really takes (blocks, not bytes); unknown after a failure.
        *used = match written {
            Ok(()) => Some(now.saturating_sub(old) + taken(parent.as_fd(), name)),
            Err(_) => None,
        };
        written
    }
}

/// The count in `used`, walking `ws` when it is not known.
fn current(used: &mut Option<u64>, ws: impl AsFd) -> io::Result<u64> {
    if let Some(n) = *used {
        return Ok(n);
    }
    let n = measure(ws)?;
    *used = Some(n);
    Ok(n)
}

/// What the entry `name` of `dir` takes on disk, not following a link (0 when there is none,
/// or when it has other links, whose blocks stay).
fn taken(dir: impl AsFd, name: &str) -> u64 {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_nlink <= 1 => blocks(&st),
        _ => 0,
    }
}

fn blocks(st: &rfs::Stat) -> u64 {
    (st.st_blocks as u64).saturating_mul(512)
}

/// The bytes on disk every entry under the directory `ws` takes (the directories themselves
/// included, a file with several links once), never following a link. Blocks.
pub(crate) fn measure(ws: impl AsFd) -> io::Result<u64> {
    let flags =
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    // Opened afresh for reading (the handle given may be one that cannot list, `O_PATH`).
    let top = rfs::openat(ws.as_fd(), ".", flags, Mode::empty())?;
    let mut total = blocks(&rfs::fstat(&top)?);
    let mut stack: Vec<(OwnedFd, usize)> = vec![(top, 0)];
    while let Some((dir, depth)) = stack.pop() {
        for entry in rfs::Dir::read_from(&dir)? {
            let entry = entry?;
            let name: &CStr = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let st = match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed since it was listed (a command still running): not there to count.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if st.st_nlink > 1
                && FileType::from_raw_mode(st.st_mode) != FileType::Directory
                && !seen.insert((st.st_dev, st.st_ino))
            {
                continue;
            }
            total = total.saturating_add(blocks(&st));
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                if depth + 1 >= MAX_DEPTH {
                    return Ok(u64::MAX);
                }
                match rfs::openat(&dir, name, flags, Mode::empty()) {
                    Ok(sub) => stack.push((sub, depth + 1)),
                    // Replaced by something else since it was listed: counted as it was.
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("sk-quota-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn open(d: &std::path::Path) -> OwnedFd {
        rfs::open(d, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    /// The walk counts files in nested directories, a file with two links once, and never
    /// follows a link out (here to a directory of 4 MiB outside).
    #[test]
    fn the_walk_counts_blocks_once_and_never_follows_a_link() {
        let (ws, outside) = (dir("ws"), dir("outside"));
        std::fs::write(outside.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), vec![1u8; 256 << 10]).unwrap();
        std::fs::hard_link(ws.join("a/b/f"), ws.join("a/g")).unwrap();
        symlink(&outside, ws.join("out")).unwrap();
        let n = measure(open(&ws)).unwrap();
        assert!((256 << 10..1 << 20).contains(&n), "counted {n}");
        let _ = std::fs::remove_dir_all(&ws);
        let _ = std::fs::remove_dir_all(&outside);
    }

    /// A write that would pass the quota writes nothing; replacing a file counts the new size
    /// only; after `forget` the walk counts again.
    #[test]
    fn a_write_is_admitted_with_the_file_it_replaces_taken_off() {
        let ws = dir("admit");
        let fd = open(&ws);
        let q = Quota::new(Some(1 << 20));
        let put = |name: &str, n: usize| {
            let path = ws.join(name);
            q.admit_write(&fd, &fd, name, n as u64, || {
                std::fs::write(&path, vec![7u8; n])
            })
        };
        put("a", 600 << 10).unwrap();
        let e = put("b", 600 << 10).unwrap_err();
        assert!(exceeded(&e).is_some(), "{e}");
        assert!(!ws.join("b").exists());
        put("a", 900 << 10).unwrap();
        std::fs::remove_file(ws.join("a")).unwrap();
        q.forget();
        put("b", 900 << 10).unwrap();
        std::fs::write(ws.join("c"), vec![1u8; 300 << 10]).unwrap();
        q.forget();
        assert!(exceeded(&q.admit_command(&fd).unwrap_err()).is_some());
        let _ = std::fs::remove_dir_all(&ws);
    }
}
