//! What a sandbox (or, with one bubblewrap per command, each of its commands) may use:
//! processes, memory, CPU time (per process, per sandbox over its life, and cores at once), file
//! size, open files, `/tmp` and its workspace on disk.
//!
//! How each is enforced depends on the machine, and is found at start ([`Enforcement`], whose
//! `Display` the main job prints):
//!
//! - **cgroup v1** (a keeper that may make cgroups, i.e. root, where the `pids` and `memory`
//!   controllers are mounted under `/sys/fs/cgroup/<controller>`): each command gets a cgroup
//!   of its own under the keeper's own, joined by the spawned process before it runs anything
//!   (so nothing it starts is outside), with `pids.max` and `memory.limit_in_bytes` (and
//!   `memory.memsw.limit_in_bytes` where swap is accounted). A fork bomb stops at the limit; an
//!   allocation past the memory limit wakes the OOM killer *in that cgroup* only. When the
//!   command ends, every process still in its cgroup is killed, however it left its process
//!   group or session, and the cgroup is removed. Where `cpuacct` is mounted too, the cgroup is
//!   in it (its `cpuacct.usage`: the CPU time of everything that ran in it); where `cpu` is,
//!   `cpu.cfs_quota_us` is [`Limits::cpu_cores`] times `cpu.cfs_period_us`, so a sandbox uses at
//!   most that many of the host's cores at once. (cgroup v2 is not supported: only v1.)
//! - **rlimits**, set in the spawned process before bubblewrap (or the command) runs, and so
//!   inherited by everything the command starts: `RLIMIT_CPU` (CPU seconds of each process,
//!   then `SIGKILL`), `RLIMIT_FSIZE` (one file's size: the write fails with `EFBIG`, after
//!   `SIGXFSZ`), `RLIMIT_NOFILE`, and, without a memory cgroup, `RLIMIT_AS` (an allocation past
//!   it fails with `ENOMEM`).
//! - `RLIMIT_NPROC` counts processes per user *and user namespace* (Linux ≥ 5.14), and a user
//!   namespace records the limit its creator had as a cap on everything under it: set on
//!   bubblewrap it would cap all of the keeper's user's processes. So it is set *inside* the
//!   sandbox's own user namespace, by util-linux `prlimit` (the command runs as
//!   `prlimit --nproc=N -- argv`), where an unprivileged keeper's command counts alone: it holds
//!   per command. It does nothing for a root keeper (the kernel exempts processes whose real
//!   user is the initial root, which the sandbox's root maps to), nor under
//!   [`Isolation::Off`](super::Isolation::Off) (it would count every process of the keeper's
//!   user): there only the pids cgroup holds processes in.
//! - `/tmp` is a `tmpfs` of [`Limits::tmp_bytes`] (bubblewrap only): writes past it fail with
//!   `ENOSPC`.
//!
//! With one bubblewrap per sandbox (its init running every command, `sandbox_init.rs`), the
//! cgroup, the rlimits and `prlimit --nproc` are set once, on the sandbox's bubblewrap: the
//! processes, memory and cores limits hold for the sandbox as a whole (its commands and the
//! init's threads share them), while the rlimits (CPU, file size, open files, and `RLIMIT_AS`)
//! still count per process. `RLIMIT_CPU` is the exception: set on the bubblewrap it would be
//! inherited by the init, which lives as long as the sandbox and would die of it (and the
//! sandbox with it) however its CPU time came. So where `prlimit` is present it is set on each
//! command instead (the command runs as `prlimit --cpu=N -- argv`, and everything it starts
//! inherits it), and the bubblewrap and the init go without; where `prlimit` is missing it
//! stays on the bubblewrap, the init included, and the summary says so. With one bubblewrap per
//! command every limit holds per command, so a sandbox running k commands at once may use k
//! times as much.
//!
//! Over time (one bubblewrap per sandbox; `limit_watch.rs`):
//!
//! - **A sandbox's CPU time over its life** ([`Limits::sandbox_cpu_seconds`], besides the
//!   per-process [`Limits::cpu_seconds`], which keeps its meaning): the keeper reads its
//!   cgroup's `cpuacct.usage` at each command's end and every `TICK` (250 ms) while the sandbox
//!   has processes besides its init (a sandbox without has no timer: its next command wakes
//!   the watch), and, once the total (across its inits) passes the budget,
//!   kills every process of the sandbox; the running commands, and every later command of the
//!   sandbox, fail `OpError::CpuBudgetSpent` (class `Limit`). It overshoots by at most what the
//!   sandbox uses in one tick (with 2 cores: half a second). It needs root and the `cpuacct`
//!   controller: elsewhere (an unprivileged keeper, or one bubblewrap per command) only
//!   `RLIMIT_CPU` holds, per process, and a sandbox running many processes, or processes one
//!   after another, uses unbounded CPU time (rate-capped only where the `cpu` controller is).
//! - **The workspace's size** ([`Limits::workspace_bytes`], `quota.rs`) is the keeper's own
//!   count: no kernel quota is needed. Besides the count at each command's admission, the
//!   keeper counts it while the sandbox has processes besides its init (a command running, or
//!   one a command left running in the background): at most every second, and never more often
//!   than 50 times what the last count took. Past the quota it kills every process of the
//!   sandbox: a sandbox over its quota loses its background processes (and its running
//!   commands, which fail `OpError::QuotaExceeded`), and a background writer overshoots the
//!   quota by at most what it writes in one interval. This holds as root and unprivileged.

use std::fmt;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a sandbox may use (with one bubblewrap per command: each command); `None` leaves a
/// resource unlimited. The rlimits among them count per process (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Processes and threads at once (pids cgroup, or `RLIMIT_NPROC` where it holds).
    pub processes: Option<u64>,
    /// Memory, in bytes (memory cgroup, else address space, `RLIMIT_AS`).
    pub memory_bytes: Option<u64>,
    /// CPU time, in seconds, of each process (`RLIMIT_CPU`; with one bubblewrap per sandbox,
    /// set on each command by `prlimit`, never on the sandbox's init).
    pub cpu_seconds: Option<u64>,
    /// CPU time, in seconds, of a whole sandbox over its life: every process of it, at once or
    /// one after another (the `cpuacct` cgroup, watched by the keeper; root, one bubblewrap per
    /// sandbox). Once spent, its processes are killed and its commands fail
    /// `OpError::CpuBudgetSpent`.
    pub sandbox_cpu_seconds: Option<u64>,
    /// The CPU a sandbox (with one bubblewrap per command: a command) may use at once, in
    /// cores (the `cpu` cgroup's `cpu.cfs_quota_us` over `cpu.cfs_period_us`; root).
    pub cpu_cores: Option<u32>,
    /// The largest file a command may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: Option<u64>,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// The size of the sandbox's `/tmp`, in bytes (a size-limited `tmpfs`; bubblewrap only).
    pub tmp_bytes: Option<u64>,
    /// What the sandbox's workspace may take on disk, in bytes: counted by the keeper
    /// (`quota.rs`); writes and commands past it fail `OpError::QuotaExceeded`. With one
    /// bubblewrap per sandbox it is also watched while the sandbox has processes: past it, they
    /// are killed (`limit_watch.rs`).
    pub workspace_bytes: Option<u64>,
}

impl Default for Limits {
    /// 512 processes, 2 GiB of memory, 10 minutes of CPU per process and an hour per sandbox,
    /// 2 cores at once, 1 GiB files, 4,096 open files, 512 MiB of `/tmp`, a workspace of 8 GiB.
    fn default() -> Self {
        Limits {
            processes: Some(512),
            memory_bytes: Some(2 << 30),
            cpu_seconds: Some(600),
            sandbox_cpu_seconds: Some(3600),
            cpu_cores: Some(2),
            file_size_bytes: Some(1 << 30),
            open_files: Some(4096),
            tmp_bytes: Some(512 << 20),
            workspace_bytes: Some(8 << 30),
        }
    }
}

impl Limits {
    /// No limit at all.
    pub fn none() -> Self {
        Limits {
            processes: None,
            memory_bytes: None,
            cpu_seconds: None,
            sandbox_cpu_seconds: None,
            cpu_cores: None,
            file_size_bytes: None,
            open_files: None,
            tmp_bytes: None,
            workspace_bytes: None,
        }
    }
}

/// Bytes, shortly.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// How the limits are enforced on this machine, found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enforcement {
    /// The limits asked for.
    pub limits: Limits,
    /// The cgroup v1 directories (pids, memory) each command's own cgroup is made under, if
    /// the keeper may make cgroups here.
    pub cgroups: Option<Arc<CgroupV1>>,
    /// util-linux `prlimit`, which sets `RLIMIT_NPROC` inside the sandbox, if present.
    pub prlimit: Option<PathBuf>,
    /// Whether commands run in a user namespace of their own, unprivileged (so `RLIMIT_NPROC`
    /// counts per command).
    pub nproc_rlimit_holds: bool,
    /// Whether `/tmp` is the sandbox's own `tmpfs` (bubblewrap).
    pub tmp_is_tmpfs: bool,
    /// Whether the limits hold for each sandbox as a whole (one bubblewrap, cgroup and
    /// `prlimit` per sandbox), rather than for each command.
    pub per_sandbox: bool,
}

/// A resource of `setrlimit`.
#[cfg(target_env = "gnu")]
pub(crate) type Resource = libc::__rlimit_resource_t;
/// A resource of `setrlimit`.
#[cfg(not(target_env = "gnu"))]
pub(crate) type Resource = libc::c_int;

/// Where each command's cgroup is made (cgroup v1): `sandkeeper-<pid>-<n>` under the keeper's
/// own cgroup of each controller, removed when the backend is dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct CgroupV1 {
    /// Under the `pids` controller.
    pub pids: PathBuf,
    /// Under the `memory` controller.
    pub memory: PathBuf,
    /// Under the `cpuacct` controller, where it is mounted: a sandbox's CPU time over its life
    /// ([`Limits::sandbox_cpu_seconds`]).
    pub cpuacct: Option<PathBuf>,
    /// Under the `cpu` controller, where it is mounted: the cores a sandbox may use at once
    /// ([`Limits::cpu_cores`]). The same directory as `cpuacct` where the two are mounted
    /// together.
    pub cpu: Option<PathBuf>,
}

impl CgroupV1 {
    /// Every directory, once (`cpu` and `cpuacct` may be one).
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.pids.clone(), self.memory.clone()];
        for dir in [&self.cpuacct, &self.cpu].into_iter().flatten() {
            if !dirs.contains(dir) {
                dirs.push(dir.clone());
            }
        }
        dirs
    }
}

impl Enforcement {
    /// What holds here for `limits`, with or without bubblewrap's user namespace.
    pub(crate) fn find(limits: Limits, bubblewrap: bool) -> Self {
        let root = rustix::process::geteuid().is_root();
        let cgroups = if root {
            CgroupV1::make().map(Arc::new)
        } else {
            None
        };
        let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file());
        if prlimit.is_none() && bubblewrap && !root {
            tracing::warn!("util-linux prlimit is missing: no process limit on commands");
        }
        Enforcement {
            limits,
            cgroups,
            nproc_rlimit_holds: bubblewrap && !root && prlimit.is_some(),
            prlimit,
            tmp_is_tmpfs: bubblewrap,
            per_sandbox: false,
        }
    }

    /// Whether `RLIMIT_CPU` is set on each command through the sandbox's init by `prlimit`
    /// ([`command_prlimit_argv`](Self::command_prlimit_argv)) rather than on the sandbox's
    /// bubblewrap, where the init, which lives as long as the sandbox, would count against it.
    pub(crate) fn cpu_rlimit_per_command(&self) -> bool {
        self.per_sandbox && self.prlimit.is_some() && self.limits.cpu_seconds.is_some()
    }

    /// `prlimit --cpu=N --` to run before the argv of each command through a sandbox's init
    /// (see [`cpu_rlimit_per_command`](Self::cpu_rlimit_per_command)), else nothing. Never above
    /// the keeper's own hard limit, which the init inherited and `prlimit` could not raise.
    pub(crate) fn command_prlimit_argv(&self) -> Vec<String> {
        match (&self.prlimit, self.limits.cpu_seconds) {
            (Some(prlimit), Some(n)) if self.cpu_rlimit_per_command() => {
                let hard = rustix::process::getrlimit(rustix::process::Resource::Cpu).maximum;
                let n = hard.map_or(n, |hard| n.min(hard));
                vec![
                    prlimit.display().to_string(),
                    format!("--cpu={n}"),
                    "--".into(),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// Whether the keeper watches each sandbox's CPU time over its life (one bubblewrap per
    /// sandbox, its cgroup in `cpuacct`, a budget asked for).
    pub(crate) fn sandbox_cpu_watched(&self) -> bool {
        self.per_sandbox
            && self.limits.sandbox_cpu_seconds.is_some()
            && self.cgroups.as_ref().is_some_and(|c| c.cpuacct.is_some())
    }

    /// `prlimit --nproc=N --` to run before the command's argv where that limit holds (see
    /// the module docs), else nothing.
    pub(crate) fn prlimit_argv(&self) -> Vec<String> {
        match (
            &self.prlimit,
            self.limits.processes,
            self.nproc_rlimit_holds,
        ) {
            (Some(prlimit), Some(n), true) => vec![
                prlimit.display().to_string(),
                format!("--nproc={n}"),
                "--".into(),
            ],
            _ => Vec::new(),
        }
    }

    /// The rlimits the spawned process sets on itself before it runs bubblewrap or the
    /// command, as `(resource, limit)`, soft and hard alike; never above the keeper's own hard
    /// limit (which an unprivileged keeper could not raise: the spawn would fail).
    pub(crate) fn rlimits(&self) -> Vec<(Resource, u64)> {
        use rustix::process::{getrlimit, Resource as R};
        let l = &self.limits;
        let mut out = Vec::new();
        let mut push = |resource: Resource, ours: R, n: u64| {
            let n = getrlimit(ours).maximum.map_or(n, |hard| n.min(hard));
            out.push((resource, n));
        };
        if let (Some(n), None) = (l.memory_bytes, &self.cgroups) {
            push(libc::RLIMIT_AS, R::As, n);
        }
        if let (Some(n), false) = (l.cpu_seconds, self.cpu_rlimit_per_command()) {
            push(libc::RLIMIT_CPU, R::Cpu, n);
        }
        if let Some(n) = l.file_size_bytes {
            push(libc::RLIMIT_FSIZE, R::Fsize, n);
        }
        if let Some(n) = l.open_files {
            push(libc::RLIMIT_NOFILE, R::Nofile, n);
        }
        out
    }

    /// A cgroup of its own for one command, limits written, or `None` without cgroups.
    pub(crate) fn cgroup(&self) -> io::Result<Option<CommandCgroup>> {
        let Some(base) = &self.cgroups else {
            return Ok(None);
        };
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("x{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut group = CommandCgroup {
            dirs: base.dirs().iter().map(|d| d.join(&name)).collect(),
            procs: Vec::new(),
            cpu_usage: base
                .cpuacct
                .as_ref()
                .map(|d| d.join(&name).join("cpuacct.usage")),
        };
        for dir in &group.dirs {
            std::fs::create_dir(dir)?;
        }
        let l = &self.limits;
        if let Some(n) = l.processes {
            write_value(&group.dirs[0].join("pids.max"), n)?;
        }
        if let Some(n) = l.memory_bytes {
            write_value(&group.dirs[1].join("memory.limit_in_bytes"), n)?;
            let memsw = group.dirs[1].join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write_value(&memsw, n)?;
            }
        }
        if let (Some(cores), Some(cpu)) = (l.cpu_cores, &base.cpu) {
            let dir = cpu.join(&name);
            let period = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))
                .ok()
                .and_then(|p| p.trim().parse::<u64>().ok())
                .unwrap_or(100_000);
            write_value(
                &dir.join("cpu.cfs_quota_us"),
                period.saturating_mul(u64::from(cores)),
            )?;
        }
        for dir in &group.dirs {
            group.procs.push(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))?
                    .into(),
            );
        }
        Ok(Some(group))
    }
}

fn write_value(path: &Path, n: u64) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(n.to_string().as_bytes())
}

impl CgroupV1 {
    /// `sandkeeper-<pid>-<n>` under the keeper's own cgroup of each controller (so commands stay
    /// inside whatever limits the keeper itself is under), made now; `None` where either
    /// controller is missing or the keeper may not make cgroups.
    fn make() -> Option<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let under = |controller: &str| -> Option<PathBuf> {
            let line = own.lines().find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == controller))
            })?;
            let path = line.split(':').nth(2)?.trim_start_matches('/');
            // Canonical: `cpu` and `cpuacct` mounted together are links to one directory.
            let mount = std::fs::canonicalize(Path::new("/sys/fs/cgroup").join(controller)).ok()?;
            if !mount.join("cgroup.procs").is_file() {
                return None;
            }
            let parent = mount.join(path);
            sweep_stale(&parent);
            let dir = parent.join(format!("sandkeeper-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => Some(dir),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Some(dir),
                Err(e) => {
                    tracing::info!(dir = %dir.display(), error = %e, "no cgroup for commands");
                    None
                }
            }
        };
        let pids = under("pids")?;
        let Some(memory) = under("memory") else {
            let _ = std::fs::remove_dir(&pids);
            return None;
        };
        Some(CgroupV1 {
            pids,
            memory,
            cpuacct: under("cpuacct"),
            cpu: under("cpu"),
        })
    }
}

/// Removes what keepers that are gone left under `parent` (a keeper that exits without
/// dropping its backend leaves its `sandkeeper-<pid>-<n>`), killing anything still in it.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("sandkeeper-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        let stayed: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|e| {
                e.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        if !stayed.is_empty() {
            CommandCgroup {
                dirs: stayed,
                procs: Vec::new(),
                cpu_usage: None,
            }
            .end_now();
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

impl Drop for CgroupV1 {
    /// Removes the directories, and any command's cgroup that stayed in them (one whose
    /// command's future was dropped while the runtime shut down), killing what is left in it.
    fn drop(&mut self) {
        for dir in &self.dirs() {
            if let Ok(entries) = std::fs::read_dir(dir) {
                let stayed: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect();
                if !stayed.is_empty() {
                    CommandCgroup {
                        dirs: stayed,
                        procs: Vec::new(),
                        cpu_usage: None,
                    }
                    .end_now();
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// One command's cgroup: joined by the spawned process (`procs`, written `0` before it runs
/// anything); its processes killed and the directories removed when the command ends
/// ([`CommandCgroup::end`]).
pub(crate) struct CommandCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, open for the spawned process to write itself into.
    pub(crate) procs: Vec<OwnedFd>,
    /// Its `cpuacct.usage` (the CPU time of every process that was in it, in nanoseconds),
    /// where `cpuacct` is mounted.
    cpu_usage: Option<PathBuf>,
}

impl CommandCgroup {
    /// Its `cpuacct.usage` file, where `cpuacct` is mounted.
    pub(crate) fn cpu_usage_file(&self) -> Option<&Path> {
        self.cpu_usage.as_deref()
    }

    /// Sends `SIGKILL` to every process in it; how many there were.
    pub(crate) fn kill_all(&self) -> usize {
        let mut left = 0;
        for dir in &self.dirs {
            let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
                continue;
            };
            for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                left += 1;
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        left
    }

    fn remove(&self) {
        for dir in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "a command's cgroup stays");
            }
        }
    }

    /// Kills every process in it and removes it. A process that is dying still counts until
    /// it is reaped, so this tries a bounded number of rounds (each a `SIGKILL` of whoever is
    /// left, then a yield, later a 5 ms pause: about a second in all); a directory still busy
    /// after them stays, and is said so.
    pub(crate) async fn end(self) {
        for round in 0..KILL_ROUNDS {
            if self.kill_all() == 0 {
                break;
            }
            match reap_wait(round) {
                None => tokio::task::yield_now().await,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
        self.remove();
    }

    /// [`end`](Self::end), blocking (for the probe at start, outside any runtime).
    pub(crate) fn end_now(self) {
        for round in 0..KILL_ROUNDS {
            if self.kill_all() == 0 {
                break;
            }
            match reap_wait(round) {
                None => std::thread::yield_now(),
                Some(wait) => std::thread::sleep(wait),
            }
        }
        self.remove();
    }
}

/// Rounds of killing a cgroup's processes before it is given up on (about a second).
const KILL_ROUNDS: u32 = 220;

/// How long to wait after a round of kills that found processes: the first rounds only yield;
/// then a short bounded wait, reaping being the kernel's and the parents' work.
fn reap_wait(round: u32) -> Option<std::time::Duration> {
    (round >= 20).then_some(std::time::Duration::from_millis(5))
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.limits;
        let rl = true;
        let mut parts: Vec<String> = Vec::new();
        let mut part = |name: &str, value: Option<String>, how: Option<&str>| {
            parts.push(match (value, how) {
                (None, _) => format!("{name} unlimited"),
                (Some(v), Some(how)) => format!("{name} {v} ({how})"),
                (Some(v), None) => format!("{name} {v} (NOT ENFORCED here)"),
            })
        };
        part(
            "processes",
            l.processes.map(|n| n.to_string()),
            if self.cgroups.is_some() {
                Some("pids cgroup")
            } else if self.nproc_rlimit_holds && self.prlimit.is_some() {
                Some("RLIMIT_NPROC in the sandbox's user namespace")
            } else {
                None
            },
        );
        part(
            "memory",
            l.memory_bytes.map(bytes),
            if self.cgroups.is_some() {
                Some("memory cgroup")
            } else if rl {
                Some("RLIMIT_AS")
            } else {
                None
            },
        );
        part(
            "cpu",
            l.cpu_seconds.map(|n| format!("{n} s")),
            Some(if self.cpu_rlimit_per_command() {
                "RLIMIT_CPU of each command's processes, by prlimit"
            } else if self.per_sandbox {
                "RLIMIT_CPU, the sandbox's init included"
            } else {
                "RLIMIT_CPU"
            }),
        );
        part(
            "sandbox cpu",
            l.sandbox_cpu_seconds.map(|n| format!("{n} s")),
            Some(if self.sandbox_cpu_watched() {
                "cpuacct cgroup, watched by the keeper"
            } else {
                "NOT ENFORCED here: RLIMIT_CPU per process only"
            }),
        );
        part(
            "cpu cores",
            l.cpu_cores.map(|n| n.to_string()),
            self.cgroups
                .as_ref()
                .is_some_and(|c| c.cpu.is_some())
                .then_some("cpu cgroup's CFS quota"),
        );
        part(
            "file size",
            l.file_size_bytes.map(bytes),
            rl.then_some("RLIMIT_FSIZE"),
        );
        part(
            "open files",
            l.open_files.map(|n| n.to_string()),
            rl.then_some("RLIMIT_NOFILE"),
        );
        part(
            "/tmp",
            l.tmp_bytes.map(bytes),
            self.tmp_is_tmpfs.then_some("tmpfs"),
        );
        let per = if self.per_sandbox {
            "per sandbox (cpu, file size and open files per process, sandbox cpu over its life)"
        } else {
            "per command"
        };
        let workspace = match l.workspace_bytes {
            Some(n) if self.per_sandbox => format!(
                "{} (counted by the keeper, and watched while the sandbox has processes)",
                bytes(n)
            ),
            Some(n) => format!("{} (counted by the keeper)", bytes(n)),
            None => "unlimited".into(),
        };
        write!(f, "{per}: {}; workspace: {workspace}", parts.join(", "))
    }
}
