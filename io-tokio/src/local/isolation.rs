//! How far a local sandbox's commands are kept apart from the host, the keeper and each other
//! (the threat model: `docs/threat-model.md`).
//!
//! With bubblewrap (`bwrap`, the Debian package `bubblewrap`) present and working, a sandbox's
//! commands run in one bubblewrap per sandbox, started at its first command, with
//! `sandkeeper-init` as its PID 1 spawning each command on the keeper's request
//! ([`Mode::PerSandbox`], `sandbox_init.rs`; the init is found by [`find_init`]), or, without an
//! init or when the configuration asks ([`Namespaces::PerCommand`]), one bubblewrap per command
//! ([`Mode::PerCommand`]). Either way each command runs:
//!
//! - in new user, PID, IPC, UTS, cgroup and (unless the network is enabled) network namespaces,
//!   with **no capabilities** in any set (`--cap-drop ALL`; as root too), `no_new_privs`, and no
//!   further user namespaces (`--disable-userns`);
//! - under a **seccomp filter** ([`seccomp`](super::seccomp)) against mounts, namespaces,
//!   `ptrace`, keyrings, `bpf` and the like;
//! - on a **minimal root**: a read-only `/`, with only `/usr` (and the `/bin`, `/sbin`, `/lib*`
//!   that lead into it), a short list of `/etc` files (users and groups, name resolution, the
//!   dynamic linker's cache, certificates, `alternatives`), a minimal `/dev`, its own `/proc`
//!   and a `/tmp` of its own (a size-limited `tmpfs`); no `/root`, `/home`, `/run`, `/var`,
//!   `/sys`, no host socket; the keeper's root hidden under an empty `tmpfs`, and only the
//!   sandbox's own directory mounted back, writable, at its own path; or, with a
//!   [`workspace_mount`](super::LocalConfig::workspace_mount), at that path alone, nothing
//!   of the root mounted (`mount.rs`);
//! - with a **clean environment**: bubblewrap itself starts with none (nothing of a request
//!   can load code into it on the host side), and the command's variables are set inside: by
//!   the init, from its pipe (one per sandbox), or by `--clearenv`, `--setenv` (one per
//!   command, where they show on bubblewrap's command line);
//! - with **no descriptor but 0, 1 and 2**: every other descriptor of the keeper is made
//!   close-on-exec in the spawned process before bubblewrap runs (and bubblewrap's own
//!   descriptor for the filter is closed once read);
//! - in a session of its own (`--new-session`: no terminal injection), dying with bubblewrap
//!   (`--die-with-parent`), under the [limits](super::limits) of the configuration.
//!
//! At start ([`detect`]) one command runs in exactly such a sandbox and must find every
//! capability set empty, `no_new_privs` set and the filter on; otherwise bubblewrap counts as not
//! working here ([`IsolationError`]).
//!
//! Without it ([`Isolation::Off`], or [`Isolation::Auto`] where it does not work), a command
//! still gets a cleared environment, the rlimits, no inherited descriptor and its own process
//! group and session, and everything it started is killed when it ends (its cgroup's processes
//! where the keeper may make cgroups, else every process carrying its exec's mark in its
//! environment, besides its process group); but it runs as the keeper's user with the host's
//! file system and network: the keeper says so at start (a warning) and in [`Isolated`].

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::limits::{CommandCgroup, Enforcement};

/// What isolation a [`LocalConfig`](super::LocalConfig) asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Bubblewrap when it is present and works, else process groups only (with a warning).
    #[default]
    Auto,
    /// Bubblewrap, or [`LocalBackend::new`](super::LocalBackend::new) fails.
    Require,
    /// Process groups only.
    Off,
}

/// How many bubblewraps a [`LocalConfig`](super::LocalConfig) asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Namespaces {
    /// One per sandbox, with `sandkeeper-init` as its PID 1 running each command, where the
    /// init is found (see [`find_init`]); else one per command.
    #[default]
    PerSandbox,
    /// One per command (each command's own namespaces, cgroup and limits).
    PerCommand,
}

/// How bubblewrap runs a sandbox's commands, found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One bubblewrap per sandbox, started at its first command, with `init` as its PID 1:
    /// each command is a process the init spawns inside the sandbox's namespaces, and the
    /// limits hold for the sandbox as a whole.
    PerSandbox {
        /// The `sandkeeper-init` program on the host (bound read-only into the sandbox).
        init: PathBuf,
    },
    /// One bubblewrap per command.
    PerCommand {
        /// Why not one per sandbox.
        why: String,
    },
}

/// The isolation a [`LocalBackend`](super::LocalBackend) runs commands under, found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolated {
    /// Inside bubblewrap (see the module docs).
    Bubblewrap {
        /// The `bwrap` program.
        program: PathBuf,
        /// Whether commands reach the network.
        network: bool,
        /// One bubblewrap per sandbox or per command.
        mode: Mode,
    },
    /// A cleared environment and a process group; no namespaces.
    ProcessGroup {
        /// Why not bubblewrap.
        why: String,
    },
}

/// Why bubblewrap cannot isolate commands here (under [`Isolation::Require`],
/// [`LocalBackend::new`](super::LocalBackend::new) fails with it, inside its `io::Error`).
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// No `bwrap` on `PATH`.
    #[error("bwrap is not installed (Debian: apt-get install bubblewrap)")]
    Missing,
    /// `bwrap` did not run a command.
    #[error("{program} does not work here: {why}")]
    Broken {
        /// The `bwrap` program.
        program: PathBuf,
        /// What it said, or why it did not start.
        why: String,
    },
    /// A command in the sandbox still had capabilities, or lacked `no_new_privs` or the
    /// seccomp filter.
    #[error("a command in the sandbox is not contained: {status}")]
    Leaky {
        /// The lines of its `/proc/self/status` that were wrong.
        status: String,
    },
}

impl Isolated {
    /// Whether commands run inside bubblewrap.
    pub fn is_bubblewrap(&self) -> bool {
        matches!(self, Isolated::Bubblewrap { .. })
    }

    /// The `sandkeeper-init` each sandbox's bubblewrap runs, when there is one per sandbox.
    pub fn init(&self) -> Option<&Path> {
        match self {
            Isolated::Bubblewrap {
                mode: Mode::PerSandbox { init },
                ..
            } => Some(init),
            _ => None,
        }
    }
}

/// The variable that names the `sandkeeper-init` program.
pub const INIT_VAR: &str = "SANDKEEPER_INIT";

/// The init's name beside the keeper's program.
const INIT_NAME: &str = "sandkeeper-init";

/// Where the `sandkeeper-init` program is: `configured` (the configuration's
/// [`init`](super::LocalConfig::init)), else [`SANDKEEPER_INIT`](INIT_VAR), else beside the
/// keeper's own program or in its parent directory (where cargo puts a package's programs
/// when the keeper is a test in `target/*/deps`). The first that names a file wins; why none
/// did otherwise. A path named is made absolute.
pub fn find_init(configured: Option<&Path>) -> Result<PathBuf, String> {
    let named = configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(INIT_VAR).map(PathBuf::from));
    if let Some(path) = named {
        // Absolute: bubblewrap runs in `/` and binds it from there.
        return match std::fs::canonicalize(&path) {
            Ok(path) if path.is_file() => Ok(path),
            _ => Err(format!("the init {} is not a file", path.display())),
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("no program path: {e}"))?;
    let beside = exe
        .parent()
        .into_iter()
        .flat_map(|dir| [Some(dir), dir.parent()])
        .flatten()
        .map(|dir| dir.join(INIT_NAME))
        .find(|p| p.is_file());
    beside.ok_or_else(|| format!("no {INIT_NAME} beside {} (nor {INIT_VAR})", exe.display()))
}

impl std::fmt::Display for Isolated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Isolated::Bubblewrap {
                program,
                network,
                mode,
            } => write!(
                f,
                "bubblewrap ({}, {}): user, pid, ipc, uts, cgroup{} namespaces, no capabilities, \
                 seccomp filter, minimal read-only root, only the sandbox writable, network {}",
                program.display(),
                match mode {
                    Mode::PerSandbox { init } => format!(
                        "one per sandbox, {} its pid 1",
                        init.display()
                    ),
                    Mode::PerCommand { why } => format!("one per command: {why}"),
                },
                if *network { "" } else { ", net" },
                if *network { "on" } else { "off" }
            ),
            Isolated::ProcessGroup { why } => write!(
                f,
                "process groups only (cleared environment; host file system and network visible): {why}"
            ),
        }
    }
}

/// `bwrap` on `PATH`, if any.
fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// Finds what `wanted` can have here: bubblewrap is tried once, with every protection and
/// limit on, on a command that reads its own `/proc/self/status`, which must show no capability,
/// `no_new_privs` and the seccomp filter. A machine where it is missing, cannot make namespaces
/// or leaves the command capabilities falls back (a warning), or fails under
/// [`Isolation::Require`] with an [`IsolationError`]. One bubblewrap per sandbox when
/// `namespaces` asks for it and the init is found (`init`, see [`find_init`]) and passes the
/// same probe, the command run through it; else one per command, saying why. The probe sees
/// the keeper's root as its workspace, at `mount` when given (see
/// [`LocalConfig::workspace_mount`](super::LocalConfig::workspace_mount)), so a mount
/// bubblewrap cannot make counts as bubblewrap not working.
pub(crate) fn detect(
    wanted: Isolation,
    network: bool,
    (namespaces, init): (Namespaces, Option<&Path>),
    (root, mount): (&Path, Option<&Path>),
    limits: &Enforcement,
) -> io::Result<Isolated> {
    if wanted == Isolation::Off {
        return Ok(Isolated::ProcessGroup {
            why: "isolation is off in the configuration".into(),
        });
    }
    let found = match find_bwrap() {
        None => Err(IsolationError::Missing),
        Some(program) => {
            let with = |mode| Isolated::Bubblewrap {
                program: program.clone(),
                network,
                mode,
            };
            let init = match namespaces {
                Namespaces::PerSandbox => find_init(init),
                Namespaces::PerCommand => Err("one per command in the configuration".into()),
            };
            let per_sandbox = init.and_then(|init| {
                probe(with(Mode::PerSandbox { init }), root, mount, limits).map_err(|e| {
                    tracing::warn!(%e, "the per-sandbox init does not work here: one bubblewrap per command");
                    format!("the per-sandbox init does not work here: {e}")
                })
            });
            per_sandbox.or_else(|why| probe(with(Mode::PerCommand { why }), root, mount, limits))
        }
    };
    match (found, wanted) {
        (Ok(isolated), _) => Ok(isolated),
        (Err(why), Isolation::Require) => Err(io::Error::new(io::ErrorKind::NotFound, why)),
        (Err(why), _) => {
            tracing::warn!(%why, "local sandboxes run without bubblewrap: commands see the host's file system and network");
            Ok(Isolated::ProcessGroup {
                why: why.to_string(),
            })
        }
    }
}

/// Runs `cat /proc/self/status` under `isolated` (the keeper's root as its workspace, seen at
/// `mount` when given; through a sandbox's init when there is one per sandbox) and checks that
/// it is contained.
fn probe(
    isolated: Isolated,
    root: &Path,
    mount: Option<&Path>,
    limits: &Enforcement,
) -> Result<Isolated, IsolationError> {
    let Isolated::Bubblewrap { program, mode, .. } = &isolated else {
        return Ok(isolated);
    };
    let broken = |why: String| IsolationError::Broken {
        program: program.clone(),
        why,
    };
    let argv = ["cat".to_string(), "/proc/self/status".to_string()];
    let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let workspace = Workspace {
        host: root,
        inside: mount.unwrap_or(root),
    };
    let (ok, stdout, stderr) = match mode {
        Mode::PerSandbox { .. } => {
            let prepared = isolated
                .init_command(limits, root, workspace)
                .map_err(|e| broken(e.to_string()))?;
            let spawn = super::wire::Spawn {
                argv: argv.to_vec(),
                env: env.to_vec(),
                cwd: workspace.inside.to_string_lossy().into_owned(),
                stdin: Vec::new(),
                window: 0,
                input: false,
            };
            let (exit, stdout, stderr) = super::sandbox_init::run_blocking(prepared, spawn)
                .map_err(|e| broken(e.to_string()))?;
            (exit.code == Some(0), stdout, stderr)
        }
        Mode::PerCommand { .. } => {
            let mut prepared = isolated
                .command(limits, root, workspace, "", &argv, &env)
                .map_err(|e| broken(e.to_string()))?;
            prepared
                .command
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let out = prepared.command.output().map_err(|e| broken(e.to_string()));
            drop(prepared.fds);
            if let Some(cgroup) = prepared.cgroup {
                cgroup.end_now();
            }
            let out = out?;
            (out.status.success(), out.stdout, out.stderr)
        }
    };
    if !ok {
        return Err(broken(String::from_utf8_lossy(&stderr).trim().to_string()));
    }
    contained(&String::from_utf8_lossy(&stdout))?;
    Ok(isolated)
}

/// Checks a `/proc/self/status` read inside the sandbox: every capability set empty,
/// `NoNewPrivs: 1`, `Seccomp: 2` (a filter), each line present.
fn contained(status: &str) -> Result<(), IsolationError> {
    let wrong: Vec<&str> = status
        .lines()
        .filter(|l| match l.split_once(':') {
            Some((k, v)) if k.starts_with("Cap") => v.trim() != "0000000000000000",
            Some(("NoNewPrivs", v)) => v.trim() != "1",
            Some(("Seccomp", v)) => v.trim() != "2",
            _ => false,
        })
        .collect();
    let seen = status
        .lines()
        .filter(|l| {
            l.starts_with("Cap") || l.starts_with("NoNewPrivs:") || l.starts_with("Seccomp:")
        })
        .count();
    if !wrong.is_empty() || seen < 7 {
        return Err(IsolationError::Leaky {
            status: if wrong.is_empty() {
                format!("its status lacks lines: {status}")
            } else {
                wrong.join("; ")
            },
        });
    }
    Ok(())
}

/// The `--ro-bind`s and `--symlink`s of the minimal root, found once: `/usr`, the top-level
/// directories that lead into it (a symlink where the host has one, else a bind), and the few
/// `/etc` files commands need.
fn system_binds() -> &'static [OsString] {
    static BINDS: OnceLock<Vec<OsString>> = OnceLock::new();
    BINDS.get_or_init(|| {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &[&str]| a.extend(s.iter().map(OsString::from));
        push(&["--ro-bind", "/usr", "/usr"]);
        for &top in LEADING {
            match std::fs::symlink_metadata(top) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(top) {
                        a.push("--symlink".into());
                        a.push(target.into_os_string());
                        a.push(top.into());
                    }
                }
                Ok(_) => {
                    a.push("--ro-bind".into());
                    a.push(top.into());
                    a.push(top.into());
                }
                Err(_) => {}
            }
        }
        for etc in ETC {
            a.push("--ro-bind-try".into());
            a.push(etc.into());
            a.push(etc.into());
        }
        a
    })
}

/// Whether the minimal root ([`system_binds`]) would show `path`: it lies under a directory
/// bound from the host.
fn shown_by_system_binds(path: &Path) -> bool {
    std::iter::once(&"/usr")
        .chain(LEADING)
        .chain(ETC)
        .any(|bound| path.starts_with(bound))
}

/// The top-level directories that lead into `/usr`, bound (or linked) where the host has them.
pub(super) const LEADING: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// The `/etc` files and directories a sandbox sees (where the host has them).
const ETC: &[&str] = &[
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/alternatives",
];

/// A command ready to spawn, with what must live until it was spawned and ended.
pub(crate) struct Prepared {
    /// The command (bubblewrap, or the program itself), environment and descriptors set.
    pub(crate) command: std::process::Command,
    /// Descriptors the spawned process takes (the filter's pipe): dropped after spawning.
    pub(crate) fds: Vec<OwnedFd>,
    /// The command's own cgroup, where the keeper makes them: ended after the command.
    pub(crate) cgroup: Option<CommandCgroup>,
    /// Without bubblewrap and without a cgroup: the mark in its processes' environment that
    /// finds whatever it started (see [`kill_marked`]).
    pub(crate) mark: Option<String>,
}

/// The variable that marks an exec's processes when nothing else can find them.
const MARK: &str = "SANDKEEPER_EXEC";

/// A sandbox's workspace: its directory on the host, and the path its commands see it at (the
/// same path, unless a [`workspace_mount`](super::LocalConfig::workspace_mount) names another;
/// only bubblewrap can show it elsewhere). Everything handed into the sandbox (the working
/// directory, `HOME`, `PWD`) is a path `inside`; everything the keeper itself touches is a path
/// on the `host`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workspace<'a> {
    /// The sandbox's directory on the host.
    pub(crate) host: &'a Path,
    /// Where its commands see it.
    pub(crate) inside: &'a Path,
}

impl Workspace<'_> {
    /// The host path of `rel`, a path relative to the workspace (`""` or `"."`: the
    /// workspace itself).
    pub(crate) fn host_path(&self, rel: &str) -> PathBuf {
        under(self.host, rel)
    }

    /// The path commands see `rel` at, `rel` relative to the workspace (`""` or `"."`: the
    /// workspace itself).
    pub(crate) fn inside_path(&self, rel: &str) -> PathBuf {
        under(self.inside, rel)
    }

    /// The host path of `seen`, an absolute path as commands see it, when it is the workspace
    /// or in it; `None` for any other path.
    pub(crate) fn host_of(&self, seen: &Path) -> Option<PathBuf> {
        let rel = seen.strip_prefix(self.inside).ok()?;
        Some(under(self.host, &rel.to_string_lossy()))
    }
}

/// `base`, joined with `rel` unless that names `base` itself (no trailing `/`: the path is
/// also a command's `PWD`).
fn under(base: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() || rel == "." {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

impl Isolated {
    /// The command that runs `argv` in `cwd` (relative to the workspace: `""` for the
    /// workspace itself) of the sandbox `workspace` under the keeper's `root`, with exactly the
    /// variables `env` (the host's never reach it, nor bubblewrap). Without bubblewrap it runs
    /// at the workspace's host path (there is then no other: `LocalBackend::new` refuses a
    /// workspace mount without bubblewrap).
    pub(crate) fn command(
        &self,
        limits: &Enforcement,
        root: &Path,
        workspace: Workspace<'_>,
        cwd: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> io::Result<Prepared> {
        let cgroup = limits.cgroup()?;
        let mut wrapped: Vec<String> = limits.prlimit_argv();
        wrapped.extend(argv.iter().cloned());
        let mut fds = Vec::new();
        let mut mark = None;
        let (mut command, keep) = match self {
            Isolated::ProcessGroup { .. } => {
                let (program, args) = wrapped.split_first().expect("checked non-empty");
                let mut c = std::process::Command::new(program);
                c.args(args)
                    .env_clear()
                    .current_dir(workspace.host_path(cwd));
                c.envs(env.iter().map(|(k, v)| (k, v)));
                if cgroup.is_none() {
                    static NEXT: AtomicU64 = AtomicU64::new(0);
                    let m = format!(
                        "{}-{}",
                        std::process::id(),
                        NEXT.fetch_add(1, Ordering::Relaxed)
                    );
                    c.env(MARK, &m);
                    mark = Some(m);
                }
                (c, None)
            }
            Isolated::Bubblewrap {
                program: bwrap,
                network,
                ..
            } => {
                let (read, keep) = seccomp_fd()?;
                fds.push(read);
                let mut a = bwrap_args(limits, root, workspace, *network, &[]);
                for (k, v) in env {
                    a.extend(["--setenv".into(), k.into(), v.into()]);
                }
                a.extend([
                    "--seccomp".into(),
                    keep.to_string().into(),
                    "--chdir".into(),
                ]);
                a.push(workspace.inside_path(cwd).into());
                a.push("--".into());
                a.extend(wrapped.iter().map(OsString::from));
                let mut c = std::process::Command::new(bwrap);
                // Nothing of the keeper's or the request's environment reaches bubblewrap,
                // which runs on the host side before any namespace exists.
                c.args(a).env_clear().current_dir("/");
                (c, Some(keep))
            }
        };
        let procs: Vec<RawFd> = cgroup
            .iter()
            .flat_map(|c| c.procs.iter().map(AsRawFd::as_raw_fd))
            .collect();
        before_exec(&mut command, keep, procs, limits.rlimits());
        Ok(Prepared {
            command,
            fds,
            cgroup,
            mark,
        })
    }
}

/// Where a sandbox's init is bound, read-only, inside its namespaces.
pub(super) const INIT_INSIDE: &str = "/sandkeeper-init";

impl Isolated {
    /// The bubblewrap of the sandbox `workspace` under the keeper's `root` with its init as
    /// PID 1 (one bubblewrap per sandbox), started in the workspace as its commands see it:
    /// every protection of [`command`](Self::command), the limits (rlimits, `prlimit`, a
    /// cgroup) for the whole sandbox, and no variable at all (each command's come over the
    /// init's pipe, never on a command line). An error unless there is one bubblewrap per
    /// sandbox.
    pub(crate) fn init_command(
        &self,
        limits: &Enforcement,
        root: &Path,
        workspace: Workspace<'_>,
    ) -> io::Result<Prepared> {
        let Isolated::Bubblewrap {
            program: bwrap,
            network,
            mode: Mode::PerSandbox { init },
        } = self
        else {
            return Err(io::Error::other("no per-sandbox init here"));
        };
        let cgroup = limits.cgroup()?;
        let (read, keep) = seccomp_fd()?;
        let bind: [OsString; 3] = ["--ro-bind".into(), init.into(), INIT_INSIDE.into()];
        let mut a = bwrap_args(limits, root, workspace, *network, &bind);
        a.extend([
            "--as-pid-1".into(),
            "--seccomp".into(),
            keep.to_string().into(),
        ]);
        a.extend(["--chdir".into(), workspace.inside.into(), "--".into()]);
        a.extend(limits.prlimit_argv().into_iter().map(OsString::from));
        a.push(INIT_INSIDE.into());
        let mut command = std::process::Command::new(bwrap);
        command.args(a).env_clear().current_dir("/");
        let procs: Vec<RawFd> = cgroup
            .iter()
            .flat_map(|c| c.procs.iter().map(AsRawFd::as_raw_fd))
            .collect();
        before_exec(&mut command, Some(keep), procs, limits.rlimits());
        Ok(Prepared {
            command,
            fds: vec![read],
            cgroup,
            mark: None,
        })
    }
}

/// A pipe holding the seccomp filter, its read end at 3 or above: the descriptor bubblewrap
/// reads it from, and its number.
fn seccomp_fd() -> io::Result<(OwnedFd, RawFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // A keeper that closed its standard input or output would get 0, 1 or 2 here, which the
    // child's standard streams replace: moved to 3 or above.
    let read = if read.as_raw_fd() < 3 {
        rustix::io::fcntl_dupfd_cloexec(&read, 3)?
    } else {
        read
    };
    // The filter is far smaller than a pipe's buffer: this does not block.
    std::fs::File::from(write).write_all(seccomp_program())?;
    let fd = read.as_raw_fd();
    Ok((read, fd))
}

/// Bubblewrap's arguments for the sandbox `workspace` under `root`, up to the variables, the
/// filter, the working directory and the program: the minimal root, `/dev`, `/proc`, `/tmp`,
/// the workspace bound writable where its commands see it, `binds` (made before the root
/// turns read-only), the namespaces, no capabilities, a session of its own, death with its
/// parent, no variable.
///
/// The keeper's root is hidden under an empty `tmpfs` when the workspace is bound at its own
/// host path (which lies in the root). Bound elsewhere, nothing of the root is bound at all; it
/// is hidden only where the minimal root would show it (a root under `/usr`, say), so a
/// command does not even see its name.
fn bwrap_args(
    limits: &Enforcement,
    root: &Path,
    workspace: Workspace<'_>,
    network: bool,
    binds: &[OsString],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = system_binds().to_vec();
    let mut push = |s: &dyn AsRef<std::ffi::OsStr>| a.push(s.as_ref().to_owned());
    for s in ["--dev", "/dev", "--proc", "/proc"] {
        push(&s);
    }
    if let Some(n) = limits.limits.tmp_bytes {
        push(&"--size");
        push(&n.to_string());
    }
    for s in ["--tmpfs", "/tmp"] {
        push(&s);
    }
    if workspace.inside == workspace.host || shown_by_system_binds(root) {
        push(&"--tmpfs");
        push(&root);
    }
    push(&"--bind");
    push(&workspace.host);
    push(&workspace.inside);
    for s in binds {
        push(s);
    }
    for s in [
        "--remount-ro",
        "/",
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
        "--new-session",
        "--die-with-parent",
        "--clearenv",
    ] {
        push(&s);
    }
    if !network {
        push(&"--unshare-net");
    }
    a
}

use std::io::Write as _;

/// The seccomp filter's bytes, made once.
fn seccomp_program() -> &'static [u8] {
    static PROGRAM: OnceLock<Vec<u8>> = OnceLock::new();
    PROGRAM.get_or_init(super::seccomp::program)
}

/// Sets what the spawned process does between fork and exec: joins the command's cgroups
/// (writes `0` into each `cgroup.procs` in `procs`), sets the `rlimits`, makes every descriptor from 3 up
/// close-on-exec (so nothing the keeper holds reaches the command, whether or not it was opened
/// close-on-exec), then clears close-on-exec on `keep` alone (the filter's pipe, which
/// bubblewrap reads), and starts a session of its own (which also leaves it a process group of
/// its own).
///
/// The one `unsafe` of the crate: `pre_exec` is unsafe because the closure runs in the child
/// of a `fork` of a multi-threaded process, where only async-signal-safe calls are allowed. This
/// one makes only raw system calls (`write`, `setrlimit`, `close_range`, `fcntl`, `setsid`) on values
/// computed before the fork, allocates nothing and takes no lock. Doing it before exec is the
/// only way: descriptors and cgroup membership must be right before bubblewrap runs anything,
/// and a leaked descriptor can only be closed in the process that has it.
#[allow(unsafe_code)]
fn before_exec(
    command: &mut std::process::Command,
    keep: Option<RawFd>,
    procs: Vec<RawFd>,
    rlimits: Vec<(super::limits::Resource, u64)>,
) {
    use std::os::unix::process::CommandExt;
    let hook = move || -> io::Result<()> {
        let check = |r: libc::c_long| {
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: plain system calls on descriptors this closure owns copies of (valid until
        // the parent drops them after spawning) and on a static buffer.
        unsafe {
            for &fd in &procs {
                check(libc::write(fd, b"0".as_ptr().cast(), 1) as libc::c_long)?;
            }
            for &(resource, n) in &rlimits {
                let limit = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                check(libc::setrlimit(resource, &limit) as libc::c_long)?;
            }
            check(libc::setsid() as libc::c_long)?;
            let all = libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if all != 0 {
                // Before Linux 5.11: one by one, up to the descriptor limit's usual size.
                for fd in 3..65536 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            if let Some(fd) = keep {
                check(libc::fcntl(fd, libc::F_SETFD, 0) as libc::c_long)?;
            }
        }
        Ok(())
    };
    // SAFETY: see above; the hook is async-signal-safe.
    unsafe {
        command.pre_exec(hook);
    }
}

/// Kills every process whose environment carries `mark` (an exec's processes without a cgroup
/// or namespace to find them by, however they left its process group and session), in bounded
/// rounds. A process that cleared its environment is not found: without bubblewrap or cgroups
/// nothing else names it. Each round reads `/proc` on a blocking thread, never on the runtime's.
pub(crate) async fn kill_marked(mark: &str) {
    let needle = format!("{MARK}={mark}\0").into_bytes();
    let needle = std::sync::Arc::new(needle);
    for round in 0..50 {
        let n = needle.clone();
        let found = tokio::task::spawn_blocking(move || kill_round(&n))
            .await
            .unwrap_or(0);
        if found == 0 {
            return;
        }
        if round >= 10 {
            // Reaping is the parents' and init's: a short bounded wait for it.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// One round of [`kill_marked`]: kills every process whose environment holds `needle`, and
/// says how many it signalled. Blocks (reads `/proc`).
fn kill_round(needle: &[u8]) -> usize {
    let mut found = 0;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.windows(needle.len()).any(|w| w == needle) {
            // A zombie keeps its environment readable only while it lives; one that is dying
            // already counts once more, harmlessly.
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                if rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok() {
                    found += 1;
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELD: &str = "Name:\tcat\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
        CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n\
        NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";

    #[test]
    fn an_init_named_is_taken_absolute_or_refused() {
        let file = std::env::temp_dir().join(format!("sk-init-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let found = find_init(Some(
            &std::env::temp_dir()
                .join(".")
                .join(file.file_name().unwrap()),
        ));
        assert_eq!(found, Ok(std::fs::canonicalize(&file).unwrap()));
        std::fs::remove_file(&file).unwrap();
        assert!(find_init(Some(&file)).is_err(), "gone");
        assert!(
            find_init(Some(&std::env::temp_dir())).is_err(),
            "a directory"
        );
    }

    #[test]
    fn the_probe_accepts_only_a_contained_status() {
        assert!(contained(HELD).is_ok());
        // What a root command had before issue 31: every capability.
        let root = HELD.replace("CapEff:\t0000000000000000", "CapEff:\t000001fffeffffff");
        assert!(
            matches!(contained(&root), Err(IsolationError::Leaky { status }) if status.contains("CapEff"))
        );
        let no_filter = HELD.replace("Seccomp:\t2", "Seccomp:\t0");
        assert!(contained(&no_filter).is_err());
        let privs = HELD.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0");
        assert!(contained(&privs).is_err());
        assert!(contained("Name:\tcat\n").is_err(), "lines missing");
    }
}
