//! The simulated store every replica reaches: one lease per process incarnation, one record per
//! fleet key, in true time. It decides exactly what `StoreCommand`'s docs promise, and nothing
//! more: the replicas' cores are the protocol under test, this is the world they run against.
//!
//! Not modelled: the store's own replication and its clock (true time is the store's clock),
//! partial writes (a write lands whole or not at all), and watch latency (the owner learns of a
//! want at its next renewal, as the real drivers do).

use std::collections::{BTreeMap, BTreeSet};

use sandkeeper::{Key, KeyRecord, Token};

/// A process lease as the store keeps it.
#[derive(Clone, Copy, Debug)]
struct Lease {
    epoch: u64,
    expires_ns: u64,
}

/// A key's entry: its owner (incarnation, epoch), its last token, its record, who wants it.
#[derive(Clone, Debug, Default)]
pub struct Entry {
    /// The owner, while one holds it.
    pub owner: Option<(u32, u64)>,
    /// The newest token handed out.
    pub token: u64,
    /// The durable record the last owner left (handed to each claim, kept until its owner writes a newer one).
    pub record: KeyRecord,
    /// Incarnations that asked for the key while another held it.
    pub wants: BTreeSet<u32>,
    /// The newest record write of the current owner applied (reset when the key is claimed).
    pub recording: Option<u64>,
}

/// How the store answered a claim.
#[derive(Clone, Debug)]
pub enum ClaimAnswer {
    /// Owned under this token, continuing from this record.
    Claimed(Token, KeyRecord),
    /// Another live process holds it; the want is recorded.
    Busy,
}

/// The store.
#[derive(Clone, Debug, Default)]
pub struct Store {
    leases: BTreeMap<u32, Lease>,
    /// Every key's entry, in key order.
    pub keys: BTreeMap<Key, Entry>,
    lease_ns: u64,
    /// Writes made (renewals, claims, releases), for the per-minute figure.
    pub writes: u64,
}

impl Store {
    /// An empty store whose leases last `lease_ns` after each renewal.
    pub fn new(lease_ns: u64) -> Self {
        Store {
            lease_ns,
            ..Store::default()
        }
    }

    /// Whether `(incarnation, epoch)` holds a live lease at `now_ns`.
    pub fn is_live(&self, owner: (u32, u64), now_ns: u64) -> bool {
        self.leases
            .get(&owner.0)
            .is_some_and(|l| l.epoch == owner.1 && now_ns < l.expires_ns)
    }

    /// A renewal under `epoch`: `Some(keys others want that this process holds)` when written,
    /// `None` when refused (an older epoch).
    pub fn renew(&mut self, incarnation: u32, epoch: u64, now_ns: u64) -> Option<Vec<Key>> {
        let expires_ns = now_ns + self.lease_ns;
        match self.leases.get_mut(&incarnation) {
            Some(l) if l.epoch > epoch => return None,
            Some(l) => {
                l.epoch = epoch;
                l.expires_ns = expires_ns;
            }
            None => {
                self.leases.insert(incarnation, Lease { epoch, expires_ns });
            }
        }
        self.writes += 1;
        Some(
            self.keys
                .iter()
                .filter(|(_, e)| e.owner == Some((incarnation, epoch)) && !e.wants.is_empty())
                .map(|(k, _)| k.clone())
                .collect(),
        )
    }

    /// A claim of `key` by `(incarnation, epoch)`.
    pub fn claim(&mut self, key: &Key, incarnation: u32, epoch: u64, now_ns: u64) -> ClaimAnswer {
        if self
            .leases
            .get(&incarnation)
            .is_some_and(|l| l.epoch > epoch)
        {
            // Made under a lease epoch the process has left (a claim that arrives late): it
            // must not take the key, nor its record, from under the process's newer epoch.
            return ClaimAnswer::Busy;
        }
        let owner = self.keys.entry(key.clone()).or_default().owner;
        if let Some(other) = owner.filter(|o| o.0 != incarnation) {
            if self.is_live(other, now_ns) {
                let e = self.keys.get_mut(key).expect("entered");
                e.wants.insert(incarnation);
                return ClaimAnswer::Busy;
            }
        }
        self.writes += 1;
        let e = self.keys.get_mut(key).expect("entered");
        e.owner = Some((incarnation, epoch));
        e.token += 1;
        e.wants.remove(&incarnation);
        e.recording = None;
        ClaimAnswer::Claimed(Token(e.token), e.record.clone())
    }

    /// A write of the owned `key`'s record under `token`: whether the key is still the
    /// writer's under that token (a write older than one applied changes nothing).
    pub fn record(
        &mut self,
        key: &Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: KeyRecord,
        now_ns: u64,
    ) -> bool {
        if !self.still_owned(key, incarnation, token, now_ns) {
            return false;
        }
        let e = self.keys.get_mut(key).expect("owned");
        if e.recording.is_some_and(|newest| newest >= recording) {
            return true;
        }
        self.writes += 1;
        e.recording = Some(recording);
        e.record = record;
        true
    }

    /// A release of `key` under `token` with `record`: whether it was written (the key is still
    /// the releaser's under that token, with a live lease).
    pub fn release(
        &mut self,
        key: &Key,
        incarnation: u32,
        token: Token,
        record: KeyRecord,
        now_ns: u64,
    ) -> bool {
        if !self.still_owned(key, incarnation, token, now_ns) {
            return false;
        }
        let e = self.keys.get_mut(key).expect("owned");
        self.writes += 1;
        e.owner = None;
        e.record = record;
        true
    }

    /// Whether `incarnation` owns `key` under `token` with a live lease at `now_ns` (a write of
    /// an owner whose lease expired is refused even before another claims the key: a sweep may
    /// have removed what it would name).
    fn still_owned(&self, key: &Key, incarnation: u32, token: Token, now_ns: u64) -> bool {
        self.keys.get(key).is_some_and(|e| {
            e.token == token.0
                && e.owner
                    .is_some_and(|o| o.0 == incarnation && self.is_live(o, now_ns))
        })
    }

    /// Whether `incarnation` holds a live lease at `now_ns`, whatever its epoch.
    pub fn lease_live(&self, incarnation: u32, now_ns: u64) -> bool {
        self.leases
            .get(&incarnation)
            .is_some_and(|l| now_ns < l.expires_ns)
    }

    /// The owner of `key` if it holds a live lease at `now_ns`.
    pub fn live_owner(&self, key: &Key, now_ns: u64) -> Option<(u32, u64)> {
        self.keys
            .get(key)
            .and_then(|e| e.owner)
            .filter(|o| self.is_live(*o, now_ns))
    }
}
