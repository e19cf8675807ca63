//! Time bounds: every deadline the core documents holds in the history. One checker, fed the
//! commands, events and accepted inputs the history sees, in virtual milliseconds.
//!
//! | check | what must hold |
//! |---|---|
//! | `command-deadline` | a Start's deadline is the start timeout from its order; a Stop's, Persist's and Shutdown's the command timeout; an Upload's the upload timeout from its version's *first* attempt, the same for every retry |
//! | `upload-within-timeout` | after every input, no upload attempt is still awaited past its version's deadline |
//! | `drain-within-deadline` | after every input, no sandbox drains longer than the drain deadline since its Drain (unless a call revived it) |
//! | `wait-within-timeout` | a call that fails with `wait-timeout` fails exactly at its acquire plus the wait timeout; after every input, no call is still neither ready nor ended past its acquire plus the wait and start timeouts |
//! | `close-within-deadlines` | after every input, `Closed` has come if the close deadline and the grace have both passed since `close` |
//!
//! Each is a min-heap of (deadline, what) with lazy deletion: an entry whose subject has moved on
//! is dropped when it reaches the top, so a check costs O(log n) per entry over its life.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use sandkeeper::{
    CallId, Command, Config, ErrorKind, Instant, PathName, SandboxId, SessionId, UploadId,
};

use crate::fastmap::FastMap;

/// A broken time bound: the check's name and what happened.
pub type Broken = (&'static str, String);

const MS: u64 = 1_000_000;

/// The time-bound checker.
#[derive(Clone, Debug)]
pub struct Bounds {
    start_ms: u64,
    upload_ms: u64,
    command_ms: u64,
    drain_ms: u64,
    wait_ms: u64,
    grace_ms: u64,
    /// Per (session, path, version) with an attempt so far: its deadline, in ns.
    versions: FastMap<(SessionId, PathName, u64), u64>,
    /// Upload attempts by deadline (ms, rounded up); whether one is still awaited is the
    /// history's.
    upload_heap: BinaryHeap<Reverse<(u64, UploadId)>>,
    /// Draining sandboxes: the drain's deadline (ms).
    drains: FastMap<SandboxId, u64>,
    drain_heap: BinaryHeap<Reverse<(u64, SandboxId)>>,
    /// Calls neither ready nor ended: when they were acquired (ms).
    pending: FastMap<CallId, u64>,
    pending_heap: BinaryHeap<Reverse<(u64, CallId)>>,
    /// When close must have finished (ms).
    close_by: Option<u64>,
}

impl Bounds {
    /// A checker for a core with `config`.
    pub fn new(config: &Config) -> Self {
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        Bounds {
            start_ms: ms(config.start_timeout),
            upload_ms: ms(config.upload_timeout),
            command_ms: ms(config.command_timeout),
            drain_ms: ms(config.drain_deadline),
            wait_ms: ms(config.wait_timeout),
            grace_ms: ms(config.close_grace),
            versions: FastMap::default(),
            upload_heap: BinaryHeap::new(),
            drains: FastMap::default(),
            drain_heap: BinaryHeap::new(),
            pending: FastMap::default(),
            pending_heap: BinaryHeap::new(),
            close_by: None,
        }
    }

    /// A call's acquire was accepted at `now` (ms).
    pub fn acquired(&mut self, call: &CallId, now: u64) {
        self.pending.insert(call.clone(), now);
        self.pending_heap
            .push(Reverse((now + self.wait_ms + self.start_ms, call.clone())));
    }

    /// A call is ready or ended: no longer pending.
    pub fn call_settled(&mut self, call: &CallId) {
        self.pending.remove(call);
    }

    /// `close(deadline)` was accepted at `now` (ms).
    pub fn closing(&mut self, now: u64, deadline_ms: u64) {
        self.close_by = Some(now + deadline_ms + self.grace_ms);
    }

    /// `Closed` came.
    pub fn closed(&mut self) {
        self.close_by = None;
    }

    /// A version settled: forget its first attempt.
    pub fn version_settled(&mut self, session: &SessionId, path: &PathName, version: u64) {
        self.versions
            .remove(&(session.clone(), path.clone(), version));
    }

    /// One command, ordered at `now` (ms). Returns the first broken bound.
    pub fn command(&mut self, cmd: &Command, now: u64) -> Option<Broken> {
        let at = |ms: u64| Instant::from_millis(ms);
        let exact = |what: &str, got: Instant, want_ms: u64| {
            (got != at(want_ms)).then(|| {
                (
                    "command-deadline",
                    format!("{what}'s deadline is {got:?}, expected {:?}", at(want_ms)),
                )
            })
        };
        match cmd {
            Command::Start { deadline, .. } => exact("Start", *deadline, now + self.start_ms),
            Command::Stop { deadline, .. } => exact("Stop", *deadline, now + self.command_ms),
            Command::Persist { deadline, .. } => exact("Persist", *deadline, now + self.command_ms),
            Command::Shutdown { deadline, .. } => {
                exact("Shutdown", *deadline, now + self.command_ms)
            }
            Command::Upload {
                upload,
                session,
                path,
                version,
                deadline,
                ..
            } => {
                let first = *self
                    .versions
                    .entry((session.clone(), path.clone(), version.0))
                    .or_insert(deadline.as_nanos());
                let broken = if first != deadline.as_nanos() {
                    Some((
                        "command-deadline",
                        format!(
                            "a retry of {session}/{path} {version} has deadline {deadline:?}, its first attempt had {:?}",
                            Instant::from_nanos(first)
                        ),
                    ))
                } else if first == deadline.as_nanos()
                    && deadline.as_nanos() > (now + self.upload_ms) * MS
                {
                    Some((
                        "command-deadline",
                        format!(
                            "Upload {upload} of {session}/{path} {version} at {now} ms has deadline {deadline:?}, past the upload timeout"
                        ),
                    ))
                } else {
                    None
                };
                let due = deadline.as_nanos().div_ceil(MS);
                self.upload_heap.push(Reverse((due, *upload)));
                broken
            }
            Command::Drain { sandbox, .. } => {
                let due = now + self.drain_ms;
                self.drains.insert(*sandbox, due);
                self.drain_heap.push(Reverse((due, *sandbox)));
                None
            }
            Command::CancelUpload { .. } | Command::Abandon { .. } => None,
        }
    }

    /// A call failed at `now` (ms) with `error`.
    pub fn call_failed(&mut self, call: &CallId, error: ErrorKind, now: u64) -> Option<Broken> {
        let acquired = self.pending.remove(call);
        match (error, acquired) {
            (ErrorKind::WaitTimeout, Some(t)) if now != t + self.wait_ms => Some((
                "wait-within-timeout",
                format!(
                    "{call}, acquired at {t} ms, failed with wait-timeout at {now} ms, not at {} ms",
                    t + self.wait_ms
                ),
            )),
            _ => None,
        }
    }

    /// After an input at `now` (ms): nothing outlives its bound. `awaited` and `draining` are
    /// the history's word on an upload attempt and a managed sandbox now.
    pub fn after_input(
        &mut self,
        now: u64,
        closed: bool,
        awaited: impl Fn(UploadId) -> bool,
        draining: impl Fn(SandboxId) -> bool,
    ) -> Option<Broken> {
        while let Some(Reverse((due, upload))) = self.upload_heap.peek().cloned() {
            if !awaited(upload) {
                self.upload_heap.pop();
                continue;
            }
            if due >= now {
                break;
            }
            return Some((
                "upload-within-timeout",
                format!("{upload} is still awaited at {now} ms, past its deadline {due} ms"),
            ));
        }
        while let Some(Reverse((due, sandbox))) = self.drain_heap.peek().cloned() {
            if self.drains.get(&sandbox) != Some(&due) || !draining(sandbox) {
                self.drain_heap.pop();
                continue;
            }
            if due >= now {
                break;
            }
            return Some((
                "drain-within-deadline",
                format!("{sandbox} still drains at {now} ms, past its drain deadline {due} ms"),
            ));
        }
        while let Some(Reverse((due, call))) = self.pending_heap.peek().cloned() {
            let current = self
                .pending
                .get(&call)
                .is_some_and(|t| t + self.wait_ms + self.start_ms == due);
            if !current {
                self.pending_heap.pop();
                continue;
            }
            if due >= now {
                break;
            }
            return Some((
                "wait-within-timeout",
                format!("{call} is neither ready nor ended at {now} ms, past {due} ms (wait and start timeouts)"),
            ));
        }
        match self.close_by {
            Some(by) if !closed && now > by => Some((
                "close-within-deadlines",
                format!("not closed at {now} ms; close had to finish by {by} ms"),
            )),
            _ => None,
        }
    }
}
