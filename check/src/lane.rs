//! The order of backend-facing operations on one sandbox: its lane.
//!
//! A managed sandbox's lane is Start, then Uploads, then (on the way down) Stop, then Persist,
//! then Shutdown; an external sandbox (the application's own, bound without a Start) receives
//! Uploads only. This is the part of the output contract that a backend can see on its own: a
//! backend never sees a Drain, an Abandon or a CancelUpload, but it receives exactly these five
//! operations, so the same rules hold whether they are checked on the core's commands (the
//! simulator, the core's tests) or on what a backend received (io-tokio's `FaultBackend`, the
//! agreement test's scripted backend).
//!
//! | check | what must hold |
//! |---|---|
//! | `start-once` | a sandbox is started at most once, and never one bound as external |
//! | `no-command-after-shutdown` | no operation names a sandbox after its Shutdown |
//! | `no-upload-after-stop` | no Upload after the sandbox's Stop, or after the core was told it died |
//! | `stop-managed-only` | a Stop or Persist names a sandbox that was started (not an external one) |
//! | `stop-once` | a sandbox is stopped once, or again right after (the core orders a Stop again when one failed, up to [`WAY_DOWN_ATTEMPTS`] in a row; a lane does not see answers) |
//! | `persist-after-stop` | a Persist comes after its sandbox's Stop, once or again right after (as a Stop) |
//! | `no-shutdown-of-external` | a Shutdown names a sandbox that was started, never an external one |
//! | (fleet) | an Adopt starts the lane like a Start; a Relinquish ends it like a Shutdown, after which nothing may name the sandbox |
//! | `liveness-shutdown-every-started` | at the end, every started sandbox was ordered to shut down (or, under `Suspend`, persisted: that is its last command; or the core left it to the backend as it was after its way down failed, [`Lane::leave_as_is`]) |
//!
//! An Upload into a sandbox never started is an upload into an external sandbox: its lane
//! becomes external (a Start, Stop, Persist or Shutdown of it then breaks the order). The core
//! orders such an Upload before it announces the binding (its commands drain before its events),
//! and a backend never hears of the binding at all, so a lane cannot demand it first; that an
//! upload goes where its session's call is ready is the simulator's `upload-routing`.
//!
//! A lane takes the operation whatever it finds: after a violation it goes on from the state the
//! operation implies, so one broken order is reported once, where it happened.
//!
//! Deaths: a backend sees a sandbox die before the core hears of it, and an Upload ordered in
//! between is legitimate; so a lane only counts a death it is told about with [`Lane::die`],
//! which core-side users call when they hand the core the death.

use rustc_hash::FxHashMap;
use sandkeeper::{Command, SandboxId, WAY_DOWN_ATTEMPTS};

use crate::violation::Violation;

/// A backend-facing operation on one sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Start (or resume).
    Start,
    /// Upload of one version.
    Upload,
    /// Stop.
    Stop,
    /// Persist of the stopped sandbox's snapshot.
    Persist,
    /// Shutdown.
    Shutdown,
    /// A hook of the application, run in the sandbox (a core-side operation: backends never
    /// receive it).
    Hook,
    /// Fleet mode: the sandbox is no longer this process's (handed over or lost with its key):
    /// its lane here ends without a Shutdown.
    Relinquish,
}

impl Op {
    /// The operation a command asks of a backend, and the sandbox it names; `None` for the
    /// commands a backend never receives as an operation (Drain, CancelUpload, Abandon).
    pub fn of(command: &Command) -> Option<(SandboxId, Op)> {
        let op = match command {
            // An adoption starts the sandbox's lane in this process.
            Command::Start { .. } | Command::Adopt { .. } => Op::Start,
            Command::Relinquish { .. } => Op::Relinquish,
            Command::Upload { .. } => Op::Upload,
            Command::Stop { .. } => Op::Stop,
            Command::Persist { .. } => Op::Persist,
            Command::Shutdown { .. } => Op::Shutdown,
            Command::Hook { .. } => Op::Hook,
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Abandon { .. } => return None,
        };
        Some((command.sandbox(), op))
    }
}

/// Where one sandbox's lane is. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lane {
    started: bool,
    external: bool,
    stopped: bool,
    persisted: bool,
    shut_down: bool,
    dead: bool,
    relinquished: bool,
    left: bool,
    /// The last operation taken, and how many times in a row (a Stop or a Persist ordered
    /// again after it failed).
    last: Option<(Op, u8)>,
}

impl Lane {
    /// Takes `op` for sandbox `x` (named only in the violation's detail). `Err` names the first
    /// rule it breaks; the lane moves on either way.
    pub fn take(&mut self, x: SandboxId, op: Op) -> Result<(), Violation> {
        let broken = self.judge(op);
        self.last = match self.last {
            Some((last, n)) if last == op => Some((op, n.saturating_add(1))),
            _ => Some((op, 1)),
        };
        match op {
            Op::Start => self.started = true,
            Op::Upload => self.bind_external(),
            Op::Stop => self.stopped = true,
            Op::Persist => self.persisted = true,
            Op::Shutdown => self.shut_down = true,
            Op::Hook => {}
            Op::Relinquish => self.relinquished = true,
        }
        match broken {
            None => Ok(()),
            Some((check, why)) => Err(Violation::new(check, format!("{op:?} for {x}: {why}"))),
        }
    }

    fn judge(&self, op: Op) -> Option<(&'static str, &'static str)> {
        if self.shut_down {
            return Some(("no-command-after-shutdown", "after its Shutdown"));
        }
        if self.relinquished {
            return Some(("no-command-after-shutdown", "after it was relinquished"));
        }
        if self.left {
            return Some(("no-command-after-shutdown", "after it was left as it was"));
        }
        match op {
            Op::Start if self.started => Some(("start-once", "a second Start")),
            Op::Start if self.external => Some(("start-once", "a Start of an external sandbox")),
            Op::Start => None,
            Op::Upload if self.stopped => Some(("no-upload-after-stop", "after its Stop")),
            Op::Upload if self.dead => Some(("no-upload-after-stop", "after its death")),
            Op::Upload => None,
            Op::Stop | Op::Persist if !self.started => {
                Some(("stop-managed-only", "a sandbox never started"))
            }
            Op::Stop if self.stopped && !self.again(Op::Stop) => {
                Some(("stop-once", "a second Stop"))
            }
            Op::Stop => None,
            Op::Persist if !self.stopped => Some(("persist-after-stop", "before its Stop")),
            Op::Persist if self.persisted && !self.again(Op::Persist) => {
                Some(("persist-after-stop", "a second Persist"))
            }
            Op::Persist => None,
            Op::Shutdown if !self.started => Some((
                "no-shutdown-of-external",
                "a sandbox the core never started",
            )),
            Op::Shutdown => None,
            Op::Hook if !self.started => Some(("hook-in-order", "a sandbox never started")),
            Op::Hook if self.stopped => Some(("hook-in-order", "after its Stop")),
            Op::Hook if self.dead => Some(("hook-in-order", "after its death")),
            Op::Hook => None,
            Op::Relinquish if !self.started => Some((
                "stop-managed-only",
                "relinquished, never started or adopted",
            )),
            Op::Relinquish => None,
        }
    }

    /// Whether `op` may come again now: it is the operation taken last, fewer than
    /// [`WAY_DOWN_ATTEMPTS`] times in a row (the core's retry after a failure).
    fn again(&self, op: Op) -> bool {
        matches!(self.last, Some((last, n)) if last == op && n < WAY_DOWN_ATTEMPTS)
    }

    /// The core left the sandbox to the backend as it was after every Stop or Persist of its
    /// way down failed (`Event::WayDownFailed`): its lane ends without a Shutdown.
    pub fn leave_as_is(&mut self) {
        self.left = true;
    }

    /// The sandbox was bound to a call without a Start: the application's own, which may
    /// receive uploads and nothing else. A started sandbox stays managed.
    pub fn bind_external(&mut self) {
        if !self.started {
            self.external = true;
        }
    }

    /// The core was told the sandbox died (a death report, a lost instance that counts as one,
    /// an upload answered `gone`): no Upload may follow.
    pub fn die(&mut self) {
        self.dead = true;
    }

    /// A Start was taken.
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// Bound as external (and never started).
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// A Stop was taken.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// A Persist was taken.
    pub fn is_persisted(&self) -> bool {
        self.persisted
    }

    /// The core left it to the backend as it was ([`leave_as_is`](Self::leave_as_is)).
    pub fn is_left(&self) -> bool {
        self.left
    }

    /// A Shutdown was taken.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// The core was told it died.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Whether the sandbox is up as far as its lane says: neither stopped, shut down nor
    /// reported dead.
    pub fn is_up(&self) -> bool {
        !self.stopped && !self.shut_down && !self.dead
    }

    /// Whether the lane has ended: shut down, or (when `suspend`, the release policy's last
    /// command being Persist) persisted. A started lane that has not ended breaks
    /// `liveness-shutdown-every-started` once nothing more will come.
    pub fn has_ended(&self, suspend: bool) -> bool {
        self.shut_down || self.relinquished || self.left || (suspend && self.persisted)
    }
}

/// The lanes of every sandbox named so far, for a user that keeps no record of its own per
/// sandbox.
#[derive(Clone, Debug, Default)]
pub struct Lanes {
    lanes: FxHashMap<SandboxId, Lane>,
}

impl Lanes {
    /// An empty table.
    pub fn new() -> Self {
        Lanes::default()
    }

    /// Takes `op` for `x`. See [`Lane::take`].
    pub fn take(&mut self, x: SandboxId, op: Op) -> Result<(), Violation> {
        self.lanes.entry(x).or_default().take(x, op)
    }

    /// Takes the operation `command` asks of a backend, if any.
    pub fn command(&mut self, command: &Command) -> Result<(), Violation> {
        match Op::of(command) {
            Some((x, op)) => self.take(x, op),
            None => Ok(()),
        }
    }

    /// `x` was bound without a Start. See [`Lane::bind_external`].
    pub fn bind_external(&mut self, x: SandboxId) {
        self.lanes.entry(x).or_default().bind_external();
    }

    /// The core was told `x` died. See [`Lane::die`].
    pub fn die(&mut self, x: SandboxId) {
        if let Some(lane) = self.lanes.get_mut(&x) {
            lane.die();
        }
    }

    /// The core left `x` to the backend as it was. See [`Lane::leave_as_is`].
    pub fn leave_as_is(&mut self, x: SandboxId) {
        if let Some(lane) = self.lanes.get_mut(&x) {
            lane.leave_as_is();
        }
    }

    /// The lane of `x`, if it was named.
    pub fn get(&self, x: SandboxId) -> Option<&Lane> {
        self.lanes.get(&x)
    }

    /// The lowest started sandbox whose lane has not ended (see [`Lane::has_ended`]), as the
    /// violation `liveness-shutdown-every-started`; `Ok` when every started lane ended.
    pub fn every_started_ended(&self, suspend: bool) -> Result<(), Violation> {
        let left = self
            .lanes
            .iter()
            .filter(|(_, l)| l.is_started() && !l.has_ended(suspend))
            .map(|(x, _)| *x)
            .min();
        match left {
            None => Ok(()),
            Some(x) => Err(Violation::new(
                "liveness-shutdown-every-started",
                format!("{x} was started and never ordered to shut down"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;

    #[test]
    fn a_managed_lane_follows_the_way_down() {
        let mut l = Lanes::new();
        let x = SandboxId(1);
        for op in [
            Op::Start,
            Op::Upload,
            Op::Upload,
            Op::Stop,
            Op::Persist,
            Op::Shutdown,
        ] {
            assert_eq!(check(l.take(x, op)), "ok", "{op:?}");
        }
        assert!(l.get(x).unwrap().has_ended(false));
        for op in [Op::Start, Op::Upload, Op::Stop, Op::Persist, Op::Shutdown] {
            assert_eq!(check(l.take(x, op)), "no-command-after-shutdown", "{op:?}");
        }
    }

    #[test]
    fn each_break_of_order_is_named() {
        let mut l = Lanes::new();
        let (a, b, c, d) = (SandboxId(1), SandboxId(2), SandboxId(3), SandboxId(4));
        assert_eq!(check(l.take(a, Op::Upload)), "ok", "an external sandbox");
        assert!(l.get(a).unwrap().is_external());
        assert_eq!(check(l.take(a, Op::Start)), "start-once");
        assert_eq!(check(l.take(b, Op::Stop)), "stop-managed-only");
        assert_eq!(check(l.take(c, Op::Persist)), "stop-managed-only");
        assert_eq!(check(l.take(d, Op::Shutdown)), "no-shutdown-of-external");

        let x = SandboxId(10);
        l.take(x, Op::Start).unwrap();
        assert_eq!(check(l.take(x, Op::Start)), "start-once");
        assert_eq!(check(l.take(x, Op::Persist)), "persist-after-stop");
        l.take(x, Op::Stop).unwrap();
        assert_eq!(check(l.take(x, Op::Upload)), "no-upload-after-stop");
        assert_eq!(check(l.take(x, Op::Stop)), "stop-once");
        assert_eq!(check(l.take(x, Op::Persist)), "persist-after-stop");

        let y = SandboxId(11);
        l.take(y, Op::Start).unwrap();
        assert!(l.get(y).unwrap().is_up());
        l.die(y);
        assert!(!l.get(y).unwrap().is_up());
        assert_eq!(check(l.take(y, Op::Upload)), "no-upload-after-stop");
        assert_eq!(check(l.take(y, Op::Shutdown)), "ok");
    }

    #[test]
    fn an_external_lane_takes_uploads_only() {
        let mut l = Lanes::new();
        let e = SandboxId(5);
        l.bind_external(e);
        assert_eq!(check(l.take(e, Op::Upload)), "ok");
        assert_eq!(check(l.take(e, Op::Start)), "start-once");
        let f = SandboxId(6);
        l.bind_external(f);
        assert_eq!(check(l.take(f, Op::Stop)), "stop-managed-only");
        assert_eq!(check(l.take(f, Op::Shutdown)), "no-shutdown-of-external");
        // A started sandbox bound later stays managed.
        let g = SandboxId(7);
        l.take(g, Op::Start).unwrap();
        l.bind_external(g);
        assert!(!l.get(g).unwrap().is_external());
        assert_eq!(check(l.take(g, Op::Shutdown)), "ok");
    }

    #[test]
    fn liveness_names_the_lowest_started_lane_left_open() {
        let mut l = Lanes::new();
        for x in [3, 1, 2] {
            l.take(SandboxId(x), Op::Start).unwrap();
        }
        l.take(SandboxId(1), Op::Shutdown).unwrap();
        l.take(SandboxId(2), Op::Stop).unwrap();
        l.take(SandboxId(2), Op::Persist).unwrap();
        let v = l.every_started_ended(false).unwrap_err();
        assert_eq!(v.check, "liveness-shutdown-every-started");
        assert!(v.detail.starts_with(&SandboxId(2).to_string()), "{v}");
        let v = l.every_started_ended(true).unwrap_err();
        assert!(v.detail.starts_with(&SandboxId(3).to_string()), "{v}");
        l.take(SandboxId(3), Op::Shutdown).unwrap();
        assert_eq!(l.every_started_ended(true), Ok(()));
    }

    #[test]
    fn a_death_the_core_was_not_told_of_allows_uploads() {
        let mut l = Lanes::new();
        let x = SandboxId(1);
        l.take(x, Op::Start).unwrap();
        l.die(SandboxId(99)); // unknown: ignored
        assert_eq!(check(l.take(x, Op::Upload)), "ok");
        assert!(l.get(SandboxId(99)).is_none());
    }
}
