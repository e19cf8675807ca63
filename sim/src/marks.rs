//! Coverage marks: rare paths a seed batch must reach. Each run sets the marks it reached; a
//! batch reports their union and which are missing.

/// One rare path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mark {
    /// A drain ended at its deadline with work left.
    DrainDeadline,
    /// A sandbox died with an upload in flight into it.
    DeathDuringUpload,
    /// A sandbox died while draining.
    DeathDuringDrain,
    /// A sandbox died while starting.
    DeathDuringStart,
    /// A queued call timed out.
    WaitTimeout,
    /// Close revoked a live call.
    CloseRevokedCall,
    /// Close refused a queued call.
    CloseRefusedWaiter,
    /// An answer came for a command no longer awaited.
    StaleAnswer,
    /// A start timed out.
    StartTimeout,
    /// A start failed.
    StartFailed,
    /// A key's queue was full.
    QueueFull,
    /// A transient upload failure was retried.
    UploadRetry,
    /// An upload timed out.
    UploadTimeout,
    /// An upload reported its sandbox gone.
    UploadGone,
    /// A version was superseded.
    Superseded,
    /// A version was dropped for lack of a sandbox.
    DroppedNoSandbox,
    /// A version was dropped by close.
    DroppedClosed,
    /// A version was dropped after every retry failed.
    DroppedUploadFailed,
    /// A sandbox was suspended.
    Suspended,
    /// A warm or draining sandbox was revived.
    Revival,
    /// A Start carried a snapshot to resume from.
    ResumeFrom,
    /// A Shutdown went unconfirmed.
    ShutdownUnconfirmed,
    /// A Stop failed.
    StopFailed,
    /// A Persist failed.
    PersistFailed,
    /// A start answered after all its calls ended.
    OrphanStart,
    /// A bound call's sandbox died under it.
    SandboxLost,
    /// Two live calls shared one sandbox.
    SharedSandbox,
    /// A Drain named a session that held a hold.
    DrainWaitsForHold,
    /// A call was released while waiting or starting (a cancellation).
    CancelBeforeReady,
    /// A ready call's release asked its sandbox's way down (`release_as`).
    ReleaseAsked,
    /// The application dropped a key's snapshot (`drop_snapshot`).
    SnapshotDropped,
    /// A live call's name was acquired again.
    DuplicateCall,
    /// An ended call was released again.
    AlreadyReleased,
    /// Close finished.
    Closed,
    /// A duplicate answer was given.
    DuplicateAnswer,
    /// A sandbox's running instance was reported gone while it was being suspended.
    InstanceGoneWhileSuspending,
    /// A sandbox's instance was lost while it was up: its workspace kept (a suspension).
    InstanceLostKept,
    /// A loss was reported for a suspended sandbox after its key had resumed it as another
    /// (the late-Delete race: stale for the core).
    LateLossAfterResume,
    /// An outstanding Start, Stop or Persist was abandoned.
    Abandoned,
    /// A key's snapshot was discarded when its retention passed.
    DiscardRetention,
    /// An after-start or after-resume hook was ordered.
    HookAfter,
    /// A before-suspend or before-stop hook was ordered.
    HookBefore,
    /// A hook failed or outlasted its timeout.
    HookFailed,
}

/// Every mark, in report order.
pub const ALL: [Mark; 43] = [
    Mark::DrainDeadline,
    Mark::DeathDuringUpload,
    Mark::DeathDuringDrain,
    Mark::DeathDuringStart,
    Mark::WaitTimeout,
    Mark::CloseRevokedCall,
    Mark::CloseRefusedWaiter,
    Mark::StaleAnswer,
    Mark::StartTimeout,
    Mark::StartFailed,
    Mark::QueueFull,
    Mark::UploadRetry,
    Mark::UploadTimeout,
    Mark::UploadGone,
    Mark::Superseded,
    Mark::DroppedNoSandbox,
    Mark::DroppedClosed,
    Mark::DroppedUploadFailed,
    Mark::Suspended,
    Mark::Revival,
    Mark::ResumeFrom,
    Mark::ShutdownUnconfirmed,
    Mark::StopFailed,
    Mark::PersistFailed,
    Mark::OrphanStart,
    Mark::SandboxLost,
    Mark::SharedSandbox,
    Mark::DrainWaitsForHold,
    Mark::CancelBeforeReady,
    Mark::ReleaseAsked,
    Mark::SnapshotDropped,
    Mark::DuplicateCall,
    Mark::AlreadyReleased,
    Mark::Closed,
    Mark::DuplicateAnswer,
    Mark::InstanceGoneWhileSuspending,
    Mark::InstanceLostKept,
    Mark::LateLossAfterResume,
    Mark::Abandoned,
    Mark::DiscardRetention,
    Mark::HookAfter,
    Mark::HookBefore,
    Mark::HookFailed,
];

impl Mark {
    /// The mark's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mark::DrainDeadline => "drain-deadline",
            Mark::DeathDuringUpload => "death-during-upload",
            Mark::DeathDuringDrain => "death-during-drain",
            Mark::DeathDuringStart => "death-during-start",
            Mark::WaitTimeout => "wait-timeout",
            Mark::CloseRevokedCall => "close-revoked-call",
            Mark::CloseRefusedWaiter => "close-refused-waiter",
            Mark::StaleAnswer => "stale-answer",
            Mark::StartTimeout => "start-timeout",
            Mark::StartFailed => "start-failed",
            Mark::QueueFull => "queue-full",
            Mark::UploadRetry => "upload-retry",
            Mark::UploadTimeout => "upload-timeout",
            Mark::UploadGone => "upload-gone",
            Mark::Superseded => "superseded",
            Mark::DroppedNoSandbox => "dropped-no-sandbox",
            Mark::DroppedClosed => "dropped-closed",
            Mark::DroppedUploadFailed => "dropped-upload-failed",
            Mark::Suspended => "suspended",
            Mark::Revival => "revival",
            Mark::ResumeFrom => "resume-from-snapshot",
            Mark::ShutdownUnconfirmed => "shutdown-unconfirmed",
            Mark::StopFailed => "stop-failed",
            Mark::PersistFailed => "persist-failed",
            Mark::OrphanStart => "orphan-start",
            Mark::SandboxLost => "sandbox-lost",
            Mark::SharedSandbox => "shared-sandbox",
            Mark::DrainWaitsForHold => "drain-waits-for-hold",
            Mark::CancelBeforeReady => "cancel-before-ready",
            Mark::ReleaseAsked => "release-asked",
            Mark::SnapshotDropped => "snapshot-dropped",
            Mark::DuplicateCall => "duplicate-call",
            Mark::AlreadyReleased => "already-released",
            Mark::Closed => "closed",
            Mark::DuplicateAnswer => "duplicate-answer",
            Mark::InstanceGoneWhileSuspending => "instance-gone-while-suspending",
            Mark::InstanceLostKept => "instance-lost-kept",
            Mark::LateLossAfterResume => "late-loss-after-resume",
            Mark::Abandoned => "abandoned",
            Mark::DiscardRetention => "discard-retention",
            Mark::HookAfter => "hook-after",
            Mark::HookBefore => "hook-before",
            Mark::HookFailed => "hook-failed",
        }
    }
}

/// A set of marks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks(u64);

impl Marks {
    /// Sets a mark.
    pub fn hit(&mut self, mark: Mark) {
        self.0 |= 1 << (mark as u8);
    }

    /// Whether a mark is set.
    pub fn has(&self, mark: Mark) -> bool {
        self.0 & (1 << (mark as u8)) != 0
    }

    /// The union of two sets.
    pub fn union(self, other: Marks) -> Marks {
        Marks(self.0 | other.0)
    }

    /// The names of the marks set.
    pub fn reached(&self) -> Vec<&'static str> {
        ALL.iter()
            .filter(|m| self.has(**m))
            .map(|m| m.name())
            .collect()
    }

    /// The names of the marks not set.
    pub fn missing(&self) -> Vec<&'static str> {
        ALL.iter()
            .filter(|m| !self.has(**m))
            .map(|m| m.name())
            .collect()
    }
}
