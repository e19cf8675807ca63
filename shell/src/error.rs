//! What the shell's calls can answer besides success: [`KeeperError`] for a refusal, [`CallEnd`]
//! for an acquire that ended without a sandbox, [`Released`] for how a release ended.

use sandkeeper::{CallId, ErrorKind};

/// Why a keeper call was refused or did not give what it was asked for.
///
/// [`Shared`](crate::Shared)'s methods answer `Core`; [`CallEnd::into_error`] names an acquire
/// that ended without a sandbox (`CallFailed`, `Revoked`, `Closed`); `InvalidConfig` and
/// `Unsupported` are for the driver that builds the shell (io-tokio's `Keeper::new`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeeperError {
    /// The core refused the input (closed, duplicate call, unknown session, limit, bad name,
    /// ...); nothing changed.
    #[error(transparent)]
    Core(#[from] sandkeeper::Error),
    /// The call ended without becoming ready: its start failed or timed out, it waited too
    /// long for its key, its sandbox died while starting, or close refused it.
    #[error("call {call} failed: {error}")]
    CallFailed {
        /// The call.
        call: CallId,
        /// Why, as the core says.
        error: ErrorKind,
    },
    /// Close revoked the call at its deadline before the caller saw it ready.
    #[error("call {call} was revoked by close")]
    Revoked {
        /// The call.
        call: CallId,
    },
    /// The keeper closed before it could answer.
    #[error("the keeper is closed")]
    Closed,
    /// The keeper could not be built (a bad configuration).
    #[error("invalid keeper configuration: {0}")]
    InvalidConfig(&'static str),
    /// The backend cannot serve the core's configuration (io-tokio: `Backend::check_config`).
    #[error("the backend cannot serve this configuration: {0}")]
    Unsupported(String),
}

/// How an acquire ended without a sandbox: the answer of
/// [`PendingCall::ready`](crate::PendingCall::ready), before it is named for the caller with
/// [`into_error`](Self::into_error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEnd {
    /// The core failed the call (`CallFailed`): its start failed or timed out, it waited too
    /// long for its key, its sandbox died while starting, or close refused it.
    Failed(ErrorKind),
    /// Close revoked the call at its deadline before it was ready.
    Revoked,
    /// Close finished (or the shell was dropped) before the call was ready.
    Closed,
}

impl CallEnd {
    /// The [`KeeperError`] that tells `call`'s caller how it ended.
    pub fn into_error(self, call: CallId) -> KeeperError {
        match self {
            CallEnd::Failed(error) => KeeperError::CallFailed { call, error },
            CallEnd::Revoked => KeeperError::Revoked { call },
            CallEnd::Closed => KeeperError::Closed,
        }
    }
}

/// How a release ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The core completed the release (`CallReleased`): the session's mirror work for the
    /// call's sandbox has settled.
    Completed,
    /// Close had already revoked the call; there was nothing left to release.
    Revoked,
    /// The keeper closed before the release completed; close settled what was left.
    Closed,
}
