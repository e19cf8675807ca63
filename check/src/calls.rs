//! Calls: what the core says about each call agrees with what it was given and with what it
//! answers when asked.
//!
//! | check | what must hold |
//! |---|---|
//! | `call-names-unique` | an acquire of a live call's name is refused |
//! | `typed-errors` | an acquire of a live call is refused with `duplicate-call` (or `closed`); a release of a call that is not live with `already-released` while the core still remembers it ended, else `unknown-call` |
//! | `release-live` | a release is accepted exactly when the call is live (until close) |
//! | `call-events` | `CallReady` and `CallFailed` name a pending live call; `CallRevoked` a live call; `SandboxLost` a call ready on that sandbox, which was reported dead |
//! | `ready-on-live-sandbox` | a call becomes ready only on a sandbox neither stopped, shut down nor dead |
//! | `serialize-fifo` | under `Serialize`, no call of a key becomes ready while an older call of the key still waits |
//! | `release-completes-once` | `CallReleased` comes once per accepted release |
//! | `binding-stable` | asked, the core places every live call where its events put it (waiting or starting while pending; ready on its sandbox; lost on a dead one) |
//! | `no-teardown-under-live-call` | no live call is bound to a sandbox that is draining, stopped or shut down (and not dead) |
//! | `serialize-one-per-key` | under `Serialize`, at most one live call holds a key |
//! | `resolve-own-sandbox` | `resolve(S)` answers the sandbox of one of S's own ready calls whose sandbox is up, `sandbox-gone` when its ready calls all lost theirs, `no-active-sandbox` when it has none |
//! | `liveness-release-completes` | at the end, every accepted release completed |
//!
//! What a sandbox is (up, dead, torn down) is the caller's word: it keeps the sandboxes' lanes
//! anyway ([`Lane`](crate::Lane)). The getter checks ask the core about every live call, or only
//! about those a caller says an input reached (the simulator narrows them to save time between
//! full looks).

use rustc_hash::FxHashMap;
use sandkeeper::{
    CallId, CallStatus, Config, Error, ErrorKind, ExternalId, Key, Lifecycle, SameKey, SandboxId,
    Scope, SessionId, UserId,
};

use crate::live::{CallRecord, LiveCalls, Phase};
use crate::violation::Violation;

/// The call checker. See the module docs.
#[derive(Clone, Debug)]
pub struct CallChecker {
    scope: Scope,
    same_key: SameKey,
    /// How many ended calls the core remembers (for `already-released` against
    /// `unknown-call`).
    remembered: u64,
    live: LiveCalls,
    /// Accepted releases whose `CallReleased` has not come, per call.
    awaiting_release: FxHashMap<CallId, u32>,
    /// Per ended call name, the number of its latest end.
    ended_at: FxHashMap<CallId, u64>,
    ends: u64,
    /// Per live call, whether the getter checks look at it and whether it holds its key (a
    /// reused buffer).
    pick: Vec<u8>,
}

const SKIP: u8 = 0;
const CHECK: u8 = 1;
const HOLDS_KEY: u8 = 2;

fn fail<T>(check: &'static str, detail: String) -> Result<T, Violation> {
    Err(Violation::new(check, detail))
}

impl CallChecker {
    /// A checker for a core with `config`.
    pub fn new(config: &Config) -> Self {
        CallChecker {
            scope: config.scope,
            same_key: config.same_key,
            remembered: config.limits.remembered_ended_calls as u64,
            live: LiveCalls::default(),
            awaiting_release: FxHashMap::default(),
            // Sized for a run of a few dozen calls (a simulator seed), so it does not grow in
            // steps from empty, rehashing at each.
            ended_at: FxHashMap::with_capacity_and_hasher(64, Default::default()),
            ends: 0,
            pick: Vec::new(),
        }
    }

    /// The live calls, oldest first.
    pub fn live(&self) -> &LiveCalls {
        &self.live
    }

    /// The key a call of `session` (by `user`) is isolated under.
    pub fn key_of(&self, session: &SessionId, call: &CallId, user: Option<&UserId>) -> Key {
        match self.scope {
            Scope::Call => Key::Call(call.clone()),
            Scope::Session => Key::Session(session.clone()),
            Scope::User => match user {
                Some(u) => Key::User(u.clone()),
                None => Key::Agent,
            },
            Scope::Agent => Key::Agent,
            Scope::Global => Key::Global,
        }
    }

    // ------------------------------------------------------------------------------------------
    // Inputs

    /// `acquire` was accepted.
    pub fn acquired(
        &mut self,
        call: &CallId,
        session: &SessionId,
        user: Option<&UserId>,
        external: Option<&ExternalId>,
    ) -> Result<(), Violation> {
        let was_live = self.live.contains(call);
        let key = external.is_none().then(|| self.key_of(session, call, user));
        let rec = CallRecord {
            call: call.clone(),
            session_no: self.live.number_session(session),
            key_no: self.live.number_key(key.as_ref()),
            session: session.clone(),
            key,
            phase: Phase::Pending,
            sandbox: None,
        };
        match self.live.get_mut(call) {
            Some(old) => *old = rec,
            None => self.live.push(rec),
        }
        self.ended_at.remove(call);
        if was_live {
            return fail(
                "call-names-unique",
                format!("acquire of live call {call} was accepted"),
            );
        }
        Ok(())
    }

    /// `acquire` was refused with `kind`.
    pub fn acquire_rejected(&self, call: &CallId, kind: ErrorKind) -> Result<(), Violation> {
        let was_live = self.live.contains(call);
        if was_live && kind != ErrorKind::DuplicateCall && kind != ErrorKind::Closed {
            return fail(
                "typed-errors",
                format!("acquire of live call {call} failed with {kind}, not duplicate-call"),
            );
        }
        Ok(())
    }

    /// `release` was accepted: the call's record, which it ends.
    pub fn released(&mut self, call: &CallId) -> Result<CallRecord, Violation> {
        let Some(rec) = self.live.remove(call) else {
            return fail(
                "release-live",
                format!("release of {call} accepted, but it is not live"),
            );
        };
        self.ended(call);
        *self.awaiting_release.entry(call.clone()).or_default() += 1;
        Ok(rec)
    }

    /// `release` was refused with `kind`; `closed`: the `Closed` event came.
    pub fn release_rejected(
        &self,
        call: &CallId,
        kind: ErrorKind,
        closed: bool,
    ) -> Result<(), Violation> {
        let live = self.live.contains(call);
        if !closed && !live {
            let remembered = self
                .ended_at
                .get(call)
                .is_some_and(|at| self.ends - at < self.remembered);
            let want = if remembered {
                ErrorKind::AlreadyReleased
            } else {
                ErrorKind::UnknownCall
            };
            if kind != want {
                return fail(
                    "typed-errors",
                    format!(
                        "release of {call} (not live) was refused with {kind}, expected {want}"
                    ),
                );
            }
        }
        if live && !closed {
            return fail(
                "release-live",
                format!("release of live call {call} was rejected with {kind}"),
            );
        }
        Ok(())
    }

    fn ended(&mut self, call: &CallId) {
        self.ends += 1;
        self.ended_at.insert(call.clone(), self.ends);
    }

    /// The core was told, or a getter said while it starts, that `call` is bound to `x`.
    pub fn learn_binding(&mut self, call: &CallId, x: SandboxId) {
        if let Some(c) = self.live.get_mut(call) {
            c.sandbox = Some(x);
        }
    }

    // ------------------------------------------------------------------------------------------
    // Events

    /// `CallReady { call, sandbox }`; `up`: the sandbox is neither stopped, shut down nor dead.
    pub fn ready(&mut self, call: &CallId, sandbox: SandboxId, up: bool) -> Result<(), Violation> {
        let mut broken = None;
        if !up {
            broken = Some(Violation::new(
                "ready-on-live-sandbox",
                format!("{call} ready on {sandbox}, which is stopped, shut down or dead"),
            ));
        }
        let pending = self
            .live
            .get(call)
            .is_some_and(|c| c.phase == Phase::Pending);
        if !pending && broken.is_none() {
            broken = Some(Violation::new(
                "call-events",
                format!("CallReady for {call}, which is not a pending live call"),
            ));
        }
        if self.same_key == SameKey::Serialize && broken.is_none() {
            // Waiters of one key are admitted first in, first out: no older call of the key
            // may still be pending.
            let key = self.live.get(call).and_then(|c| c.key.as_ref());
            let older = key.and_then(|key| {
                self.live
                    .iter()
                    .take_while(|r| &r.call != call)
                    .find(|r| r.phase == Phase::Pending && r.key.as_ref() == Some(key))
            });
            if let Some(older) = older {
                broken = Some(Violation::new(
                    "serialize-fifo",
                    format!("{call} became ready while {}, acquired before it for the same key, still waits", older.call),
                ));
            }
        }
        if let Some(c) = self.live.get_mut(call) {
            c.phase = Phase::Ready;
            c.sandbox = Some(sandbox);
        }
        broken.map_or(Ok(()), Err)
    }

    /// `CallFailed { call }`: the call's record, which it ends.
    pub fn failed(&mut self, call: &CallId) -> Result<Option<CallRecord>, Violation> {
        let pending = self
            .live
            .get(call)
            .is_some_and(|c| c.phase == Phase::Pending);
        let rec = self.live.remove(call);
        self.ended(call);
        if !pending {
            return fail(
                "call-events",
                format!("CallFailed for {call}, which is not a pending live call"),
            );
        }
        Ok(rec)
    }

    /// `CallReleased { call }`.
    pub fn release_completed(&mut self, call: &CallId) -> Result<(), Violation> {
        match self.awaiting_release.get_mut(call) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.awaiting_release.remove(call);
                }
                Ok(())
            }
            None => fail(
                "release-completes-once",
                format!("CallReleased for {call}, which was not released or already completed"),
            ),
        }
    }

    /// `CallRevoked { call }`: the call's record, which it ends.
    pub fn revoked(&mut self, call: &CallId) -> Result<Option<CallRecord>, Violation> {
        let rec = self.live.remove(call);
        self.ended(call);
        if rec.is_none() {
            return fail(
                "call-events",
                format!("CallRevoked for {call}, which is not live"),
            );
        }
        Ok(rec)
    }

    /// `SandboxLost { call, sandbox }`; `dead`: the core was told the sandbox died, or lost
    /// its running instance.
    pub fn lost(&mut self, call: &CallId, sandbox: SandboxId, dead: bool) -> Result<(), Violation> {
        if !dead {
            return fail(
                "call-events",
                format!("SandboxLost for {call} on {sandbox}, which was not reported dead"),
            );
        }
        match self.live.get_mut(call) {
            Some(c) if c.phase == Phase::Ready && c.sandbox == Some(sandbox) => {
                c.phase = Phase::Lost;
                Ok(())
            }
            _ => fail(
                "call-events",
                format!("SandboxLost for {call} on {sandbox}, which it was not ready on"),
            ),
        }
    }

    /// `Closed`: close revoked or dropped everything still live, and said so in its report.
    pub fn closed(&mut self) {
        self.live.clear();
        self.awaiting_release.clear();
    }

    // ------------------------------------------------------------------------------------------
    // Asking the core

    /// Whether `session` has a live call ready on a sandbox not reported dead.
    pub fn has_up_call(&self, session: &SessionId, dead: impl Fn(SandboxId) -> bool) -> bool {
        self.live.iter().any(|r| {
            &r.session == session && r.phase == Phase::Ready && r.sandbox.is_some_and(|x| !dead(x))
        })
    }

    /// The getter checks (`binding-stable`, `no-teardown-under-live-call`,
    /// `serialize-one-per-key`, `resolve-own-sandbox`), over the live calls `reaches` picks
    /// (with, under `Serialize`, the calls sharing their keys), or every live call when `full`.
    /// `dead` and `torn` are the caller's word on a sandbox: reported dead; draining, stopped or
    /// shut down.
    pub fn check_core(
        &mut self,
        core: &Lifecycle,
        full: bool,
        reaches: impl Fn(&CallRecord) -> bool,
        dead: impl Fn(SandboxId) -> bool,
        torn: impl Fn(SandboxId) -> bool,
    ) -> Result<(), Violation> {
        if self.live.is_empty() {
            return Ok(());
        }
        let mut pick = std::mem::take(&mut self.pick);
        pick.clear();
        pick.extend(
            self.live
                .iter()
                .map(|r| if full || reaches(r) { CHECK } else { SKIP }),
        );
        let result = self
            .check_calls(core, full, &mut pick, &dead, &torn)
            .and_then(|()| self.check_resolve(core, &pick, &dead));
        self.pick = pick;
        result
    }

    fn check_calls(
        &self,
        core: &Lifecycle,
        full: bool,
        pick: &mut [u8],
        dead: &impl Fn(SandboxId) -> bool,
        torn: &impl Fn(SandboxId) -> bool,
    ) -> Result<(), Violation> {
        let serialize = self.same_key == SameKey::Serialize;
        if serialize && !full {
            // A call's key partners are checked with it (two bound under one key).
            for i in 0..pick.len() {
                let key_no = self.live.at(i).key_no;
                if pick[i] == SKIP || key_no == 0 {
                    continue;
                }
                for (j, r) in self.live.iter().enumerate() {
                    if pick[j] == SKIP && r.key_no == key_no {
                        pick[j] = CHECK;
                    }
                }
            }
        }
        let mut broken: Option<Violation> = None;
        let mut holders = 0;
        for (i, rec) in self.live.iter().enumerate() {
            if pick[i] == SKIP {
                continue;
            }
            let status = core.call_status(&rec.call);
            let fits = match (rec.phase, status) {
                (Phase::Pending, Some(CallStatus::Waiting | CallStatus::Starting(_))) => true,
                (Phase::Ready, Some(CallStatus::Ready(x))) => Some(x) == rec.sandbox,
                (Phase::Ready | Phase::Lost, Some(CallStatus::Lost(x))) => {
                    Some(x) == rec.sandbox && dead(x)
                }
                _ => false,
            };
            if !fits && broken.is_none() {
                broken = Some(Violation::new(
                    "binding-stable",
                    format!(
                        "{} is {:?} by its events, the core says {status:?}",
                        rec.call, rec.phase
                    ),
                ));
            }
            let bound = match status {
                Some(CallStatus::Starting(x) | CallStatus::Ready(x)) => Some(x),
                _ => None,
            };
            if let Some(x) = bound {
                if torn(x) && broken.is_none() {
                    broken = Some(Violation::new(
                        "no-teardown-under-live-call",
                        format!(
                            "{} is bound to {x}, which is draining, stopped or shut down",
                            rec.call
                        ),
                    ));
                }
            }
            if serialize
                && rec.key_no != 0
                && bound.or(rec.sandbox).is_some()
                && status.is_some()
                && !matches!(status, Some(CallStatus::Waiting))
            {
                pick[i] = HOLDS_KEY;
                holders += 1;
            }
        }
        if holders > 1 && broken.is_none() {
            let holds = |i: usize| pick[i] == HOLDS_KEY;
            let key_no = |i: usize| self.live.at(i).key_no;
            let dup = (0..pick.len()).find(|&i| {
                holds(i) && (i + 1..pick.len()).any(|j| holds(j) && key_no(j) == key_no(i))
            });
            if let Some(key) = dup.and_then(|i| self.live.at(i).key.clone()) {
                broken = Some(Violation::new(
                    "serialize-one-per-key",
                    format!("two live calls bound under key {key} with same-key=serialize"),
                ));
            }
        }
        broken.map_or(Ok(()), Err)
    }

    /// `resolve(S)` for the session of every picked live call: the sandbox of one of its own
    /// ready calls, or the right error.
    fn check_resolve(
        &self,
        core: &Lifecycle,
        pick: &[u8],
        dead: &impl Fn(SandboxId) -> bool,
    ) -> Result<(), Violation> {
        for (i, rec) in self.live.iter().enumerate() {
            if pick[i] == SKIP {
                continue;
            }
            // Once per session.
            let session_no = rec.session_no;
            let seen = self
                .live
                .iter()
                .zip(pick)
                .take(i)
                .any(|(o, p)| *p != SKIP && o.session_no == session_no);
            if seen {
                continue;
            }
            let got = core.resolve(&rec.session);
            let mut up = false;
            let mut lost = false;
            let mut ok_here = false;
            for o in self.live.iter().filter(|o| o.session_no == session_no) {
                match o.phase {
                    Phase::Ready if !o.sandbox.is_some_and(dead) => {
                        up = true;
                        if let Ok(x) = &got {
                            ok_here |= o.sandbox == Some(*x);
                        }
                    }
                    Phase::Ready | Phase::Lost => lost = true,
                    Phase::Pending => {}
                }
            }
            let fits = match &got {
                Ok(_) => up && ok_here,
                Err(Error::SandboxGone { .. }) => !up && lost,
                Err(Error::NoActiveSandbox { .. }) => !up && !lost,
                Err(_) => false,
            };
            if !fits {
                return fail(
                    "resolve-own-sandbox",
                    format!(
                        "resolve({}) = {got:?}; its live calls: up={up} lost={lost}",
                        rec.session
                    ),
                );
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Liveness

    /// `liveness-release-completes`: every accepted release completed.
    pub fn releases_completed(&self) -> Result<(), Violation> {
        match self.awaiting_release.keys().min() {
            None => Ok(()),
            Some(call) => fail(
                "liveness-release-completes",
                format!("release of {call} never completed"),
            ),
        }
    }

    /// The live calls neither ready nor ended.
    pub fn pending(&self) -> Vec<CallId> {
        self.live
            .iter()
            .filter(|r| r.phase == Phase::Pending)
            .map(|r| r.call.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;
    use sandkeeper::{CallSpec, Command, Instant};

    fn call(n: &str) -> CallId {
        CallId::new(n).unwrap()
    }

    fn session(n: &str) -> SessionId {
        SessionId::new(n).unwrap()
    }

    fn serialize() -> Config {
        Config {
            same_key: SameKey::Serialize,
            scope: Scope::Session,
            ..Config::default()
        }
    }

    #[test]
    fn call_events_must_fit_the_live_calls() {
        let mut c = CallChecker::new(&Config::default());
        let (a, b, s) = (call("a"), call("b"), session("s"));
        let x = SandboxId(1);
        assert_eq!(check(c.ready(&a, x, true)), "call-events", "never acquired");
        assert_eq!(check(c.acquired(&a, &s, None, None)), "ok");
        assert_eq!(check(c.acquired(&a, &s, None, None)), "call-names-unique");
        assert_eq!(check(c.ready(&a, x, false)), "ready-on-live-sandbox");
        assert_eq!(check(c.ready(&a, x, true)), "call-events", "ready twice");
        assert_eq!(check(c.failed(&a)), "call-events", "failed once ready");
        assert_eq!(check(c.revoked(&b)), "call-events");
        c.acquired(&b, &s, None, None).unwrap();
        c.ready(&b, x, true).unwrap();
        assert_eq!(
            check(c.lost(&b, x, false)),
            "call-events",
            "not reported dead"
        );
        assert_eq!(
            check(c.lost(&b, SandboxId(2), true)),
            "call-events",
            "not its sandbox"
        );
        assert_eq!(check(c.lost(&b, x, true)), "ok");
        assert_eq!(check(c.release_completed(&b)), "release-completes-once");
        assert_eq!(check(c.released(&b)), "ok");
        assert_eq!(check(c.release_completed(&b)), "ok");
        assert_eq!(check(c.release_completed(&b)), "release-completes-once");
        assert_eq!(check(c.released(&b)), "release-live");
        // The CallFailed above ended `a`, however wrong it was.
        c.acquired(&a, &s, None, None).unwrap();
        c.released(&a).unwrap();
        assert_eq!(check(c.releases_completed()), "liveness-release-completes");
    }

    #[test]
    fn refusals_must_name_the_right_error() {
        let config = Config::default();
        let remembered = config.limits.remembered_ended_calls;
        let mut c = CallChecker::new(&config);
        let (a, s) = (call("a"), session("s"));
        c.acquired(&a, &s, None, None).unwrap();
        assert_eq!(
            check(c.acquire_rejected(&a, ErrorKind::DuplicateCall)),
            "ok"
        );
        assert_eq!(
            check(c.acquire_rejected(&a, ErrorKind::QueueFull)),
            "typed-errors"
        );
        assert_eq!(
            check(c.release_rejected(&a, ErrorKind::UnknownCall, false)),
            "release-live"
        );
        c.released(&a).unwrap();
        assert_eq!(
            check(c.release_rejected(&a, ErrorKind::AlreadyReleased, false)),
            "ok"
        );
        assert_eq!(
            check(c.release_rejected(&a, ErrorKind::UnknownCall, false)),
            "typed-errors"
        );
        // Once enough other calls ended, the core has forgotten `a`.
        for i in 0..remembered {
            let o = call(&format!("o{i}"));
            c.acquired(&o, &s, None, None).unwrap();
            c.released(&o).unwrap();
        }
        assert_eq!(
            check(c.release_rejected(&a, ErrorKind::UnknownCall, false)),
            "ok"
        );
    }

    #[test]
    fn serialized_waiters_are_admitted_first_in_first_out() {
        let mut c = CallChecker::new(&serialize());
        let s = session("s");
        for n in ["a", "b", "c"] {
            c.acquired(&call(n), &s, None, None).unwrap();
        }
        assert_eq!(
            check(c.ready(&call("b"), SandboxId(1), true)),
            "serialize-fifo"
        );
        let mut c = CallChecker::new(&serialize());
        for n in ["a", "b"] {
            c.acquired(&call(n), &s, None, None).unwrap();
        }
        assert_eq!(check(c.ready(&call("a"), SandboxId(1), true)), "ok");
        assert_eq!(check(c.ready(&call("b"), SandboxId(1), true)), "ok");
    }

    /// The getter checks against a real core: they agree with it when fed its events, and say
    /// so when the events they were fed disagree with what it answers.
    #[test]
    fn the_core_is_asked_where_each_call_is() {
        let mut core = Lifecycle::new(Config::default()).unwrap();
        let (a, s) = (call("a"), session("s"));
        core.acquire(Instant::ZERO, CallSpec::new(a.clone(), s.clone()))
            .unwrap();
        let Some(Command::Start { sandbox: x, .. }) = core.poll_command() else {
            panic!("no Start");
        };
        let mut c = CallChecker::new(core.config());
        c.acquired(&a, &s, None, None).unwrap();
        let no = |_| false;
        assert_eq!(check(c.check_core(&core, true, |_| true, no, no)), "ok");
        core.handle_start_ok(Instant::ZERO, x).unwrap();
        assert_eq!(
            check(c.check_core(&core, true, |_| true, no, no)),
            "binding-stable",
            "the core made the call ready, the checker was not told"
        );
        assert_eq!(
            check(c.check_core(&core, false, |_| false, no, no)),
            "ok",
            "nothing picked: nothing asked"
        );
        c.ready(&a, x, true).unwrap();
        assert_eq!(check(c.check_core(&core, true, |_| true, no, no)), "ok");
        assert_eq!(
            check(c.check_core(&core, true, |_| true, no, |_| true)),
            "no-teardown-under-live-call"
        );
        assert!(c.has_up_call(&s, no));
        assert!(!c.has_up_call(&s, |_| true));
        c.lost(&a, x, true).unwrap();
        assert_eq!(
            check(c.check_core(&core, true, |_| true, |_| true, no)),
            "binding-stable",
            "the checker was told of a loss the core was not"
        );
        assert!(!c.has_up_call(&s, no));
    }
}
