//! What one core input touched: the calls, sessions and sandboxes the input named, and those its
//! commands, events and backend answer named. After an input, the history's getter checks
//! (`binding-stable`, `no-teardown-under-live-call`, `serialize-one-per-key`,
//! `resolve-own-sandbox`) ask the core only about the live calls these reach; every few inputs,
//! and at the end of the random phase, they ask about every live call, so a change the core made
//! without naming it is still caught.

use sandkeeper::{CallId, SandboxId, SessionId};

use sandkeeper_check::CallRecord;

/// The names one input touched.
#[derive(Clone, Debug, Default)]
pub struct Touched {
    calls: Vec<CallId>,
    sessions: Vec<SessionId>,
    sandboxes: Vec<SandboxId>,
    /// The input may have changed any call (close).
    pub all: bool,
    /// Whether to record at all (not when every call is checked after every input).
    pub recording: bool,
}

impl Touched {
    /// `call` was named.
    pub fn call(&mut self, call: &CallId) {
        if self.recording && !self.calls.contains(call) {
            self.calls.push(call.clone());
        }
    }

    /// `session` was named.
    pub fn session(&mut self, session: &SessionId) {
        if self.recording && !self.sessions.contains(session) {
            self.sessions.push(session.clone());
        }
    }

    /// `sandbox` was named.
    pub fn sandbox(&mut self, sandbox: SandboxId) {
        if self.recording && !self.sandboxes.contains(&sandbox) {
            self.sandboxes.push(sandbox);
        }
    }

    /// Whether the live call `rec` is reached: named itself, or its session or sandbox named.
    pub fn reaches(&self, rec: &CallRecord) -> bool {
        self.all
            || self.calls.contains(&rec.call)
            || self.sessions.contains(&rec.session)
            || rec.sandbox.is_some_and(|x| self.sandboxes.contains(&x))
    }

    /// Forgets everything (the next input starts afresh). Keeps the buffers.
    pub fn clear(&mut self) {
        self.calls.clear();
        self.sessions.clear();
        self.sandboxes.clear();
        self.all = false;
    }
}
