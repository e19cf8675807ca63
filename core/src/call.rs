//! Call records, isolation-key slots, and the memory of recently ended calls.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::ids::{Key, SandboxId, Snapshot, Spec};
use crate::map::Map;
use crate::name::{CallId, ExternalId, SessionId, UserId};
use crate::sandbox::SandboxIx;
use crate::session::SessionIx;
use crate::small_set::Few;
use crate::timer::TimerRef;

slotmap::new_key_type! {
    /// A live call's place in the call table. Records refer to calls by it; a call's name is
    /// hashed once, where it comes in ([`Calls::find`]). A place is reused after its call ended,
    /// with a new generation, so a stale one never finds the wrong call.
    pub(crate) struct CallIx;
}

slotmap::new_key_type! {
    /// An isolation key's place in the key table. Calls and sandboxes refer to their key by it;
    /// a key is hashed once per acquire ([`Keys::find`]).
    pub(crate) struct KeyIx;
}

/// What the application asks for when it acquires a sandbox for a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    /// The call's name; unique among live calls.
    pub call: CallId,
    /// The session the call belongs to.
    pub session: SessionId,
    /// The user, required by scope `User`.
    pub user: Option<UserId>,
    /// An application-supplied sandbox to bind at once instead of a managed one.
    pub external: Option<ExternalId>,
    /// Passed through to Start.
    pub spec: Spec,
}

impl CallSpec {
    /// A call of `session` with no user, no external sandbox and an empty spec.
    pub fn new(call: CallId, session: SessionId) -> Self {
        CallSpec {
            call,
            session,
            user: None,
            external: None,
            spec: Spec::default(),
        }
    }

    /// The same, naming the user.
    pub fn with_user(mut self, user: UserId) -> Self {
        self.user = Some(user);
        self
    }

    /// The same, bound to an external sandbox.
    pub fn with_external(mut self, external: ExternalId) -> Self {
        self.external = Some(external);
        self
    }

    /// The same, with a spec for Start.
    pub fn with_spec(mut self, spec: Spec) -> Self {
        self.spec = spec;
        self
    }
}

/// Where a live call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallStatus {
    /// Queued behind its key.
    Waiting,
    /// Bound to a sandbox that is starting.
    Starting(SandboxId),
    /// Bound to a sandbox that is up: ready.
    Ready(SandboxId),
    /// Was ready; its sandbox died. Live until released.
    Lost(SandboxId),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum CallState {
    /// Queued in its key's waiters until the deadline.
    Waiting { deadline: TimerRef },
    /// Bound to a starting sandbox.
    Starting(SandboxIx),
    /// Bound to a sandbox that was up when bound (it may have died since).
    Ready(SandboxIx),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Call {
    /// Its name, as the application gave it.
    pub(crate) id: CallId,
    pub(crate) session: SessionIx,
    pub(crate) key: KeyIx,
    pub(crate) spec: Spec,
    pub(crate) state: CallState,
}

impl Call {
    /// The sandbox the call is bound to, if any.
    pub(crate) fn sandbox(&self) -> Option<SandboxIx> {
        match self.state {
            CallState::Waiting { .. } => None,
            CallState::Starting(x) | CallState::Ready(x) => Some(x),
        }
    }
}

/// The live calls: records in a generational slab, and the index from names to places.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Calls {
    records: slotmap::SlotMap<CallIx, Call>,
    by_name: Map<CallId, CallIx>,
}

impl Calls {
    /// The place of the live call named `call`. The one hash of a call's name per input.
    pub(crate) fn find(&self, call: &CallId) -> Option<CallIx> {
        self.by_name.get(call).copied()
    }

    /// Adds a call whose name is not live.
    pub(crate) fn insert(&mut self, call: Call) -> CallIx {
        let id = call.id.clone();
        let ix = self.records.insert(call);
        let was = self.by_name.insert(id, ix);
        debug_assert!(was.is_none(), "a live call's name inserted twice");
        ix
    }

    /// Removes a live call.
    pub(crate) fn remove(&mut self, ix: CallIx) -> Call {
        let call = self.records.remove(ix).expect("a live call");
        self.by_name.remove(&call.id);
        call
    }

    /// The live call at `ix`, if it is still live.
    pub(crate) fn get(&self, ix: CallIx) -> Option<&Call> {
        self.records.get(ix)
    }

    /// Live calls.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no call is live.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every live call, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (CallIx, &Call)> {
        self.records.iter()
    }

    /// Whether the name index and the records agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_name.len() == self.records.len()
            && self
                .by_name
                .iter()
                .all(|(name, ix)| self.records.get(*ix).is_some_and(|c| &c.id == name))
    }

    /// Forgets every call (close finished).
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.by_name.clear();
    }

    /// `calls` sorted by name: the order in which several calls reach an output.
    pub(crate) fn by_name_order(&self, mut calls: Few<CallIx>) -> Few<CallIx> {
        if calls.len() > 1 {
            calls.sort_by(|a, b| self[*a].id.cmp(&self[*b].id));
        }
        calls
    }
}

impl std::ops::Index<CallIx> for Calls {
    type Output = Call;

    fn index(&self, ix: CallIx) -> &Call {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<CallIx> for Calls {
    fn index_mut(&mut self, ix: CallIx) -> &mut Call {
        &mut self.records[ix]
    }
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
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.current.is_none()
            && self.retiring.is_none()
            && self.bound == 0
            && self.waiters.is_empty()
            && self.snapshot.is_none()
    }
}

/// The last [`Limits::remembered_ended_calls`](crate::Limits) ended call names, oldest first.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct EndedCalls {
    order: VecDeque<(CallId, u64)>,
    index: Map<CallId, u64>,
    next: u64,
}

impl EndedCalls {
    pub(crate) fn remember(&mut self, call: CallId, capacity: usize) {
        if capacity == 0 {
            return;
        }
        let stamp = self.next;
        self.next += 1;
        self.index.insert(call.clone(), stamp);
        self.order.push_back((call, stamp));
        while self.order.len() > capacity {
            if let Some((old, old_stamp)) = self.order.pop_front() {
                if self.index.get(&old) == Some(&old_stamp) {
                    self.index.remove(&old);
                }
            }
        }
    }

    pub(crate) fn contains(&self, call: &CallId) -> bool {
        self.index.contains_key(call)
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
        if let Some(ix) = self.by_key.get(&key) {
            return *ix;
        }
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
    pub(crate) fn forget_if_empty(&mut self, ix: KeyIx) {
        if self.records.get(ix).is_some_and(KeySlot::is_empty) {
            let slot = self.records.remove(ix).expect("checked");
            self.by_key.remove(&slot.key);
        }
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
