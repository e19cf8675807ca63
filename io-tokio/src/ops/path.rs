//! Paths inside a sandbox's workspace, validated before anything touches the sandbox.

use super::OpError;

/// The most bytes of a path.
pub const MAX_PATH_LEN: usize = 4096;

/// The keeper's own directory in a workspace (the mirror's files); the application may read
/// it, never write or remove in it: by name ([`WorkPath::writable`]), nor through a link to it
/// (a backend never follows a link in a path: [`OpError::Escapes`]).
pub const KEEPER_DIR: &str = ".sandkeeper";

/// A path relative to a sandbox's workspace: components separated by `/`, none empty, `.`,
/// `..`, or holding a NUL; never absolute. `.` alone (or [`WorkPath::root`]) is the workspace
/// itself. Built only by [`WorkPath::new`], so a held value is always valid. Symlinks are the
/// backend's to refuse: the local backend never goes through one ([`OpError::Escapes`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkPath(String);

impl WorkPath {
    /// Validates `path`.
    pub fn new(path: impl AsRef<str>) -> Result<Self, OpError> {
        let path = path.as_ref();
        let bad = |why| OpError::InvalidPath {
            path: path.chars().take(256).collect(),
            why,
        };
        if path == "." {
            return Ok(Self::root());
        }
        if path.is_empty() {
            return Err(bad("empty"));
        }
        if path.len() > MAX_PATH_LEN {
            return Err(bad("longer than 4096 bytes"));
        }
        if path.contains('\0') {
            return Err(bad("holds a NUL byte"));
        }
        if path.starts_with('/') {
            return Err(bad("absolute: paths are relative to the workspace"));
        }
        let trimmed = path.strip_suffix('/').unwrap_or(path);
        for part in trimmed.split('/') {
            match part {
                "" => return Err(bad("an empty component (`//`)")),
                "." => return Err(bad("a `.` component")),
                ".." => return Err(bad("a `..` component")),
                p if p.len() > 255 => return Err(bad("a component longer than 255 bytes")),
                _ => {}
            }
        }
        Ok(WorkPath(trimmed.to_string()))
    }

    /// The workspace itself.
    pub fn root() -> Self {
        WorkPath(".".into())
    }

    /// Whether this is the workspace itself.
    pub fn is_root(&self) -> bool {
        self.0 == "."
    }

    /// The path as a string (`.` for the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it is in (or is) the keeper's own directory.
    pub fn is_keepers(&self) -> bool {
        self.0.split('/').next() == Some(KEEPER_DIR)
    }

    /// Refuses the root and the keeper's directory, which work may not change (every
    /// backend checks it before a write or a remove).
    pub fn writable(&self) -> Result<(), OpError> {
        let bad = |why| OpError::InvalidPath {
            path: self.0.clone(),
            why,
        };
        if self.is_root() {
            return Err(bad("the workspace itself"));
        }
        if self.is_keepers() {
            return Err(bad("in the keeper's own directory (.sandkeeper)"));
        }
        Ok(())
    }
}

impl std::fmt::Display for WorkPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_relative_plain_paths_are_taken() {
        for ok in ["a", "a/b", "a/b/", "dir/.hidden", "x..y", "é/ü"] {
            assert!(WorkPath::new(ok).is_ok(), "{ok:?}");
        }
        assert_eq!(WorkPath::new("a/b/").unwrap().as_str(), "a/b");
        assert!(WorkPath::new(".").unwrap().is_root());
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "a/../b",
            "a/./b",
            "a//b",
            "a\0b",
            "./a",
            "../x",
        ] {
            assert!(
                matches!(WorkPath::new(bad), Err(OpError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
        assert!(WorkPath::new("x".repeat(256)).is_err());
        assert!(WorkPath::new(format!("{}/", "a/".repeat(2100))).is_err());
    }

    #[test]
    fn the_root_and_the_keepers_directory_are_not_writable() {
        assert!(WorkPath::root().writable().is_err());
        assert!(WorkPath::new(".sandkeeper/s/log")
            .unwrap()
            .writable()
            .is_err());
        assert!(WorkPath::new(".sandkeeper").unwrap().writable().is_err());
        assert!(WorkPath::new(".sandkeeperx/a").unwrap().writable().is_ok());
        assert!(WorkPath::new("a/.sandkeeper").unwrap().writable().is_ok());
    }
}
