//! Events: news for the application, drained with
//! [`Lifecycle::poll_event`](crate::Lifecycle::poll_event).

use serde::{Deserialize, Serialize};

use crate::command::HookPoint;
use crate::error::{DropReason, ErrorKind};
use crate::fleet::Token;
use crate::ids::{Key, SandboxId, Snapshot, Version};
use crate::name::{CallId, PathName, SessionId};
use crate::time::Instant;

/// Something the application may wait for or should know.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "event")]
pub enum Event {
    /// The call is bound to a sandbox that is up.
    CallReady {
        /// The call.
        call: CallId,
        /// Its sandbox.
        sandbox: SandboxId,
    },
    /// The call ended without becoming ready. Its name is free again.
    CallFailed {
        /// The call.
        call: CallId,
        /// Why: `start-failed`, `start-timeout`, `wait-timeout`, `sandbox-gone` or `closed`.
        error: ErrorKind,
    },
    /// The call's release has completed: its session's mirror work for the call's sandbox has
    /// settled (uploaded or dropped), its holds there are let go, or nothing was pending.
    /// A call released before it was bound completes at once.
    CallReleased {
        /// The call.
        call: CallId,
    },
    /// Close revoked the call at its deadline; the call has ended.
    CallRevoked {
        /// The call.
        call: CallId,
    },
    /// The sandbox this live call is bound to died. The call stays live until it is released;
    /// `resolve` for its session answers `SandboxGone`.
    SandboxLost {
        /// The call.
        call: CallId,
        /// The dead sandbox.
        sandbox: SandboxId,
    },
    /// The backend reported a managed sandbox's storage destroyed (a death, not only its
    /// running instance): whatever of its key's work it alone held is lost. Emitted once per
    /// death of a sandbox that was up or resumed its key's snapshot, whether or not calls were
    /// bound to it (they also get `SandboxLost`), so the application hears of a warm sandbox's
    /// loss too.
    WorkspaceLost {
        /// The dead sandbox.
        sandbox: SandboxId,
        /// Its key.
        key: Key,
    },
    /// A flushed version settled. Every version settles exactly once.
    Settled {
        /// The session.
        session: SessionId,
        /// The path.
        path: PathName,
        /// The version.
        version: Version,
        /// How.
        outcome: Settlement,
    },
    /// Every version flushed for this session so far has settled.
    MirrorSettled {
        /// The session.
        session: SessionId,
    },
    /// A Shutdown went unacknowledged (failed or timed out): the backend may still hold it.
    ShutdownUnconfirmed {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Every Stop or Persist the sandbox's way down ordered failed
    /// ([`WAY_DOWN_ATTEMPTS`](crate::WAY_DOWN_ATTEMPTS)), and its workspace held its key's
    /// history: it was not shut down (nothing deleted), and the core forgot it. `kept`: the
    /// snapshot its Stop took, which the key keeps and its next Start resumes (salvaged);
    /// `None`: no snapshot could be taken, the workspace stays in the backend as it is (a
    /// directory, a claim) and the key's next call starts afresh: the application decides what
    /// to do with it.
    WayDownFailed {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its key.
        key: Key,
        /// The snapshot the key keeps of it.
        kept: Option<Snapshot>,
    },
    /// A hook failed or outlasted its timeout. After a before-suspend or before-stop hook the
    /// way down goes on (a suspend turns into a shutdown under
    /// [`SuspendHookFailure::Shutdown`](crate::SuspendHookFailure::Shutdown)); after an
    /// after-start or after-resume hook its calls failed with `hook-failed`.
    HookFailed {
        /// The sandbox.
        sandbox: SandboxId,
        /// Which hook.
        hook: HookPoint,
        /// It outlasted its timeout (rather than answering a failure).
        late: bool,
    },
    /// Fleet mode: this process lost the key and fenced itself: nothing more is ordered under
    /// its token. Its starting calls failed with `fenced`, its ready calls got `SandboxLost`,
    /// its uploads were dropped (`fenced`), its sandboxes were relinquished (left in the backend
    /// for the key's next owner). Calls of the key that still wait claim it again.
    KeyFenced {
        /// The key.
        key: Key,
        /// The token it was owned under.
        token: Token,
        /// Why.
        reason: FenceReason,
    },
    /// Close has finished. No command follows; every later input is refused.
    Closed {
        /// What close did. Boxed: it is by far the largest event and comes once, and every
        /// other event is moved through the queue at the size of the largest.
        report: Box<CloseReport>,
    },
}

/// Why this process lost a key ([`Event::KeyFenced`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceReason {
    /// No renewal of this process's lease was confirmed in time: by its own clock, the store may
    /// have given the key to another process.
    LeaseLapsed,
    /// The backend refused a command: it has seen a newer token for the key's sandbox.
    Refused,
}

/// How a version settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum Settlement {
    /// It was written into this sandbox.
    Uploaded {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// A newer version of the same path took its place before it was written.
    Superseded {
        /// The newer version.
        by: Version,
    },
    /// It never reached a sandbox.
    Dropped {
        /// Why.
        reason: DropReason,
    },
}

/// What close did, in the `Closed` event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseReport {
    /// Calls still live at the close deadline, ended by close.
    pub revoked_calls: Vec<CallId>,
    /// Calls that were queued when close began, failed with `closed`.
    pub refused_waiters: Vec<CallId>,
    /// Versions dropped by close, as (session, path, version).
    pub dropped_versions: Vec<(SessionId, PathName, Version)>,
    /// Holds still taken at the close deadline, per session.
    pub revoked_holds: Vec<(SessionId, u32)>,
    /// Managed sandboxes whose Shutdown was acknowledged during close.
    pub shut_down: u64,
    /// Sandboxes suspended (persisted, not shut down) by the `Suspend` policy during close.
    pub suspended: Vec<SandboxId>,
    /// Sandboxes whose Shutdown was ordered but not acknowledged (failed, or not by the second
    /// deadline).
    pub unconfirmed: Vec<SandboxId>,
    /// The snapshots close leaves behind for the keys' next starts (a suspended sandbox, or
    /// the snapshot a Stop took), each with the end of its retention, in key order. In fleet
    /// mode they went into the keys' durable records, which carry the retention to the next
    /// owner, this process restarted included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained: Vec<Retained>,
}

/// A key's snapshot that outlives close ([`CloseReport::retained`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retained {
    /// The key.
    pub key: Key,
    /// Its snapshot.
    pub snapshot: Snapshot,
    /// The end of its retention (the core's time), when the policy has one; `None`: kept until
    /// the key's next start.
    pub until: Option<Instant>,
}
