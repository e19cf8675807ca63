//! The one timer table: every deadline the core keeps, ordered by instant.

use serde::{Deserialize, Serialize};

use crate::call::CallIx;
use crate::key::KeyIx;
use crate::sandbox::SandboxIx;
use crate::session::SessionIx;
use crate::time::Instant;
use crate::upload::UploadIx;

/// What a deadline is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Timer {
    /// The sandbox's current state has a deadline: Starting (start timeout), Idle (warm idle
    /// timeout), Draining (drain deadline), Stopping, Persisting or ShuttingDown (command
    /// timeout). One per sandbox: a state change replaces it.
    Sandbox(SandboxIx),
    /// An upload attempt's timeout.
    Upload(UploadIx),
    /// A retry of a (session, path) after a transient upload failure.
    Retry(SessionIx, usize),
    /// A queued call's wait timeout.
    Wait(CallIx),
    /// The end of a key's snapshot retention.
    Retain(KeyIx),
    /// The close deadline, then the second (grace) deadline.
    Close,
    /// Fleet mode: a key's claim or release deadline, or its next try.
    KeyStore(KeyIx),
    /// Fleet mode: the next renewal of this process's lease.
    Renew,
    /// Fleet mode: the end of this process's lease by the core's clock.
    Lapse,
}

/// A set timer, as its owner remembers it in order to cancel it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct TimerRef {
    /// When it is due.
    pub(crate) at: Instant,
    /// The order it was set in, which breaks ties between equal instants.
    seq: u64,
}

impl TimerRef {
    /// A reference to no timer, for a state that is about to be replaced.
    pub(crate) const UNSET: TimerRef = TimerRef {
        at: Instant::MAX,
        seq: u64::MAX,
    };
}

/// Deadlines ordered by (instant, order of setting): the order in which due timers fire is a
/// pure function of the inputs. Whoever sets a timer keeps its [`TimerRef`]; the timer is live
/// exactly while its owner still holds that reference.
///
/// A binary heap with lazy deletion: cancelling is forgetting the reference, and an entry whose
/// owner no longer holds it is *stale* (one cancelled while it is the earliest entry leaves at
/// once, see [`Timers::cancel`]). The lifecycle drops stale entries when they reach the top (after every input, so [`Timers::next`] is always a live deadline)
/// and rebuilds the heap from its live entries whenever it has doubled since the last rebuild,
/// so stale entries never outnumber live ones by more than a constant factor.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Timers {
    #[serde(with = "entries")]
    heap: Heap,
    next_seq: u64,
    /// The heap's size after the last rebuild: the next rebuild comes at twice this (plus a
    /// floor).
    rebuilt_at: usize,
}

/// One heap entry, ordered by (instant, sequence): the sequence is unique, so the timer itself
/// never takes part in a comparison.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Entry {
    at: Instant,
    seq: u64,
    timer: Timer,
}

/// Entries past which the heap is never rebuilt (small heaps are cheap to keep as they are).
const REBUILD_FLOOR: usize = 64;

impl Timers {
    /// Sets `timer` at `at`. O(log n).
    #[inline]
    pub(crate) fn set(&mut self, at: Instant, timer: Timer) -> TimerRef {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { at, seq, timer });
        TimerRef { at, seq }
    }

    /// Cancels a timer: its owner forgets the reference and the entry is stale from now on.
    /// The entry leaves the heap at once only when it is the earliest one (a timer cancelled
    /// soon after it was set, the common case: a start or an upload answered in time), which
    /// spares the lifecycle's pruning a look at its owner; anywhere else it stays until it
    /// reaches the top. The sequence alone names an entry: no two share one. O(log n).
    #[inline]
    pub(crate) fn cancel(&mut self, timer: TimerRef) {
        if self.heap.peek().is_some_and(|e| e.seq == timer.seq) {
            self.heap.pop();
        }
    }

    /// The earliest deadline in the heap (live once the lifecycle pruned stale entries after an input).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.at)
    }

    /// Removes and returns the earliest timer due at or before `now`, live or stale: the caller
    /// asks its owner.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(TimerRef, Timer)> {
        match self.heap.peek() {
            Some(e) if e.at <= now => {
                let e = self.heap.pop().expect("peeked");
                Some((
                    TimerRef {
                        at: e.at,
                        seq: e.seq,
                    },
                    e.timer,
                ))
            }
            _ => None,
        }
    }

    /// The earliest entry, live or stale: the caller asks its owner, and pops it with
    /// [`Timers::pop_stale`] when stale (after every input, so [`Timers::next`] is always a
    /// live deadline).
    pub(crate) fn peek(&self) -> Option<(TimerRef, Timer)> {
        self.heap.peek().map(|e| {
            (
                TimerRef {
                    at: e.at,
                    seq: e.seq,
                },
                e.timer,
            )
        })
    }

    /// Drops the earliest entry, which [`Timers::peek`] showed stale.
    pub(crate) fn pop_stale(&mut self) {
        self.heap.pop();
    }

    /// Whether the heap has grown to twice its size at the last rebuild (past a floor), so
    /// that [`Timers::rebuild`] is due. Checked after every input: rebuilding then keeps stale
    /// entries from outnumbering live ones by more than a constant factor, amortised O(1) per
    /// timer set.
    pub(crate) fn rebuild_due(&self) -> bool {
        self.heap.len() > REBUILD_FLOOR.max(2 * self.rebuilt_at)
    }

    /// Rebuilds the heap from the entries whose owner still holds them (`live`).
    pub(crate) fn rebuild(&mut self, live: impl Fn(TimerRef, &Timer) -> bool) {
        self.heap.retain(|e| {
            live(
                TimerRef {
                    at: e.at,
                    seq: e.seq,
                },
                &e.timer,
            )
        });
        self.rebuilt_at = self.heap.len();
    }

    /// Entries in the heap, live and stale.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The entries, in no particular order (for the invariant checks).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TimerRef, &Timer)> {
        self.heap.iter().map(|e| {
            (
                TimerRef {
                    at: e.at,
                    seq: e.seq,
                },
                &e.timer,
            )
        })
    }
}

/// The entries as a binary min-heap on (instant, sequence) in a vector.
///
/// Written here rather than `BinaryHeap<Reverse<Entry>>` for the common sizes: the table
/// usually holds no entry, one or two (a start or an upload answered in time), and std's heap
/// goes through its general sift on every push and pop of those; here a push onto an empty heap
/// and the pop of its only entry are a vector's push and pop. Ordered by (instant, sequence)
/// only: the sequence is unique.
#[derive(Clone, Debug, Default)]
struct Heap(Vec<Entry>);

impl Heap {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn peek(&self) -> Option<&Entry> {
        self.0.first()
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.0.iter()
    }

    /// Whether the entry at `a` fires before the one at `b`.
    #[inline]
    fn before(&self, a: usize, b: usize) -> bool {
        let (a, b) = (&self.0[a], &self.0[b]);
        (a.at, a.seq) < (b.at, b.seq)
    }

    #[inline]
    fn push(&mut self, entry: Entry) {
        self.0.push(entry);
        let mut i = self.0.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.before(i, parent) {
                break;
            }
            self.0.swap(i, parent);
            i = parent;
        }
    }

    #[inline]
    fn pop(&mut self) -> Option<Entry> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.0[0], last);
        self.sift_down(0);
        Some(top)
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.0.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.before(right, left) {
                right
            } else {
                left
            };
            if !self.before(child, i) {
                break;
            }
            self.0.swap(i, child);
            i = child;
        }
    }

    /// Keeps the entries for which `keep` holds, and restores the heap order. O(n).
    fn retain(&mut self, keep: impl FnMut(&Entry) -> bool) {
        self.0.retain(keep);
        for i in (0..self.0.len() / 2).rev() {
            self.sift_down(i);
        }
    }
}

/// Serialises the heap as a list of entries in firing order, so a serialised state does not
/// depend on the heap's layout.
mod entries {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Entry, Heap};

    pub(super) fn serialize<S: Serializer>(heap: &Heap, s: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<&Entry> = heap.iter().collect();
        entries.sort();
        entries.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Heap, D::Error> {
        let entries: Vec<Entry> = Vec::deserialize(d)?;
        let mut heap = Heap(entries);
        heap.retain(|_| true);
        Ok(heap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_n(timers: &mut Timers, n: usize) {
        for _ in 0..n {
            timers.set(Instant::ZERO, Timer::Close);
        }
    }

    /// Rebuilds come exactly when the heap has outgrown twice its size at the last rebuild (and
    /// the floor): often enough to bound the stale entries, rarely enough to stay amortised
    /// O(1) per timer set.
    #[test]
    fn a_rebuild_is_due_when_the_heap_doubled_past_the_floor() {
        let mut timers = Timers::default();
        set_n(&mut timers, REBUILD_FLOOR);
        assert!(!timers.rebuild_due(), "at the floor");
        set_n(&mut timers, 1);
        assert!(timers.rebuild_due(), "past the floor");
        // Every entry live: the rebuild keeps them all, and the next one is due at twice that.
        timers.rebuild(|_, _| true);
        assert_eq!(timers.len(), REBUILD_FLOOR + 1);
        set_n(&mut timers, REBUILD_FLOOR + 1);
        assert!(
            !timers.rebuild_due(),
            "at twice the size of the last rebuild"
        );
        set_n(&mut timers, 1);
        assert!(
            timers.rebuild_due(),
            "past twice the size of the last rebuild"
        );
        // Stale entries go: the odd ones are live.
        timers.rebuild(|at, _| at.seq % 2 == 1);
        assert_eq!(timers.len(), REBUILD_FLOOR + 1);
    }

    proptest::proptest! {
        /// The heap against a sorted list: any mix of sets, cancels, due pops and rebuilds
        /// gives the same entries in the same (instant, sequence) order.
        #[test]
        fn the_heap_fires_as_a_sorted_list_would(
            ops in proptest::collection::vec((0u8..4, 0u64..6), 0..200),
        ) {
            let mut timers = Timers::default();
            let mut model: Vec<(Instant, TimerRef)> = Vec::new();
            let mut live: Vec<TimerRef> = Vec::new();
            let at = |n: u64| Instant::ZERO + std::time::Duration::from_secs(n);
            for (op, n) in ops {
                match op {
                    0 | 1 => {
                        let r = timers.set(at(n), Timer::Close);
                        model.push((r.at, r));
                        live.push(r);
                    }
                    2 => {
                        // Cancel one (lazily: it stays in the model until it would fire).
                        if !live.is_empty() {
                            let r = live.remove(n as usize % live.len());
                            timers.cancel(r);
                            if model.iter().min_by_key(|(a, r)| (*a, r.seq)).map(|(_, r)| r.seq) == Some(r.seq) {
                                model.retain(|(_, m)| m.seq != r.seq);
                            }
                        }
                    }
                    _ => {
                        let now = at(n);
                        model.sort_by_key(|(a, r)| (*a, r.seq));
                        let due: Vec<TimerRef> = model.iter().filter(|(a, _)| *a <= now).map(|(_, r)| *r).collect();
                        model.retain(|(a, _)| *a > now);
                        let fired: Vec<TimerRef> =
                            std::iter::from_fn(|| timers.pop_due(now).map(|(r, _)| r)).collect();
                        proptest::prop_assert_eq!(fired, due);
                        live.retain(|r| r.at > now);
                        if n % 2 == 0 {
                            let keep: Vec<u64> = live.iter().map(|r| r.seq).collect();
                            timers.rebuild(|r, _| keep.contains(&r.seq));
                            model.retain(|(_, r)| keep.contains(&r.seq));
                        }
                    }
                }
                model.sort_by_key(|(a, r)| (*a, r.seq));
                proptest::prop_assert_eq!(timers.len(), model.len());
                proptest::prop_assert_eq!(timers.next(), model.first().map(|(a, _)| *a));
            }
        }
    }

    /// Entries come out by instant, then in the order they were set.
    #[test]
    fn timers_fire_by_instant_then_by_order_of_setting() {
        let mut timers = Timers::default();
        let late = Instant::ZERO + std::time::Duration::from_secs(2);
        let early = Instant::ZERO + std::time::Duration::from_secs(1);
        let a = timers.set(late, Timer::Close);
        let b = timers.set(early, Timer::Close);
        let c = timers.set(early, Timer::Close);
        assert_eq!(timers.next(), Some(early));
        let fired: Vec<TimerRef> =
            std::iter::from_fn(|| timers.pop_due(late).map(|(r, _)| r)).collect();
        assert_eq!(fired, vec![b, c, a]);
        assert_eq!(timers.pop_due(late), None);
    }
}
