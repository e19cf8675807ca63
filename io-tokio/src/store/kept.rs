//! What every fleet store keeps and reports, whatever its medium (files on a local root, Leases
//! on Kubernetes): a key's entry, what a sweep removed, and the wall clock in milliseconds every
//! process of a fleet shares. Backends build on these; the generic driver (the executor, the
//! keeper) sees only them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::StoredRecord;

/// One key's entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// The key, as it displays.
    pub key: String,
    /// Its owner: (incarnation, lease epoch), while one holds it.
    pub owner: Option<(u32, u64)>,
    /// The newest token handed out for it.
    pub token: u64,
    /// What its last owner left.
    pub record: StoredRecord,
    /// Incarnations that asked for it while another held it.
    pub wants: BTreeSet<u32>,
    /// The newest record write of its current owner applied (none since the key was claimed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<u64>,
}

/// What one sweep removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Sandbox directories removed.
    pub sandboxes: u64,
    /// Snapshots removed.
    pub snapshots: u64,
    /// Of those snapshots, ones a key's record named until its retention ended (the record no
    /// longer names them).
    pub unrecorded: u64,
}

impl Swept {
    /// Counts `object`, removed on `verdict`.
    pub fn count(&mut self, object: &sandkeeper::SweepObject, verdict: sandkeeper::SweepVerdict) {
        match object {
            sandkeeper::SweepObject::Sandbox { .. } => self.sandboxes += 1,
            sandkeeper::SweepObject::Snapshot { .. } => {
                self.snapshots += 1;
                if verdict == sandkeeper::SweepVerdict::SweepAndUnrecord {
                    self.unrecorded += 1;
                }
            }
        }
    }
}

impl std::ops::AddAssign for Swept {
    fn add_assign(&mut self, other: Swept) {
        self.sandboxes += other.sandboxes;
        self.snapshots += other.snapshots;
        self.unrecorded += other.unrecorded;
    }
}

/// Milliseconds since the unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The keys `incarnation` owns among `entries` (a local store's
/// [`entries`](crate::local::store::LocalStore::entries), or the Kubernetes store's), with the
/// token each is held under.
pub fn held_by(entries: &[KeyEntry], incarnation: u32) -> BTreeMap<String, u64> {
    entries
        .iter()
        .filter(|e| e.owner.is_some_and(|(i, _)| i == incarnation))
        .map(|e| (e.key.clone(), e.token))
        .collect()
}

/// Of the keys `incarnation` held (`held`, as [`held_by`] gave them), those `entries` show not
/// taken over: still its own, or under no newer token.
pub fn not_taken_over(
    held: &BTreeMap<String, u64>,
    entries: &[KeyEntry],
    incarnation: u32,
) -> Vec<String> {
    held.iter()
        .filter(|(key, token)| {
            !entries.iter().any(|e| {
                &e.key == *key && e.token > **token && e.owner.is_none_or(|(i, _)| i != incarnation)
            })
        })
        .map(|(key, _)| key.clone())
        .collect()
}
