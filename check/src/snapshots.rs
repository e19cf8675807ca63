//! Snapshots and their retention: what a key keeps for its next start, and when the core lets
//! it go. One checker, fed the persists the core accepted, its Start and Discard commands, and
//! the end of every input, at the core's instants.
//!
//! | check | what must hold |
//! |---|---|
//! | `discard-unreferenced` | a Discard names a snapshot its key keeps (never one a Start took as `resume_from`, never one already discarded), with the sandbox that persisted it; an `unused` one only of a call's own key; a `dropped` one only of the snapshot its key keeps, in the input in which the application dropped it ([`Snapshots::dropping`]); a `taken` one only of a snapshot a Start of its key took from that sandbox, once, and never while the key keeps it again (a start that failed gave it back) |
//! | `discard-after-retention` | a `retention` Discard comes no earlier than the persist plus the policy's retention; a `superseded` one only in the input that persisted the key's newer snapshot |
//! | `snapshot-released` | after every input, no key keeps a snapshot past its retention, none that a newer one superseded, and none the application dropped in it |
//!
//! A key keeps the snapshot its last persist left until a Start takes it (`resume_from`), its
//! retention passes, or a newer one supersedes it; the checker models exactly that, so a
//! snapshot discarded while referenced and one kept after the core should have let it go are
//! both seen. Keys of one call never keep a snapshot (nothing resumes them).
//!
//! In fleet mode a key also keeps the snapshot its claim's record handed over, until the
//! retention that record carries ([`Snapshots::handed`]), and lets go of what it keeps, without
//! a Discard, when the process no longer owns the key (released with its record, fenced:
//! [`Snapshots::let_go`]); the record holds the snapshot then.

use std::collections::BTreeMap;
use std::time::Duration;

use sandkeeper::{Command, DiscardReason, Instant, Key, SandboxId, Snapshot};

use crate::violation::Violation;

/// The snapshot checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Snapshots {
    retain: Option<Duration>,
    /// Per key, the snapshot it keeps, the sandbox that persisted it, when it became the key's
    /// and when its retention ends (`None`: never).
    kept: BTreeMap<Key, (Snapshot, SandboxId, Instant, Option<Instant>)>,
    /// Snapshots superseded in this input, still to be discarded before it ends.
    superseded: Vec<(Key, Snapshot)>,
    /// Snapshots a Start took, by key and snapshot: the sandbox that persisted each (what a
    /// `taken` Discard may name, once).
    taken: BTreeMap<(Key, String), SandboxId>,
    /// The key whose snapshot the application dropped in this input (`drop_snapshot`).
    dropping: Option<Key>,
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
        let due = self.retain.map(|r| now + r);
        if let Some((old, _, _, _)) = self.kept.insert(key.clone(), (snapshot, by, now, due)) {
            self.superseded.push((key.clone(), old));
        }
    }

    /// Fleet mode: the core accepted, at `now`, a claim of `key` whose record hands over
    /// `snapshot` (persisted by `by`), retained until `until` (the record's retention, on the
    /// core's clock; `None`: the policy's retention from now, as the core counts it).
    pub fn handed(
        &mut self,
        key: &Key,
        snapshot: Snapshot,
        by: SandboxId,
        until: Option<Instant>,
        now: Instant,
    ) {
        let due = self.retain.map(|r| until.unwrap_or(now + r).max(now));
        self.kept.insert(key.clone(), (snapshot, by, now, due));
    }

    /// Fleet mode: the process no longer owns `key` (released with its record, fenced): it
    /// keeps nothing of it here from now on, and discards nothing of it.
    pub fn let_go(&mut self, key: &Key) {
        self.kept.remove(key);
    }

    /// The application dropped what `key` keeps (`drop_snapshot` returned `Ok`, in the input
    /// now being checked): a `dropped` Discard of it may follow in this input.
    pub fn dropping(&mut self, key: &Key) {
        self.dropping = Some(key.clone());
    }

    /// What the key keeps now, if anything (for the Start checks of a caller).
    pub fn kept(&self, key: &Key) -> Option<(&Snapshot, SandboxId)> {
        self.kept.get(key).map(|(s, by, _, _)| (s, *by))
    }

    /// The keys that keep a snapshot now, in key order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.kept.keys()
    }

    /// One command, ordered at `now`.
    pub fn command(&mut self, cmd: &Command, now: Instant) -> Result<(), Violation> {
        match cmd {
            Command::Start {
                key,
                resume_from,
                resumes,
                ..
            } => {
                // The start takes what the key kept (whether it resumes it is the caller's
                // `resume-latest-snapshot`).
                self.kept.remove(key);
                if let (Some(snapshot), Some(by)) = (resume_from, resumes) {
                    self.taken
                        .insert((key.clone(), snapshot.as_str().to_string()), *by);
                }
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
                DiscardReason::Taken => {
                    if self
                        .kept
                        .get(key)
                        .is_some_and(|(kept, ..)| kept == snapshot)
                    {
                        return Err(Violation::new(
                            "discard-unreferenced",
                            format!("Discard of {snapshot:?} of key {key} as taken, which the key keeps (given back)"),
                        ));
                    }
                    let taken = (key.clone(), snapshot.as_str().to_string());
                    if self.taken.get(&taken) == Some(sandbox) {
                        self.taken.remove(&taken);
                        return Ok(());
                    }
                    Err(Violation::new(
                        "discard-unreferenced",
                        format!("Discard of {snapshot:?} by {sandbox} of key {key} as taken, and no Start of the key took it from that sandbox (or it went already)"),
                    ))
                }
                DiscardReason::Dropped => {
                    let kept = self.kept.get(key).map(|(s, by, ..)| (s, *by));
                    if self.dropping.as_ref() != Some(key) || kept != Some((snapshot, *sandbox)) {
                        return Err(Violation::new(
                            "discard-unreferenced",
                            format!("Discard of {snapshot:?} by {sandbox} of key {key} as dropped, which the application did not drop now, or the key does not keep"),
                        ));
                    }
                    self.dropping = None;
                    self.kept.remove(key);
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
                    let Some((kept, by, at, due)) = self.kept.get(key) else {
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
                    if due.is_none_or(|due| now < due) {
                        return Err(Violation::new(
                            "discard-after-retention",
                            format!("Discard of {snapshot:?} of key {key} at {now:?}, kept since {at:?}, retained until {due:?}"),
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
            self.taken.clear();
            self.dropping = None;
            return Ok(());
        }
        if let Some(key) = self.dropping.take() {
            if let Some((snapshot, ..)) = self.kept.get(&key) {
                return Err(Violation::new(
                    "snapshot-released",
                    format!("key {key} keeps {snapshot:?} after the application dropped it"),
                ));
            }
        }
        if let Some((key, snapshot)) = self.superseded.first().cloned() {
            self.superseded.clear();
            return Err(Violation::new(
                "snapshot-released",
                format!("{snapshot:?} of key {key} was superseded and not discarded"),
            ));
        }
        if self.retain.is_none() {
            return Ok(());
        }
        // A scan of the kept keys: a simulation keeps a few dozen keys at most.
        if let Some((key, (snapshot, _, at, due))) = self
            .kept
            .iter()
            .find(|(_, (_, _, _, due))| due.is_some_and(|due| now > due))
        {
            return Err(Violation::new(
                "snapshot-released",
                format!("key {key} still keeps {snapshot:?} at {now:?}, kept since {at:?}, retained until {due:?}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;

    fn discard(key: &Key, snapshot: &Snapshot, by: SandboxId) -> Command {
        Command::Discard {
            sandbox: by,
            key: key.clone(),
            snapshot: snapshot.clone(),
            reason: DiscardReason::Retention,
            token: None,
        }
    }

    /// A `taken` Discard names a snapshot a Start of the key took from that sandbox, once, and
    /// never one the key keeps again.
    #[test]
    fn a_taken_discard_names_what_a_start_took_once() {
        let key = Key::Session(sandkeeper::SessionId::new("s").unwrap());
        let (snap, by) = (Snapshot::new("snap-1"), SandboxId(1));
        let at = Instant::from_millis;
        let taken = |sandbox| Command::Discard {
            sandbox,
            key: key.clone(),
            snapshot: snap.clone(),
            reason: DiscardReason::Taken,
            token: None,
        };
        let start = Command::Start {
            sandbox: SandboxId(2),
            key: key.clone(),
            spec: sandkeeper::Spec::new(""),
            resume_from: Some(snap.clone()),
            resumes: Some(by),
            token: None,
            deadline: at(10_000),
        };
        let mut c = Snapshots::new(None);
        c.persisted(&key, snap.clone(), by, at(0));
        assert_eq!(check(c.command(&taken(by), at(1))), "discard-unreferenced");
        assert_eq!(check(c.command(&start, at(2))), "ok");
        assert_eq!(
            check(c.command(&taken(SandboxId(9)), at(3))),
            "discard-unreferenced"
        );
        assert_eq!(check(c.command(&taken(by), at(3))), "ok");
        assert_eq!(check(c.command(&taken(by), at(4))), "discard-unreferenced");
        // Taken, then given back by a failed start: the key keeps it again.
        assert_eq!(check(c.command(&start, at(5))), "ok");
        c.persisted(&key, snap.clone(), by, at(6));
        assert_eq!(check(c.command(&taken(by), at(7))), "discard-unreferenced");
    }

    /// A snapshot a claim handed over is retained until its record says, not the policy's
    /// retention from the claim; once the key is let go, a Discard of it is unreferenced.
    #[test]
    fn a_handed_snapshot_keeps_its_records_retention_until_let_go() {
        let s = sandkeeper::SessionId::new("s").unwrap();
        let key = Key::Session(s);
        let (snap, by) = (Snapshot::new("snap-1"), SandboxId(1));
        let at = |ms| Instant::from_millis(ms);
        let mut c = Snapshots::new(Some(Duration::from_secs(10)));
        c.handed(&key, snap.clone(), by, Some(at(3_000)), at(1_000));
        assert_eq!(c.input_done(at(2_000), false), Ok(()));
        assert_eq!(
            check(c.command(&discard(&key, &snap, by), at(2_999))),
            "discard-after-retention"
        );
        assert_eq!(check(c.input_done(at(3_001), false)), "snapshot-released");
        assert_eq!(check(c.command(&discard(&key, &snap, by), at(3_001))), "ok");

        c.handed(&key, snap.clone(), by, None, at(5_000));
        c.let_go(&key);
        assert_eq!(c.keys().count(), 0);
        assert_eq!(c.input_done(at(60_000), false), Ok(()));
        assert_eq!(
            check(c.command(&discard(&key, &snap, by), at(60_000))),
            "discard-unreferenced"
        );
    }
}
