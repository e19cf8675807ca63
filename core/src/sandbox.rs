//! Sandbox records and their states.

use crate::call::CallIx;
use crate::command::HookPoint;
use crate::fleet::Token;
use crate::id_index::IdIndex;
use crate::ids::{SandboxId, Snapshot};
use crate::key::KeyIx;
use crate::name::ExternalId;
use crate::session::SessionIx;
use crate::small_set::SmallSet;
use crate::timer::TimerRef;
use crate::upload::UploadIx;
use serde::{Deserialize, Serialize};

/// Where a sandbox is in its life, as the core decides it. A sandbox's liveness is this state,
/// never a flag on a backend object.
///
/// Starting → Running → (Idle, when warm) → Draining → Stopping → Persisting → ShuttingDown →
/// gone; Dead from anywhere once the backend reports it gone. Suspend ends after Persisting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxState {
    /// Start ordered, not answered.
    Starting,
    /// Up, with bound calls.
    Running,
    /// Up, no calls, kept warm for the next call of its key.
    Idle,
    /// Up, no calls, finishing its mirror work before Stop.
    Draining,
    /// Stop ordered.
    Stopping,
    /// Persist ordered.
    Persisting,
    /// Fleet mode: persisted, its Shutdown (or its suspension) held back until its key's
    /// durable record no longer names it warm (a record write naming the snapshot instead is
    /// confirmed).
    Persisted,
    /// Shutdown ordered.
    ShuttingDown,
    /// Fleet mode: drained, handed over warm to the key's next owner: the release of its key
    /// (naming it in the key's record) is ordered, not answered.
    HandingOver,
    /// The backend reported it gone.
    Dead,
}

impl SandboxState {
    /// Whether uploads may be ordered into it: it is up and no Stop, Shutdown or death came.
    pub fn accepts_uploads(self) -> bool {
        matches!(
            self,
            SandboxState::Running | SandboxState::Idle | SandboxState::Draining
        )
    }
}

/// Who orders a sandbox's start and end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ownership {
    /// The core orders Start, Stop, Persist and Shutdown.
    Managed,
    /// The application supplied it; the core only binds and unbinds it.
    External(ExternalId),
}

/// Which answer the core waits for from the backend about a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Awaiting {
    Nothing,
    Start,
    Stop,
    Persist,
    Hook,
    /// Fleet mode: a write of its key's durable record, before the sandbox goes on. Up
    /// (state `Starting`), its calls are made ready once the record names it, so that what
    /// they do is acknowledged only where the key's next owner would continue. Persisted
    /// (state `Persisted`), its Shutdown (or its suspension, whose snapshot the key's next
    /// start takes) waits until the record no longer names it warm: a process that ends
    /// meanwhile leaves the next owner the sandbox or the snapshot, never a record naming a
    /// sandbox already deleted or emptied. No sandbox timer (the record's store timer
    /// runs; a lapse of the lease fences the key).
    Record,
    Shutdown,
}

slotmap::new_key_type! {
    /// A tracked sandbox's place in the sandbox table. Records refer to sandboxes by it; a
    /// [`SandboxId`] is looked up once, where an answer or report comes in
    /// ([`Sandboxes::find`]).
    pub(crate) struct SandboxIx;
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Sandbox {
    /// Its id, as commands and events name it.
    pub(crate) id: SandboxId,
    pub(crate) key: KeyIx,
    pub(crate) owner: Ownership,
    pub(crate) state: SandboxState,
    pub(crate) awaiting: Awaiting,
    /// Live calls bound to it (starting or ready): its reference count is this set's size.
    pub(crate) bound: SmallSet<CallIx>,
    /// Uploads in flight into it.
    pub(crate) uploads: SmallSet<UploadIx>,
    /// Sessions whose mirror targets it.
    pub(crate) targeting: SmallSet<SessionIx>,
    /// How many of those have pending work or holds.
    pub(crate) busy_sessions: u32,
    /// Work entered into it and not yet left ([`Lifecycle::enter`](crate::Lifecycle::enter)).
    pub(crate) operations: u32,
    /// The instant of its `Timer::Sandbox`, if set.
    pub(crate) deadline: Option<TimerRef>,
    pub(crate) shutdown_ordered: bool,
    /// The snapshot its Stop returned.
    pub(crate) snapshot: Option<Snapshot>,
    /// The snapshot its Start resumed and the sandbox that persisted it, if it resumed one
    /// (its hook on the way up is then the after-resume one; a Start that fails gives the
    /// snapshot back to its key).
    pub(crate) resumed: Option<(Snapshot, SandboxId)>,
    /// Its way down ends suspended: decided when its drain ends (the policy, unless a failed
    /// before-suspend hook turned it into a shutdown).
    pub(crate) suspend: bool,
    /// The hook outstanding, while `awaiting` is `Hook`.
    pub(crate) hook: Option<HookPoint>,
    /// Fleet mode: the token its key was owned under when it was started or adopted, which
    /// every command changing it carries.
    pub(crate) token: Option<Token>,
    /// Fleet mode: it was adopted from the key's last owner (its Start is an Adopt).
    pub(crate) adopted: bool,
    /// How many of its Stops, then (counted afresh once a Stop succeeded) of its Persists,
    /// failed: each is ordered up to `WAY_DOWN_ATTEMPTS` times (`way_down.rs`).
    pub(crate) way_down_failures: u8,
    /// Fleet mode, adopted: how many of its Adopts went unanswered in time. Each is ordered
    /// again, up to `WAY_DOWN_ATTEMPTS` in all (`ownership.rs`): the sandbox holds its key's
    /// history, and a late answer (this process paused) is no reason to lose it.
    pub(crate) adopt_timeouts: u8,
    /// The backend lost its running instance while it was up, its workspace intact: it goes
    /// down as a suspension at its last release (or at once, without calls), with no drain
    /// and no before-hook, and no call binds to it again (`death.rs`).
    pub(crate) instance_lost: bool,
}

impl Sandbox {
    /// Whether uploads (and the application's work) may go into it: its state accepts them
    /// and its running instance was not lost.
    #[inline(always)]
    pub(crate) fn accepts_uploads(&self) -> bool {
        self.state.accepts_uploads() && !self.instance_lost
    }

    fn new(id: SandboxId, key: KeyIx, owner: Ownership, state: SandboxState) -> Self {
        Sandbox {
            id,
            key,
            owner,
            state,
            awaiting: Awaiting::Nothing,
            bound: SmallSet::Empty,
            uploads: SmallSet::Empty,
            targeting: SmallSet::Empty,
            busy_sessions: 0,
            operations: 0,
            deadline: None,
            shutdown_ordered: false,
            snapshot: None,
            resumed: None,
            suspend: false,
            instance_lost: false,
            hook: None,
            token: None,
            adopted: false,
            way_down_failures: 0,
            adopt_timeouts: 0,
        }
    }

    pub(crate) fn is_managed(&self) -> bool {
        self.owner == Ownership::Managed
    }
}

/// The sandboxes the core tracks: records in a generational slab, the index from ids to places,
/// and the next id to hand out (ids are never reused: a late answer names a sandbox that is
/// gone, never another one).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Sandboxes {
    records: slotmap::SlotMap<SandboxIx, Sandbox>,
    by_id: IdIndex<SandboxId, SandboxIx>,
    /// The first id this core handed out: 0, or in fleet mode its incarnation's first.
    first_id: u64,
    next_id: u64,
}

impl Sandboxes {
    /// No sandbox yet; ids are handed out from `first`.
    pub(crate) fn starting_at(first: u64) -> Self {
        Sandboxes {
            first_id: first,
            next_id: first,
            ..Sandboxes::default()
        }
    }

    /// Tracks a new sandbox under the next id.
    pub(crate) fn create(
        &mut self,
        key: KeyIx,
        owner: Ownership,
        state: SandboxState,
    ) -> SandboxIx {
        let id = SandboxId(self.next_id);
        self.next_id += 1;
        let ix = self.records.insert(Sandbox::new(id, key, owner, state));
        self.by_id.insert(id, ix);
        ix
    }

    /// Tracks a sandbox handed over by another process, under the id its first owner gave it
    /// (fleet mode: adopted). That may be this process, getting back a sandbox it handed over
    /// earlier: its Relinquish dropped every command outstanding on it unanswered (the drain
    /// contract), so no answer of the earlier tracking can reach the new one. `None` when that
    /// id is tracked already.
    pub(crate) fn adopt(&mut self, id: SandboxId, key: KeyIx) -> Option<SandboxIx> {
        if self.by_id.contains_key(id) {
            return None;
        }
        let ix = self.records.insert(Sandbox::new(
            id,
            key,
            Ownership::Managed,
            SandboxState::Starting,
        ));
        self.by_id.insert(id, ix);
        Some(ix)
    }

    /// Whether `id` is another fleet process's numbering (fleet mode: an id this core may
    /// adopt; incarnation 0 is no fleet process's).
    pub(crate) fn is_foreign(&self, id: SandboxId) -> bool {
        let incarnation = id.0 >> 32;
        self.first_id != 0 && incarnation != 0 && incarnation != self.first_id >> 32
    }

    /// The place of the tracked sandbox `id`. The one lookup of a sandbox id per input.
    pub(crate) fn find(&self, id: SandboxId) -> Option<SandboxIx> {
        self.by_id.get(id)
    }

    /// Whether `id` was ever handed out.
    pub(crate) fn was_handed_out(&self, id: SandboxId) -> bool {
        (self.first_id..self.next_id).contains(&id.0)
    }

    /// The sandbox at `ix`, if it is still tracked.
    pub(crate) fn get(&self, ix: SandboxIx) -> Option<&Sandbox> {
        self.records.get(ix)
    }

    /// The sandbox at `ix`, if it is still tracked.
    pub(crate) fn get_mut(&mut self, ix: SandboxIx) -> Option<&mut Sandbox> {
        self.records.get_mut(ix)
    }

    /// Forgets a sandbox.
    #[inline(always)]
    pub(crate) fn remove(&mut self, ix: SandboxIx) {
        let id = self.records[ix].id;
        self.by_id.remove(id);
        // Dropped where it lies: nothing of it is needed any more.
        self.records.remove(ix);
    }

    /// Sandboxes tracked.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none is tracked.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every sandbox, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SandboxIx, &Sandbox)> {
        self.records.iter()
    }

    /// The tracked sandboxes for which `pick` holds, in id order (the order in which several
    /// sandboxes reach an output).
    pub(crate) fn in_id_order(&self, pick: impl Fn(&Sandbox) -> bool) -> Vec<SandboxIx> {
        let mut picked: Vec<(SandboxId, SandboxIx)> = self
            .records
            .iter()
            .filter(|(_, x)| pick(x))
            .map(|(ix, x)| (x.id, ix))
            .collect();
        picked.sort_unstable();
        picked.into_iter().map(|(_, ix)| ix).collect()
    }

    /// Whether the id index and the records agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_id.len() == self.records.len()
            && self
                .by_id
                .iter()
                .all(|(id, ix)| self.records.get(ix).is_some_and(|x| x.id == id))
    }

    /// Forgets every sandbox (close finished); ids keep counting.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.by_id.clear();
    }
}

impl std::ops::Index<SandboxIx> for Sandboxes {
    type Output = Sandbox;

    fn index(&self, ix: SandboxIx) -> &Sandbox {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<SandboxIx> for Sandboxes {
    fn index_mut(&mut self, ix: SandboxIx) -> &mut Sandbox {
        &mut self.records[ix]
    }
}
