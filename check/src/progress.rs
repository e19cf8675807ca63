//! Progress: a queued call waits only while something real holds its key back.
//!
//! A call the core queues behind its key (`CallStatus::Waiting`) is admitted as soon as nothing
//! holds the key back; until then it may fail with `wait-timeout`. A core that forgets to admit
//! (misses one of the changes that lets a key's waiters in) fails its waiters exactly on time,
//! which every time bound accepts. This checker asks, after every input, what holds back each
//! key with a queued call, from what the core was told and ordered and what its getters say
//! about the key's sandboxes, never from the core's own decision to keep the call queued. (It
//! looks only while `queued_calls` counts a queued call, a count the core's own invariants
//! check against its calls.)
//!
//! | check | what must hold |
//! |---|---|
//! | `progress` | after every input, every key with a queued call is held back by one of: a sandbox of the key on its way down with its snapshot not in yet (`sandbox_state` `stopping` or `persisting`: drained, its before hook, Stop or Persist outstanding); a sandbox of the key being handed over (`handing-over`, fleet mode); under `Serialize`, a live call of the key bound to a sandbox (starting, ready, or lost with it); in fleet mode, the key not this process's (`key_token` none) and a claim of it ordered and not answered, or answered busy or failed (made again later), or the lease not valid (`lease_valid_until`: the claim waits for it); or the key this process's and a release of it ordered and not answered (under way, or in doubt after one went unanswered; until a claim of the key) |
//! | `wait-timeout-held` | a call fails with `wait-timeout` only if it was queued at the last look (when its key was held back, by `progress`) |
//!
//! What does not hold a key back in this core: a sandbox of the key starting or running (its
//! waiters bind to it), a hook running on it (its calls are bound, starting), the limit on
//! sandboxes (`max_sandboxes` refuses an acquire; a queued call, once admitted, starts one
//! whatever the count).
//!
//! A timer that lets the key go and the call's wait timer may fire in one input (at one
//! instant, or a paused process catching up): the failure is judged by the last look, before
//! that input.

use std::borrow::Borrow;

use sandkeeper::{
    CallId, CallStatus, ClaimId, Command, Config, ErrorKind, Input, Key, Lifecycle, ReleaseId,
    SameKey, SandboxId, SandboxState, StoreCommand,
};

use crate::violation::Violation;

/// The progress checker. See the module docs.
#[derive(Clone, Debug)]
pub struct Progress {
    serialize: bool,
    fleet: bool,
    /// The managed sandboxes the core started or adopted and has not let go (Shutdown,
    /// Relinquish) or forgotten, with their keys.
    sandboxes: Vec<(SandboxId, Key)>,
    /// Fleet mode: releases ordered and not answered, per key (cleared by a claim of the key).
    releases: Vec<(Key, ReleaseId)>,
    /// Fleet mode: claims ordered and not answered, per key (cleared by the next claim).
    claims: Vec<(Key, ClaimId)>,
    /// Fleet mode: keys whose last claim was answered busy or failed: it is made again later.
    busy: Vec<Key>,
    /// The calls queued at the last look, with their keys.
    waiting: Vec<(CallId, Key)>,
    /// Under `Serialize`, the keys a live call holds (a reused buffer).
    holders: Vec<Key>,
}

impl Progress {
    /// A checker for a core with `config`.
    pub fn new(config: &Config) -> Self {
        Progress {
            serialize: config.same_key == SameKey::Serialize,
            fleet: config.fleet.is_some(),
            sandboxes: Vec::new(),
            releases: Vec::new(),
            claims: Vec::new(),
            busy: Vec::new(),
            waiting: Vec::new(),
            holders: Vec::new(),
        }
    }

    /// A command the core ordered.
    pub fn command(&mut self, cmd: &Command) {
        match cmd {
            Command::Start { sandbox, key, .. } | Command::Adopt { sandbox, key, .. } => {
                self.sandboxes.push((*sandbox, key.clone()));
            }
            Command::Shutdown { sandbox, .. } | Command::Relinquish { sandbox } => {
                self.sandboxes.retain(|(x, _)| x != sandbox);
            }
            _ => {}
        }
    }

    /// Store work the core ordered (fleet mode).
    pub fn store_command(&mut self, cmd: &StoreCommand) {
        match cmd {
            StoreCommand::Release { release, key, .. } => {
                self.releases.push((key.clone(), *release));
            }
            // The core claims a key only once it is no longer this process's: whatever it
            // released of it before is over, and so is an earlier claim.
            StoreCommand::Claim { claim, key, .. } => {
                self.releases.retain(|(k, _)| k != key);
                self.claims.retain(|(k, _)| k != key);
                self.busy.retain(|k| k != key);
                self.claims.push((key.clone(), *claim));
            }
            StoreCommand::Renew { .. } | StoreCommand::Record { .. } => {}
        }
    }

    /// An answer of the store reaches the core (fleet mode): a release answered is no longer
    /// under way (one that went unanswered before it stays in doubt); a claim answered is not
    /// either, and one answered busy or failed is made again later.
    pub fn store_answer(&mut self, input: &Input) {
        match input {
            Input::KeyReleased { release, key }
            | Input::ReleaseFailed { release, key }
            | Input::ReleaseFenced { release, key } => {
                self.releases.retain(|(k, r)| !(r == release && k == key));
            }
            Input::Claimed { claim, key, .. } => {
                self.claims.retain(|(k, c)| !(c == claim && k == key));
            }
            Input::ClaimBusy { claim, key } | Input::ClaimFailed { claim, key } => {
                let before = self.claims.len();
                self.claims.retain(|(k, c)| !(c == claim && k == key));
                if self.claims.len() < before {
                    self.busy.push(key.clone());
                }
            }
            _ => {}
        }
    }

    /// `CallFailed { call, error }`.
    pub fn call_failed(&self, call: &CallId, error: ErrorKind) -> Result<(), Violation> {
        if error == ErrorKind::WaitTimeout && !self.waiting.iter().any(|(c, _)| c == call) {
            return Err(Violation::new(
                "wait-timeout-held",
                format!("{call} failed with wait-timeout, but it was not queued at the last look"),
            ));
        }
        Ok(())
    }

    /// After every input: each live call as `(call, may_queue, key)` (`may_queue`: neither
    /// ready nor lost, and not known to be bound to a sandbox; a fleet passes every call not
    /// ready yet, as a failed adoption queues its calls again; `key`: none for an external
    /// sandbox's call). Asks the core where each call that may be queued is; for every key with
    /// a queued call, what holds it back.
    pub fn after_input<'a, K: Borrow<Key>>(
        &mut self,
        core: &Lifecycle,
        live: impl IntoIterator<Item = (&'a CallId, bool, Option<K>)>,
    ) -> Result<(), Violation> {
        self.waiting.clear();
        let queued = core.queued_calls();
        if queued == 0 {
            // The usual case, at the cost of one load: no call to look for.
            return Ok(());
        }
        self.holders.clear();
        for (call, may_queue, key) in live {
            let Some(key) = key else {
                continue;
            };
            let status = if may_queue {
                core.call_status(call)
            } else {
                None
            };
            match status {
                Some(CallStatus::Waiting) => {
                    self.waiting.push((call.clone(), key.borrow().clone()));
                    if !self.serialize && self.waiting.len() == queued {
                        // Every queued call found (the rest are not holders but under
                        // `Serialize`).
                        break;
                    }
                }
                _ if self.serialize => self.holders.push(key.borrow().clone()),
                _ => {}
            }
        }
        if self.waiting.is_empty() {
            return Ok(());
        }
        // The core forgets a suspended sandbox without a Shutdown.
        self.sandboxes
            .retain(|(x, _)| core.sandbox_state(*x).is_some());
        for (i, (call, key)) in self.waiting.iter().enumerate() {
            if self.waiting[..i].iter().any(|(_, k)| k == key) || self.held(core, key) {
                continue;
            }
            return Err(Violation::new("progress", self.explain(core, call, key)));
        }
        Ok(())
    }

    /// Whether something real holds `key` back.
    fn held(&self, core: &Lifecycle, key: &Key) -> bool {
        let way_down = self.sandboxes.iter().any(|(x, k)| {
            k == key
                && matches!(
                    core.sandbox_state(*x),
                    Some(
                        SandboxState::Stopping
                            | SandboxState::Persisting
                            | SandboxState::HandingOver
                    )
                )
        });
        way_down || self.holders.iter().any(|k| k == key) || self.not_ours(core, key)
    }

    /// Fleet mode: whether `key` is not this process's to bind: not owned, and a claim of it
    /// under way, made again later, or waiting for the lease to be valid; or owned, with a
    /// release of it under way or in doubt.
    fn not_ours(&self, core: &Lifecycle, key: &Key) -> bool {
        if !self.fleet || matches!(key, Key::Call(_) | Key::External(_)) {
            return false;
        }
        match core.key_token(key) {
            Some(_) => self.releases.iter().any(|(k, _)| k == key),
            None => {
                let lease_valid = core.lease_valid_until().is_some_and(|t| core.now() < t);
                !lease_valid
                    || self.claims.iter().any(|(k, _)| k == key)
                    || self.busy.iter().any(|k| k == key)
            }
        }
    }

    #[cold]
    fn explain(&self, core: &Lifecycle, call: &CallId, key: &Key) -> String {
        let sandboxes: Vec<String> = self
            .sandboxes
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(x, _)| format!("{x} {:?}", core.sandbox_state(*x)))
            .collect();
        let mut detail = format!(
            "{call} waits for key {key}, and nothing holds the key back: its sandboxes [{}]",
            sandboxes.join(", ")
        );
        if self.serialize {
            detail.push_str(", no live call of it bound (same-key=serialize)");
        }
        if self.fleet {
            detail.push_str(&format!(
                ", owned under {:?}, no claim or release under way, the lease valid until {:?} (now {:?})",
                core.key_token(key),
                core.lease_valid_until(),
                core.now()
            ));
        }
        detail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;
    use sandkeeper::{CallSpec, Instant, ReleasePolicy, Scope, SessionId};

    fn suspend() -> Config {
        Config {
            scope: Scope::Session,
            release: ReleasePolicy::Suspend,
            ..Config::default()
        }
    }

    /// Drains the core, telling the checkers of its commands; the commands.
    fn drain(core: &mut Lifecycle, checkers: &mut [&mut Progress]) -> Vec<Command> {
        let mut cmds = Vec::new();
        while let Some(c) = core.poll_command() {
            for p in checkers.iter_mut() {
                p.command(&c);
            }
            cmds.push(c);
        }
        while core.poll_event().is_some() {}
        cmds
    }

    /// Against a real core: a call queued behind its key's previous sandbox, which is being
    /// suspended, is held by it while it stops and persists; once it is suspended the call is
    /// admitted. A checker that was never told of that sandbox sees nothing holding the call
    /// back: `progress`, as when a core keeps a call queued with nothing in its way.
    #[test]
    fn a_queued_call_is_held_by_its_keys_sandbox_on_the_way_down() {
        let config = suspend();
        let mut core = Lifecycle::new(config.clone()).unwrap();
        let (mut p, mut blind) = (Progress::new(&config), Progress::new(&config));
        let s = SessionId::new("s").unwrap();
        let key = Key::Session(s.clone());
        let t = Instant::ZERO;
        let (a, b) = (CallId::new("a").unwrap(), CallId::new("b").unwrap());
        core.acquire(t, CallSpec::new(a.clone(), s.clone()))
            .unwrap();
        let Some(Command::Start { sandbox: x, .. }) = drain(&mut core, &mut [&mut p]).pop() else {
            panic!("no Start");
        };
        core.handle_start_ok(t, x).unwrap();
        drain(&mut core, &mut [&mut p, &mut blind]);
        core.release(t, &a).unwrap();
        let cmds = drain(&mut core, &mut [&mut p, &mut blind]);
        assert!(
            cmds.iter().any(|c| matches!(c, Command::Stop { .. })),
            "{cmds:?}"
        );
        core.acquire(t, CallSpec::new(b.clone(), s.clone()))
            .unwrap();
        drain(&mut core, &mut [&mut p, &mut blind]);
        assert_eq!(core.call_status(&b), Some(CallStatus::Waiting));
        let live = || [(&b, true, Some(&key))];
        assert_eq!(
            check(p.after_input(&core, live())),
            "ok",
            "held by {x}, stopping"
        );
        assert_eq!(check(blind.after_input(&core, live())), "progress");
        assert_eq!(
            check(p.call_failed(&b, ErrorKind::WaitTimeout)),
            "ok",
            "queued"
        );
        core.handle_stop_ok(t, x, None).unwrap();
        drain(&mut core, &mut [&mut p]);
        assert_eq!(
            check(p.after_input(&core, live())),
            "ok",
            "held by {x}, persisting"
        );
        core.handle_persist_ok(t, x).unwrap();
        let cmds = drain(&mut core, &mut [&mut p]);
        assert!(
            cmds.iter().any(|c| matches!(c, Command::Start { .. })),
            "b admitted: {cmds:?}"
        );
        assert_eq!(check(p.after_input(&core, live())), "ok");
        assert_eq!(
            check(p.call_failed(&b, ErrorKind::WaitTimeout)),
            "wait-timeout-held",
            "b is starting, no longer queued"
        );
        assert_eq!(check(p.call_failed(&b, ErrorKind::StartTimeout)), "ok");
    }

    /// Fleet mode: a call of a key this process does not own is held while the lease is not
    /// valid (the claim waits for it), then by its claim, then by the claim answered busy (made
    /// again later). A checker that was never told of the claim sees nothing holding the call
    /// back once the lease is valid: `progress`, as when a core leaves a key's waiters
    /// unclaimed.
    #[test]
    fn a_queued_call_of_a_fleet_key_is_held_by_its_claim() {
        use sandkeeper::Fleet;
        use std::time::Duration;
        let config = Config {
            scope: Scope::Session,
            fleet: Some(Fleet {
                incarnation: 1,
                lease: Duration::from_secs(10),
                renew_every: Duration::from_secs(3),
                margin: Duration::from_secs(2),
                claim_retry: Duration::from_millis(500),
            }),
            ..Config::default()
        };
        let mut core = Lifecycle::new(config.clone()).unwrap();
        let (mut p, mut blind) = (Progress::new(&config), Progress::new(&config));
        let store = |core: &mut Lifecycle, p: &mut Progress| {
            let mut work = Vec::new();
            while let Some(w) = core.poll_store() {
                p.store_command(&w);
                work.push(w);
            }
            while core.poll_command().is_some() {}
            while core.poll_event().is_some() {}
            work
        };
        let s = SessionId::new("s").unwrap();
        let key = Key::Session(s.clone());
        let a = CallId::new("a").unwrap();
        let t = Instant::ZERO;
        core.handle_timeout(t).unwrap();
        let work = store(&mut core, &mut p);
        let Some(StoreCommand::Renew { renewal, .. }) = work.first().cloned() else {
            panic!("no renewal: {work:?}");
        };
        core.acquire(t, CallSpec::new(a.clone(), s.clone()))
            .unwrap();
        assert!(
            store(&mut core, &mut p).is_empty(),
            "no claim before the lease"
        );
        let live = || [(&a, true, Some(&key))];
        assert_eq!(
            check(p.after_input(&core, live())),
            "ok",
            "the lease is not valid"
        );
        core.handle_renewed(t, renewal, &[]).unwrap();
        let work = store(&mut core, &mut p);
        let Some(StoreCommand::Claim { claim, .. }) = work.first().cloned() else {
            panic!("no claim: {work:?}");
        };
        assert_eq!(check(p.after_input(&core, live())), "ok", "claiming");
        assert_eq!(check(blind.after_input(&core, live())), "progress");
        let busy = Input::ClaimBusy {
            claim,
            key: key.clone(),
        };
        p.store_answer(&busy);
        core.handle(t, busy).unwrap();
        store(&mut core, &mut p);
        assert_eq!(
            check(p.after_input(&core, live())),
            "ok",
            "busy: claimed again later"
        );
    }
}
