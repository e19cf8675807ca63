//! The one timer table: every deadline the core keeps, ordered by instant.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, UploadId};
use crate::name::{CallId, PathName, SessionId};
use crate::time::Instant;

/// What a deadline is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

/// Deadlines ordered by (instant, timer): the order in which due timers fire is a pure function
/// of the inputs. Whoever sets a timer remembers its instant to cancel it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Timers {
    due: BTreeSet<(Instant, Timer)>,
}

impl Timers {
    /// Sets `timer` at `at`. O(log n).
    pub(crate) fn set(&mut self, at: Instant, timer: Timer) {
        let fresh = self.due.insert((at, timer));
        debug_assert!(fresh, "a timer was set twice");
    }

    /// Cancels `timer` set at `at`; harmless if it is not set. O(log n).
    pub(crate) fn cancel(&mut self, at: Instant, timer: &Timer) {
        // BTreeSet::remove needs an owned key of the tuple type.
        self.due.remove(&(at, timer.clone()));
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        match self.due.first() {
            Some((at, _)) if *at <= now => self.due.pop_first(),
            _ => None,
        }
    }

    /// How many timers are set.
    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether `timer` is set at `at`.
    pub(crate) fn contains(&self, at: Instant, timer: &Timer) -> bool {
        self.due.contains(&(at, timer.clone()))
    }

    /// Forgets every timer.
    pub(crate) fn clear(&mut self) {
        self.due.clear();
    }
}
