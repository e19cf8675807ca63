//! What one replica's process ordered and reported, kept for a fleet scenario's expectations,
//! and the lanes of its sandboxes: the order of the commands on each sandbox, by
//! `sandkeeper_check`'s rules, in this process. An Adopt starts a new lane: a key's record may
//! hand a process a sandbox it let go, or one it shut down since (the backend then answers the
//! Adopt that it is gone, and the process starts afresh).
//!
//! One record per incarnation: a restart starts an empty one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use sandkeeper::{
    CallId, Command, ErrorKind, Event, FenceReason, Key, PathName, SandboxId, SessionId,
    Settlement, Snapshot, StoreCommand,
};
use sandkeeper_check::{Lane, Op, Violation};

/// What a process ordered for one sandbox.
#[derive(Clone, Debug, Default)]
pub(super) struct Ordered {
    /// The names of its commands (`start`, `adopt`, `stop`, `relinquish`, ...), in order.
    pub(super) commands: Vec<&'static str>,
    /// The snapshot its Start resumed.
    pub(super) resume_from: Option<Snapshot>,
}

impl Ordered {
    /// Whether a command of that name was ordered.
    pub(super) fn has(&self, name: &str) -> bool {
        self.commands.contains(&name)
    }
}

/// One incarnation's record.
#[derive(Clone, Debug, Default)]
pub(super) struct Seen {
    /// Calls that ended without becoming ready, with the kind.
    pub(super) failed: BTreeMap<CallId, ErrorKind>,
    /// Calls whose acquire named something the core refuses, as written.
    pub(super) refused_calls: Vec<String>,
    /// Every settlement, by session, path and version.
    pub(super) settled: BTreeMap<(SessionId, PathName, u64), Settlement>,
    /// What was ordered for each sandbox.
    pub(super) sandboxes: BTreeMap<SandboxId, Ordered>,
    /// Snapshots a Discard named.
    pub(super) discarded: BTreeSet<String>,
    /// Keys a claim was ordered for.
    pub(super) claims: BTreeSet<Key>,
    /// Keys reported fenced, in order.
    pub(super) fenced: Vec<(Key, FenceReason)>,
    /// The error of the last application step, if the core refused it.
    pub(super) last_error: Option<ErrorKind>,
    /// The sandboxes each session's entered work is in, oldest first, each with the number of
    /// the file the operation made when it entered.
    pub(super) entered: BTreeMap<SessionId, VecDeque<(SandboxId, u64)>>,
    lanes: BTreeMap<SandboxId, Lane>,
}

impl Seen {
    /// The core ordered `cmd`: noted, and taken by the sandbox's lane.
    pub(super) fn command(&mut self, cmd: &Command) -> Result<(), Violation> {
        let x = cmd.sandbox();
        let ordered = self.sandboxes.entry(x).or_default();
        if let Command::Adopt { .. } = cmd {
            // Taken over (perhaps again): a new lane here.
            self.lanes.remove(&x);
            ordered.commands.clear();
        }
        ordered.commands.push(cmd.name());
        match cmd {
            Command::Start { resume_from, .. } => ordered.resume_from = resume_from.clone(),
            Command::Discard { snapshot, .. } => {
                self.discarded.insert(snapshot.as_str().to_string());
            }
            _ => {}
        }
        match Op::of(cmd) {
            Some((x, op)) => self.lanes.entry(x).or_default().take(x, op),
            None => Ok(()),
        }
    }

    /// The core ordered store work.
    pub(super) fn store(&mut self, cmd: &StoreCommand) {
        if let StoreCommand::Claim { key, .. } = cmd {
            self.claims.insert(key.clone());
        }
    }

    /// The core reported `ev`.
    pub(super) fn event(&mut self, ev: &Event) {
        match ev {
            Event::CallFailed { call, error } => {
                self.failed.insert(call.clone(), *error);
            }
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => {
                self.settled
                    .insert((session.clone(), path.clone(), version.0), outcome.clone());
            }
            Event::KeyFenced { key, reason, .. } => self.fenced.push((key.clone(), *reason)),
            _ => {}
        }
    }

    /// The core was told the sandbox died.
    pub(super) fn died(&mut self, x: SandboxId) {
        self.lanes.entry(x).or_default().die();
    }

    /// Whether the lane of `x` is up in this process: started, neither stopped nor shut down.
    pub(super) fn is_up(&self, x: SandboxId) -> bool {
        self.lanes.get(&x).is_some_and(Lane::is_up)
            && !self.sandboxes.get(&x).is_some_and(|o| o.has("relinquish"))
    }
}
