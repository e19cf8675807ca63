//! Operations: the application's own work in a sandbox — running a command, reading and
//! writing files — under the keeper's guarantees. The values and the backend's side live here;
//! the application's side is [`SandboxWork`] (a call's work through its [`CallGuard`], and a
//! session's through [`SessionWork`], which keeps the session's sandbox from being stopped
//! under it).
//!
//! The names follow what users of E2B and Daytona know: `exec` (E2B `commands.run`, Daytona
//! `process.exec`), `read`, `write`, `list`, `remove`, `exists` (E2B `files.*`).
//!
//! [`CallGuard`]: crate::CallGuard

mod path;
mod work;

use std::future::Future;
use std::time::Duration;

use sandkeeper::{SandboxId, SessionId};

use crate::backend::Backend;

pub use path::WorkPath;
pub use work::{SandboxWork, SessionWork};

/// The most bytes of standard output, and of standard error, an exec keeps by default.
pub const DEFAULT_OUTPUT_CAP: usize = 1 << 20;

/// The most bytes a read returns by default.
pub const DEFAULT_READ_CAP: usize = 16 << 20;

/// How to run a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    /// The working directory, relative to the workspace (its root by default).
    pub cwd: WorkPath,
    /// Environment variables, beside the backend's own short allowlist; the host's
    /// environment never reaches the command. Names are `[A-Za-z_][A-Za-z0-9_]*`.
    pub env: Vec<(String, String)>,
    /// Standard input (closed at once when empty).
    pub stdin: Vec<u8>,
    /// How long it may run before it is killed with everything it started (`None`: the
    /// backend's default).
    pub timeout: Option<Duration>,
    /// The most bytes kept of standard output, and of standard error; the rest is read and
    /// dropped, and [`ExecOutput::truncated`] says so.
    pub output_cap: usize,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            cwd: WorkPath::root(),
            env: Vec::new(),
            stdin: Vec::new(),
            timeout: None,
            output_cap: DEFAULT_OUTPUT_CAP,
        }
    }
}

/// What a command that ran to its end left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Its exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// Standard output, up to the cap.
    pub stdout: Vec<u8>,
    /// Standard error, up to the cap.
    pub stderr: Vec<u8>,
    /// Whether either was cut at the cap.
    pub truncated: bool,
}

impl ExecOutput {
    /// Whether it exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// A piece of a running command's output, as it comes ([`SandboxWork::exec_streaming`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    /// From standard output.
    Stdout(Vec<u8>),
    /// From standard error.
    Stderr(Vec<u8>),
}

/// A piece of what a running command reads on its standard input
/// ([`SandboxWork::exec_with_input`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes written to its standard input, after everything sent before.
    Stdin(Vec<u8>),
    /// Closes its standard input (the command reads its end); dropping the sender does the
    /// same. Whatever is sent after it is dropped.
    Close,
}

/// What a listed entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (a socket, a pipe, a device).
    Other,
}

/// One entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// Its name (one path component).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes (of the link itself for a symlink).
    pub size: u64,
    /// What else the backend read of it (each part `None` where it reads none).
    pub meta: EntryMeta,
}

/// An entry's metadata beyond its name, kind and size, read without following a symlink.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryMeta {
    /// Its permission bits (`st_mode & 0o7777`: `0o644` for `rw-r--r--`).
    pub mode: Option<u32>,
    /// When its content last changed.
    pub modified: Option<std::time::SystemTime>,
    /// The numeric user that owns it, as the backend sees it.
    pub uid: Option<u32>,
    /// The numeric group that owns it, as the backend sees it.
    pub gid: Option<u32>,
    /// Where a symlink points, as written in the link (never resolved).
    pub link_target: Option<String>,
}

/// What a caller can do about an [`OpError`]: every error is of exactly one class
/// ([`OpError::class`]). See `docs/operations-errors.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpErrorClass {
    /// The sandbox this work ran in is gone for good, for this work: it died, was stopped or
    /// shut down, the keeper closed, or another process took its key over. No retry through
    /// the same handle can succeed; new work needs a new call (which gets a sandbox).
    Gone,
    /// Nothing is bound to run the work yet, or any more: the session has no sandbox its work
    /// may use, or a hook's work ran past its hook. Acquire a call first.
    Unbound,
    /// A failure of the backend that may not happen again (an IO error, an API error): the
    /// same operation may succeed when retried.
    Retryable,
    /// The request itself is refused (a path, a link, a missing file, a directory where a file
    /// was meant, an argv, a variable, a program that cannot start): the same request fails
    /// the same way until the caller changes it or the workspace.
    Refused,
    /// A limit was reached (a read's cap, a command's timeout, the keeper's own limits).
    Limit,
}

/// Why an operation did not do its work. Nothing ran, or what ran was stopped, in every case:
/// an operation never runs in another sandbox than the one it names.
///
/// One situation has one answer: the sandbox going away under the work (it died, was removed
/// from outside, was stopped, the keeper closed) is [`OpError::SandboxGone`] through
/// [`SandboxWork`] whatever the moment it happens (before the operation, or while it runs).
/// [`OpError::class`] groups the answers by what a caller can do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// Entering a session's work ([`Keeper::session_work`](crate::Keeper::session_work)): the
    /// session has no sandbox its work may use (no live call, and no warm or draining sandbox
    /// of its last call). Class [`OpErrorClass::Unbound`]. An operation of a work handle
    /// already entered never answers it: its sandbox going away is [`OpError::SandboxGone`].
    #[error("session {session} has no active sandbox")]
    NoActiveSandbox {
        /// The session.
        session: SessionId,
    },
    /// The sandbox went away before or during the operation: it died (its workspace removed,
    /// its pod deleted), was stopped or shut down (a session's sandbox past its drain
    /// deadline), or the keeper closed. Class [`OpErrorClass::Gone`]. When the backend found it
    /// dead, the keeper learnt of the death.
    #[error("sandbox {sandbox} is gone: {why}")]
    SandboxGone {
        /// The sandbox.
        sandbox: SandboxId,
        /// What showed it.
        why: String,
    },
    /// A backend's answer ([`SandboxOps`]) for a sandbox it has stopped (the keeper ordered
    /// it) before or during the operation; a command running then was killed. Class
    /// [`OpErrorClass::Gone`]. [`SandboxWork`] answers [`OpError::SandboxGone`] for it.
    #[error("sandbox {sandbox} was stopped")]
    Stopped {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Fleet mode: another process took the sandbox's key over (the sandbox or its key has seen
    /// a newer fencing token than this process holds). Nothing was changed; the keeper learnt
    /// of it (the key is fenced here). Class [`OpErrorClass::Gone`].
    #[error("sandbox {sandbox} belongs to another process now: {why}")]
    Fenced {
        /// The sandbox.
        sandbox: SandboxId,
        /// What the backend said.
        why: String,
    },
    /// A hook's work used outside its hook (the sandbox moved on from the place the hook
    /// ran at). Class [`OpErrorClass::Unbound`].
    #[error("work in {sandbox} is not bound to it now: {why}")]
    Unbound {
        /// The sandbox.
        sandbox: SandboxId,
        /// Why.
        why: String,
    },
    /// The command ran longer than its timeout; it was killed with everything it started.
    /// Class [`OpErrorClass::Limit`].
    #[error("killed after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// A path that is not a path inside the workspace, or one work may not change (the
    /// workspace itself, the keeper's own directory). Class [`OpErrorClass::Refused`].
    #[error("invalid path {path:?}: {why}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A path through a symbolic link the operation would have to follow. File operations
    /// never follow a link, wherever it leads (outside the workspace, into the keeper's own
    /// directory, or elsewhere inside): a link in a directory component is refused, and so is
    /// reading one; `write` replaces a link at the path's last component, `remove` removes
    /// it, `exists` sees it, `list` lists it as a link. Class [`OpErrorClass::Refused`].
    #[error("path {path:?} goes through a symbolic link (never followed)")]
    Escapes {
        /// The path.
        path: String,
    },
    /// No such file or directory. Class [`OpErrorClass::Refused`].
    #[error("{path:?} does not exist")]
    NotFound {
        /// The path.
        path: String,
    },
    /// A read of something that is not a regular file: a directory (the workspace itself
    /// included), a FIFO, a socket, a device. Nothing was read (a FIFO is never waited on).
    /// Class [`OpErrorClass::Refused`].
    #[error("{path:?} is not a regular file")]
    NotAFile {
        /// The path.
        path: String,
    },
    /// A path whose directory part is not a directory (a file where a directory was meant),
    /// or a list of something that is not a directory. Class [`OpErrorClass::Refused`].
    #[error("{path:?} is not a directory, or goes through something that is not")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// A read over its cap. Class [`OpErrorClass::Limit`].
    #[error("{path:?} is larger than the cap of {cap} bytes")]
    TooLarge {
        /// The path.
        path: String,
        /// The cap.
        cap: usize,
    },
    /// The workspace is (or with this write would be) over its disk quota: nothing was written,
    /// or the command did not start; or (the local backend with one bubblewrap per sandbox) the
    /// keeper's watch found the workspace over it while the command ran, and killed every
    /// process of the sandbox, the ones left running in the background too. Otherwise a command
    /// that wrote past the quota was not stopped; what it wrote is counted once it ended. Remove
    /// files to make room. Class [`OpErrorClass::Limit`].
    #[error("the workspace takes (or would take) {used} bytes of its quota of {limit}")]
    QuotaExceeded {
        /// Bytes it takes, or would take with the write.
        used: u64,
        /// The quota.
        limit: u64,
    },
    /// The sandbox spent its CPU budget (its processes' CPU time over its life, all of them:
    /// `Limits::sandbox_cpu_seconds` of the local backend, where it is enforced). The keeper
    /// killed every process of the sandbox; the command running then answers this, and so does
    /// every later command of the sandbox (the budget is for its life: a new sandbox has a new
    /// one). Files can still be read, written and removed. Class [`OpErrorClass::Limit`].
    #[error("the sandbox used {used:?} of CPU, past its budget of {budget:?}")]
    CpuBudgetSpent {
        /// CPU time its processes used, as the keeper last counted it.
        used: Duration,
        /// The budget.
        budget: Duration,
    },
    /// An empty argv. Class [`OpErrorClass::Refused`].
    #[error("empty argv")]
    EmptyArgv,
    /// An environment variable the command cannot be given. Class [`OpErrorClass::Refused`].
    #[error("invalid environment variable {name:?}: {why}")]
    InvalidEnv {
        /// Its name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The program could not be started (not found, not executable). Class
    /// [`OpErrorClass::Refused`]. (A start that failed because the sandbox went away is
    /// [`OpError::SandboxGone`] through [`SandboxWork`].)
    #[error("could not start {program:?}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        error: String,
    },
    /// What the backend cannot do at all (a standard input fed while the command runs, on a
    /// backend that only takes it up front). Class [`OpErrorClass::Refused`].
    #[error("{what} is not supported by this backend")]
    Unsupported {
        /// What was asked.
        what: &'static str,
    },
    /// Any other failure of the backend, with what it said. Class
    /// [`OpErrorClass::Retryable`].
    #[error("{what}: {error}")]
    Backend {
        /// What was being done.
        what: &'static str,
        /// What went wrong.
        error: String,
    },
    /// The keeper refused the work. Class: [`OpErrorClass::Gone`] once it closed,
    /// [`OpErrorClass::Limit`] for a limit or a full queue, [`OpErrorClass::Unbound`] for a
    /// session without a sandbox, [`OpErrorClass::Refused`] otherwise.
    #[error(transparent)]
    Keeper(#[from] crate::KeeperError),
}

impl OpError {
    /// A short name of the error's kind (`sandbox-gone`, `timeout`, ...), for counts.
    pub fn kind(&self) -> &'static str {
        match self {
            OpError::NoActiveSandbox { .. } => "no-active-sandbox",
            OpError::SandboxGone { .. } => "sandbox-gone",
            OpError::Stopped { .. } => "stopped",
            OpError::Fenced { .. } => "fenced",
            OpError::Unbound { .. } => "unbound",
            OpError::Timeout { .. } => "timeout",
            OpError::InvalidPath { .. } => "invalid-path",
            OpError::Escapes { .. } => "escapes",
            OpError::NotFound { .. } => "not-found",
            OpError::NotAFile { .. } => "not-a-file",
            OpError::NotADirectory { .. } => "not-a-directory",
            OpError::TooLarge { .. } => "too-large",
            OpError::QuotaExceeded { .. } => "quota-exceeded",
            OpError::CpuBudgetSpent { .. } => "cpu-budget-spent",
            OpError::EmptyArgv => "empty-argv",
            OpError::InvalidEnv { .. } => "invalid-env",
            OpError::Spawn { .. } => "spawn",
            OpError::Unsupported { .. } => "unsupported",
            OpError::Backend { .. } => "backend",
            OpError::Keeper(_) => "keeper",
        }
    }

    /// What a caller can do about it (see [`OpErrorClass`]).
    pub fn class(&self) -> OpErrorClass {
        use crate::KeeperError as K;
        use sandkeeper::Error as C;
        match self {
            OpError::SandboxGone { .. } | OpError::Stopped { .. } | OpError::Fenced { .. } => {
                OpErrorClass::Gone
            }
            OpError::NoActiveSandbox { .. } | OpError::Unbound { .. } => OpErrorClass::Unbound,
            OpError::Backend { .. } => OpErrorClass::Retryable,
            OpError::InvalidPath { .. }
            | OpError::Escapes { .. }
            | OpError::NotFound { .. }
            | OpError::NotAFile { .. }
            | OpError::NotADirectory { .. }
            | OpError::EmptyArgv
            | OpError::InvalidEnv { .. }
            | OpError::Spawn { .. }
            | OpError::Unsupported { .. } => OpErrorClass::Refused,
            OpError::Timeout { .. }
            | OpError::TooLarge { .. }
            | OpError::QuotaExceeded { .. }
            | OpError::CpuBudgetSpent { .. } => OpErrorClass::Limit,
            OpError::Keeper(e) => match e {
                K::Closed | K::Revoked { .. } | K::Core(C::Closed { .. }) => OpErrorClass::Gone,
                K::Core(C::SandboxGone { .. }) => OpErrorClass::Gone,
                K::Core(C::NoActiveSandbox { .. }) => OpErrorClass::Unbound,
                K::Core(C::QueueFull { .. } | C::LimitExceeded { .. }) => OpErrorClass::Limit,
                _ => OpErrorClass::Refused,
            },
        }
    }

    /// Whether the same operation may succeed when retried as it is: only for
    /// [`OpErrorClass::Retryable`].
    pub fn is_retryable(&self) -> bool {
        self.class() == OpErrorClass::Retryable
    }
}

/// A command to run: argv only (never a shell string: every element reaches the program as
/// one argument, whatever it holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecRequest {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// How to run it.
    pub options: ExecOptions,
}

/// A backend that runs the application's own work in its sandboxes. Every method names the
/// sandbox; the keeper calls them only for a sandbox that it knows up and that may take the
/// work, and a backend refuses a sandbox it has stopped ([`OpError::Stopped`]) or finds gone
/// ([`OpError::SandboxGone`]); [`SandboxWork`] answers both as `SandboxGone`. A dropped future
/// stops its work (a command is killed with everything it started).
pub trait SandboxOps: Backend {
    /// Runs a command in the sandbox.
    fn exec(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
    ) -> impl Future<Output = Result<ExecOutput, OpError>> + Send;

    /// Runs a command like [`exec`](Self::exec), and also sends its output to `chunks` as it
    /// comes (each stream in order; not capped: the returned output is). A full channel holds
    /// the command's output back; a dropped receiver stops nothing. The default, for a backend
    /// that cannot stream, sends each stream whole once the command ended.
    fn exec_streaming(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
    ) -> impl Future<Output = Result<ExecOutput, OpError>> + Send {
        async move {
            let out = self.exec(sandbox, request).await?;
            if !out.stdout.is_empty() {
                let _ = chunks.send(Chunk::Stdout(out.stdout.clone())).await;
            }
            if !out.stderr.is_empty() {
                let _ = chunks.send(Chunk::Stderr(out.stderr.clone())).await;
            }
            Ok(out)
        }
    }

    /// Runs a command like [`exec_streaming`](Self::exec_streaming) whose standard input stays
    /// open while it runs: first the request's `stdin`, then each [`Input::Stdin`] from `input`
    /// in order; [`Input::Close`], or the sender dropped, closes it. The backend takes the next
    /// piece only once the last was written or is bounded on its way: a full channel holds
    /// the writer back. A command that no longer reads (it closed its input, or
    /// exited) gets nothing more: what is sent then is dropped, and once the exec ended the
    /// sender's `send` fails. The command is killed at its timeout whether its input is open or
    /// not. The default, for a backend that takes standard input only up front, answers
    /// [`OpError::Unsupported`] and runs nothing.
    fn exec_with_input(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
        input: tokio::sync::mpsc::Receiver<Input>,
    ) -> impl Future<Output = Result<ExecOutput, OpError>> + Send {
        let _ = (sandbox, request, chunks, input);
        async {
            Err(OpError::Unsupported {
                what: "a standard input fed while the command runs",
            })
        }
    }

    /// Writes a file atomically (a reader sees the old file or the new one, never a part),
    /// making its parent directories.
    fn write(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        bytes: Vec<u8>,
    ) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Reads a file of at most `cap` bytes.
    fn read(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        cap: usize,
    ) -> impl Future<Output = Result<Vec<u8>, OpError>> + Send;

    /// Lists a directory, by name.
    fn list(
        &self,
        sandbox: SandboxId,
        dir: WorkPath,
    ) -> impl Future<Output = Result<Vec<Entry>, OpError>> + Send;

    /// Removes a file, or a directory with everything in it.
    fn remove(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
    ) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Whether something exists at the path (a symlink in the path's directory part is an
    /// error, not a `false`).
    fn exists(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
    ) -> impl Future<Output = Result<bool, OpError>> + Send;

    /// Whether the sandbox went away, asked after an operation failed in a way its going away
    /// may explain (a program that could not start in a removed directory, a file missing from
    /// a removed workspace): `Some` with the answer for it — [`OpError::SandboxGone`] when the
    /// backend finds it dead, [`OpError::Stopped`] when it stopped it — or `None` while it is
    /// there. [`SandboxWork`] asks it so that the sandbox's going away has one answer whatever
    /// the moment it happens. The default knows nothing (`None`): the backend's errors stand.
    fn went_away(&self, sandbox: SandboxId) -> impl Future<Output = Option<OpError>> + Send {
        let _ = sandbox;
        async { None }
    }
}

impl ExecRequest {
    /// A request checked before anything runs: a non-empty argv and valid variables.
    pub fn new(argv: Vec<String>, options: ExecOptions) -> Result<Self, OpError> {
        let request = ExecRequest { argv, options };
        request.check()?;
        Ok(request)
    }

    /// Checks the request (its fields are public, so a backend checks what it is given):
    /// answers the program, or [`OpError::EmptyArgv`] / [`OpError::InvalidEnv`].
    pub fn check(&self) -> Result<&str, OpError> {
        let program = self.argv.first().ok_or(OpError::EmptyArgv)?;
        for (name, value) in &self.options.env {
            check_env(name, value)?;
        }
        Ok(program)
    }
}

/// Checks an environment variable for a command.
pub fn check_env(name: &str, value: &str) -> Result<(), OpError> {
    let bad = |why| OpError::InvalidEnv {
        name: name.to_string(),
        why,
    };
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad("names are [A-Za-z_][A-Za-z0-9_]*"));
    }
    if value.contains('\0') {
        return Err(bad("the value holds a NUL byte"));
    }
    Ok(())
}
