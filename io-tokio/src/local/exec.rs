//! Running real processes in a local sandbox: argv only (never a shell string), in the
//! sandbox's directory, with a timeout, stopped when the sandbox stops. The same path as the
//! operations' exec (`ops.rs`): the same isolation, limits and clean environment.

use std::ffi::OsStr;
use std::time::Duration;

use sandkeeper::SandboxId;

use super::LocalBackend;
use crate::ops::{ExecOptions, ExecRequest, OpError};

/// What a finished process left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutput {
    /// Its exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// What it wrote to standard output.
    pub stdout: Vec<u8>,
    /// What it wrote to standard error.
    pub stderr: Vec<u8>,
}

/// Why a process did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The backend runs no such sandbox (never started, stopped or shut down).
    #[error("sandbox {0} is not running")]
    NoSandbox(SandboxId),
    /// The argv was empty.
    #[error("empty argv")]
    EmptyArgv,
    /// The program could not be started.
    #[error("could not start {program:?}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        error: std::io::Error,
    },
    /// It ran longer than its timeout and was killed.
    #[error("killed after {0:?}")]
    Timeout(Duration),
    /// The sandbox stopped while it ran; it was killed.
    #[error("sandbox {0} stopped while the process ran")]
    Stopped(SandboxId),
}

impl LocalBackend {
    /// Runs `argv[0]` with the arguments `argv[1..]` in the sandbox's directory, with standard
    /// input closed, and returns its exit code and output. No shell is involved: every element
    /// reaches the program as one argument, whatever it contains. It runs exactly as an exec
    /// of [`SandboxOps`](crate::SandboxOps) does: under the backend's isolation and limits,
    /// with a cleared environment (`PATH`, `HOME`, `PWD`, `LANG`, `SANDKEEPER_SANDBOX`; never
    /// the host's), and its output is not capped. Killed, with everything it started, after
    /// `timeout` (or [`LocalConfig::run_timeout`](super::LocalConfig::run_timeout) when
    /// `None`), or when the sandbox stops; killed too if the returned future is dropped.
    /// Arguments must be UTF-8 (a [`RunError::Spawn`] otherwise).
    pub async fn run<S: AsRef<OsStr>>(
        &self,
        sandbox: SandboxId,
        argv: &[S],
        timeout: Option<Duration>,
    ) -> Result<RunOutput, RunError> {
        let Some(s) = self.get(sandbox) else {
            return Err(RunError::NoSandbox(sandbox));
        };
        if *s.gate.read().unwrap_or_else(|p| p.into_inner()) {
            return Err(RunError::NoSandbox(sandbox));
        }
        let program = argv
            .first()
            .ok_or(RunError::EmptyArgv)?
            .as_ref()
            .to_string_lossy()
            .into_owned();
        let spawn = |error: std::io::Error| RunError::Spawn {
            program: program.clone(),
            error,
        };
        let argv = argv
            .iter()
            .map(|a| {
                a.as_ref().to_str().map(str::to_owned).ok_or_else(|| {
                    spawn(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "an argument is not UTF-8",
                    ))
                })
            })
            .collect::<Result<Vec<String>, RunError>>()?;
        let request = ExecRequest {
            argv,
            options: ExecOptions {
                timeout: Some(timeout.unwrap_or(self.config.run_timeout)),
                output_cap: usize::MAX,
                ..ExecOptions::default()
            },
        };
        tracing::debug!(sandbox = %sandbox, program = %program, "run");
        match self.exec_with(sandbox, request, None, None).await {
            Ok(out) => Ok(RunOutput {
                code: out.code,
                stdout: out.stdout,
                stderr: out.stderr,
            }),
            Err(OpError::EmptyArgv) => Err(RunError::EmptyArgv),
            Err(OpError::Timeout { after }) => Err(RunError::Timeout(after)),
            Err(OpError::Stopped { .. }) => Err(RunError::Stopped(sandbox)),
            Err(OpError::SandboxGone { .. }) | Err(OpError::NoActiveSandbox { .. }) => {
                Err(RunError::NoSandbox(sandbox))
            }
            Err(OpError::Spawn { error, .. }) => Err(spawn(std::io::Error::other(error))),
            Err(e) => Err(spawn(std::io::Error::other(e.to_string()))),
        }
    }
}
