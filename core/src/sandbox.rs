//! Sandbox records and their states.

use serde::{Deserialize, Serialize};

use crate::call::{CallIx, KeyIx};
use crate::ids::{Snapshot, UploadId};
use crate::name::ExternalId;
use crate::session::SessionIx;
use crate::small_set::SmallSet;
use crate::timer::TimerRef;

/// Where a sandbox is in its life, as the core decides it. A sandbox's liveness is this state,
/// never a flag on a backend object.
///
/// Starting → Running → (Idle, when warm) → Draining → Stopping → Persisting → ShuttingDown →
/// gone; Dead from anywhere once the backend reports it gone. Suspend ends after Persisting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxState {
    /// Start ordered, not answered.
    Starting,
    /// Up, with bound calls.
    Running,
    /// Up, no calls, kept warm for the next call of its key.
    Idle,
    /// Up, no calls, finishing its mirror work before Stop.
    Draining,
    /// Stop ordered.
    Stopping,
    /// Persist ordered.
    Persisting,
    /// Shutdown ordered.
    ShuttingDown,
    /// The backend reported it gone.
    Dead,
}

impl SandboxState {
    /// Whether uploads may be ordered into it: it is up and no Stop, Shutdown or death came.
    pub fn accepts_uploads(self) -> bool {
        matches!(
            self,
            SandboxState::Running | SandboxState::Idle | SandboxState::Draining
        )
    }
}

/// Who orders a sandbox's start and end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ownership {
    /// The core orders Start, Stop, Persist and Shutdown.
    Managed,
    /// The application supplied it; the core only binds and unbinds it.
    External(ExternalId),
}

/// Which answer the core waits for from the backend about a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Awaiting {
    Nothing,
    Start,
    Stop,
    Persist,
    Shutdown,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Sandbox {
    pub(crate) key: KeyIx,
    pub(crate) owner: Ownership,
    pub(crate) state: SandboxState,
    pub(crate) awaiting: Awaiting,
    /// Live calls bound to it (starting or ready): its reference count is this set's size.
    pub(crate) bound: SmallSet<CallIx>,
    /// Uploads in flight into it.
    pub(crate) uploads: SmallSet<UploadId>,
    /// Sessions whose mirror targets it.
    pub(crate) targeting: SmallSet<SessionIx>,
    /// How many of those have pending work or holds.
    pub(crate) busy_sessions: u32,
    /// The instant of its `Timer::Sandbox`, if set.
    pub(crate) deadline: Option<TimerRef>,
    pub(crate) shutdown_ordered: bool,
    /// The snapshot its Stop returned.
    pub(crate) snapshot: Option<Snapshot>,
}

impl Sandbox {
    pub(crate) fn new(key: KeyIx, owner: Ownership, state: SandboxState) -> Self {
        Sandbox {
            key,
            owner,
            state,
            awaiting: Awaiting::Nothing,
            bound: SmallSet::Empty,
            uploads: SmallSet::Empty,
            targeting: SmallSet::Empty,
            busy_sessions: 0,
            deadline: None,
            shutdown_ordered: false,
            snapshot: None,
        }
    }

    pub(crate) fn is_managed(&self) -> bool {
        self.owner == Ownership::Managed
    }
}
