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
}

/// Why an operation did not do its work. Nothing ran, or what ran was stopped, in every case:
/// an operation never runs in another sandbox than the one it names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The session has no sandbox its work may use (no live call, and no warm or draining
    /// sandbox of its last call; or that sandbox was ordered to stop).
    #[error("session {session} has no active sandbox")]
    NoActiveSandbox {
        /// The session.
        session: SessionId,
    },
    /// The sandbox died, before or during the operation; the keeper learnt of it.
    #[error("sandbox {sandbox} is gone: {why}")]
    SandboxGone {
        /// The sandbox.
        sandbox: SandboxId,
        /// What showed it.
        why: String,
    },
    /// The sandbox was stopped (the keeper ordered it) before or during the operation; a
    /// command running then was killed.
    #[error("sandbox {sandbox} was stopped")]
    Stopped {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Fleet mode: another process took the sandbox's key over (the sandbox or its key has seen
    /// a newer fencing token than this process holds). Nothing was changed; the keeper learnt
    /// of it (the key is fenced here).
    #[error("sandbox {sandbox} belongs to another process now: {why}")]
    Fenced {
        /// The sandbox.
        sandbox: SandboxId,
        /// What the backend said.
        why: String,
    },
    /// The command ran longer than its timeout; it was killed with everything it started.
    #[error("killed after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// A path that is not a path inside the workspace.
    #[error("invalid path {path:?}: {why}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A path that leads out of the workspace (through a symlink).
    #[error("path {path:?} leads outside the workspace")]
    Escapes {
        /// The path.
        path: String,
    },
    /// No such file or directory.
    #[error("{path:?} does not exist")]
    NotFound {
        /// The path.
        path: String,
    },
    /// A read over its cap.
    #[error("{path:?} is larger than the cap of {cap} bytes")]
    TooLarge {
        /// The path.
        path: String,
        /// The cap.
        cap: usize,
    },
    /// An empty argv.
    #[error("empty argv")]
    EmptyArgv,
    /// An environment variable the command cannot be given.
    #[error("invalid environment variable {name:?}: {why}")]
    InvalidEnv {
        /// Its name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The program could not be started.
    #[error("could not start {program:?}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        error: String,
    },
    /// Any other failure of the backend, with what it said.
    #[error("{what}: {error}")]
    Backend {
        /// What was being done.
        what: &'static str,
        /// What went wrong.
        error: String,
    },
    /// The keeper refused the work (closed, a limit).
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
            OpError::Timeout { .. } => "timeout",
            OpError::InvalidPath { .. } => "invalid-path",
            OpError::Escapes { .. } => "escapes",
            OpError::NotFound { .. } => "not-found",
            OpError::TooLarge { .. } => "too-large",
            OpError::EmptyArgv => "empty-argv",
            OpError::InvalidEnv { .. } => "invalid-env",
            OpError::Spawn { .. } => "spawn",
            OpError::Backend { .. } => "backend",
            OpError::Keeper(_) => "keeper",
        }
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
/// ([`OpError::SandboxGone`]). A dropped future stops its work (a command is killed with
/// everything it started).
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

    /// Whether something exists at the path (a symlink leading outside is an error, not a
    /// `false`).
    fn exists(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
    ) -> impl Future<Output = Result<bool, OpError>> + Send;
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
