//! How far a local sandbox's commands are kept apart from the host.
//!
//! With bubblewrap (`bwrap`, the Debian package `bubblewrap`) present and working, a command
//! runs in new PID, IPC, UTS and (unless the network is enabled) network namespaces; the whole
//! host file system is mounted read-only, the keeper's root directory is hidden under an empty
//! `tmpfs` (no other sandbox and no snapshot is visible), and only the sandbox's own directory
//! is mounted back, writable; `/tmp` is a fresh `tmpfs`, `/dev` and `/proc` are minimal. The
//! namespace dies with bubblewrap (`--die-with-parent`), so killing its process group kills
//! everything the command started.
//!
//! Without it, a command still gets a cleared environment and its own process group, but runs
//! as the keeper's user with the host's file system and network: the keeper says so at start
//! (a warning) and in [`Isolated`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};

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

/// The isolation a [`LocalBackend`](super::LocalBackend) runs commands under, found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolated {
    /// Inside bubblewrap (see the module docs).
    Bubblewrap {
        /// The `bwrap` program.
        program: PathBuf,
        /// Whether commands reach the network.
        network: bool,
    },
    /// A cleared environment and a process group; no namespaces.
    ProcessGroup {
        /// Why not bubblewrap.
        why: String,
    },
}

impl Isolated {
    /// Whether commands run inside bubblewrap.
    pub fn is_bubblewrap(&self) -> bool {
        matches!(self, Isolated::Bubblewrap { .. })
    }
}

impl std::fmt::Display for Isolated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Isolated::Bubblewrap { program, network } => write!(
                f,
                "bubblewrap ({}): namespaces, read-only host, only the sandbox writable, network {}",
                program.display(),
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

/// Finds what `wanted` can have here: bubblewrap is tried once (a command that must run) so a
/// machine where it is installed but cannot make namespaces falls back, or fails under
/// [`Isolation::Require`].
pub(crate) fn detect(wanted: Isolation, network: bool) -> std::io::Result<Isolated> {
    if wanted == Isolation::Off {
        return Ok(Isolated::ProcessGroup {
            why: "isolation is off in the configuration".into(),
        });
    }
    let found = match find_bwrap() {
        None => Err("bwrap is not installed (Debian: apt-get install bubblewrap)".to_string()),
        Some(program) => {
            let probe = std::process::Command::new(&program)
                .args(["--ro-bind", "/", "/", "--unshare-pid", "--die-with-parent"])
                .args((!network).then_some("--unshare-net"))
                .arg("true")
                .env_clear()
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .output();
            match probe {
                Ok(out) if out.status.success() => Ok(Isolated::Bubblewrap { program, network }),
                Ok(out) => Err(format!(
                    "{} does not work here: {}",
                    program.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => Err(format!("{} does not run: {e}", program.display())),
            }
        }
    };
    match (found, wanted) {
        (Ok(isolated), _) => Ok(isolated),
        (Err(why), Isolation::Require) => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("isolation Require: {why}"),
        )),
        (Err(why), _) => {
            tracing::warn!(%why, "local sandboxes run without bubblewrap: commands see the host's file system and network");
            Ok(Isolated::ProcessGroup { why })
        }
    }
}

impl Isolated {
    /// The program and arguments that run `argv` in `cwd` of the sandbox at `dir` under the
    /// keeper's `root`.
    pub(crate) fn argv(
        &self,
        root: &Path,
        dir: &Path,
        cwd: &Path,
        argv: &[String],
    ) -> (OsString, Vec<OsString>) {
        let (program, args) = argv.split_first().expect("checked non-empty");
        match self {
            Isolated::ProcessGroup { .. } => {
                (program.into(), args.iter().map(OsString::from).collect())
            }
            Isolated::Bubblewrap {
                program: bwrap,
                network,
            } => {
                let mut a: Vec<OsString> = Vec::new();
                let mut push = |s: &dyn AsRef<std::ffi::OsStr>| a.push(s.as_ref().to_owned());
                for s in [
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                ] {
                    push(&s);
                }
                push(&"--tmpfs");
                push(&root);
                push(&"--bind");
                push(&dir);
                push(&dir);
                for s in [
                    "--unshare-pid",
                    "--unshare-ipc",
                    "--unshare-uts",
                    "--die-with-parent",
                ] {
                    push(&s);
                }
                if !network {
                    push(&"--unshare-net");
                }
                push(&"--chdir");
                push(&cwd);
                push(&"--");
                push(program);
                for s in args {
                    push(s);
                }
                (bwrap.clone().into_os_string(), a)
            }
        }
    }
}
