//! The running commands of one sandbox: what `List` shows, what `SendSignal` and a sandbox's
//! kill reach, the events `Connect` follows, and the standard input `SendInput` and
//! `CloseStdin` reach (of a command started with `stdin: true`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use sandkeeper_tokio::Input;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::error::{Code, ConnectError};

/// Commands one sandbox may run at once.
pub const MAX_PROCESSES: usize = 64;

/// Events kept for a `Connect` that falls behind (it skips what it missed beyond).
const EVENTS: usize = 256;

/// The running commands of one sandbox, by pid (the server's number, from 1).
#[derive(Default)]
pub struct Processes {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    running: HashMap<u32, Running>,
    /// Set by [`Processes::kill_all`]: no command starts after it (a kill waits for every
    /// command, so one started then would hold the kill up).
    closed: bool,
}

struct Running {
    config: Value,
    tag: Option<String>,
    kill: watch::Sender<Option<Kill>>,
    events: broadcast::Sender<Event>,
    stdin: Stdin,
}

/// A command's standard input, as `SendInput` and `CloseStdin` find it.
enum Stdin {
    /// Started without `stdin: true`: closed from the start.
    None,
    /// Open: where its pieces go (a bounded channel to its exec; a full one holds the
    /// sender back).
    Open(mpsc::Sender<Input>),
    /// Closed by `CloseStdin`.
    Closed,
}

/// Why a command is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kill {
    /// `SendSignal`: its stream ends with its `end` event.
    Signal,
    /// Its sandbox is being killed: its stream breaks off, as E2B's do when a sandbox goes
    /// (the SDKs then probe `/health` and report the sandbox gone).
    Sandbox,
}

/// What a command's stream carries, for the `Connect`s that follow it. A follower whose
/// channel closes without an `End` or `Failed` breaks off (the sandbox was killed).
#[derive(Clone, Debug)]
pub enum Event {
    /// A message envelope (`data`, `keepalive`).
    Frame(Bytes),
    /// The `end` event's envelope: the end-of-stream envelope follows.
    End(Bytes),
    /// The stream ends with this error.
    Failed(ConnectError),
}

/// A command just added: how it is told to die, and where its events go.
pub struct Started {
    /// Set once it is to be killed.
    pub killed: watch::Receiver<Option<Kill>>,
    /// Its events, for followers.
    pub events: broadcast::Sender<Event>,
}

impl Processes {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds command `pid`; `resource_exhausted` at [`MAX_PROCESSES`], `unavailable` once the
    /// sandbox is being killed.
    /// `stdin`: where its standard input goes, when it stays open (`stdin: true`).
    pub fn add(
        &self,
        pid: u32,
        config: Value,
        tag: Option<String>,
        stdin: Option<mpsc::Sender<Input>>,
    ) -> Result<Started, ConnectError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(ConnectError::new(
                Code::Unavailable,
                "The sandbox was not found",
            ));
        }
        if inner.running.len() >= MAX_PROCESSES {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_PROCESSES} commands run at once"),
            ));
        }
        let (kill, killed) = watch::channel(None);
        let (events, _) = broadcast::channel(EVENTS);
        let running = Running {
            config,
            tag,
            kill,
            events: events.clone(),
            stdin: stdin.map_or(Stdin::None, Stdin::Open),
        };
        inner.running.insert(pid, running);
        Ok(Started { killed, events })
    }

    /// Removes command `pid` (it ended).
    pub fn remove(&self, pid: u32) {
        self.lock().running.remove(&pid);
    }

    /// The commands as `List` shows them, by pid.
    pub fn list(&self) -> Vec<Value> {
        let mut all: Vec<_> = self
            .lock()
            .running
            .iter()
            .map(|(pid, r)| json!({"pid": pid, "config": r.config, "tag": r.tag}))
            .collect();
        all.sort_by_key(|v| v["pid"].as_u64());
        all
    }

    /// Kills the command `pid` (or tagged `tag`); `false` if there is none.
    pub fn kill(&self, pid: Option<u32>, tag: Option<&str>) -> bool {
        let inner = self.lock();
        match find(&inner.running, pid, tag) {
            Some((_, r)) => {
                r.kill.send_replace(Some(Kill::Signal));
                true
            }
            None => false,
        }
    }

    /// Follows the command `pid` (or tagged `tag`): its pid and its events from now on.
    pub fn follow(
        &self,
        pid: Option<u32>,
        tag: Option<&str>,
    ) -> Option<(u32, broadcast::Receiver<Event>)> {
        let inner = self.lock();
        find(&inner.running, pid, tag).map(|(pid, r)| (*pid, r.events.subscribe()))
    }

    /// Where the standard input of command `pid` (or tagged `tag`) goes: `not_found` for no
    /// such command, `failed_precondition` for one whose standard input is not open.
    pub fn stdin(
        &self,
        pid: Option<u32>,
        tag: Option<&str>,
    ) -> Result<mpsc::Sender<Input>, ConnectError> {
        let inner = self.lock();
        let (_, r) = find(&inner.running, pid, tag).ok_or_else(no_such_process)?;
        match &r.stdin {
            Stdin::Open(tx) => Ok(tx.clone()),
            Stdin::None => Err(not_open("it was started without stdin")),
            Stdin::Closed => Err(not_open("it was closed")),
        }
    }

    /// Closes the standard input of command `pid` (or tagged `tag`): answers where to send the
    /// close (once; `None` when it was closed already), `not_found` for no such command,
    /// `failed_precondition` for one started without standard input.
    pub fn close_stdin(
        &self,
        pid: Option<u32>,
        tag: Option<&str>,
    ) -> Result<Option<mpsc::Sender<Input>>, ConnectError> {
        let mut inner = self.lock();
        let pid = find(&inner.running, pid, tag)
            .map(|(pid, _)| *pid)
            .ok_or_else(no_such_process)?;
        let Some(r) = inner.running.get_mut(&pid) else {
            return Err(no_such_process());
        };
        match std::mem::replace(&mut r.stdin, Stdin::Closed) {
            Stdin::Open(tx) => Ok(Some(tx)),
            Stdin::Closed => Ok(None),
            Stdin::None => {
                r.stdin = Stdin::None;
                Err(not_open("it was started without stdin"))
            }
        }
    }

    /// Takes new commands again (the sandbox was paused, and is resumed).
    pub fn reopen(&self) {
        self.lock().closed = false;
    }

    /// Kills every command, and refuses new ones (the sandbox is being killed or paused).
    pub fn kill_all(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        for r in inner.running.values() {
            r.kill.send_replace(Some(Kill::Sandbox));
        }
    }
}

/// The error for no command of a pid or tag (the SDKs raise their not-found exception).
pub fn no_such_process() -> ConnectError {
    ConnectError::new(Code::NotFound, "no such process")
}

fn not_open(why: &str) -> ConnectError {
    ConnectError::new(
        Code::FailedPrecondition,
        format!("the command's stdin is not open: {why} (start it with stdin: true)"),
    )
}

fn find<'a>(
    inner: &'a HashMap<u32, Running>,
    pid: Option<u32>,
    tag: Option<&str>,
) -> Option<(&'a u32, &'a Running)> {
    inner
        .iter()
        .find(|(p, r)| pid == Some(**p) || (tag.is_some() && r.tag.as_deref() == tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_all_kills_every_command_and_refuses_new_ones() {
        let p = Processes::default();
        let a = p.add(1, json!({}), None, None).unwrap();
        let b = p.add(2, json!({}), Some("t".into()), None).unwrap();
        assert!(p.kill(None, Some("t")));
        assert_eq!(*b.killed.borrow(), Some(Kill::Signal));
        assert!(!p.kill(Some(9), None));
        assert_eq!(p.follow(Some(1), None).map(|(pid, _)| pid), Some(1));
        p.kill_all();
        assert_eq!(*a.killed.borrow(), Some(Kill::Sandbox));
        let refused = p.add(3, json!({}), None, None).err().map(|e| e.code);
        assert_eq!(refused, Some(Code::Unavailable));
        p.remove(1);
        assert_eq!(p.list().len(), 1);
    }

    #[test]
    fn stdin_is_found_open_closed_once_or_refused() {
        let p = Processes::default();
        let (tx, mut rx) = mpsc::channel(1);
        p.add(1, json!({}), Some("with".into()), Some(tx)).unwrap();
        p.add(2, json!({}), None, None).unwrap();
        fn code<T>(r: Result<T, ConnectError>) -> Option<Code> {
            r.err().map(|e| e.code)
        }
        assert_eq!(code(p.stdin(Some(9), None)), Some(Code::NotFound));
        assert_eq!(
            code(p.close_stdin(None, Some("none"))),
            Some(Code::NotFound)
        );
        assert_eq!(code(p.stdin(Some(2), None)), Some(Code::FailedPrecondition));
        assert_eq!(
            code(p.close_stdin(Some(2), None)),
            Some(Code::FailedPrecondition)
        );
        // Still refused as never opened, not as closed, after the refused close.
        let again = p.stdin(Some(2), None).err().unwrap();
        assert!(again.message.contains("without stdin"), "{again:?}");
        p.stdin(None, Some("with"))
            .unwrap()
            .try_send(Input::Stdin(b"a".to_vec()))
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), Input::Stdin(b"a".to_vec()));
        assert!(p.close_stdin(Some(1), None).unwrap().is_some());
        assert!(p.close_stdin(Some(1), None).unwrap().is_none());
        assert_eq!(code(p.stdin(Some(1), None)), Some(Code::FailedPrecondition));
    }
}
