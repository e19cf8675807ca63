//! One exec through its sandbox's init (one bubblewrap per sandbox): the request goes over
//! the init's pipe (argv, the whole environment, working directory, standard input — none of
//! it on any command line), its output comes back in pieces, capped and streamed as an exec's
//! always is, and the command is killed — its process group, by the init — when it times out,
//! when the sandbox stops, or when the caller drops the exec. It answers what the
//! per-command path (`ops.rs`) answers, and an [`OpError::Backend`] (`what: "sandbox init"`,
//! retryable: the next exec starts a fresh init) when the init ended under it — or, when the
//! keeper ended it for a limit over time (`limit_watch.rs`), that limit's error
//! ([`OpError::QuotaExceeded`], [`OpError::CpuBudgetSpent`]). At its command's end an exec asks
//! the sandbox's watch for its CPU time, and answers `CpuBudgetSpent` if the budget is spent.
//! The command runs under `prlimit --cpu=N` where `RLIMIT_CPU` is set per command
//! (`limits.rs`).
//!
//! A command whose standard input stays open ([`InitExec::input`]) gets its input in pieces of
//! at most [`wire::MAX_INPUT`] bytes, no more than [`INPUT_WINDOW`] of them ahead of what the
//! init says it wrote ([`Reply::Taken`]): the caller's channel waits meanwhile, so a command that
//! does not read holds its caller back, not the keeper's memory or the init's.

use std::sync::Arc;
use std::time::Duration;

use sandkeeper::SandboxId;

use super::sandbox_init::SandboxInit;
use super::wire::{self, Exit, Reply, Request, Spawn};
use super::LocalSandbox;
use crate::ops::{Chunk, ExecOutput, Input, OpError};

/// How long an exec that timed out waits for the init to say its group is dead.
const REAP: Duration = Duration::from_secs(5);

/// How much of a streamed command's output may be on its way (in the init, the pipe and the
/// keeper's channels) before its reader takes it: past it, the command blocks on its output,
/// as on a pipe, instead of the keeper's memory growing. An exec that is not streamed takes
/// every piece at once, and runs without a window.
const WINDOW: u64 = 1 << 20;

/// How many bytes of a command's standard input may be on their way to it (in the keeper's
/// pipe to the init and the init's queue for the command) before the init said it wrote them.
const INPUT_WINDOW: u64 = 256 << 10;

/// What an exec asks of its sandbox's init.
pub(crate) struct InitExec {
    /// The program asked for (the argv may start with `prlimit`'s).
    pub(crate) program: String,
    /// The command, as the init runs it.
    pub(crate) spawn: Spawn,
    /// The most bytes kept of each output.
    pub(crate) cap: usize,
    /// How long it may run.
    pub(crate) timeout: Duration,
    /// Where its output goes as it comes, when streamed.
    pub(crate) chunks: Option<tokio::sync::mpsc::Sender<Chunk>>,
    /// Where more of its standard input comes from while it runs, when it stays open (the
    /// spawn is then asked with [`Spawn::input`]).
    pub(crate) input: Option<tokio::sync::mpsc::Receiver<Input>>,
}

/// The caller's input to a command on its way to the init, within [`INPUT_WINDOW`].
struct Feed {
    from: tokio::sync::mpsc::Receiver<Input>,
    /// The piece taken from the caller and not yet all sent, and how much of it was sent.
    pending: Vec<u8>,
    sent: usize,
    /// Bytes sent and not yet answered by [`Reply::Taken`].
    in_flight: u64,
    /// The caller closed the input (or dropped its sender): [`Request::CloseInput`] follows
    /// the pending piece.
    closing: bool,
    /// `CloseInput` was sent: what the caller sends now is dropped.
    closed: bool,
}

impl Feed {
    /// Whether it takes the caller's next piece now (its last is all sent, within the window;
    /// after the close always, to drop it).
    fn wants(&self) -> bool {
        self.closed || (!self.closing && self.sent == self.pending.len() && self.has_room())
    }

    fn has_room(&self) -> bool {
        self.in_flight < INPUT_WINDOW
    }

    /// Takes what the caller sent (`None`: its sender is gone).
    fn took(&mut self, got: Option<Input>) {
        if self.closed {
            return;
        }
        match got {
            Some(Input::Stdin(bytes)) => {
                self.pending = bytes;
                self.sent = 0;
            }
            Some(Input::Close) | None => self.closing = true,
        }
    }

    /// Sends what it may of the pending piece, then the close once all is sent.
    fn pump(&mut self, init: &SandboxInit, id: u64) {
        while self.sent < self.pending.len() && self.has_room() {
            let end = self.pending.len().min(self.sent + wire::MAX_INPUT);
            let piece = self.pending[self.sent..end].to_vec();
            self.in_flight += piece.len() as u64;
            self.sent = end;
            let _ = init.send(id, &Request::Input(piece));
        }
        if self.sent == self.pending.len() {
            self.pending = Vec::new();
            self.sent = 0;
            if self.closing && !self.closed {
                self.closed = true;
                let _ = init.send(id, &Request::CloseInput);
            }
        }
    }

    /// The init wrote (or dropped) `n` bytes.
    fn taken(&mut self, n: u64, init: &SandboxInit, id: u64) {
        self.in_flight = self.in_flight.saturating_sub(n);
        self.pump(init, id);
    }
}

/// The caller's next piece, when `feed` wants one; else never.
async fn next_input(feed: &mut Option<Feed>) -> Option<Input> {
    match feed {
        Some(f) if f.wants() => f.from.recv().await,
        _ => std::future::pending().await,
    }
}

/// Kills the command (its group, by the init) when dropped before it ended: an exec that times
/// out, stops, or whose caller drops it.
struct Running<'a> {
    init: &'a SandboxInit,
    id: u64,
    ended: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.init.send(self.id, &Request::Kill);
        }
        self.init.forget(self.id);
    }
}

/// Output kept up to a cap, and whether any was cut.
struct Kept {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: usize,
    cut: bool,
}

impl Kept {
    fn keep(&mut self, bytes: &[u8], err: bool) {
        let cap = self.cap;
        let out = if err {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        let room = cap.saturating_sub(out.len());
        self.cut |= bytes.len() > room;
        out.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// The error of an exec whose init ended under it.
fn init_ended(why: String) -> OpError {
    OpError::Backend {
        what: "sandbox init",
        error: why,
    }
}

/// Runs `exec` in sandbox `s` through `init` (see the module docs).
pub(crate) async fn run(
    s: &LocalSandbox,
    sandbox: SandboxId,
    init: Arc<SandboxInit>,
    exec: InitExec,
) -> Result<ExecOutput, OpError> {
    let InitExec {
        program,
        spawn,
        cap,
        timeout,
        chunks,
        input,
    } = exec;
    if spawn.argv.is_empty() {
        return Err(OpError::EmptyArgv);
    }
    let spawn = Spawn {
        window: if chunks.is_some() { WINDOW } else { 0 },
        input: input.is_some(),
        ..spawn
    };
    let mut feed = input.map(|from| Feed {
        from,
        pending: Vec::new(),
        sent: 0,
        in_flight: 0,
        closing: false,
        closed: false,
    });
    let mut stopped = s.stopped.subscribe();
    let stopped_now = *stopped.borrow();
    if stopped_now {
        return Err(OpError::Stopped { sandbox });
    }
    let (id, mut replies) = init.register().map_err(init_ended)?;
    let mut running = Running {
        init: &init,
        id,
        ended: false,
    };
    init.send(id, &Request::Spawn(spawn))
        .map_err(|e| OpError::Spawn {
            program: program.clone(),
            error: e.to_string(),
        })?;
    tracing::debug!(sandbox = %sandbox, program = %program, "exec (through the sandbox's init)");
    let mut kept = Kept {
        stdout: Vec::new(),
        stderr: Vec::new(),
        cap,
        cut: false,
    };
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let ended: Result<Exit, OpError> = loop {
        tokio::select! {
            reply = replies.recv() => match reply {
                Some(Reply::Stdout(b)) => output(&mut kept, (&init, id), &chunks, b, false).await,
                Some(Reply::Stderr(b)) => output(&mut kept, (&init, id), &chunks, b, true).await,
                Some(Reply::Exit(exit)) => break Ok(exit),
                Some(Reply::Failed(error)) => break Err(OpError::Spawn { program, error }),
                Some(Reply::Taken(n)) => {
                    if let Some(f) = feed.as_mut() {
                        f.taken(n, &init, id);
                    }
                }
                None => break Err(match init.overrun() {
                    Some(overrun) => overrun.error(),
                    None => init_ended(init.why()),
                }),
            },
            got = next_input(&mut feed) => {
                if let Some(f) = feed.as_mut() {
                    f.took(got);
                    f.pump(&init, id);
                }
            }
            () = &mut deadline => break Err(OpError::Timeout { after: timeout }),
            () = stopping(&mut stopped) => break Err(OpError::Stopped { sandbox }),
        }
    };
    let was_stopped = *stopped.borrow();
    let exit = match ended {
        Ok(exit) => exit,
        // The init ends when the sandbox stops: that is the answer then.
        Err(OpError::Backend { .. }) if was_stopped => return Err(OpError::Stopped { sandbox }),
        Err(OpError::Timeout { after }) => {
            // Everything it started goes with it before the exec answers, as on every path.
            let _ = init.send(id, &Request::Kill);
            let _ = tokio::time::timeout(REAP, async {
                while let Some(reply) = replies.recv().await {
                    if matches!(reply, Reply::Exit(_) | Reply::Failed(_)) {
                        return;
                    }
                }
            })
            .await;
            running.ended = true;
            return Err(OpError::Timeout { after });
        }
        Err(e) => return Err(e),
    };
    running.ended = true;
    // Its CPU, at its end: a command that spent the sandbox's budget answers so.
    if let Some(overrun) = init.cpu_spent().await {
        return Err(overrun.error());
    }
    if exit.escaped {
        return Err(OpError::Backend {
            what: "exec",
            error: "its output stayed open after it ended: a process left its group (it lives \
                    on in the sandbox until the sandbox stops)"
                .into(),
        });
    }
    if !s.dir.exists() {
        return Err(OpError::SandboxGone {
            sandbox,
            why: format!("{} is gone", s.dir.display()),
        });
    }
    Ok(ExecOutput {
        code: exit.code,
        stdout: kept.stdout,
        stderr: kept.stderr,
        truncated: kept.cut,
    })
}

/// Keeps a piece of output and streams it, when streamed; then gives the init (`init`, about
/// command `id`) as much credit as the reader took.
async fn output(
    kept: &mut Kept,
    (init, id): (&SandboxInit, u64),
    chunks: &Option<tokio::sync::mpsc::Sender<Chunk>>,
    bytes: Vec<u8>,
    err: bool,
) {
    kept.keep(&bytes, err);
    if let Some(tx) = chunks {
        let n = bytes.len() as u64;
        let chunk = if err {
            Chunk::Stderr(bytes)
        } else {
            Chunk::Stdout(bytes)
        };
        let _ = tx.send(chunk).await;
        let _ = init.send(id, &Request::Credit(n));
    }
}

/// Waits until the sandbox stops (a value, not a guard: the exec's future stays `Send`).
async fn stopping(stopped: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}
