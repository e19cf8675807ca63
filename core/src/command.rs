//! Commands: the work the core orders a driver to do, drained with
//! [`Lifecycle::poll_command`](crate::Lifecycle::poll_command).
//!
//! A command says everything the driver needs to carry it out: which sandbox, what to do, by
//! when (its `deadline`, the core's own, in the core's [`Instant`]s), and what the core means by
//! it (that a Stop and Persist suspend the sandbox rather than lead to its Shutdown, which
//! suspended sandbox a Start continues, that an outstanding command is abandoned). A driver
//! never infers any of this from the configuration or from the order of commands.

use std::ops::Deref;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::fleet::Token;
use crate::ids::{Key, Payload, SandboxId, Snapshot, Spec, UploadId, Version};
use crate::name::{PathName, SessionId};
use crate::time::Instant;

/// One piece of work for the driver. Each names exactly one sandbox. A driver answers Start,
/// Upload, Stop, Persist and Shutdown with the matching `handle_*` input, unless it dropped the
/// command at its deadline or on a cancel; Drain, CancelUpload, Discard and Abandon need no
/// answer.
///
/// **Deadlines.** Start, Upload, Stop, Persist and Shutdown carry the instant at which the core
/// stops waiting for their answer. The core's own timer fires then (its consequence comes from
/// [`handle_timeout`](crate::Lifecycle::handle_timeout)); the driver stops the operation at the
/// same instant, by its own clock mapped from the core's, and answers nothing: any answer would
/// be stale. A driver keeps no timeouts of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "command")]
pub enum Command {
    /// Start a managed sandbox for `key`. Answer with `handle_start_ok` or `handle_start_failed`.
    Start {
        /// The new sandbox.
        sandbox: SandboxId,
        /// The isolation key it serves (for labels, names, sharing beyond this core).
        key: Key,
        /// The spec of the call that caused the start.
        spec: Spec,
        /// The snapshot of the key's previous sandbox, to resume its workspace from.
        resume_from: Option<Snapshot>,
        /// The sandbox that persisted `resume_from` (set exactly when `resume_from` is): the
        /// earlier incarnation this start continues. The core no longer tracks it, so a late
        /// report about it (a death seen on the old pod) is stale; a backend names the new
        /// incarnation's objects after `sandbox`, never after this one.
        resumes: Option<SandboxId>,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// When the core stops waiting: the start timeout.
        deadline: Instant,
    },
    /// Fleet mode: take over `sandbox`, a sandbox of `key` that its last owner handed over warm
    /// (up, drained, no call; named in the key's [`KeyRecord`](crate::KeyRecord)). Record
    /// `token` as the newest for it, then check it is still up. Answer with `handle_start_ok`
    /// (the calls of the key bind to it, with no hook: it was started and hooked before) or
    /// `handle_start_failed` (it is gone: the core shuts down what is left of it, and starts the
    /// key afresh). Runs in the sandbox's order, like a Start.
    Adopt {
        /// The sandbox, under the id its first owner gave it.
        sandbox: SandboxId,
        /// Its key.
        key: Key,
        /// This owner's fencing token.
        token: Token,
        /// When the core stops waiting: the start timeout.
        deadline: Instant,
    },
    /// Fleet mode: this process no longer drives the sandbox (its key was handed over with it,
    /// or the key was lost): drop whatever is outstanding on it, forget it, send nothing more
    /// about it, and leave it in the backend, which belongs to the key's next owner now. Its last
    /// command; no answer.
    Relinquish {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Write `payload` as `path` of `session` into the sandbox. Answer with `handle_upload_ok`
    /// or `handle_upload_failed`.
    Upload {
        /// This upload, for its answer.
        upload: UploadId,
        /// Where to write. Always a sandbox bound to `session` (or where its released call was).
        sandbox: SandboxId,
        /// Whose file.
        session: SessionId,
        /// Which file of the session.
        path: PathName,
        /// Which version of it.
        version: Version,
        /// The bytes.
        payload: Payload,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// When the core stops waiting: the upload timeout, counted from the version's first
        /// attempt (a retry carries the same deadline as the attempt before it).
        deadline: Instant,
    },
    /// Stop waiting for this upload: its outcome no longer matters (timeout, drain deadline,
    /// death, close). Drop it; an answer that comes anyway is stale.
    CancelUpload {
        /// The upload.
        upload: UploadId,
        /// Its sandbox.
        sandbox: SandboxId,
    },
    /// The sandbox is draining: ask these sessions' background writers to submit their last
    /// writes now. No answer.
    Drain {
        /// The draining sandbox.
        sandbox: SandboxId,
        /// The sessions whose mirror targets it, in ascending order of name.
        sessions: SessionList,
    },
    /// Stop the sandbox (its processes); no write may land in it afterwards. Answer with
    /// `handle_stop_ok` (with a snapshot of its workspace, if the backend takes one) or
    /// `handle_stop_failed`.
    Stop {
        /// The sandbox.
        sandbox: SandboxId,
        /// The sandbox is being suspended: return a snapshot the next Start of its key can
        /// resume from (`Persist { suspend: true }` follows). When `false`, its way down ends
        /// in Shutdown, and a snapshot is optional.
        suspend: bool,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// When the core stops waiting: the command timeout.
        deadline: Instant,
    },
    /// Persist the stopped sandbox's state. Answer with `handle_persist_ok` or
    /// `handle_persist_failed`.
    Persist {
        /// The sandbox.
        sandbox: SandboxId,
        /// The snapshot its Stop returned, if any.
        snapshot: Option<Snapshot>,
        /// Suspend it: the backend keeps it (its workspace, at least) for a later Start that
        /// resumes `snapshot`. When this Persist succeeds it is the sandbox's **last command**
        /// (but for the [`Command::Discard`] of its snapshot):
        /// the core forgets the sandbox, and reports about it afterwards are stale. When it
        /// fails, times out or the sandbox dies first, Shutdown follows as usual. While it is
        /// outstanding, the loss of the sandbox's running instance (see
        /// [`handle_instance_gone`](crate::Lifecycle::handle_instance_gone)) is the suspension's
        /// own doing. When `false`, Shutdown follows.
        suspend: bool,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// The end of the snapshot's retention, when the policy has one
        /// ([`Tiers::retain`](crate::Tiers::retain)): the backend records it with what it keeps
        /// (a suspended claim's `shutdownTime`, an expiry beside a snapshot directory) and deletes
        /// it then by itself, so that a keeper that crashed keeps nothing forever. The core orders
        /// the same deletion ([`Command::Discard`]) no later; a keeper that restarts honours the
        /// recorded instant, no earlier.
        retain_until: Option<Instant>,
        /// When the core stops waiting: the command timeout.
        deadline: Instant,
    },
    /// Delete a snapshot the key no longer references: its retention passed, a newer snapshot
    /// of the key superseded it, or its key is one call's, which never starts again. `sandbox` is the sandbox that persisted it, which may
    /// be shut down or suspended: this is the one command that may name a sandbox after its
    /// last one, and it runs beside everything, in no sandbox's order. A snapshot that a Start
    /// took as `resume_from` is the new sandbox's and is never discarded. Best effort and no
    /// answer: a snapshot the backend cannot delete now goes at its own recorded expiry
    /// (`Persist::retain_until`).
    Discard {
        /// The sandbox that persisted the snapshot.
        sandbox: SandboxId,
        /// The key it was kept for.
        key: Key,
        /// The snapshot.
        snapshot: Snapshot,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// Why it goes.
        reason: DiscardReason,
    },
    /// Run the application's hook `hook` in the sandbox (with its operations: exec, files).
    /// Answer with `handle_hook_ok` or `handle_hook_failed`; at the deadline drop it and answer
    /// nothing. It runs in the sandbox's order, like Start and Stop: after the Start, before the
    /// Stop; never beside another hook, an upload or a Stop of the sandbox.
    Hook {
        /// The sandbox.
        sandbox: SandboxId,
        /// Which hook.
        hook: HookPoint,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// When the core stops waiting: the hook's timeout.
        deadline: Instant,
    },
    /// Shut the sandbox down and free everything it holds. Ordered exactly once per managed
    /// sandbox, and always its last command. Answer with `handle_shutdown_ok` or
    /// `handle_shutdown_failed`.
    Shutdown {
        /// The sandbox.
        sandbox: SandboxId,
        /// The fencing token of the key's owner in fleet mode ([`Token`]); `None` for a key no
        /// process owns (scope `Call`, an external sandbox, a single keeper). The backend refuses
        /// it when it has seen a newer one for this sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
        /// When the core stops waiting (the command timeout): unanswered by then, the shutdown
        /// is reported unconfirmed.
        deadline: Instant,
    },
    /// The core no longer awaits the answer of the sandbox's outstanding Start, Hook, Stop or
    /// Persist (it timed out, the sandbox died, or close gave up on it): stop that operation at
    /// its next await point and send no answer (one sent anyway is stale). Always followed at
    /// once by the sandbox's Shutdown, which must not wait for the abandoned operation to end. No
    /// answer.
    Abandon {
        /// The sandbox.
        sandbox: SandboxId,
    },
}

impl Command {
    /// The sandbox the command names.
    pub fn sandbox(&self) -> SandboxId {
        match self {
            Command::Start { sandbox, .. }
            | Command::Upload { sandbox, .. }
            | Command::CancelUpload { sandbox, .. }
            | Command::Drain { sandbox, .. }
            | Command::Stop { sandbox, .. }
            | Command::Persist { sandbox, .. }
            | Command::Shutdown { sandbox, .. }
            | Command::Discard { sandbox, .. }
            | Command::Hook { sandbox, .. }
            | Command::Adopt { sandbox, .. }
            | Command::Relinquish { sandbox }
            | Command::Abandon { sandbox } => *sandbox,
        }
    }

    /// The instant at which the core stops waiting for the command's answer; `None` for the
    /// commands that want no answer (Drain, CancelUpload, Abandon).
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Command::Start { deadline, .. }
            | Command::Upload { deadline, .. }
            | Command::Stop { deadline, .. }
            | Command::Persist { deadline, .. }
            | Command::Hook { deadline, .. }
            | Command::Adopt { deadline, .. }
            | Command::Shutdown { deadline, .. } => Some(*deadline),
            Command::Relinquish { .. }
            | Command::CancelUpload { .. }
            | Command::Drain { .. }
            | Command::Discard { .. }
            | Command::Abandon { .. } => None,
        }
    }

    /// The fencing token it carries, in fleet mode, for a key some process owns.
    pub fn token(&self) -> Option<Token> {
        match self {
            Command::Start { token, .. }
            | Command::Upload { token, .. }
            | Command::Stop { token, .. }
            | Command::Persist { token, .. }
            | Command::Shutdown { token, .. }
            | Command::Discard { token, .. }
            | Command::Hook { token, .. } => *token,
            Command::Adopt { token, .. } => Some(*token),
            Command::CancelUpload { .. }
            | Command::Drain { .. }
            | Command::Relinquish { .. }
            | Command::Abandon { .. } => None,
        }
    }

    /// The command's name, as in its serialised form (`start`, `upload`, ...): for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Start { .. } => "start",
            Command::Upload { .. } => "upload",
            Command::CancelUpload { .. } => "cancel-upload",
            Command::Drain { .. } => "drain",
            Command::Stop { .. } => "stop",
            Command::Persist { .. } => "persist",
            Command::Shutdown { .. } => "shutdown",
            Command::Discard { .. } => "discard",
            Command::Hook { .. } => "hook",
            Command::Abandon { .. } => "abandon",
            Command::Adopt { .. } => "adopt",
            Command::Relinquish { .. } => "relinquish",
        }
    }
}

/// Where in a sandbox's life a [`Command::Hook`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookPoint {
    /// After a fresh start, before its calls are ready.
    AfterStart,
    /// After a start that resumed a snapshot, before its calls are ready.
    AfterResume,
    /// After the drain of a suspension, before its Stop.
    BeforeSuspend,
    /// After the drain of a sandbox going the Shutdown way, before its Stop.
    BeforeStop,
}

impl HookPoint {
    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::AfterStart => "after-start",
            HookPoint::AfterResume => "after-resume",
            HookPoint::BeforeSuspend => "before-suspend",
            HookPoint::BeforeStop => "before-stop",
        }
    }

    /// Whether it runs on the way up (its failure fails the start).
    pub fn is_after(self) -> bool {
        matches!(self, HookPoint::AfterStart | HookPoint::AfterResume)
    }
}

/// Why a [`Command::Discard`] deletes a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiscardReason {
    /// The key's retention ([`Tiers::retain`](crate::Tiers::retain)) passed without a start.
    Retention,
    /// A newer snapshot of the key was persisted.
    Superseded,
    /// No start will ever take it: its key is one call's (scope `Call`), and that call ended.
    Unused,
    /// A start took it, and the sandbox it became is up: its workspace lives on there, and no
    /// start takes the snapshot again. What is left of it is a copy a start leaves behind (on
    /// the shelf, which a start on another host downloads from); a backend whose start moves
    /// or reuses the snapshot itself (the local root's rename, an agent-sandbox claim) has
    /// nothing of it left to delete, and must delete nothing.
    Taken,
    /// The application let it go ([`Lifecycle::drop_snapshot`](crate::Lifecycle::drop_snapshot):
    /// a kill of a paused sandbox): no start takes it.
    Dropped,
}

/// The sessions of a [`Command::Drain`]: a list that holds one session without allocating (a
/// sandbox mostly drains for its own call's session alone). Reads as a slice; serialised as a
/// sequence of names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionList(pub(crate) SmallVec<[SessionId; 1]>);

impl Deref for SessionList {
    type Target = [SessionId];

    fn deref(&self) -> &[SessionId] {
        &self.0
    }
}

impl FromIterator<SessionId> for SessionList {
    fn from_iter<I: IntoIterator<Item = SessionId>>(iter: I) -> Self {
        SessionList(iter.into_iter().collect())
    }
}

impl From<Vec<SessionId>> for SessionList {
    fn from(sessions: Vec<SessionId>) -> Self {
        SessionList(SmallVec::from_vec(sessions))
    }
}

impl IntoIterator for SessionList {
    type Item = SessionId;
    type IntoIter = smallvec::IntoIter<[SessionId; 1]>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a SessionList {
    type Item = &'a SessionId;
    type IntoIter = std::slice::Iter<'a, SessionId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `SessionList` reads as the names it was made of, however it was made.
    #[test]
    fn a_session_list_reads_as_its_names() {
        let names: Vec<SessionId> = ["a", "b"]
            .iter()
            .map(|n| SessionId::new(n).unwrap())
            .collect();
        let from_vec = SessionList::from(names.clone());
        assert_eq!(&*from_vec, names.as_slice());
        let collected: SessionList = names.iter().cloned().collect();
        assert_eq!(collected, from_vec);
        let borrowed: Vec<&SessionId> = (&collected).into_iter().collect();
        assert_eq!(borrowed, names.iter().collect::<Vec<_>>());
        let owned: Vec<SessionId> = collected.into_iter().collect();
        assert_eq!(owned, names);
    }

    /// A command that carries a fencing token tells it; one that carries none tells none.
    #[test]
    fn a_command_tells_the_token_it_carries() {
        let start = |token| Command::Start {
            sandbox: SandboxId(1),
            key: Key::Agent,
            spec: Spec::default(),
            resume_from: None,
            resumes: None,
            token,
            deadline: Instant::from_millis(5),
        };
        assert_eq!(start(Some(Token(7))).token(), Some(Token(7)));
        assert_eq!(start(None).token(), None);
        let drain = Command::Drain {
            sandbox: SandboxId(1),
            sessions: SessionList::default(),
        };
        assert_eq!(drain.token(), None);
    }

    /// A hook point's name is the one it serialises as (drivers and logs read it).
    #[test]
    fn a_hook_point_is_named_as_it_serialises() {
        for (point, name) in [
            (HookPoint::AfterStart, "after-start"),
            (HookPoint::AfterResume, "after-resume"),
            (HookPoint::BeforeSuspend, "before-suspend"),
            (HookPoint::BeforeStop, "before-stop"),
        ] {
            assert_eq!(point.as_str(), name);
            assert_eq!(
                serde_json::to_string(&point).unwrap(),
                format!("\"{name}\"")
            );
        }
    }
}
