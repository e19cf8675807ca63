//! The application's own work in the fault world ([`SandboxOps`] for [`FaultBackend`]): a
//! workspace of bytes per sandbox, commands from a tiny fixed repertoire, and the seeded
//! faults of such work — latency, hangs (only a timeout ends them) and the sandbox dying while
//! the work runs. Work that would change a sandbox that is not up is refused and, had it
//! landed, recorded as a violation: the keeper must never send it there.
//!
//! Commands: `echo ARGS...` (its arguments, one space apart, and a newline), `cat PATH`
//! (a workspace file), `write PATH TEXT` (writes a workspace file), `fail CODE` (exits with
//! CODE), `sleep` (hangs until its timeout); any other program is not found.

use std::time::Duration;

use sandkeeper::SandboxId;

use super::{FaultBackend, Phase};
use crate::ops::{
    Entry, EntryKind, EntryMeta, ExecOutput, ExecRequest, OpError, SandboxOps, WorkPath,
};

/// The default timeout of an exec.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// How a piece of work ends, drawn before it runs.
enum Fate {
    Answers(Duration),
    Hangs,
    KillsItsSandbox(Duration),
}

impl FaultBackend {
    /// Draws the fate of one piece of work.
    fn fate(&self) -> Fate {
        self.draw(|r| {
            let latency = r.between(self.config.work_latency.0, self.config.work_latency.1);
            if r.chance(self.config.work_hang) {
                Fate::Hangs
            } else if r.chance(self.config.work_death) {
                Fate::KillsItsSandbox(latency)
            } else {
                Fate::Answers(latency)
            }
        })
    }

    /// The sandbox's state for work: up, or the error that says why not.
    fn up(&self, sandbox: SandboxId) -> Result<(), OpError> {
        match self.world().boxes.get(&sandbox).map(|b| b.phase) {
            Some(Phase::Up) => Ok(()),
            Some(Phase::Dead) | None | Some(Phase::ShutDown) => Err(OpError::SandboxGone {
                sandbox,
                why: "not up in the fault world".into(),
            }),
            Some(_) => Err(OpError::Stopped { sandbox }),
        }
    }

    /// Runs `f` on the sandbox's workspace after the drawn latency, unless the work hangs
    /// (until `timeout`) or the sandbox dies meanwhile. `changes`: whether `f` changes the
    /// workspace (a violation if the sandbox is not up then).
    async fn work<T>(
        &self,
        sandbox: SandboxId,
        timeout: Option<Duration>,
        changes: bool,
        f: impl FnOnce(&mut std::collections::BTreeMap<String, Vec<u8>>) -> Result<T, OpError>,
    ) -> Result<T, OpError> {
        self.up(sandbox)?;
        match self.fate() {
            Fate::Hangs => {
                let after = timeout.unwrap_or(EXEC_TIMEOUT);
                tokio::time::sleep(after).await;
                return Err(OpError::Timeout { after });
            }
            Fate::KillsItsSandbox(latency) => {
                tokio::time::sleep(latency).await;
                self.die(sandbox);
            }
            Fate::Answers(latency) => tokio::time::sleep(latency).await,
        }
        let mut world = self.world();
        let Some(b) = world.boxes.get_mut(&sandbox) else {
            return Err(OpError::SandboxGone {
                sandbox,
                why: "no such sandbox".into(),
            });
        };
        match b.phase {
            Phase::Up => {
                let r = f(&mut b.work);
                world.work_done += 1;
                r
            }
            Phase::Dead | Phase::ShutDown => Err(OpError::SandboxGone {
                sandbox,
                why: "died while the work ran".into(),
            }),
            phase => {
                if changes {
                    world.work_refused += 1;
                }
                tracing::debug!(%sandbox, ?phase, "work in a stopped sandbox refused");
                Err(OpError::Stopped { sandbox })
            }
        }
    }
}

fn not_found(path: &str) -> OpError {
    OpError::NotFound {
        path: path.to_string(),
    }
}

/// Whether `file` is `dir` or under it.
fn under(file: &str, dir: &WorkPath) -> bool {
    dir.is_root() || file == dir.as_str() || file.starts_with(&format!("{dir}/"))
}

impl SandboxOps for FaultBackend {
    async fn exec(&self, sandbox: SandboxId, request: ExecRequest) -> Result<ExecOutput, OpError> {
        request.check()?;
        let ExecRequest { argv, options } = request;
        let (program, args) = argv.split_first().expect("checked: not empty");
        if program == "sleep" {
            self.up(sandbox)?;
            let after = options.timeout.unwrap_or(EXEC_TIMEOUT);
            tokio::time::sleep(after).await;
            return Err(OpError::Timeout { after });
        }
        let cap = options.output_cap;
        let changes = program == "write";
        self.work(sandbox, options.timeout, changes, |ws| {
            let (code, stdout) = match (program.as_str(), args) {
                ("echo", args) => (0, format!("{}\n", args.join(" ")).into_bytes()),
                ("cat", [path]) => match ws.get(path) {
                    Some(b) => (0, b.clone()),
                    None => (1, Vec::new()),
                },
                ("write", [path, text]) => {
                    ws.insert(path.clone(), text.clone().into_bytes());
                    (0, Vec::new())
                }
                ("fail", [code]) => (code.parse().unwrap_or(1), Vec::new()),
                _ => {
                    return Err(OpError::Spawn {
                        program: program.clone(),
                        error: "not in the fault world's repertoire".into(),
                    })
                }
            };
            let truncated = stdout.len() > cap;
            Ok(ExecOutput {
                code: Some(code),
                stdout: stdout.into_iter().take(cap).collect(),
                stderr: Vec::new(),
                truncated,
            })
        })
        .await
    }

    async fn write(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        bytes: Vec<u8>,
    ) -> Result<(), OpError> {
        path.writable()?;
        self.work(sandbox, None, true, |ws| {
            ws.insert(path.to_string(), bytes);
            Ok(())
        })
        .await
    }

    async fn read(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        cap: usize,
    ) -> Result<Vec<u8>, OpError> {
        self.work(sandbox, None, false, |ws| {
            let bytes = ws
                .get(path.as_str())
                .ok_or_else(|| not_found(path.as_str()))?;
            if bytes.len() > cap {
                return Err(OpError::TooLarge {
                    path: path.to_string(),
                    cap,
                });
            }
            Ok(bytes.clone())
        })
        .await
    }

    async fn list(&self, sandbox: SandboxId, dir: WorkPath) -> Result<Vec<Entry>, OpError> {
        self.work(sandbox, None, false, |ws| {
            let prefix = if dir.is_root() {
                String::new()
            } else {
                format!("{dir}/")
            };
            let mut out: Vec<Entry> = Vec::new();
            for (file, bytes) in ws.iter().filter(|(f, _)| f.starts_with(&prefix)) {
                let rest = &file[prefix.len()..];
                let entry = match rest.split_once('/') {
                    Some((d, _)) => Entry {
                        name: d.to_string(),
                        kind: EntryKind::Dir,
                        size: 0,
                        // The double keeps bytes only: no modes, times or owners.
                        meta: EntryMeta::default(),
                    },
                    None => Entry {
                        name: rest.to_string(),
                        kind: EntryKind::File,
                        size: bytes.len() as u64,
                        meta: EntryMeta::default(),
                    },
                };
                if !out.contains(&entry) {
                    out.push(entry);
                }
            }
            if out.is_empty() && !dir.is_root() {
                return Err(not_found(dir.as_str()));
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    async fn remove(&self, sandbox: SandboxId, path: WorkPath) -> Result<(), OpError> {
        path.writable()?;
        self.work(sandbox, None, true, |ws| {
            let before = ws.len();
            ws.retain(|f, _| !under(f, &path));
            if ws.len() == before {
                return Err(not_found(path.as_str()));
            }
            Ok(())
        })
        .await
    }

    async fn exists(&self, sandbox: SandboxId, path: WorkPath) -> Result<bool, OpError> {
        self.work(sandbox, None, false, |ws| {
            Ok(ws.keys().any(|f| under(f, &path)))
        })
        .await
    }
}
