//! Operations: the application's own work in a sandbox (running a command, reading or writing
//! a file) begun by context-free code that acts for a session. This file owns entering and
//! leaving: which sandbox such work may use, and the count of work in each sandbox
//! (`Sandbox::operations`) that keeps its drain from ending under the work.
//!
//! A call's own work needs none of this: a live call keeps its sandbox from draining. Work for
//! a session whose call may end meanwhile enters the sandbox the session's work goes to now
//! (the one its mirror targets: its first ready call's sandbox that accepts work, else the
//! sandbox of its last released call while that one is warm or drains), and leaves it when
//! done. While work is in it, a draining sandbox waits, up to the drain deadline as for a
//! hold; past the deadline the sandbox stops anyway, and the driver refuses further work in
//! it. Entering and leaving order nothing by themselves: they only delay the end of a drain.

use crate::error::Error;
use crate::ids::SandboxId;
use crate::lifecycle::Lifecycle;
use crate::name::SessionId;
use crate::time::Instant;

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Operations

    /// Context-free code acting for `session` begins work in the session's sandbox, and is told
    /// which: the sandbox the session's mirror targets (see the module docs). Until the
    /// matching [`leave`](Self::leave), a drain of that sandbox does not end (up to the drain
    /// deadline). Never another session's sandbox. O(1).
    ///
    /// Errors: `NoActiveSandbox` when the session has no sandbox its work may use (no live
    /// call bound to one that is up, and no warm or draining one of its last call: a sandbox
    /// ordered to stop is never entered); `LimitExceeded` (`max_operations_per_sandbox`);
    /// `Closed` after close finished.
    pub fn enter(&mut self, now: Instant, session: &SessionId) -> Result<SandboxId, Error> {
        self.time_passes(now);
        self.check_not_closed("enter")?;
        let no_sandbox = || Error::NoActiveSandbox {
            session: session.clone(),
        };
        let s = self.sessions.find(session).ok_or_else(no_sandbox)?;
        let target = self.sessions[s].target.ok_or_else(no_sandbox)?;
        let sandbox = &self.sandboxes[target];
        debug_assert!(sandbox.accepts_uploads(), "a target accepts work");
        let max = self.config.limits.max_operations_per_sandbox;
        if sandbox.operations >= max {
            return Err(Error::LimitExceeded {
                limit: "max_operations_per_sandbox",
                max: max as usize,
            });
        }
        self.advance(now);
        let sandbox = self.sandboxes.get_mut(target).expect("found above");
        sandbox.operations += 1;
        let id = sandbox.id;
        tracing::debug!(session = %session, sandbox = %id, "enter");
        self.finish_input();
        Ok(id)
    }

    /// Work begun with [`enter`](Self::enter) in `sandbox` ends. A draining sandbox with no
    /// other work, hold or upload left ends its drain. A sandbox the core no longer tracks
    /// (it died, or was shut down after its drain deadline, and was forgotten) has nothing to
    /// let go: that is not an error. O(1).
    ///
    /// Errors: `UnknownSandbox` for an id never handed out; `NotEntered` when the sandbox is
    /// tracked and no work is in it; `Closed` after close finished.
    pub fn leave(&mut self, now: Instant, sandbox: SandboxId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("leave")?;
        self.check_sandbox_id(sandbox)?;
        let Some(entered) = self.sandboxes.find(sandbox) else {
            return Ok(());
        };
        if self.sandboxes[entered].operations == 0 {
            return Err(Error::NotEntered { sandbox });
        }
        self.advance(now);
        self.sandboxes
            .get_mut(entered)
            .expect("found above")
            .operations -= 1;
        tracing::debug!(sandbox = %sandbox, "leave");
        self.reconcile.sandbox(entered);
        self.finish_input();
        Ok(())
    }

    /// How much entered work is in a sandbox the core tracks. O(1).
    pub fn operations_in(&self, sandbox: SandboxId) -> Option<u32> {
        let entered = self.sandboxes.find(sandbox)?;
        Some(self.sandboxes[entered].operations)
    }
}
