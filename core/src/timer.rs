//! The one timer table: every deadline the core keeps, ordered by instant.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, UploadId};
use crate::name::{CallId, PathName, SessionId};
use crate::time::Instant;

/// What a deadline is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Timer {
    /// The sandbox's current state has a deadline: Starting (start timeout), Idle (warm idle
    /// timeout), Draining (drain deadline), Stopping, Persisting or ShuttingDown (command
    /// timeout). One per sandbox: a state change replaces it.
    Sandbox(SandboxId),
    /// An upload attempt's timeout.
    Upload(UploadId),
    /// A retry of a (session, path) after a transient upload failure.
    Retry(SessionId, PathName),
    /// A queued call's wait timeout.
    Wait(CallId),
    /// The close deadline, then the second (grace) deadline.
    Close,
}

/// A set timer, as its owner remembers it in order to cancel it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
/// pure function of the inputs. Whoever sets a timer keeps its [`TimerRef`] to cancel it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Timers {
    #[serde(with = "entries")]
    due: BTreeMap<(Instant, u64), Timer>,
    next_seq: u64,
}

impl Timers {
    /// Sets `timer` at `at`. O(log n).
    pub(crate) fn set(&mut self, at: Instant, timer: Timer) -> TimerRef {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.due.insert((at, seq), timer);
        TimerRef { at, seq }
    }

    /// Cancels a timer; harmless if it already fired or was cancelled. O(log n).
    pub(crate) fn cancel(&mut self, timer: TimerRef) {
        self.due.remove(&(timer.at, timer.seq));
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(TimerRef, Timer)> {
        match self.due.first_key_value() {
            Some(((at, _), _)) if *at <= now => {
                let ((at, seq), timer) = self.due.pop_first().expect("first exists");
                Some((TimerRef { at, seq }, timer))
            }
            _ => None,
        }
    }

    /// How many timers are set.
    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether `timer` is set as `r`.
    pub(crate) fn contains(&self, r: TimerRef, timer: &Timer) -> bool {
        self.due.get(&(r.at, r.seq)) == Some(timer)
    }

    /// Forgets every timer.
    pub(crate) fn clear(&mut self) {
        self.due.clear();
    }
}

/// Serialises the table as a list of entries (JSON maps need string keys).
mod entries {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Timer;
    use crate::time::Instant;

    type Table = BTreeMap<(Instant, u64), Timer>;

    pub(super) fn serialize<S: Serializer>(table: &Table, s: S) -> Result<S::Ok, S::Error> {
        let entries: Vec<(&(Instant, u64), &Timer)> = table.iter().collect();
        entries.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Table, D::Error> {
        let entries: Vec<((Instant, u64), Timer)> = Vec::deserialize(d)?;
        Ok(entries.into_iter().collect())
    }
}
