//! The call guard: a ready call's sandbox, and its one release.

use sandkeeper::{CallId, SandboxId, SessionId, WayDown};
use sandkeeper_shell::{CallTicket, Released};
use tracing::{Instrument, Span};

use crate::backend::Backend;
use crate::executor::TokioExecutor;

/// A ready call, bound to its sandbox. Release it with [`release`](Self::release) to wait until
/// the release completed (its session's mirror work for the sandbox settled); dropping it
/// releases too, at once, without blocking and without losing the release. Either way the call
/// is released exactly once.
pub struct CallGuard<B: Backend> {
    ticket: CallTicket<TokioExecutor<B>>,
    session: SessionId,
    span: Span,
}

impl<B: Backend> CallGuard<B> {
    pub(crate) fn new(
        ticket: CallTicket<TokioExecutor<B>>,
        session: SessionId,
        span: Span,
    ) -> Self {
        CallGuard {
            ticket,
            session,
            span,
        }
    }

    /// The call.
    pub fn call(&self) -> &CallId {
        self.ticket.call()
    }

    /// The call's session.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// The sandbox the call is bound to: every file operation of the call goes there.
    pub fn sandbox(&self) -> SandboxId {
        self.ticket.sandbox()
    }

    /// Whether the sandbox died while the call held it (the core said `SandboxLost`). The call
    /// stays live until released.
    pub fn is_lost(&self) -> bool {
        self.ticket.is_lost()
    }

    /// The call's work in its sandbox: commands and files, there and nowhere else, for as long
    /// as the guard lives.
    pub fn work(&self) -> crate::ops::SandboxWork<'_, B>
    where
        B: crate::ops::SandboxOps,
    {
        crate::ops::SandboxWork::for_call(
            self.ticket.shared().clone(),
            self.sandbox(),
            self.call().clone(),
        )
    }

    /// The call's tracing span.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Releases the call and waits until the release completed.
    pub async fn release(self) -> Released {
        let CallGuard { ticket, span, .. } = self;
        let wait = span.in_scope(|| ticket.release());
        wait.instrument(span).await.unwrap_or(Released::Closed)
    }

    /// Releases the call asking its sandbox's way down, and waits until the release completed:
    /// when it is the sandbox's last call, `WayDown::Suspend` pauses the sandbox (drain, Stop,
    /// Persist: kept for its key's next call, which resumes it) and `WayDown::Shutdown` lets it
    /// go (drain, Stop, Shutdown), whatever the keeper's release policy says
    /// (`Lifecycle::release_as`).
    pub async fn release_as(self, way: WayDown) -> Released {
        let CallGuard { ticket, span, .. } = self;
        let wait = span.in_scope(|| ticket.release_as(way));
        wait.instrument(span).await.unwrap_or(Released::Closed)
    }
}

impl<B: Backend> std::fmt::Debug for CallGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallGuard")
            .field("call", self.call())
            .field("session", &self.session)
            .field("sandbox", &self.sandbox())
            .finish()
    }
}
