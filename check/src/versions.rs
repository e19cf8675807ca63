//! The numbering and settlement of one path's versions.
//!
//! Every `flush` of a session's path hands out the next version (1, 2, 3, ...); every version
//! handed out settles exactly once (uploaded, superseded or dropped); uploads are ordered and
//! land in increasing order; a version is superseded only by a newer one that was handed out.
//!
//! | check | what must hold |
//! |---|---|
//! | `versions-numbered` | a flush returns the path's next version; it starts again at 1 only when every version of the session has settled (the core may forget an idle session's record, and with it the numbering) |
//! | `settle-once` | a version settles once, and only one handed out; no Upload is ordered for a version that settled or was never handed out |
//! | `versions-increase` | per path, Uploads are ordered with non-decreasing versions (a retry repeats its version) and versions settle `Uploaded` in increasing order |
//! | `superseded-by-newer` | `Superseded { by }` names a newer version of the path that was handed out |
//! | `liveness-settled` | at the end, every version handed out has settled |
//!
//! The unsettled versions of a path are a short vector: a path has a few versions open at once,
//! and the buffer stays with the path, so a flush allocates nothing once the path was used.

use rustc_hash::FxHashMap;
use sandkeeper::{PathName, SessionId, Settlement};

use crate::violation::Violation;

/// The versions of one path. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct PathVersions {
    /// The last version handed out.
    last: u64,
    /// Handed out and not settled.
    unsettled: Vec<u64>,
    /// The newest version ordered uploaded.
    last_ordered: u64,
    /// The newest version settled `Uploaded`.
    last_uploaded: u64,
}

impl PathVersions {
    /// A flush of `session`'s `path` returned `version`. `session_settled` answers whether every
    /// version of the session (all its paths) has settled; it is asked only when the numbering
    /// starts again.
    pub fn flushed(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        session_settled: impl FnOnce() -> bool,
    ) -> Result<(), Violation> {
        let next = self.last + 1;
        let ok = if version == next {
            true
        } else if version == 1 && self.unsettled.is_empty() && session_settled() {
            self.last_ordered = 0;
            self.last_uploaded = 0;
            true
        } else {
            false
        };
        self.last = version;
        let fresh = !self.unsettled.contains(&version);
        if fresh {
            self.unsettled.push(version);
        }
        if ok && fresh {
            Ok(())
        } else {
            Err(Violation::new(
                "versions-numbered",
                format!("flush of {session}/{path} returned v{version}, expected v{next}"),
            ))
        }
    }

    /// An Upload of `version` was ordered (a first attempt or a retry).
    pub fn ordered(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
    ) -> Result<(), Violation> {
        let last = self.last_ordered;
        self.last_ordered = last.max(version);
        if version < last {
            return Err(Violation::new(
                "versions-increase",
                format!("Upload of {session}/{path} v{version} after v{last}"),
            ));
        }
        if !self.unsettled.contains(&version) {
            return Err(Violation::new(
                "settle-once",
                format!(
                    "Upload of {session}/{path} v{version}, which settled or was never handed out"
                ),
            ));
        }
        Ok(())
    }

    /// `version` settled with `outcome`.
    pub fn settled(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        outcome: &Settlement,
    ) -> Result<(), Violation> {
        let was = match self.unsettled.iter().position(|v| *v == version) {
            Some(i) => {
                self.unsettled.swap_remove(i);
                true
            }
            None => false,
        };
        if !was {
            return Err(Violation::new(
                "settle-once",
                format!("{session}/{path} v{version} settled twice or was never handed out"),
            ));
        }
        match outcome {
            Settlement::Uploaded { sandbox } => {
                let last = self.last_uploaded;
                self.last_uploaded = last.max(version);
                if version <= last {
                    return Err(Violation::new(
                        "versions-increase",
                        format!(
                            "{session}/{path} v{version} uploaded into {sandbox} after v{last}"
                        ),
                    ));
                }
            }
            Settlement::Superseded { by } => {
                if by.0 <= version || by.0 > self.last {
                    return Err(Violation::new(
                        "superseded-by-newer",
                        format!(
                            "{session}/{path} v{version} superseded by {by} (last handed out v{})",
                            self.last
                        ),
                    ));
                }
            }
            Settlement::Dropped { .. } => {}
        }
        Ok(())
    }

    /// Whether `version` was handed out and has not settled.
    pub fn is_unsettled(&self, version: u64) -> bool {
        self.unsettled.contains(&version)
    }

    /// The versions handed out and not settled, in no particular order.
    pub fn unsettled(&self) -> &[u64] {
        &self.unsettled
    }

    /// The last version handed out.
    pub fn last(&self) -> u64 {
        self.last
    }
}

/// The versions of every path, for a user that keeps no record of its own per path: per
/// session, its paths in the order first flushed (a session has a few), so a lookup hashes the
/// session's name once and borrows both names, and what concerns one session looks at its
/// paths only.
#[derive(Clone, Debug, Default)]
pub struct Versions {
    sessions: FxHashMap<SessionId, Vec<(PathName, PathVersions)>>,
}

impl Versions {
    /// An empty table.
    pub fn new() -> Self {
        Versions::default()
    }

    /// A flush of `session`'s `path` returned `version`. See [`PathVersions::flushed`]; whether
    /// the whole session has settled is read from its other paths.
    pub fn flushed(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
    ) -> Result<(), Violation> {
        let paths = self.paths_mut(session);
        let i = Self::slot(paths, path);
        let settled =
            |paths: &[(PathName, PathVersions)]| paths.iter().all(|(_, p)| p.unsettled.is_empty());
        let session_settled = version == 1 && paths[i].1.last > 0 && settled(paths);
        paths[i]
            .1
            .flushed(session, path, version, || session_settled)
    }

    /// An Upload of `version` was ordered. See [`PathVersions::ordered`].
    pub fn ordered(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
    ) -> Result<(), Violation> {
        self.path_mut(session, path).ordered(session, path, version)
    }

    /// `version` settled. See [`PathVersions::settled`].
    pub fn settled(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        outcome: &Settlement,
    ) -> Result<(), Violation> {
        self.path_mut(session, path)
            .settled(session, path, version, outcome)
    }

    fn paths_mut(&mut self, session: &SessionId) -> &mut Vec<(PathName, PathVersions)> {
        // A name is an inline string: the clone for a new entry is a copy.
        self.sessions.entry(session.clone()).or_default()
    }

    fn slot(paths: &mut Vec<(PathName, PathVersions)>, path: &PathName) -> usize {
        match paths.iter().position(|(p, _)| p == path) {
            Some(i) => i,
            None => {
                paths.push((path.clone(), PathVersions::default()));
                paths.len() - 1
            }
        }
    }

    /// The record of `session`'s `path`, made when new.
    pub fn path_mut(&mut self, session: &SessionId, path: &PathName) -> &mut PathVersions {
        let paths = self.paths_mut(session);
        let i = Self::slot(paths, path);
        &mut paths[i].1
    }

    /// The record of `session`'s `path`, if it was named.
    pub fn get(&self, session: &SessionId, path: &PathName) -> Option<&PathVersions> {
        self.sessions
            .get(session)?
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v)
    }

    /// Whether some version of `session` has not settled.
    pub fn session_unsettled(&self, session: &SessionId) -> bool {
        self.first_unsettled_of(session).is_some()
    }

    /// A path of `session` with versions not settled (the first flushed), and how many.
    pub fn first_unsettled_of(&self, session: &SessionId) -> Option<(&PathName, usize)> {
        self.sessions
            .get(session)?
            .iter()
            .find(|(_, p)| !p.unsettled.is_empty())
            .map(|(path, p)| (path, p.unsettled.len()))
    }

    /// `liveness-settled`: `Ok` when every version handed out has settled, else the violation
    /// naming the first path (in name order) with versions left.
    pub fn all_settled(&self) -> Result<(), Violation> {
        let open = self
            .sessions
            .iter()
            .flat_map(|(s, paths)| paths.iter().map(move |(path, p)| (s, path, p)))
            .filter(|(_, _, p)| !p.unsettled.is_empty())
            .min_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        match open {
            None => Ok(()),
            Some((s, path, p)) => {
                let mut left = p.unsettled.clone();
                left.sort_unstable();
                Err(Violation::new(
                    "liveness-settled",
                    format!("unsettled versions: {s}/{path}: {left:?}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::check;
    use sandkeeper::{DropReason, SandboxId, Version};

    fn names() -> (SessionId, PathName, PathName) {
        (
            SessionId::new("s").unwrap(),
            PathName::new("log").unwrap(),
            PathName::new("p1").unwrap(),
        )
    }

    const UP: Settlement = Settlement::Uploaded {
        sandbox: SandboxId(1),
    };

    #[test]
    fn versions_are_numbered_settle_once_and_increase() {
        let (s, p, _) = names();
        let mut v = Versions::new();
        assert_eq!(check(v.flushed(&s, &p, 1)), "ok");
        assert_eq!(check(v.flushed(&s, &p, 3)), "versions-numbered");
        let mut v = Versions::new();
        v.flushed(&s, &p, 1).unwrap();
        v.flushed(&s, &p, 2).unwrap();
        assert_eq!(check(v.ordered(&s, &p, 2)), "ok");
        assert_eq!(
            check(v.ordered(&s, &p, 2)),
            "ok",
            "a retry repeats its version"
        );
        assert_eq!(check(v.ordered(&s, &p, 1)), "versions-increase");
        assert_eq!(check(v.settled(&s, &p, 2, &UP)), "ok");
        assert_eq!(check(v.settled(&s, &p, 2, &UP)), "settle-once");
        assert_eq!(check(v.ordered(&s, &p, 2)), "settle-once");
        assert_eq!(check(v.settled(&s, &p, 1, &UP)), "versions-increase");
        assert_eq!(check(v.settled(&s, &p, 7, &UP)), "settle-once");
        assert_eq!(v.all_settled(), Ok(()));
    }

    #[test]
    fn superseded_names_a_newer_version_handed_out() {
        let (s, p, _) = names();
        let mut v = Versions::new();
        for n in 1..=3 {
            v.flushed(&s, &p, n).unwrap();
        }
        let by = |n| Settlement::Superseded { by: Version(n) };
        assert_eq!(check(v.settled(&s, &p, 1, &by(3))), "ok");
        assert_eq!(check(v.settled(&s, &p, 2, &by(4))), "superseded-by-newer");
        v.flushed(&s, &p, 4).unwrap();
        assert_eq!(check(v.settled(&s, &p, 3, &by(3))), "superseded-by-newer");
    }

    #[test]
    fn numbering_starts_again_only_once_the_whole_session_settled() {
        let (s, log, p1) = names();
        let mut v = Versions::new();
        v.flushed(&s, &log, 1).unwrap();
        v.flushed(&s, &p1, 1).unwrap();
        v.settled(&s, &log, 1, &UP).unwrap();
        // p1's v1 is still open: the session was not forgotten.
        assert_eq!(check(v.flushed(&s, &log, 1)), "versions-numbered");
        let mut v = Versions::new();
        v.flushed(&s, &log, 1).unwrap();
        v.flushed(&s, &p1, 1).unwrap();
        v.settled(&s, &log, 1, &UP).unwrap();
        let dropped = Settlement::Dropped {
            reason: DropReason::NoSandbox,
        };
        v.settled(&s, &p1, 1, &dropped).unwrap();
        assert_eq!(check(v.flushed(&s, &log, 1)), "ok");
        assert_eq!(check(v.ordered(&s, &log, 1)), "ok");
        assert_eq!(
            check(v.settled(&s, &log, 1, &UP)),
            "ok",
            "uploaded order restarts too"
        );
    }

    #[test]
    fn liveness_names_the_first_path_left_open() {
        let (s, log, p1) = names();
        let mut v = Versions::new();
        v.flushed(&s, &p1, 1).unwrap();
        v.flushed(&s, &log, 1).unwrap();
        v.flushed(&s, &log, 2).unwrap();
        assert_eq!(v.get(&s, &log).unwrap().last(), 2);
        assert!(v.get(&s, &PathName::new("p2").unwrap()).is_none());
        let e = v.all_settled().unwrap_err();
        assert_eq!(e.check, "liveness-settled");
        assert_eq!(e.detail, "unsettled versions: s/log: [1, 2]");
        let first = v.first_unsettled_of(&s);
        assert!(
            first == Some((&log, 2)) || first == Some((&p1, 1)),
            "{first:?}"
        );
        assert!(v.session_unsettled(&s));
        assert!(!v.session_unsettled(&SessionId::new("t").unwrap()));
    }
}
