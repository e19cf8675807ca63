//! The application's side of operations: [`SandboxWork`], the work of one call or one session
//! in one sandbox, and [`SessionWork`], which keeps a session's sandbox from being stopped
//! under its work.

use std::marker::PhantomData;
use std::sync::Arc;

use sandkeeper::{CallId, CallStatus, HookPoint, SandboxId, SandboxState, SessionId};
use sandkeeper_shell::Shared;

use super::{
    Chunk, Entry, ExecOptions, ExecOutput, ExecRequest, Input, OpError, SandboxOps, WorkPath,
    DEFAULT_READ_CAP,
};
use crate::executor::TokioExecutor;

/// Whose work it is, which decides what is checked before each operation.
#[derive(Clone, Debug)]
enum Owner {
    /// A call's, through its guard: the live call keeps its sandbox up; the sandbox may die.
    Call(CallId),
    /// A session's, entered into the session's sandbox: it may also have been ordered to stop
    /// (past the drain deadline).
    Session(SessionId),
    /// A hook's, which the core ordered: the sandbox is between its Start and its calls (after)
    /// or between its drain and its Stop (before).
    Hook(HookPoint),
}

/// Work in one sandbox on behalf of a call ([`CallGuard::work`](crate::CallGuard::work)) or a
/// session ([`SessionWork`]). Every operation first checks, in the keeper, that the sandbox
/// may still take the work, and runs only there; a sandbox found gone is reported to the
/// keeper as a death.
///
/// Errors, by [`OpError::class`]: the sandbox going away — it died, was removed from outside,
/// was stopped or ordered to stop, or the keeper closed — is [`OpError::SandboxGone`], whether
/// it happened before the operation or while it ran (a failure its going away explains is
/// answered as such, [`SandboxOps::went_away`]); [`OpError::Fenced`] in fleet mode once another
/// process owns the key; [`OpError::Unbound`] for a hook's work used past its hook; refused
/// input ([`OpError::InvalidPath`], [`OpError::Escapes`], [`OpError::NotFound`],
/// [`OpError::NotAFile`], [`OpError::NotADirectory`], [`OpError::EmptyArgv`],
/// [`OpError::InvalidEnv`], [`OpError::Spawn`]); limits ([`OpError::TooLarge`],
/// [`OpError::Timeout`]); [`OpError::Backend`] for a failure a retry may not meet.
/// [`OpError::NoActiveSandbox`] and [`OpError::Stopped`] never come from it.
pub struct SandboxWork<'a, B: SandboxOps> {
    shared: Arc<Shared<TokioExecutor<B>>>,
    sandbox: SandboxId,
    owner: Owner,
    _guard: PhantomData<&'a ()>,
}

impl<B: SandboxOps> SandboxWork<'_, B> {
    pub(crate) fn for_call(
        shared: Arc<Shared<TokioExecutor<B>>>,
        sandbox: SandboxId,
        call: CallId,
    ) -> Self {
        SandboxWork {
            shared,
            sandbox,
            owner: Owner::Call(call),
            _guard: PhantomData,
        }
    }

    pub(crate) fn for_hook(
        shared: Arc<Shared<TokioExecutor<B>>>,
        sandbox: SandboxId,
        point: HookPoint,
    ) -> Self {
        SandboxWork {
            shared,
            sandbox,
            owner: Owner::Hook(point),
            _guard: PhantomData,
        }
    }

    /// The sandbox the work runs in.
    pub fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// Runs a command (argv only, never a shell string). Errors: see [`OpError`].
    pub async fn exec<S: Into<String>>(
        &self,
        argv: impl IntoIterator<Item = S>,
        options: ExecOptions,
    ) -> Result<ExecOutput, OpError> {
        let request = ExecRequest::new(argv.into_iter().map(Into::into).collect(), options)?;
        let x = self.check()?;
        self.settle(self.backend().exec(x, request).await).await
    }

    /// Runs a command like [`exec`](Self::exec), sending its output to `chunks` as it comes
    /// (for long commands: a build, a test run). The returned output is capped as for `exec`.
    pub async fn exec_streaming<S: Into<String>>(
        &self,
        argv: impl IntoIterator<Item = S>,
        options: ExecOptions,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
    ) -> Result<ExecOutput, OpError> {
        let request = ExecRequest::new(argv.into_iter().map(Into::into).collect(), options)?;
        let x = self.check()?;
        self.settle(self.backend().exec_streaming(x, request, chunks).await)
            .await
    }

    /// Runs a command like [`exec_streaming`](Self::exec_streaming) whose standard input stays
    /// open while it runs, fed from `input` (E2B's `commands.run(..., stdin=True)` with
    /// `send_stdin` and `close_stdin`): `options.stdin` first, then each [`Input::Stdin`] in
    /// order; [`Input::Close`] or the sender dropped closes it. A full channel holds the
    /// sender back; once the command stopped reading, what is sent is dropped, and once the
    /// exec ended `send` fails. The timeout holds as for `exec`. A backend that cannot feed a
    /// running command answers [`OpError::Unsupported`] ([`SandboxOps::exec_with_input`]).
    pub async fn exec_with_input<S: Into<String>>(
        &self,
        argv: impl IntoIterator<Item = S>,
        options: ExecOptions,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
        input: tokio::sync::mpsc::Receiver<Input>,
    ) -> Result<ExecOutput, OpError> {
        let request = ExecRequest::new(argv.into_iter().map(Into::into).collect(), options)?;
        let x = self.check()?;
        self.settle(
            self.backend()
                .exec_with_input(x, request, chunks, input)
                .await,
        )
        .await
    }

    /// Writes a file atomically, making its parent directories.
    pub async fn write(&self, path: &str, bytes: impl Into<Vec<u8>>) -> Result<(), OpError> {
        let path = WorkPath::new(path)?;
        path.writable()?;
        let bytes = bytes.into();
        let x = self.check()?;
        self.settle(self.backend().write(x, path, bytes).await)
            .await
    }

    /// Reads a file of at most [`DEFAULT_READ_CAP`] bytes.
    pub async fn read(&self, path: &str) -> Result<Vec<u8>, OpError> {
        self.read_capped(path, DEFAULT_READ_CAP).await
    }

    /// Reads a file of at most `cap` bytes ([`OpError::TooLarge`] beyond).
    pub async fn read_capped(&self, path: &str, cap: usize) -> Result<Vec<u8>, OpError> {
        let path = WorkPath::new(path)?;
        let x = self.check()?;
        self.settle(self.backend().read(x, path, cap).await).await
    }

    /// Lists a directory (`"."`: the workspace), by name.
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>, OpError> {
        let dir = WorkPath::new(dir)?;
        let x = self.check()?;
        self.settle(self.backend().list(x, dir).await).await
    }

    /// Removes a file, or a directory with everything in it.
    pub async fn remove(&self, path: &str) -> Result<(), OpError> {
        let path = WorkPath::new(path)?;
        path.writable()?;
        let x = self.check()?;
        self.settle(self.backend().remove(x, path).await).await
    }

    /// Whether something exists at the path.
    pub async fn exists(&self, path: &str) -> Result<bool, OpError> {
        let path = WorkPath::new(path)?;
        let x = self.check()?;
        self.settle(self.backend().exists(x, path).await).await
    }

    /// The sandbox, if it may take work now by the keeper's state.
    fn check(&self) -> Result<SandboxId, OpError> {
        let sandbox = self.sandbox;
        let gone = |why: &str| OpError::SandboxGone {
            sandbox,
            why: why.to_string(),
        };
        match &self.owner {
            Owner::Call(call) => match self.shared.with_core(|c| c.call_status(call)) {
                Some(CallStatus::Ready(x)) if x == sandbox => Ok(sandbox),
                Some(CallStatus::Lost(_)) => Err(gone("the keeper knows it dead")),
                // The guard lives, so the call ended only by the keeper's doing: close revoked
                // it, and its sandbox went with it.
                other => Err(gone(&format!(
                    "call {call} is no longer bound to it ({other:?}): the keeper closed"
                ))),
            },
            Owner::Session(session) => match self.shared.with_core(|c| c.sandbox_state(sandbox)) {
                Some(SandboxState::Running | SandboxState::Idle | SandboxState::Draining) => {
                    Ok(sandbox)
                }
                Some(SandboxState::Dead) | None => Err(gone("the keeper knows it dead or gone")),
                Some(state) => Err(gone(&format!(
                    "session {session}'s sandbox was ordered to stop (it is {state:?})"
                ))),
            },
            Owner::Hook(point) => {
                let want = if point.is_after() {
                    SandboxState::Starting
                } else {
                    SandboxState::Stopping
                };
                match self.shared.with_core(|c| c.sandbox_state(sandbox)) {
                    Some(state) if state == want => Ok(sandbox),
                    Some(SandboxState::Dead) | None => {
                        Err(gone("the keeper knows it dead or gone"))
                    }
                    Some(state) => Err(OpError::Unbound {
                        sandbox,
                        why: format!(
                            "the {} hook of {sandbox} runs past its place (the sandbox is {state:?})",
                            point.as_str()
                        ),
                    }),
                }
            }
        }
    }

    fn backend(&self) -> &B {
        self.shared.executor().backend()
    }

    /// The backend's answer as the caller gets it: a failure the sandbox's going away explains
    /// is answered as that ([`SandboxOps::went_away`]), what the operation learnt is reported
    /// ([`seen`](Self::seen)), and a backend's `Stopped` is `SandboxGone` (one answer for the
    /// sandbox going away, whatever the moment).
    async fn settle<T>(&self, r: Result<T, OpError>) -> Result<T, OpError> {
        let r = match r {
            Err(
                e @ (OpError::Spawn { .. }
                | OpError::Backend { .. }
                | OpError::NotFound { .. }
                | OpError::NotADirectory { .. }),
            ) => Err(self.backend().went_away(self.sandbox).await.unwrap_or(e)),
            r => r,
        };
        self.seen(r).map_err(|e| match e {
            // The keeper ordered it: no death to report.
            OpError::Stopped { sandbox } => OpError::SandboxGone {
                sandbox,
                why: "stopped by the keeper".into(),
            },
            e => e,
        })
    }

    /// Reports to the keeper what an operation learnt: a sandbox found gone (a death), a token
    /// refused (the key is fenced).
    fn seen<T>(&self, r: Result<T, OpError>) -> Result<T, OpError> {
        match &r {
            Err(OpError::SandboxGone { why, .. }) => {
                tracing::info!(sandbox = %self.sandbox, %why, "an operation found its sandbox gone");
                Shared::answer(
                    &self.shared,
                    sandkeeper::Input::Died {
                        sandbox: self.sandbox,
                    },
                );
            }
            Err(OpError::Fenced { why, .. }) => {
                tracing::warn!(sandbox = %self.sandbox, %why, "an operation was fenced");
                Shared::answer(
                    &self.shared,
                    sandkeeper::Input::Fenced {
                        sandbox: self.sandbox,
                    },
                );
            }
            _ => {}
        }
        r
    }
}

impl<B: SandboxOps> std::fmt::Debug for SandboxWork<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxWork")
            .field("sandbox", &self.sandbox)
            .field("owner", &self.owner)
            .finish()
    }
}

/// A session's work in its sandbox, for code that acts for a session without its call
/// ([`Keeper::session_work`](crate::Keeper::session_work)): resolving the session's sandbox
/// and entering it happen in one step, so a draining sandbox waits for this work (up to the
/// drain deadline) instead of being stopped under it. Dropping it lets the sandbox go.
/// Entering a session without a sandbox its work may use is [`OpError::NoActiveSandbox`]
/// ([`Keeper::session_work`](crate::Keeper::session_work)). Once entered, the sandbox going
/// away (it died, or was ordered to stop past the drain deadline) is [`OpError::SandboxGone`]
/// for every operation, before anything runs or while it runs, whatever the moment; see
/// [`SandboxWork`] for every error.
pub struct SessionWork<B: SandboxOps> {
    work: SandboxWork<'static, B>,
    /// Left already ([`SessionWork::leave`]): the drop has nothing to do.
    left: bool,
}

impl<B: SandboxOps> SessionWork<B> {
    pub(crate) fn enter(
        shared: Arc<Shared<TokioExecutor<B>>>,
        session: &SessionId,
    ) -> Result<Self, OpError> {
        let sandbox = shared.enter(session).map_err(|e| match e {
            crate::KeeperError::Core(sandkeeper::Error::NoActiveSandbox { session }) => {
                OpError::NoActiveSandbox { session }
            }
            other => OpError::Keeper(other),
        })?;
        Ok(SessionWork {
            work: SandboxWork {
                shared,
                sandbox,
                owner: Owner::Session(session.clone()),
                _guard: PhantomData,
            },
            left: false,
        })
    }

    /// Ends the work now and says how the keeper took it (dropping it does the same, and
    /// says nothing). Errors: `Keeper(Core(Closed))` after close.
    pub fn leave(mut self) -> Result<(), OpError> {
        self.left = true;
        self.work
            .shared
            .leave(self.work.sandbox)
            .map_err(OpError::Keeper)
    }
}

impl<B: SandboxOps> std::ops::Deref for SessionWork<B> {
    type Target = SandboxWork<'static, B>;

    fn deref(&self) -> &Self::Target {
        &self.work
    }
}

impl<B: SandboxOps> Drop for SessionWork<B> {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        if let Err(e) = self.work.shared.leave(self.work.sandbox) {
            // Only after close: nothing is left to let go then.
            tracing::debug!(error = %e, sandbox = %self.work.sandbox, "leave");
        }
    }
}

impl<B: SandboxOps> std::fmt::Debug for SessionWork<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SessionWork").field(&self.work).finish()
    }
}
