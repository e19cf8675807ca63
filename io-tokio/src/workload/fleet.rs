//! The fleet's own checks of a workload run on one local root, once every process ended:
//! what no single process can see. [`verify_local_fleet`] reads the root's store, its token
//! log and the processes' ledgers of acknowledged session-log versions
//! ([`FleetOptions::ledger`](super::FleetOptions::ledger)), sweeps the root as any process
//! would, and checks:
//!
//! - no key is held by a live process (every process ended);
//! - no sandbox was changed by two tokens out of order (the token log, which the processes'
//!   backends kept with [`LocalConfig::token_log`](crate::local::LocalConfig::token_log));
//! - every object a key's record references is there (the sweep removed nothing referenced);
//! - nothing is leaked: every sandbox directory and snapshot left is one a record references,
//!   or a snapshot whose own retention has not ended;
//! - every session's last acknowledged session-log version is in its user's recorded sandbox
//!   or snapshot (or a later version of the same log, flushed after it, whose acknowledgement
//!   a killed process never saw).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandkeeper::{Key, PathName, SandboxId, SessionId, UserId, Version};
use serde::{Deserialize, Serialize};

use super::WorkloadError;
use crate::local::layout::{self, sandbox_dirs, snapshot_dirs, META_DIR};
use crate::local::store::LocalStore;
use crate::local::{meta, token_log_in_order};

/// One line of a fleet process's ledger: a session-log version the backend acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acknowledged {
    /// The session.
    pub session: SessionId,
    /// The session's user (whose key's sandbox holds the log).
    pub user: UserId,
    /// The version.
    pub version: Version,
    /// The sandbox it was uploaded into.
    pub sandbox: SandboxId,
    /// The log's contents at that version.
    pub log: String,
}

/// What [`verify_local_fleet`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetVerdict {
    /// Each check, as `(passed, what)`.
    pub checks: Vec<(bool, String)>,
    /// What was looked at: keys, sessions, ledger lines, the token log, what the sweep removed.
    pub figures: String,
}

impl FleetVerdict {
    /// Every check passed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|(ok, _)| *ok)
    }

    /// One line per check (`ok` or `FAILED`, then what it checked), and the figures last.
    pub fn report(&self) -> String {
        let mut out: String = self
            .checks
            .iter()
            .map(|(ok, what)| format!("{} {what}\n", if *ok { "ok    " } else { "FAILED" }))
            .collect();
        out.push_str(&format!("figures: {}\n", self.figures));
        out
    }
}

/// What the fleet's ledgers say: each session's last acknowledged session-log version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LastAcknowledged {
    /// Each session's acknowledged version with the highest number, over every ledger.
    pub last: BTreeMap<SessionId, Acknowledged>,
    /// The lines read, over every ledger.
    pub lines: u64,
}

impl LastAcknowledged {
    /// The check each fleet's verification makes of every session: its last acknowledged
    /// session-log version is where its user's key continues from (the log there starts with
    /// it: a later version, whose acknowledgement a killed process never saw, may have landed
    /// after it). `session_log(key, session)` looks in what the key's record names: `None` when
    /// it names nothing that is there, else where it looked (for the report) and the log found
    /// there. Each check goes to `check`; returns how many users the sessions span.
    pub fn check_logs(
        &self,
        mut session_log: impl FnMut(&str, &SessionId) -> Option<(String, Option<String>)>,
        check: &mut impl FnMut(bool, String),
    ) -> usize {
        let mut users = BTreeSet::new();
        for (session, ack) in &self.last {
            let key = Key::User(ack.user.clone()).to_string();
            let Some((place, log)) = session_log(&key, session) else {
                check(
                    false,
                    format!(
                        "{session}'s version {} (acknowledged in {}) is in {key}'s recorded \
                         sandbox or snapshot: the key's record names none that is there",
                        ack.version, ack.sandbox
                    ),
                );
                users.insert(key);
                continue;
            };
            check(
                log.is_some_and(|log| log.starts_with(&ack.log)),
                format!(
                    "{session}'s last acknowledged version {} (uploaded into {}) is in {place}",
                    ack.version, ack.sandbox
                ),
            );
            users.insert(key);
        }
        users.len()
    }
}

/// Reads the ledgers of a fleet's processes ([`FleetOptions::ledger`](super::FleetOptions::ledger))
/// and keeps each session's last acknowledged version.
///
/// Errors: a ledger could not be read, or a line is not an [`Acknowledged`] (the error names
/// the file and the line).
pub fn last_acknowledged(ledgers: &[PathBuf]) -> Result<LastAcknowledged, WorkloadError> {
    let mut out = LastAcknowledged::default();
    for path in ledgers {
        let text = std::fs::read_to_string(path)
            .map_err(|e| WorkloadError::Fleet(format!("ledger {}: {e}", path.display())))?;
        for (n, line) in text.lines().enumerate() {
            let ack: Acknowledged = serde_json::from_str(line).map_err(|e| {
                WorkloadError::Fleet(format!("ledger {} line {}: {e}", path.display(), n + 1))
            })?;
            out.lines += 1;
            let newer = out
                .last
                .get(&ack.session)
                .is_none_or(|seen| seen.version < ack.version);
            if newer {
                out.last.insert(ack.session.clone(), ack);
            }
        }
    }
    Ok(out)
}

/// The fleet's checks of the local root `root` whose processes ran with the process lease
/// `lease` and wrote the ledgers `ledgers`. Run it once every process ended; it sweeps the root first (judged as of `now -
/// lease`, as every sweep), which is what any process of the fleet would do next.
///
/// Errors: the store, the token log or a ledger could not be read (a malformed line names its
/// file and line).
pub fn verify_local_fleet(
    root: &Path,
    lease: Duration,
    ledgers: &[PathBuf],
) -> Result<FleetVerdict, WorkloadError> {
    let fail = |what: String| WorkloadError::Fleet(what);
    let store = LocalStore::open(root, lease).map_err(|e| fail(e.to_string()))?;
    // The one clock the processes share, as every store operation reads it.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    let swept = store.sweep(now).map_err(|e| fail(e.to_string()))?;
    let mut checks = Vec::new();
    let mut check = |ok: bool, what: String| checks.push((ok, what));

    let entries = store.entries().map_err(|e| fail(e.to_string()))?;
    let mut warm: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut snapshots: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut by_key = BTreeMap::new();
    for entry in &entries {
        if let Some(owner) = entry.owner {
            let live = store.is_live(owner, now).map_err(|e| fail(e.to_string()))?;
            check(
                !live,
                format!("{} is held by no live process (owner {owner:?})", entry.key),
            );
        }
        if let Some(sandbox) = entry.record.warm {
            let dir = layout::sandbox_dir(root, sandbox);
            check(
                dir.is_dir(),
                format!(
                    "{}'s recorded sandbox {} is there",
                    entry.key,
                    dir.display()
                ),
            );
            warm.insert(dir.clone(), entry.key.clone());
            by_key.insert(entry.key.clone(), dir);
        } else if let Some(s) = &entry.record.snapshot {
            let dir = layout::snapshot_dir(root, &s.snapshot)
                .map_err(|e| fail(format!("{}: {e}", entry.key)))?;
            check(
                dir.is_dir(),
                format!(
                    "{}'s recorded snapshot {} is there",
                    entry.key,
                    dir.display()
                ),
            );
            snapshots.insert(dir.clone(), entry.key.clone());
            by_key.insert(entry.key.clone(), dir);
        }
        if let (Some(_), Some(s)) = (entry.record.warm, &entry.record.snapshot) {
            // A record naming both: the snapshot is kept too.
            if let Ok(dir) = layout::snapshot_dir(root, &s.snapshot) {
                snapshots.insert(dir, entry.key.clone());
            }
        }
    }

    let log = token_log_in_order(root)?;
    check(
        log.out_of_order.is_empty(),
        format!(
            "no sandbox was changed by two tokens out of order ({} changes of {} sandboxes; {} \
             out of order, the first: {:?})",
            log.changes,
            log.sandboxes,
            log.out_of_order.len(),
            &log.out_of_order[..log.out_of_order.len().min(5)]
        ),
    );

    // Nothing leaked.
    let mut leaked = Vec::new();
    for dir in sandbox_dirs(root)? {
        if !warm.contains_key(&dir) {
            leaked.push(dir);
        }
    }
    for dir in snapshot_dirs(root)? {
        // Its retention as the keeper recorded it, outside the workspace.
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let record = meta::snapshot_record(root, &sandkeeper::Snapshot::new(name))
            .map_err(|e| WorkloadError::Fleet(e.to_string()))?;
        let retained = record
            .and_then(|r| r.expiry())
            .is_some_and(|until| until > now);
        if !snapshots.contains_key(&dir) && !retained {
            leaked.push(dir);
        }
    }
    check(
        leaked.is_empty(),
        format!("nothing is leaked: every object left is referenced ({leaked:?} are not)"),
    );

    // Every session's last acknowledged version is where its user's key continues from.
    let acknowledged = last_acknowledged(ledgers)?;
    let users = acknowledged.check_logs(
        |key, session| {
            let dir = by_key.get(key)?;
            let file = dir
                .join(META_DIR)
                .join(session.as_str())
                .join(PathName::session_log().as_str());
            let log = std::fs::read_to_string(&file).unwrap_or_default();
            Some((file.display().to_string(), Some(log)))
        },
        &mut check,
    );
    let figures = format!(
        "{} keys in the store, {} sessions' last acknowledged versions ({} ledger lines) over {} \
         users; token log: {} changes, {} sandboxes, {} changed under several tokens; this \
         sweep removed {} sandboxes and {} snapshots",
        entries.len(),
        acknowledged.last.len(),
        acknowledged.lines,
        users,
        log.changes,
        log.sandboxes,
        log.changed_by_several,
        swept.sandboxes,
        swept.snapshots
    );
    Ok(FleetVerdict { checks, figures })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(session: &str, version: u64, log: &str) -> String {
        let ack = Acknowledged {
            session: SessionId::new(session).unwrap(),
            user: UserId::new("user-00").unwrap(),
            version: Version(version),
            sandbox: SandboxId(1),
            log: log.to_string(),
        };
        serde_json::to_string(&ack).unwrap() + "\n"
    }

    #[test]
    fn the_ledgers_give_each_sessions_highest_version_and_name_a_bad_line() {
        let dir = std::env::temp_dir().join(format!("sk-ledgers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
        let text = line("s1", 2, "two") + &line("s1", 1, "one") + &line("s2", 1, "x");
        std::fs::write(&a, text).unwrap();
        std::fs::write(&b, line("s1", 3, "three")).unwrap();
        let read = last_acknowledged(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(read.lines, 4);
        let s1 = &read.last[&SessionId::new("s1").unwrap()];
        assert_eq!((s1.version, s1.log.as_str()), (Version(3), "three"));
        assert_eq!(read.last.len(), 2);

        std::fs::write(&b, line("s1", 3, "three") + "{not json\n").unwrap();
        let e = last_acknowledged(&[a, b.clone()]).unwrap_err().to_string();
        assert!(e.contains(&format!("{} line 2", b.display())), "{e}");
        let missing = last_acknowledged(&[dir.join("none")]).unwrap_err();
        assert!(missing.to_string().contains("none"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
