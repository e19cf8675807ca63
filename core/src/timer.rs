//! The one timer table: every deadline the core keeps, ordered by instant.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    heap: BinaryHeap<Reverse<Entry>>,
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
    pub(crate) fn set(&mut self, at: Instant, timer: Timer) -> TimerRef {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Entry { at, seq, timer }));
        TimerRef { at, seq }
    }

    /// Cancels a timer: its owner forgets the reference and the entry is stale from now on.
    /// The entry leaves the heap at once only when it is the earliest one (a timer cancelled
    /// soon after it was set, the common case: a start or an upload answered in time), which
    /// spares the lifecycle's pruning a look at its owner; anywhere else it stays until it
    /// reaches the top. The sequence alone names an entry: no two share one. O(log n).
    #[inline]
    pub(crate) fn cancel(&mut self, timer: TimerRef) {
        if self
            .heap
            .peek()
            .is_some_and(|Reverse(e)| e.seq == timer.seq)
        {
            self.heap.pop();
        }
    }

    /// The earliest deadline in the heap (live once the lifecycle pruned stale entries after an input).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Removes and returns the earliest timer due at or before `now`, live or stale: the caller
    /// asks its owner.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(TimerRef, Timer)> {
        match self.heap.peek() {
            Some(Reverse(e)) if e.at <= now => {
                let Reverse(e) = self.heap.pop().expect("peeked");
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
        self.heap.peek().map(|Reverse(e)| {
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
        let entries = std::mem::take(&mut self.heap).into_vec();
        self.heap = entries
            .into_iter()
            .filter(|Reverse(e)| {
                live(
                    TimerRef {
                        at: e.at,
                        seq: e.seq,
                    },
                    &e.timer,
                )
            })
            .collect();
        self.rebuilt_at = self.heap.len();
    }

    /// Entries in the heap, live and stale.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The entries, in no particular order (for the invariant checks).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TimerRef, &Timer)> {
        self.heap.iter().map(|Reverse(e)| {
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

/// Serialises the heap as a list of entries in firing order, so a serialised state does not
/// depend on the heap's layout.
mod entries {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Entry;

    type Heap = BinaryHeap<Reverse<Entry>>;

    pub(super) fn serialize<S: Serializer>(heap: &Heap, s: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<&Entry> = heap.iter().map(|Reverse(e)| e).collect();
        entries.sort();
        entries.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Heap, D::Error> {
        let entries: Vec<Entry> = Vec::deserialize(d)?;
        Ok(entries.into_iter().map(Reverse).collect())
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
