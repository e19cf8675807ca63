//! Fleet mode's fencing on a local root: the newest token each sandbox and each key has seen,
//! in files under `<root>/.tokens/`, checked and recorded under the key's lock, which the caller
//! holds while it makes its change, so that the check is at the last step that changes anything
//! (no other process's change of the key's sandboxes comes between).
//!
//! | file | holds |
//! |---|---|
//! | `sandboxes/<id>` | `<key>` and the newest token the sandbox accepted |
//! | `keys/<key>` | the newest token any sandbox of the key accepted |
//! | `keys/<key>.lock` | the key's lock (`flock`) |
//! | `accepted.log` | with [`LocalConfig::token_log`](super::LocalConfig::token_log): every admitted change, `<sandbox> <key> <token>` |
//!
//! A command without a token (a key no process owns: one call's, an external sandbox, a single
//! keeper) is not checked. The key's newest token is what refuses a stale owner's Start of a
//! second sandbox once the key's next owner has touched the backend.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use sandkeeper::{Key, SandboxId, Token};

use crate::backend::{BackendError, FailureClass};

/// The token files of one local root.
#[derive(Clone, Debug)]
pub(crate) struct Ledger {
    dir: PathBuf,
    /// Append every admitted token to `accepted.log`.
    log: bool,
}

/// The key's lock, held while the admitted change is made. `None`: no token to check.
pub(crate) type Admitted = Option<File>;

impl Ledger {
    pub(crate) fn new(root: &Path, log: bool) -> Self {
        Ledger {
            dir: root.join(".tokens"),
            log,
        }
    }

    /// Checks `token` for a change of `sandbox` (of `key`, when the caller knows it: a Start;
    /// otherwise as recorded at its Start). Refused (`Fenced`) when the sandbox or its key has
    /// seen a newer token; else recorded as the newest, and the key's lock returned.
    pub(crate) fn admit(
        &self,
        sandbox: SandboxId,
        key: Option<&Key>,
        token: Option<Token>,
    ) -> Result<Admitted, BackendError> {
        let Some(Token(token)) = token else {
            return Ok(None);
        };
        let Some(held) = self.hold(sandbox, key, token)? else {
            return Ok(None);
        };
        let io = |what: &str, e: io::Error| BackendError::transient(format!("tokens: {what}: {e}"));
        let Held {
            lock,
            key,
            key_file,
            key_newest,
            sandbox_file,
        } = held;
        write_whole(&key_file, format!("{}\n", token.max(key_newest)).as_bytes())
            .map_err(|e| io("write", e))?;
        write_whole(&sandbox_file, format!("{key}\n{token}\n").as_bytes())
            .map_err(|e| io("write", e))?;
        if self.log {
            // One write of one line with O_APPEND: whole, and in the order the key's lock
            // admitted the changes of the key's sandboxes.
            let line = format!("{} {key} {token}\n", sandbox.0);
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(ACCEPTED_LOG))
                .and_then(|mut f| io::Write::write_all(&mut f, line.as_bytes()))
                .map_err(|e| io("log", e))?;
        }
        Ok(Some(lock))
    }

    /// Checks `token` for the application's own work in `sandbox` (a write, a removal, a
    /// command's start), without recording anything: refused (`Fenced`) when the sandbox or
    /// its key has seen a newer token, that is, when another process took the key over. The
    /// key's lock is returned, held while the work makes its change, so that no takeover comes
    /// between the check and the change: a change either lands before the next owner's first
    /// command (which then sees it) or is refused.
    pub(crate) fn check(
        &self,
        sandbox: SandboxId,
        token: Option<Token>,
    ) -> Result<Admitted, BackendError> {
        let Some(Token(token)) = token else {
            return Ok(None);
        };
        Ok(self.hold(sandbox, None, token)?.map(|held| held.lock))
    }

    /// Takes the key's lock and checks `token` against the newest the sandbox and its key have
    /// seen. `None`: nothing to check it by (a sandbox started without a token).
    fn hold(
        &self,
        sandbox: SandboxId,
        key: Option<&Key>,
        token: u64,
    ) -> Result<Option<Held>, BackendError> {
        let io = |what: &str, e: io::Error| BackendError::transient(format!("tokens: {what}: {e}"));
        let sandbox_file = self.dir.join("sandboxes").join(sandbox.0.to_string());
        let recorded = match fs::read_to_string(&sandbox_file) {
            Ok(text) => Some(parse_sandbox(&text).ok_or_else(|| {
                BackendError::fatal(format!("{} is malformed", sandbox_file.display()))
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("read", e)),
        };
        let key = match (key, &recorded) {
            (Some(key), _) => key.to_string(),
            (None, Some((key, _))) => key.clone(),
            // Started without a token: nothing to fence it by.
            (None, None) => return Ok(None),
        };
        let keys = self.dir.join("keys");
        if recorded.is_none() {
            // The sandbox's first admission (its Start or Adopt); once it has a file, both
            // directories exist, and every later check (each operation's) skips this.
            fs::create_dir_all(&keys).map_err(|e| io("mkdir", e))?;
            fs::create_dir_all(self.dir.join("sandboxes")).map_err(|e| io("mkdir", e))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(keys.join(format!("{key}.lock")))
            .map_err(|e| io("lock", e))?;
        lock.lock().map_err(|e| io("lock", e))?;
        let key_file = keys.join(&key);
        let key_newest = match fs::read_to_string(&key_file) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|_| BackendError::fatal(format!("{} is malformed", key_file.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io("read", e)),
        };
        // Read again under the lock: another process may have recorded a newer one meanwhile.
        let sandbox_newest = match fs::read_to_string(&sandbox_file) {
            Ok(text) => parse_sandbox(&text).map_or(0, |(_, t)| t),
            Err(_) => 0,
        };
        let newest = key_newest.max(sandbox_newest);
        if token < newest {
            return Err(BackendError::new(
                FailureClass::Fenced,
                format!("{sandbox} of {key}: token {token} is older than {newest}"),
            ));
        }
        Ok(Some(Held {
            lock,
            key,
            key_file,
            key_newest,
            sandbox_file,
        }))
    }
}

/// A key's lock, taken, with what was read under it.
struct Held {
    lock: File,
    key: String,
    key_file: PathBuf,
    key_newest: u64,
    sandbox_file: PathBuf,
}

/// The token log's file name, under `<root>/.tokens/`.
const ACCEPTED_LOG: &str = "accepted.log";

/// What the token log of a root shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenLog {
    /// Changes admitted.
    pub changes: u64,
    /// Sandboxes changed.
    pub sandboxes: u64,
    /// Sandboxes changed under more than one token (adopted, or fenced and handed on).
    pub changed_by_several: u64,
    /// Each change admitted under a token older than one the same sandbox accepted before
    /// it, as `(sandbox, older, newer)`. Empty when fencing held.
    pub out_of_order: Vec<(SandboxId, u64, u64)>,
}

/// Reads the token log of the local root `root` (written with
/// [`LocalConfig::token_log`](super::LocalConfig::token_log)) and checks that no sandbox was
/// changed by two tokens out of order. A missing log reads as empty; a malformed line is an
/// error naming it.
pub fn token_log_in_order(root: &Path) -> io::Result<TokenLog> {
    let path = root.join(".tokens").join(ACCEPTED_LOG);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let mut newest: std::collections::HashMap<u64, (u64, bool)> = Default::default();
    let mut log = TokenLog::default();
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split(' ');
        let parsed = (|| {
            let sandbox = words.next()?.parse::<u64>().ok()?;
            let _key = words.next()?;
            let token = words.next()?.parse::<u64>().ok()?;
            words.next().is_none().then_some((sandbox, token))
        })();
        let Some((sandbox, token)) = parsed else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} line {}: {line:?}", path.display(), n + 1),
            ));
        };
        log.changes += 1;
        let seen = newest.entry(sandbox).or_insert((token, false));
        if token < seen.0 {
            log.out_of_order.push((SandboxId(sandbox), token, seen.0));
        } else if token > seen.0 {
            *seen = (token, true);
        }
    }
    log.sandboxes = newest.len() as u64;
    log.changed_by_several = newest.values().filter(|(_, several)| *several).count() as u64;
    Ok(log)
}

fn parse_sandbox(text: &str) -> Option<(String, u64)> {
    let mut lines = text.lines();
    let key = lines.next()?.to_string();
    let token = lines.next()?.trim().parse().ok()?;
    Some((key, token))
}

/// Written whole (under the key's lock, so one temporary name is enough).
fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    super::layout::write_atomically(path, sandkeeper::UploadId(u64::MAX), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::Session(sandkeeper::SessionId::new(s).unwrap())
    }

    #[test]
    fn an_older_token_is_refused_for_the_sandbox_and_for_any_sandbox_of_its_key() {
        let root = std::env::temp_dir().join(format!("sk-fence-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let ledger = Ledger::new(&root, true);
        let (a, b) = (SandboxId(1 << 32), SandboxId(2 << 32));
        // No token: not checked.
        assert!(ledger.admit(a, Some(&key("s")), None).unwrap().is_none());
        drop(ledger.admit(a, Some(&key("s")), Some(Token(3))).unwrap());
        drop(ledger.admit(a, None, Some(Token(3))).unwrap());
        // The next owner (token 4) starts another sandbox of the key.
        drop(ledger.admit(b, Some(&key("s")), Some(Token(4))).unwrap());
        // The stale owner's change of its own sandbox, and its start of a third, are refused.
        for (x, k) in [(a, None), (SandboxId(1 << 32 | 1), Some(key("s")))] {
            let e = ledger.admit(x, k.as_ref(), Some(Token(3))).unwrap_err();
            assert_eq!(e.class, FailureClass::Fenced, "{e}");
        }
        // Another key is untouched.
        drop(
            ledger
                .admit(SandboxId(9), Some(&key("t")), Some(Token(1)))
                .unwrap(),
        );
        // The log holds the four admitted changes, none out of order (refusals are not in it).
        let log = token_log_in_order(&root).unwrap();
        assert_eq!((log.changes, log.sandboxes), (4, 3));
        assert!(log.out_of_order.is_empty(), "{log:?}");
        // A change under an older token, had one been admitted, is found.
        let path = root.join(".tokens").join(ACCEPTED_LOG);
        let mut text = fs::read_to_string(&path).unwrap();
        text.push_str(&format!("{} session:s 4\n{} session:s 3\n", b.0, b.0));
        fs::write(&path, text).unwrap();
        let log = token_log_in_order(&root).unwrap();
        assert_eq!(log.out_of_order, vec![(b, 3, 4)]);
        fs::write(&path, "1 session:s x\n").unwrap();
        assert!(token_log_in_order(&root).is_err());
        let _ = fs::remove_dir_all(&root);
    }
}
