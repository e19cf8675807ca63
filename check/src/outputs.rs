//! The shape of the output stream itself: nothing after `Closed`, and an `Abandon` followed at
//! once by its sandbox's Shutdown.
//!
//! | check | what must hold |
//! |---|---|
//! | `nothing-after-closed` | no command and no event after the `Closed` event |
//! | `abandon-then-shutdown` | an `Abandon` names a managed sandbox on its way (started, not shut down) and is followed at once by that sandbox's Shutdown, with only cancellations of its uploads between, within the same input |
//!
//! An `Abandon` tells the driver to drop the sandbox's outstanding start; the Shutdown right
//! after it is what the backend executes. Anything between them would run against a sandbox
//! whose start the driver has already given up.

use sandkeeper::{Command, Event, SandboxId};

use crate::lane::Lane;
use crate::violation::Violation;

/// The output-stream checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct OutputChecker {
    /// A sandbox abandoned by the last command: its Shutdown must come next.
    abandoned: Option<SandboxId>,
    /// `Closed` came.
    closed: bool,
}

impl OutputChecker {
    /// An empty checker.
    pub fn new() -> Self {
        OutputChecker::default()
    }

    /// One command; `lane` is its sandbox's lane before the command.
    pub fn command(&mut self, cmd: &Command, lane: Option<&Lane>) -> Result<(), Violation> {
        let x = cmd.sandbox();
        let mut broken = None;
        if self.closed {
            broken = Some(Violation::new(
                "nothing-after-closed",
                format!("command {cmd:?} after Closed"),
            ));
        }
        if let Some(a) = self.abandoned {
            let follows =
                a == x && matches!(cmd, Command::Shutdown { .. } | Command::CancelUpload { .. });
            if !follows || matches!(cmd, Command::Shutdown { .. }) {
                self.abandoned = None;
            }
            if !follows && broken.is_none() {
                broken = Some(Violation::new(
                    "abandon-then-shutdown",
                    format!("{cmd:?} between the Abandon of {a} and its Shutdown"),
                ));
            }
        }
        if let Command::Abandon { .. } = cmd {
            let on_its_way = lane.is_some_and(|l| l.is_started() && !l.is_shut_down());
            if !on_its_way && broken.is_none() {
                broken = Some(Violation::new(
                    "abandon-then-shutdown",
                    format!("Abandon of {x}, which is not a managed sandbox on its way"),
                ));
            }
            self.abandoned = Some(x);
        }
        broken.map_or(Ok(()), Err)
    }

    /// One event.
    pub fn event(&mut self, ev: &Event) -> Result<(), Violation> {
        let was_closed = self.closed;
        if let Event::Closed { .. } = ev {
            self.closed = true;
        }
        if was_closed {
            return Err(Violation::new(
                "nothing-after-closed",
                format!("event {ev:?} after Closed"),
            ));
        }
        Ok(())
    }

    /// The input's outputs are all in: no Abandon waits for its Shutdown.
    pub fn input_done(&mut self) -> Result<(), Violation> {
        match self.abandoned.take() {
            None => Ok(()),
            Some(a) => Err(Violation::new(
                "abandon-then-shutdown",
                format!("Abandon of {a} without its Shutdown in the same input"),
            )),
        }
    }

    /// Whether `Closed` came.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;
    use crate::lane::{Lanes, Op};
    use sandkeeper::{Instant, UploadId};

    fn shutdown(x: u64) -> Command {
        Command::Shutdown {
            sandbox: SandboxId(x),
            deadline: Instant::ZERO,
            token: None,
        }
    }

    fn abandon(x: u64) -> Command {
        Command::Abandon {
            sandbox: SandboxId(x),
        }
    }

    #[test]
    fn an_abandon_is_followed_at_once_by_its_shutdown() {
        let mut lanes = Lanes::new();
        lanes.take(SandboxId(1), Op::Start).unwrap();
        lanes.take(SandboxId(2), Op::Start).unwrap();
        let mut o = OutputChecker::new();
        let lane = |x| lanes.get(SandboxId(x)).copied();
        assert_eq!(check(o.command(&abandon(1), lane(1).as_ref())), "ok");
        let cancel = Command::CancelUpload {
            upload: UploadId(3),
            sandbox: SandboxId(1),
        };
        assert_eq!(check(o.command(&cancel, None)), "ok");
        assert_eq!(check(o.command(&shutdown(1), None)), "ok");
        assert_eq!(check(o.input_done()), "ok");

        assert_eq!(check(o.command(&abandon(2), lane(2).as_ref())), "ok");
        assert_eq!(
            check(o.command(&shutdown(1), None)),
            "abandon-then-shutdown"
        );
        assert_eq!(check(o.input_done()), "ok", "reported once");
        assert_eq!(check(o.command(&abandon(2), lane(2).as_ref())), "ok");
        assert_eq!(check(o.input_done()), "abandon-then-shutdown");
        assert_eq!(check(o.command(&abandon(9), None)), "abandon-then-shutdown");
    }

    #[test]
    fn nothing_comes_after_closed() {
        let mut o = OutputChecker::new();
        let closed = Event::Closed {
            report: Default::default(),
        };
        assert_eq!(check(o.event(&closed)), "ok");
        assert!(o.is_closed());
        assert_eq!(check(o.event(&closed)), "nothing-after-closed");
        assert_eq!(check(o.command(&shutdown(1), None)), "nothing-after-closed");
    }
}
