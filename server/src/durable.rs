//! The sandbox table on disk (`--fleet`): one record a sandbox under
//! `<root>/.sandkeeperd/sandboxes/<id>.json`, shared by every server on the root (its
//! replicas). The keeper's own durable state (the key's record naming its kept workspace) is
//! in the root's fleet store; this table maps the E2B id, team, token and settings back onto
//! that key, and says where the sandbox runs: on one replica ([`Record::runs_on`], written by
//! that replica at the create or resume, before it answers), or nowhere (paused, written at the
//! pause, once the keeper's way down ended and before the pause is answered). A kill removes
//! the record before the keeper acts.
//!
//! A record is replaced whole (written beside, synced, renamed over, the directory synced): a
//! crash leaves the old record or the new one. A change that depends on what a record says (a
//! paused sandbox taken by one replica, or forgotten by a kill) is made under the table's
//! lock ([`Durable::locked`], an exclusive `flock` of `.lock`, which the kernel lets go if the
//! process dies), so two replicas never both take one sandbox. The files hold the sandbox's
//! access token and variables, so the directory is the server's alone (mode 0700, files
//! 0600). Names are checked on the way in and out: a file that is not `<id>.json` of a valid
//! id, or does not parse, is skipped with a warning naming it, never followed or trusted.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The largest record read back (a create's body is bounded far below this).
pub const MAX_RECORD: u64 = 4 << 20;

/// What the table keeps of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Its id.
    pub id: String,
    /// Its team.
    pub team: String,
    /// The template the create named.
    pub template: String,
    /// The create's metadata.
    pub metadata: BTreeMap<String, String>,
    /// Variables for every command.
    pub env: Vec<(String, String)>,
    /// Its keeper session.
    pub session: String,
    /// Its envd access token.
    pub token: String,
    /// When it was created, in Unix milliseconds.
    pub started_ms: u64,
    /// At its timeout it is paused, not killed.
    pub auto_pause: bool,
    /// The replica it runs on; `None`: paused.
    #[serde(default)]
    pub runs_on: Option<Replica>,
    /// When it expires, in Unix milliseconds, as its replica last set it (0 while paused by
    /// its user).
    #[serde(default)]
    pub end_ms: u64,
    /// Paused by its server's end (SIGTERM, or a crash), not by its user: the first envd
    /// request for it, on any replica, resumes it until `end_ms`.
    #[serde(default)]
    pub interrupted: bool,
    /// When it was last paused, in Unix milliseconds: its retention counts from then, on
    /// whichever replica (0 while it runs, and in a record written before this field, whose
    /// retention counts from when a server took it back).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paused_ms: u64,
    /// A kill of it is under way on [`runs_on`](Self::runs_on): the record goes once the
    /// keeper deleted the sandbox, and if that replica dies first, another one finishes the
    /// kill. No request resumes or pauses it meanwhile.
    #[serde(default, skip_serializing_if = "is_false")]
    pub killing: bool,
    /// Replicas on hosts of their own: interrupted with its workspace on that replica's host's
    /// disk alone (the host froze past its lease, or died), so only a server on that host (it,
    /// or its restart on the same root) can continue it, and requests for it go there while it
    /// lives. `None`: any replica can continue it (one root, or a workspace on the shelf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_on: Option<Replica>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One server of those sharing a root: its incarnation in the root's fleet store (its lease
/// there says whether it lives) and where the others reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    /// Its incarnation.
    pub incarnation: u32,
    /// Its base URL (`--advertise`).
    pub url: String,
    /// Replicas on hosts of their own: its host, the id kept in its root
    /// ([`crate::hosts::host_id`]); a restart on the same root is the same host. `None` on one
    /// root (every replica reaches every workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The table's directory.
#[derive(Clone, Debug)]
pub struct Durable {
    dir: PathBuf,
}

impl Durable {
    /// The table under `root`, made if missing (mode 0700).
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = root.join(".sandkeeperd").join("sandboxes");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(Durable { dir })
    }

    /// Writes `record`, replacing any older one of its id.
    pub fn put(&self, record: &Record) -> io::Result<()> {
        let name = file_name(&record.id)?;
        let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
        // Its own name beside: writes of one record from two tasks, or two hosts, never share
        // (and so never empty or lose) a half-written file.
        let tmp = self.dir.join(format!(".{name}.{}.tmp", unique()?));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, self.dir.join(name))?;
        fs::File::open(&self.dir)?.sync_all()
    }

    /// `id`'s record, if it has one (a file that is not a record is an error naming why).
    pub fn get(&self, id: &str) -> io::Result<Option<Record>> {
        let name = file_name(id)?;
        let path = self.dir.join(&name);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        read_record(&path, &name)
            .map(Some)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {why}")))
    }

    /// Runs `change` holding the table's lock: no other process on the root changes a record
    /// under the lock meanwhile. Blocking (the lock waits for the holder).
    pub fn locked<T>(&self, change: impl FnOnce(&Durable) -> io::Result<T>) -> io::Result<T> {
        let lock = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(".lock"))?;
        lock.lock()?;
        let changed = change(self);
        drop(lock); // unlocks
        changed
    }

    /// Removes `id`'s record ("already gone" is success).
    pub fn remove(&self, id: &str) -> io::Result<()> {
        match fs::remove_file(self.dir.join(file_name(id)?)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => fs::File::open(&self.dir)?.sync_all(),
        }
    }

    /// Every record, by id. What is not a record (see the module docs) is skipped, named in a
    /// warning.
    pub fn load(&self) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue; // the lock, or a write that did not finish
            }
            match read_record(&entry.path(), &name) {
                Ok(record) => out.push(record),
                Err(why) => tracing::warn!(file = ?name, %why, "not a sandbox record: skipped"),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

fn read_record(path: &Path, name: &str) -> Result<Record, String> {
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_RECORD {
        return Err(format!("{} bytes, over {MAX_RECORD}", meta.len()));
    }
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if file_name(&record.id).ok().as_deref() != Some(name) {
        return Err(format!("names sandbox {:?}", record.id));
    }
    Ok(record)
}

/// A name no other write of a record uses: this process's id, a count of its writes, and 8
/// random bytes (for processes of another host sharing the root).
fn unique() -> io::Result<String> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut random = [0u8; 8];
    getrandom::getrandom(&mut random).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(format!(
        "{}.{n}.{}",
        std::process::id(),
        hex::encode(random)
    ))
}

/// `<id>.json` for a valid id (`sbx` and 20 lower-case hex digits), else an error.
/// Whether `id` is a sandbox id (`sbx` and 20 hex digits): `InvalidInput` naming it if not.
pub fn check_id(id: &str) -> io::Result<()> {
    file_name(id).map(drop)
}

fn file_name(id: &str) -> io::Result<String> {
    let valid = id.len() == 23
        && id.starts_with("sbx")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if valid {
        Ok(format!("{id}.json"))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a sandbox id: {id:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, auto_pause: bool) -> Record {
        Record {
            id: id.into(),
            team: "team-a".into(),
            template: "base".into(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            env: vec![("A".into(), "1".into())],
            session: id.into(),
            token: "ab".repeat(32),
            started_ms: 1,
            auto_pause,
            runs_on: None,
            end_ms: 0,
            interrupted: false,
            paused_ms: 0,
            killing: false,
            held_on: None,
        }
    }

    #[test]
    fn records_are_written_replaced_removed_and_read_back() {
        let root = tempfile::tempdir().unwrap();
        let table = Durable::open(root.path()).unwrap();
        let a = record("sbx0123456789abcdef0123", false);
        table.put(&a).unwrap();
        let mut paused = a.clone();
        paused.auto_pause = true;
        table.put(&paused).unwrap();
        table
            .put(&record("sbxffffffffffffffffffff", false))
            .unwrap();
        let back = table.load().unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], paused);
        table.remove("sbxffffffffffffffffffff").unwrap();
        table.remove("sbxffffffffffffffffffff").unwrap();
        assert_eq!(table.load().unwrap(), vec![paused]);
    }

    #[test]
    fn what_is_not_a_record_is_skipped_and_bad_ids_refused() {
        let root = tempfile::tempdir().unwrap();
        let table = Durable::open(root.path()).unwrap();
        let dir = root.path().join(".sandkeeperd/sandboxes");
        fs::write(dir.join("sbx0123456789abcdef0123.json"), b"{not json").unwrap();
        // A record under another id's name, a link, a file of another name.
        let b = serde_json::to_vec(&record("sbx0123456789abcdef0124", true)).unwrap();
        fs::write(dir.join("sbxffffffffffffffffffff.json"), &b).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("sbx0000000000000000000a.json"))
            .unwrap();
        fs::write(dir.join("notes.txt"), b"hello").unwrap();
        assert_eq!(table.load().unwrap(), vec![]);
        for bad in [
            "../x",
            "sbx",
            "SBX0123456789ABCDEF0123",
            "sbx0123456789abcdef012/",
        ] {
            assert!(table.put(&record(bad, false)).is_err(), "{bad}");
            assert!(table.remove(bad).is_err(), "{bad}");
        }
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    use std::os::unix::fs::PermissionsExt;
}
