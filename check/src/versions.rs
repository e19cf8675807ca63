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

use std::collections::hash_map::Entry;

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

/// The versions of every path, for a user that keeps no record of its own per path. `X` is what
/// the user keeps beside each path (nothing by default), so that one lookup serves both.
#[derive(Clone, Debug)]
pub struct Versions<X = ()> {
    paths: FxHashMap<(SessionId, PathName), (PathVersions, X)>,
}

impl<X> Default for Versions<X> {
    fn default() -> Self {
        Versions {
            paths: FxHashMap::default(),
        }
    }
}

impl<X: Default> Versions<X> {
    /// An empty table.
    pub fn new() -> Self {
        Versions::default()
    }

    /// A flush of `session`'s `path` returned `version`. See [`PathVersions::flushed`]. Also
    /// hands back what the user keeps beside the path, so that one lookup serves both.
    pub fn flushed(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
    ) -> (Result<(), Violation>, &mut X) {
        if version == 1 && self.entry(session, path).0.last > 0 {
            // The numbering starts again: allowed only when the whole session has settled, which
            // walks the table (rare: a forgotten idle session).
            let settled = !self.session_unsettled(session);
            let (p, x) = self.entry(session, path);
            return (p.flushed(session, path, version, || settled), x);
        }
        let (p, x) = self.entry(session, path);
        (p.flushed(session, path, version, || false), x)
    }

    /// An Upload of `version` was ordered. See [`PathVersions::ordered`].
    pub fn ordered(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
    ) -> Result<(), Violation> {
        self.entry(session, path).0.ordered(session, path, version)
    }

    /// `version` settled. See [`PathVersions::settled`].
    pub fn settled(
        &mut self,
        session: &SessionId,
        path: &PathName,
        version: u64,
        outcome: &Settlement,
    ) -> Result<(), Violation> {
        self.entry(session, path)
            .0
            .settled(session, path, version, outcome)
    }

    /// The record of `session`'s `path` and what the user keeps beside it, made when new.
    pub fn entry(&mut self, session: &SessionId, path: &PathName) -> &mut (PathVersions, X) {
        // Names are inline strings: cloning them for the key is a copy, not an allocation.
        let key = (session.clone(), path.clone());
        match self.paths.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(Default::default()),
        }
    }

    /// The record of `session`'s `path`, if it was named.
    pub fn get(&self, session: &SessionId, path: &PathName) -> Option<&(PathVersions, X)> {
        self.paths.get(&(session.clone(), path.clone()))
    }

    /// The record of `session`'s `path`, if it was named, to change.
    pub fn get_mut(
        &mut self,
        session: &SessionId,
        path: &PathName,
    ) -> Option<&mut (PathVersions, X)> {
        self.paths.get_mut(&(session.clone(), path.clone()))
    }

    /// Every path's record, in no particular order.
    pub fn iter_mut(
        &mut self,
    ) -> impl Iterator<Item = (&(SessionId, PathName), &mut (PathVersions, X))> {
        self.paths.iter_mut()
    }

    /// Whether some version of `session` has not settled.
    pub fn session_unsettled(&self, session: &SessionId) -> bool {
        self.first_unsettled_of(session).is_some()
    }

    /// A path of `session` with versions not settled, and how many.
    pub fn first_unsettled_of(&self, session: &SessionId) -> Option<(&PathName, usize)> {
        self.paths
            .iter()
            .find(|((s, _), (p, _))| s == session && !p.unsettled.is_empty())
            .map(|((_, path), (p, _))| (path, p.unsettled.len()))
    }

    /// `liveness-settled`: `Ok` when every version handed out has settled, else the violation
    /// naming the first path (in name order) with versions left.
    pub fn all_settled(&self) -> Result<(), Violation> {
        let open = self
            .paths
            .iter()
            .filter(|(_, (p, _))| !p.unsettled.is_empty())
            .min_by(|a, b| a.0.cmp(b.0));
        match open {
            None => Ok(()),
            Some(((s, path), (p, _))) => {
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
    use sandkeeper::{DropReason, SandboxId, Version};

    fn names() -> (SessionId, PathName, PathName) {
        (
            SessionId::new("s").unwrap(),
            PathName::new("log").unwrap(),
            PathName::new("p1").unwrap(),
        )
    }

    fn check(r: Result<(), Violation>) -> &'static str {
        r.err().map_or("ok", |v| v.check)
    }

    const UP: Settlement = Settlement::Uploaded {
        sandbox: SandboxId(1),
    };

    #[test]
    fn versions_are_numbered_settle_once_and_increase() {
        let (s, p, _) = names();
        let mut v = Versions::<()>::new();
        assert_eq!(check(v.flushed(&s, &p, 1).0), "ok");
        assert_eq!(check(v.flushed(&s, &p, 3).0), "versions-numbered");
        let mut v = Versions::<()>::new();
        v.flushed(&s, &p, 1).0.unwrap();
        v.flushed(&s, &p, 2).0.unwrap();
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
        let mut v = Versions::<()>::new();
        for n in 1..=3 {
            v.flushed(&s, &p, n).0.unwrap();
        }
        let by = |n| Settlement::Superseded { by: Version(n) };
        assert_eq!(check(v.settled(&s, &p, 1, &by(3))), "ok");
        assert_eq!(check(v.settled(&s, &p, 2, &by(4))), "superseded-by-newer");
        v.flushed(&s, &p, 4).0.unwrap();
        assert_eq!(check(v.settled(&s, &p, 3, &by(3))), "superseded-by-newer");
    }

    #[test]
    fn numbering_starts_again_only_once_the_whole_session_settled() {
        let (s, log, p1) = names();
        let mut v = Versions::<()>::new();
        v.flushed(&s, &log, 1).0.unwrap();
        v.flushed(&s, &p1, 1).0.unwrap();
        v.settled(&s, &log, 1, &UP).unwrap();
        // p1's v1 is still open: the session was not forgotten.
        assert_eq!(check(v.flushed(&s, &log, 1).0), "versions-numbered");
        let mut v = Versions::<()>::new();
        v.flushed(&s, &log, 1).0.unwrap();
        v.flushed(&s, &p1, 1).0.unwrap();
        v.settled(&s, &log, 1, &UP).unwrap();
        let dropped = Settlement::Dropped {
            reason: DropReason::NoSandbox,
        };
        v.settled(&s, &p1, 1, &dropped).unwrap();
        assert_eq!(check(v.flushed(&s, &log, 1).0), "ok");
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
        let mut v = Versions::<u8>::new();
        v.flushed(&s, &p1, 1).0.unwrap();
        v.flushed(&s, &log, 1).0.unwrap();
        v.flushed(&s, &log, 2).0.unwrap();
        v.entry(&s, &log).1 = 7;
        assert_eq!(v.get(&s, &log).unwrap().1, 7);
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
