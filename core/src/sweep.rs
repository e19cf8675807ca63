//! Fleet mode's sweep: which objects left in a shared backend may go. A pure decision, so that
//! every backend's sweep (the local root, Kubernetes) and the fleet simulator take the same one,
//! and the simulator checks it: the driver lists what the backend holds and what the store says,
//! [`sweep_verdict`] says what to do with each object, and the driver does it atomically with
//! respect to the store (under its lock, or with optimistic concurrency), so that no claim or
//! record write comes between the decision and the removal.
//!
//! The rules, in order (the first that applies decides):
//!
//! | object | kept when | swept when |
//! |---|---|---|
//! | any | it belongs to no fleet process (incarnation 0: a single keeper's) | - |
//! | any | the process that made it holds a live lease (it may be using it, or on its way down) | - |
//! | any | its key has a live owner (the owner may adopt or resume it) | - |
//! | sandbox | its key's record names it (handed over, or left by a crashed owner) | - |
//! | sandbox | it took the snapshot its key's record names as its workspace (its owner crashed while starting it from the snapshot, before the record named it) | otherwise |
//! | snapshot | made by the sandbox its key's record names (its owner stopped it and crashed before recording the stop; adopting the sandbox takes it back) | - |
//! | snapshot | its key's record names it, until the record's retention ends | the record's retention ended: swept, and the record no longer names it |
//! | snapshot | no record names it, and its own recorded expiry is ahead | no record names it, and it has no expiry or the expiry passed |
//!
//! A snapshot with no recorded expiry and no record is no key's: nothing would resume it.
//!
//! One more rule is the sweeping process's own, for the snapshots it made itself
//! ([`sweep_verdict_of`], with a [`Sweeper`]): a snapshot of its own that its core no longer
//! holds (no key of it keeps it, no sandbox of it made or took it), that its key's record
//! names neither as the snapshot nor by its maker as the warm sandbox, and whose own recorded
//! expiry, if any, passed, is swept, although its maker (this very process) lives. Once its core let go of it, only a record naming it could
//! bring it back to a start, and the record has moved on: another process resumed it and
//! recorded the sandbox that took it (on another host: this host's copy, and the shelf's, are
//! left over), or it was never recorded. The core lets go of a snapshot it released with a key
//! only once the release is written (a release in doubt keeps it), so the record the sweep
//! reads after asking the core names it whenever a start may still take it. Only the maker can
//! tell: another live process's snapshots stay under the rules above.
//!
//! A caller judges leases and retention later than a claim would (the local sweep: a lease
//! later): a claim made on a clock that runs ahead is fenced at the backend, but a removal
//! cannot be taken back.

use std::collections::BTreeMap;

use crate::fleet::KeyRecord;
use crate::ids::{Key, SandboxId, Snapshot};
use crate::time::Instant;

/// One object a backend holds, as a sweep sees it. Instants are the caller's clock, the same one
/// as the records' retention (a driver passes the wall clock as an [`Instant`] since the Unix
/// epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SweepObject {
    /// A sandbox (up, or whatever a crash left of it).
    Sandbox {
        /// Its id (its incarnation is its maker's).
        id: SandboxId,
        /// Its key, as the backend recorded it (`None`: unknown, e.g. a start that never got as
        /// far as recording it).
        key: Option<Key>,
        /// The snapshot its Start took as its workspace, where the backend records it (a start
        /// that *moves* the snapshot, as the local root's rename does; `None` where resuming
        /// leaves the snapshot where it was, or the backend does not say).
        resumed_from: Option<Snapshot>,
    },
    /// A kept snapshot.
    Snapshot {
        /// Its name.
        snapshot: Snapshot,
        /// The sandbox it was taken from (its incarnation is its maker's).
        by: SandboxId,
        /// Its key, as the backend recorded it.
        key: Option<Key>,
        /// The end of its retention, as recorded beside it (by its Persist), if any.
        expires: Option<Instant>,
    },
}

/// What the store says about one key, for the sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepKey {
    /// Whether a process with a live lease owns it.
    pub owner_live: bool,
    /// Its durable record.
    pub record: KeyRecord,
}

/// What to do with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepVerdict {
    /// Leave it.
    Keep,
    /// Remove it.
    Sweep,
    /// Remove it, and drop it from its key's record in the same atomic step (its retention, as
    /// the record carries it, ended).
    SweepAndUnrecord,
}

/// The process that sweeps, for [`sweep_verdict_of`]: its incarnation, and whether its core
/// holds the object being judged, asked *before* the key's record the verdict reads is read
/// (the module docs say why).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweeper {
    /// The sweeping process's incarnation.
    pub incarnation: u32,
    /// Whether its core holds the object ([`Lifecycle::holds_snapshot`] for a snapshot).
    ///
    /// [`Lifecycle::holds_snapshot`]: crate::Lifecycle::holds_snapshot
    pub holds: bool,
}

/// [`sweep_verdict`], and, with a `sweeper`, the rule for its own snapshots (module docs): a
/// snapshot made by the sweeper's incarnation that its core does not hold, its key's record
/// names neither as the snapshot nor by its maker, and whose recorded expiry is not ahead, is
/// swept.
pub fn sweep_verdict_of(
    object: &SweepObject,
    keys: &BTreeMap<Key, SweepKey>,
    live: impl Fn(u32) -> bool,
    now: Instant,
    sweeper: Option<Sweeper>,
) -> SweepVerdict {
    let verdict = sweep_verdict(object, keys, live, now);
    let (Some(sweeper), SweepVerdict::Keep) = (sweeper, verdict) else {
        return verdict;
    };
    let SweepObject::Snapshot {
        snapshot,
        by,
        key,
        expires,
    } = object
    else {
        return verdict;
    };
    let own = sweeper.incarnation != 0 && incarnation_of(*by) == sweeper.incarnation;
    if !own || sweeper.holds || expires.is_some_and(|until| until > now) {
        return verdict;
    }
    let record = key.as_ref().and_then(|k| keys.get(k)).map(|e| &e.record);
    let named = record.is_some_and(|r| {
        r.warm == Some(*by) || r.snapshot.as_ref().is_some_and(|s| &s.snapshot == snapshot)
    });
    if named {
        SweepVerdict::Keep
    } else {
        SweepVerdict::Sweep
    }
}

/// The incarnation a fleet sandbox id carries (its high 32 bits).
fn incarnation_of(id: SandboxId) -> u32 {
    u32::try_from(id.0 >> 32).unwrap_or(u32::MAX)
}

/// The verdict on `object`. `keys`: the store's keys; `live`: whether an incarnation holds a live
/// lease; `now`: the caller's clock, as the records' retention.
pub fn sweep_verdict(
    object: &SweepObject,
    keys: &BTreeMap<Key, SweepKey>,
    live: impl Fn(u32) -> bool,
    now: Instant,
) -> SweepVerdict {
    let (maker, key) = match object {
        SweepObject::Sandbox { id, key, .. } => (id, key),
        SweepObject::Snapshot { by, key, .. } => (by, key),
    };
    let incarnation = incarnation_of(*maker);
    if incarnation == 0 || live(incarnation) {
        return SweepVerdict::Keep;
    }
    let entry = key.as_ref().and_then(|k| keys.get(k));
    if entry.is_some_and(|e| e.owner_live) {
        return SweepVerdict::Keep;
    }
    let record = entry.map(|e| &e.record);
    match object {
        SweepObject::Sandbox {
            id, resumed_from, ..
        } => {
            let named = record.is_some_and(|r| r.warm == Some(*id));
            // Started from the snapshot its key's record names, by an owner that crashed before
            // the record named the new sandbox: the snapshot *is* this workspace now, and the
            // next owner's start of the key takes it from here.
            let took_recorded = resumed_from.as_ref().is_some_and(|from| {
                record
                    .and_then(|r| r.snapshot.as_ref())
                    .is_some_and(|r| &r.snapshot == from)
            });
            if named || took_recorded {
                SweepVerdict::Keep
            } else {
                SweepVerdict::Sweep
            }
        }
        SweepObject::Snapshot {
            snapshot,
            by,
            expires,
            ..
        } => {
            if record.is_some_and(|r| r.warm == Some(*by)) {
                // Made by the sandbox the record names: its owner stopped it and crashed before
                // the record said so. The next owner's adoption takes it back.
                return SweepVerdict::Keep;
            }
            let recorded = record
                .and_then(|r| r.snapshot.as_ref())
                .filter(|r| &r.snapshot == snapshot);
            match recorded {
                Some(r) => match r.retain_until {
                    Some(until) if until <= now => SweepVerdict::SweepAndUnrecord,
                    _ => SweepVerdict::Keep,
                },
                None => match expires {
                    Some(until) if *until > now => SweepVerdict::Keep,
                    _ => SweepVerdict::Sweep,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::RecordedSnapshot;
    use crate::name::SessionId;

    fn key() -> Key {
        Key::Session(SessionId::new("s").unwrap())
    }

    fn at(s: u64) -> Instant {
        Instant::from_nanos(s * 1_000_000_000)
    }

    fn sandbox(incarnation: u64) -> SweepObject {
        SweepObject::Sandbox {
            id: SandboxId(incarnation << 32 | 7),
            key: Some(key()),
            resumed_from: None,
        }
    }

    fn snapshot(expires: Option<Instant>) -> SweepObject {
        SweepObject::Snapshot {
            snapshot: Snapshot::new("snap"),
            by: SandboxId(2 << 32),
            key: Some(key()),
            expires,
        }
    }

    fn keys(owner_live: bool, record: KeyRecord) -> BTreeMap<Key, SweepKey> {
        BTreeMap::from([(key(), SweepKey { owner_live, record })])
    }

    fn dead(_: u32) -> bool {
        false
    }

    #[test]
    fn the_maker_sweeps_its_own_snapshot_once_its_core_lets_go_and_the_record_moved_on() {
        let me = |holds| {
            Some(Sweeper {
                incarnation: 2,
                holds,
            })
        };
        let live = |i| i == 2;
        // Resumed elsewhere: the record names the sandbox that took it, owned by a live process.
        let moved_on = keys(
            true,
            KeyRecord {
                snapshot: None,
                warm: Some(SandboxId(3 << 32 | 1)),
            },
        );
        let verdict = |object: &SweepObject, keys, sweeper| {
            sweep_verdict_of(object, keys, live, at(10), sweeper)
        };
        assert_eq!(
            verdict(&snapshot(None), &moved_on, me(false)),
            SweepVerdict::Sweep
        );
        // Held by its core, asked by no sweeper, another live process's, or its expiry ahead:
        // kept, as before.
        assert_eq!(
            verdict(&snapshot(None), &moved_on, me(true)),
            SweepVerdict::Keep
        );
        assert_eq!(
            verdict(&snapshot(None), &moved_on, None),
            SweepVerdict::Keep
        );
        let other = Some(Sweeper {
            incarnation: 3,
            holds: false,
        });
        assert_eq!(
            sweep_verdict_of(
                &snapshot(None),
                &moved_on,
                |i| i == 2 || i == 3,
                at(10),
                other
            ),
            SweepVerdict::Keep
        );
        assert_eq!(
            verdict(&snapshot(Some(at(11))), &moved_on, me(false)),
            SweepVerdict::Keep
        );
        assert_eq!(
            verdict(&snapshot(Some(at(10))), &moved_on, me(false)),
            SweepVerdict::Sweep
        );
        // Named by the record, as the snapshot or by its maker: kept.
        let named = keys(
            true,
            KeyRecord {
                snapshot: Some(RecordedSnapshot {
                    snapshot: Snapshot::new("snap"),
                    by: SandboxId(2 << 32),
                    retain_until: None,
                }),
                warm: None,
            },
        );
        assert_eq!(
            verdict(&snapshot(None), &named, me(false)),
            SweepVerdict::Keep
        );
        let its_maker = keys(
            false,
            KeyRecord {
                snapshot: None,
                warm: Some(SandboxId(2 << 32)),
            },
        );
        assert_eq!(
            verdict(&snapshot(None), &its_maker, me(false)),
            SweepVerdict::Keep
        );
        // Sandboxes are never judged by this rule.
        assert_eq!(
            verdict(&sandbox(2), &moved_on, me(false)),
            SweepVerdict::Keep
        );
    }

    #[test]
    fn a_live_maker_or_a_live_owner_keeps_everything() {
        let none = keys(false, KeyRecord::default());
        assert_eq!(
            sweep_verdict(&sandbox(2), &none, |i| i == 2, at(0)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&sandbox(0), &none, dead, at(0)),
            SweepVerdict::Keep
        );
        let owned = keys(true, KeyRecord::default());
        assert_eq!(
            sweep_verdict(&sandbox(2), &owned, dead, at(0)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&snapshot(None), &owned, dead, at(0)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&sandbox(2), &none, dead, at(0)),
            SweepVerdict::Sweep
        );
    }

    #[test]
    fn a_record_keeps_its_sandbox_and_its_snapshot_until_its_retention() {
        let warm = keys(
            false,
            KeyRecord {
                snapshot: None,
                warm: Some(SandboxId(2 << 32 | 7)),
            },
        );
        assert_eq!(
            sweep_verdict(&sandbox(2), &warm, dead, at(0)),
            SweepVerdict::Keep
        );
        let recorded = |retain_until| {
            keys(
                false,
                KeyRecord {
                    snapshot: Some(RecordedSnapshot {
                        snapshot: Snapshot::new("snap"),
                        by: SandboxId(2 << 32),
                        retain_until,
                    }),
                    warm: None,
                },
            )
        };
        // The record's retention decides, not the snapshot's own expiry.
        let object = snapshot(Some(at(5)));
        assert_eq!(
            sweep_verdict(&object, &recorded(None), dead, at(100)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&object, &recorded(Some(at(50))), dead, at(49)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&object, &recorded(Some(at(50))), dead, at(50)),
            SweepVerdict::SweepAndUnrecord
        );
    }

    #[test]
    fn a_sandbox_that_took_the_recorded_snapshot_is_kept_for_the_next_start() {
        let took = |from: &str| SweepObject::Sandbox {
            id: SandboxId(2 << 32 | 9),
            key: Some(key()),
            resumed_from: Some(Snapshot::new(from)),
        };
        let record = KeyRecord {
            snapshot: Some(RecordedSnapshot {
                snapshot: Snapshot::new("snap"),
                by: SandboxId(1 << 32),
                retain_until: None,
            }),
            warm: None,
        };
        let keys = keys(false, record);
        assert_eq!(
            sweep_verdict(&took("snap"), &keys, dead, at(10)),
            SweepVerdict::Keep
        );
        // Another snapshot's, or none: nothing names it.
        assert_eq!(
            sweep_verdict(&took("older"), &keys, dead, at(10)),
            SweepVerdict::Sweep
        );
        assert_eq!(
            sweep_verdict(&sandbox(2), &keys, dead, at(10)),
            SweepVerdict::Sweep
        );
    }

    #[test]
    fn a_snapshot_made_by_the_recorded_sandbox_is_kept_for_its_adoption() {
        // The record names sandbox 2<<32 (running when its owner crashed); the owner had
        // stopped it into this snapshot without recording so.
        let record = KeyRecord {
            snapshot: None,
            warm: Some(SandboxId(2 << 32)),
        };
        let v = sweep_verdict(&snapshot(None), &keys(false, record), dead, at(10));
        assert_eq!(v, SweepVerdict::Keep);
        // Made by another sandbox: no record names it, so it goes.
        let other = KeyRecord {
            snapshot: None,
            warm: Some(SandboxId(3 << 32)),
        };
        let v = sweep_verdict(&snapshot(None), &keys(false, other), dead, at(10));
        assert_eq!(v, SweepVerdict::Sweep);
    }

    #[test]
    fn an_unrecorded_snapshot_goes_at_its_own_expiry_or_at_once_without_one() {
        let none = keys(false, KeyRecord::default());
        assert_eq!(
            sweep_verdict(&snapshot(Some(at(10))), &none, dead, at(9)),
            SweepVerdict::Keep
        );
        assert_eq!(
            sweep_verdict(&snapshot(Some(at(10))), &none, dead, at(10)),
            SweepVerdict::Sweep
        );
        assert_eq!(
            sweep_verdict(&snapshot(None), &none, dead, at(0)),
            SweepVerdict::Sweep
        );
        // A key the store does not know is no key's.
        assert_eq!(
            sweep_verdict(&snapshot(None), &BTreeMap::new(), dead, at(0)),
            SweepVerdict::Sweep
        );
    }
}
