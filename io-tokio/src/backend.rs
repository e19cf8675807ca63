//! The `Backend` trait: what a place to run sandboxes (local directories, Kubernetes pods, a
//! scripted test world) must do for the driver, and how it says what went wrong.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use sandkeeper::{
    Config, DiscardReason, Key, PathName, Payload, SandboxId, SessionId, Snapshot, Spec, Token,
    UploadId, Version,
};

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
    /// Fleet mode: refused because the sandbox, or its key, has seen a newer fencing token:
    /// another process owns the key now. Becomes the core's `fenced` for every command.
    Fenced,
    /// Fleet mode across hosts: the sandbox is not on this host, and may be up on another
    /// host's (a local root with a [`Shelf`](crate::local::shelf::Shelf)). An Adopt so answered
    /// is the core's `instance_gone` (the sandbox is left to its key's next adoption, never
    /// shut down); any other command's, a transient failure.
    Elsewhere,
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

    /// Not on this host; maybe on another.
    pub fn elsewhere(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Elsewhere, message)
    }
}

/// The core's `Adopt` command (fleet mode), for a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptRequest {
    /// The sandbox another process handed over warm, under the id its first owner gave it.
    pub sandbox: SandboxId,
    /// Its key.
    pub key: Key,
    /// This owner's fencing token: record it as the newest the sandbox has seen.
    pub token: Token,
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
    /// The sandbox that persisted `resume_from`: the earlier incarnation this start continues.
    /// The core no longer tracks it; name the new incarnation's objects after `sandbox`, so
    /// that a late event of the old one names the old sandbox and the core ignores it.
    pub resumes: Option<SandboxId>,
    /// Fleet mode: the key owner's fencing token (see [`FailureClass::Fenced`]).
    pub token: Option<Token>,
}

/// The core's `Stop` command, for a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopRequest {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// It is being suspended: return a snapshot the key's next start can resume from.
    pub suspend: bool,
    /// Fleet mode: the key owner's fencing token.
    pub token: Option<Token>,
}

/// The core's `Persist` command, for a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistRequest {
    /// The sandbox, stopped.
    pub sandbox: SandboxId,
    /// The snapshot its stop returned.
    pub snapshot: Option<Snapshot>,
    /// Suspend it: keep it for a later start that resumes `snapshot`. When this persist
    /// succeeds, the driver never names the sandbox again but to discard its snapshot (a
    /// failure leads to its shutdown).
    pub suspend: bool,
    /// The end of the snapshot's retention on the wall clock, when the policy has one: record
    /// it with what is kept (a suspended claim's `shutdownTime`, an expiry file beside a
    /// snapshot directory) so that the snapshot goes then even if no keeper is left to
    /// discard it, and never earlier.
    pub retain_until: Option<SystemTime>,
    /// Fleet mode: the key owner's fencing token.
    pub token: Option<Token>,
}

/// The core's `Discard` command, for a backend: delete a snapshot its key no longer
/// references. No answer reaches the core; a failure is logged, and the snapshot's recorded
/// expiry (`PersistRequest::retain_until`) or a sweep collects it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscardRequest {
    /// The sandbox that persisted the snapshot (shut down or suspended by now).
    pub sandbox: SandboxId,
    /// The key it was kept for.
    pub key: Key,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Why it goes.
    pub reason: DiscardReason,
    /// Fleet mode: the key owner's fencing token.
    pub token: Option<Token>,
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
    /// Fleet mode: the key owner's fencing token.
    pub token: Option<Token>,
}

/// What a backend found gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loss {
    /// The whole sandbox: its workspace too (a claim deleted or expired, a directory removed,
    /// a pod of pod mode). The core's `handle_died`.
    Sandbox,
    /// Only its running instance (the pod of a claim); the workspace may remain. The core's
    /// `handle_instance_gone`: the core decides whether that is a death (it is not while the
    /// sandbox is being suspended).
    Instance,
}

/// Where a backend reports sandboxes it learned are gone, by the sandbox number it found on
/// the object. A report about an earlier incarnation of a resumed sandbox names that earlier
/// sandbox, and the core ignores it: a backend keeps no table of incarnations. Cheap to clone;
/// reporting never blocks on IO (it takes the keeper's lock for one core input).
#[derive(Clone)]
pub struct DeathSink {
    report: Arc<dyn Fn(SandboxId, Loss) -> bool + Send + Sync>,
    listening: Arc<dyn Fn() -> bool + Send + Sync>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl DeathSink {
    /// A sink calling `report` for each loss (it answers whether the keeper still listens),
    /// and `listening` to ask whether the keeper still listens; `stop` holds `true` while it
    /// listens and turns `false` (or loses its sender) when it stops, for
    /// [`stopped`](Self::stopped).
    pub fn new(
        report: impl Fn(SandboxId, Loss) -> bool + Send + Sync + 'static,
        listening: impl Fn() -> bool + Send + Sync + 'static,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        DeathSink {
            report: Arc::new(report),
            listening: Arc::new(listening),
            stop,
        }
    }

    /// Resolves once the keeper no longer listens (closed or dropped): a watcher that only
    /// reports what events tell it waits on this instead of polling
    /// [`is_listening`](Self::is_listening).
    pub async fn stopped(&self) {
        let mut stop = self.stop.clone();
        // An error: the keeper (the sender's owner) is gone, which is a stop too.
        let _ = stop.wait_for(|listening| !*listening).await;
    }

    /// Whether the keeper still listens (not closed, not dropped): a watcher stops when not.
    pub fn is_listening(&self) -> bool {
        (self.listening)()
    }

    /// Reports `sandbox` gone, whole. Returns `false` once the keeper is closed or dropped:
    /// the watcher may stop then.
    pub fn report(&self, sandbox: SandboxId) -> bool {
        (self.report)(sandbox, Loss::Sandbox)
    }

    /// Reports what of `sandbox` was lost. Returns as [`report`](Self::report).
    pub fn report_loss(&self, sandbox: SandboxId, loss: Loss) -> bool {
        (self.report)(sandbox, loss)
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
/// (cancelled) at any await point: when the core's deadline for it passes, when its upload is
/// cancelled, or when the core abandons the sandbox's outstanding start, stop or persist; for
/// an abandoned one the driver then calls `shutdown` at once, and it must leave nothing behind
/// even if the dropped operation's work goes on elsewhere (a blocking thread).
///
/// A backend never decides lifecycle: it executes and reports, with a [`FailureClass`].
pub trait Backend: Send + Sync + 'static {
    /// Whether this backend serves fleet mode (several processes over one backend): it checks
    /// the fencing token every request carries, [`adopt`](Self::adopt)s a sandbox another
    /// process handed over and [`relinquish`](Self::relinquish)es one. A keeper refuses to run
    /// a fleet configuration on a backend that does not. Default: `false`.
    const FLEET: bool = false;

    /// Brings a sandbox up (resuming `resume_from`'s workspace when given).
    fn start(&self, request: StartRequest)
        -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Writes one version of a session's file into the sandbox, atomically (all or nothing).
    fn upload(
        &self,
        request: UploadRequest,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Stops the sandbox's processes; may return a snapshot of its workspace (must, when
    /// `request.suspend`). After it, no write may land in the sandbox.
    fn stop(
        &self,
        request: StopRequest,
    ) -> impl Future<Output = Result<Option<Snapshot>, BackendError>> + Send;

    /// Persists the stopped sandbox's snapshot; with `request.suspend`, keeps the sandbox
    /// suspended for a later start that resumes the snapshot.
    fn persist(
        &self,
        request: PersistRequest,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Frees everything the sandbox holds. "Already gone" is success. `token`: fleet mode's
    /// fencing token, as in the requests.
    fn shutdown(
        &self,
        sandbox: SandboxId,
        token: Option<Token>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Deletes a snapshot its key no longer references (its retention passed, or a newer one
    /// superseded it). Runs beside everything, in no sandbox's order; "already gone" is
    /// success. A snapshot that a start took as `resume_from` is never discarded.
    fn discard(
        &self,
        request: DiscardRequest,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Fleet mode: takes over `request.sandbox`, which another process handed over warm:
    /// records the token as the newest it has seen (refusing an older one with `Fenced`) and
    /// checks the sandbox is still there (an error if not: the core starts the key afresh).
    /// Only called on a backend with [`FLEET`](Self::FLEET); the default refuses.
    fn adopt(
        &self,
        request: AdoptRequest,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = request;
        async {
            Err(BackendError::fatal(
                "this backend does not adopt sandboxes (fleet mode)",
            ))
        }
    }

    /// Fleet mode: this process no longer drives `sandbox` (handed over, or its key lost):
    /// forget it, leaving it as it is for the key's next owner. Never fails; the default has
    /// nothing to forget.
    fn relinquish(&self, sandbox: SandboxId) -> impl Future<Output = ()> + Send {
        let _ = sandbox;
        async {}
    }

    /// Whether this backend can serve a keeper whose core runs with `config` (a backend that
    /// cannot suspend refuses `ReleasePolicy::Suspend`, say). The keeper asks once, at
    /// construction, and refuses to start with the reason; the default accepts everything.
    /// The backend keeps nothing of the configuration: every command says what it needs.
    fn check_config(&self, config: &Config) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// Watches for sandboxes that disappear on their own and reports them to `deaths` until it
    /// answers `false`. The keeper runs this once, as its own task. The default watches
    /// nothing.
    fn watch_deaths(&self, deaths: DeathSink) -> impl Future<Output = ()> + Send {
        let _ = deaths;
        async {}
    }
}

#[cfg(test)]
mod death_sink_tests {
    use super::*;

    fn sink(stop: tokio::sync::watch::Receiver<bool>) -> DeathSink {
        DeathSink::new(|_, _| true, || true, stop)
    }

    /// `stopped` resolves when the keeper says it stopped listening, or when the keeper (the
    /// sender) is gone, and not before.
    #[tokio::test(start_paused = true)]
    async fn stopped_resolves_on_close_or_when_the_keeper_is_gone() {
        let (tx, rx) = tokio::sync::watch::channel(true);
        let s = sink(rx);
        let waiting = tokio::spawn(async move { s.stopped().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "still listening");
        tx.send_replace(false);
        waiting.await.unwrap();

        let (tx, rx) = tokio::sync::watch::channel(true);
        let s = sink(rx);
        let waiting = tokio::spawn(async move { s.stopped().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(tx);
        waiting.await.unwrap();
    }
}
