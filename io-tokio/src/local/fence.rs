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
}

/// The key's lock, held while the admitted change is made. `None`: no token to check.
pub(crate) type Admitted = Option<File>;

impl Ledger {
    pub(crate) fn new(root: &Path) -> Self {
        Ledger {
            dir: root.join(".tokens"),
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
        fs::create_dir_all(&keys).map_err(|e| io("mkdir", e))?;
        fs::create_dir_all(self.dir.join("sandboxes")).map_err(|e| io("mkdir", e))?;
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
        write_whole(&key_file, format!("{}\n", token.max(key_newest)).as_bytes())
            .map_err(|e| io("write", e))?;
        write_whole(&sandbox_file, format!("{key}\n{token}\n").as_bytes())
            .map_err(|e| io("write", e))?;
        Ok(Some(lock))
    }
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
        let ledger = Ledger::new(&root);
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
        let _ = fs::remove_dir_all(&root);
    }
}
