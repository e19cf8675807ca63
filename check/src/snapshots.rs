//! Snapshots and their retention: what a key keeps for its next start, and when the core lets
//! it go. One checker, fed the persists the core accepted, its Start and Discard commands, and
//! the end of every input, at the core's instants.
//!
//! | check | what must hold |
//! |---|---|
//! | `discard-unreferenced` | a Discard names a snapshot its key keeps (never one a Start took as `resume_from`, never one already discarded), with the sandbox that persisted it; an `unused` one only of a call's own key |
//! | `discard-after-retention` | a `retention` Discard comes no earlier than the persist plus the policy's retention; a `superseded` one only in the input that persisted the key's newer snapshot |
//! | `snapshot-released` | after every input, no key keeps a snapshot past its retention, and none that a newer one superseded |
//!
//! A key keeps the snapshot its last persist left until a Start takes it (`resume_from`), its
//! retention passes, or a newer one supersedes it; the checker models exactly that, so a
//! snapshot discarded while referenced and one kept after the core should have let it go are
//! both seen. Keys of one call never keep a snapshot (nothing resumes them).

use std::collections::BTreeMap;
use std::time::Duration;

use sandkeeper::{Command, DiscardReason, Instant, Key, SandboxId, Snapshot};

use crate::violation::Violation;

/// The snapshot checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Snapshots {
    retain: Option<Duration>,
    /// Per key, the snapshot it keeps, the sandbox that persisted it and when.
    kept: BTreeMap<Key, (Snapshot, SandboxId, Instant)>,
    /// Snapshots superseded in this input, still to be discarded before it ends.
    superseded: Vec<(Key, Snapshot)>,
}

impl Snapshots {
    /// A checker for a policy whose retention is `retain`
    /// ([`Tiers::retain`](sandkeeper::Tiers::retain)).
    pub fn new(retain: Option<Duration>) -> Self {
        Snapshots {
            retain,
            ..Snapshots::default()
        }
    }

    /// The core accepted, at `now`, the persist of `snapshot` by `by` for `key`.
    pub fn persisted(&mut self, key: &Key, snapshot: Snapshot, by: SandboxId, now: Instant) {
        if matches!(key, Key::Call(_)) {
            return;
        }
        if let Some((old, _, _)) = self.kept.insert(key.clone(), (snapshot, by, now)) {
            self.superseded.push((key.clone(), old));
        }
    }

    /// What the key keeps now, if anything (for the Start checks of a caller).
    pub fn kept(&self, key: &Key) -> Option<(&Snapshot, SandboxId)> {
        self.kept.get(key).map(|(s, by, _)| (s, *by))
    }

    /// One command, ordered at `now`.
    pub fn command(&mut self, cmd: &Command, now: Instant) -> Result<(), Violation> {
        match cmd {
            Command::Start { key, .. } => {
                // The start takes what the key kept (whether it resumes it is the caller's
                // `resume-latest-snapshot`).
                self.kept.remove(key);
                Ok(())
            }
            Command::Discard {
                sandbox,
                key,
                snapshot,
                reason,
                token: _,
            } => match reason {
                DiscardReason::Superseded => {
                    let Some(i) = self
                        .superseded
                        .iter()
                        .position(|(k, s)| k == key && s == snapshot)
                    else {
                        return Err(Violation::new(
                            "discard-after-retention",
                            format!("Discard of {snapshot:?} of key {key} as superseded, and no newer snapshot of the key was persisted in this input"),
                        ));
                    };
                    self.superseded.remove(i);
                    Ok(())
                }
                DiscardReason::Unused => match key {
                    Key::Call(_) => Ok(()),
                    _ => Err(Violation::new(
                        "discard-unreferenced",
                        format!(
                            "Discard of {snapshot:?} as unused, and its key {key} may start again"
                        ),
                    )),
                },
                DiscardReason::Retention => {
                    let Some((kept, by, at)) = self.kept.get(key) else {
                        return Err(Violation::new(
                            "discard-unreferenced",
                            format!("Discard of {snapshot:?} of key {key}, which keeps no snapshot (a Start took it, or it went already)"),
                        ));
                    };
                    if kept != snapshot || by != sandbox {
                        return Err(Violation::new(
                            "discard-unreferenced",
                            format!("Discard of {snapshot:?} by {sandbox} of key {key}, which keeps {kept:?} by {by}"),
                        ));
                    }
                    let due = self.retain.map(|r| *at + r);
                    if due.is_none_or(|due| now < due) {
                        return Err(Violation::new(
                            "discard-after-retention",
                            format!("Discard of {snapshot:?} of key {key} at {now:?}, persisted at {at:?}, retention {:?}", self.retain),
                        ));
                    }
                    self.kept.remove(key);
                    Ok(())
                }
            },
            _ => Ok(()),
        }
    }

    /// The input ended at `now`. `closed`: the core finished closing (what it kept is the
    /// backend's from then on).
    pub fn input_done(&mut self, now: Instant, closed: bool) -> Result<(), Violation> {
        if closed {
            self.kept.clear();
            self.superseded.clear();
            return Ok(());
        }
        if let Some((key, snapshot)) = self.superseded.first().cloned() {
            self.superseded.clear();
            return Err(Violation::new(
                "snapshot-released",
                format!("{snapshot:?} of key {key} was superseded and not discarded"),
            ));
        }
        let Some(retain) = self.retain else {
            return Ok(());
        };
        // A scan of the kept keys: a simulation keeps a few dozen keys at most.
        if let Some((key, (snapshot, _, at))) =
            self.kept.iter().find(|(_, (_, _, at))| now > *at + retain)
        {
            return Err(Violation::new(
                "snapshot-released",
                format!("key {key} still keeps {snapshot:?} at {now:?}, persisted at {at:?} with retention {retain:?}"),
            ));
        }
        Ok(())
    }
}
