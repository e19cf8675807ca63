//! Sandbox records and their states.

use crate::call::CallIx;
use crate::command::HookPoint;
use crate::config::WayDown;
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

/// Which answer the core waits for about a sandbox: a view of its [`State`], which carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Awaiting {
    Nothing,
    Start,
    Stop,
    Persist,
    Hook,
    /// Fleet mode: a write of its key's durable record, before the sandbox goes on (see
    /// [`Rising::Record`] and [`State::Persisted`]). No sandbox timer (the record's store timer
    /// runs; a lapse of the lease fences the key).
    Record,
    Shutdown,
}

/// Where a sandbox is in its life, with what belongs there: what it awaits, whether its way down
/// ends suspended, the snapshot its Stop took, how many of its way-down commands failed, how far
/// its last command went. [`SandboxState`] is its public view. Changed only by the transitions
/// below.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum State {
    Starting(Rising),
    Running,
    Idle,
    Draining,
    HandingOver,
    Stopping(Stopping),
    Persisting(Persisting),
    /// Fleet mode: persisted (or its Persist given up with the snapshot salvaged), held back
    /// until a write of its key's record that no longer names it warm is confirmed; then
    /// `then`. It always awaits that record.
    Persisted(Then),
    ShuttingDown(Last),
    /// The backend reported it gone, or its way down ended without a Shutdown; its last
    /// command, if one was ordered.
    Dead(Option<Last>),
}

/// What a starting sandbox waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Rising {
    /// The answer to its Start (or, adopted, its Adopt).
    Start,
    /// Its after-start or after-resume hook (which one its [`Origin`] says).
    Hook,
    /// Fleet mode: up, its calls made ready once its key's record names it, so that what they
    /// do is acknowledged only where the key's next owner would continue.
    Record,
    /// Nothing: what it awaited was answered, within the input that moves it on.
    Answered,
}

/// A drained managed sandbox on its way to its Stop: its before-hook, then the Stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stopping {
    /// Its way down ends suspended: decided when its drain ends (the policy, unless a failed
    /// before-suspend hook turned it into a shutdown; a lost instance always suspends).
    suspend: bool,
    /// How many of its Stops failed (each is ordered up to `WAY_DOWN_ATTEMPTS` times).
    failures: u8,
    awaits: Step,
}

/// What a stopping sandbox waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Step {
    /// Its before-stop or before-suspend hook (which one `suspend` says).
    Hook,
    /// The answer to its Stop.
    Stop,
    /// Nothing: the hook or the Stop was answered, within the input that moves it on.
    Answered,
}

/// A stopped sandbox whose Persist is ordered (or about to be).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Persisting {
    suspend: bool,
    /// The snapshot its Stop returned.
    snapshot: Option<Snapshot>,
    /// How many of its Persists failed (counted afresh after its Stop succeeded).
    failures: u8,
    /// Whether the answer to a Persist is awaited (not yet ordered, or just answered, otherwise).
    awaited: bool,
}

/// What follows once a persisted sandbox's key record no longer names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Then {
    /// Its Shutdown.
    Shutdown,
    /// It stays suspended, for the key's next start to take its workspace.
    Suspend,
    /// Its way down was given up: left to the backend as it is, the snapshot salvaged.
    LeaveAsItIs(Snapshot),
}

/// A sandbox's last command, its one Shutdown (or, fleet mode, its Relinquish).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Last {
    /// Its answer is awaited.
    Awaited,
    /// Answered (or unanswered in time); a Relinquish awaits no answer.
    Done,
}

/// Where a sandbox's workspace came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Origin {
    /// A fresh Start, or an external sandbox.
    Fresh,
    /// Its Start resumed the key's snapshot `snapshot`, persisted by `by` (its hook on the way
    /// up is then the after-resume one; a Start that fails gives the snapshot back to its key).
    Resumed { snapshot: Snapshot, by: SandboxId },
    /// Fleet mode: adopted from the key's last owner (its Start is an Adopt), of which
    /// `unanswered` went unanswered in time. Each is ordered again, up to `WAY_DOWN_ATTEMPTS`
    /// in all (`ownership.rs`): the sandbox holds its key's history, and a late answer (this
    /// process paused) is no reason to lose it.
    Adopted { unanswered: u8 },
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
    state: State,
    origin: Origin,
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
    /// Fleet mode: the token its key was owned under when it was started or adopted, which
    /// every command changing it carries.
    pub(crate) token: Option<Token>,
    /// The backend lost its running instance while it was up, its workspace intact: it goes
    /// down as a suspension at its last release (or at once, without calls), with no drain
    /// and no before-hook, and no call binds to it again (`death.rs`). A fact about the
    /// backend's instance, not a state: it stays true on the way down and after.
    pub(crate) instance_lost: bool,
    /// The way down the last release of a call ready in it asked for
    /// ([`Lifecycle::release_as`]); `None`: the release policy's. Read when it goes down.
    pub(crate) asked: Option<WayDown>,
}

impl Sandbox {
    fn new(id: SandboxId, key: KeyIx, owner: Ownership, state: State, origin: Origin) -> Self {
        Sandbox {
            id,
            key,
            owner,
            state,
            origin,
            bound: SmallSet::Empty,
            uploads: SmallSet::Empty,
            targeting: SmallSet::Empty,
            busy_sessions: 0,
            operations: 0,
            deadline: None,
            token: None,
            instance_lost: false,
            asked: None,
        }
    }

    pub(crate) fn is_managed(&self) -> bool {
        self.owner == Ownership::Managed
    }

    // ------------------------------------------------------------------------------------------
    // Views

    /// Its state, as the public API names it.
    #[inline(always)]
    pub(crate) fn state(&self) -> SandboxState {
        match self.state {
            State::Starting(_) => SandboxState::Starting,
            State::Running => SandboxState::Running,
            State::Idle => SandboxState::Idle,
            State::Draining => SandboxState::Draining,
            State::HandingOver => SandboxState::HandingOver,
            State::Stopping(_) => SandboxState::Stopping,
            State::Persisting(_) => SandboxState::Persisting,
            State::Persisted(_) => SandboxState::Persisted,
            State::ShuttingDown(_) => SandboxState::ShuttingDown,
            State::Dead(_) => SandboxState::Dead,
        }
    }

    /// Which answer it waits for.
    #[inline(always)]
    pub(crate) fn awaiting(&self) -> Awaiting {
        match &self.state {
            State::Starting(Rising::Start) => Awaiting::Start,
            State::Starting(Rising::Hook)
            | State::Stopping(Stopping {
                awaits: Step::Hook, ..
            }) => Awaiting::Hook,
            State::Starting(Rising::Record) | State::Persisted(_) => Awaiting::Record,
            State::Stopping(Stopping {
                awaits: Step::Stop, ..
            }) => Awaiting::Stop,
            State::Persisting(Persisting { awaited: true, .. }) => Awaiting::Persist,
            State::ShuttingDown(Last::Awaited) | State::Dead(Some(Last::Awaited)) => {
                Awaiting::Shutdown
            }
            _ => Awaiting::Nothing,
        }
    }

    /// Whether its one Shutdown (or its Relinquish) was ordered.
    pub(crate) fn shutdown_ordered(&self) -> bool {
        matches!(self.state, State::ShuttingDown(_) | State::Dead(Some(_)))
    }

    /// Whether uploads (and the application's work) may go into it: it is up, no Stop,
    /// Shutdown or death came, and its running instance was not lost.
    #[inline(always)]
    pub(crate) fn accepts_uploads(&self) -> bool {
        self.state().accepts_uploads() && !self.instance_lost
    }

    /// The hook it awaits, if any: on the way up after its start or resume, on the way down
    /// before its suspension or stop.
    pub(crate) fn hook(&self) -> Option<HookPoint> {
        match self.state {
            State::Starting(Rising::Hook) => Some(self.after_hook()),
            State::Stopping(Stopping {
                awaits: Step::Hook,
                suspend,
                ..
            }) => Some(before_hook(suspend)),
            _ => None,
        }
    }

    /// The hook that runs after its start: after-resume when it resumed a snapshot.
    pub(crate) fn after_hook(&self) -> HookPoint {
        match self.origin {
            Origin::Resumed { .. } => HookPoint::AfterResume,
            _ => HookPoint::AfterStart,
        }
    }

    /// Whether its way down ends suspended (false before its drain ends).
    pub(crate) fn suspends(&self) -> bool {
        match &self.state {
            State::Stopping(Stopping { suspend, .. })
            | State::Persisting(Persisting { suspend, .. }) => *suspend,
            State::Persisted(then) => *then == Then::Suspend,
            _ => false,
        }
    }

    /// The snapshot its Stop returned, while it persists it.
    pub(crate) fn snapshot(&self) -> Option<&Snapshot> {
        match &self.state {
            State::Persisting(Persisting { snapshot, .. }) => snapshot.as_ref(),
            _ => None,
        }
    }

    /// The key's snapshot its Start resumed and the sandbox that persisted it, if it resumed
    /// one.
    pub(crate) fn resumed(&self) -> Option<(&Snapshot, SandboxId)> {
        match &self.origin {
            Origin::Resumed { snapshot, by } => Some((snapshot, *by)),
            _ => None,
        }
    }

    /// Fleet mode: whether it was adopted from the key's last owner.
    pub(crate) fn is_adopted(&self) -> bool {
        matches!(self.origin, Origin::Adopted { .. })
    }

    /// Fleet mode: whether it is up and its calls wait for its key's record to name it.
    pub(crate) fn awaits_record_to_rise(&self) -> bool {
        self.state == State::Starting(Rising::Record)
    }

    // ------------------------------------------------------------------------------------------
    // Transitions

    /// What it awaited was answered, or is awaited no longer: it awaits nothing and stays where
    /// it is (a persisted sandbox always awaits its record: its caller moves it on). What it
    /// awaited.
    #[inline(always)]
    pub(crate) fn answered(&mut self) -> Awaiting {
        let awaited = self.awaiting();
        match &mut self.state {
            State::Starting(rising) => *rising = Rising::Answered,
            State::Stopping(stopping) => stopping.awaits = Step::Answered,
            State::Persisting(persisting) => persisting.awaited = false,
            State::ShuttingDown(last) | State::Dead(Some(last)) => *last = Last::Done,
            _ => {}
        }
        awaited
    }

    /// Its Start or hook answered: it awaits its key's record before it comes up.
    pub(crate) fn await_record(&mut self) {
        debug_assert_eq!(self.state, State::Starting(Rising::Answered));
        self.state = State::Starting(Rising::Record);
    }

    /// A hook is ordered: after its start, or before its Stop. Which one.
    pub(crate) fn await_hook(&mut self) -> HookPoint {
        match &mut self.state {
            State::Starting(rising @ Rising::Answered) => *rising = Rising::Hook,
            State::Stopping(stopping) if stopping.awaits == Step::Answered => {
                stopping.awaits = Step::Hook
            }
            other => unreachable!("a hook ordered in {other:?}"),
        }
        self.hook().expect("just ordered")
    }

    /// Its failed before-suspend hook turns its suspension into a shutdown.
    pub(crate) fn suspend_no_more(&mut self) {
        let State::Stopping(stopping) = &mut self.state else {
            unreachable!("a before-hook ends in {:?}", self.state)
        };
        stopping.suspend = false;
    }

    /// Up (its Start and hook passed, or warm or draining and bound again): running.
    #[inline(always)]
    pub(crate) fn run(&mut self) {
        debug_assert!(
            matches!(
                self.state,
                State::Starting(Rising::Answered) | State::Idle | State::Draining
            ),
            "run from {:?}",
            self.state
        );
        self.state = State::Running;
    }

    /// Without calls, kept warm (or warm again: its hand-over failed).
    pub(crate) fn idle(&mut self) {
        debug_assert!(matches!(self.state, State::Running | State::HandingOver));
        self.state = State::Idle;
    }

    /// Without calls, it drains.
    #[inline(always)]
    pub(crate) fn drain(&mut self) {
        debug_assert!(matches!(self.state, State::Running | State::Idle));
        self.state = State::Draining;
    }

    /// Fleet mode: drained, handed over warm to its key's next owner.
    pub(crate) fn hand_over(&mut self) {
        debug_assert_eq!(self.state, State::Draining);
        self.state = State::HandingOver;
    }

    /// Drained (or, its instance lost, without calls): on its way to its Stop, to end
    /// suspended or not.
    pub(crate) fn stop(&mut self, suspend: bool) {
        debug_assert!(matches!(
            self.state,
            State::Running | State::Idle | State::Draining
        ));
        self.state = State::Stopping(Stopping {
            suspend,
            failures: 0,
            awaits: Step::Answered,
        });
    }

    /// Its Stop is ordered; whether it suspends.
    pub(crate) fn await_stop(&mut self) -> bool {
        let State::Stopping(stopping) = &mut self.state else {
            unreachable!("a Stop ordered in {:?}", self.state)
        };
        debug_assert_eq!(stopping.awaits, Step::Answered);
        stopping.awaits = Step::Stop;
        stopping.suspend
    }

    /// Its Stop or Persist failed (answered): how many have failed so far.
    pub(crate) fn way_down_failed(&mut self) -> u8 {
        self.answered();
        match &mut self.state {
            State::Stopping(Stopping { failures, .. })
            | State::Persisting(Persisting { failures, .. }) => {
                *failures += 1;
                *failures
            }
            other => unreachable!("a way down failed in {other:?}"),
        }
    }

    /// Its Stop succeeded with `snapshot` (answered): whether a Persist follows (a snapshot,
    /// or a suspension); else it stays stopping until its Shutdown.
    pub(crate) fn stopped(&mut self, snapshot: Option<Snapshot>) -> bool {
        let State::Stopping(Stopping { suspend, .. }) = self.state else {
            unreachable!("a Stop answered in {:?}", self.state)
        };
        if snapshot.is_none() && !suspend {
            return false;
        }
        self.state = State::Persisting(Persisting {
            suspend,
            snapshot,
            failures: 0,
            awaited: false,
        });
        true
    }

    /// Its Persist is ordered: the snapshot it persists, and whether it suspends.
    pub(crate) fn await_persist(&mut self) -> (Option<Snapshot>, bool) {
        let State::Persisting(persisting) = &mut self.state else {
            unreachable!("a Persist ordered in {:?}", self.state)
        };
        debug_assert!(!persisting.awaited);
        persisting.awaited = true;
        (persisting.snapshot.clone(), persisting.suspend)
    }

    /// Fleet mode: persisted (or, `given_up`, its Persist given up with the snapshot
    /// salvaged), it is held back until its key's record no longer names it.
    pub(crate) fn hold_for_record(&mut self, given_up: bool) {
        self.state = State::Persisted(self.after_persist(given_up));
    }

    /// What follows its Persist (done or, `given_up`, salvaged) once no record names it.
    pub(crate) fn after_persist(&self, given_up: bool) -> Then {
        match &self.state {
            State::Persisted(then) => then.clone(),
            State::Persisting(Persisting { snapshot, .. }) if given_up => {
                Then::LeaveAsItIs(snapshot.clone().expect("a salvaged snapshot"))
            }
            State::Persisting(Persisting { suspend: true, .. }) => Then::Suspend,
            State::Persisting(_) => Then::Shutdown,
            other => unreachable!("persisted in {other:?}"),
        }
    }

    /// Its one Shutdown is ordered (a dead sandbox stays dead).
    pub(crate) fn await_shutdown(&mut self) {
        debug_assert!(!self.shutdown_ordered(), "shutdown ordered twice");
        self.state = match self.state {
            State::Dead(_) => State::Dead(Some(Last::Awaited)),
            _ => State::ShuttingDown(Last::Awaited),
        };
    }

    /// Fleet mode: relinquished, its last command (which awaits no answer).
    pub(crate) fn relinquished(&mut self) {
        self.state = State::Dead(Some(Last::Done));
    }

    /// Its way down ended with the backend keeping it (suspended, or left as it is), or,
    /// external, it was unbound: done with, no Shutdown.
    pub(crate) fn kept_by_the_backend(&mut self) {
        debug_assert!(!self.shutdown_ordered());
        self.state = State::Dead(None);
    }

    /// The backend reported it gone: dead, a Shutdown already ordered still awaited. Nothing
    /// else may be awaited of it any more.
    pub(crate) fn died(&mut self) {
        debug_assert!(
            matches!(
                self.awaiting(),
                Awaiting::Nothing | Awaiting::Shutdown | Awaiting::Record
            ),
            "died awaiting {:?}",
            self.awaiting()
        );
        self.state = match self.state {
            State::ShuttingDown(last) => State::Dead(Some(last)),
            State::Dead(last) => State::Dead(last),
            _ => State::Dead(None),
        };
    }

    /// Fleet mode: an Adopt of it went unanswered in time: whether it is ordered again (fewer
    /// than `attempts` went unanswered so far).
    pub(crate) fn adopt_again(&mut self, attempts: u8) -> bool {
        let Origin::Adopted { unanswered } = &mut self.origin else {
            return false;
        };
        if *unanswered + 1 >= attempts {
            return false;
        }
        *unanswered += 1;
        true
    }

    /// Whether what it awaits fits where it is beyond what its state carries: it awaits
    /// something whenever it is starting or stopping (a transition's "answered" never outlasts
    /// the input), and a Shutdown only when managed (for the invariant check).
    pub(crate) fn awaits_agree(&self) -> bool {
        let settled = !matches!(
            self.state,
            State::Starting(Rising::Answered)
                | State::Stopping(Stopping {
                    awaits: Step::Answered,
                    ..
                })
                | State::Persisting(Persisting { awaited: false, .. })
        );
        settled && (!self.shutdown_ordered() || self.is_managed())
    }
}

/// The hook before a Stop: before-suspend when the way down ends suspended.
fn before_hook(suspend: bool) -> HookPoint {
    if suspend {
        HookPoint::BeforeSuspend
    } else {
        HookPoint::BeforeStop
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

    /// Tracks a new managed sandbox under the next id, its Start (resuming the key's snapshot
    /// `resumed`, persisted by the sandbox named with it, if any) awaited.
    pub(crate) fn start(
        &mut self,
        key: KeyIx,
        resumed: Option<(Snapshot, SandboxId)>,
    ) -> SandboxIx {
        let origin = match resumed {
            Some((snapshot, by)) => Origin::Resumed { snapshot, by },
            None => Origin::Fresh,
        };
        let state = State::Starting(Rising::Start);
        self.insert_next(key, Ownership::Managed, state, origin)
    }

    /// Tracks the application's sandbox `external` under the next id, running.
    pub(crate) fn bind_external(&mut self, key: KeyIx, external: ExternalId) -> SandboxIx {
        let owner = Ownership::External(external);
        self.insert_next(key, owner, State::Running, Origin::Fresh)
    }

    fn insert_next(
        &mut self,
        key: KeyIx,
        owner: Ownership,
        state: State,
        origin: Origin,
    ) -> SandboxIx {
        let id = SandboxId(self.next_id);
        self.next_id += 1;
        let ix = self
            .records
            .insert(Sandbox::new(id, key, owner, state, origin));
        self.by_id.insert(id, ix);
        ix
    }

    /// Tracks a sandbox handed over by another process, under the id its first owner gave it
    /// (fleet mode: adopted), its Adopt awaited. That may be this process, getting back a
    /// sandbox it handed over earlier: its Relinquish dropped every command outstanding on it
    /// unanswered (the drain contract), so no answer of the earlier tracking can reach the new
    /// one. `None` when that id is tracked already.
    pub(crate) fn adopt(&mut self, id: SandboxId, key: KeyIx) -> Option<SandboxIx> {
        if self.by_id.contains_key(id) {
            return None;
        }
        let ix = self.records.insert(Sandbox::new(
            id,
            key,
            Ownership::Managed,
            State::Starting(Rising::Start),
            Origin::Adopted { unanswered: 0 },
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
            .filter(|(_, sandbox)| pick(sandbox))
            .map(|(ix, sandbox)| (sandbox.id, ix))
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
                .all(|(id, ix)| self.records.get(ix).is_some_and(|sandbox| sandbox.id == id))
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
