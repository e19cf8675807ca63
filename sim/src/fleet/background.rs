//! The application's work beside its calls, in a seed's fleet world: operations (a call that
//! became ready enters its session's sandbox, writes the session's file under the token its
//! process holds the key by, and leaves) and holds (a background writer of the session, such
//! as a memory write, holds it, later flushes its log and lets the hold go). Each is drawn from
//! a stream of its own, so the other draws of a seed stay as they were.
//!
//! What a drain must wait for (`drain-waits-for-work`, `drain-waits-for-holds`) is told to the
//! incarnation's checks here (`process.rs`, `drains.rs`): an operation once `enter` let it in,
//! until its `leave` (whatever the core answers); a hold once `hold` was accepted, until its
//! `unhold` was.

use sandkeeper::{PathName, SandboxId, SessionId};
use sandkeeper_check::Work;

use super::backend::Outcome;
use super::process::Told;
use super::{Ev, World, MS};
use crate::step::Step;

/// How often a call that became ready also runs an operation in its sandbox (a write of its
/// session's file, entered and left), per mille.
const OPERATIONS_IN: u32 = 250;

/// How often a call that became ready also starts a background writer of its session (a hold,
/// a flush later, and the hold let go), per mille.
const HOLDS_IN: u32 = 200;

/// What an operation of `session` writes, as `conservation` follows it: the session's file
/// `work.md`, which each write replaces whole, as a session log's flush does.
pub(super) fn operation_work(session: &SessionId) -> Work {
    let path = PathName::new("work.md").expect("a valid name");
    Work::Version(session.clone(), path)
}

impl World {
    /// A call of `session` became ready on replica `r` (incarnation `inc`): the work the
    /// application does beside it, drawn.
    pub(super) fn work_beside(&mut self, r: usize, inc: u32, session: &SessionId) {
        if self.work_rng.chance(OPERATIONS_IN) {
            let enter = self.work_rng.range(10, 400) * MS;
            self.push(self.now + enter, Ev::Enter(r, inc, session.clone()));
        }
        if self.hold_rng.chance(HOLDS_IN) {
            let hold = self.hold_rng.range(10, 1_500) * MS;
            self.push(self.now + hold, Ev::Hold(r, inc, session.clone()));
        }
    }

    /// A background writer of `session` on replica `r` holds it; if the core takes the hold,
    /// the writer flushes and lets go later.
    pub(super) fn hold(&mut self, r: usize, inc: u32, session: SessionId) {
        if self.replicas[r].core.is_closing() {
            return;
        }
        if self.recorder.is_some() {
            self.record(Some(r), Step::Hold(session.clone()));
        }
        let held = self.apply_input(r, |core, t| core.hold(t, &session));
        let local = self.replicas[r].local(self.now);
        let result = held.as_ref().map(drop).map_err(sandkeeper::Error::kind);
        self.told(r, Told::Hold(&session), result, local);
        if let Ok(((), local)) = held {
            self.drain(r, local);
            let write = self.hold_rng.range(50, 3_000) * MS;
            self.push(self.now + write, Ev::Unhold(r, inc, session));
        }
    }

    /// The background writer of `session` on replica `r` flushes its log and lets its hold go.
    pub(super) fn unhold(&mut self, r: usize, session: SessionId) {
        self.flush(r, session.clone());
        if self.recorder.is_some() {
            self.record(Some(r), Step::Unhold(session.clone()));
        }
        let unheld = self.apply_input(r, |core, t| core.unhold(t, &session));
        let local = self.replicas[r].local(self.now);
        let result = unheld.as_ref().map(drop).map_err(sandkeeper::Error::kind);
        self.told(r, Told::Unhold(&session), result, local);
        if let Ok(((), local)) = unheld {
            self.drain(r, local);
        }
    }

    /// The application of replica `r` enters its session's sandbox for an operation: if the
    /// core lets it in, the operation's file is made now (numbered in the world's flush order)
    /// and written into the sandbox later, under the token the replica holds its key by.
    pub(super) fn enter(&mut self, r: usize, inc: u32, session: SessionId) {
        if self.replicas[r].core.is_closing() || self.in_work.contains(&(inc, session.clone())) {
            return;
        }
        if self.recorder.is_some() {
            self.record(Some(r), Step::Enter(session.clone()));
        }
        let entered = self.apply_input(r, |core, t| core.enter(t, &session));
        let local = self.replicas[r].local(self.now);
        let result = entered.as_ref().map(drop).map_err(sandkeeper::Error::kind);
        self.told(r, Told::Nothing, result, local);
        if let Ok((x, local)) = entered {
            self.replicas[r].process.entered(x);
            self.in_work.insert((inc, session.clone()));
            let order = self.operation_made();
            self.drain(r, local);
            let write = self.work_rng.range(5, 300) * MS;
            self.push(self.now + write, Ev::Leave(r, inc, session, x, order));
        }
    }

    /// An operation's file is made now: its number in the order of every operation's file.
    pub(super) fn operation_made(&mut self) -> u64 {
        self.operations += 1;
        self.operations
    }

    /// The operation entered into `x` writes its file (made at `order`) and leaves: the write is
    /// acknowledged (the operation returned ok) when the backend took it and the core took the
    /// leave. A process that lost the key meanwhile writes under its old token, which the
    /// backend refuses.
    pub(super) fn leave(&mut self, r: usize, session: &SessionId, x: SandboxId, order: u64) {
        let inc = self.replicas[r].incarnation;
        self.in_work.remove(&(inc, session.clone()));
        if self.recorder.is_some() {
            self.record(Some(r), Step::Leave(session.clone()));
        }
        let wrote = self.operation_writes(r, session, x, order);
        let left = self.apply_input(r, |core, t| core.leave(t, x));
        let local = self.replicas[r].local(self.now);
        let result = left.as_ref().map(drop).map_err(sandkeeper::Error::kind);
        self.told(r, Told::Leave(x), result, local);
        if let Ok(((), local)) = left {
            if wrote {
                let work = operation_work(session);
                self.conservation.acknowledged(x, work, order);
            }
            self.drain(r, local);
        }
    }

    /// The backend takes (or refuses) replica `r`'s write of `session`'s file, made at `order`,
    /// into `x`: whether it landed.
    pub(super) fn operation_writes(
        &mut self,
        r: usize,
        session: &SessionId,
        x: SandboxId,
        order: u64,
    ) -> bool {
        let token = self.replicas[r].intent.key_of(x).and_then(|(_, t)| *t);
        let landed = self.backend.write(x, token, r) == Outcome::Ok(None);
        if landed {
            let work = operation_work(session);
            self.conservation.written(x, work, order);
        }
        landed
    }
}
