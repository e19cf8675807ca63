//! Conservation: nothing acknowledged is lost. What the application was told is safe for a key
//! stays in what the key's next call continues from, through every transition, unless one of
//! the excuses the core documents applies (its crate docs, "Conservation").
//!
//! The checker models each workspace's content as the acknowledged work it holds: a live
//! sandbox's (from its Start: empty, or the content of the snapshot it resumes or the sandbox
//! it adopts), and a snapshot's (the content of the sandbox whose Stop took it; from then on
//! the stopped sandbox holds nothing its key continues from). Work is acknowledged into a
//! sandbox by the caller ([`Conservation::acknowledged`]: a mirror version settled `Uploaded`,
//! an operation that returned ok); the key owes it from then on.
//!
//! | check | what must hold |
//! |---|---|
//! | `conservation` | after every input, every piece of work acknowledged for a key (and not excused) is held by a workspace the key may continue from: a live sandbox of the key (not shut down, dead, left, or stopped with a snapshot) or a snapshot of the key (not discarded, not taken by a Start); and a sandbox started (or adopted) in the input continues from all of it |
//!
//! Excuses, each the one the core documents (nothing else lets work go):
//!
//! - the policy lets a workspace go: a Shutdown of a sandbox that started fresh (it continues
//!   nothing of its key), was not being suspended and did not lose only its instance lets go
//!   of the work acknowledged in it (a Stop that took a snapshot moved it there before);
//! - the application let it go: a Shutdown of a sandbox whose last released call asked for it
//!   (`release_as(Shutdown)`, a kill), not suspended and not of a lost instance, lets go of
//!   what it held, whatever it continued;
//! - the backend reported the storage destroyed ([`Conservation::died`]), with a snapshot its
//!   Stop took that the key does not keep yet (on Kubernetes the same claim), and work
//!   acknowledged into it once it was destroyed (the write landed before, its answer came
//!   after);
//! - the core left the sandbox to the backend as it was after its way down failed and said so
//!   (`WayDownFailed` with no snapshot kept: [`Conservation::left`]);
//! - a snapshot's retention ended, it was of a key nothing continues, or the application
//!   dropped it (`Discard` with reason `retention`, `unused` or `dropped`); a `superseded`
//!   Discard excuses nothing (the newer one holds it);
//! - the application closed ([`Conservation::closing`]): what close cuts is its choice.
//!
//! Keys of one call (`Key::Call`) and external sandboxes are not followed: nothing continues
//! them. What the checker does not see: the content itself (a workspace holds a version or not;
//! a backend that corrupts one is not modelled).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use sandkeeper::{Command, DiscardReason, Key, PathName, SandboxId, SessionId, Snapshot, WayDown};

use crate::violation::Violation;

/// One piece of acknowledged work, as a workspace holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Work {
    /// A mirrored path of a session: its value is the version (a newer one holds the older).
    Version(SessionId, PathName),
    /// An operation of the application (a write that returned ok), by its number.
    Operation(u64),
}

/// What a workspace holds: each piece of work with its version (1 for an operation).
pub type Content = BTreeMap<Work, u64>;

/// A live sandbox of a followed key (one shut down, dead, left, or stopped with a snapshot
/// holds nothing its key may continue from, and is forgotten).
#[derive(Clone, Debug)]
struct Workspace {
    key: Key,
    content: Content,
    /// It continues its key's history (it resumed a snapshot or was adopted).
    inherited: bool,
    /// Its Stop asked for a suspension.
    suspend: bool,
    /// Its instance was lost with the workspace intact: the core may not delete it.
    instance_lost: bool,
    /// Its last released call asked it shut down (`Lifecycle::release_as`): the application
    /// lets its workspace go, as a kill does.
    asked_shutdown: bool,
}

/// What a sandbox started in this input starts from, for the report.
#[derive(Clone, Debug)]
enum StartedFrom {
    Snapshot(Option<Snapshot>),
    Adopted,
}

/// The conservation checker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Conservation {
    /// Live sandboxes of followed keys.
    sandboxes: FxHashMap<SandboxId, Workspace>,
    /// Snapshots taken and not discarded nor resumed: their key and content.
    snapshots: FxHashMap<Snapshot, (Key, Content)>,
    /// The snapshot a sandbox's Stop took, until its key keeps it (persisted or salvaged):
    /// until then it is the sandbox's storage, which a death destroys with it.
    unpersisted: FxHashMap<SandboxId, Snapshot>,
    /// Per key, the work acknowledged and not excused.
    owed: BTreeMap<Key, Content>,
    /// Keys whose holders changed in this input: checked at its end.
    dirty: Vec<Key>,
    /// Close began: the deadlines the application gave may cut work.
    closing: bool,
    /// Sandboxes started (or adopted) in this input, and what from.
    starts: Vec<(SandboxId, StartedFrom)>,
    /// The snapshot each sandbox's Stop took.
    stopped_into: FxHashMap<SandboxId, Snapshot>,
    /// The sandbox each resumed snapshot went into (the last Start that took it).
    taken: FxHashMap<Snapshot, SandboxId>,
    /// The key of every sandbox of a followed key seen, live or not (an acknowledgement may
    /// come after its sandbox stopped).
    key_of: FxHashMap<SandboxId, Key>,
    /// Sandboxes whose storage the backend destroyed ([`Conservation::died`]): work
    /// acknowledged into one afterwards (its write landed before the death, its answer came
    /// after) is lost with it, and excused.
    destroyed: rustc_hash::FxHashSet<SandboxId>,
    /// Work acknowledged so far (for the coverage of a run).
    pub acknowledged: u64,
    /// Work excused so far, by a documented excuse.
    pub excused: u64,
}

fn followed(key: &Key) -> bool {
    !matches!(key, Key::Call(_) | Key::External(_))
}

fn raise(content: &mut Content, work: &Work, version: u64) {
    match content.get_mut(work) {
        Some(v) => *v = (*v).max(version),
        None => {
            content.insert(work.clone(), version);
        }
    }
}

/// The first piece of `owed` that `content` lacks.
fn lacks<'a>(owed: &'a Content, content: &Content) -> Option<(&'a Work, u64)> {
    owed.iter()
        .find(|(w, v)| content.get(*w).is_none_or(|have| have < *v))
        .map(|(w, v)| (w, *v))
}

impl Conservation {
    /// A checker with nothing followed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One command the core ordered.
    pub fn command(&mut self, cmd: &Command) {
        match cmd {
            Command::Start {
                sandbox,
                key,
                resume_from,
                ..
            } => {
                // The Start takes the snapshot: from now on the sandbox holds what it held. A
                // snapshot an earlier Start took already (its process ended before any record
                // named that sandbox) is found where that Start put it, as the backends do (the
                // local backend's `took_snapshot`; on Kubernetes it is the same claim), and
                // moves on from there.
                let content = resume_from.as_ref().and_then(|s| {
                    let kept = self.snapshots.remove(s).map(|(_, c)| c);
                    kept.or_else(|| {
                        let by = self.taken.get(s)?;
                        self.sandboxes.remove(by).map(|w| w.content)
                    })
                });
                if let Some(s) = resume_from {
                    self.taken.insert(s.clone(), *sandbox);
                }
                let from = StartedFrom::Snapshot(resume_from.clone());
                self.begin(*sandbox, key, content, resume_from.is_some(), from);
            }
            // Fleet mode: the sandbox its key's last owner ran (or handed over) goes on here,
            // with what it holds.
            Command::Adopt { sandbox, key, .. } => {
                // Up as its last owner left it, or stopped by it (and taken back, from the
                // snapshot its Stop took, as the backends do), or left as it was after its own
                // resumed start failed (the snapshot that start took, which its key got back,
                // is this sandbox's workspace).
                let content = match self.sandboxes.get(sandbox) {
                    Some(w) => Some(w.content.clone()),
                    None => {
                        let took = || {
                            let mut taken = self.taken.iter();
                            taken.find(|(_, by)| *by == sandbox).map(|(s, _)| s.clone())
                        };
                        let snapshot = self.stopped_into.get(sandbox).cloned().or_else(took);
                        snapshot
                            .and_then(|s| self.snapshots.remove(&s))
                            .map(|(_, c)| c)
                    }
                };
                self.begin(*sandbox, key, content, true, StartedFrom::Adopted);
            }
            Command::Stop {
                sandbox, suspend, ..
            } => {
                if let Some(w) = self.sandboxes.get_mut(sandbox) {
                    w.suspend = *suspend;
                }
            }
            Command::Shutdown { sandbox, .. } => self.shut_down(*sandbox),
            Command::Discard {
                snapshot, reason, ..
            } => {
                let expired = matches!(
                    reason,
                    DiscardReason::Retention | DiscardReason::Unused | DiscardReason::Dropped
                );
                if let Some((key, content)) = self.snapshots.remove(snapshot) {
                    if expired {
                        self.excuse(&key, &content);
                    }
                    self.dirty.push(key);
                } else if expired {
                    self.taken_snapshot_expired(snapshot);
                }
            }
            // A Relinquish leaves the sandbox in the backend for the key's next owner, which
            // adopts it: it still holds what it holds.
            _ => {}
        }
    }

    /// A sandbox of `key` begins with `content` (none: empty). Whether its key owes nothing
    /// it lacks is judged at the end of the input: an excuse (the previous sandbox left as it
    /// was, and said so) may come in the same input, after the Start.
    fn begin(
        &mut self,
        sandbox: SandboxId,
        key: &Key,
        content: Option<Content>,
        inherited: bool,
        from: StartedFrom,
    ) {
        if !followed(key) {
            return;
        }
        self.key_of.insert(sandbox, key.clone());
        self.sandboxes.insert(
            sandbox,
            Workspace {
                key: key.clone(),
                content: content.unwrap_or_default(),
                inherited,
                suspend: false,
                instance_lost: false,
                asked_shutdown: false,
            },
        );
        self.starts.push((sandbox, from));
    }

    /// Whether the sandboxes started in this input continue from everything their keys owe.
    fn judge_starts(&mut self) -> Result<(), Violation> {
        let mut result = Ok(());
        for (sandbox, from) in std::mem::take(&mut self.starts) {
            let Some(w) = self.sandboxes.get(&sandbox) else {
                continue;
            };
            let Some(owed) = self.owed.get(&w.key) else {
                continue;
            };
            if let Some((work, version)) = lacks(owed, &w.content) {
                let from = match from {
                    StartedFrom::Snapshot(s) => format!("its resume_from {s:?}"),
                    StartedFrom::Adopted => "the sandbox it adopts".to_string(),
                };
                if result.is_ok() {
                    result = Err(Violation::new(
                        "conservation",
                        format!(
                            "{sandbox} starts key {} from {from}, which lacks {work:?} at {version}, acknowledged for the key",
                            w.key
                        ),
                    ));
                }
                // Reported once.
                let key = w.key.clone();
                self.owed.remove(&key);
            }
        }
        result
    }

    /// The core accepted a Stop answer of `sandbox` with `snapshot`: the snapshot holds what
    /// the sandbox held, and the sandbox (stopped, taking no more work) is no longer what its
    /// key continues from.
    pub fn stopped(&mut self, sandbox: SandboxId, snapshot: Option<&Snapshot>) {
        let Some(s) = snapshot else {
            return;
        };
        if let Some(w) = self.sandboxes.remove(&sandbox) {
            self.unpersisted.insert(sandbox, s.clone());
            self.stopped_into.insert(sandbox, s.clone());
            self.snapshots.insert(s.clone(), (w.key, w.content));
        }
    }

    /// The snapshot `sandbox`'s Stop took goes by `name` from now on, not by the name this
    /// checker was given (a scenario answers the Stop with a name of its own, which the core
    /// then uses).
    pub fn renamed(&mut self, sandbox: SandboxId, name: &Snapshot) {
        let Some(old) = self.stopped_into.get(&sandbox).cloned() else {
            return;
        };
        if let Some(held) = self.snapshots.remove(&old) {
            self.snapshots.insert(name.clone(), held);
        }
        if self.unpersisted.contains_key(&sandbox) {
            self.unpersisted.insert(sandbox, name.clone());
        }
        self.stopped_into.insert(sandbox, name.clone());
    }

    /// The core accepted the Persist of `sandbox`'s snapshot, or salvaged it: its key keeps it
    /// apart from the sandbox.
    pub fn persisted(&mut self, sandbox: SandboxId) {
        self.unpersisted.remove(&sandbox);
    }

    /// `sandbox` took a write of `work` at `version` (a version's upload landed, an operation
    /// wrote): what it holds of that work is that version now, older or newer (a write
    /// replaces the file). Whether anything was acknowledged is [`acknowledged`]'s.
    ///
    /// [`acknowledged`]: Conservation::acknowledged
    pub fn written(&mut self, sandbox: SandboxId, work: Work, version: u64) {
        let Some(w) = self.sandboxes.get_mut(&sandbox) else {
            return;
        };
        w.content.insert(work, version);
        self.dirty.push(w.key.clone());
    }

    /// Work acknowledged into `sandbox` (a version settled `Uploaded` into it, an operation in
    /// it that returned ok): its key owes it from now on. What the sandbox holds is
    /// [`written`](Conservation::written)'s.
    pub fn acknowledged(&mut self, sandbox: SandboxId, work: Work, version: u64) {
        let Some(key) = self.key_of.get(&sandbox) else {
            return;
        };
        if self.destroyed.contains(&sandbox) {
            self.acknowledged += 1;
            self.excused += 1;
            return;
        }
        if let Some(owed) = self.owed.get_mut(key) {
            raise(owed, &work, version);
        } else {
            self.owed
                .insert(key.clone(), Content::from([(work, version)]));
        }
        self.dirty.push(key.clone());
        self.acknowledged += 1;
    }

    /// Fleet mode: the sweep removed `sandbox` (nothing of a live owner, nothing a record
    /// names): it holds nothing any more, and nothing is excused.
    pub fn swept_sandbox(&mut self, sandbox: SandboxId) {
        if let Some(w) = self.sandboxes.remove(&sandbox) {
            self.dirty.push(w.key);
        }
    }

    /// Fleet mode: the sweep removed `snapshot`; `retention_over`: its retention had ended
    /// (which excuses what only it held).
    pub fn swept_snapshot(&mut self, snapshot: &Snapshot, retention_over: bool) {
        if let Some((key, content)) = self.snapshots.remove(snapshot) {
            if retention_over {
                self.excuse_unheld(&key, &content);
            }
            self.dirty.push(key);
        }
    }

    /// The backend reported `sandbox`'s storage destroyed (a death, not only its instance):
    /// what only it held is lost, and excused; so is a snapshot its Stop took that its key
    /// does not keep yet (the same storage, on a backend whose snapshot is the sandbox's own).
    pub fn died(&mut self, sandbox: SandboxId) {
        self.destroyed.insert(sandbox);
        if let Some(s) = self.unpersisted.remove(&sandbox) {
            if let Some((key, content)) = self.snapshots.remove(&s) {
                self.excuse_unheld(&key, &content);
                self.dirty.push(key);
            }
        }
        if let Some(w) = self.sandboxes.remove(&sandbox) {
            self.excuse_unheld(&w.key, &w.content);
            self.dirty.push(w.key);
        }
    }

    /// The backend reported `sandbox`'s running instance lost, its workspace intact, and the
    /// core took it so (the sandbox was up): it may not delete the workspace.
    pub fn instance_lost(&mut self, sandbox: SandboxId) {
        if let Some(w) = self.sandboxes.get_mut(&sandbox) {
            w.instance_lost = true;
        }
    }

    /// A call ready in `sandbox` was released asking `way` of its way down (`None`: a plain
    /// release, the policy's way); the last release decides. Asking `Shutdown` is the
    /// application's excuse for the workspace it lets go.
    pub fn asked(&mut self, sandbox: SandboxId, way: Option<WayDown>) {
        if let Some(w) = self.sandboxes.get_mut(&sandbox) {
            w.asked_shutdown = way == Some(WayDown::Shutdown);
        }
    }

    /// The core left `sandbox` to the backend as it was, its way down failed, and said so
    /// (`WayDownFailed`); `kept` is the snapshot its key keeps of it, if any.
    ///
    /// A kept snapshot this checker no longer has is the one the sandbox's own Start took and
    /// its key got back (a resumed start that failed): it holds what the sandbox held.
    pub fn left(&mut self, sandbox: SandboxId, kept: Option<&Snapshot>) {
        self.unpersisted.remove(&sandbox);
        if let Some(w) = self.sandboxes.remove(&sandbox) {
            match kept {
                None => self.excuse_unheld(&w.key, &w.content),
                Some(s) if !self.snapshots.contains_key(s) => {
                    let key = w.key.clone();
                    self.snapshots.insert(s.clone(), (key, w.content));
                }
                Some(_) => {}
            }
            self.dirty.push(w.key);
        }
    }

    /// The core ordered `snapshot` discarded for `reason` (a world whose backend runs the
    /// Discard later, as the fleet's does): from the order on, a retention that ended or a
    /// snapshot of a key nothing continues excuses what it holds, as the Discard itself does.
    pub fn discard_ordered(&mut self, snapshot: &Snapshot, reason: DiscardReason) {
        if !matches!(
            reason,
            DiscardReason::Retention | DiscardReason::Unused | DiscardReason::Dropped
        ) {
            return;
        }
        if let Some((key, content)) = self.snapshots.get(snapshot) {
            let (key, content) = (key.clone(), content.clone());
            self.excuse(&key, &content);
            self.dirty.push(key);
        } else {
            self.taken_snapshot_expired(snapshot);
        }
    }

    /// A snapshot a Start took (its process ended, or lost the key, before a record named the
    /// new sandbox) is discarded for its retention or as unused: the record its key continues
    /// from still named the snapshot, whose retention decides; what the taking sandbox holds
    /// (the snapshot's content: no call was ready in it before a record named it) is excused.
    fn taken_snapshot_expired(&mut self, snapshot: &Snapshot) {
        let Some(w) = self
            .taken
            .get(snapshot)
            .and_then(|by| self.sandboxes.get(by))
        else {
            return;
        };
        let (key, content) = (w.key.clone(), w.content.clone());
        self.excuse(&key, &content);
        self.dirty.push(key);
    }

    /// The Start of `sandbox`, which took `snapshot`, failed: its key keeps the snapshot again,
    /// holding what the sandbox began with.
    pub fn given_back(&mut self, sandbox: SandboxId, snapshot: &Snapshot) {
        if let Some(w) = self.sandboxes.remove(&sandbox) {
            self.dirty.push(w.key.clone());
            self.snapshots.insert(snapshot.clone(), (w.key, w.content));
        }
    }

    /// Close began: what its deadlines cut is the application's choice.
    pub fn closing(&mut self) {
        self.closing = true;
    }

    /// After every input: the sandboxes started in it continue from everything their keys
    /// owe, and every key whose holders changed still holds what it owes.
    pub fn after_input(&mut self) -> Result<(), Violation> {
        let started = if self.starts.is_empty() {
            Ok(())
        } else {
            self.judge_starts()
        };
        if self.dirty.is_empty() {
            return started;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut result = started;
        for key in &dirty {
            if let Err(v) = self.holds(key) {
                // Reported once: the key owes it no longer.
                self.owed.remove(key);
                if result.is_ok() {
                    result = Err(v);
                }
            }
        }
        dirty.clear();
        self.dirty = dirty;
        result
    }

    /// The most of each piece of work any workspace of `key` holds.
    fn held(&self, key: &Key) -> Content {
        let mut held = Content::new();
        let sandboxes = self
            .sandboxes
            .values()
            .filter(|w| &w.key == key)
            .map(|w| &w.content);
        let snapshots = self
            .snapshots
            .values()
            .filter(|(k, _)| k == key)
            .map(|(_, c)| c);
        for content in sandboxes.chain(snapshots) {
            for (work, version) in content {
                raise(&mut held, work, *version);
            }
        }
        held
    }

    /// Whether every piece `key` owes is held by a live sandbox of it or a snapshot of it.
    fn holds(&self, key: &Key) -> Result<(), Violation> {
        let Some(owed) = self.owed.get(key) else {
            return Ok(());
        };
        match lacks(owed, &self.held(key)) {
            None => Ok(()),
            Some((work, version)) => Err(Violation::new(
                "conservation",
                format!(
                    "{work:?} at {version}, acknowledged for key {key}, is in no workspace the key may continue from"
                ),
            )),
        }
    }

    /// A Shutdown of `sandbox`: it lets go of its workspace. The policy's excuse applies to one
    /// that started fresh, was not suspended and did not lose only its instance (or to any,
    /// once close began); one stopped with a snapshot was forgotten then.
    fn shut_down(&mut self, sandbox: SandboxId) {
        let Some(w) = self.sandboxes.remove(&sandbox) else {
            return;
        };
        let policy_lets_go = !w.inherited && !w.suspend && !w.instance_lost;
        let asked = w.asked_shutdown && !w.suspend && !w.instance_lost;
        if policy_lets_go || asked || self.closing {
            self.excuse_unheld(&w.key, &w.content);
        }
        self.dirty.push(w.key);
    }

    /// Excuses what `content` (of a workspace of `key` just gone) held that no other workspace
    /// of the key holds.
    fn excuse_unheld(&mut self, key: &Key, content: &Content) {
        if !self.owed.contains_key(key) {
            return;
        }
        let held = self.held(key);
        let unheld: Content = content
            .iter()
            .filter(|(work, version)| held.get(*work).is_none_or(|v| v < *version))
            .map(|(w, v)| (w.clone(), *v))
            .collect();
        self.excuse(key, &unheld);
    }

    /// The key owes none of `content` any more (at the versions given or older).
    fn excuse(&mut self, key: &Key, content: &Content) {
        let Some(owed) = self.owed.get_mut(key) else {
            return;
        };
        for (work, version) in content {
            if owed.get(work).is_some_and(|v| v <= version) {
                owed.remove(work);
                self.excused += 1;
            }
        }
        if owed.is_empty() {
            self.owed.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use sandkeeper::{Instant, Spec};

    use super::*;
    use crate::fixtures::{check, names};

    fn key() -> Key {
        Key::Session(SessionId::new("s").unwrap())
    }

    fn start(x: u64, resume_from: Option<&str>) -> Command {
        Command::Start {
            sandbox: SandboxId(x),
            key: key(),
            spec: Spec::default(),
            resume_from: resume_from.map(Snapshot::new),
            resumes: resume_from.map(|_| SandboxId(0)),
            deadline: Instant::ZERO,
            token: None,
        }
    }

    fn stop(x: u64, suspend: bool) -> Command {
        Command::Stop {
            sandbox: SandboxId(x),
            suspend,
            deadline: Instant::ZERO,
            token: None,
        }
    }

    fn shutdown(x: u64) -> Command {
        Command::Shutdown {
            sandbox: SandboxId(x),
            token: None,
            deadline: Instant::ZERO,
        }
    }

    /// Work `version` of `s`/`log` written into `x` and acknowledged.
    fn acknowledge(c: &mut Conservation, x: u64, version: u64) {
        let (session, path) = names();
        let work = Work::Version(session, path);
        c.written(SandboxId(x), work.clone(), version);
        c.acknowledged(SandboxId(x), work, version);
    }

    /// Sandbox 0 with version 1 acknowledged, stopped (`suspend` or not) into `snapshot`.
    fn stopped_into(snapshot: &str, suspend: bool) -> Conservation {
        let mut c = Conservation::new();
        c.command(&start(0, None));
        acknowledge(&mut c, 0, 1);
        c.command(&stop(0, suspend));
        c.stopped(SandboxId(0), Some(&Snapshot::new(snapshot)));
        c
    }

    /// Sandbox 0 with version 1 acknowledged, stopped into snapshot `ws`, its Persist taken;
    /// sandbox 1 resumed from it.
    fn resumed() -> Conservation {
        let mut c = stopped_into("ws", false);
        c.persisted(SandboxId(0));
        c.command(&shutdown(0));
        assert_eq!(check(c.after_input()), "ok");
        c.command(&start(1, Some("ws")));
        assert_eq!(check(c.after_input()), "ok");
        c
    }

    #[test]
    fn a_resumed_sandbox_shut_down_without_a_snapshot_loses_its_keys_history() {
        let mut c = resumed();
        c.command(&stop(1, false));
        c.command(&shutdown(1));
        assert_eq!(check(c.after_input()), "conservation");
    }

    #[test]
    fn a_fresh_sandbox_shut_down_on_the_shutdown_way_is_excused() {
        let mut c = Conservation::new();
        c.command(&start(0, None));
        acknowledge(&mut c, 0, 1);
        c.command(&stop(0, false));
        c.command(&shutdown(0));
        assert_eq!(check(c.after_input()), "ok");
        assert_eq!(c.excused, 1);
        c.command(&start(1, None));
        assert_eq!(check(c.after_input()), "ok");
    }

    #[test]
    fn a_start_that_does_not_resume_the_snapshot_holding_the_work_fails() {
        let mut c = stopped_into("ws", true);
        c.persisted(SandboxId(0));
        assert_eq!(check(c.after_input()), "ok");
        c.command(&start(1, None));
        assert_eq!(check(c.after_input()), "conservation");
    }

    #[test]
    fn a_stale_write_over_newer_work_fails() {
        let mut c = resumed();
        acknowledge(&mut c, 1, 2);
        assert_eq!(check(c.after_input()), "ok");
        let (session, path) = names();
        c.written(SandboxId(1), Work::Version(session, path), 1);
        assert_eq!(check(c.after_input()), "conservation");
    }

    #[test]
    fn a_failed_way_down_left_as_it_is_is_excused_and_a_death_too() {
        let mut c = resumed();
        c.left(SandboxId(1), None);
        assert_eq!(check(c.after_input()), "ok");
        let mut c = resumed();
        c.died(SandboxId(1));
        assert_eq!(check(c.after_input()), "ok");
        // A lost instance is no excuse: its Shutdown loses the work.
        let mut c = resumed();
        c.instance_lost(SandboxId(1));
        c.command(&shutdown(1));
        assert_eq!(check(c.after_input()), "conservation");
    }

    /// A snapshot the core was told by another name (a scenario's answer) is followed by that
    /// name: a start resuming it continues the key's work.
    #[test]
    fn a_renamed_snapshot_is_resumed_by_its_new_name() {
        let mut c = stopped_into("snap-0", true);
        c.renamed(SandboxId(0), &Snapshot::new("snap1"));
        c.persisted(SandboxId(0));
        assert_eq!(check(c.after_input()), "ok");
        c.command(&start(1, Some("snap1")));
        assert_eq!(check(c.after_input()), "ok");
        // By the name it had before, the key's work is not found.
        let mut c = stopped_into("snap-0", true);
        c.renamed(SandboxId(0), &Snapshot::new("snap1"));
        c.command(&start(1, Some("snap-0")));
        assert_eq!(check(c.after_input()), "conservation");
    }

    /// A retention discard ordered (the backend runs it later) excuses the snapshot's work at
    /// once; a superseded one does not. A discard of a snapshot a start took excuses what the
    /// taking sandbox holds.
    #[test]
    fn an_ordered_retention_discard_excuses_its_snapshot() {
        let discard = |c: &mut Conservation, reason| {
            c.discard_ordered(&Snapshot::new("ws"), reason);
            c.command(&start(2, None));
            check(c.after_input())
        };
        let mut c = stopped_into("ws", false);
        c.persisted(SandboxId(0));
        c.command(&shutdown(0));
        let mut superseded = c.clone();
        assert_eq!(discard(&mut c, DiscardReason::Retention), "ok");
        assert_eq!(
            discard(&mut superseded, DiscardReason::Superseded),
            "conservation"
        );
        let mut taken = resumed();
        taken.discard_ordered(&Snapshot::new("ws"), DiscardReason::Retention);
        taken.command(&shutdown(1));
        assert_eq!(check(taken.after_input()), "ok");
    }
}
