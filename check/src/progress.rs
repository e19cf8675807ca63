//! Progress: a queued call waits only while something real holds its key back.
//!
//! A call the core queues behind its key (`CallStatus::Waiting`) is admitted as soon as nothing
//! holds the key back; until then it may fail with `wait-timeout`. A core that forgets to admit
//! (misses one of the changes that lets a key's waiters in) fails its waiters exactly on time,
//! which every time bound accepts. This checker asks, after every input, what holds back each
//! key with a queued call, from what the core was told and ordered and what its getters say
//! about the key's sandboxes, never from the core's own decision to keep the calls queued. The
//! core says only how many calls are queued (`queued_calls`, then `queued_on` for the key of
//! each call that may be queued: counts its own invariants check against its calls).
//!
//! | check | what must hold |
//! |---|---|
//! | `progress` | after every input, every key with a queued call is held back by one of: a sandbox of the key on its way down with its snapshot not in yet (`sandbox_state` `stopping` or `persisting`: drained, its before hook, Stop or Persist outstanding); in fleet mode, a sandbox of the key `persisted` while a record write of the key is not answered or was answered failed, or follows a failed release (its Shutdown waits for the record to stop naming it); in fleet mode, a sandbox of the key this process relinquished and still tracks (its lost calls not released: the record may name it for adoption, which waits for it); in fleet mode, a record write of the key in flight (not answered to the core) that names warm a sandbox not up; in fleet mode, the sandbox the key's last claim named warm, still tracked here and dead or shutting down (its adoption waits until the core forgot it); a sandbox of the key whose instance was lost while it ran, still running its calls (it goes down as a suspension at its last release: [`Progress::instance_lost`]); a sandbox of the key being handed over (`handing-over`, fleet mode); under `Serialize`, a live call of the key bound to a sandbox (starting, ready, or lost with it: the key has more live calls than queued ones); in fleet mode, the key not this process's (`key_token` none) and a claim of it ordered and not answered, or answered busy or failed (made again later), or the lease not valid (`lease_valid_until`: the claim waits for it); or the key this process's and a release of it ordered and not answered (under way, or in doubt after one went unanswered; until a claim of the key) |
//! | `wait-timeout-held` | a call fails with `wait-timeout` only if its key had queued calls at the last look (held back then, by `progress`) |
//!
//! What does not hold a key back in this core: a sandbox of the key starting or running (its
//! waiters bind to it), a hook running on it (its calls are bound, starting), the limit on
//! sandboxes (`max_sandboxes` refuses an acquire; a queued call, once admitted, starts one
//! whatever the count).
//!
//! A timer that lets the key go and the call's wait timer may fire in one input (at one
//! instant, or a paused process catching up): the failure is judged by the last look, before
//! that input.

use sandkeeper::{
    CallId, ClaimId, Command, Config, ErrorKind, Input, Key, Lifecycle, RecordingId, ReleaseId,
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
    /// Fleet mode: per key, a record write due: its last one (`Some`), while it is not
    /// answered or was answered failed (it is written again later), or one that follows the
    /// store's retry after a failed release (`None`). A newer write replaces it, a confirmed or
    /// refused one clears it.
    records: Vec<(Key, Option<RecordingId>)>,
    /// The keys with queued calls at the last look (each held back then).
    queued: Vec<Key>,
    /// Fleet mode: sandboxes relinquished (the key was lost, or handed over) with their keys,
    /// while the core still tracks them (lost calls not released yet): the key's record may
    /// name one for adoption, which waits until the core forgot it.
    relinquished: Vec<(SandboxId, Key)>,
    /// Sandboxes whose running instance was lost while they were up, their workspace kept:
    /// each holds its key back until it is down (it goes down as a suspension at its last
    /// release), as a sandbox on its way down does.
    lost: Vec<SandboxId>,
    /// Fleet mode: per key, the sandbox its last claim's record named warm. While the core
    /// still tracks it and it is not up (dead, or its Shutdown not answered), the key's calls
    /// wait: the core adopts it once it forgot its old record of it.
    named: Vec<(Key, SandboxId)>,
    /// Fleet mode: the key's record writes that name a sandbox warm, not answered to the core
    /// (in flight, or in doubt after their answer was dropped): while such a sandbox is not up,
    /// the key's calls wait (a new start would take the workspace from under what the write, if
    /// it lands, names) until a write of the key is confirmed after it, or it is answered
    /// failed, or the key is claimed anew or fenced.
    naming: Vec<(Key, RecordingId, SandboxId)>,
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
            records: Vec::new(),
            relinquished: Vec::new(),
            queued: Vec::new(),
            lost: Vec::new(),
            named: Vec::new(),
            naming: Vec::new(),
        }
    }

    /// A command the core ordered.
    pub fn command(&mut self, cmd: &Command) {
        match cmd {
            Command::Start { sandbox, key, .. } | Command::Adopt { sandbox, key, .. } => {
                self.sandboxes.push((*sandbox, key.clone()));
            }
            Command::Shutdown { sandbox, .. } | Command::Relinquish { sandbox } => {
                if let Command::Relinquish { .. } = cmd {
                    let key = self.sandboxes.iter().find(|(x, _)| x == sandbox);
                    if let Some((x, key)) = key.cloned() {
                        self.relinquished.push((x, key));
                    }
                }
                self.sandboxes.retain(|(x, _)| x != sandbox);
                self.lost.retain(|x| x != sandbox);
            }
            _ => {}
        }
    }

    /// The core was told that `sandbox`'s running instance is lost while it was up and awaited
    /// nothing: it keeps its workspace and holds its key back until it is down.
    pub fn instance_lost(&mut self, sandbox: SandboxId) {
        self.lost.push(sandbox);
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
                self.naming.retain(|(k, ..)| k != key);
                self.claims.push((key.clone(), *claim));
            }
            StoreCommand::Record {
                key,
                recording,
                record,
                ..
            } => {
                self.records.retain(|(k, _)| k != key);
                self.records.push((key.clone(), Some(*recording)));
                if let Some(x) = record.warm {
                    self.naming.push((key.clone(), *recording, x));
                }
            }
            StoreCommand::Renew { .. } => {}
        }
    }

    /// An answer of the store reaches the core (fleet mode): a release answered is no longer
    /// under way (one that went unanswered before it stays in doubt); a claim answered is not
    /// either, and one answered busy or failed is made again later.
    pub fn store_answer(&mut self, input: &Input) {
        match input {
            Input::KeyReleased { release, key } | Input::ReleaseFenced { release, key } => {
                self.releases.retain(|(k, r)| !(r == release && k == key));
            }
            Input::ReleaseFailed { release, key } => {
                let before = self.releases.len();
                self.releases.retain(|(k, r)| !(r == release && k == key));
                if self.releases.len() < before && !self.records.iter().any(|(k, _)| k == key) {
                    self.records.push((key.clone(), None));
                }
            }
            Input::Claimed {
                claim, key, record, ..
            } => {
                self.claims.retain(|(k, c)| !(c == claim && k == key));
                self.named.retain(|(k, _)| k != key);
                if let Some(x) = record.warm {
                    self.named.push((key.clone(), x));
                }
            }
            // Written, or refused (the key is fenced): no record write of the key is due. A
            // failed one is written again later.
            Input::Recorded { key, recording } | Input::RecordFenced { key, recording } => {
                self.records
                    .retain(|(k, r)| !(k == key && *r == Some(*recording)));
                // Confirmed: the store keeps it over every older write. Fenced: not ours.
                let fenced = matches!(input, Input::RecordFenced { .. });
                self.naming
                    .retain(|(k, r, ..)| !(k == key && (fenced || r <= recording)));
            }
            Input::RecordFailed { key, recording } => {
                self.naming
                    .retain(|(k, r, ..)| !(k == key && r == recording));
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

    /// `CallFailed { call, error }` of a call of `key` (none: an external sandbox's).
    pub fn call_failed(
        &self,
        call: &CallId,
        key: Option<&Key>,
        error: ErrorKind,
    ) -> Result<(), Violation> {
        let queued = key.is_some_and(|key| self.queued.iter().any(|k| k == key));
        if error == ErrorKind::WaitTimeout && !queued {
            return Err(Violation::new(
                "wait-timeout-held",
                format!(
                    "{call} failed with wait-timeout, but no call of its key {key:?} was queued at the last look"
                ),
            ));
        }
        Ok(())
    }

    /// After every input: each live call as `(may_queue, key)` (`may_queue`: neither ready nor
    /// lost, and not known to be bound to a sandbox; a fleet passes every call not ready yet,
    /// as a failed adoption queues its calls again; `key`: none for an external sandbox's
    /// call). Asks the core how many calls each key with a call that may be queued has queued;
    /// for every such key, what holds it back.
    pub fn after_input<'a>(
        &mut self,
        core: &Lifecycle,
        live: impl IntoIterator<Item = (bool, Option<&'a Key>)>,
    ) -> Result<(), Violation> {
        let queued = core.queued_calls();
        if queued == 0 {
            // The usual case, at the cost of one load: no call to look for.
            self.queued.clear();
            return Ok(());
        }
        // The core forgets a suspended sandbox without a Shutdown: what it forgot goes, once
        // more are listed than it tracks (a forgotten one listed holds nothing back; it only
        // costs a look).
        if self.sandboxes.len() > core.tracked_sandboxes() {
            self.sandboxes
                .retain(|(x, _)| core.sandbox_state(*x).is_some());
        }
        if !self.relinquished.is_empty() {
            self.relinquished
                .retain(|(x, _)| core.sandbox_state(*x).is_some());
        }
        if !self.named.is_empty() {
            self.named.retain(|(_, x)| core.sandbox_state(*x).is_some());
        }
        // The keys of the calls that may be queued (under `Serialize`, of every live call),
        // each with its live calls and whether one of them may be queued: borrowed, not copied
        // (a fleet has calls queued after most of its inputs). Without `Serialize` each key is
        // judged when first seen, and the look ends once every queued call is accounted for.
        let mut keys: Vec<(&Key, usize, bool)> = Vec::new();
        let (mut found, mut listed) = (0, 0);
        for (may_queue, key) in live {
            if !may_queue && !self.serialize {
                continue;
            }
            let Some(key) = key else {
                continue;
            };
            if let Some((_, calls, may)) = keys.iter_mut().find(|(k, _, _)| *k == key) {
                *calls += 1;
                *may |= may_queue;
                continue;
            }
            keys.push((key, 1, may_queue));
            if !self.serialize {
                found += self.judge(core, key, false, &mut listed)?;
                if found == queued {
                    break;
                }
            }
        }
        if self.serialize {
            for (key, calls, may_queue) in keys {
                if may_queue {
                    // A live call of the key not queued is bound: it holds the key.
                    let waiting = core.queued_on(key);
                    found += self.judge(core, key, calls > waiting, &mut listed)?;
                    if found == queued {
                        break;
                    }
                }
            }
        }
        self.queued.truncate(listed);
        Ok(())
    }

    /// Judges `key`, which a call that may be queued has: how many calls it has queued, each
    /// held back by something real (`holder`: a live call of the key is bound, under
    /// `Serialize`). A key with queued calls is listed at `listed` in `queued`.
    fn judge(
        &mut self,
        core: &Lifecycle,
        key: &Key,
        holder: bool,
        listed: &mut usize,
    ) -> Result<usize, Violation> {
        let waiting = core.queued_on(key);
        if waiting == 0 {
            return Ok(0);
        }
        if !holder && !self.held(core, key) {
            self.queued.truncate(*listed);
            return Err(Violation::new("progress", self.explain(core, key, waiting)));
        }
        if self.queued.get(*listed) != Some(key) {
            self.queued.truncate(*listed);
            self.queued.push(key.clone());
        }
        *listed += 1;
        Ok(waiting)
    }

    /// Whether something real holds `key` back.
    fn held(&self, core: &Lifecycle, key: &Key) -> bool {
        // The store's reasons first: in a fleet most queued calls wait for their key's claim.
        if self.not_ours(core, key) {
            return true;
        }
        // Fleet: a sandbox of the key this process relinquished and still tracks (its lost
        // calls not released): the key's record may name it, and its adoption waits for it.
        if self.relinquished.iter().any(|(_, k)| k == key) {
            return true;
        }
        // Fleet: the sandbox the key's claim named warm, still tracked here and not up (dead,
        // or shutting down): its adoption waits until the core forgot it.
        let not_up = |x: &SandboxId| {
            matches!(
                core.sandbox_state(*x),
                Some(SandboxState::Dead | SandboxState::ShuttingDown)
            )
        };
        if self.named.iter().any(|(k, x)| k == key && not_up(x)) {
            return true;
        }
        // Fleet: a record write in flight names a sandbox of the key that is not up.
        let up = |x: &SandboxId| {
            core.sandbox_state(*x)
                .is_some_and(SandboxState::accepts_uploads)
        };
        if self.naming.iter().any(|(k, _, x)| k == key && !up(x)) {
            return true;
        }
        self.sandboxes.iter().any(|(x, k)| {
            k == key
                && match core.sandbox_state(*x) {
                    Some(
                        SandboxState::Stopping
                        | SandboxState::Persisting
                        | SandboxState::HandingOver,
                    ) => true,
                    Some(SandboxState::Running) => self.lost.contains(x),
                    Some(SandboxState::Persisted) => self.records.iter().any(|(k, _)| k == key),
                    _ => false,
                }
        })
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
    fn explain(&self, core: &Lifecycle, key: &Key, waiting: usize) -> String {
        let sandboxes: Vec<String> = self
            .sandboxes
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(x, _)| format!("{x} {:?}", core.sandbox_state(*x)))
            .collect();
        let mut detail = format!(
            "{waiting} call(s) wait for key {key}, and nothing holds the key back: its sandboxes [{}]",
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
    use sandkeeper::{CallSpec, CallStatus, Instant, ReleasePolicy, Scope, SessionId};

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
        let live = || [(true, Some(&key))];
        assert_eq!(
            check(p.after_input(&core, live())),
            "ok",
            "held by {x}, stopping"
        );
        assert_eq!(check(blind.after_input(&core, live())), "progress");
        assert_eq!(
            check(p.call_failed(&b, Some(&key), ErrorKind::WaitTimeout)),
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
            check(p.call_failed(&b, Some(&key), ErrorKind::WaitTimeout)),
            "wait-timeout-held",
            "b is starting, no longer queued"
        );
        assert_eq!(
            check(p.call_failed(&b, Some(&key), ErrorKind::StartTimeout)),
            "ok"
        );
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
                handover: sandkeeper::Handover::Warm,
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
        let live = || [(true, Some(&key))];
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
