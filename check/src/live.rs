//! The live calls a checker knows of, in the order they were acquired, each with its record
//! inline. A run has a handful of live calls at a time: a short vector scanned by name (names
//! compare by pointer first) costs less than hashing the name, and the after-input checks walk
//! it without a lookup per call.

use sandkeeper::{CallId, Key, SandboxId, SessionId};

/// Where a live call is, as the events told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Acquired, neither ready nor failed.
    Pending,
    /// Ready on its sandbox.
    Ready,
    /// Ready once; its sandbox died.
    Lost,
}

/// A live call.
#[derive(Clone, Debug)]
pub struct CallRecord {
    /// Its name.
    pub call: CallId,
    /// Its session.
    pub session: SessionId,
    /// Its key, when not external.
    pub key: Option<Key>,
    /// Where it is.
    pub phase: Phase,
    /// Its sandbox, once known.
    pub sandbox: Option<SandboxId>,
    /// A number for its session: two live calls have the same number exactly when they have
    /// the same session (see [`LiveCalls::number_session`]), so the after-input checks compare
    /// a word instead of a name.
    pub(crate) session_no: u32,
    /// A number for its key, the same way; 0 when it has none.
    pub(crate) key_no: u32,
}

/// The live calls, oldest first.
#[derive(Clone, Debug, Default)]
pub struct LiveCalls {
    calls: Vec<CallRecord>,
    /// The last number given to a session or key (numbers are never reused).
    numbered: u32,
}

impl LiveCalls {
    fn position(&self, call: &CallId) -> Option<usize> {
        self.calls.iter().position(|c| &c.call == call)
    }

    /// The record of `call`, if live.
    pub fn get(&self, call: &CallId) -> Option<&CallRecord> {
        self.calls.iter().find(|c| &c.call == call)
    }

    /// The record of `call`, if live, to change.
    pub fn get_mut(&mut self, call: &CallId) -> Option<&mut CallRecord> {
        self.calls.iter_mut().find(|c| &c.call == call)
    }

    /// Whether `call` is live.
    pub fn contains(&self, call: &CallId) -> bool {
        self.position(call).is_some()
    }

    /// The number for `session` (see [`CallRecord`]'s `session_no`): a live call's number when
    /// one has this session, else a number no call had before.
    pub(crate) fn number_session(&mut self, session: &SessionId) -> u32 {
        self.number(|c| (&c.session == session).then_some(c.session_no))
    }

    /// The number for `key` (see [`CallRecord`]'s `key_no`), the same way; 0 for none.
    pub(crate) fn number_key(&mut self, key: Option<&Key>) -> u32 {
        match key {
            Some(key) => self.number(|c| (c.key.as_ref() == Some(key)).then_some(c.key_no)),
            None => 0,
        }
    }

    /// The number the first live call `same` answers for, else a fresh one.
    fn number(&mut self, same: impl Fn(&CallRecord) -> Option<u32>) -> u32 {
        if let Some(n) = self.calls.iter().find_map(same) {
            return n;
        }
        // Four billion distinct sessions and keys in one checker's life would wrap it.
        self.numbered = self.numbered.checked_add(1).expect("numbers exhausted");
        self.numbered
    }

    /// Adds a live call (the newest).
    pub fn push(&mut self, rec: CallRecord) {
        self.calls.push(rec);
    }

    /// Ends `call`, returning its record if it was live.
    pub fn remove(&mut self, call: &CallId) -> Option<CallRecord> {
        let i = self.position(call)?;
        Some(self.calls.remove(i))
    }

    /// Ends every live call.
    pub fn clear(&mut self) {
        self.calls.clear();
    }

    /// The live calls, oldest first.
    pub fn iter(&self) -> std::slice::Iter<'_, CallRecord> {
        self.calls.iter()
    }

    /// The `i`th live call, oldest first.
    pub fn at(&self, i: usize) -> &CallRecord {
        &self.calls[i]
    }

    /// How many calls are live.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no call is live.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The names of the live calls, oldest first.
    pub fn ids(&self) -> Vec<CallId> {
        self.calls.iter().map(|c| c.call.clone()).collect()
    }
}
