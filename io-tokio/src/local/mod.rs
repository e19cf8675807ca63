//! `LocalBackend`: sandboxes as local directories, commands as real processes. The embedded
//! default, and what the main job runs on.
//!
//! - Start records what the sandbox is started for (its key, the snapshot it resumes) in
//!   `<root>/.meta/` (`meta.rs`), then makes `<root>/sbx-<n>`, or, resuming the key's snapshot,
//!   *renames* the snapshot's directory to it (the start takes the snapshot: O(1) in the
//!   workspace's size, and the workspace exists once). A snapshot found missing (deleted by
//!   hand, expired) means a fresh workspace and a warning, as a lost claim does on Kubernetes.
//! - Upload writes `.sandkeeper/<session>/<path>` atomically (temporary file, then rename).
//! - The keeper never acts through a command's files: a workspace, `.sandkeeper/` included, is
//!   its commands' to change, so every read, write, rename and remove the keeper (uploads) or an
//!   operation does in it goes through directory handles that never follow a link, writes a new
//!   temporary (`O_EXCL`) and renames it within the handle, and reads only regular files without
//!   waiting (`nofollow.rs`). And nothing the keeper decides from is in a workspace: what a
//!   sandbox was started for and what a snapshot is (persisted, until when) are its records in
//!   `<root>/.meta/`, out of every sandbox's sight, each written before its directory is made and
//!   removed after it is gone (`meta.rs`; `docs/operations-errors.md`, which also says what a
//!   root an older keeper made becomes).
//! - Stop seals the sandbox (no write can land after it: a write holds the sandbox's gate while
//!   it writes and refuses a sealed one), stops its running processes, and, when snapshots are
//!   on or it suspends, records the snapshot (not persisted) and *renames* the workspace to
//!   `<root>/.snapshots/sbx-<n>-<instance>` and returns that snapshot (O(1); no copy is ever
//!   made: nothing needs the stopped workspace where it was, and a start takes a snapshot rather
//!   than sharing it).
//! - Persist marks the snapshot's record persisted and, when the policy retains it for a while,
//!   records its expiry (seconds since the Unix epoch). Shutdown removes the sandbox directory,
//!   also one that a start the driver dropped was still making (a per-sandbox fence orders the
//!   two), and the sandbox's own snapshot if its record says no Persist kept it. Discard removes
//!   a snapshot. Each removes the records of what it removed, after it.
//! - At construction the backend sweeps `.snapshots/`: a snapshot whose recorded expiry passed
//!   is removed ([`LocalBackend::sweep_expired`]), so a keeper that crashed keeps nothing
//!   forever, and one that restarts removes nothing early; so are records a crash left without
//!   their directory, once old.
//! - With a shelf ([`LocalConfig::shelf`], `shelf.rs`) the root is one host's of a fleet:
//!   Persist puts the snapshot on the shelf before it answers, a Start fetches from the shelf a
//!   snapshot not on this host (one on neither fails the start), Discard removes the shelf's copy
//!   too, and an Adopt of a sandbox not on this root answers `Elsewhere`, never `Gone`.
//! - A sandbox directory removed from outside is reported as a death by a periodic check
//!   ([`LocalConfig::death_check`]); an upload that finds it gone answers `Gone`.
//! - [`LocalBackend::run`] runs a real process in a sandbox, argv only, never a shell string,
//!   with a timeout.
//! - Commands run under bubblewrap (`isolation.rs`): one per sandbox, started at its first
//!   command with `sandkeeper-init` as its PID 1 (`sandbox_init.rs` owns it, `init_exec.rs`
//!   runs an exec through it, `wire.rs` is what they say to each other) and ended when the
//!   sandbox stops; or one per command where no init is found. The limits (`limits.rs`) hold
//!   for the sandbox, or for each command.
//! - Commands see their workspace at its host path, or, with a
//!   [`workspace_mount`](LocalConfig::workspace_mount), at one fixed path such as `/home/user`
//!   (bubblewrap binds it there; `mount.rs` checks the path and why it needs bubblewrap).

mod exec;
mod fence;
mod init_exec;
pub mod inventory;
mod isolation;
pub(crate) mod layout;
mod limit_watch;
mod limits;
pub mod meta;
mod mount;
mod nofollow;
mod ops;
mod quota;
mod sandbox_init;
mod seccomp;
pub mod shelf;
pub mod store;
// Both halves of the frames: the keeper uses its own, the init (`src/bin`) the other.
#[allow(dead_code)]
mod wire;

pub use fence::{token_log_in_order, TokenLog};

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use sandkeeper::{DiscardReason, Handover, SandboxId, Snapshot, Token};
use tokio::sync::watch;

use crate::backend::{
    AdoptRequest, Backend, BackendError, DeathSink, DiscardRequest, PersistRequest, StartRequest,
    StopRequest, UploadRequest,
};

pub use exec::{RunError, RunOutput};
pub use isolation::{find_init, Isolated, Isolation, IsolationError, Mode, Namespaces, INIT_VAR};
pub use layout::session_file;
use layout::{sandbox_dir, snapshot_dir, META_DIR};
pub use limits::{CgroupV1, Enforcement, Limits};
use meta::{MetaError, SnapshotRecord, StartedFor};
pub use mount::WorkspaceMountError;
use shelf::{Shelf, ShelfError};

/// How a [`LocalBackend`] runs.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// The directory that holds every sandbox directory (made if missing).
    pub root: PathBuf,
    /// Stop keeps the workspace as a snapshot (a rename), which the next sandbox of the key
    /// resumes from. Always so when the sandbox is suspended.
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
    /// What each sandbox may use (processes, memory, CPU, file size, `/tmp`), and
    /// [`LocalBackend::limits`] says how that is enforced here (for the sandbox as a whole with
    /// one bubblewrap per sandbox, else for each command).
    pub limits: Limits,
    /// One bubblewrap per sandbox (the default, where the init is found) or per command.
    pub namespaces: Namespaces,
    /// The `sandkeeper-init` program a sandbox's bubblewrap runs as its PID 1. `None`: the
    /// [`SANDKEEPER_INIT`](INIT_VAR) variable, else beside the keeper's program or in its parent
    /// directory ([`find_init`]); where none is found, one bubblewrap per command, and
    /// [`LocalBackend::isolation`] says why.
    pub init: Option<PathBuf>,
    /// Fleet mode: append every fencing token a change was admitted under to
    /// `<root>/.tokens/accepted.log` (`<sandbox> <key> <token>`, one line per change, in the
    /// order the key's lock admitted them), for audits and the fleet tests
    /// ([`token_log_in_order`](crate::local::token_log_in_order)). Off by default: it grows
    /// with every upload.
    pub token_log: bool,
    /// Fleet mode across hosts: the shelf that keeps persisted snapshots beyond this root, so
    /// that a key suspended here resumes on another host (`shelf.rs`: Persist puts, a Start
    /// fetches what is not here, Discard removes, an Adopt of a sandbox not here answers
    /// [`Elsewhere`](crate::backend::FailureClass::Elsewhere)). With a shelf the root is one
    /// host's of a fleet, and the fleet's sweep decides what goes: construction sweeps nothing.
    /// `None` (the default): one root holds everything.
    pub shelf: Option<Arc<dyn Shelf>>,
    /// The absolute path every sandbox's commands see their own workspace at (`/home/user`,
    /// say): bubblewrap binds the workspace there, and nowhere else, and a command starts in
    /// it (or in its `cwd` under it) with `HOME` and `PWD` naming it, so the keeper's root and
    /// the workspace's host path appear nowhere inside. Files the application reads and
    /// writes through the backend are the same files, named relative to the workspace as
    /// always. Needs bubblewrap: [`LocalBackend::new`] refuses a mount where commands run
    /// without it (isolation off, or not working here), and a path that is not plain or lies
    /// on the sandbox's system paths ([`WorkspaceMountError`]). `None` (the default): commands
    /// see the workspace at its host path.
    pub workspace_mount: Option<PathBuf>,
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
            limits: Limits::default(),
            namespaces: Namespaces::default(),
            init: None,
            token_log: false,
            shelf: None,
            workspace_mount: None,
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
    /// Fleet mode: the token this process started or adopted it under. The application's
    /// own work in it (writes, removals, commands) is checked against the newest token of the
    /// sandbox and its key at the backend, so a process whose key was taken over changes
    /// nothing the next owner sees (`ops.rs`).
    token: Option<Token>,
    /// What its workspace may take on disk, and the keeper's count (`quota.rs`).
    quota: quota::Quota,
    /// What it used over its life (its CPU, across its inits), watched by the keeper
    /// (`limit_watch.rs`).
    usage: Arc<limit_watch::Usage>,
    /// Its init, with one bubblewrap per sandbox: started by its first command, again by the
    /// next after it ended, ended when the sandbox stops (`sandbox_init.rs`).
    init: tokio::sync::Mutex<Option<Arc<sandbox_init::SandboxInit>>>,
}

impl LocalSandbox {
    /// A sandbox up in `dir` under `token`, its workspace within `quota` bytes: open to
    /// writes, its processes running.
    fn running(dir: PathBuf, token: Option<Token>, quota: Option<u64>) -> Self {
        LocalSandbox {
            dir,
            gate: RwLock::new(false),
            stopped: watch::channel(false).0,
            reported: false.into(),
            token,
            quota: quota::Quota::new(quota),
            usage: Arc::default(),
            init: tokio::sync::Mutex::new(None),
        }
    }
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
    /// How the limits are enforced here, found at start.
    limits: Enforcement,
    /// This backend's own mark in snapshot names (from its start time): snapshots that an
    /// earlier keeper on the same root kept for their retention are never overwritten by a
    /// sandbox of this one that happens to have the same number.
    instance: String,
    /// Fleet mode: the newest fencing tokens each sandbox and key has seen (`fence.rs`).
    ledger: fence::Ledger,
}

/// `true` once the sandbox was shut down; held while a start makes its directory.
type Fence = Arc<Mutex<bool>>;

impl LocalBackend {
    /// A backend under `config.root` (made if missing), with the isolation that
    /// `config.isolation` asks for and the machine allows (a warning where bubblewrap is
    /// missing under [`Isolation::Auto`]; an error under [`Isolation::Require`]). With a
    /// [`workspace_mount`](LocalConfig::workspace_mount), an `InvalidInput` error holding a
    /// [`WorkspaceMountError`] when the path is refused, before anything is made, or when
    /// commands would run without bubblewrap.
    pub fn new(config: LocalConfig) -> io::Result<Self> {
        let refused = |e: WorkspaceMountError| io::Error::new(io::ErrorKind::InvalidInput, e);
        if let Some(mount) = &config.workspace_mount {
            mount::check(mount).map_err(refused)?;
        }
        std::fs::create_dir_all(&config.root)?;
        let wanted = config.isolation != Isolation::Off;
        let limits = Enforcement::find(config.limits.clone(), wanted);
        let isolated = isolation::detect(
            config.isolation,
            config.network,
            (config.namespaces, config.init.as_deref()),
            (&config.root, config.workspace_mount.as_deref()),
            &limits,
        )?;
        if let (Some(path), Isolated::ProcessGroup { why }) = (&config.workspace_mount, &isolated) {
            return Err(refused(WorkspaceMountError::NotIsolated {
                path: path.clone(),
                why: why.clone(),
            }));
        }
        let mut limits = if isolated.is_bubblewrap() == wanted {
            limits
        } else {
            Enforcement::find(config.limits.clone(), false)
        };
        limits.per_sandbox = isolated.init().is_some();
        // A driver may read the clock: the wall clock names this instance's snapshots apart
        // from an earlier keeper's on the same root, and judges the expiries they recorded.
        #[allow(clippy::disallowed_methods)]
        let wall = SystemTime::now();
        let started = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let backend = LocalBackend {
            isolated,
            limits,
            instance: format!("{:x}", started.as_micros()),
            ledger: fence::Ledger::new(&config.root, config.token_log),
            config,
            sandboxes: Mutex::new(HashMap::new()),
            fences: Mutex::new(HashMap::new()),
        };
        let swept = backend.sweep_expired(wall)?;
        if swept > 0 {
            tracing::info!(swept, "removed snapshots whose retention ended");
        }
        Ok(backend)
    }

    /// Fleet mode: the token check of a change of `sandbox` (see `fence.rs`), made before work
    /// that is not itself on a blocking thread; the key's lock comes back, to hold across the
    /// change. A command without a token costs nothing: no file, no blocking thread.
    async fn admit(
        &self,
        sandbox: SandboxId,
        token: Option<Token>,
    ) -> Result<fence::Admitted, BackendError> {
        if token.is_none() {
            return Ok(None);
        }
        let ledger = self.ledger.clone();
        blocking(move || ledger.admit(sandbox, None, token)).await
    }

    /// Removes every snapshot under the root whose recorded expiry (in its record under
    /// `.meta/`, written by a Persist with a retention) is at or before `now`, then its record;
    /// returns how many. Snapshots without an expiry are kept (the policy retains them until the
    /// key's next start), and so are those without a record (an older keeper's: never judged
    /// from what is in a workspace). Records left by a crash go ([`meta`]). Construction runs
    /// it once. Not on a fleet's root (one with `.fleet/`, or one host's, with a
    /// [`shelf`](LocalConfig::shelf)): there the fleet sweep ([`store::LocalStore::sweep`], or
    /// the fleet store's over the host's inventory) decides, records included. A malformed
    /// record is an `InvalidData` error naming it.
    pub fn sweep_expired(&self, now: SystemTime) -> io::Result<usize> {
        let mut swept = 0;
        let root = &self.config.root;
        if root.join(".fleet").is_dir() || self.config.shelf.is_some() {
            // A fleet's root: a snapshot may be named by a key's record, which its own
            // retention then decides; the fleet sweep checks both.
            return Ok(0);
        }
        let invalid = |e: MetaError| match e {
            MetaError::Io { source, .. } => source,
            e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        };
        for path in self.snapshot_dirs_present()? {
            let Some(snapshot) = path.file_name().map(|n| Snapshot::new(n.to_string_lossy()))
            else {
                continue;
            };
            let expiry = meta::snapshot_record(root, &snapshot)
                .map_err(invalid)?
                .and_then(|r| r.expiry());
            match expiry {
                Some(expires) if expires <= now => match std::fs::remove_dir_all(&path) {
                    Ok(()) => swept += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                },
                _ => continue,
            }
            meta::forget_snapshot(root, &snapshot).map_err(invalid)?;
        }
        meta::clear_orphans(root, now).map_err(invalid)?;
        Ok(swept)
    }

    /// The snapshot the sandbox's Stop takes (this backend's name for it).
    fn snapshot_of(&self, sandbox: SandboxId) -> Snapshot {
        Snapshot::new(format!("sbx-{}-{}", sandbox.0, self.instance))
    }

    /// A backend under a fresh directory in the OS temporary directory.
    pub fn new_temp() -> io::Result<Self> {
        Self::new(LocalConfig::temp())
    }

    /// The isolation the application's commands run under.
    pub fn isolation(&self) -> &Isolated {
        &self.isolated
    }

    /// The limits on each command, and how they are enforced here.
    pub fn limits(&self) -> &Enforcement {
        &self.limits
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// The path commands see their workspace at, when it is not its host path (the
    /// [`workspace_mount`](LocalConfig::workspace_mount) in effect: construction refused one
    /// it could not honour).
    pub fn workspace_mount(&self) -> Option<&Path> {
        self.config.workspace_mount.as_deref()
    }

    /// Where the commands of `sandbox` see their workspace: the workspace mount, else the
    /// sandbox's directory ([`sandbox_dir`](Self::sandbox_dir)).
    pub fn workspace_seen(&self, sandbox: SandboxId) -> PathBuf {
        match &self.config.workspace_mount {
            Some(mount) => mount.clone(),
            None => self.sandbox_dir(sandbox),
        }
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

    /// Snapshot directories present now (kept for their key, in name order).
    pub fn snapshot_dirs_present(&self) -> io::Result<Vec<PathBuf>> {
        layout::snapshot_dirs(&self.config.root)
    }

    /// Sandbox directories present under the root now (started and not yet removed).
    pub fn sandbox_dirs_present(&self) -> io::Result<Vec<PathBuf>> {
        layout::sandbox_dirs(&self.config.root)
    }

    /// The keeper's record of what `sandbox` was started for, if there is one ([`meta`]).
    pub fn sandbox_record(&self, sandbox: SandboxId) -> Result<Option<StartedFor>, MetaError> {
        meta::sandbox_record(&self.config.root, sandbox)
    }

    /// The keeper's record of `snapshot` (whose it is, whether a Persist kept it, until when),
    /// if there is one ([`meta`]).
    pub fn snapshot_record(
        &self,
        snapshot: &Snapshot,
    ) -> Result<Option<SnapshotRecord>, MetaError> {
        meta::snapshot_record(&self.config.root, snapshot)
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

/// Makes a starting sandbox's workspace `made`, its record written already: the snapshot it
/// resumes, renamed (the start takes it, then its record goes); or, where a start of an owner
/// that crashed before its key's record named that sandbox took it already, that sandbox's
/// directory (then its record goes); or a fresh directory, with a warning when the snapshot is
/// gone (deleted by hand, expired), as a lost claim does on Kubernetes. With a shelf, a
/// snapshot not on this host is fetched from it into `made`; one on neither fails the start
/// (`shelf.rs`): it may be on another host's disk, and the core keeps it for the key.
fn take_or_make(
    root: &Path,
    made: &Path,
    request: &StartRequest,
    running: &[PathBuf],
    shelf: Option<&(Arc<dyn Shelf>, tokio::runtime::Handle)>,
) -> Result<(), BackendError> {
    if let Some(snapshot) = &request.resume_from {
        let from = snapshot_dir(root, snapshot).map_err(|e| io_error("snapshot", e))?;
        match std::fs::rename(&from, made) {
            Ok(()) => return meta::forget_snapshot(root, snapshot).map_err(meta_error),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("resume", e)),
        }
        let key = request.key.to_string();
        if let Some((there, by)) = took_snapshot(root, snapshot, &key, running)? {
            match std::fs::rename(&there, made) {
                Ok(()) => return meta::forget_sandbox(root, by).map_err(meta_error),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("resume", e)),
            }
        }
        if let Some((shelf, runtime)) = shelf {
            return match runtime.block_on(shelf.fetch(snapshot, made)) {
                Ok(()) => Ok(()),
                Err(ShelfError::NotFound(_)) => Err(BackendError::fatal(format!(
                    "snapshot {} is neither on this host nor on the shelf: it may be on the host \
                     that took it, whose Persists all failed; the key keeps it",
                    snapshot.as_str()
                ))),
                Err(e) => Err(shelf_error(&format!("fetching {}", snapshot.as_str()), e)),
            };
        }
        tracing::warn!(sandbox = %request.sandbox, snapshot = %from.display(),
            "the snapshot to resume is gone (removed, or expired): starting with a fresh workspace");
    }
    std::fs::create_dir_all(made).map_err(|e| io_error("mkdir", e))
}

/// The adoption of `sandbox`, whose directory is there, for `key`: its record must say it was
/// started for that key. One without a record (an older keeper's, which kept it inside the
/// workspace) gets one now, from the adopting owner's request (the key's record named the
/// sandbox), never from what is in the workspace.
fn adopt_up(root: &Path, sandbox: SandboxId, key: &sandkeeper::Key) -> Result<(), BackendError> {
    let key = key.to_string();
    match meta::sandbox_record(root, sandbox).map_err(meta_error)? {
        Some(record) if record.key == key => Ok(()),
        Some(record) => Err(BackendError::fatal(format!(
            "{sandbox} was started for {}, not {key}: not adopted",
            record.key
        ))),
        None => {
            tracing::warn!(%sandbox, %key,
                "adopting a sandbox without a keeper record (an older keeper's): recorded now");
            let record = StartedFor {
                sandbox: sandbox.0,
                key,
                spec: None,
                resumed_from: None,
            };
            meta::record_sandbox(root, sandbox, &record).map_err(meta_error)
        }
    }
}

/// The snapshot `sandbox`'s own Stop made of its workspace (`sbx-<n>-<instance>`, its record
/// saying it was taken from that sandbox), with its record, if one is under `root`. A snapshot
/// without a record (an older keeper's) is not taken for one.
fn stopped_workspace(
    root: &Path,
    sandbox: SandboxId,
) -> Result<Option<(PathBuf, Snapshot, SnapshotRecord)>, BackendError> {
    let prefix = format!("sbx-{}-", sandbox.0);
    let dirs = layout::snapshot_dirs(root).map_err(|e| io_error("snapshots", e))?;
    for dir in dirs {
        let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !name.starts_with(&prefix) {
            continue;
        }
        let snapshot = Snapshot::new(name);
        let Some(record) = meta::snapshot_record(root, &snapshot).map_err(meta_error)? else {
            continue;
        };
        if record.taken_from.sandbox == sandbox.0 {
            return Ok(Some((dir, snapshot, record)));
        }
    }
    Ok(None)
}

/// The sandbox directory under `root` whose start took `snapshot` as its workspace for `key`
/// (its record names the snapshot as `resumed_from`, and the key), with its sandbox, if one is
/// there and not among `running`. Only the keeper's records are read, never a workspace: a
/// command cannot make its directory look like another key's taking.
fn took_snapshot(
    root: &Path,
    snapshot: &Snapshot,
    key: &str,
    running: &[PathBuf],
) -> Result<Option<(PathBuf, SandboxId)>, BackendError> {
    for dir in layout::sandbox_dirs(root).map_err(|e| io_error("sandboxes", e))? {
        if running.contains(&dir) {
            continue;
        }
        let Some(sandbox) = layout::sandbox_of(&dir) else {
            continue;
        };
        let Some(record) = meta::sandbox_record(root, sandbox).map_err(meta_error)? else {
            continue;
        };
        if record.resumed_from.as_deref() == Some(snapshot.as_str()) && record.key == key {
            return Ok(Some((dir, sandbox)));
        }
    }
    Ok(None)
}

/// The snapshot directory a Persist keeps and its record, which must both be there.
fn kept_snapshot(
    root: &Path,
    snapshot: &Snapshot,
    sandbox: SandboxId,
) -> Result<(PathBuf, SnapshotRecord), BackendError> {
    let dir = snapshot_dir(root, snapshot).map_err(|e| io_error("snapshot", e))?;
    if !dir.exists() {
        return Err(BackendError::fatal(format!(
            "snapshot {} of {sandbox} is missing",
            dir.display()
        )));
    }
    match meta::snapshot_record(root, snapshot).map_err(meta_error)? {
        Some(record) => Ok((dir, record)),
        None => Err(BackendError::fatal(format!(
            "snapshot {} of {sandbox} has no record: not persisted",
            dir.display()
        ))),
    }
}

/// The seconds since the Unix epoch a retention ends at, rounded up: a snapshot never goes
/// before its retention ends.
fn expiry_secs(until: SystemTime) -> u64 {
    let until = until
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    until.as_secs() + u64::from(until.subsec_nanos() > 0)
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(BackendError::fatal(format!("file task failed: {e}"))))
}

/// A record under `.meta/` that failed: as the file system failure beneath it, or, for a record
/// that is not one, fatal (the same work would meet it again).
fn meta_error(e: MetaError) -> BackendError {
    match e {
        MetaError::Io { path, source } => io_error(&format!("record {}", path.display()), source),
        e => BackendError::fatal(e.to_string()),
    }
}

/// A shelf's failure as the backend's: a snapshot not on the shelf is `Gone`, a failure that
/// may pass `Transient`, a refusal `Fatal`.
fn shelf_error(what: &str, e: ShelfError) -> BackendError {
    match e {
        ShelfError::NotFound(_) => BackendError::gone(format!("{what}: {e}")),
        ShelfError::Unavailable(_) => BackendError::transient(format!("{what}: {e}")),
        ShelfError::Refused(_) => BackendError::fatal(format!("{what}: {e}")),
    }
}

fn io_error(what: &str, e: io::Error) -> BackendError {
    if nofollow::refusal(&e).is_some() {
        // What a command put in its workspace: the same work would meet it again.
        return BackendError::fatal(format!("{what}: {e}"));
    }
    match e.kind() {
        io::ErrorKind::NotFound => BackendError::gone(format!("{what}: {e}")),
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => {
            BackendError::fatal(format!("{what}: {e}"))
        }
        _ => BackendError::transient(format!("{what}: {e}")),
    }
}

impl Backend for LocalBackend {
    /// Tokens are checked beside the sandbox directories (`fence.rs`); a sandbox handed over
    /// is a directory any process on the root can take into its table.
    const FLEET: bool = true;

    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        let dir = self.sandbox_dir(request.sandbox);
        let root = self.config.root.clone();
        let made = dir.clone();
        let fence = self.fences().entry(request.sandbox).or_default().clone();
        let sandbox = request.sandbox;
        let token = request.token;
        let ledger = self.ledger.clone();
        // What this backend runs is never another start's to take.
        let running: Vec<PathBuf> = self.table().values().map(|s| s.dir.clone()).collect();
        // A fetch from the shelf runs on this runtime, from the start's blocking thread.
        let shelf = self
            .config
            .shelf
            .clone()
            .map(|shelf| (shelf, tokio::runtime::Handle::current()));
        let work = blocking(move || {
            let _admitted = ledger.admit(sandbox, Some(&request.key), request.token)?;
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
            // What it is started for is recorded first, outside the workspace (`meta.rs`), so
            // that its directory says what it is wherever a crash leaves it: a key's record names
            // the snapshot until the sandbox is up, and the sweep keeps a sandbox that took the
            // recorded snapshot for the key's next start.
            let started = StartedFor {
                sandbox: sandbox.0,
                key: request.key.to_string(),
                spec: Some(request.spec.as_str().to_string()),
                resumed_from: request.resume_from.as_ref().map(|s| s.as_str().to_string()),
            };
            meta::record_sandbox(&root, sandbox, &started).map_err(meta_error)?;
            let made_it = take_or_make(&root, &made, &request, &running, shelf.as_ref());
            if made_it.is_err() && !made.exists() {
                // Nothing was made: the record goes too (else the sweep's, once it is old).
                let _ = meta::forget_sandbox(&root, sandbox);
            }
            made_it?;
            // The directory of the session mirrors, there for the commands from the start
            // (through handles: whatever a command left at its name in a resumed workspace is
            // taken away, never followed).
            nofollow::open_dir(&made)
                .and_then(|ws| nofollow::claim_dir(&ws, META_DIR))
                .map_err(|e| io_error("mkdir", e))?;
            drop(shut_down);
            Ok(())
        })
        .await;
        self.fences().remove(&sandbox);
        work?;
        self.table().insert(
            sandbox,
            Arc::new(LocalSandbox::running(
                dir,
                token,
                self.config.limits.workspace_bytes,
            )),
        );
        Ok(())
    }

    async fn adopt(&self, request: AdoptRequest) -> Result<(), BackendError> {
        let AdoptRequest {
            sandbox,
            key,
            token,
        } = request;
        let dir = self.sandbox_dir(sandbox);
        let ledger = self.ledger.clone();
        let there = dir.clone();
        let root = self.config.root.clone();
        let hosts = self.config.shelf.is_some();
        blocking(move || {
            let _admitted = ledger.admit(sandbox, Some(&key), Some(token))?;
            // Up means its workspace is there as its first owner's Start left it; or its owner
            // stopped it (its workspace renamed to its snapshot) and crashed before the key's
            // record said so: the record still names the sandbox, and the stop is undone.
            // Decided from the keeper's records, never from the workspace (`meta.rs`).
            if there.is_dir() {
                return adopt_up(&root, sandbox, &key);
            }
            let Some((stopped, snapshot, record)) = stopped_workspace(&root, sandbox)? else {
                if hosts {
                    // One host's root of several: the sandbox may be up on another's, with the
                    // key's history in it. Never taken for gone (`shelf.rs`).
                    return Err(BackendError::elsewhere(format!(
                        "{sandbox} is not on this host ({}): it may be on another's",
                        root.display()
                    )));
                }
                return Err(BackendError::gone(format!(
                    "{} is gone: nothing to adopt",
                    there.display()
                )));
            };
            tracing::warn!(%sandbox, snapshot = %stopped.display(),
                "adopting a sandbox its crashed owner had stopped: its workspace is taken back");
            // Its record again first, then the rename; the snapshot's record once it is gone.
            meta::record_sandbox(&root, sandbox, &record.taken_from).map_err(meta_error)?;
            std::fs::rename(&stopped, &there).map_err(|e| io_error("adopt", e))?;
            meta::forget_snapshot(&root, &snapshot).map_err(meta_error)?;
            Ok(())
        })
        .await?;
        self.table().entry(sandbox).or_insert_with(|| {
            Arc::new(LocalSandbox::running(
                dir,
                Some(token),
                self.config.limits.workspace_bytes,
            ))
        });
        Ok(())
    }

    async fn relinquish(&self, sandbox: SandboxId) {
        // The directory stays for the key's next owner; processes this process ran in it stop.
        if let Some(s) = self.table().remove(&sandbox) {
            let _ = s.stopped.send(true);
        }
        self.fences().remove(&sandbox);
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        let Some(s) = self.get(request.sandbox) else {
            return Err(BackendError::gone(format!(
                "no sandbox {}",
                request.sandbox
            )));
        };
        let ledger = self.ledger.clone();
        blocking(move || {
            let _admitted = ledger.admit(request.sandbox, None, request.token)?;
            let sealed = s.gate.read().unwrap_or_else(|p| p.into_inner());
            if *sealed {
                return Err(BackendError::gone("sandbox stopped"));
            }
            if !s.dir.exists() {
                return Err(BackendError::gone(format!("{} is gone", s.dir.display())));
            }
            // Through handles from the sandbox directory down, never following a link a
            // command planted (`nofollow.rs`): `.sandkeeper` and the session's directory are
            // the keeper's, and what is at their names instead is taken away. A sandbox
            // directory removed from outside is not brought back by a write: its handle is
            // opened first, and nothing can be made in a removed directory (it stays gone,
            // and the death check sees it).
            let ws = nofollow::open_dir(&s.dir).map_err(|e| io_error("open", e))?;
            let meta = nofollow::claim_dir(&ws, META_DIR).map_err(|e| io_error("mkdir", e))?;
            let session = nofollow::claim_dir(&meta, request.session.as_str())
                .map_err(|e| io_error("mkdir", e))?;
            nofollow::write_file(&session, request.path.as_str(), request.payload.as_bytes())
                .map_err(|e| io_error("write", e))?;
            // The keeper's own write is never refused, but counted in the workspace's total.
            s.quota.forget();
            drop(sealed);
            Ok(())
        })
        .await
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        let sandbox = request.sandbox;
        let Some(s) = self.get(sandbox) else {
            return Err(BackendError::gone(format!("no sandbox {sandbox}")));
        };
        let admitted = self.admit(sandbox, request.token).await?;
        let _ = s.stopped.send(true);
        let snapshots = self.config.snapshots;
        let root = self.config.root.clone();
        let snapshot = self.snapshot_of(sandbox);
        blocking(move || {
            let _admitted = admitted;
            *s.gate.write().unwrap_or_else(|p| p.into_inner()) = true;
            if !s.dir.exists() {
                return Err(BackendError::gone(format!("{} is gone", s.dir.display())));
            }
            if !snapshots && !request.suspend {
                return Ok(None);
            }
            let to = snapshot_dir(&root, &snapshot).map_err(|e| io_error("snapshot", e))?;
            std::fs::create_dir_all(root.join(layout::SNAPSHOTS_DIR))
                .map_err(|e| io_error("snapshot", e))?;
            // The snapshot's record first (what its sandbox was started for, not yet persisted:
            // only a Persist's say keeps it), then the rename, then the sandbox's record.
            let Some(taken_from) = meta::sandbox_record(&root, sandbox).map_err(meta_error)? else {
                return Err(BackendError::fatal(format!(
                    "{sandbox} has no record of what it was started for: not snapshotted"
                )));
            };
            let record = SnapshotRecord {
                taken_from,
                persisted: false,
                expires: None,
            };
            meta::record_snapshot(&root, &snapshot, &record).map_err(meta_error)?;
            // Sealed, its processes stopped: the workspace itself becomes the snapshot.
            if let Err(e) = std::fs::rename(&s.dir, &to) {
                let _ = meta::forget_snapshot(&root, &snapshot);
                return Err(io_error("snapshot", e));
            }
            meta::forget_sandbox(&root, sandbox).map_err(meta_error)?;
            Ok(Some(snapshot))
        })
        .await
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        let PersistRequest {
            sandbox,
            snapshot,
            suspend,
            retain_until,
            token,
        } = request;
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let admitted = self.admit(sandbox, token).await?;
        let root = self.config.root.clone();
        let (dir, mut record) = {
            let (root, snapshot) = (root.clone(), snapshot.clone());
            blocking(move || kept_snapshot(&root, &snapshot, sandbox)).await?
        };
        if let Some(shelf) = &self.config.shelf {
            // On the shelf first: a Persist that answers ok has put it beyond this host.
            shelf
                .put(&dir, &snapshot, &record.taken_from.key, retain_until)
                .await
                .map_err(|e| {
                    shelf_error(&format!("putting {} on the shelf", snapshot.as_str()), e)
                })?;
        }
        let persisted = blocking(move || {
            let _admitted = admitted;
            // The snapshot's record, outside the workspace: nothing in the workspace says what
            // is kept (`meta.rs`).
            record.persisted = true;
            record.expires = retain_until.map(expiry_secs);
            meta::record_snapshot(&root, &snapshot, &record).map_err(meta_error)
        })
        .await;
        if persisted.is_ok() && suspend {
            // Its last command: the backend no longer runs it (its workspace is the snapshot).
            self.table().remove(&sandbox);
        }
        persisted
    }

    async fn discard(&self, request: DiscardRequest) -> Result<(), BackendError> {
        let root = self.config.root.clone();
        let ledger = self.ledger.clone();
        let snapshot = request.snapshot.clone();
        blocking(move || {
            // What a start left of a snapshot it took (`Taken`) fences nothing: the sandbox it
            // became is up and holds its workspace, and no start takes the snapshot again. So
            // it takes no key lock either (a process paused while holding one would hold up
            // the key's next owner).
            let _admitted = match request.reason {
                DiscardReason::Taken => None,
                _ => ledger.admit(request.sandbox, Some(&request.key), request.token)?,
            };
            let dir = snapshot_dir(&root, &request.snapshot).map_err(|e| io_error("discard", e))?;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("discard", e)),
            }
            // Its record once it is gone.
            meta::forget_snapshot(&root, &request.snapshot).map_err(meta_error)
        })
        .await?;
        // Then the shelf's copy (after this host's, so the shelf's outlives it: a Discard cut
        // short never leaves a host copy that only this host could resume).
        if let Some(shelf) = &self.config.shelf {
            match shelf.remove(&snapshot).await {
                Ok(()) | Err(ShelfError::NotFound(_)) => {}
                Err(e) => return Err(shelf_error(&format!("removing {}", snapshot.as_str()), e)),
            }
        }
        Ok(())
    }

    async fn shutdown(&self, sandbox: SandboxId, token: Option<Token>) -> Result<(), BackendError> {
        let admitted = self.admit(sandbox, token).await?;
        let s = self.table().remove(&sandbox);
        if let Some(s) = &s {
            let _ = s.stopped.send(true);
        }
        let dir = self.sandbox_dir(sandbox);
        let root = self.config.root.clone();
        let own_snapshot = self.snapshot_of(sandbox);
        let own = snapshot_dir(&root, &own_snapshot).map_err(|e| io_error("snapshot", e))?;
        let fence = self.fences().remove(&sandbox).unwrap_or_default();
        blocking(move || {
            let _admitted = admitted;
            if let Some(s) = &s {
                *s.gate.write().unwrap_or_else(|p| p.into_inner()) = true;
            }
            // Waits for a dropped start's file work, and stops one that has not begun.
            *fence.lock().unwrap_or_else(|p| p.into_inner()) = true;
            let remove = |dir: &Path| match std::fs::remove_dir_all(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error("remove", e)),
            };
            remove(&dir)?;
            meta::forget_sandbox(&root, sandbox).map_err(meta_error)?;
            // A snapshot its Stop took that no Persist kept (the persist failed or timed out)
            // is no key's: it goes with the sandbox, then its record. Whether a Persist kept it
            // is in its record, never in the workspace.
            let persisted = meta::snapshot_record(&root, &own_snapshot)
                .map_err(meta_error)?
                .is_some_and(|r| r.persisted);
            if own.exists() && !persisted {
                remove(&own)?;
                meta::forget_snapshot(&root, &own_snapshot).map_err(meta_error)?;
            }
            Ok(())
        })
        .await
    }

    /// A root with a shelf is one host's: another host's process cannot reach a sandbox here,
    /// so a fleet on it hands keys over suspended (their snapshots on the shelf), never warm.
    fn check_config(&self, config: &sandkeeper::Config) -> Result<(), String> {
        match &config.fleet {
            Some(fleet) if self.config.shelf.is_some() && fleet.handover == Handover::Warm => {
                Err(format!(
                    "the local root {} has a shelf: it is one host's of a fleet, whose other \
                     hosts cannot adopt a sandbox here; set config.core.fleet.handover to \
                     Handover::Suspended",
                    self.config.root.display()
                ))
            }
            _ => Ok(()),
        }
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
