//! Where a sandbox's commands see its workspace: at its host path (the default), or at one
//! fixed path such as `/home/user` ([`LocalConfig::workspace_mount`](super::LocalConfig)),
//! the same for every sandbox, which tools written for a hosted sandbox expect.
//!
//! Only bubblewrap can show the workspace at another path (it binds the workspace there in the
//! sandbox's own mount namespace, `isolation.rs`); without it a command sees the host's file
//! system, where the path is not the workspace. So a mount is refused, at construction, where
//! commands will not run under bubblewrap: a command never runs at the host path while the
//! application was told it would see the mount.
//!
//! This module owns the check of the path itself ([`check`]): it must be somewhere bubblewrap
//! can make a mount point of its own, never over what the minimal root shows.

use std::path::{Component, Path, PathBuf};

use super::isolation::{INIT_INSIDE, LEADING};

/// Why a [`LocalConfig::workspace_mount`](super::LocalConfig::workspace_mount) is refused
/// ([`LocalBackend::new`](super::LocalBackend::new) fails with it, inside its `io::Error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceMountError {
    /// The path is relative: commands would see the workspace wherever they started.
    #[error("the workspace mount {0} is not an absolute path")]
    NotAbsolute(PathBuf),
    /// The path is not in its plain form (`.`, `..`, `//` or a trailing `/` in it), or not
    /// UTF-8 (commands get it in `HOME` and `PWD`, which are UTF-8 here).
    #[error(
        "the workspace mount {0} is not a plain path (no `.`, `..`, `//`, trailing `/`; UTF-8)"
    )]
    NotNormal(PathBuf),
    /// The path is `/`: the workspace would hide everything the sandbox needs.
    #[error("the workspace mount cannot be /")]
    Root,
    /// The path is, or is under, one the sandbox's minimal root binds or makes itself
    /// (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, `/proc`, `/dev`, `/tmp`, the init's).
    #[error("the workspace mount {path} is at or under {system}, which the sandbox needs")]
    SystemPath {
        /// The path asked for.
        path: PathBuf,
        /// The system path it would cover or land in.
        system: &'static str,
    },
    /// Commands here will not run under bubblewrap (isolation is off, or it does not work
    /// here), and nothing else can show the workspace at another path.
    #[error(
        "the workspace mount {path} needs bubblewrap, and commands here run without it ({why}); \
         leave the workspace mount unset to run them at the workspace's host path"
    )]
    NotIsolated {
        /// The path asked for.
        path: PathBuf,
        /// Why commands run without bubblewrap.
        why: String,
    },
}

/// The paths the minimal root binds or makes, besides [`LEADING`]: a workspace is mounted at
/// none of them nor under them.
const MADE: &[&str] = &["/usr", "/etc", "/proc", "/dev", "/tmp", INIT_INSIDE];

/// Checks that `path` can be where commands see their workspace: absolute, plain, not `/`,
/// and clear of every system path (see [`WorkspaceMountError`]).
pub(crate) fn check(path: &Path) -> Result<(), WorkspaceMountError> {
    if !path.is_absolute() {
        return Err(WorkspaceMountError::NotAbsolute(path.to_path_buf()));
    }
    // `Path::components` drops a `.` inside, a repeated `/` and a trailing `/`: the plain form
    // is the one rebuilt from its components, with nothing but names after the root.
    let plain: PathBuf = path.components().collect();
    let names = path
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)));
    if !names || plain.as_os_str() != path.as_os_str() || path.to_str().is_none() {
        return Err(WorkspaceMountError::NotNormal(path.to_path_buf()));
    }
    if path == Path::new("/") {
        return Err(WorkspaceMountError::Root);
    }
    match MADE
        .iter()
        .chain(LEADING)
        .find(|system| path.starts_with(system))
    {
        Some(system) => Err(WorkspaceMountError::SystemPath {
            path: path.to_path_buf(),
            system,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_path_clear_of_the_system_is_taken() {
        for good in ["/home/user", "/workspace", "/home", "/srv/a/b", "/library"] {
            assert_eq!(check(Path::new(good)), Ok(()), "{good}");
        }
    }

    #[test]
    fn a_relative_unplain_root_or_system_path_is_refused() {
        let refused = |p: &str| check(Path::new(p)).unwrap_err();
        assert!(matches!(
            refused("home/user"),
            WorkspaceMountError::NotAbsolute(_)
        ));
        for unplain in [
            "/home/user/",
            "/home//user",
            "/home/./user",
            "/home/../user",
        ] {
            assert!(
                matches!(refused(unplain), WorkspaceMountError::NotNormal(_)),
                "{unplain}"
            );
        }
        assert_eq!(refused("/"), WorkspaceMountError::Root);
        for (path, system) in [
            ("/usr", "/usr"),
            ("/usr/local/ws", "/usr"),
            ("/bin", "/bin"),
            ("/lib64", "/lib64"),
            ("/etc/ws", "/etc"),
            ("/proc", "/proc"),
            ("/dev", "/dev"),
            ("/tmp/ws", "/tmp"),
            ("/sandkeeper-init", "/sandkeeper-init"),
        ] {
            assert_eq!(
                refused(path),
                WorkspaceMountError::SystemPath {
                    path: path.into(),
                    system
                },
                "{path}"
            );
        }
    }
}
