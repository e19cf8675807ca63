//! The keeper's watch of a sandbox with one bubblewrap per sandbox: its CPU time over its life
//! ([`Limits::sandbox_cpu_seconds`](super::Limits::sandbox_cpu_seconds), where its cgroup is in
//! `cpuacct`) and its workspace's size
//! ([`Limits::workspace_bytes`](super::Limits::workspace_bytes)) while it has processes.
//!
//! One timer per sandbox, on the task that owns its init (`sandbox_init.rs`), running only
//! while the sandbox has processes besides its init: a command running (the init counts them
//! for the watch), or the init's children (from `/proc`: what commands left running). Every
//! [`TICK`] it reads the cgroup's `cpuacct.usage`, and it counts the workspace (`quota.rs`'s
//! walk) at most every [`WALK_AT_MOST_EVERY`], never more often than [`WALK_SHARE`] times the
//! last walk's own cost (so a walk takes at most 1/[`WALK_SHARE`] of one core, whatever the
//! workspace's size). A sandbox found without processes costs nothing until its next command:
//! only a command, which the keeper asks the init for, starts processes in it, and each
//! command's start and end nudge the watch ([`Nudge::Wake`]). An exec also asks it for the CPU
//! at its command's end ([`Nudge::Cpu`]), and answers with what it says.
//!
//! When the budget is spent, or the workspace is over its quota, the watch returns the
//! [`Overrun`]: its task ends the init, and with it every process of the sandbox (the PID
//! namespace dies, the cgroup is emptied). The running execs answer the overrun's error. A spent
//! CPU budget is the sandbox's for life ([`Usage`]): its later commands are refused at once. A
//! quota overrun is not kept: the next command's admission counts the workspace afresh, and a
//! workspace still over its quota refuses it until the caller made room. A background writer
//! overshoots the quota by at most what it writes in one walk interval; a sandbox's CPU
//! overshoots its budget by at most what its processes use in one tick.
//!
//! Every read of `/proc`, of the cgroup and of the workspace runs on a blocking thread. The
//! watch does one thing at a time: an exec's question at its command's end waits for a walk
//! under way (25 ms for 10,000 files, `docs/performance.md`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use tokio::sync::{mpsc, oneshot};

use super::quota::{self, Exceeded};
use crate::ops::OpError;

/// How often the watch looks at a sandbox (whether it has processes; its CPU). The CPU overshoot
/// of a sandbox is at most what it uses in one tick (with [`Limits::cpu_cores`] of 2: half a
/// second).
///
/// [`Limits::cpu_cores`]: super::Limits::cpu_cores
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// The longest a sandbox with processes goes without its workspace counted (unless the walk is
/// slow: see [`WALK_SHARE`]).
pub(crate) const WALK_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// A walk waits at least this many times its own last cost: it takes at most 1/50 of a core.
pub(crate) const WALK_SHARE: u32 = 50;

/// Why the keeper ended a sandbox's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// Its CPU budget is spent.
    Cpu {
        /// CPU time its processes used over its life.
        used: Duration,
        /// The budget.
        budget: Duration,
    },
    /// Its workspace is over its quota.
    Quota(Exceeded),
}

impl Overrun {
    /// The error an exec answers with.
    pub(crate) fn error(&self) -> OpError {
        match *self {
            Overrun::Cpu { used, budget } => OpError::CpuBudgetSpent { used, budget },
            Overrun::Quota(q) => OpError::QuotaExceeded {
                used: q.used,
                limit: q.limit,
            },
        }
    }
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Overrun::Cpu { used, budget } => write!(
                f,
                "its processes used {used:?} of CPU, past its budget of {budget:?}: killed"
            ),
            Overrun::Quota(q) => write!(f, "{q}: its processes were killed"),
        }
    }
}

/// What a sandbox used over its life, across its inits.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    /// CPU time, in nanoseconds, of its inits that ended.
    cpu_before: AtomicU64,
    /// Its CPU budget, once spent.
    spent: Mutex<Option<Overrun>>,
}

impl Usage {
    /// The error of a command of a sandbox whose CPU budget is spent.
    pub(crate) fn spent(&self) -> Option<OpError> {
        self.spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|o| o.error())
    }

    fn mark_spent(&self, overrun: Overrun) {
        *self.spent.lock().unwrap_or_else(|p| p.into_inner()) = Some(overrun);
    }
}

/// What a sandbox's watch looks at, the same for each of its inits.
#[derive(Clone, Debug)]
pub(crate) struct Watched {
    /// Its workspace.
    pub(crate) workspace: PathBuf,
    /// The workspace's quota, in bytes.
    pub(crate) quota: Option<u64>,
    /// Its CPU budget, where it is watched (`Enforcement::sandbox_cpu_watched`).
    pub(crate) cpu_budget: Option<Duration>,
    /// What it used over its life.
    pub(crate) usage: Arc<Usage>,
}

/// What an exec tells the watch.
pub(crate) enum Nudge {
    /// A command started or ended: look now, and tick on while the sandbox has processes.
    Wake,
    /// The CPU now, please: answered with the overrun if there is one (at a command's end).
    Cpu(oneshot::Sender<Option<Overrun>>),
}

/// One init's watch.
pub(crate) struct Watch {
    watched: Watched,
    /// Commands running through the init now (counted by it, `SandboxInit`).
    commands: Arc<AtomicUsize>,
    /// The init's cgroup's `cpuacct.usage`.
    cpu_usage: Option<PathBuf>,
    /// The sandbox's bubblewrap, whose child is the init.
    bwrap: Option<u32>,
    /// The init, once found.
    init: Mutex<Option<u32>>,
}

impl Watch {
    /// The watch of the init under the bubblewrap `bwrap` running `commands` now, its cgroup's
    /// `cpu_usage` file.
    pub(crate) fn new(
        watched: Watched,
        commands: Arc<AtomicUsize>,
        cpu_usage: Option<&Path>,
        bwrap: Option<u32>,
    ) -> Self {
        Watch {
            watched,
            commands,
            cpu_usage: cpu_usage.map(Path::to_path_buf),
            bwrap,
            init: Mutex::new(None),
        }
    }

    /// Whether there is anything to watch at all.
    fn has_nothing_to_watch(&self) -> bool {
        self.watched.quota.is_none() && !self.cpu_watched()
    }

    fn cpu_watched(&self) -> bool {
        self.watched.cpu_budget.is_some() && self.cpu_usage.is_some()
    }

    /// The init's cgroup's CPU time so far, in nanoseconds (0 unreadable). Blocks.
    fn cpu_now(&self) -> u64 {
        self.cpu_usage
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The spent budget, if it is: marked in the sandbox's [`Usage`] for life. Blocks (one read
    /// of the cgroup).
    pub(crate) fn cpu(&self) -> Option<Overrun> {
        let budget = self.watched.cpu_budget.filter(|_| self.cpu_watched())?;
        let before = self.watched.usage.cpu_before.load(Ordering::Relaxed);
        let used = Duration::from_nanos(before.saturating_add(self.cpu_now()));
        if used <= budget {
            return None;
        }
        let overrun = Overrun::Cpu { used, budget };
        self.watched.usage.mark_spent(overrun);
        Some(overrun)
    }

    /// The workspace over its quota, if it is. Blocks (a walk).
    fn quota(&self) -> Option<Overrun> {
        let limit = self.watched.quota?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let used = rustix::fs::open(&self.watched.workspace, flags, Mode::empty())
            .map_err(io::Error::from)
            .and_then(quota::measure);
        match used {
            Ok(used) if used > limit => Some(Overrun::Quota(Exceeded { used, limit })),
            Ok(_) => None,
            // Gone, or unreadable: the death check and the next exec say so.
            Err(_) => None,
        }
    }

    /// Whether the sandbox has processes besides its init: a command running, or the init's
    /// children (its orphans' too: the init reaps them all); `true` when that cannot be told.
    /// Blocks (`/proc`).
    fn busy(&self) -> bool {
        if self.commands.load(Ordering::SeqCst) > 0 {
            return true;
        }
        let mut init = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if init.is_none() {
            *init = self.bwrap.and_then(find_init);
        }
        match *init {
            Some(pid) => children(pid).is_none_or(|c| !c.is_empty()),
            None => true,
        }
    }

    /// The init ended: its cgroup's CPU time is kept in the sandbox's [`Usage`]. Blocks.
    pub(crate) fn ended(&self) {
        if self.cpu_usage.is_some() {
            let now = self.cpu_now();
            self.watched
                .usage
                .cpu_before
                .fetch_add(now, Ordering::Relaxed);
        }
    }
}

/// The children of every thread of `pid`; `None` when they cannot be read.
fn children(pid: u32) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    // A thread that ended while listed has no children to read: skipped.
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    Some(out)
}

/// The init under the bubblewrap `bwrap`: its child (or grandchild, where bubblewrap keeps a
/// process of its own in between) named `sandkeeper-init`.
fn find_init(bwrap: u32) -> Option<u32> {
    let is_init = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == INIT_COMM)
    };
    let first = children(bwrap)?;
    if let Some(pid) = first.iter().copied().find(is_init) {
        return Some(pid);
    }
    first
        .iter()
        .filter_map(|&c| children(c))
        .flatten()
        .find(is_init)
}

/// The init's name in `/proc/<pid>/comm` (15 bytes, all of it).
const INIT_COMM: &str = "sandkeeper-init";

/// Runs `f` on a blocking thread (`None` if the thread failed).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Watches one init until an overrun, which it returns, ticking while the sandbox has processes
/// and woken by `nudges` otherwise; answers an exec's question meanwhile. Never returns when
/// there is nothing to watch.
pub(crate) async fn run(watch: Arc<Watch>, mut nudges: mpsc::UnboundedReceiver<Nudge>) -> Overrun {
    if watch.has_nothing_to_watch() {
        while let Some(nudge) = nudges.recv().await {
            if let Nudge::Cpu(ask) = nudge {
                let _ = ask.send(None);
            }
        }
        return std::future::pending().await;
    }
    let mut walk_due = tokio::time::Instant::now();
    let mut busy = true;
    loop {
        let nudge = if busy {
            tokio::select! {
                () = tokio::time::sleep(TICK) => Nudge::Wake,
                Some(nudge) = nudges.recv() => nudge,
            }
        } else {
            match nudges.recv().await {
                Some(nudge) => nudge,
                // No handle left: the init ends.
                None => return std::future::pending().await,
            }
        };
        let w = watch.clone();
        let found = match nudge {
            Nudge::Cpu(ask) => {
                let found = blocking(move || w.cpu()).await.flatten();
                let _ = ask.send(found);
                found
            }
            Nudge::Wake => {
                let walk = tokio::time::Instant::now() >= walk_due;
                let looked = blocking(move || look(&w, walk)).await;
                let Looked {
                    found,
                    busy: b,
                    walked,
                } = looked.unwrap_or(Looked {
                    found: None,
                    busy: true,
                    walked: None,
                });
                busy = b;
                if let Some(took) = walked {
                    walk_due =
                        tokio::time::Instant::now() + WALK_AT_MOST_EVERY.max(took * WALK_SHARE);
                }
                found
            }
        };
        if let Some(overrun) = found {
            return overrun;
        }
    }
}

/// What one look found.
struct Looked {
    /// A limit passed.
    found: Option<Overrun>,
    /// Whether the sandbox has processes besides its init.
    busy: bool,
    /// How long the walk of the workspace took, if one ran.
    walked: Option<Duration>,
}

/// One look: nothing while the sandbox has no process besides its init; else its CPU, and,
/// when `walk`, its workspace.
fn look(watch: &Watch, walk: bool) -> Looked {
    let mut looked = Looked {
        found: None,
        busy: watch.busy(),
        walked: None,
    };
    if !looked.busy {
        return looked;
    }
    looked.found = watch.cpu();
    if looked.found.is_some() || !walk || watch.watched.quota.is_none() {
        return looked;
    }
    let started = tokio::time::Instant::now();
    looked.found = watch.quota();
    looked.walked = Some(started.elapsed());
    looked
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `children` of this test's process list a child it spawned, and nothing once it was
    /// reaped; a process that does not exist has none to read.
    #[test]
    fn a_process_s_children_are_read_from_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ours = children(std::process::id()).unwrap();
        assert!(ours.contains(&child.id()), "{ours:?}");
        let _ = child.kill();
        let _ = child.wait();
        let ours = children(std::process::id()).unwrap();
        assert!(!ours.contains(&child.id()), "{ours:?}");
        assert_eq!(children(u32::MAX), None);
    }

    /// What the watch costs on a workspace of 10,000 files (100 directories of 100): one walk,
    /// and one tick's look for processes (`/proc`). A measurement, not a check: run with
    /// `cargo test -p sandkeeper-tokio --lib the_watch_s_cost -- --ignored --nocapture`
    /// (`docs/performance.md`).
    #[test]
    #[ignore = "a measurement, not a check: run by hand for docs/performance.md"]
    #[allow(clippy::disallowed_methods)] // a measurement reads the clock
    fn the_watch_s_cost() {
        let ws = std::env::temp_dir().join(format!("sk-watch-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ws);
        for d in 0..100 {
            let dir = ws.join(format!("d{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..100 {
                std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
            }
        }
        let watch = Watch::new(
            Watched {
                workspace: ws.clone(),
                quota: Some(u64::MAX),
                cpu_budget: None,
                usage: Arc::default(),
            },
            Arc::default(),
            None,
            Some(std::process::id()),
        );
        let median = |mut v: Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        let time = |f: &dyn Fn()| {
            let runs: Vec<Duration> = (0..21)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed()
                })
                .collect();
            median(runs)
        };
        let walk = time(&|| assert_eq!(watch.quota(), None));
        let look = time(&|| {
            watch.busy();
        });
        let every = WALK_AT_MOST_EVERY.max(walk * WALK_SHARE);
        eprintln!(
            "watch cost: walk of 10,000 files {walk:?} (one every {every:?}: {:.2} % of a core), \
             a tick's look for processes {look:?} ({:.3} % of a core)",
            100.0 * walk.as_secs_f64() / every.as_secs_f64(),
            100.0 * look.as_secs_f64() / TICK.as_secs_f64(),
        );
        let _ = std::fs::remove_dir_all(&ws);
    }
}
