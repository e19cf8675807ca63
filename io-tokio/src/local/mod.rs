//! `LocalBackend`: sandboxes as local directories, commands as real processes. The embedded
//! default, and what the main job runs on.
//!
//! - Start makes `<root>/sbx-<n>` (from the key's snapshot, when the core hands one), and
//!   writes `.sandkeeper/sandbox.json`.
//! - Upload writes `.sandkeeper/<session>/<path>` atomically (temporary file, then rename).
//! - Stop seals the sandbox (no write can land after it: a write holds the sandbox's gate while
//!   it writes and refuses a sealed one), stops its running processes, and, when snapshots are
//!   on, copies the workspace to `<root>/.snapshots/sbx-<n>` and returns that snapshot.
//! - Persist marks the snapshot persisted. Shutdown removes the directory, also one that a
//!   start the driver dropped was still making (a per-sandbox fence orders the two).
//! - A sandbox directory removed from outside is reported as a death by a periodic check
//!   ([`LocalConfig::death_check`]); an upload that finds it gone answers `Gone`.
//! - [`LocalBackend::run`] runs a real process in a sandbox, argv only, never a shell string,
//!   with a timeout.

mod exec;
mod isolation;
mod layout;
mod ops;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sandkeeper::{SandboxId, Snapshot};
use tokio::sync::watch;

use crate::backend::{
    Backend, BackendError, DeathSink, PersistRequest, StartRequest, StopRequest, UploadRequest,
};

pub use exec::{RunError, RunOutput};
pub use isolation::{Isolated, Isolation};
use layout::{copy_tree, sandbox_dir, session_file, snapshot_dir, write_atomically, META_DIR};

/// How a [`LocalBackend`] runs.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// The directory that holds every sandbox directory (made if missing).
    pub root: PathBuf,
    /// Stop copies the workspace to a snapshot, which the next sandbox of the key resumes from.
    pub snapshots: bool,
    /// How often the backend looks for sandbox directories removed from outside.
    pub death_check: Duration,
    /// The longest a [`LocalBackend::run`] or an exec may take when the caller gives no
    /// timeout.
    pub run_timeout: Duration,
    /// How commands of the application's own work are isolated (see [`Isolated`]).
    pub isolation: Isolation,
    /// Whether those commands reach the network (under bubblewrap; without it they always
    /// do).
    pub network: bool,
}

impl LocalConfig {
    /// Sandboxes under `root`, with snapshots, a 200 ms death check and a 30 s run timeout.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalConfig {
            root: root.into(),
            snapshots: true,
            death_check: Duration::from_millis(200),
            run_timeout: Duration::from_secs(30),
            isolation: Isolation::Auto,
            network: false,
        }
    }

    /// A fresh root inside the OS temporary directory: `sandkeeper-<pid>-<n>`.
    pub fn temp() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::new(std::env::temp_dir().join(format!("sandkeeper-{}-{n}", std::process::id())))
    }
}

/// One sandbox directory the backend runs.
struct LocalSandbox {
    dir: PathBuf,
    /// `true` once stopped. Writes hold it for reading while they write; Stop takes it for
    /// writing to seal, so no write can land after Stop.
    gate: RwLock<bool>,
    /// Tells running processes to stop.
    stopped: watch::Sender<bool>,
    /// Reported dead already.
    reported: std::sync::atomic::AtomicBool,
}

/// Sandboxes as local directories. See the module docs.
pub struct LocalBackend {
    config: LocalConfig,
    sandboxes: Mutex<HashMap<SandboxId, Arc<LocalSandbox>>>,
    /// The fence of each sandbox whose start's file work may still run. A start's file work
    /// runs on a blocking thread and goes on when the driver drops the start (its deadline, or
    /// the core ordering Shutdown while it starts); it holds the fence while it makes the
    /// directory and makes nothing once the fence says shut down. Shutdown sets the fence under
    /// its lock before it removes the directory, so no directory outlives its shutdown.
    fences: Mutex<HashMap<SandboxId, Fence>>,
    /// The isolation found at start.
    isolated: Isolated,
}

/// `true` once the sandbox was shut down; held while a start makes its directory.
type Fence = Arc<Mutex<bool>>;

impl LocalBackend {
    /// A backend under `config.root` (made if missing), with the isolation that
    /// `config.isolation` asks for and the machine allows (a warning where bubblewrap is
    /// missing under [`Isolation::Auto`]; an error under [`Isolation::Require`]).
    pub fn new(config: LocalConfig) -> io::Result<Self> {
        std::fs::create_dir_all(&config.root)?;
        let isolated = isolation::detect(config.isolation, config.network)?;
        Ok(LocalBackend {
            isolated,
            config,
            sandboxes: Mutex::new(HashMap::new()),
            fences: Mutex::new(HashMap::new()),
        })
    }

    /// A backend under a fresh directory in the OS temporary directory.
    pub fn new_temp() -> io::Result<Self> {
        Self::new(LocalConfig::temp())
    }

    /// The isolation the application's commands run under.
    pub fn isolation(&self) -> &Isolated {
        &self.isolated
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// The directory of a sandbox (whether or not it exists).
    pub fn sandbox_dir(&self, sandbox: SandboxId) -> PathBuf {
        sandbox_dir(&self.config.root, sandbox)
    }

    /// The directory where snapshots are kept.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.config.root.join(layout::SNAPSHOTS_DIR)
    }

    /// Where a session's mirrored file lives in a sandbox.
    pub fn session_file(
        &self,
        sandbox: SandboxId,
        session: &sandkeeper::SessionId,
        path: &sandkeeper::PathName,
    ) -> PathBuf {
        session_file(&self.sandbox_dir(sandbox), session, path)
    }

    /// Sandbox directories present under the root now (started and not yet removed).
    pub fn sandbox_dirs_present(&self) -> io::Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        for entry in std::fs::read_dir(&self.config.root)? {
            let entry = entry?;
            if entry.file_type()?.is_dir()
                && entry.file_name().to_string_lossy().starts_with("sbx-")
            {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        Ok(dirs)
    }

    /// Sandboxes the backend runs now.
    pub fn running(&self) -> usize {
        self.table().len()
    }

    /// Looks for sandbox directories removed from outside and reports each once. Returns how
    /// many it reported. The death watcher calls this every [`LocalConfig::death_check`].
    pub fn check_deaths(&self, deaths: &DeathSink) -> usize {
        let candidates: Vec<(SandboxId, Arc<LocalSandbox>)> =
            self.table().iter().map(|(x, s)| (*x, s.clone())).collect();
        let mut reported = 0;
        for (sandbox, s) in candidates {
            let sealed = *s.gate.read().unwrap_or_else(|p| p.into_inner());
            if sealed || s.dir.exists() || s.reported.swap(true, Ordering::SeqCst) {
                continue;
            }
            tracing::warn!(sandbox = %sandbox, dir = %s.dir.display(), "sandbox directory removed from outside");
            deaths.report(sandbox);
            reported += 1;
        }
        reported
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Arc<LocalSandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fences(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Fence>> {
        self.fences.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, sandbox: SandboxId) -> Option<Arc<LocalSandbox>> {
        self.table().get(&sandbox).cloned()
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(BackendError::fatal(format!("file task failed: {e}"))))
}

fn io_error(what: &str, e: io::Error) -> BackendError {
    match e.kind() {
        io::ErrorKind::NotFound => BackendError::gone(format!("{what}: {e}")),
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => {
            BackendError::fatal(format!("{what}: {e}"))
        }
        _ => BackendError::transient(format!("{what}: {e}")),
    }
}

impl Backend for LocalBackend {
    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let dir = self.sandbox_dir(request.sandbox);
        let root = self.config.root.clone();
        let made = dir.clone();
        let fence = self.fences().entry(request.sandbox).or_default().clone();
        let sandbox = request.sandbox;
        let work = blocking(move || {
            let shut_down = fence.lock().unwrap_or_else(|p| p.into_inner());
            if *shut_down {
                return Err(BackendError::gone("shut down while starting"));
            }
            if made.exists() {
                return Err(BackendError::fatal(format!(
                    "{} exists already",
                    made.display()
                )));
            }
            let from = match &request.resume_from {
                Some(snapshot) => {
                    let from =
                        snapshot_dir(&root, snapshot).map_err(|e| io_error("snapshot", e))?;
                    from.exists().then_some(from)
                }
                None => None,
            };
            match &from {
                Some(from) => copy_tree(from, &made).map_err(|e| io_error("resume", e))?,
                None => std::fs::create_dir_all(&made).map_err(|e| io_error("mkdir", e))?,
            }
            let meta = made.join(META_DIR);
            std::fs::create_dir_all(&meta).map_err(|e| io_error("mkdir", e))?;
            let info = serde_json::json!({
                "sandbox": request.sandbox.0,
                "key": request.key.to_string(),
                "spec": request.spec.as_str(),
                "resumed_from": request.resume_from.as_ref().map(|s| s.as_str().to_string()),
            });
            write_atomically(
                &meta.join("sandbox.json"),
                sandkeeper::UploadId(u64::MAX),
                info.to_string().as_bytes(),
            )
            .map_err(|e| io_error("sandbox.json", e))?;
            drop(shut_down);
            Ok(())
        })
        .await;
        self.fences().remove(&sandbox);
        work?;
        let (stopped, _) = watch::channel(false);
        self.table().insert(
            request.sandbox,
            Arc::new(LocalSandbox {
                dir,
                gate: RwLock::new(false),
                stopped,
                reported: false.into(),
            }),
        );
        Ok(())
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let Some(s) = self.get(request.sandbox) else {
            return Err(BackendError::gone(format!(
                "no sandbox {}",
                request.sandbox
            )));
        };
        blocking(move || {
            let sealed = s.gate.read().unwrap_or_else(|p| p.into_inner());
            if *sealed {
                return Err(BackendError::gone("sandbox stopped"));
            }
            if !s.dir.exists() {
                return Err(BackendError::gone(format!("{} is gone", s.dir.display())));
            }
            let target = session_file(&s.dir, &request.session, &request.path);
            if let Some(parent) = target.parent() {
                // Only the session's own directory is made here, never its parents: a sandbox
                // directory removed from outside is not brought back by a write (it stays gone,
                // and the death check sees it).
                match std::fs::create_dir(parent) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_error("mkdir", e)),
                }
            }
            write_atomically(&target, request.upload, request.payload.as_bytes())
                .map_err(|e| io_error("write", e))?;
            drop(sealed);
            Ok(())
        })
        .await
    }

    fn check_config(&self, config: &sandkeeper::Config) -> Result<(), String> {
        if config.release == sandkeeper::ReleasePolicy::Suspend && !self.config.snapshots {
            return Err(
                "release policy Suspend needs LocalConfig::snapshots: without a snapshot \
                 a suspended sandbox's workspace could not be resumed"
                    .to_string(),
            );
        }
        Ok(())
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        let sandbox = request.sandbox;
        let Some(s) = self.get(sandbox) else {
            return Err(BackendError::gone(format!("no sandbox {sandbox}")));
        };
        let _ = s.stopped.send(true);
        let snapshots = self.config.snapshots;
        let root = self.config.root.clone();
        blocking(move || {
            *s.gate.write().unwrap_or_else(|p| p.into_inner()) = true;
            if !s.dir.exists() {
                return Err(BackendError::gone(format!("{} is gone", s.dir.display())));
            }
            if !snapshots && !request.suspend {
                return Ok(None);
            }
            let snapshot = Snapshot::new(format!("sbx-{}", sandbox.0));
            let to = snapshot_dir(&root, &snapshot).map_err(|e| io_error("snapshot", e))?;
            if to.exists() {
                std::fs::remove_dir_all(&to).map_err(|e| io_error("snapshot", e))?;
            }
            copy_tree(&s.dir, &to).map_err(|e| io_error("snapshot", e))?;
            Ok(Some(snapshot))
        })
        .await
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        let PersistRequest {
            sandbox, snapshot, ..
        } = request;
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let root = self.config.root.clone();
        blocking(move || {
            let dir = snapshot_dir(&root, &snapshot).map_err(|e| io_error("snapshot", e))?;
            if !dir.exists() {
                return Err(BackendError::fatal(format!(
                    "snapshot {} of {sandbox} is missing",
                    dir.display()
                )));
            }
            write_atomically(
                &dir.join(META_DIR).join("persisted"),
                sandkeeper::UploadId(u64::MAX),
                b"persisted\n",
            )
            .map_err(|e| io_error("persist", e))
        })
        .await
    }

    async fn shutdown(&self, sandbox: SandboxId) -> Result<(), BackendError> {
        let s = self.table().remove(&sandbox);
        if let Some(s) = &s {
            let _ = s.stopped.send(true);
        }
        let dir = self.sandbox_dir(sandbox);
        let fence = self.fences().remove(&sandbox).unwrap_or_default();
        blocking(move || {
            if let Some(s) = &s {
                *s.gate.write().unwrap_or_else(|p| p.into_inner()) = true;
            }
            // Waits for a dropped start's file work, and stops one that has not begun.
            *fence.lock().unwrap_or_else(|p| p.into_inner()) = true;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error("remove", e)),
            }
        })
        .await
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        let mut tick = tokio::time::interval(self.config.death_check);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check_deaths(&deaths);
            // A probe with no sandbox: tells whether the keeper still listens.
            if !deaths.is_listening() {
                return;
            }
        }
    }
}
