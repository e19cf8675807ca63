//! Session records (ready calls, holds, pending releases, the mirror slots of its paths), their
//! table with the queue of idle records, and the session's derived bookkeeping, reconciled once
//! per input: which sandbox its busyness keeps draining, which releases completed, whether its
//! mirror settled, whether it is idle.
//!
//! A session outlives its calls: its record remembers the last version of each path, so a later
//! flush continues the numbering. Most records are idle, so a record keeps only that inline;
//! everything about live calls and work in progress sits in a box that exists only while there
//! is some (`Deref` reads an empty one when there is none). Boxes of records that went idle are
//! kept for the next records that go live ([`Spares`], a bounded few), so the commonest cycle,
//! a session going live and idle again, allocates nothing.

use crate::call::{CallIx, Calls};
use crate::command::SessionList;
use crate::event::Event;
use crate::lifecycle::Lifecycle;
use crate::map::Map;
use crate::mirror::{Mirror, Slot, SlotWork};
use crate::name::{CallId, PathName, SessionId};
use crate::sandbox::{SandboxIx, Sandboxes};
use crate::small_set::Few;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::ops::{Deref, DerefMut};

slotmap::new_key_type! {
    /// A session record's place in the session table. Records refer to sessions by it; a
    /// session's name is hashed once, where it comes in ([`Sessions::find`]).
    pub(crate) struct SessionIx;
}

/// A session record: its paths inline, the rest boxed while live.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Its name, as the application gave it.
    pub(crate) id: SessionId,
    /// One slot per path flushed, in the order first flushed. A boxed slice, not a `Vec`: most
    /// sessions have one path, and the spare capacity word would be paid by every idle record.
    pub(crate) paths: Box<[Slot]>,
    /// Its stamp in the idle queue, while idle. Non-zero, so the option costs no extra word:
    /// records are mostly idle and there can be a million of them.
    pub(crate) idle_stamp: Option<NonZeroU64>,
    live: Option<Box<Live>>,
}

/// The parts of a session record that matter only while something is live.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Live {
    /// Live calls bound to a sandbox, in the order they became ready.
    pub(crate) ready: Few<CallIx>,
    /// Live calls still waiting or starting: a sandbox is coming.
    pub(crate) coming: u32,
    /// The sandbox of the session's last released call, while it accepts uploads.
    pub(crate) linger: Option<SandboxIx>,
    /// Where its mirror goes now: the first ready call's sandbox that accepts uploads, else the
    /// linger sandbox.
    pub(crate) target: Option<SandboxIx>,
    /// The sandbox whose `busy_sessions` counts this session.
    pub(crate) busy_on: Option<SandboxIx>,
    pub(crate) holds: u32,
    /// Released calls whose release has not completed, with their sandbox.
    pub(crate) releasing: smallvec::SmallVec<[(CallId, SandboxIx); 1]>,
    /// Whether it had unsettled versions when last looked at (for `MirrorSettled`).
    pub(crate) unsettled: bool,
    /// Fleet mode: a call of it lost its key to a fence, or came while its key was not this
    /// process's. What the application writes for the session is stale until a call of it is
    /// ready again (another process may have continued it meanwhile, or may yet): its flushes
    /// are dropped at once (`fenced`), never uploaded over the owner's work once this process
    /// owns the key.
    pub(crate) stale: bool,
}

impl Live {
    /// The sandbox of its earliest ready call that accepts uploads: where its mirror goes, and
    /// what [`Lifecycle::resolve`] answers. The one statement of the rule (the linger sandbox
    /// comes after it, in [`Mirror::retarget`]).
    #[inline]
    pub(crate) fn first_up(&self, calls: &Calls, sandboxes: &Sandboxes) -> Option<SandboxIx> {
        self.ready
            .iter()
            .map(|call| calls[*call].sandbox().expect("a ready call is bound"))
            .find(|sandbox| sandboxes[*sandbox].accepts_uploads())
    }

    /// Whether nothing here is live (the paths' unsettled versions aside).
    fn is_idle(&self) -> bool {
        self.ready.is_empty()
            && self.coming == 0
            && self.holds == 0
            && self.target.is_none()
            && self.linger.is_none()
            && self.releasing.is_empty()
    }
}

static NOT_LIVE: Live = Live {
    stale: false,
    ready: Few::new_const(),
    coming: 0,
    linger: None,
    target: None,
    busy_on: None,
    holds: 0,
    releasing: smallvec::SmallVec::new_const(),
    unsettled: false,
};

impl Deref for Session {
    type Target = Live;

    fn deref(&self) -> &Live {
        self.live.as_deref().unwrap_or(&NOT_LIVE)
    }
}

impl DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Live {
        self.live.get_or_insert_with(Box::default)
    }
}

impl Session {
    /// A new record: no path, no live work.
    pub(crate) fn new(id: SessionId) -> Self {
        Session {
            id,
            paths: Box::default(),
            idle_stamp: None,
            live: None,
        }
    }

    /// Adds a slot for a path the session never flushed before (rare: a reallocation).
    pub(crate) fn add_path(&mut self, path: PathName) {
        // Exactly the room needed, so the boxed slice takes the allocation as it is.
        let mut paths = Vec::with_capacity(self.paths.len() + 1);
        paths.extend(std::mem::take(&mut self.paths).into_vec());
        paths.push(Slot::new(path));
        self.paths = paths.into_boxed_slice();
    }

    #[inline(always)]
    pub(crate) fn slot(&self, path: &PathName) -> Option<usize> {
        self.paths.iter().position(|s| &s.path == path)
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.paths.iter().any(|s| s.pending.is_some())
    }

    pub(crate) fn has_unsettled(&self) -> bool {
        self.paths
            .iter()
            .any(|s| s.pending.is_some() || s.inflight.is_some())
    }

    /// Whether this session must keep its target sandbox from finishing its drain.
    pub(crate) fn is_busy(&self) -> bool {
        self.holds > 0 || self.has_pending()
    }

    /// Whether nothing about it is live: the record only remembers versions.
    pub(crate) fn is_idle(&self) -> bool {
        self.live.as_deref().is_none_or(Live::is_idle) && !self.has_unsettled()
    }

    /// Whether some path has a version pending, and whether some path has one pending or in
    /// flight: one pass over the paths.
    fn pending_and_unsettled(&self) -> (bool, bool) {
        let (mut pending, mut unsettled) = (false, false);
        for work in self.paths.iter().filter_map(Slot::work) {
            pending |= work.pending.is_some();
            unsettled |= work.pending.is_some() || work.inflight.is_some();
        }
        (pending, unsettled)
    }

    /// Gives back the boxes of an idle record to `spares`, keeping only its versions.
    #[inline(always)]
    pub(crate) fn compact(&mut self, spares: &mut Spares) {
        debug_assert!(self.is_idle());
        if let Some(live) = self.live.take() {
            spares.lives.give(live);
        }
        for slot in &mut self.paths {
            if let Some(work) = slot.compact() {
                spares.works.give(work);
            }
        }
    }

    /// Makes the live box exist, taking a spare one when there is.
    fn revive(&mut self, spares: &mut Spares) {
        if self.live.is_none() {
            self.live = Some(spares.lives.take());
        }
    }
}

/// Boxes of compacted records kept for reuse, so that a session going live and idle again, the
/// commonest cycle there is, costs no allocation. At most [`SPARES`] of each kind are kept, so
/// the spares cost constant memory however many records there are.
#[derive(Clone, Debug, Default)]
pub(crate) struct Spares {
    lives: Spare<Live>,
    pub(crate) works: Spare<SlotWork>,
}

/// Spare boxes of one kind kept by [`Spares`].
pub(crate) const SPARES: usize = 64;

/// Empty boxes of one kind, at most [`SPARES`].
#[derive(Clone, Debug)]
pub(crate) struct Spare<T>(Vec<Box<T>>);

impl<T> Default for Spare<T> {
    fn default() -> Self {
        Spare(Vec::new())
    }
}

impl<T: Default> Spare<T> {
    /// A box holding `T::default()`: a spare one, else a new one.
    pub(crate) fn take(&mut self) -> Box<T> {
        self.0.pop().unwrap_or_default()
    }

    /// How many boxes are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Keeps `item`'s box for reuse (reset to `T::default()`), unless enough are kept.
    pub(crate) fn give(&mut self, mut item: Box<T>) {
        if self.0.len() < SPARES {
            *item = T::default();
            self.0.push(item);
        }
    }
}

/// Idle session records, oldest first, so the oldest can be forgotten past the limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct IdleSessions {
    pub(crate) queue: VecDeque<(SessionIx, NonZeroU64)>,
    pub(crate) count: usize,
    /// The last stamp given (stamps count from 1).
    pub(crate) last_stamp: u64,
}

/// Stale queue entries (of records that came back to life or were forgotten) below which the
/// idle queue is never compacted.
const IDLE_QUEUE_FLOOR: usize = 64;

impl IdleSessions {
    /// Whether the queue holds more than twice as many entries as there are idle records (past
    /// a floor), so that dropping its stale entries is due: amortised O(1) per record that went
    /// idle, and the queue stays within a constant factor of the idle records.
    pub(crate) fn compaction_due(&self) -> bool {
        self.queue.len() > 2 * self.count + IDLE_QUEUE_FLOOR
    }
}

/// The session records: a generational slab, the index from names to places, and the queue of
/// idle records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Sessions {
    records: slotmap::SlotMap<SessionIx, Session>,
    by_name: Map<SessionId, SessionIx>,
    pub(crate) idle: IdleSessions,
    /// Boxes of compacted records, for the next records that go live.
    #[serde(skip)]
    pub(crate) spares: Spares,
}

impl Sessions {
    /// The place of the record of `session`. The one hash of a session's name per input.
    #[inline(always)]
    pub(crate) fn find(&self, session: &SessionId) -> Option<SessionIx> {
        self.by_name.get(session).copied()
    }

    /// The record `found` by [`find`](Self::find) earlier in the same input (so the name is not
    /// hashed again), or a new one for `session` when none was: no longer idle either way.
    #[inline(always)]
    pub(crate) fn take_up(&mut self, found: Option<SessionIx>, session: &SessionId) -> SessionIx {
        debug_assert_eq!(found, self.find(session), "found in this very input");
        let ix = match found {
            Some(ix) => ix,
            None => {
                let ix = self.records.insert(Session::new(session.clone()));
                self.by_name.insert(session.clone(), ix);
                ix
            }
        };
        let s = &mut self.records[ix];
        if s.idle_stamp.take().is_some() {
            self.idle.count -= 1;
        }
        s.revive(&mut self.spares);
        ix
    }

    /// The record at `ix` and the spare boxes, borrowed together.
    pub(crate) fn with_spares(&mut self, ix: SessionIx) -> (&mut Session, &mut Spares) {
        (&mut self.records[ix], &mut self.spares)
    }

    /// The record at `ix`, if it is still kept.
    pub(crate) fn get(&self, ix: SessionIx) -> Option<&Session> {
        self.records.get(ix)
    }

    /// Forgets a record.
    pub(crate) fn remove(&mut self, ix: SessionIx) -> Session {
        let s = self.records.remove(ix).expect("a kept session record");
        self.by_name.remove(&s.id);
        s
    }

    /// Records kept, active and idle.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Records that are not idle.
    pub(crate) fn active(&self) -> usize {
        self.records.len() - self.idle.count
    }

    /// Every record, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SessionIx, &Session)> {
        self.records.iter()
    }

    /// Whether the name index and the records agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_name.len() == self.records.len()
            && self
                .by_name
                .iter()
                .all(|(name, ix)| self.records.get(*ix).is_some_and(|s| &s.id == name))
    }

    /// Forgets every record (close finished).
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.by_name.clear();
        self.idle = IdleSessions::default();
    }

    /// `sessions` sorted by name: the order in which several sessions reach an output.
    pub(crate) fn by_name_order(&self, mut sessions: Few<SessionIx>) -> Few<SessionIx> {
        sessions.sort_by(|a, b| self[*a].id.cmp(&self[*b].id));
        sessions
    }

    /// Forgets the oldest idle records beyond `max`, and compacts the idle queue. Returns how
    /// many were forgotten.
    pub(crate) fn forget_idle(&mut self, max: usize) -> u64 {
        let mut forgotten = 0;
        while self.idle.count > max {
            let Some((session, stamp)) = self.idle.queue.pop_front() else {
                break;
            };
            if self
                .get(session)
                .is_some_and(|s| s.idle_stamp == Some(stamp))
            {
                let s = self.remove(session);
                tracing::debug!(session = %s.id, "idle session forgotten");
                self.idle.count -= 1;
                forgotten += 1;
            }
        }
        if self.idle.compaction_due() {
            let mut queue = std::mem::take(&mut self.idle.queue);
            queue.retain(|(session, stamp)| {
                self.get(*session)
                    .is_some_and(|s| s.idle_stamp == Some(*stamp))
            });
            self.idle.queue = queue;
        }
        forgotten
    }

    /// The names of `sessions`, sorted.
    pub(crate) fn names(&self, sessions: &[SessionIx]) -> SessionList {
        if let [one] = sessions {
            // The usual drain: one session, no collecting or sorting.
            return SessionList(smallvec::smallvec![self[*one].id.clone()]);
        }
        let mut names: SessionList = sessions.iter().map(|s| self[*s].id.clone()).collect();
        names.0.sort_unstable();
        names
    }
}

impl std::ops::Index<SessionIx> for Sessions {
    type Output = Session;

    fn index(&self, ix: SessionIx) -> &Session {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<SessionIx> for Sessions {
    fn index_mut(&mut self, ix: SessionIx) -> &mut Session {
        &mut self.records[ix]
    }
}

impl Session {
    /// Whether the session has a live call or a sandbox its mirror can still go to.
    pub(crate) fn is_live(&self) -> bool {
        !self.ready.is_empty() || self.coming > 0 || self.target.is_some()
    }
}

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Internals: a session's derived bookkeeping

    /// Notes that the session changed: its derived bookkeeping is brought up to date once, when
    /// the input is done ([`Lifecycle::finish_input`]), however often it changed.
    pub(crate) fn session_changed(&mut self, session: SessionIx) {
        self.reconcile.session(session);
    }
}

impl Mirror<'_> {
    /// Brings a session's derived bookkeeping up to date: which sandbox its busyness keeps
    /// draining, which releases have completed, whether its mirror settled, whether it is idle.
    /// Runs once per changed session per input, from [`Lifecycle::finish_input`].
    #[inline(always)]
    pub(crate) fn reconcile_session(&mut self, session: SessionIx) {
        if self.sessions.get(session).is_none() {
            return;
        }
        let (s, spares) = self.sessions.with_spares(session);
        let (pending, unsettled) = s.pending_and_unsettled();
        // The live part is looked at once, not through `Deref` field by field. A record with no
        // live part is neither busy nor releasing, and was settled when last looked at.
        // One with unsettled versions gets its live part (`revive` keeps one that exists).
        if unsettled {
            s.revive(spares);
        }
        let idle = match s.live.as_deref_mut() {
            None => true,
            Some(live) => {
                let busy = live.holds > 0 || pending;
                let busy_on = if busy { live.target } else { None };
                if busy_on != live.busy_on {
                    if let Some(old) = live.busy_on {
                        if let Some(old_sandbox) = self.sandboxes.get_mut(old) {
                            old_sandbox.busy_sessions -= 1;
                        }
                        self.reconcile.sandbox(old);
                    }
                    if let Some(new) = busy_on {
                        self.sandboxes.get_mut(new).expect("target").busy_sessions += 1;
                    }
                    live.busy_on = busy_on;
                }
                if !live.releasing.is_empty() {
                    let uploads = &self.uploads;
                    let events = &mut self.out.events;
                    let paths = &s.paths;
                    let releasing = std::mem::take(&mut live.releasing);
                    for (call, sandbox) in releasing {
                        let in_flight = paths
                            .iter()
                            .any(|p| p.inflight.is_some_and(|u| uploads[u].sandbox == sandbox));
                        if busy_on != Some(sandbox) && !in_flight {
                            tracing::debug!(call = %call, "release completed");
                            events.push_back(Event::CallReleased { call });
                        } else {
                            live.releasing.push((call, sandbox));
                        }
                    }
                }
                if live.unsettled && !unsettled {
                    self.out.events.push_back(Event::MirrorSettled {
                        session: s.id.clone(),
                    });
                }
                live.unsettled = unsettled;
                live.is_idle()
            }
        };
        let idle = idle && !unsettled;
        // An idle record comes back to life only through `Sessions::take_up` (a call or
        // a flush for it), which takes its stamp: a live record here has none.
        debug_assert!(idle || s.idle_stamp.is_none(), "a live record stamped idle");
        if idle && s.idle_stamp.is_none() {
            s.compact(spares);
            let idle = &mut self.sessions.idle;
            idle.last_stamp += 1;
            let stamp = NonZeroU64::new(idle.last_stamp).expect("stamps count from 1");
            idle.queue.push_back((session, stamp));
            idle.count += 1;
            self.sessions[session].idle_stamp = Some(stamp);
            // On the sessions alone: the mirror's view stays in registers (a call taking the
            // view would set it up in memory for every reconciliation).
            let max = self.config.limits.max_idle_sessions;
            self.out.stats.sessions_forgotten += self.sessions.forget_idle(max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record going idle gives its live box back, and the next record going live takes it
    /// instead of allocating one.
    #[test]
    fn a_record_going_live_takes_a_spare_box() {
        let mut sessions = Sessions::default();
        let id = SessionId::new("s").unwrap();
        let ix = sessions.take_up(None, &id);
        let (s, spares) = sessions.with_spares(ix);
        s.compact(spares);
        assert_eq!(sessions.spares.lives.len(), 1);
        let found = sessions.find(&id);
        sessions.take_up(found, &id);
        assert_eq!(sessions.spares.lives.len(), 0, "the spare box was taken");
    }

    /// Spare boxes come back reset, and no more than `SPARES` are kept.
    #[test]
    fn spare_boxes_are_reset_and_bounded() {
        let mut spare = Spare::<Live>::default();
        for _ in 0..SPARES + 3 {
            spare.give(Box::new(Live {
                holds: 7,
                ..Live::default()
            }));
        }
        assert_eq!(spare.0.len(), SPARES);
        let live = spare.take();
        assert_eq!(live.holds, 0, "a spare box holds a fresh value");
        assert_eq!(spare.0.len(), SPARES - 1);
    }

    /// The idle queue is compacted exactly when it holds more than twice the idle records plus
    /// the floor.
    #[test]
    fn idle_queue_compaction_is_due_past_twice_the_idle_records() {
        let stamp = NonZeroU64::new(1).expect("non-zero");
        let mut idle = IdleSessions {
            count: 10,
            ..IdleSessions::default()
        };
        let bound = 2 * 10 + IDLE_QUEUE_FLOOR;
        for _ in 0..bound {
            idle.queue.push_back((SessionIx::default(), stamp));
        }
        assert!(!idle.compaction_due(), "at the bound");
        idle.queue.push_back((SessionIx::default(), stamp));
        assert!(idle.compaction_due(), "past the bound");
        idle.count += 1;
        assert!(
            !idle.compaction_due(),
            "one more idle record raises the bound by two"
        );
    }
}
