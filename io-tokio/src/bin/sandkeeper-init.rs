//! `sandkeeper-init`: the first process of a local sandbox's namespaces (its PID 1), which runs
//! the sandbox's commands on the keeper's request (issue 31; `docs/threat-model.md`).
//!
//! The keeper starts one bubblewrap per sandbox with every protection on and this program as
//! its PID 1 (`--as-pid-1`); from then on a command costs a spawn inside the namespaces instead
//! of a new bubblewrap. It reads frames (`local/wire.rs`) on its standard input — run a command
//! (argv, environment, working directory, standard input), feed one's standard input while it
//! runs, kill one — and writes frames on its standard output: each command's output as it comes,
//! the input it took and its exit, tagged with the command's id, so commands run at once without
//! waiting for each other. A command's standard input is written by a thread of its own, so one
//! that does not read blocks only that thread, never this loop or another command.
//!
//! Each command leads a process group of its own. When its first process ends (or the keeper
//! asks), the whole group is killed; its exit is reported once its output pipes closed, or,
//! when a process that left the group (`setsid`, `setpgid`) still holds them, after
//! [`ESCAPE_GRACE`], saying so. Such a process lives on inside the sandbox — its namespaces, its
//! limits, no more — until the sandbox stops, when the keeper kills this init and with it the
//! whole PID namespace.
//!
//! As PID 1 it reaps every process of the sandbox, its commands' orphans too. A signal from
//! inside the sandbox cannot end it (the kernel drops those a namespace's init has no handler
//! for, `SIGKILL` included). When its standard input ends (the keeper is gone) it exits, and the
//! namespace with it.
//!
//! It is not dumpable, so that a command — the same user — cannot open its pipes or memory
//! through `/proc/1`.
//!
//! Std and `rustix` only (the safe system calls: wait, kill, prctl), no `unsafe`.

#![forbid(unsafe_code)]

#[path = "../local/wire.rs"]
#[allow(dead_code)]
mod wire;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions, WaitStatus};
use wire::{Exit, Reply, Request, Spawn};

/// How long a command's exit waits, after its group was killed, for its output pipes to close
/// before it is reported anyway (see the module docs).
const ESCAPE_GRACE: Duration = Duration::from_secs(2);

/// How much more of a command's output the keeper takes (`None`: no bound), and the readers
/// waiting for more.
struct Credit {
    left: Mutex<Option<u64>>,
    more: Condvar,
}

impl Credit {
    fn new(window: u64) -> Arc<Credit> {
        Arc::new(Credit {
            left: Mutex::new((window > 0).then_some(window)),
            more: Condvar::new(),
        })
    }

    fn left(&self) -> MutexGuard<'_, Option<u64>> {
        self.left.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until some is left, then takes `n` (one piece may overdraw it).
    fn take(&self, n: usize) {
        let mut left = self.left();
        while *left == Some(0) {
            left = self.more.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(l) = left.as_mut() {
            *l = l.saturating_sub(n as u64);
        }
    }

    /// `n` more (the keeper's [`Request::Credit`]).
    fn give(&self, n: u64) {
        if let Some(l) = self.left().as_mut() {
            *l = l.saturating_add(n);
        }
        self.more.notify_all();
    }

    /// No bound any more: the command ended or is killed, its readers drain its pipes.
    fn open(&self) {
        *self.left() = None;
        self.more.notify_all();
    }
}

/// One running command.
struct Running {
    /// Its first process, which leads its process group.
    pid: Pid,
    /// How much more output the keeper takes.
    credit: Arc<Credit>,
    /// Where its standard input's pieces go, while it stays open ([`Spawn::input`]): its writer
    /// thread. Dropped (by [`Request::CloseInput`], or with the command), it closes the input
    /// once what was queued is written. Bounded by the keeper: it sends no more than its window
    /// ahead of the [`Reply::Taken`] the writer answers.
    input: Option<mpsc::Sender<Vec<u8>>>,
    /// Output pipes still open (0 to 2).
    open: u8,
    /// How its first process ended, once it did.
    ended: Option<WaitStatus>,
}

/// Every running command, by id, and the ids by first process.
#[derive(Default)]
struct Table {
    running: HashMap<u64, Running>,
    ids: HashMap<i32, u64>,
}

/// What the threads share: the table, the keeper's end of the pipe, and the queue of exits
/// waiting for their pipes (see [`grace`]).
struct Init {
    table: Mutex<Table>,
    out: Mutex<File>,
    waiting: Mutex<mpsc::Sender<(Instant, u64)>>,
}

impl Init {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one frame; a keeper that is gone is no error here (standard input ends too).
    fn send(&self, id: u64, reply: &Reply) {
        if let Ok(frame) = wire::encode_reply(id, reply) {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(&frame);
        }
    }

    /// Reports `id`'s exit if its first process ended and its pipes closed (or `escaped`), once.
    fn report_if_done(&self, table: &mut Table, id: u64, escaped: bool) {
        let Some(r) = table.running.get(&id) else {
            return;
        };
        let Some(status) = r.ended else {
            return;
        };
        if r.open > 0 && !escaped {
            return;
        }
        table.ids.remove(&r.pid.as_raw_nonzero().get());
        table.running.remove(&id);
        let exit = Exit {
            code: status.exit_status(),
            signal: status.terminating_signal(),
            escaped,
        };
        self.send(id, &Reply::Exit(exit));
    }
}

fn main() -> ExitCode {
    match serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandkeeper-init: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads requests until the keeper closes standard input.
fn serve() -> io::Result<()> {
    // Not dumpable: its `/proc/1/fd` (the keeper's pipes, which carry every command's request
    // and answer) and `/proc/1/mem` are then out of reach of the commands, the same user as
    // it but without capabilities. A command gets its own dumpable flag back at its exec.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    let out = File::from(io::stdout().as_fd().try_clone_to_owned()?);
    let mut input = BufReader::new(File::from(io::stdin().as_fd().try_clone_to_owned()?));
    let (waiting, waited) = mpsc::channel();
    let init = Arc::new(Init {
        table: Mutex::new(Table::default()),
        out: Mutex::new(out),
        waiting: Mutex::new(waiting),
    });
    let (spawned, wake) = mpsc::channel();
    {
        let init = init.clone();
        std::thread::Builder::new().spawn(move || reap(&init, &wake))?;
    }
    {
        let init = init.clone();
        std::thread::Builder::new().spawn(move || grace(&init, &waited))?;
    }
    while let Some(body) = wire::read_frame(&mut input, wire::MAX_FRAME)? {
        let (id, request) = wire::decode_request(&body)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match request {
            Request::Spawn(s) => {
                if spawn(&init, id, s) {
                    let _ = spawned.send(());
                }
            }
            Request::Kill => {
                // Not once its first process was reaped: the reaper killed the group then, and
                // the number may name another group by now.
                if let Some(r) = init.table().running.get(&id) {
                    if r.ended.is_none() {
                        let _ = rustix::process::kill_process_group(r.pid, Signal::KILL);
                    }
                    r.credit.open();
                }
            }
            Request::Credit(n) => {
                if let Some(r) = init.table().running.get(&id) {
                    r.credit.give(n);
                }
            }
            Request::Input(bytes) => {
                // Queued to its writer (never written here: the command may not read). For a
                // command that ended, or whose input closed, dropped.
                if let Some(tx) = init.table().running.get(&id).and_then(|r| r.input.as_ref()) {
                    let _ = tx.send(bytes);
                }
            }
            Request::CloseInput => {
                if let Some(r) = init.table().running.get_mut(&id) {
                    r.input = None;
                }
            }
        }
    }
    Ok(())
}

/// Starts command `id`; whether it started (else its failure was reported).
fn spawn(init: &Arc<Init>, id: u64, s: Spawn) -> bool {
    let Some((program, args)) = s.argv.split_first() else {
        init.send(id, &Reply::Failed("empty argv".into()));
        return false;
    };
    let mut c = std::process::Command::new(program);
    c.args(args)
        .env_clear()
        .envs(s.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&s.cwd)
        .process_group(0)
        .stdin(if s.stdin.is_empty() && !s.input {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The table is held while spawning: the reaper reaps nothing meanwhile, so a child std
    // reaps itself (one whose exec failed) is never reaped twice, and one that ends at once is
    // in the table before the reaper looks it up.
    let mut table = init.table();
    let mut child = match c.spawn() {
        Ok(child) => child,
        Err(e) => {
            drop(table);
            init.send(id, &Reply::Failed(e.to_string()));
            return false;
        }
    };
    let Some(pid) = Pid::from_raw(child.id() as i32) else {
        return false;
    };
    let credit = Credit::new(s.window);
    let (input, pieces) = if s.input {
        let (tx, rx) = mpsc::channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    table.running.insert(
        id,
        Running {
            pid,
            credit: credit.clone(),
            input,
            open: 2,
            ended: None,
        },
    );
    table.ids.insert(pid.as_raw_nonzero().get(), id);
    drop(table);
    let stdin = child.stdin.take().map(|w| {
        let (init, first) = (init.clone(), s.stdin);
        move || write_input(&init, id, w, first, pieces)
    });
    let threads = [
        stdin.map(thread),
        child
            .stdout
            .take()
            .map(|r| forward(init, (id, &credit), r, Reply::Stdout)),
        child
            .stderr
            .take()
            .map(|r| forward(init, (id, &credit), r, Reply::Stderr)),
    ];
    if let Some(Err(e)) = threads.into_iter().flatten().find(Result::is_err) {
        // No thread to carry its input or output (the sandbox is at its process limit): it
        // does not run. Its process is reaped as an orphan; frames of it are dropped.
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        let mut table = init.table();
        table.running.remove(&id);
        table.ids.remove(&pid.as_raw_nonzero().get());
        drop(table);
        init.send(id, &Reply::Failed(format!("no thread for its pipes: {e}")));
        return false;
    }
    true
}

/// Writes command `id`'s standard input `w`: `first`, then each piece from `pieces` (when it
/// stays open), answering [`Reply::Taken`] for each; once the command stops reading, pieces
/// are dropped (and still answered). Closes the input when `pieces` ends (its sender dropped:
/// [`Request::CloseInput`], or the command ended).
fn write_input(
    init: &Init,
    id: u64,
    mut w: impl Write,
    first: Vec<u8>,
    pieces: Option<mpsc::Receiver<Vec<u8>>>,
) {
    let mut reads = w.write_all(&first).is_ok();
    let Some(pieces) = pieces else {
        return;
    };
    while let Ok(piece) = pieces.recv() {
        if reads {
            reads = w.write_all(&piece).is_ok();
        }
        init.send(id, &Reply::Taken(piece.len() as u64));
    }
}

/// Runs `f` on a thread of its own; an error where no thread can be made (at the sandbox's
/// process limit), which the init survives.
fn thread(f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().spawn(f).map(drop)
}

/// Sends what `from` gives as frames made by `wrap`, on a thread of its own, until it ends,
/// each piece within command `id`'s `credit`.
fn forward(
    init: &Arc<Init>,
    (id, credit): (u64, &Arc<Credit>),
    mut from: impl Read + Send + 'static,
    wrap: fn(Vec<u8>) -> Reply,
) -> io::Result<()> {
    let (init, credit) = (init.clone(), credit.clone());
    thread(move || {
        let mut buf = vec![0; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    credit.take(n);
                    init.send(id, &wrap(buf[..n].to_vec()));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let mut table = init.table();
        if let Some(r) = table.running.get_mut(&id) {
            r.open = r.open.saturating_sub(1);
        }
        init.report_if_done(&mut table, id, false);
    })
}

/// Reaps every process of the sandbox (as its PID 1), and ends each command whose first
/// process ended: its group is killed, its exit reported (at once, or when its pipes close, or
/// after [`ESCAPE_GRACE`]). Waits on `wake` while there is no child at all.
fn reap(init: &Arc<Init>, wake: &mpsc::Receiver<()>) {
    loop {
        // Waits for any child to end without reaping it, so that the reaping below happens
        // under the table's lock (see `spawn`).
        match rustix::process::waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Ok(_) => {}
            Err(rustix::io::Errno::CHILD) => {
                if wake.recv().is_err() {
                    return;
                }
                continue;
            }
            Err(_) => continue,
        }
        let mut table = init.table();
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            let Some(&id) = table.ids.get(&pid.as_raw_nonzero().get()) else {
                continue; // an orphan of some command, reparented to us
            };
            let _ = rustix::process::kill_process_group(pid, Signal::KILL);
            if let Some(r) = table.running.get_mut(&id) {
                r.ended = Some(status);
                // Its readers drain what is left: its exit waits for its pipes to close.
                r.credit.open();
                if r.open > 0 {
                    let waiting = init.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = waiting.send((now() + ESCAPE_GRACE, id));
                }
            }
            init.report_if_done(&mut table, id, false);
        }
    }
}

/// Reports each exit queued on `waited` whose pipes are still open at its deadline, saying that
/// a process escaped its group. One thread for every command: the deadlines come in order.
fn grace(init: &Arc<Init>, waited: &mpsc::Receiver<(Instant, u64)>) {
    while let Ok((deadline, id)) = waited.recv() {
        // A wait on the clock, bounded by the grace: the pipes' closing is reported at once
        // by the readers; this only ends the wait for a process that never closes them.
        std::thread::sleep(deadline.saturating_duration_since(now()));
        let mut table = init.table();
        init.report_if_done(&mut table, id, true);
    }
}

/// The clock, for the grace's deadlines only (a process, not the core: it may read it).
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}
