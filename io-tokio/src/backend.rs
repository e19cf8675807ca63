//! The `Backend` trait: what a place to run sandboxes (local directories, Kubernetes pods, a
//! scripted test world) must do for the driver, and how it says what went wrong.

use std::future::Future;
use std::sync::Arc;

use sandkeeper::{Key, PathName, Payload, SandboxId, SessionId, Snapshot, Spec, UploadId, Version};

/// What kind of failure a backend met. The driver turns each into the core's input (see
/// `classify.rs`): the backend never decides lifecycle, it only reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The sandbox is gone (directory removed, pod deleted, claim expired, 404). Becomes the
    /// core's `died` (for an upload: `UploadFailure::Gone`; for a shutdown: done).
    Gone,
    /// The operation took too long (the backend's own deadline, or the driver's). Retried where
    /// the core retries (uploads), a failure elsewhere.
    Timeout,
    /// It may work if tried again (a dropped connection, a 5xx, a busy resource).
    Transient,
    /// It will not work if tried again (bad spec, permission denied, invalid state).
    Fatal,
}

/// A backend operation's failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{class:?}: {message}")]
pub struct BackendError {
    /// What kind of failure.
    pub class: FailureClass,
    /// What happened, for logs.
    pub message: String,
}

impl BackendError {
    /// A failure of `class`.
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        BackendError {
            class,
            message: message.into(),
        }
    }

    /// The sandbox is gone.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Gone, message)
    }

    /// It took too long.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Timeout, message)
    }

    /// Worth another try.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Transient, message)
    }

    /// Not worth another try.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Fatal, message)
    }
}

/// The core's `Start` command, for a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRequest {
    /// The new sandbox.
    pub sandbox: SandboxId,
    /// The isolation key it serves.
    pub key: Key,
    /// The spec of the call that caused the start.
    pub spec: Spec,
    /// The snapshot of the key's previous sandbox, to resume its workspace from.
    pub resume_from: Option<Snapshot>,
}

/// The core's `Upload` command, for a backend: write `payload` as `path` of `session` into
/// `sandbox`. Every name in it is validated (one safe path component).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadRequest {
    /// This upload.
    pub upload: UploadId,
    /// Where.
    pub sandbox: SandboxId,
    /// Whose file.
    pub session: SessionId,
    /// Which file.
    pub path: PathName,
    /// Which version.
    pub version: Version,
    /// The bytes.
    pub payload: Payload,
}

/// Where a backend reports sandboxes it learned are gone. Cheap to clone; reporting never
/// blocks on IO (it takes the keeper's lock for one core input).
#[derive(Clone)]
pub struct DeathSink {
    report: Arc<dyn Fn(SandboxId) -> bool + Send + Sync>,
    listening: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl DeathSink {
    /// A sink calling `report` for each death (it answers whether the keeper still listens),
    /// and `listening` to ask whether the keeper still listens.
    pub fn new(
        report: impl Fn(SandboxId) -> bool + Send + Sync + 'static,
        listening: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        DeathSink {
            report: Arc::new(report),
            listening: Arc::new(listening),
        }
    }

    /// Whether the keeper still listens (not closed, not dropped): a watcher stops when not.
    pub fn is_listening(&self) -> bool {
        (self.listening)()
    }

    /// Reports `sandbox` gone. Returns `false` once the keeper is closed or dropped: the
    /// watcher may stop then.
    pub fn report(&self, sandbox: SandboxId) -> bool {
        (self.report)(sandbox)
    }
}

impl std::fmt::Debug for DeathSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeathSink")
    }
}

/// A place to run sandboxes. The driver calls these for the core's commands, concurrently
/// across sandboxes and sessions, in the core's order for one sandbox's lifecycle (Start, Stop,
/// Persist, Shutdown one after the other; uploads alongside). Each future may be dropped
/// (cancelled) at any await point: when its upload is cancelled, when its deadline passes, or,
/// for a start, when the core orders the sandbox's Shutdown (or Stop) while it is outstanding;
/// the driver then calls `shutdown` at once, and it must leave nothing behind even if the
/// dropped start's work goes on elsewhere (a blocking thread).
///
/// A backend never decides lifecycle: it executes and reports, with a [`FailureClass`].
pub trait Backend: Send + Sync + 'static {
    /// Brings a sandbox up (resuming `resume_from`'s workspace when given).
    fn start(&self, request: StartRequest)
        -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Writes one version of a session's file into the sandbox, atomically (all or nothing).
    fn upload(
        &self,
        request: UploadRequest,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Stops the sandbox's processes; may return a snapshot of its workspace. After it, no
    /// write may land in the sandbox.
    fn stop(
        &self,
        sandbox: SandboxId,
    ) -> impl Future<Output = Result<Option<Snapshot>, BackendError>> + Send;

    /// Persists the stopped sandbox's snapshot.
    fn persist(
        &self,
        sandbox: SandboxId,
        snapshot: Option<Snapshot>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Frees everything the sandbox holds. "Already gone" is success.
    fn shutdown(&self, sandbox: SandboxId)
        -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Watches for sandboxes that disappear on their own and reports them to `deaths` until it
    /// answers `false`. The keeper runs this once, as its own task. The default watches
    /// nothing.
    fn watch_deaths(&self, deaths: DeathSink) -> impl Future<Output = ()> + Send {
        let _ = deaths;
        async {}
    }
}
