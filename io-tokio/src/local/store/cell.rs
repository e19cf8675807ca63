//! A compare-and-set cell on the file system: one mutable value of the fleet store (a key's
//! entry, a process lease, the incarnation counter), kept as a directory of versions, so that
//! writers on every process of the machine change it atomically **without holding anything**.
//! A process stopped at any instant (SIGSTOP, a long pause) stalls nobody: its write, when it
//! wakes, fails and it decides again on what it reads then.
//!
//! | name in the cell's directory | holds |
//! |---|---|
//! | `<n>` (decimal) | version `n` of the value, written whole before it got its name |
//!
//! - **Read**: list the directory, read the highest version. A version may be removed between
//!   the listing and the read (see pruning): the read lists again (bounded).
//! - **Write** on the version `b` it read: write the bytes whole to a private temporary file
//!   (`<fleet>/tmp/`), then `link(2)` it as `b + 1`. The link fails when the name exists, so of
//!   the writers that read `b`, exactly one gets `b + 1`; the others see a conflict, read again
//!   and decide again. A reader never sees part of a file: a version has its name only once it
//!   is whole.
//! - **Pruning**: the writer of version `n` removes the versions at or below `n - KEEP`, so a
//!   cell holds its newest [`KEEP`] versions (and whatever a crash left, removed by the next
//!   write).
//!
//! **Why a won link is a won write, and the one case where it is not known.** Pruning frees
//! names, so a writer stopped between its read (of `b`) and its link could link `b + 1` after
//! `b + 1` was written by another, built upon, and pruned: the link succeeds, yet the write did
//! not follow `b` (the ABA problem). Two facts rule it out: the highest version present never
//! goes down (a writer prunes only below what it wrote, and a writer removes its own version
//! only below the highest present), and a version `n` is removed only once a version at or
//! above `n + KEEP` exists. So after a successful link of `n` the writer lists the directory
//! once more: if the highest version is below `n + KEEP`, no version `n` was ever removed before
//! the link, so none existed (the link would have failed): the write is won, and it followed
//! `b`, since every other write after `b` would have had to take the name `n` first. If the
//! highest is `n + KEEP` or more, the link may have been late (then its version is below the
//! highest, read by nobody, and the writer removes it), or it was won and `KEEP` more writes
//! followed it before the writer looked: the outcome is [`Written::InDoubt`], which an
//! operation that may not apply twice reports as a failure whose effect may have landed (as a
//! store answer lost at its deadline already is), and an idempotent one simply tries again.
//! `KEEP` writes to one cell between a writer's link and its next listing take a stopped
//! writer: the doubt is as rare as that.
//!
//! The store's root must be on a file system with hard links (every local Linux one); staged
//! files and cells must be on the same one (they are: both under `<root>/.fleet/`).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How many of its newest versions a cell keeps.
pub(super) const KEEP: u64 = 8;

/// How many times a read lists again when the version it chose was pruned meanwhile (each
/// time took [`KEEP`] writes by others between a listing and a read).
const READ_ATTEMPTS: u32 = 100;

/// One cell: its directory and where its writers stage their files.
#[derive(Clone, Debug)]
pub(super) struct Cell {
    dir: PathBuf,
    tmp: PathBuf,
}

/// A cell's newest version as read: its number and bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Version {
    /// Its number (at least 1).
    pub(super) number: u64,
    /// What it holds.
    pub(super) bytes: Vec<u8>,
    /// Its file (for errors naming it).
    pub(super) path: PathBuf,
}

/// How a write on a version ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// The write followed the version it was made on: the cell holds it.
    Won,
    /// Another write followed that version first: nothing was written. Read again.
    Lost,
    /// Either the write was won and [`KEEP`] more writes followed it, or it lost: not known
    /// (see the module docs). If it was won, the cell has moved on from it since.
    InDoubt,
}

/// Why a cell could not be read.
#[derive(Debug)]
pub(super) enum CellError {
    /// The file system refused.
    Io(io::Error),
    /// The version chosen vanished at every one of [`READ_ATTEMPTS`] listings.
    Overtaken,
}

impl From<io::Error> for CellError {
    fn from(e: io::Error) -> Self {
        CellError::Io(e)
    }
}

impl Cell {
    /// The cell in `dir` (made at its first write), whose writers stage files in `tmp` (a
    /// directory on the same file system, which must exist).
    pub(super) fn new(dir: PathBuf, tmp: PathBuf) -> Self {
        Cell { dir, tmp }
    }

    /// The cell's directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The version numbers present, ascending (none when the cell was never written).
    fn versions(&self) -> io::Result<Vec<u64>> {
        let items = match fs::read_dir(&self.dir) {
            Ok(items) => items,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut out = vec![];
        for item in items {
            let name = item?.file_name();
            // Only names that are a version: decimal digits, no sign, no leading zero.
            if let Some(n) = name
                .to_str()
                .filter(|s| !s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
            {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The highest version number present (0: none).
    pub(super) fn newest(&self) -> io::Result<u64> {
        Ok(self.versions()?.last().copied().unwrap_or(0))
    }

    /// The newest version (`None`: the cell was never written).
    pub(super) fn read(&self) -> Result<Option<Version>, CellError> {
        for _ in 0..READ_ATTEMPTS {
            let number = self.newest()?;
            if number == 0 {
                return Ok(None);
            }
            let path = self.dir.join(number.to_string());
            match fs::read(&path) {
                Ok(bytes) => {
                    return Ok(Some(Version {
                        number,
                        bytes,
                        path,
                    }))
                }
                // Pruned after the listing: KEEP newer versions exist now.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CellError::Overtaken)
    }

    /// Writes `bytes` as the version after `base` (the number read; 0 for a cell never
    /// written, or the first number to follow, for a cell that continues a count kept
    /// elsewhere). See the module docs.
    pub(super) fn write(&self, base: u64, bytes: &[u8]) -> io::Result<Written> {
        let number = base + 1;
        fs::create_dir_all(&self.dir)?;
        let staged = Staged::new(&self.tmp, bytes)?;
        let target = self.dir.join(number.to_string());
        match fs::hard_link(&staged.0, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Written::Lost),
            // The staged file went: a sweep took it for a dead writer's (a writer stopped an
            // hour). Nothing was written.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Written::Lost),
            Err(e) => return Err(e),
        }
        // The look follows the link at once (the staged file goes after it, when dropped):
        // the doubt needs a stop between the two.
        let versions = self.versions()?;
        let newest = versions.last().copied().unwrap_or(0);
        if newest >= number + KEEP {
            // Below the newest: nobody reads it as the value; take it away (if that fails, a
            // later write's pruning does).
            remove(&target);
            return Ok(Written::InDoubt);
        }
        // Ascending, and only below what this write made: the newest is never removed. The
        // write is won whatever happens here: a version left is pruned by a later write.
        for old in versions.into_iter().take_while(|&v| v + KEEP <= number) {
            remove(&self.dir.join(old.to_string()));
        }
        Ok(Written::Won)
    }
}

/// Removes a version, best effort: one left behind is below the newest, read by nobody, and
/// pruned by a later write.
fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}

/// A staged file, whole and flushed, under a name no other writer uses; removed when dropped
/// (its linked name, if any, stays).
struct Staged(PathBuf);

impl Staged {
    fn new(tmp: &Path, bytes: &[u8]) -> io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            // The process id and a counter: unique among live processes; a name a dead
            // process left is skipped.
            let path = tmp.join(format!("{}-{n}", std::process::id()));
            let mut file = match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            let staged = Staged(path);
            file.write_all(bytes)?;
            file.sync_data()?;
            return Ok(staged);
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A scratch directory removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let path = std::env::temp_dir().join(format!(
                "sandkeeper-cell-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(path.join("tmp")).unwrap();
            Scratch(path)
        }

        fn cell(&self) -> Cell {
            Cell::new(self.0.join("cell"), self.0.join("tmp"))
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn value(version: &Option<Version>) -> u64 {
        version.as_ref().map_or(0, |v| {
            std::str::from_utf8(&v.bytes)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
    }

    /// Adds one to the counter the cell holds: the version won, or `None` when the write was
    /// in doubt (a thread descheduled between its link and its listing while the others wrote
    /// `KEEP` times: it may have landed).
    fn increment(cell: &Cell) -> Option<u64> {
        loop {
            let current = cell.read().unwrap();
            let base = current.as_ref().map_or(0, |v| v.number);
            let next = value(&current) + 1;
            match cell.write(base, format!("{next}\n").as_bytes()).unwrap() {
                Written::Won => return Some(base + 1),
                Written::Lost => continue,
                Written::InDoubt => return None,
            }
        }
    }

    #[test]
    fn racing_writers_never_both_win_a_version_and_no_increment_is_lost() {
        let scratch = Scratch::new();
        let per_thread = 200;
        let outcomes: Vec<Option<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let cell = scratch.cell();
                    s.spawn(move || {
                        (0..per_thread)
                            .map(|_| increment(&cell))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let won: Vec<u64> = outcomes.iter().flatten().copied().collect();
        let doubts = outcomes.len() - won.len();
        let distinct: BTreeSet<u64> = won.iter().copied().collect();
        assert_eq!(distinct.len(), won.len(), "a version won twice");
        // Every won increment is in the count; a doubtful one may be.
        let cell = scratch.cell();
        let count = value(&cell.read().unwrap());
        assert!(
            (won.len() as u64..=outcomes.len() as u64).contains(&count),
            "{count} for {} won and {doubts} in doubt",
            won.len()
        );
        assert_eq!(cell.newest().unwrap(), count, "one version per increment");
        // Pruned to the newest few; nothing staged left behind.
        assert!(cell.versions().unwrap().len() as u64 <= KEEP);
        assert_eq!(fs::read_dir(scratch.0.join("tmp")).unwrap().count(), 0);
    }

    /// A writer stopped between its read and its link, by construction: whatever happened
    /// meanwhile (one write, a few, enough that the version it aims at was written and pruned),
    /// its write never wins, and what the cell holds is never its.
    #[test]
    fn a_writer_stopped_between_read_and_link_never_wins_a_stale_version() {
        for others in [1, 2, KEEP, KEEP + 1, 3 * KEEP] {
            let scratch = Scratch::new();
            let cell = scratch.cell();
            increment(&cell).unwrap();
            // The stopped writer read version 1 (value 1) ...
            let read = cell.read().unwrap().unwrap();
            // ... others write meanwhile ...
            for _ in 0..others {
                increment(&cell).unwrap();
            }
            // ... and it wakes: its write must not be taken as following version 1.
            let outcome = cell.write(read.number, b"stale\n").unwrap();
            assert_ne!(outcome, Written::Won, "{others} writes meanwhile");
            let now = cell.read().unwrap();
            assert_eq!(value(&now), 1 + others, "{others} writes meanwhile");
            assert_eq!(now.unwrap().number, 1 + others);
            // The cell goes on from there.
            increment(&cell).unwrap();
            assert_eq!(value(&cell.read().unwrap()), 2 + others);
        }
    }

    #[test]
    fn a_reader_never_sees_a_torn_or_missing_value() {
        let scratch = Scratch::new();
        let writes = 100;
        std::thread::scope(|s| {
            let writer = {
                let cell = scratch.cell();
                s.spawn(move || {
                    for i in 1..=writes {
                        // Large enough to take more than one write(2) of a small buffer.
                        let digit = char::from(b'0' + (i % 10) as u8);
                        let bytes = digit.to_string().repeat(64 * 1024);
                        loop {
                            let base = cell.newest().unwrap();
                            if cell.write(base, bytes.as_bytes()).unwrap() == Written::Won {
                                break;
                            }
                        }
                    }
                })
            };
            let cell = scratch.cell();
            let mut seen = 0;
            while !writer.is_finished() {
                if let Some(v) = cell.read().unwrap() {
                    assert_eq!(v.bytes.len(), 64 * 1024, "a torn version {}", v.number);
                    assert!(v.bytes.iter().all(|&b| b == v.bytes[0]), "mixed bytes");
                    assert!(v.number >= seen, "the newest went back");
                    seen = v.number;
                }
            }
            writer.join().unwrap();
        });
        assert_eq!(scratch.cell().newest().unwrap(), writes);
    }
}
