//! E2B paths and the workspace's. An E2B sandbox's user works in `/home/user`; here that
//! directory is the keeper sandbox's workspace. So `/home/user/a.txt` and `a.txt` are the
//! workspace's `a.txt`, `/home/user` is its root, and any other absolute path is refused (the
//! local backend has nothing else to show).

use sandkeeper_tokio::WorkPath;

use crate::error::{Code, ConnectError};

/// The user's home in E2B's base template: the workspace here.
pub const HOME: &str = "/home/user";

/// The workspace path of an E2B path (validated: no `..`, no `//`, no NUL).
pub fn to_work(path: &str) -> Result<WorkPath, ConnectError> {
    let rel = if path == HOME || path == "~" || path == "./" || path.is_empty() {
        "."
    } else if let Some(rest) = path.strip_prefix(HOME).and_then(|r| r.strip_prefix('/')) {
        if rest.is_empty() {
            "."
        } else {
            rest
        }
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest
    } else if path.starts_with('/') {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!(
                "{}: only {HOME} (the sandbox's workspace) and paths under it exist here",
                crate::error::shown(path)
            ),
        ));
    } else {
        path
    };
    WorkPath::new(rel).map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))
}

/// The E2B path of a workspace path.
pub fn to_e2b(path: &WorkPath) -> String {
    if path.is_root() {
        HOME.to_string()
    } else {
        format!("{HOME}/{}", path.as_str())
    }
}

/// The workspace path of `name` in `dir`.
pub fn join(dir: &WorkPath, name: &str) -> Result<WorkPath, ConnectError> {
    let joined = if dir.is_root() {
        name.to_string()
    } else {
        format!("{}/{name}", dir.as_str())
    };
    WorkPath::new(joined).map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))
}

/// The parent directory and last name of a path (`None` for the root).
pub fn split(path: &WorkPath) -> Option<(WorkPath, String)> {
    if path.is_root() {
        return None;
    }
    let (dir, name) = match path.as_str().rsplit_once('/') {
        Some((dir, name)) => (WorkPath::new(dir).ok()?, name),
        None => (WorkPath::root(), path.as_str()),
    };
    Some((dir, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_is_the_workspace_and_nothing_else_is_reachable() {
        assert!(to_work("/home/user").unwrap().is_root());
        assert!(to_work("/home/user/").unwrap().is_root());
        assert_eq!(to_work("/home/user/a/b.txt").unwrap().as_str(), "a/b.txt");
        assert_eq!(to_work("a.txt").unwrap().as_str(), "a.txt");
        assert_eq!(to_work("~/x").unwrap().as_str(), "x");
        for bad in [
            "/etc/passwd",
            "/home/userx",
            "/home/user/../x",
            "a//b",
            "/home/user/a\0",
        ] {
            assert!(to_work(bad).is_err(), "{bad:?}");
        }
        assert_eq!(to_e2b(&to_work("a/b").unwrap()), "/home/user/a/b");
        let (dir, name) = split(&to_work("a/b").unwrap()).unwrap();
        assert_eq!((dir.as_str(), name.as_str()), ("a", "b"));
        assert!(split(&WorkPath::root()).is_none());
    }
}
