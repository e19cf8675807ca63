//! Time bounds: every deadline the core documents holds in what it orders and announces. One
//! checker, fed the accepted inputs, commands and events it needs, at the core's instants.
//!
//! | check | what must hold |
//! |---|---|
//! | `command-deadline` | a Start's deadline is the start timeout from its order; a Stop's, Persist's and Shutdown's the command timeout; an Upload's at most the upload timeout from its version's *first* attempt, the same for every retry, and still ahead when the attempt is ordered |
//! | `upload-within-timeout` | after every input, no upload attempt is still awaited past its version's deadline |
//! | `drain-within-deadline` | after every input, no sandbox drains longer than the drain deadline since its Drain (unless a call revived it) |
//! | `wait-within-timeout` | a call that fails with `wait-timeout` fails exactly at its acquire plus the wait timeout; after every input, no call is still neither ready nor ended past its acquire plus the wait and start timeouts |
//! | `close-within-deadlines` | after every input, `Closed` has come if the close deadline and the grace have both passed since `close` |
//!
//! In fleet mode (`config.fleet` set) a call's wait is measured from its acquire or from when
//! the core queued it again after an adoption that failed ([`Deadlines::waiting_again`]: the
//! core gives such a call its wait timeout afresh), and `wait-timeout` fails it at or after
//! that plus the wait timeout, not exactly then: a replica's timers run when its driver wakes
//! it, at the first instant of its own clock at or past the deadline, and a paused replica's
//! clock jumps past it. The caller judges [`Deadlines::after_input`] at the instant the core's
//! timers last ran. A fleet call whose sandbox is up and waits for its key's durable record to
//! name it (the core makes it ready only then) has left its call's timeouts behind: no timer of
//! the call bounds that wait (the record write's own deadline and the lease do), so it leaves
//! the bound ([`Deadlines::awaits_record`]). And a replica's inputs other than a wake-up run no
//! timer: one that comes after a pause, its clock past a call's wait deadline before the wait's
//! timer ran, may still bind the call to a start, whose start timeout (and hook) bound it from
//! there ([`Deadlines::bound`]).
//!
//! Each bound is a min-heap of (deadline, subject) with lazy deletion: an entry whose subject
//! has moved on is dropped when it reaches the top, so a bound costs O(log n) per entry over its
//! life. Whether an upload attempt is still awaited and whether a sandbox still drains is the
//! caller's word ([`Deadlines::after_input`]): it keeps those records anyway.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rustc_hash::FxHashMap;
use sandkeeper::{
    CallId, Command, Config, ErrorKind, HookPoint, Hooks, Instant, PathName, SandboxId, SessionId,
    UploadId,
};

use crate::violation::Violation;

/// The time-bound checker. See the module docs.
#[derive(Clone, Debug)]
pub struct Deadlines {
    start: Duration,
    upload: Duration,
    command: Duration,
    drain: Duration,
    wait: Duration,
    grace: Duration,
    /// Per session, its (path, version) with an attempt so far and that attempt's deadline: a
    /// session has a few versions in flight, so one hash of the session's name and a short scan.
    versions: FxHashMap<SessionId, Vec<(PathName, u64, Instant)>>,
    /// Upload attempts by deadline; whether one is still awaited is the caller's.
    upload_heap: BinaryHeap<Reverse<(Instant, UploadId)>>,
    /// Draining sandboxes: the drain's deadline.
    drains: FxHashMap<SandboxId, Instant>,
    drain_heap: BinaryHeap<Reverse<(Instant, SandboxId)>>,
    /// Calls neither ready nor ended: when they were acquired.
    pending: FxHashMap<CallId, Instant>,
    pending_heap: BinaryHeap<Reverse<(Instant, CallId)>>,
    /// When close must have finished.
    close_by: Option<Instant>,
    /// The hooks' timeouts.
    hooks: Hooks,
    /// How long a call may stay neither ready nor ended ([`pending_bound`]), computed once: it
    /// is read after every input.
    pending_bound: Duration,
    /// Fleet mode: a `wait-timeout` may come later than its deadline (see the module docs).
    fleet: bool,
}

impl Deadlines {
    /// A checker for a core with `config`.
    pub fn new(config: &Config) -> Self {
        Deadlines {
            start: config.start_timeout,
            upload: config.upload_timeout,
            command: config.command_timeout,
            drain: config.drain_deadline,
            wait: config.wait_timeout,
            grace: config.close_grace,
            versions: FxHashMap::default(),
            upload_heap: BinaryHeap::new(),
            drains: FxHashMap::default(),
            drain_heap: BinaryHeap::new(),
            // Sized for the calls a run keeps live at once, so it does not grow in steps.
            pending: FxHashMap::with_capacity_and_hasher(64, Default::default()),
            pending_heap: BinaryHeap::new(),
            close_by: None,
            hooks: config.hooks,
            pending_bound: pending_bound(config),
            fleet: config.fleet.is_some(),
        }
    }

    /// A call's acquire was accepted at `now`.
    pub fn acquired(&mut self, call: &CallId, now: Instant) {
        self.pending.insert(call.clone(), now);
        self.pending_heap
            .push(Reverse((now + self.pending_bound, call.clone())));
    }

    /// Fleet mode: an adoption `call` was bound to failed, and the core queued the call again at
    /// `now` with its wait timeout afresh: its wait (and its bound) start over.
    pub fn waiting_again(&mut self, call: &CallId, now: Instant) {
        self.acquired(call, now);
    }

    /// Fleet mode: the core bound `call` to a starting sandbox at `now`. Bound past its wait
    /// deadline (its wait's timer not yet run), it is held to its start and hook from `now`.
    pub fn bound(&mut self, call: &CallId, now: Instant) {
        let Some(t) = self.pending.get(call).copied() else {
            return;
        };
        if self.fleet && now > t + self.wait {
            let since = Instant::from_nanos(now.as_nanos() - self.wait.as_nanos() as u64);
            self.acquired(call, since);
        }
    }

    /// Fleet mode: the Adopt of the sandbox `call` is bound to went unanswered and the core
    /// ordered it again at `now` (up to its attempts): its start is bounded afresh from `now`.
    pub fn adopting_again(&mut self, call: &CallId, now: Instant) {
        if self.fleet && self.pending.contains_key(call) {
            let since = now.as_nanos().saturating_sub(self.wait.as_nanos() as u64);
            self.acquired(call, Instant::from_nanos(since));
        }
    }

    /// Fleet mode: `call`'s sandbox is up and waits for its key's record to name it: no longer
    /// under the bound of its wait and start (see the module docs).
    pub fn awaits_record(&mut self, call: &CallId) {
        self.pending.remove(call);
    }

    /// A call is ready or ended: no longer pending.
    pub fn call_settled(&mut self, call: &CallId) {
        self.pending.remove(call);
    }

    /// `close(deadline)` was accepted at `now`.
    pub fn closing(&mut self, now: Instant, deadline: Duration) {
        self.close_by = Some(now + deadline + self.grace);
    }

    /// `Closed` came.
    pub fn closed(&mut self) {
        self.close_by = None;
    }

    /// A version settled: forget its first attempt.
    pub fn version_settled(&mut self, session: &SessionId, path: &PathName, version: u64) {
        if let Some(open) = self.versions.get_mut(session) {
            open.retain(|(p, v, _)| !(p == path && *v == version));
        }
    }

    /// One command, ordered at `now`.
    pub fn command(&mut self, cmd: &Command, now: Instant) -> Result<(), Violation> {
        let exact = |what: &str, got: Instant, want: Instant| {
            if got == want {
                Ok(())
            } else {
                Err(Violation::new(
                    "command-deadline",
                    format!("{what}'s deadline is {got:?}, expected {want:?}"),
                ))
            }
        };
        match cmd {
            Command::Start { deadline, .. } => exact("Start", *deadline, now + self.start),
            Command::Adopt { deadline, .. } => exact("Adopt", *deadline, now + self.start),
            Command::Stop { deadline, .. } => exact("Stop", *deadline, now + self.command),
            Command::Persist { deadline, .. } => exact("Persist", *deadline, now + self.command),
            Command::Shutdown { deadline, .. } => exact("Shutdown", *deadline, now + self.command),
            Command::Hook { hook, deadline, .. } => {
                let timeout = match hook {
                    HookPoint::AfterStart => self.hooks.after_start,
                    HookPoint::AfterResume => self.hooks.after_resume,
                    HookPoint::BeforeSuspend => self.hooks.before_suspend,
                    HookPoint::BeforeStop => self.hooks.before_stop,
                };
                match timeout {
                    Some(t) => exact("Hook", *deadline, now + t),
                    None => Err(Violation::new(
                        "command-deadline",
                        format!(
                            "a {} hook, which the configuration does not have",
                            hook.as_str()
                        ),
                    )),
                }
            }
            Command::Upload {
                upload,
                session,
                path,
                version,
                deadline,
                ..
            } => {
                let open = self.versions.entry(session.clone()).or_default();
                let first = match open.iter().find(|(p, v, _)| p == path && *v == version.0) {
                    Some((_, _, first)) => *first,
                    None => {
                        open.push((path.clone(), version.0, *deadline));
                        *deadline
                    }
                };
                self.upload_heap.push(Reverse((*deadline, *upload)));
                if first != *deadline {
                    Err(Violation::new(
                        "command-deadline",
                        format!(
                            "a retry of {session}/{path} {version} has deadline {deadline:?}, its first attempt had {first:?}"
                        ),
                    ))
                } else if *deadline <= now {
                    Err(Violation::new(
                        "command-deadline",
                        format!(
                            "Upload {upload} of {session}/{path} {version} ordered at {now:?}, at or past its deadline {deadline:?}"
                        ),
                    ))
                } else if *deadline > now + self.upload {
                    Err(Violation::new(
                        "command-deadline",
                        format!(
                            "Upload {upload} of {session}/{path} {version} at {now:?} has deadline {deadline:?}, past the upload timeout"
                        ),
                    ))
                } else {
                    Ok(())
                }
            }
            Command::Drain { sandbox, .. } => {
                let due = now + self.drain;
                self.drains.insert(*sandbox, due);
                self.drain_heap.push(Reverse((due, *sandbox)));
                Ok(())
            }
            Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Relinquish { .. }
            | Command::Abandon { .. } => Ok(()),
        }
    }

    /// A call failed at `now` with `error`.
    pub fn call_failed(
        &mut self,
        call: &CallId,
        error: ErrorKind,
        now: Instant,
    ) -> Result<(), Violation> {
        let acquired = self.pending.remove(call);
        // In one process exactly at its deadline; in a fleet at its first timer run from then.
        let timely = |t: Instant| {
            if self.fleet {
                now >= t + self.wait
            } else {
                now == t + self.wait
            }
        };
        match (error, acquired) {
            (ErrorKind::WaitTimeout, Some(t)) if !timely(t) => Err(Violation::new(
                "wait-within-timeout",
                format!(
                    "{call}, acquired at {t:?}, failed with wait-timeout at {now:?}, not at {:?}",
                    t + self.wait
                ),
            )),
            _ => Ok(()),
        }
    }

    /// After an input at `now`: nothing outlives its bound. `awaited` and `draining` are the
    /// caller's word on an upload attempt and a managed sandbox now; `closed`, whether `Closed`
    /// came.
    pub fn after_input(
        &mut self,
        now: Instant,
        closed: bool,
        awaited: impl Fn(UploadId) -> bool,
        draining: impl Fn(SandboxId) -> bool,
    ) -> Result<(), Violation> {
        let (drains, pending) = (&self.drains, &self.pending);
        let bound = self.pending_bound;
        if let Some((due, upload)) = overdue(&mut self.upload_heap, now, |u, _| awaited(*u)) {
            return Err(Violation::new(
                "upload-within-timeout",
                format!("{upload} is still awaited at {now:?}, past its deadline {due:?}"),
            ));
        }
        let still_draining = |x: &SandboxId, due| drains.get(x) == Some(&due) && draining(*x);
        if let Some((due, sandbox)) = overdue(&mut self.drain_heap, now, still_draining) {
            return Err(Violation::new(
                "drain-within-deadline",
                format!("{sandbox} still drains at {now:?}, past its drain deadline {due:?}"),
            ));
        }
        let still_pending = |c: &CallId, due| pending.get(c).is_some_and(|t| *t + bound == due);
        if let Some((due, call)) = overdue(&mut self.pending_heap, now, still_pending) {
            return Err(Violation::new(
                "wait-within-timeout",
                format!("{call} is neither ready nor ended at {now:?}, past {due:?} (wait and start timeouts)"),
            ));
        }
        match self.close_by {
            Some(by) if !closed && now > by => Err(Violation::new(
                "close-within-deadlines",
                format!("not closed at {now:?}; close had to finish by {by:?}"),
            )),
            _ => Ok(()),
        }
    }
}

/// How long a call may stay neither ready nor ended: its wait, its start and its sandbox's hook
/// on the way up.
fn pending_bound(config: &Config) -> Duration {
    let hook = config
        .hooks
        .after_start
        .max(config.hooks.after_resume)
        .unwrap_or_default();
    config.wait_timeout + config.start_timeout + hook
}

/// The earliest entry of `heap` still `current` (its subject has not moved on since the entry was
/// made) whose deadline is before `now`; entries no longer current are dropped on the way
/// (lazy deletion), once their deadline has passed: while the earliest deadline is still ahead,
/// no entry can be overdue and none is looked at (the usual case, one comparison per input).
fn overdue<T: Ord + Clone>(
    heap: &mut BinaryHeap<Reverse<(Instant, T)>>,
    now: Instant,
    current: impl Fn(&T, Instant) -> bool,
) -> Option<(Instant, T)> {
    while let Some(Reverse((due, subject))) = heap.peek() {
        if *due >= now {
            return None;
        }
        if !current(subject, *due) {
            heap.pop();
            continue;
        }
        return Some((*due, subject.clone()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{check, upload_at};
    use sandkeeper::{Key, Spec};

    fn config() -> Config {
        Config {
            start_timeout: Duration::from_secs(1),
            upload_timeout: Duration::from_secs(2),
            drain_deadline: Duration::from_secs(3),
            wait_timeout: Duration::from_secs(4),
            command_timeout: Duration::from_secs(5),
            close_grace: Duration::from_secs(6),
            ..Config::default()
        }
    }

    fn s(n: u64) -> Instant {
        Instant::from_millis(n * 1000)
    }

    fn never<T>(_: T) -> bool {
        false
    }

    #[test]
    fn command_deadlines_are_their_timeouts_and_a_retry_keeps_its_first() {
        let mut d = Deadlines::new(&config());
        let start = Command::Start {
            sandbox: SandboxId(1),
            key: Key::Global,
            spec: Spec::new(""),
            resume_from: None,
            resumes: None,
            deadline: s(11),
            token: None,
        };
        assert_eq!(check(d.command(&start, s(10))), "ok");
        assert_eq!(check(d.command(&start, s(11))), "command-deadline");
        let shutdown = |deadline| Command::Shutdown {
            sandbox: SandboxId(1),
            deadline,
            token: None,
        };
        assert_eq!(check(d.command(&shutdown(s(15)), s(10))), "ok");
        assert_eq!(
            check(d.command(&shutdown(s(16)), s(10))),
            "command-deadline"
        );
        assert_eq!(check(d.command(&upload_at(1, 1, 1, s(12)), s(10))), "ok");
        assert_eq!(
            check(d.command(&upload_at(2, 1, 1, s(12)), s(11))),
            "ok",
            "a retry"
        );
        assert_eq!(
            check(d.command(&upload_at(3, 1, 1, s(13)), s(11))),
            "command-deadline",
            "a retry with a fresh window"
        );
        assert_eq!(
            check(d.command(&upload_at(4, 2, 1, s(13)), s(10))),
            "command-deadline"
        );
        assert_eq!(
            check(d.command(&upload_at(5, 1, 1, s(12)), s(12))),
            "command-deadline",
            "a retry ordered when its window has closed"
        );
    }

    #[test]
    fn what_outlives_its_bound_is_caught_after_the_input() {
        let mut d = Deadlines::new(&config());
        d.command(&upload_at(1, 1, 1, s(2)), s(0)).unwrap();
        assert_eq!(check(d.after_input(s(2), false, |_| true, never)), "ok");
        assert_eq!(
            check(d.after_input(s(3), false, |_| true, never)),
            "upload-within-timeout"
        );
        assert_eq!(check(d.after_input(s(3), false, |_| false, never)), "ok");

        let drain = Command::Drain {
            sandbox: SandboxId(2),
            sessions: Default::default(),
        };
        d.command(&drain, s(10)).unwrap();
        assert_eq!(
            check(d.after_input(s(13), false, |_| false, |_| true)),
            "ok"
        );
        assert_eq!(
            check(d.after_input(s(14), false, |_| false, |_| true)),
            "drain-within-deadline"
        );
        assert_eq!(check(d.after_input(s(14), false, |_| false, never)), "ok");

        let a = CallId::new("a").unwrap();
        d.acquired(&a, s(20));
        assert_eq!(check(d.after_input(s(25), false, never, never)), "ok");
        assert_eq!(
            check(d.after_input(s(26), false, never, never)),
            "wait-within-timeout"
        );
        assert_eq!(
            check(d.call_failed(&a, ErrorKind::WaitTimeout, s(25))),
            "wait-within-timeout"
        );
        let b = CallId::new("b").unwrap();
        d.acquired(&b, s(30));
        assert_eq!(
            check(d.call_failed(&b, ErrorKind::WaitTimeout, s(34))),
            "ok"
        );

        d.closing(s(40), Duration::from_secs(1));
        assert_eq!(check(d.after_input(s(47), false, never, never)), "ok");
        assert_eq!(
            check(d.after_input(s(48), false, never, never)),
            "close-within-deadlines"
        );
        assert_eq!(check(d.after_input(s(48), true, never, never)), "ok");
    }

    /// In a fleet a `wait-timeout` comes at the replica's first timer run from its deadline,
    /// a call queued again after a failed adoption waits afresh, one bound late is held to its
    /// start from then, and one waiting for its key's record leaves the bound; in one process
    /// none of that holds.
    #[test]
    fn a_fleet_call_is_bound_from_where_its_replica_put_it() {
        let fleet = Config {
            fleet: Some(sandkeeper::Fleet {
                incarnation: 1,
                lease: Duration::from_secs(10),
                renew_every: Duration::from_secs(3),
                margin: Duration::from_secs(2),
                claim_retry: Duration::from_secs(1),
                handover: sandkeeper::Handover::Warm,
            }),
            ..config()
        };
        let a = CallId::new("a").unwrap();
        // Wait 4 s, start 1 s: the bound is 5 s.
        let mut one = Deadlines::new(&config());
        one.acquired(&a, s(0));
        assert_eq!(
            check(one.call_failed(&a, ErrorKind::WaitTimeout, s(5))),
            "wait-within-timeout",
            "late in one process"
        );
        let mut d = Deadlines::new(&fleet);
        d.acquired(&a, s(0));
        assert_eq!(check(d.call_failed(&a, ErrorKind::WaitTimeout, s(5))), "ok");
        d.acquired(&a, s(0));
        assert_eq!(
            check(d.call_failed(&a, ErrorKind::WaitTimeout, s(3))),
            "wait-within-timeout",
            "early in a fleet"
        );

        d.acquired(&a, s(0));
        d.waiting_again(&a, s(10));
        assert_eq!(check(d.after_input(s(15), false, never, never)), "ok");
        assert_eq!(
            check(d.after_input(s(16), false, never, never)),
            "wait-within-timeout"
        );
        assert_eq!(
            check(d.call_failed(&a, ErrorKind::WaitTimeout, s(13))),
            "wait-within-timeout",
            "its wait started over"
        );

        let b = CallId::new("b").unwrap();
        d.acquired(&b, s(20));
        d.bound(&b, s(27));
        assert_eq!(check(d.after_input(s(28), false, never, never)), "ok");
        assert_eq!(
            check(d.after_input(s(29), false, never, never)),
            "wait-within-timeout",
            "held to its start from its binding"
        );
        let mut one = Deadlines::new(&config());
        one.acquired(&b, s(20));
        one.bound(&b, s(27));
        assert_eq!(
            check(one.after_input(s(26), false, never, never)),
            "wait-within-timeout",
            "bound late in one process"
        );

        let c = CallId::new("c").unwrap();
        d.call_settled(&b);
        d.acquired(&c, s(30));
        d.awaits_record(&c);
        assert_eq!(check(d.after_input(s(100), false, never, never)), "ok");
    }
}
