//! Operations in a local sandbox ([`SandboxOps`] for [`LocalBackend`]).
//!
//! - **Files** go through directory handles from the sandbox's directory down, one component
//!   at a time, never following a link (`nofollow.rs`): a path through a link — wherever it
//!   leads: out of the workspace, into the keeper's `.sandkeeper`, or elsewhere inside — is
//!   refused ([`OpError::Escapes`]). A read opens without waiting and reads only a regular
//!   file ([`OpError::NotAFile`] for a directory or a FIFO), up to its cap. Writes are atomic
//!   (a new temporary `.sk-<16 hex>` in the target's directory, then a rename within it) and,
//!   like uploads, hold the sandbox's gate: none lands after Stop.
//! - **Commands** run with argv only, in the workspace (or a directory in it, checked the same
//!   way), seen at its host path or at the configured workspace mount (`mount.rs`), with a
//!   cleared environment: `PATH`, `HOME` (the workspace as they see it), `PWD`, `LANG`,
//!   `SANDKEEPER_SANDBOX` and the request's own variables, never the host's. Each runs under
//!   the backend's isolation and limits (`isolation.rs`, `limits.rs`; the threat model is
//!   `docs/threat-model.md`), leading a process group of its own, killed with
//!   everything it started (its group, its PID namespace, its cgroup, or what carries its
//!   mark; through the sandbox's init, its group: `init_exec.rs`) when it ends, times out, the
//!   sandbox stops, or the caller drops the future.
//!
//! Without bubblewrap, a command runs as the keeper's user, sees the host's file system and
//! network, and may write wherever that user may.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt as _, PermissionsExt as _};
use sandkeeper::SandboxId;

use super::init_exec::{self, InitExec};
use super::isolation::{Prepared, Workspace};
use super::limit_watch::Watched;
use super::nofollow::{self, Refused};
use super::quota;
use super::sandbox_init::SandboxInit;
use super::wire::Spawn;
use super::{LocalBackend, LocalSandbox};
use crate::backend::{BackendError, FailureClass};
use crate::ops::{
    Chunk, Entry, EntryKind, EntryMeta, ExecOutput, ExecRequest, Input, OpError, SandboxOps,
    WorkPath,
};

/// Maps an IO error on `path` in sandbox `s`: a missing workspace is the sandbox gone, a path
/// that led outside is refused as such.
fn path_error(s: &LocalSandbox, sandbox: SandboxId, path: &WorkPath, e: io::Error) -> OpError {
    if !s.dir.exists() {
        return OpError::SandboxGone {
            sandbox,
            why: format!("{} is gone", s.dir.display()),
        };
    }
    let path_s = || path.to_string();
    if let Some(q) = quota::exceeded(&e) {
        return OpError::QuotaExceeded {
            used: q.used,
            limit: q.limit,
        };
    }
    match nofollow::refusal(&e) {
        Some(Refused::Link) => return OpError::Escapes { path: path_s() },
        Some(Refused::NotAFile) => return OpError::NotAFile { path: path_s() },
        Some(Refused::NotADirectory) => return OpError::NotADirectory { path: path_s() },
        Some(Refused::TooLarge(cap)) => {
            return OpError::TooLarge {
                path: path_s(),
                cap,
            }
        }
        None => {}
    }
    match rustix::io::Errno::from_io_error(&e) {
        Some(rustix::io::Errno::NOTDIR) => return OpError::NotADirectory { path: path_s() },
        Some(rustix::io::Errno::ISDIR) => return OpError::NotAFile { path: path_s() },
        _ => {}
    }
    match e.kind() {
        io::ErrorKind::NotFound => OpError::NotFound {
            path: path.to_string(),
        },
        // cap-std's refusal of a path that resolves outside the directory.
        io::ErrorKind::PermissionDenied if e.to_string().contains("outside of the filesystem") => {
            OpError::Escapes {
                path: path.to_string(),
            }
        }
        _ => OpError::Backend {
            what: "file",
            error: format!("{path}: {e}"),
        },
    }
}

/// Whether an operation changes the workspace (and is fenced in fleet mode) or only reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Reads,
    Changes,
}

/// A refused token check as the operation's error.
fn fenced(sandbox: SandboxId, e: BackendError) -> OpError {
    match e.class {
        FailureClass::Fenced => OpError::Fenced {
            sandbox,
            why: e.message,
        },
        _ => OpError::Backend {
            what: "token check",
            error: e.message,
        },
    }
}

impl LocalBackend {
    /// The sandbox, if the backend runs it and it is not stopped.
    fn for_work(&self, sandbox: SandboxId) -> Result<Arc<LocalSandbox>, OpError> {
        let Some(s) = self.get(sandbox) else {
            return Err(OpError::SandboxGone {
                sandbox,
                why: "not running here".into(),
            });
        };
        if *s.gate.read().unwrap_or_else(|p| p.into_inner()) {
            return Err(OpError::Stopped { sandbox });
        }
        Ok(s)
    }

    /// Runs `f` on a blocking thread with the sandbox's directory as a capability, holding its
    /// gate for reading (so Stop waits for it, and nothing runs once it sealed). `Changes`:
    /// in fleet mode, `f` runs only while this process's token is still the newest the
    /// sandbox and its key have seen, under the key's token lock (`fence.rs`), so a process
    /// whose key another took over changes nothing, even through a handle it opened before.
    async fn with_dir<T: Send + 'static>(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        access: Access,
        f: impl FnOnce(&Dir, &WorkPath) -> io::Result<T> + Send + 'static,
    ) -> Result<T, OpError> {
        let s = self.for_work(sandbox)?;
        let ledger = self.ledger.clone();
        tokio::task::spawn_blocking(move || {
            let sealed = s.gate.read().unwrap_or_else(|p| p.into_inner());
            if *sealed {
                return Err(OpError::Stopped { sandbox });
            }
            let fence = match access {
                Access::Reads => None,
                Access::Changes => ledger
                    .check(sandbox, s.token)
                    .map_err(|e| fenced(sandbox, e))?,
            };
            let dir = Dir::open_ambient_dir(&s.dir, ambient_authority())
                .map_err(|e| path_error(&s, sandbox, &path, e))?;
            let r = f(&dir, &path).map_err(|e| path_error(&s, sandbox, &path, e));
            drop(fence);
            drop(sealed);
            r
        })
        .await
        .unwrap_or_else(|e| {
            Err(OpError::Backend {
                what: "file task",
                error: e.to_string(),
            })
        })
    }
}

/// The directory part and the last component of a path that is not the root.
fn split(path: &WorkPath) -> (&str, &str) {
    match path.as_str().rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", path.as_str()),
    }
}

/// Writes `path` atomically, making its parent directories; never through a link
/// (`nofollow.rs`): a link in the directory part is refused, a link at the last component is
/// replaced (the rename replaces the name, never what it pointed to).
/// The write is admitted by the workspace's `quota` first: nothing is written past it.
fn write_atomically(
    dir: &Dir,
    path: &WorkPath,
    bytes: &[u8],
    quota: &quota::Quota,
) -> io::Result<()> {
    let (parent, name) = split(path);
    let parent = nofollow::open_beneath(dir.as_fd(), parent, true)?;
    quota.admit_write(dir, &parent, name, bytes.len() as u64, || {
        nofollow::write_file(&parent, name, bytes)
    })
}

/// Reads `path`, at most `cap` bytes, never through a link and never waiting (a FIFO is
/// refused at once): only a regular file is read.
fn read_capped(dir: &Dir, path: &WorkPath, cap: usize) -> io::Result<Vec<u8>> {
    if path.is_root() {
        return nofollow::read_opened(nofollow::open_beneath(dir.as_fd(), ".", false)?, cap);
    }
    let (parent, name) = split(path);
    let parent = nofollow::open_beneath(dir.as_fd(), parent, false)?;
    nofollow::read_file(&parent, name, cap)
}

/// The directory `path` as a handle, never through a link.
fn open_listed(dir: &Dir, path: &WorkPath) -> io::Result<Dir> {
    let fd = nofollow::open_beneath(dir.as_fd(), path.as_str(), false)?;
    Ok(Dir::from_std_file(std::fs::File::from(fd)))
}

/// The `PATH` commands get.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether `program` names an executable file, looked up on the host as the command will
/// see it: a path when it holds a `/` (relative to the working directory `cwd` of the
/// `workspace`; an absolute one in the workspace as commands see it is looked up at its host
/// path), else a file in a directory of [`PATH`].
fn program_exists(program: &str, workspace: &Workspace<'_>, cwd: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let seen = workspace.inside_path(cwd).join(program);
        let host = workspace
            .host_of(&seen)
            .unwrap_or_else(|| workspace.host_path(cwd).join(program));
        return executable(&host);
    }
    PATH.split(':')
        .any(|d| executable(&std::path::Path::new(d).join(program)))
}

fn kind_of(t: cap_std::fs::FileType) -> EntryKind {
    if t.is_symlink() {
        EntryKind::Symlink
    } else if t.is_dir() {
        EntryKind::Dir
    } else if t.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

impl LocalBackend {
    /// An exec, streaming its output to `chunks` when given, its standard input kept open and
    /// fed from `input` when given (also what [`LocalBackend::run`] runs through).
    pub(super) async fn exec_with(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: Option<tokio::sync::mpsc::Sender<Chunk>>,
        input: Option<tokio::sync::mpsc::Receiver<Input>>,
    ) -> Result<ExecOutput, OpError> {
        let program = request.check()?.to_string();
        let s = self.for_work(sandbox)?;
        // A sandbox that spent its CPU budget runs nothing more (`limit_watch.rs`).
        if let Some(spent) = s.usage.spent() {
            return Err(spent);
        }
        let cwd = request.options.cwd.clone();
        // The working directory is checked as every operation's path is (one component at a
        // time, never through a link: `Escapes`), then named. Checked as a change: a command
        // of a process whose key was taken over does not start.
        // A workspace over its quota (a command wrote past it) runs nothing until the caller
        // made room.
        let counted = s.clone();
        self.with_dir(sandbox, cwd.clone(), Access::Changes, move |dir, cwd| {
            if !cwd.is_root() {
                nofollow::open_beneath(dir, cwd.as_str(), false)?;
            }
            counted.quota.admit_command(dir)
        })
        .await?;
        // The workspace as commands see it: at its host path, or at the workspace mount
        // (`mount.rs`). The keeper checks on the host; everything handed in names the inside.
        let workspace = Workspace {
            host: &s.dir,
            inside: self.config.workspace_mount.as_deref().unwrap_or(&s.dir),
        };
        let rel = if cwd.is_root() { "" } else { cwd.as_str() };
        // Found before anything starts, as the command will see it (the host's file system,
        // the fixed PATH, a path in the workspace where it lies on the host), so a missing
        // program is a spawn error under bubblewrap too.
        if !program_exists(&program, &workspace, rel) {
            return Err(OpError::Spawn {
                program: program.to_string(),
                error: "not found (on PATH, or at the path given)".into(),
            });
        }
        let timeout = request.options.timeout.unwrap_or(self.config.run_timeout);
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), PATH.into()),
            ("HOME".into(), path(workspace.inside)),
            ("PWD".into(), path(&workspace.inside_path(rel))),
            ("LANG".into(), "C.UTF-8".into()),
            ("SANDKEEPER_SANDBOX".into(), sandbox.to_string()),
        ];
        env.extend(request.options.env.iter().cloned());
        let ran = if self.isolated.init().is_some() {
            let init = self.sandbox_init(&s).await?;
            // `RLIMIT_CPU` on the command itself, not on the init (`limits.rs`).
            let mut argv = self.limits.command_prlimit_argv();
            argv.extend(request.argv);
            let exec = InitExec {
                program: program.clone(),
                spawn: Spawn {
                    argv,
                    env,
                    // The init runs inside: the directory as the command sees it.
                    cwd: path(&workspace.inside_path(rel)),
                    stdin: request.options.stdin,
                    window: 0,
                    input: false,
                },
                cap: request.options.output_cap,
                timeout,
                chunks,
                input,
            };
            init_exec::run(&s, sandbox, init, exec).await
        } else {
            let prepared = self
                .isolated
                .command(
                    &self.limits,
                    &self.config.root,
                    workspace,
                    rel,
                    &request.argv,
                    &env,
                )
                .map_err(|e| OpError::Backend {
                    what: "sandbox",
                    error: e.to_string(),
                })?;
            let streams = (chunks, input);
            process::run(&s, sandbox, prepared, request, timeout, streams).await
        };
        // Whatever it wrote is counted before the next write or command.
        s.quota.forget();
        ran
    }
}

impl LocalBackend {
    /// The sandbox's init (one bubblewrap per sandbox), started now if it has none running.
    async fn sandbox_init(&self, s: &LocalSandbox) -> Result<Arc<SandboxInit>, OpError> {
        let mut slot = s.init.lock().await;
        if let Some(init) = slot.as_ref().filter(|i| i.is_running()) {
            return Ok(init.clone());
        }
        let backend = |e: io::Error| OpError::Backend {
            what: "sandbox init",
            error: e.to_string(),
        };
        let workspace = Workspace {
            host: &s.dir,
            inside: self.config.workspace_mount.as_deref().unwrap_or(&s.dir),
        };
        let prepared = self
            .isolated
            .init_command(&self.limits, &self.config.root, workspace)
            .map_err(backend)?;
        let watched = Watched {
            workspace: s.dir.clone(),
            quota: self.limits.limits.workspace_bytes,
            cpu_budget: self
                .limits
                .limits
                .sandbox_cpu_seconds
                .filter(|_| self.limits.sandbox_cpu_watched())
                .map(Duration::from_secs),
            usage: s.usage.clone(),
        };
        let init = SandboxInit::start(prepared, s.stopped.subscribe(), watched);
        *slot = Some(init.clone());
        Ok(init)
    }
}

impl SandboxOps for LocalBackend {
    async fn exec(&self, sandbox: SandboxId, request: ExecRequest) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, None, None).await
    }

    async fn exec_streaming(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
    ) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, Some(chunks), None).await
    }

    async fn exec_with_input(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
        input: tokio::sync::mpsc::Receiver<Input>,
    ) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, Some(chunks), Some(input))
            .await
    }

    async fn write(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        bytes: Vec<u8>,
    ) -> Result<(), OpError> {
        path.writable()?;
        let s = self.for_work(sandbox)?;
        self.with_dir(sandbox, path, Access::Changes, move |dir, path| {
            write_atomically(dir, path, &bytes, &s.quota)
        })
        .await
    }

    async fn read(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        cap: usize,
    ) -> Result<Vec<u8>, OpError> {
        let read = self
            .with_dir(sandbox, path.clone(), Access::Reads, move |dir, path| {
                read_capped(dir, path, cap)
            })
            .await?;
        Ok(read)
    }

    async fn list(&self, sandbox: SandboxId, path: WorkPath) -> Result<Vec<Entry>, OpError> {
        self.with_dir(sandbox, path, Access::Reads, |dir, path| {
            // Every component opened without following a link; entries' metadata is read
            // without following theirs.
            let listed = open_listed(dir, path)?;
            let mut out = Vec::new();
            for entry in listed.entries()? {
                let entry = entry?;
                let meta = entry.metadata()?;
                let kind = kind_of(entry.file_type()?);
                let name = entry.file_name();
                // The link itself is read, never followed: its target as written (absolute or
                // leading out included: it is only text here).
                let link_target = match kind {
                    EntryKind::Symlink => listed
                        .read_link_contents(&name)
                        .ok()
                        .map(|t| t.to_string_lossy().into_owned()),
                    _ => None,
                };
                out.push(Entry {
                    name: name.to_string_lossy().into_owned(),
                    kind,
                    size: meta.len(),
                    meta: EntryMeta {
                        mode: Some(meta.permissions().mode() & 0o7777),
                        modified: meta.modified().ok().map(|t| t.into_std()),
                        uid: Some(meta.uid()),
                        gid: Some(meta.gid()),
                        link_target,
                    },
                });
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    async fn remove(&self, sandbox: SandboxId, path: WorkPath) -> Result<(), OpError> {
        path.writable()?;
        let s = self.for_work(sandbox)?;
        self.with_dir(sandbox, path, Access::Changes, move |dir, path| {
            // The directory part never through a link; the last component not followed: a
            // link is removed itself, a directory with what is in it (cap-std removes a tree
            // without following the links in it).
            let (parent, name) = split(path);
            let parent = open_listed(dir, &WorkPath::new(parent).map_err(io::Error::other)?)?;
            let removed = if parent.symlink_metadata(name)?.is_dir() {
                parent.remove_dir_all(name)
            } else {
                parent.remove_file(name)
            };
            // Whatever was removed (a tree may go in part), the count is taken again.
            s.quota.forget();
            removed
        })
        .await
    }

    async fn exists(&self, sandbox: SandboxId, path: WorkPath) -> Result<bool, OpError> {
        self.with_dir(sandbox, path, Access::Reads, |dir, path| {
            if path.is_root() {
                return Ok(true);
            }
            // The last component not followed (a link exists as itself); a link in the
            // directory part is an error, not a `false`.
            let (parent, name) = split(path);
            let parent = match nofollow::open_beneath(dir.as_fd(), parent, false) {
                Ok(parent) => parent,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) if nofollow::refusal(&e) == Some(Refused::NotADirectory) => {
                    return Ok(false)
                }
                Err(e) => return Err(e),
            };
            Ok(nofollow::kind_at(&parent, name)?.is_some())
        })
        .await
    }

    async fn went_away(&self, sandbox: SandboxId) -> Option<OpError> {
        let Some(s) = self.get(sandbox) else {
            return Some(OpError::SandboxGone {
                sandbox,
                why: "not running here".into(),
            });
        };
        if *s.gate.read().unwrap_or_else(|p| p.into_inner()) {
            return Some(OpError::Stopped { sandbox });
        }
        let dir = s.dir.clone();
        // A stat: on a blocking thread, as every file call here.
        let there = tokio::task::spawn_blocking(move || dir.exists())
            .await
            .unwrap_or(true);
        (!there).then(|| OpError::SandboxGone {
            sandbox,
            why: format!("{} is gone", s.dir.display()),
        })
    }
}

/// Where an exec's output goes as it comes, and where its standard input comes from while it
/// runs, when given.
type Streams = (
    Option<tokio::sync::mpsc::Sender<Chunk>>,
    Option<tokio::sync::mpsc::Receiver<Input>>,
);

#[cfg(loom)]
mod process {
    //! tokio leaves out its process module under `--cfg loom`; loom builds only check the
    //! shared-state layer and never run processes.
    use super::*;

    pub(super) async fn run(
        _: &LocalSandbox,
        _: SandboxId,
        _: Prepared,
        request: ExecRequest,
        _: Duration,
        _: Streams,
    ) -> Result<ExecOutput, OpError> {
        Err(OpError::Spawn {
            program: request.argv.first().cloned().unwrap_or_default(),
            error: "no processes in a --cfg loom build".into(),
        })
    }
}

#[cfg(not(loom))]
mod process {
    //! Running one command in its own process group.
    use super::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

    /// How long an exec waits, after its group was killed, for its output pipes to close.
    const REAP: Duration = Duration::from_secs(5);

    /// Kills a command's processes when dropped, whatever path the exec leaves by: its
    /// process group (and session: the command leads both) at once, and, on a task of its own,
    /// its cgroup's processes or those carrying its mark ([`Group::end`] does the same, waited
    /// for).
    struct Group {
        pid: Option<rustix::process::Pid>,
        cgroup: Option<crate::local::limits::CommandCgroup>,
        mark: Option<String>,
    }

    impl Group {
        /// Kills everything the command started: its group and its cgroup's processes at once
        /// (the cgroup is removed on a task of its own, once they are reaped: the exec does
        /// not wait for that), and, without either, waits until nothing carrying its mark is
        /// alive.
        async fn end(mut self) {
            self.kill_group();
            if let Some(cgroup) = &self.cgroup {
                cgroup.kill_all();
            }
            if let Some(mark) = self.mark.take() {
                crate::local::isolation::kill_marked(&mark).await;
            }
            // Drop: the cgroup's removal on a task of its own.
        }

        fn kill_group(&mut self) {
            if let Some(pid) = self.pid.take() {
                // ESRCH (already gone) is fine.
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
    }

    impl Drop for Group {
        fn drop(&mut self) {
            self.kill_group();
            let (cgroup, mark) = (self.cgroup.take(), self.mark.take());
            if cgroup.is_none() && mark.is_none() {
                return;
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Some(cgroup) = cgroup {
                        cgroup.end().await;
                    }
                    if let Some(mark) = mark {
                        crate::local::isolation::kill_marked(&mark).await;
                    }
                });
            }
        }
    }

    /// Writes a command's standard input: `first`, then, when it stays open, each piece from
    /// `input` until [`Input::Close`] or its sender is gone, then closes it. Once the command
    /// stops reading (a write fails), or after the close, pieces are taken and dropped, so the
    /// sender is held back only while the command reads slower than it sends.
    async fn feed(
        mut stdin: tokio::process::ChildStdin,
        first: Vec<u8>,
        input: Option<tokio::sync::mpsc::Receiver<Input>>,
    ) {
        let mut reads = stdin.write_all(&first).await.is_ok();
        let Some(mut input) = input else {
            return;
        };
        while let Some(Input::Stdin(bytes)) = input.recv().await {
            if reads {
                reads = stdin.write_all(&bytes).await.is_ok();
            }
        }
        drop(stdin);
        while input.recv().await.is_some() {}
    }

    /// Reads `r` to its end, keeping at most `cap` bytes; whether any were dropped.
    /// ... and sends each piece read to `chunks` (made by `wrap`), when given.
    async fn collect(
        mut r: impl AsyncRead + Unpin,
        cap: usize,
        chunks: Option<tokio::sync::mpsc::Sender<Chunk>>,
        wrap: fn(Vec<u8>) -> Chunk,
    ) -> (Vec<u8>, bool) {
        let (mut out, mut cut) = (Vec::new(), false);
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return (out, cut),
                Ok(n) => {
                    if let Some(tx) = &chunks {
                        let _ = tx.send(wrap(buf[..n].to_vec())).await;
                    }
                    let room = cap.saturating_sub(out.len());
                    cut |= n > room;
                    out.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    }

    pub(super) async fn run(
        s: &LocalSandbox,
        sandbox: SandboxId,
        prepared: Prepared,
        request: ExecRequest,
        timeout: Duration,
        (chunks, input): Streams,
    ) -> Result<ExecOutput, OpError> {
        let ExecRequest { argv, options } = request;
        let program = argv.first().ok_or(OpError::EmptyArgv)?;
        let Prepared {
            command,
            fds,
            cgroup,
            mark,
        } = prepared;
        let mut group = Group {
            pid: None,
            cgroup,
            mark,
        };
        let mut stopped = s.stopped.subscribe();
        if *stopped.borrow() {
            return Err(OpError::Stopped { sandbox });
        }
        // The environment, working directory, session and descriptors are set
        // (`isolation.rs`); the command leads a session and process group of its own.
        let mut command = tokio::process::Command::from(command);
        command
            .stdin(if options.stdin.is_empty() && input.is_none() {
                std::process::Stdio::null()
            } else {
                std::process::Stdio::piped()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let spawned = command.spawn();
        // The filter's pipe is the spawned process's now.
        drop(fds);
        let mut child = spawned.map_err(|e| OpError::Spawn {
            program: program.clone(),
            error: e.to_string(),
        })?;
        group.pid = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32));
        tracing::debug!(sandbox = %sandbox, program = %program, "exec");
        let cap = options.output_cap;
        let stdout = tokio::spawn(collect(
            child.stdout.take().expect("piped"),
            cap,
            chunks.clone(),
            Chunk::Stdout,
        ));
        let stderr = tokio::spawn(collect(
            child.stderr.take().expect("piped"),
            cap,
            chunks,
            Chunk::Stderr,
        ));
        // Fed on this future, not a task of its own: its receiver goes the moment the command
        // ended (or the exec is dropped), and the caller's sends fail from then on.
        let stdin = child.stdin.take();
        let feeding = async move {
            if let Some(stdin) = stdin {
                feed(stdin, options.stdin, input).await;
            }
            std::future::pending::<std::convert::Infallible>().await
        };
        let ended = tokio::select! {
            never = feeding => match never {},
            status = child.wait() => status.map_err(|e| OpError::Backend {
                what: "wait",
                error: e.to_string(),
            }),
            () = tokio::time::sleep(timeout) => Err(OpError::Timeout { after: timeout }),
            _ = stopped.wait_for(|stopped| *stopped) => Err(OpError::Stopped { sandbox }),
        };
        // Whatever ended it, everything it started goes with it; its pipes close once every
        // process of it is dead, so the exec returns only then (bounded, for a process that
        // escaped: none can under bubblewrap or a cgroup).
        group.end().await;
        let outputs = async { (stdout.await, stderr.await) };
        let outputs = tokio::time::timeout(REAP, outputs).await;
        let status = ended?;
        let Ok((Ok((stdout, cut_out)), Ok((stderr, cut_err)))) = outputs else {
            return Err(OpError::Backend {
                what: "exec",
                error: format!(
                    "its output stayed open {REAP:?} after it ended: a process left its group"
                ),
            });
        };
        if !s.dir.exists() {
            return Err(OpError::SandboxGone {
                sandbox,
                why: format!("{} is gone", s.dir.display()),
            });
        }
        Ok(ExecOutput {
            code: status.code(),
            stdout,
            stderr,
            truncated: cut_out || cut_err,
        })
    }
}
