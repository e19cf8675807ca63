//! The invariants (`docs/design.md`, numbered 1–9) that can be read off the core's state: one
//! check per table (calls, sandboxes, keys, sessions and the mirror, timers), each in its own
//! file, run in one pass.
//!
//! The core `debug_assert`s them after every input while it is small; the simulator calls
//! [`Lifecycle::check_invariants`] after every step, and checks the invariants about histories
//! (no command after Shutdown, versions settle once, ...) on the commands and events it drains.

use crate::close::CloseState;
use crate::key::KeyIx;
use crate::lifecycle::Lifecycle;
use crate::session::SessionIx;
use smallvec::SmallVec;
use std::fmt;

/// A broken invariant: which one, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {} broken: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for Violation {}

macro_rules! ensure {
    ($cond:expr, $name:literal, $($detail:tt)+) => {
        if !$cond {
            return Err(Violation {
                invariant: $name,
                detail: format!($($detail)+),
            });
        }
    };
}

mod calls;
mod keys;
mod sandboxes;
mod sessions;
mod timers;

/// What one table's check counts for another's: the deadlines records keep, the calls bound
/// under each key, the calls coming to each session.
#[derive(Default)]
struct Seen {
    timers: usize,
    bound_by_key: Tally<KeyIx>,
    coming_by_session: Tally<SessionIx>,
}

impl Lifecycle {
    /// Checks every state invariant in one pass over the state. O(n log n): for tests and the
    /// simulator, not for a hot path.
    ///
    /// Names: `bound-calls` (a sandbox's calls are exactly the calls bound to it, in a state
    /// that can hold calls), `key-counts` (a key's bound count, current and retiring sandboxes),
    /// `serialize` (never two live calls on one key under `Serialize`), `session-calls` (a
    /// session's ready list and coming count), `session-target` (a session's mirror goes to its
    /// own first up sandbox or its linger sandbox, and the sandbox lists it), `busy-count`,
    /// `uploads` (in flight only into sandboxes that accept uploads, one per path),
    /// `shutdown-once`, `timers` (every deadline is live in the table, nothing else is, and the
    /// table's next deadline is a live one),
    /// `key-forgotten` (a key record is kept only while it has a sandbox, a call, a waiter or a
    /// snapshot), `retention` (a key's snapshot has its retention timer exactly when the policy
    /// retains, and no starting sandbox of the key leaves it a snapshot: the start took it),
    /// `idle-count`, `closed` (nothing left after close), `call-index`, `session-index`,
    /// `key-index`, `sandbox-index` and `upload-index` (each index finds every record of its table and nothing
    /// else).
    pub fn check_invariants(&self) -> Result<(), Violation> {
        if let CloseState::Closed = self.close {
            ensure!(
                self.timers.len() == 0
                    && self.calls.is_empty()
                    && self.sandboxes.is_empty()
                    && self.uploads.is_empty()
                    && self.keys.len() == 0
                    && self.sessions.len() == 0,
                "closed",
                "state left after close: {} timers, {} calls, {} sandboxes, {} uploads, {} keys, \
                 {} session records",
                self.timers.len(),
                self.calls.len(),
                self.sandboxes.len(),
                self.uploads.len(),
                self.keys.len(),
                self.sessions.len()
            );
            return Ok(());
        }
        let mut seen = Seen::default();
        self.check_calls(&mut seen)?;
        self.check_sandboxes(&mut seen)?;
        self.check_keys(&mut seen)?;
        self.check_sessions(&mut seen)?;
        self.check_timers(seen.timers)
    }
}

/// Records counted by what they name (a key, a session, a sandbox), for the checks that compare
/// a count a record keeps with the records that make it up: a sorted list, inline while short,
/// so that checking a small state allocates nothing. Add every record, sort once, then count.
struct Tally<K>(SmallVec<[K; 16]>);

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally(SmallVec::new())
    }
}

impl<K: Ord + Copy> Tally<K> {
    fn add(&mut self, k: K) {
        self.0.push(k);
    }

    fn sort(&mut self) {
        self.0.sort_unstable();
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// How many times `k` was added (after [`sort`](Self::sort)).
    fn count(&self, k: K) -> usize {
        let from = self.0.partition_point(|x| *x < k);
        self.0[from..].partition_point(|x| *x == k)
    }

    /// The least added (after [`sort`](Self::sort)).
    fn first(&self) -> Option<&K> {
        self.0.first()
    }

    /// Whether nothing was added twice (after [`sort`](Self::sort)).
    fn distinct(&self) -> bool {
        self.0.windows(2).all(|w| w[0] != w[1])
    }
}
