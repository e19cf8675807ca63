//! Running real processes in a local sandbox: argv only (never a shell string), in the
//! sandbox's directory, with a timeout, stopped when the sandbox stops.

use std::ffi::OsStr;
use std::time::Duration;

use sandkeeper::SandboxId;

use super::LocalBackend;

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
    /// reaches the program as one argument, whatever it contains. Killed after `timeout` (or
    /// [`LocalConfig::run_timeout`](super::LocalConfig::run_timeout) when `None`), or when the
    /// sandbox stops; killed too if the returned future is dropped.
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
        let (program, args) = argv.split_first().ok_or(RunError::EmptyArgv)?;
        let timeout = timeout.unwrap_or(self.config.run_timeout);
        #[cfg(loom)]
        {
            // tokio leaves out its process module under `--cfg loom`; loom builds only check
            // the shared-state layer and never run processes.
            let _ = (args, timeout, &s);
            Err(RunError::Spawn {
                program: program.as_ref().to_string_lossy().into_owned(),
                error: std::io::Error::other("no processes in a --cfg loom build"),
            })
        }
        #[cfg(not(loom))]
        {
            let mut stopped = s.stopped.subscribe();
            let child = tokio::process::Command::new(program)
                .args(args)
                .current_dir(&s.dir)
                .env("SANDKEEPER_SANDBOX", sandbox.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|error| RunError::Spawn {
                    program: program.as_ref().to_string_lossy().into_owned(),
                    error,
                })?;
            tracing::debug!(sandbox = %sandbox, program = ?program.as_ref(), "run");
            // Dropping the output future drops the child, which kills it (kill_on_drop).
            tokio::select! {
                output = child.wait_with_output() => {
                    let output = output.map_err(|error| RunError::Spawn {
                        program: program.as_ref().to_string_lossy().into_owned(),
                        error,
                    })?;
                    Ok(RunOutput {
                        code: output.status.code(),
                        stdout: output.stdout,
                        stderr: output.stderr,
                    })
                }
                () = tokio::time::sleep(timeout) => Err(RunError::Timeout(timeout)),
                _ = stopped.wait_for(|stopped| *stopped) => Err(RunError::Stopped(sandbox)),
            }
        }
    }
}
