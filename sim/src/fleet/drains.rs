//! What a drain waits for, per incarnation of a replica: `drain-waits-for-holds` and
//! `drain-waits-for-work`, judged as the one-process history judges them
//! (`sim/src/history.rs`).
//!
//! A Drain of a sandbox opens a drain; it ends with the sandbox's before hook or its first Stop
//! (the way down goes on), or without a way down when a call of it becomes ready again, its key
//! is handed over, it dies or loses its instance, or it is shut down or relinquished. A drain that ends with the way down
//! before its deadline (the core's clock: the Drain's instant plus `drain_deadline`), while the
//! process is not closing, is judged once the input's events are in:
//!
//! - `drain-waits-for-holds`: no session of the drain holds a write back (`hold` taken, its
//!   `unhold` not yet) whose mirror lingers on this sandbox (the session's last ready call was
//!   released here, and no other call of it is ready on a sandbox that is up);
//! - `drain-waits-for-work`: no operation entered into the sandbox is still in it (`enter`
//!   without its `leave`).
//!
//! A crash drops the incarnation's holds, work and drains with it.

use std::collections::BTreeMap;
use std::time::Duration;

use sandkeeper::{Command, Instant, SandboxId, SessionId};
use sandkeeper_check::Violation;

/// A drain not ended yet: when it began and the sessions it drains.
#[derive(Debug)]
struct Open {
    at: Instant,
    sessions: Vec<SessionId>,
}

/// One incarnation's drains and what they wait for. See the module docs.
#[derive(Debug)]
pub(super) struct Drains {
    deadline: Duration,
    /// Holds taken and not let go, per session.
    holds: BTreeMap<SessionId, u32>,
    /// Operations entered and not left, per sandbox.
    entered: BTreeMap<SandboxId, u32>,
    /// Per session, the sandbox its last ready call was released on (its mirror lingers there).
    last_released: BTreeMap<SessionId, SandboxId>,
    open: BTreeMap<SandboxId, Open>,
    /// Drains this input ended with the way down, before their deadline: judged at its end.
    ended: Vec<(SandboxId, Vec<SessionId>)>,
    /// `close` was accepted: the drains may be cut short.
    closing: bool,
}

impl Drains {
    /// Nothing held, entered or draining, for a process with this drain deadline.
    pub(super) fn new(deadline: Duration) -> Self {
        Drains {
            deadline,
            holds: BTreeMap::new(),
            entered: BTreeMap::new(),
            last_released: BTreeMap::new(),
            open: BTreeMap::new(),
            ended: Vec::new(),
            closing: false,
        }
    }

    /// `hold(session)` was accepted.
    pub(super) fn held(&mut self, session: &SessionId) {
        *self.holds.entry(session.clone()).or_default() += 1;
    }

    /// `unhold(session)` was accepted.
    pub(super) fn unheld(&mut self, session: &SessionId) {
        if let Some(n) = self.holds.get_mut(session) {
            *n = n.saturating_sub(1);
        }
    }

    /// `enter` let an operation into `x`.
    pub(super) fn entered(&mut self, x: SandboxId) {
        *self.entered.entry(x).or_default() += 1;
    }

    /// The operation in `x` left it (whatever the core answered: the application's work is
    /// over).
    pub(super) fn left(&mut self, x: SandboxId) {
        if let Some(n) = self.entered.get_mut(&x) {
            *n = n.saturating_sub(1);
        }
    }

    /// `session`'s last ready call was released on `x`, which is up.
    pub(super) fn released(&mut self, session: &SessionId, x: SandboxId) {
        self.last_released.insert(session.clone(), x);
    }

    /// `close` was accepted.
    pub(super) fn closing(&mut self) {
        self.closing = true;
    }

    /// A call became ready on `x`, its key was handed over, or it died or lost its instance:
    /// its drain (if any) is over without a way down (nothing left to wait for there).
    pub(super) fn revived(&mut self, x: SandboxId) {
        self.open.remove(&x);
    }

    /// One command, ordered at `now`.
    pub(super) fn command(&mut self, cmd: &Command, now: Instant) {
        let x = cmd.sandbox();
        match cmd {
            Command::Drain { sessions, .. } => {
                let sessions = sessions.iter().cloned().collect();
                self.open.insert(x, Open { at: now, sessions });
            }
            Command::Hook { hook, .. } if !hook.is_after() => self.way_down(x, now),
            Command::Stop { .. } => self.way_down(x, now),
            Command::Shutdown { .. } | Command::Relinquish { .. } => {
                self.open.remove(&x);
            }
            _ => {}
        }
    }

    /// `x`'s drain (if one is open) ended with its way down at `now`.
    fn way_down(&mut self, x: SandboxId, now: Instant) {
        if let Some(open) = self.open.remove(&x) {
            if !self.closing && now < open.at + self.deadline {
                self.ended.push((x, open.sessions));
            }
        }
    }

    /// The input's events are in: the drains it ended before their deadline waited for every
    /// hold and every operation of theirs. `up_call`: whether a session has a call ready on a
    /// sandbox that is up.
    pub(super) fn input_done(
        &mut self,
        up_call: impl Fn(&SessionId) -> bool,
    ) -> Result<(), Violation> {
        for (x, sessions) in std::mem::take(&mut self.ended) {
            let held = sessions.iter().find(|s| {
                self.holds.get(*s).is_some_and(|h| *h > 0)
                    && !up_call(s)
                    && self.last_released.get(*s) == Some(&x)
            });
            if let Some(held) = held {
                return Err(Violation::new(
                    "drain-waits-for-holds",
                    format!("Stop for {x} before its drain deadline while session {held} still holds it"),
                ));
            }
            if let Some(n) = self.entered.get(&x).filter(|n| **n > 0) {
                return Err(Violation::new(
                    "drain-waits-for-work",
                    format!("Stop for {x} before its drain deadline with {n} piece(s) of work entered in it"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkeeper::{HookPoint, Token};

    fn session() -> SessionId {
        SessionId::new("s").unwrap()
    }

    fn drain(x: SandboxId) -> Command {
        Command::Drain {
            sandbox: x,
            sessions: [session()].into_iter().collect(),
        }
    }

    fn stop(x: SandboxId, at: Instant) -> Command {
        Command::Stop {
            sandbox: x,
            suspend: false,
            deadline: at + Duration::from_secs(5),
            token: Some(Token(1)),
        }
    }

    /// A Stop before the drain deadline with work still entered, or a hold whose mirror lingers
    /// there, breaks; at the deadline, or once the work left and the hold was let go, it holds.
    #[test]
    fn a_drain_ended_early_must_have_nothing_left_in_it() {
        let (x, t0) = (SandboxId(1), Instant::ZERO);
        let early = t0 + Duration::from_secs(1);
        let late = t0 + Duration::from_secs(5);
        let mut d = Drains::new(Duration::from_secs(5));
        d.entered(x);
        d.command(&drain(x), t0);
        d.command(&stop(x, early), early);
        let v = d.input_done(|_| false).unwrap_err();
        assert_eq!(v.check, "drain-waits-for-work");

        d.command(&drain(x), t0);
        d.command(&stop(x, late), late);
        d.input_done(|_| false).unwrap();

        d.left(x);
        d.held(&session());
        d.released(&session(), x);
        d.command(&drain(x), t0);
        let hook = Command::Hook {
            sandbox: x,
            hook: HookPoint::BeforeStop,
            deadline: early + Duration::from_secs(1),
            token: Some(Token(1)),
        };
        d.command(&hook, early);
        let v = d.input_done(|_| false).unwrap_err();
        assert_eq!(v.check, "drain-waits-for-holds");
        d.command(&drain(x), t0);
        d.command(&stop(x, early), early);
        d.input_done(|_| true).unwrap();

        d.unheld(&session());
        d.command(&drain(x), t0);
        d.command(&stop(x, early), early);
        d.input_done(|_| false).unwrap();
    }

    /// A drain a ready call revived, or one ended while closing, is not judged.
    #[test]
    fn a_revived_drain_or_a_closing_one_is_not_judged() {
        let (x, t0) = (SandboxId(1), Instant::ZERO);
        let mut d = Drains::new(Duration::from_secs(5));
        d.entered(x);
        d.command(&drain(x), t0);
        d.revived(x);
        d.command(&stop(x, t0), t0);
        d.input_done(|_| false).unwrap();
        d.closing();
        d.command(&drain(x), t0);
        d.command(&stop(x, t0), t0);
        d.input_done(|_| false).unwrap();
    }
}
