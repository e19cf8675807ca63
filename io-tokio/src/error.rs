//! What the keeper's calls can answer besides success.

use sandkeeper::{CallId, ErrorKind};

/// Why a keeper call was refused or did not give what it was asked for.
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
    /// The backend cannot serve the core's configuration (see `Backend::check_config`).
    #[error("the backend cannot serve this configuration: {0}")]
    Unsupported(String),
}

/// How an acquire ended without a sandbox (the shared layer's answer, before it is named for
/// the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallEnd {
    Failed(ErrorKind),
    Revoked,
    Closed,
}

impl CallEnd {
    pub(crate) fn into_error(self, call: CallId) -> KeeperError {
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
