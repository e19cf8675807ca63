//! The random world: the application (sessions, users, calls, flushes, holds, resolves,
//! cancellations, close) and the backend's fates (latency, failures, hangs, deaths, late and
//! duplicate answers), all drawn from one seed.

use std::time::Duration;

use sandkeeper::{CallId, ExternalId, PathName, SessionId, UserId, WayDown};

use crate::backend::{Fate, Op};
use crate::harness::Harness;
use crate::rng::{Rng, Weights};
use crate::step::{Answer, OpKind, Step};
use crate::swarm::Swarm;

/// What the world does next.
#[derive(Clone, Debug)]
pub enum Move {
    /// A step a scenario can spell.
    Step(Step),
    /// A backend answer a scenario cannot spell (late answer to a cancelled upload, a duplicate
    /// answer): given straight to the harness.
    Raw(Answer, Op, String),
}

/// The random application and backend.
pub struct World {
    rng: Rng,
    /// The swarm configuration (its step weights are read once, when the world is made).
    pub swarm: Swarm,
    /// `swarm.weights`, ready to draw from.
    weights: Weights<10>,
    sessions: Vec<SessionId>,
    users: Vec<UserId>,
    externals: Vec<ExternalId>,
    paths: Vec<Option<PathName>>,
    next_call: u64,
    next_snapshot: u64,
    ended: Vec<CallId>,
    /// Holds the application took and has not let go, per session index.
    holds: Vec<u32>,
    /// Whether the application also enters its sessions' sandboxes for work (`enter` and
    /// `leave`, in place of some holds and unholds). Off by default, so the default seeds'
    /// runs are unchanged.
    operations: bool,
    /// Work entered and not yet left, per session index.
    entered: Vec<u32>,
    /// Random steps made.
    pub made: usize,
    closed_steps: usize,
}

/// The name `prefix` followed by `n` (`s0`, `u1`, ...), made with `make`.
fn name<T>(make: impl Fn(&str) -> Result<T, sandkeeper::InvalidName>, prefix: u8, n: u64) -> T {
    make(numbered(prefix, n, &mut [0; 21])).expect("simulator names are valid")
}

/// `prefix` followed by `n` in decimal (a call name), written into `buf`: no allocation per
/// acquire (a call's name is kept inline in the name itself).
fn numbered(prefix: u8, n: u64, buf: &mut [u8; 21]) -> &str {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    i -= 1;
    buf[i] = prefix;
    std::str::from_utf8(&buf[i..]).expect("ASCII")
}

impl World {
    /// The world of `seed`.
    pub fn new(seed: u64, swarm: Swarm) -> Self {
        let sessions = (0..swarm.sessions)
            .map(|i| name(|t| SessionId::new(t), b's', i.into()))
            .collect();
        let users = (0..swarm.users)
            .map(|i| name(|t| UserId::new(t), b'u', i.into()))
            .collect();
        let externals = (0..swarm.externals)
            .map(|i| name(|t| ExternalId::new(t), b'e', i.into()))
            .collect();
        let mut paths = vec![None];
        for i in 1..swarm.paths {
            paths.push(Some(name(|t| PathName::new(t), b'p', i.into())));
        }
        let holds = vec![0; swarm.sessions as usize];
        let entered = vec![0; swarm.sessions as usize];
        World {
            operations: false,
            entered,
            rng: Rng::new(seed),
            weights: Weights::new(swarm.weights),
            swarm,
            sessions,
            users,
            externals,
            paths,
            next_call: 0,
            next_snapshot: 0,
            ended: Vec::new(),
            holds,
            made: 0,
            closed_steps: 0,
        }
    }

    /// Whether the random phase is over.
    pub fn done(&self, h: &Harness) -> bool {
        self.made >= self.swarm.steps || (h.history.closed() && self.closed_steps >= 4)
    }

    /// Plans the fate of every command the core ordered since the last call.
    pub fn plan(&mut self, h: &mut Harness) {
        let now = h.now_ms;
        let s = &self.swarm;
        // Commands are only appended to the ledger and taken out of it in order, and every
        // call plans all of them: the unplanned ones are the newest (no need to look at all).
        let ops = &mut h.ledger.ops;
        let first = ops.iter().rposition(|o| o.planned).map_or(0, |i| i + 1);
        debug_assert!(ops[..first].iter().all(|o| o.planned));
        for op in &mut ops[first..] {
            op.planned = true;
            let r = &mut self.rng;
            let (fail, hang, gone) = match op.kind {
                OpKind::Start => (s.start_fail, s.start_hang, 0),
                OpKind::Upload => (s.upload_fail, s.upload_hang, s.upload_gone),
                OpKind::Stop => (s.stop_fail, s.command_hang, 0),
                OpKind::Persist => (s.persist_fail, s.command_hang, 0),
                OpKind::Shutdown => (s.shutdown_fail, s.command_hang, 0),
                OpKind::Hook => (s.hook_fail, s.hook_hang, 0),
                OpKind::Relinquish => {
                    unreachable!("a Relinquish wants no answer: never outstanding")
                }
            };
            op.fate = if r.chance(gone) {
                Fate::Gone
            } else if r.chance(fail) {
                Fate::Fail
            } else {
                Fate::Ok
            };
            op.due = if r.chance(hang) {
                u64::MAX
            } else {
                now + r.range(0, s.latency_ms)
            };
        }
        // Cancelled uploads the driver abandons rather than answering late.
        if !h.ledger.zombies.is_empty() {
            let late = self.swarm.late_answer;
            let rng = &mut self.rng;
            h.ledger.zombies.retain(|_| rng.chance(late));
            if h.ledger.zombies.len() > 8 {
                h.ledger.zombies.remove(0);
            }
        }
    }

    /// The next move.
    pub fn next(&mut self, h: &Harness) -> Move {
        self.made += 1;
        if h.history.closed() {
            self.closed_steps += 1;
            return self.after_close(h);
        }
        if self.swarm.close_at == Some(self.made) && !h.core.is_closing() {
            return Move::Step(Step::Close(Some(self.swarm.close_deadline)));
        }
        for _ in 0..8 {
            let Some(i) = self.rng.weighted(&self.weights) else {
                break;
            };
            let m = match i {
                0 => self.acquire(h),
                1 => self.release(h),
                2 => Some(self.flush(h)),
                3 => self.resolve(h),
                4 if self.operations && self.rng.chance(500) => self.enter(h),
                4 => self.hold(h),
                5 if self.operations && self.rng.chance(500) => self.leave(),
                5 => self.unhold(),
                6 => self.answer(h),
                7 if self.rng.chance(100) => self.late_loss(h),
                7 => self.die(h),
                8 => Some(self.advance(h)),
                _ => self.misuse(h),
            };
            if let Some(m) = m {
                return m;
            }
        }
        self.advance(h)
    }

    fn after_close(&mut self, h: &Harness) -> Move {
        match self.rng.below(4) {
            0 => self.acquire(h).unwrap_or_else(|| self.advance(h)),
            1 => self.flush(h),
            2 => self.advance(h),
            _ => self.answer(h).unwrap_or_else(|| self.advance(h)),
        }
    }

    fn session(&mut self) -> usize {
        self.rng.index(self.sessions.len())
    }

    fn live_session(&mut self, h: &Harness) -> SessionId {
        if !h.history.calls.live().is_empty() && self.rng.chance(700) {
            let rec = h
                .history
                .calls
                .live()
                .at(self.rng.index(h.history.calls.live().len()));
            return rec.session.clone();
        }
        let i = self.session();
        self.sessions[i].clone()
    }

    fn acquire(&mut self, h: &Harness) -> Option<Move> {
        if h.history.calls.live().len() >= self.swarm.max_live && !h.history.closed() {
            return None;
        }
        let call = CallId::new(numbered(b'c', self.next_call, &mut [0; 21]))
            .expect("simulator names are valid");
        self.next_call += 1;
        let si = self.session();
        let session = self.sessions[si].clone();
        let user = Some(self.users[si % self.users.len()].clone());
        let external = if !self.externals.is_empty() && self.rng.chance(self.swarm.external_rate) {
            Some(self.externals[self.rng.index(self.externals.len())].clone())
        } else {
            None
        };
        Some(Move::Step(Step::Acquire {
            call,
            session,
            user,
            external,
        }))
    }

    /// A live call chosen at random (one draw). There must be one.
    fn any_live_call(&mut self, h: &Harness) -> CallId {
        h.history
            .calls
            .live()
            .at(self.rng.index(h.history.calls.live().len()))
            .call
            .clone()
    }

    fn release(&mut self, h: &Harness) -> Option<Move> {
        // Now and then the application drops what a key keeps (a kill of a paused sandbox), or
        // tries to while the key is in use.
        if self.rng.chance(30) {
            let kept: Vec<_> = h.history.keys_keeping_snapshots().cloned().collect();
            if !kept.is_empty() {
                let key = kept[self.rng.index(kept.len())].clone();
                return Some(Move::Step(Step::DropSnapshot(key)));
            }
        }
        if h.history.calls.live().is_empty() {
            return None;
        }
        let call = self.any_live_call(h);
        self.ended.push(call.clone());
        if self.ended.len() > 16 {
            self.ended.remove(0);
        }
        // One release in eight asks its sandbox's way down (an application's pause or kill).
        if self.rng.chance(125) {
            let way = if self.rng.chance(500) {
                WayDown::Suspend
            } else {
                WayDown::Shutdown
            };
            return Some(Move::Step(Step::ReleaseAs(call, way)));
        }
        Some(Move::Step(Step::Release(call)))
    }

    fn flush(&mut self, h: &Harness) -> Move {
        let session = self.live_session(h);
        let path = self.paths[self.rng.index(self.paths.len())].clone();
        let bytes = self.rng.range(0, 64) as usize;
        Move::Step(Step::Flush {
            session,
            path,
            bytes,
        })
    }

    fn resolve(&mut self, h: &Harness) -> Option<Move> {
        let session = self.live_session(h);
        // The expectation is filled in with what the core answers (the history checks it).
        Some(Move::Step(Step::Resolve(
            session,
            crate::step::ResolveExpect::None,
        )))
    }

    fn hold(&mut self, h: &Harness) -> Option<Move> {
        let session = self.live_session(h);
        let i = self.sessions.iter().position(|s| *s == session)?;
        self.holds[i] += 1;
        Some(Move::Step(Step::Hold(session)))
    }

    fn unhold(&mut self) -> Option<Move> {
        let i = take_one(&mut self.holds, &mut self.rng)?;
        Some(Move::Step(Step::Unhold(self.sessions[i].clone())))
    }

    /// Turns on the application's own work in its sessions' sandboxes (`enter`, `leave`).
    pub fn with_operations(mut self, on: bool) -> Self {
        self.operations = on;
        self
    }

    fn enter(&mut self, h: &Harness) -> Option<Move> {
        let session = self.live_session(h);
        let i = self.sessions.iter().position(|s| *s == session)?;
        self.entered[i] += 1;
        Some(Move::Step(Step::Enter(session)))
    }

    fn leave(&mut self) -> Option<Move> {
        let i = take_one(&mut self.entered, &mut self.rng)?;
        Some(Move::Step(Step::Leave(self.sessions[i].clone())))
    }

    /// Corrects the application's count of entered work after an `enter` the core refused.
    pub fn enter_refused(&mut self, session: &SessionId) {
        uncount(&mut self.entered, &self.sessions, session);
    }

    /// Sessions with work still entered, with their counts (for the liveness phase).
    pub fn take_entered(&mut self) -> Vec<(SessionId, u32)> {
        take_all(&mut self.entered, &self.sessions)
    }

    /// Corrects the application's hold count after a hold the core refused.
    pub fn hold_refused(&mut self, session: &SessionId) {
        uncount(&mut self.holds, &self.sessions, session);
    }

    /// Sessions still holding, with their counts (for the liveness phase).
    pub fn take_holds(&mut self) -> Vec<(SessionId, u32)> {
        take_all(&mut self.holds, &self.sessions)
    }

    fn answer(&mut self, h: &Harness) -> Option<Move> {
        let now = h.now_ms;
        if !h.ledger.zombies.is_empty() && self.rng.chance(200) {
            let op = h.ledger.zombies[self.rng.index(h.ledger.zombies.len())].clone();
            let a = if self.rng.chance(500) {
                Answer::UploadOk
            } else {
                Answer::UploadFail { gone: false }
            };
            return Some(Move::Raw(a, op, "late answer to a cancelled upload".into()));
        }
        if !h.ledger.answered.is_empty() && self.rng.chance(self.swarm.duplicate) {
            let op = h.ledger.answered[self.rng.index(h.ledger.answered.len())].clone();
            let a = self.answer_for(&op, h.stop_takes_snapshot(op.sandbox));
            return Some(Move::Raw(a, op, "duplicate answer".into()));
        }
        // The k-th due command, k drawn among those due (counted, not collected).
        let due = h.ledger.ops.iter().filter(|o| o.due <= now).count();
        if due == 0 {
            return None;
        }
        let k = self.rng.index(due);
        let mut op = h
            .ledger
            .ops
            .iter()
            .filter(|o| o.due <= now)
            .nth(k)
            .cloned()
            .expect("k is below the count of due commands");
        if op.kind == OpKind::Upload && !h.ledger.is_oldest_upload(&op) {
            // Scenario files answer a sandbox's uploads oldest first; so does the world.
            op = h
                .ledger
                .ops
                .iter()
                .find(|o| o.kind == OpKind::Upload && o.sandbox == op.sandbox)
                .cloned()
                .expect("an upload of that sandbox");
        }
        let answer = self.answer_for(&op, h.stop_takes_snapshot(op.sandbox));
        match h
            .history
            .sandboxes
            .get(&op.sandbox)
            .and_then(|s| s.call.clone())
        {
            Some(call) => Some(Move::Step(Step::Answer(answer, call))),
            None => Some(Move::Raw(
                answer,
                op,
                "answer to a sandbox no call names".into(),
            )),
        }
    }

    /// The answer `op`'s planned fate gives; a Stop that must take a snapshot
    /// ([`Harness::stop_takes_snapshot`]) takes one.
    fn answer_for(&mut self, op: &Op, snapshot_needed: bool) -> Answer {
        match (op.kind, op.fate) {
            (OpKind::Start, Fate::Ok) => Answer::StartOk,
            (OpKind::Start, _) => Answer::StartFail,
            (OpKind::Upload, Fate::Ok) => Answer::UploadOk,
            (OpKind::Upload, Fate::Fail) => Answer::UploadFail { gone: false },
            (OpKind::Upload, Fate::Gone) => Answer::UploadFail { gone: true },
            (OpKind::Stop, Fate::Ok) => {
                let taken = self.rng.chance(self.swarm.snapshot) || snapshot_needed;
                let snapshot = taken.then(|| {
                    self.next_snapshot += 1;
                    sandkeeper::Snapshot::new(format!("snap{}", self.next_snapshot))
                });
                Answer::StopOk { snapshot }
            }
            (OpKind::Stop, _) => Answer::StopFail,
            (OpKind::Persist, Fate::Ok) => Answer::PersistOk,
            (OpKind::Persist, _) => Answer::PersistFail,
            (OpKind::Shutdown, Fate::Ok) => Answer::ShutdownOk,
            (OpKind::Shutdown, _) => Answer::ShutdownFail,
            (OpKind::Hook, Fate::Ok) => Answer::HookOk,
            (OpKind::Hook, _) => Answer::HookFail,
            (OpKind::Relinquish, _) => {
                unreachable!("a Relinquish wants no answer: never outstanding")
            }
        }
    }

    fn die(&mut self, h: &Harness) -> Option<Move> {
        // Candidates: every outstanding command's sandbox, then every bound live call's (counted
        // and indexed, not collected).
        let bound = || h.history.calls.live().iter().filter_map(|r| r.sandbox);
        let n = h.ledger.ops.len() + bound().count();
        if n == 0 {
            return None;
        }
        let k = self.rng.index(n);
        let x = match h.ledger.ops.get(k) {
            Some(op) => op.sandbox,
            None => bound()
                .nth(k - h.ledger.ops.len())
                .expect("k is below the count of candidates"),
        };
        let call = h.history.sandboxes.get(&x).and_then(|s| s.call.clone())?;
        // A backend that reports what it saw: a pod (the instance) or the claim (everything).
        let answer = if self.rng.chance(400) {
            Answer::InstanceGone
        } else {
            Answer::Die
        };
        Some(Move::Step(Step::Answer(answer, call)))
    }

    /// A late report about a suspended sandbox whose key resumed it as another: the watch of a
    /// real backend delivers the old pod's Delete after the resume.
    fn late_loss(&mut self, h: &Harness) -> Option<Move> {
        let resumed = &h.history.resumed;
        if resumed.is_empty() {
            return None;
        }
        let x = resumed[self.rng.index(resumed.len())];
        let call = h.history.sandboxes.get(&x).and_then(|s| s.call.clone())?;
        let answer = if self.rng.chance(700) {
            Answer::InstanceGone
        } else {
            Answer::Die
        };
        Some(Move::Step(Step::Answer(answer, call)))
    }

    fn advance(&mut self, h: &Harness) -> Move {
        let now = h.now_ms;
        let next_due = h
            .ledger
            .ops
            .iter()
            .map(|o| o.due)
            .filter(|d| *d > now && *d != u64::MAX)
            .min();
        let next_timer = h
            .core
            .poll_timeout()
            .map(|t| t.as_nanos().div_ceil(1_000_000))
            .filter(|t| *t > now);
        let target = match (next_due, next_timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let d = match target {
            Some(t) if self.rng.chance(600) => t - now,
            _ => self.rng.range(1, self.swarm.jump_ms),
        };
        Move::Step(Step::Advance(Duration::from_millis(d.max(1))))
    }

    fn misuse(&mut self, h: &Harness) -> Option<Move> {
        match self.rng.below(3) {
            0 if !h.history.calls.live().is_empty() => {
                let call = self.any_live_call(h);
                let si = self.session();
                let session = self.sessions[si].clone();
                Some(Move::Step(Step::Acquire {
                    call,
                    session,
                    user: Some(self.users[0].clone()),
                    external: None,
                }))
            }
            1 if !self.ended.is_empty() => {
                let call = self.ended[self.rng.index(self.ended.len())].clone();
                if h.history.calls.live().contains(&call) {
                    return None;
                }
                Some(Move::Step(Step::Release(call)))
            }
            _ => {
                let si = self.session();
                let session = self.sessions[si].clone();
                let i = self.sessions.iter().position(|s| *s == session)?;
                if self.holds[i] > 0 {
                    return None;
                }
                Some(Move::Step(Step::Unhold(session)))
            }
        }
    }
}

/// Takes one from a random session among those whose count (holds, entered work) is above
/// zero; `None` when none is.
fn take_one(counts: &mut [u32], rng: &mut Rng) -> Option<usize> {
    let counted = counts.iter().filter(|n| **n > 0).count();
    if counted == 0 {
        return None;
    }
    let k = rng.index(counted);
    let i = (0..counts.len())
        .filter(|i| counts[*i] > 0)
        .nth(k)
        .expect("k is below the count of counted sessions");
    counts[i] -= 1;
    Some(i)
}

/// Takes one back from `session`'s count (the core refused what was counted).
fn uncount(counts: &mut [u32], sessions: &[SessionId], session: &SessionId) {
    if let Some(i) = sessions.iter().position(|s| s == session) {
        counts[i] = counts[i].saturating_sub(1);
    }
}

/// Every session's count above zero, with its session; the counts become zero.
fn take_all(counts: &mut [u32], sessions: &[SessionId]) -> Vec<(SessionId, u32)> {
    let mut out = Vec::new();
    for (i, n) in counts.iter_mut().enumerate() {
        if *n > 0 {
            out.push((sessions[i].clone(), *n));
            *n = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn numbered_writes_decimal() {
        for n in [0u64, 7, 10, 1234, u64::MAX] {
            assert_eq!(numbered(b'c', n, &mut [0; 21]), format!("c{n}"));
        }
    }
}
