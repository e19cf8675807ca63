//! The keeper's side of a sandbox's init (one bubblewrap per sandbox, `sandkeeper-init` its
//! PID 1; `src/bin/sandkeeper-init.rs`): starting it, the one task that owns its pipes, and
//! handing each reply to the exec waiting for it.
//!
//! A [`SandboxInit`] is made at the sandbox's first command and kept in the sandbox. Its task
//! writes the execs' requests to the init's standard input and reads the init's replies from
//! its standard output, each to the exec of its id. The task ends — killing the bubblewrap,
//! whose death (`--die-with-parent`) takes the init and with it the whole PID namespace, then
//! ending the sandbox's cgroup — when the sandbox stops, when the init ends or writes a frame
//! that does not decode, when every handle is gone, or when the sandbox's watch, which runs on
//! the same task (`limit_watch.rs`: its CPU time, its workspace's size), finds a limit passed.
//! Execs waiting then get their channel closed and [`SandboxInit::why`] (or the limit's error);
//! the next exec of the sandbox starts a fresh init.
//!
//! [`run_blocking`] runs one command through a fresh init without a runtime: the probe at start
//! (`isolation.rs`).

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::isolation::Prepared;
use super::limit_watch::{self, Nudge, Overrun, Watch, Watched};
use super::limits::CommandCgroup;
use super::wire::{self, Exit, Reply, Request, Spawn};

/// The most of the init's own standard error kept, to say why it ended.
const STDERR_KEPT: usize = 4096;

/// How long the task waits for the bubblewrap to be reaped and its standard error to close
/// after killing it.
const END_WAIT: Duration = Duration::from_secs(2);

/// A running sandbox init: where execs send requests and receive their replies.
pub(crate) struct SandboxInit {
    requests: mpsc::UnboundedSender<Vec<u8>>,
    waiters: Arc<Mutex<Waiters>>,
    next: AtomicU64,
    /// Nudges to the sandbox's watch (`limit_watch.rs`), which runs on the task.
    nudges: mpsc::UnboundedSender<Nudge>,
    /// Commands running now (registered and not yet forgotten), for the watch.
    commands: Arc<AtomicUsize>,
    /// Whether the watch looks at the sandbox's CPU (else nothing asks it).
    cpu_watched: bool,
}

/// The execs waiting for replies, by id; closed (with why) once the init ended.
#[derive(Default)]
struct Waiters {
    by_id: HashMap<u64, mpsc::UnboundedSender<Reply>>,
    ended: Option<String>,
    /// The limit the keeper ended the init for, if it did.
    overrun: Option<Overrun>,
}

fn lock(w: &Mutex<Waiters>) -> MutexGuard<'_, Waiters> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

impl SandboxInit {
    /// Starts the task that spawns `prepared` (the sandbox's bubblewrap and init,
    /// `Isolated::init_command`) and owns it, ending it when `stopped` turns `true` or when its
    /// watch of `watched` finds a limit passed (`limit_watch.rs`). Requests sent meanwhile wait in
    /// the channel; a spawn that fails ends the init with its error.
    ///
    /// The spawn happens on the task, a thread of the runtime, not the caller's: bubblewrap's
    /// parent-death signal (`--die-with-parent`) follows the *thread* that spawned it, and a
    /// sandbox's init must live as long as the runtime, not as an exec's caller's thread.
    pub(crate) fn start(
        prepared: Prepared,
        stopped: Stopped,
        watched: Watched,
    ) -> Arc<SandboxInit> {
        let (requests, rx) = mpsc::unbounded_channel();
        let (nudges, nudged) = mpsc::unbounded_channel();
        let init = Arc::new(SandboxInit {
            requests,
            waiters: Arc::default(),
            next: AtomicU64::new(1),
            nudges,
            commands: Arc::default(),
            cpu_watched: watched.cpu_budget.is_some(),
        });
        let commands = init.commands.clone();
        let waiters = init.waiters.clone();
        tokio::spawn(async move {
            let Prepared {
                command,
                fds,
                cgroup,
                ..
            } = prepared;
            match spawn(command) {
                Ok((child, pipes)) => {
                    // The filter's pipe is the spawned process's now.
                    drop(fds);
                    let cpu_usage = cgroup.as_ref().and_then(CommandCgroup::cpu_usage_file);
                    let watch = Watch::new(watched, commands, cpu_usage, child.id());
                    let ends = Ends {
                        stopped,
                        watch: Arc::new(watch),
                        nudged,
                    };
                    own(child, pipes, rx, waiters, ends, cgroup).await;
                }
                Err(e) => {
                    drop(fds);
                    end(&waiters, format!("it did not start: {e}"), None);
                    if let Some(cgroup) = cgroup {
                        cgroup.end().await;
                    }
                }
            }
        });
        init
    }

    /// Whether the init still runs (as far as its task knows).
    pub(crate) fn is_running(&self) -> bool {
        lock(&self.waiters).ended.is_none()
    }

    /// Why the init ended (empty while it runs).
    pub(crate) fn why(&self) -> String {
        lock(&self.waiters).ended.clone().unwrap_or_default()
    }

    /// The limit the keeper ended the init for, if it did.
    pub(crate) fn overrun(&self) -> Option<Overrun> {
        lock(&self.waiters).overrun
    }

    /// Asks the sandbox's watch for its CPU now (at a command's end): the spent budget, if it
    /// is, the init then ending. `None` also when the init ended already.
    pub(crate) async fn cpu_spent(&self) -> Option<Overrun> {
        if !self.cpu_watched {
            return None;
        }
        let (ask, answer) = tokio::sync::oneshot::channel();
        self.nudges.send(Nudge::Cpu(ask)).ok()?;
        answer.await.ok().flatten()
    }

    /// A new command id and the channel its replies come on; why not when the init ended.
    pub(crate) fn register(&self) -> Result<(u64, mpsc::UnboundedReceiver<Reply>), String> {
        let mut w = lock(&self.waiters);
        if let Some(why) = &w.ended {
            return Err(why.clone());
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        w.by_id.insert(id, tx);
        // Counted before the watch is woken: it sees the sandbox busy from now on.
        self.commands.fetch_add(1, Ordering::SeqCst);
        let _ = self.nudges.send(Nudge::Wake);
        Ok((id, rx))
    }

    /// Sends `request` about `id` (nothing when the init ended: its waiters hear so).
    pub(crate) fn send(&self, id: u64, request: &Request) -> Result<(), wire::WireError> {
        let frame = wire::encode_request(id, request)?;
        let _ = self.requests.send(frame);
        Ok(())
    }

    /// Stops waiting for `id`'s replies (those still coming are dropped); the command (once
    /// registered, forgotten once) no longer counts as running, and the watch looks whether it
    /// left processes behind.
    pub(crate) fn forget(&self, id: u64) {
        lock(&self.waiters).by_id.remove(&id);
        let _ = self
            .commands
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        let _ = self.nudges.send(Nudge::Wake);
    }
}

/// The init's standard input, output and error.
type Pipes = (
    tokio::process::ChildStdin,
    tokio::process::ChildStdout,
    tokio::process::ChildStderr,
);

/// Spawns the sandbox's bubblewrap, its standard streams piped.
fn spawn(command: std::process::Command) -> io::Result<(tokio::process::Child, Pipes)> {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let missing = || io::Error::other("a standard stream was not piped");
    let pipes = (
        child.stdin.take().ok_or_else(missing)?,
        child.stdout.take().ok_or_else(missing)?,
        child.stderr.take().ok_or_else(missing)?,
    );
    Ok((child, pipes))
}

/// Marks the init ended (`why`, for the limit `overrun` if the keeper ended it for one): every
/// waiting exec's channel closes, and they answer with it.
fn end(waiters: &Mutex<Waiters>, why: String, overrun: Option<Overrun>) {
    let mut w = lock(waiters);
    w.ended = Some(format!("the sandbox's init: {why}"));
    w.overrun = overrun;
    w.by_id.clear();
}

/// When the sandbox stops.
type Stopped = tokio::sync::watch::Receiver<bool>;

/// What else ends an init than its pipes: the sandbox stopping, its watch finding a limit
/// passed (asked by execs meanwhile).
struct Ends {
    stopped: Stopped,
    watch: Arc<Watch>,
    nudged: mpsc::UnboundedReceiver<Nudge>,
}

/// The task that owns the init: writes requests, dispatches replies, and ends it (see the
/// module docs).
async fn own(
    mut child: tokio::process::Child,
    (mut stdin, stdout, stderr): Pipes,
    mut requests: mpsc::UnboundedReceiver<Vec<u8>>,
    waiters: Arc<Mutex<Waiters>>,
    ends: Ends,
    cgroup: Option<CommandCgroup>,
) {
    let Ends {
        mut stopped,
        watch,
        nudged,
    } = ends;
    let errors = tokio::spawn(kept(stderr));
    let write = async {
        while let Some(frame) = requests.recv().await {
            if let Err(e) = stdin.write_all(&frame).await {
                return format!("its standard input failed: {e}");
            }
        }
        "no handle left".to_string()
    };
    let read = async {
        let mut stdout = tokio::io::BufReader::new(stdout);
        loop {
            let body = match read_frame(&mut stdout).await {
                Ok(Some(body)) => body,
                Ok(None) => return "it ended".to_string(),
                Err(e) => return format!("its standard output failed: {e}"),
            };
            match wire::decode_reply(&body) {
                Ok((id, reply)) => dispatch(&waiters, id, reply),
                Err(e) => return format!("it wrote a bad frame: {e}"),
            }
        }
    };
    let (why, overrun) = tokio::select! {
        why = write => (why, None),
        why = read => (why, None),
        _ = stopped.wait_for(|s| *s) => ("the sandbox stopped".to_string(), None),
        overrun = limit_watch::run(watch.clone(), nudged) => (overrun.to_string(), Some(overrun)),
    };
    let _ = child.start_kill();
    let _ = tokio::time::timeout(END_WAIT, child.wait()).await;
    if let Some(cgroup) = &cgroup {
        // Nothing of the sandbox runs on: its CPU time is final, kept for its next init.
        cgroup.kill_all();
        let watch = watch.clone();
        let _ = tokio::task::spawn_blocking(move || watch.ended()).await;
    }
    let said = match tokio::time::timeout(END_WAIT, errors).await {
        Ok(Ok(said)) if !said.is_empty() => format!(" ({})", String::from_utf8_lossy(&said).trim()),
        _ => String::new(),
    };
    end(&waiters, format!("{why}{said}"), overrun);
    tracing::debug!(%why, "a sandbox init ended");
    if let Some(cgroup) = cgroup {
        cgroup.end().await;
    }
}

/// Hands `reply` to the exec waiting for `id` (none: it was dropped, or timed out).
fn dispatch(waiters: &Mutex<Waiters>, id: u64, reply: Reply) {
    let mut w = lock(waiters);
    let last = matches!(reply, Reply::Exit(_) | Reply::Failed(_));
    if let Some(tx) = w.by_id.get(&id) {
        let _ = tx.send(reply);
    }
    if last {
        w.by_id.remove(&id);
    }
}

/// Reads `r` to its end, keeping its first [`STDERR_KEPT`] bytes.
async fn kept(mut r: impl AsyncRead + Unpin) -> Vec<u8> {
    let (mut out, mut buf) = (Vec::new(), [0u8; 1024]);
    while let Ok(n @ 1..) = r.read(&mut buf).await {
        let room = STDERR_KEPT.saturating_sub(out.len());
        out.extend_from_slice(&buf[..n.min(room)]);
    }
    out
}

/// One frame's body from `r` (`wire::read_frame`, async); `None` at a clean end.
async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Vec<u8>>> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut head[1..]).await?;
    let n = wire::frame_len(head, wire::MAX_REPLY)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0; n];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Runs `spawn` through a fresh init started from `prepared`, blocking, and ends the init: how
/// it ended, its standard output and its standard error (for the probe at start).
pub(crate) fn run_blocking(
    prepared: Prepared,
    spawn: Spawn,
) -> io::Result<(Exit, Vec<u8>, Vec<u8>)> {
    let Prepared {
        mut command,
        fds,
        cgroup,
        ..
    } = prepared;
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let spawned = command.spawn();
    drop(fds);
    let ran = spawned.and_then(|mut child| {
        let ran = exchange(&mut child, spawn);
        let _ = child.kill();
        let _ = child.wait();
        ran.map_err(|e| {
            let mut said = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = io::Read::read_to_string(&mut err, &mut said);
            }
            io::Error::new(e.kind(), format!("{e} {}", said.trim()))
        })
    });
    if let Some(cgroup) = cgroup {
        cgroup.end_now();
    }
    ran
}

/// Sends `spawn` as command 1 to `child`'s init and reads its replies to its exit.
fn exchange(child: &mut std::process::Child, spawn: Spawn) -> io::Result<(Exit, Vec<u8>, Vec<u8>)> {
    let invalid = |e: wire::WireError| io::Error::new(io::ErrorKind::InvalidData, e);
    let frame = wire::encode_request(1, &Request::Spawn(spawn)).map_err(invalid)?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin"))?;
    stdin.write_all(&frame)?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let Some(body) = wire::read_frame(&mut stdout, wire::MAX_REPLY)? else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the init ended",
            ));
        };
        match wire::decode_reply(&body).map_err(invalid)? {
            (1, Reply::Stdout(b)) => out.extend_from_slice(&b),
            (1, Reply::Stderr(b)) => err.extend_from_slice(&b),
            (1, Reply::Exit(exit)) => return Ok((exit, out, err)),
            (1, Reply::Failed(why)) => return Err(io::Error::other(why)),
            _ => {}
        }
    }
}
