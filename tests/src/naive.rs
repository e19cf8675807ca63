//! A baseline driver built the naive way, to measure sandkeeper's driver against: the shape of
//! the production harness of `docs/design.md`'s R13.
//!
//! - One process-wide FIFO mirror queue with one worker: every session's uploads go through it,
//!   one at a time, each bounded by an upload timeout (the only defence it has against a hung
//!   upload).
//! - A release drains that queue before it stops anything: it puts a barrier at the tail and
//!   waits for the worker to reach it, so it waits for every upload queued before it, of every
//!   session. Then Stop and Shutdown, in line.
//!
//! It runs on the same [`Backend`] trait as the real driver, so both can be measured on one
//! backend. It keeps no lifecycle state beyond one sandbox per session and guards against none
//! of the races: it exists to be measured, never to be used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkeeper::{Key, PathName, Payload, SandboxId, SessionId, Spec, UploadId, Version};
use sandkeeper_tokio::{Backend, BackendError, StartRequest, StopRequest, UploadRequest};
use tokio::sync::{mpsc, oneshot};

/// One entry of the process-wide mirror queue.
enum Job {
    /// Write this into its sandbox.
    Upload(UploadRequest),
    /// A release waits until the worker reaches this point.
    Barrier(oneshot::Sender<()>),
}

/// The naive driver: one sandbox per session, one FIFO mirror queue for everything.
pub struct NaiveKeeper<B: Backend> {
    backend: Arc<B>,
    queue: mpsc::UnboundedSender<Job>,
    bound: Mutex<HashMap<SessionId, SandboxId>>,
    versions: Mutex<HashMap<(SessionId, PathName), u64>>,
    next_sandbox: AtomicU64,
    next_upload: AtomicU64,
}

impl<B: Backend> NaiveKeeper<B> {
    /// A naive keeper over `backend`; its queue's worker runs on the current tokio runtime and
    /// gives each upload at most `upload_timeout`.
    pub fn new(backend: B, upload_timeout: Duration) -> Self {
        let backend = Arc::new(backend);
        let (queue, mut jobs) = mpsc::unbounded_channel::<Job>();
        let worker = backend.clone();
        tokio::spawn(async move {
            while let Some(job) = jobs.recv().await {
                match job {
                    Job::Upload(request) => {
                        let _ = tokio::time::timeout(upload_timeout, worker.upload(request)).await;
                    }
                    Job::Barrier(reached) => {
                        let _ = reached.send(());
                    }
                }
            }
        });
        NaiveKeeper {
            backend,
            queue,
            bound: Mutex::new(HashMap::new()),
            versions: Mutex::new(HashMap::new()),
            next_sandbox: AtomicU64::new(0),
            next_upload: AtomicU64::new(0),
        }
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Starts a sandbox for `session` and binds it.
    pub async fn acquire(&self, session: &SessionId) -> Result<SandboxId, BackendError> {
        let sandbox = SandboxId(self.next_sandbox.fetch_add(1, Ordering::Relaxed));
        let request = StartRequest {
            sandbox,
            key: Key::Session(session.clone()),
            spec: Spec::default(),
            resume_from: None,
            resumes: None,
            token: None,
        };
        self.backend.start(request).await?;
        lock(&self.bound).insert(session.clone(), sandbox);
        Ok(sandbox)
    }

    /// Queues the next version of `path` of `session` for its bound sandbox; `None` when the
    /// session has none.
    pub fn flush(&self, session: &SessionId, path: &PathName, bytes: Vec<u8>) -> Option<Version> {
        let sandbox = *lock(&self.bound).get(session)?;
        let version = {
            let mut versions = lock(&self.versions);
            let v = versions.entry((session.clone(), path.clone())).or_default();
            *v += 1;
            Version(*v)
        };
        let request = UploadRequest {
            upload: UploadId(self.next_upload.fetch_add(1, Ordering::Relaxed)),
            sandbox,
            session: session.clone(),
            path: path.clone(),
            version,
            payload: Payload::new(bytes),
            token: None,
        };
        self.queue.send(Job::Upload(request)).ok()?;
        Some(version)
    }

    /// Releases `session`'s sandbox: drains the whole queue up to now, then Stop and Shutdown.
    pub async fn release(&self, session: &SessionId) {
        let (reached, wait) = oneshot::channel();
        if self.queue.send(Job::Barrier(reached)).is_ok() {
            let _ = wait.await;
        }
        let Some(sandbox) = lock(&self.bound).remove(session) else {
            return;
        };
        let stop = StopRequest {
            sandbox,
            suspend: false,
            token: None,
        };
        let _ = self.backend.stop(stop).await;
        let _ = self.backend.shutdown(sandbox, None).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
