//! Session records: bound calls, mirror slots per path, holds, pending releases.
//!
//! A session outlives its calls: its record remembers the last version of each path, so a later
//! flush continues the numbering. Most records are idle, so a record keeps only that inline;
//! everything about live calls and work in progress sits in a box that exists only while there
//! is some (`Deref` reads an empty one when there is none).

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};

use crate::call::CallIx;
use crate::ids::{Payload, SandboxId, UploadId, Version};
use crate::name::{CallId, PathName, SessionId};
use crate::time::Instant;
use crate::timer::TimerRef;

/// The mirror state of one (session, path).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Slot {
    pub(crate) path: PathName,
    /// The last version flushed.
    pub(crate) last: u64,
    work: Option<Box<SlotWork>>,
}

/// What a slot has in progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct SlotWork {
    /// The newest flushed version not yet ordered uploaded.
    pub(crate) pending: Option<(Version, Payload)>,
    /// The upload in flight, if any.
    pub(crate) inflight: Option<UploadId>,
    /// Failed attempts of the pending version.
    pub(crate) attempts: u32,
    /// When the pending version's first attempt began: all its attempts end by this plus the
    /// upload timeout.
    pub(crate) since: Option<Instant>,
    /// When the pending version may be tried again.
    pub(crate) retry_at: Option<TimerRef>,
}

static NO_WORK: SlotWork = SlotWork {
    pending: None,
    inflight: None,
    attempts: 0,
    since: None,
    retry_at: None,
};

impl Slot {
    pub(crate) fn new(path: PathName) -> Self {
        Slot {
            path,
            last: 0,
            work: None,
        }
    }

    /// Whether nothing is in progress: no pending version, no upload, no retry.
    pub(crate) fn is_quiet(&self) -> bool {
        self.pending.is_none() && self.inflight.is_none() && self.retry_at.is_none()
    }

    /// Frees the work box once nothing is in progress.
    fn compact(&mut self) {
        if self.is_quiet() {
            self.work = None;
        }
    }
}

impl Deref for Slot {
    type Target = SlotWork;

    fn deref(&self) -> &SlotWork {
        self.work.as_deref().unwrap_or(&NO_WORK)
    }
}

impl DerefMut for Slot {
    fn deref_mut(&mut self) -> &mut SlotWork {
        self.work.get_or_insert_with(Box::default)
    }
}

/// One upload in flight.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Upload {
    pub(crate) session: SessionId,
    pub(crate) path: PathName,
    pub(crate) version: Version,
    pub(crate) sandbox: SandboxId,
    pub(crate) payload: Payload,
    pub(crate) deadline: TimerRef,
    /// Failed attempts before this one.
    pub(crate) attempts: u32,
    /// When the version's first attempt began.
    pub(crate) since: Instant,
}

/// A session record: its paths inline, the rest boxed while live.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Session {
    /// One slot per path flushed, in the order first flushed. A boxed slice, not a `Vec`: most
    /// sessions have one path, and the spare capacity word would be paid by every idle record.
    pub(crate) paths: Box<[Slot]>,
    /// Its stamp in the idle queue, while idle. Non-zero, so the option costs no extra word:
    /// records are mostly idle and there can be a million of them.
    pub(crate) idle_stamp: Option<NonZeroU64>,
    live: Option<Box<Live>>,
}

/// The parts of a session record that matter only while something is live.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Live {
    /// Live calls bound to a sandbox, in the order they became ready.
    pub(crate) ready: Vec<CallIx>,
    /// Live calls still waiting or starting: a sandbox is coming.
    pub(crate) coming: u32,
    /// The sandbox of the session's last released call, while it accepts uploads.
    pub(crate) linger: Option<SandboxId>,
    /// Where its mirror goes now: the first ready call's sandbox that accepts uploads, else the
    /// linger sandbox.
    pub(crate) target: Option<SandboxId>,
    /// The sandbox whose `busy_sessions` counts this session.
    pub(crate) busy_on: Option<SandboxId>,
    pub(crate) holds: u32,
    /// Released calls whose release has not completed, with their sandbox.
    pub(crate) releasing: Vec<(CallId, SandboxId)>,
    /// Whether it had unsettled versions when last looked at (for `MirrorSettled`).
    pub(crate) unsettled: bool,
}

static NOT_LIVE: Live = Live {
    ready: Vec::new(),
    coming: 0,
    linger: None,
    target: None,
    busy_on: None,
    holds: 0,
    releasing: Vec::new(),
    unsettled: false,
};

impl Deref for Session {
    type Target = Live;

    fn deref(&self) -> &Live {
        self.live.as_deref().unwrap_or(&NOT_LIVE)
    }
}

impl DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Live {
        self.live.get_or_insert_with(Box::default)
    }
}

impl Session {
    /// Adds a slot for a path the session never flushed before (rare: a reallocation).
    pub(crate) fn add_path(&mut self, path: PathName) {
        // Exactly the room needed, so the boxed slice takes the allocation as it is.
        let mut paths = Vec::with_capacity(self.paths.len() + 1);
        paths.extend(std::mem::take(&mut self.paths).into_vec());
        paths.push(Slot::new(path));
        self.paths = paths.into_boxed_slice();
    }

    pub(crate) fn slot(&self, path: &PathName) -> Option<usize> {
        self.paths.iter().position(|s| &s.path == path)
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.paths.iter().any(|s| s.pending.is_some())
    }

    pub(crate) fn has_unsettled(&self) -> bool {
        self.paths
            .iter()
            .any(|s| s.pending.is_some() || s.inflight.is_some())
    }

    /// Whether this session must keep its target sandbox from finishing its drain.
    pub(crate) fn is_busy(&self) -> bool {
        self.holds > 0 || self.has_pending()
    }

    /// Whether nothing about it is live: the record only remembers versions.
    pub(crate) fn is_idle(&self) -> bool {
        self.ready.is_empty()
            && self.coming == 0
            && self.holds == 0
            && self.target.is_none()
            && self.linger.is_none()
            && self.releasing.is_empty()
            && !self.has_unsettled()
    }

    /// Frees the boxes of an idle record, keeping only its versions.
    pub(crate) fn compact(&mut self) {
        debug_assert!(self.is_idle());
        self.live = None;
        for slot in &mut self.paths {
            slot.compact();
        }
    }
}

/// Idle session records, oldest first, so the oldest can be forgotten past the limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct IdleSessions {
    pub(crate) queue: VecDeque<(SessionId, NonZeroU64)>,
    pub(crate) count: usize,
    /// The last stamp given (stamps count from 1).
    pub(crate) last_stamp: u64,
}
