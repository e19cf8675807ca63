//! Errors: bad input is a typed error and changes nothing; reasons a call failed or a version
//! was dropped.

use serde::{Deserialize, Serialize};

use crate::ids::{Key, SandboxId, UploadId};
use crate::name::{CallId, InvalidName, SessionId};

/// Why an input was rejected. A rejected input changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize)]
pub enum Error {
    /// `close` was called: new calls are refused, and after `Closed` every input is.
    #[error("sandkeeper is closed: {what} was refused")]
    Closed {
        /// The refused input.
        what: &'static str,
    },
    /// No live call has this name (and none ended recently under it).
    #[error("no live call is named {call}")]
    UnknownCall {
        /// The name.
        call: CallId,
    },
    /// A live call already has this name.
    #[error("a live call is already named {call}")]
    DuplicateCall {
        /// The name.
        call: CallId,
    },
    /// This call has already ended (released, failed or revoked).
    #[error("call {call} has already ended")]
    AlreadyReleased {
        /// The name.
        call: CallId,
    },
    /// A name was malformed.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// The session has no live call bound to a sandbox.
    #[error("session {session} has no active sandbox: none of its calls is bound to a sandbox that is up")]
    NoActiveSandbox {
        /// The session.
        session: SessionId,
    },
    /// The session's call is bound to a sandbox the backend reported gone.
    #[error("the sandbox {sandbox} of session {session} is gone")]
    SandboxGone {
        /// The session.
        session: SessionId,
        /// The sandbox that died.
        sandbox: SandboxId,
    },
    /// The key's wait queue is full.
    #[error("{max} calls already wait for key {key}")]
    QueueFull {
        /// The key.
        key: Key,
        /// The configured `max_waiters`.
        max: usize,
    },
    /// No sandbox with this id was ever made.
    #[error("no sandbox {sandbox} was ever made")]
    UnknownSandbox {
        /// The id.
        sandbox: SandboxId,
    },
    /// No upload with this id was ever ordered.
    #[error("no upload {upload} was ever ordered")]
    UnknownUpload {
        /// The id.
        upload: UploadId,
    },
    /// `unhold` without a hold.
    #[error("session {session} holds nothing to let go")]
    NotHeld {
        /// The session.
        session: SessionId,
    },
    /// `leave` of a sandbox no work was entered into.
    #[error("no work was entered into sandbox {sandbox}")]
    NotEntered {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Scope `User` and the call named no user.
    #[error("call {call} names no user, and the scope is per user")]
    MissingUser {
        /// The call.
        call: CallId,
    },
    /// A configured limit would be crossed.
    #[error("limit {limit} ({max}) reached")]
    LimitExceeded {
        /// The limit's name in [`Limits`](crate::Limits).
        limit: &'static str,
        /// Its value.
        max: usize,
    },
    /// A store answer names work the core never ordered (fleet mode).
    #[error("no {what} {id} was ever ordered")]
    UnknownStoreWork {
        /// What kind of store work (`renewal`, ...).
        what: &'static str,
        /// Its number.
        id: u64,
    },
    /// `drop_snapshot` of a key that has a sandbox or a call: what it keeps is in use.
    #[error("key {key} has a sandbox or a call: its snapshot is in use")]
    KeyInUse {
        /// The key.
        key: Key,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {field} {why}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl Error {
    /// The error's kind, as scenario files and events name it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Closed { .. } => ErrorKind::Closed,
            Error::UnknownCall { .. } => ErrorKind::UnknownCall,
            Error::DuplicateCall { .. } => ErrorKind::DuplicateCall,
            Error::AlreadyReleased { .. } => ErrorKind::AlreadyReleased,
            Error::InvalidName(_) => ErrorKind::InvalidName,
            Error::NoActiveSandbox { .. } => ErrorKind::NoActiveSandbox,
            Error::SandboxGone { .. } => ErrorKind::SandboxGone,
            Error::QueueFull { .. } => ErrorKind::QueueFull,
            Error::UnknownSandbox { .. } => ErrorKind::UnknownSandbox,
            Error::UnknownUpload { .. } => ErrorKind::UnknownUpload,
            Error::NotHeld { .. } => ErrorKind::NotHeld,
            Error::NotEntered { .. } => ErrorKind::NotEntered,
            Error::MissingUser { .. } => ErrorKind::MissingUser,
            Error::LimitExceeded { .. } => ErrorKind::LimitExceeded,
            Error::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            Error::KeyInUse { .. } => ErrorKind::KeyInUse,
            Error::UnknownStoreWork { .. } => ErrorKind::UnknownStoreWork,
        }
    }
}

/// The kinds of errors and of call failures, in the kebab case of scenario files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// See [`Error::Closed`]; as a call failure: the call was queued when close began.
    Closed,
    /// See [`Error::UnknownCall`].
    UnknownCall,
    /// See [`Error::DuplicateCall`].
    DuplicateCall,
    /// See [`Error::AlreadyReleased`].
    AlreadyReleased,
    /// See [`Error::InvalidName`].
    InvalidName,
    /// See [`Error::NoActiveSandbox`].
    NoActiveSandbox,
    /// See [`Error::SandboxGone`]; as a call failure: the sandbox died while starting.
    SandboxGone,
    /// A call failure: it waited for its key longer than `wait_timeout`.
    WaitTimeout,
    /// See [`Error::QueueFull`].
    QueueFull,
    /// A call failure: its sandbox's Start failed.
    StartFailed,
    /// A call failure: its sandbox's Start took longer than `start_timeout`.
    StartTimeout,
    /// A call failure: its sandbox started, but its after-start or after-resume hook failed or
    /// outlasted its timeout ([`Hooks`](crate::Hooks)); the sandbox went down unused.
    HookFailed,
    /// See [`Error::UnknownSandbox`].
    UnknownSandbox,
    /// See [`Error::UnknownUpload`].
    UnknownUpload,
    /// See [`Error::NotHeld`].
    NotHeld,
    /// See [`Error::NotEntered`].
    NotEntered,
    /// See [`Error::MissingUser`].
    MissingUser,
    /// See [`Error::LimitExceeded`].
    LimitExceeded,
    /// See [`Error::InvalidConfig`].
    InvalidConfig,
    /// See [`Error::UnknownStoreWork`].
    UnknownStoreWork,
    /// See [`Error::KeyInUse`].
    KeyInUse,
    /// A call failure, fleet mode: this process lost the call's key while the call was starting
    /// (its lease lapsed, or the backend refused its token).
    Fenced,
}

impl ErrorKind {
    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Closed => "closed",
            ErrorKind::UnknownCall => "unknown-call",
            ErrorKind::DuplicateCall => "duplicate-call",
            ErrorKind::AlreadyReleased => "already-released",
            ErrorKind::InvalidName => "invalid-name",
            ErrorKind::NoActiveSandbox => "no-active-sandbox",
            ErrorKind::SandboxGone => "sandbox-gone",
            ErrorKind::WaitTimeout => "wait-timeout",
            ErrorKind::QueueFull => "queue-full",
            ErrorKind::StartFailed => "start-failed",
            ErrorKind::StartTimeout => "start-timeout",
            ErrorKind::HookFailed => "hook-failed",
            ErrorKind::UnknownSandbox => "unknown-sandbox",
            ErrorKind::UnknownUpload => "unknown-upload",
            ErrorKind::NotHeld => "not-held",
            ErrorKind::NotEntered => "not-entered",
            ErrorKind::MissingUser => "missing-user",
            ErrorKind::LimitExceeded => "limit-exceeded",
            ErrorKind::InvalidConfig => "invalid-config",
            ErrorKind::UnknownStoreWork => "unknown-store-work",
            ErrorKind::KeyInUse => "key-in-use",
            ErrorKind::Fenced => "fenced",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a flushed version settled without reaching a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// Its session's sandbox died (or an upload reported it gone).
    SandboxGone,
    /// The sandbox's drain deadline passed first.
    DrainDeadline,
    /// Close revoked it.
    Closed,
    /// Its session had no sandbox to receive it.
    NoSandbox,
    /// Every attempt failed.
    UploadFailed,
    /// An attempt took longer than `upload_timeout`.
    UploadTimeout,
    /// Fleet mode: this process lost its session's key (its lease lapsed, or the backend
    /// refused its token): the version was not written by this process, and is not its to write;
    /// so with a version flushed after the loss, or while the key is being claimed, until a call
    /// of the session is ready (what the application wrote then was not made after the owner's
    /// last write).
    Fenced,
}

impl DropReason {
    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::SandboxGone => "sandbox-gone",
            DropReason::DrainDeadline => "drain-deadline",
            DropReason::Closed => "closed",
            DropReason::NoSandbox => "no-sandbox",
            DropReason::UploadFailed => "upload-failed",
            DropReason::UploadTimeout => "upload-timeout",
            DropReason::Fenced => "fenced",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
