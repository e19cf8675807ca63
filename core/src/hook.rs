//! Hooks: the application's work at a sandbox's transitions (see [`Hooks`](crate::Hooks)),
//! ordered as a Command::Hook at its place, their answers, and what follows each.

use std::time::Duration;

use crate::command::{Command, HookPoint};
use crate::config::SuspendHookFailure;
use crate::error::{Error, ErrorKind};
use crate::event::Event;
use crate::ids::SandboxId;
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxIx};
use crate::time::Instant;

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The sandbox's hook succeeded: after start or resume, its calls are ready; before suspend
    /// or stop, its Stop follows.
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_hook_ok(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Hook)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "hook ok");
        self.out.stats.hooks_ok += 1;
        self.hook_ended(sandbox, HookEnd::Ok);
        self.finish_input();
        Ok(())
    }

    /// The sandbox's hook failed: after start or resume, its calls fail with `hook-failed` and
    /// it goes down unused; before suspend or stop, the failure is reported and the way down
    /// goes on (see [`Hooks`](crate::Hooks)).
    ///
    /// Errors: as [`handle_start_ok`](Self::handle_start_ok).
    pub fn handle_hook_failed(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(sandbox) = self.awaits(sandbox, Awaiting::Hook)? else {
            return Ok(());
        };
        self.advance(now);
        tracing::debug!(sandbox = %self.sid(sandbox), "hook failed");
        self.hook_ended(sandbox, HookEnd::Failed);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// Orders the sandbox's hook at `point`, awaited for `timeout`.
    pub(crate) fn order_hook(&mut self, sandbox: SandboxIx, point: HookPoint, timeout: Duration) {
        let awaited = self.sandboxes.get_mut(sandbox).expect("live").await_hook();
        debug_assert_eq!(awaited, point);
        let deadline = self.set_sandbox_timer(sandbox, timeout);
        self.out.stats.hooks_ordered += 1;
        tracing::debug!(sandbox = %self.sid(sandbox), hook = point.as_str(), "hook");
        self.out.commands.push_back(Command::Hook {
            sandbox: self.sid(sandbox),
            hook: point,
            deadline,
            token: self.sandboxes[sandbox].token,
        });
    }

    /// The outstanding hook ended (answered, or its timeout passed): what follows it.
    pub(crate) fn hook_ended(&mut self, sandbox: SandboxIx, end: HookEnd) {
        self.way_down().cancel_sandbox_timer(sandbox);
        let record = self.sandboxes.get_mut(sandbox).expect("awaited");
        let point = record.hook().expect("a hook is outstanding");
        record.answered();
        if end != HookEnd::Ok {
            let late = end == HookEnd::Late;
            if late {
                self.out.stats.hooks_late += 1;
            } else {
                self.out.stats.hooks_failed += 1;
            }
            self.out.events.push_back(Event::HookFailed {
                sandbox: self.sid(sandbox),
                hook: point,
                late,
            });
        }
        match (point.is_after(), end) {
            (true, HookEnd::Ok) => self.up(sandbox),
            (true, _) => self.fail_start(sandbox, ErrorKind::HookFailed),
            (false, end) => {
                let record = self.sandboxes.get_mut(sandbox).expect("awaited");
                if end != HookEnd::Ok
                    && record.suspends()
                    && self.config.hooks.on_suspend_failure == SuspendHookFailure::Shutdown
                {
                    tracing::warn!(sandbox = %record.id, "before-suspend hook failed: shutting down instead");
                    record.suspend_no_more();
                }
                self.order_stop(sandbox);
            }
        }
    }
}

/// How a hook ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HookEnd {
    Ok,
    Failed,
    Late,
}
