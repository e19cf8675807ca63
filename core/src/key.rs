//! Isolation keys: the slot of each key the core tracks (its current and retiring sandboxes,
//! its bound calls and queued waiters, its latest snapshot), the key table, and the key logic
//! (must a new call queue, admitting waiters first in first out, letting go of a sandbox).

use crate::call::{CallIx, CallState};
use crate::config::SameKey;
use crate::fleet::{ClaimId, ReleaseId, Token};
use crate::ids::{Key, SandboxId, Snapshot};
use crate::key_record::StoreRecord;
use crate::lifecycle::Lifecycle;
use crate::map::Map;
use crate::sandbox::SandboxIx;
use crate::timer::TimerRef;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

slotmap::new_key_type! {
    /// An isolation key's place in the key table. Calls and sandboxes refer to their key by it;
    /// a key is hashed once per acquire ([`Keys::find`]).
    pub(crate) struct KeyIx;
}

/// Per isolation key: which sandbox serves it, which one is retiring, who waits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct KeySlot {
    /// The key itself.
    pub(crate) key: Key,
    /// The sandbox calls of this key bind to: Starting, Running, Idle or Draining.
    pub(crate) current: Option<SandboxIx>,
    /// The key's previous sandbox while it stops and persists: the next Start of the key waits
    /// for its snapshot.
    pub(crate) retiring: Option<SandboxIx>,
    /// Live calls of this key bound to a sandbox (starting or ready, dead sandboxes included).
    pub(crate) bound: u32,
    /// Queued calls, first in first out.
    pub(crate) waiters: VecDeque<CallIx>,
    /// The latest persisted snapshot, for the next Start's `resume_from`, with the sandbox that
    /// persisted it (the next Start's `resumes`).
    pub(crate) snapshot: Option<(Snapshot, SandboxId)>,
    /// The end of the snapshot's retention, when the policy has one: `Timer::Retain`.
    pub(crate) retain: Option<TimerRef>,
    /// Fleet mode: whether this process owns the key, and the store work under way for it.
    pub(crate) own: Own,
    /// Fleet mode: the deadline of the claim or release under way, or when a busy claim or a
    /// failed release is tried again (`Timer::KeyStore`).
    pub(crate) store_at: Option<TimerRef>,
    /// Fleet mode: what this process knows of the key's durable record in the store: as last
    /// confirmed, the write under way, a write in doubt (`key_record.rs`).
    #[serde(default)]
    pub(crate) record: StoreRecord,
    /// Fleet mode: the key's sandbox left as it is after its way down failed with nothing
    /// salvaged (its Stop unanswered or failed): it still holds the key's history. The key's
    /// record names it warm, so that whoever continues the key next adopts it (the next owner,
    /// or this process's next call of the key) rather than starting afresh.
    #[serde(default)]
    pub(crate) left: Option<crate::ids::SandboxId>,
}

/// Fleet mode: a key's ownership, as this process knows it.
///
/// ```text
///  Unclaimed ──(a call; lease valid)──▶ Claiming ──claimed──▶ Owned ──(way down ended, wanted,
///      ▲                                  │  busy, failed,      │        or close)──▶ Releasing
///      │                                  ▼  late               │                        │
///      └───────(no call waits)─────── Busy (retry timer) ◀──────┘ (nothing)    released │
///      └─────────────────────────────────────────────────────────────────────────────────┘
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Own {
    /// Not a fleet key (scope `Call`, an external sandbox, or a single keeper): calls bind at
    /// once.
    Local,
    /// A fleet key this process does not own: a call of it orders a claim.
    Unclaimed,
    /// A claim is under way, made under this lease epoch.
    Claiming(ClaimId, u64),
    /// Another process holds it (or the claim failed): the claim is made again at `store_at`.
    Busy,
    /// This process owns it.
    Owned(Held),
    /// Its release is under way; the key is still this process's.
    Releasing(ReleaseId, Held),
}

/// Fleet mode: a key this process owns (or is releasing), as far as it knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// The token it owns the key under.
    pub(crate) token: Token,
    /// Another process wants the key: hand it over once this one's calls on it end.
    pub(crate) wanted: bool,
    /// A release went unanswered: it may have landed, so the key may no longer be this
    /// process's. Nothing binds to it, and the release is asked again, until a definite answer
    /// (released, or fenced).
    pub(crate) doubtful: bool,
}

impl Held {
    /// Just claimed under `token`: wanted by nobody yet, in no doubt.
    pub(crate) fn claimed(token: Token) -> Self {
        Held {
            token,
            wanted: false,
            doubtful: false,
        }
    }
}

impl KeySlot {
    /// A slot with nothing in it yet.
    pub(crate) fn new(key: Key) -> Self {
        KeySlot {
            key,
            current: None,
            retiring: None,
            bound: 0,
            waiters: VecDeque::new(),
            snapshot: None,
            retain: None,
            own: Own::Local,
            store_at: None,
            record: StoreRecord::default(),
            left: None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.current.is_none()
            && self.retiring.is_none()
            && self.bound == 0
            && self.waiters.is_empty()
            && self.snapshot.is_none()
            && matches!(self.own, Own::Local | Own::Unclaimed)
            && self.store_at.is_none()
    }

    /// The token this process owns the key under, if it does.
    pub(crate) fn token(&self) -> Option<Token> {
        match self.own {
            Own::Owned(held) | Own::Releasing(_, held) => Some(held.token),
            _ => None,
        }
    }
}

/// The isolation keys the core tracks: slots in a generational slab, and the index from keys to
/// places. A slot is forgotten once empty ([`KeySlot::is_empty`]); a sandbox that outlives its
/// key's slot (shutting down) finds no slot at its old place, as it found none by name before.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Keys {
    records: slotmap::SlotMap<KeyIx, KeySlot>,
    by_key: Map<Key, KeyIx>,
}

impl Keys {
    /// The place of `key`'s slot.
    pub(crate) fn find(&self, key: &Key) -> Option<KeyIx> {
        self.by_key.get(key).copied()
    }

    /// The place of `key`'s slot, made empty if there is none.
    pub(crate) fn find_or_insert(&mut self, key: Key) -> KeyIx {
        match self.by_key.get(&key) {
            Some(ix) => *ix,
            None => self.insert_new(key),
        }
    }

    /// A new, empty slot for `key`, which has none (the caller just looked).
    #[inline(always)]
    pub(crate) fn insert_new(&mut self, key: Key) -> KeyIx {
        debug_assert!(!self.by_key.contains_key(&key), "a key has one slot");
        let ix = self.records.insert(KeySlot::new(key.clone()));
        self.by_key.insert(key, ix);
        ix
    }

    /// The slot at `ix`, if it is still tracked.
    pub(crate) fn get(&self, ix: KeyIx) -> Option<&KeySlot> {
        self.records.get(ix)
    }

    /// The slot at `ix`, if it is still tracked.
    pub(crate) fn get_mut(&mut self, ix: KeyIx) -> Option<&mut KeySlot> {
        self.records.get_mut(ix)
    }

    /// Forgets the slot at `ix` if it is tracked and empty.
    #[inline]
    pub(crate) fn forget_if_empty(&mut self, ix: KeyIx) {
        if self.records.get(ix).is_some_and(KeySlot::is_empty) {
            self.forget(ix);
        }
    }

    /// Forgets the tracked, empty slot at `ix`.
    #[inline(always)]
    pub(crate) fn forget(&mut self, ix: KeyIx) {
        let slot = &self.records[ix];
        debug_assert!(slot.is_empty(), "forgot a key in use");
        self.by_key.remove(&slot.key);
        self.records.remove(ix);
    }

    /// Keys tracked.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Every slot, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (KeyIx, &KeySlot)> {
        self.records.iter()
    }

    /// Every slot, mutably, in no order that may reach an output.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (KeyIx, &mut KeySlot)> {
        self.records.iter_mut()
    }

    /// Whether the key index and the slots agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_key.len() == self.records.len()
            && self
                .by_key
                .iter()
                .all(|(key, ix)| self.records.get(*ix).is_some_and(|k| &k.key == key))
    }

    /// Forgets every key (close finished).
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.by_key.clear();
    }
}

impl std::ops::Index<KeyIx> for Keys {
    type Output = KeySlot;

    fn index(&self, ix: KeyIx) -> &KeySlot {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<KeyIx> for Keys {
    fn index_mut(&mut self, ix: KeyIx) -> &mut KeySlot {
        &mut self.records[ix]
    }
}

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Internals: keys

    /// Whether a new call of `key` must queue: others queue already (first in, first out), the
    /// key's previous sandbox is still stopping (its snapshot is not persisted yet), or the
    /// policy is `Serialize` and a call holds the key.
    pub(crate) fn must_wait(&self, key: &Key, slot: Option<KeyIx>) -> bool {
        if matches!(key, Key::External(_)) {
            return false;
        }
        if self.is_fleet_key(key) && !slot.is_some_and(|k| self.may_bind(k)) {
            return true;
        }
        slot.map(|k| &self.keys[k]).is_some_and(|k| {
            !k.waiters.is_empty()
                || k.retiring.is_some()
                || (self.config.same_key == SameKey::Serialize && k.bound > 0)
        })
    }

    /// Admits queued calls of `key` while the policy lets them in. Called after every change
    /// that may let one in; with no call queued anywhere (the usual case) it is one test, kept
    /// inline, and the work is out of line in `admit_queued`.
    #[inline]
    pub(crate) fn admit(&mut self, key: KeyIx) {
        if self.calls.waiting != 0 {
            self.admit_queued(key);
        }
    }

    /// [`admit`](Self::admit)'s work, when some call is queued.
    fn admit_queued(&mut self, key: KeyIx) {
        loop {
            let serialize = self.config.same_key == SameKey::Serialize;
            if self.keys.get(key).is_some_and(|k| k.own != Own::Local) && !self.may_bind(key) {
                return;
            }
            let Some(slot) = self.keys.get_mut(key) else {
                return;
            };
            if slot.retiring.is_some() || (serialize && slot.bound > 0) {
                return;
            }
            let Some(call) = slot.waiters.pop_front() else {
                return;
            };
            if let CallState::Waiting { deadline } = self.calls[call].state {
                self.timers.cancel(deadline);
            }
            self.calls.waiting -= 1;
            tracing::debug!(call = %self.calls[call].id, key = %slot.key, "admitted");
            self.bind(call);
        }
    }

    /// The key no longer waits on the sandbox: queued calls may start a new one.
    pub(crate) fn key_lets_go(&mut self, key: KeyIx, sandbox: SandboxIx) {
        if let Some(slot) = self.keys.get_mut(key) {
            if slot.current == Some(sandbox) {
                slot.current = None;
            }
            if slot.retiring == Some(sandbox) {
                slot.retiring = None;
            }
        }
        self.admit(key);
        self.key_settles(key);
    }
}
