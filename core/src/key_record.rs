//! Fleet mode: what this process knows of an owned key's durable record in the store (the
//! record last confirmed, the write in flight, a write left in doubt), owned by the key's slot
//! ([`KeySlot::record`](crate::key::KeySlot::record)) and changed only through the transitions
//! here.
//!
//! The three belong together because each decision reads them together: whether the record
//! must be written again ([`says`](StoreRecord::says)), whether a sandbox may be named by what
//! the store holds or will hold ([`may_name`](StoreRecord::may_name)), whether calls may bind
//! while a write names another sandbox ([`names_another`](StoreRecord::names_another)).
//!
//! ```text
//!            write                 answered: written
//!  settled ─────────▶ writing ─────────────────────────▶ settled (confirmed = what it wrote)
//!     ▲                  │  answered: failed (nothing landed)        ▲
//!     │                  ├───────────────────────────────▶ settled   │ a newer write confirmed
//!     │                  │  unanswered in time                       │
//!     │                  └───────────────────────────────▶ in doubt ─┘ (written again meanwhile)
//!     └── claimed (confirmed = the record the claim handed out) / forgotten (released, fenced)
//! ```

use crate::fleet::{KeyRecord, RecordingId};
use crate::ids::SandboxId;
use serde::{Deserialize, Serialize};

/// The empty record, which a `confirmed` of `None` stands for.
static NO_RECORD: KeyRecord = KeyRecord {
    snapshot: None,
    warm: None,
};

/// An owned key's record as this process knows it (see the module docs). Boxed parts: only
/// fleet keys write records, and a key slot is moved whole when it is made and forgotten (each
/// call cycle on a fresh key does both), so a slot outside fleet mode carries three `None`
/// pointers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct StoreRecord {
    /// What the store's record says, as last confirmed (once claimed: the record the claim
    /// handed out, which the store keeps). `None` is the empty record.
    #[serde(default)]
    confirmed: Option<Box<KeyRecord>>,
    /// The write under way, with what it writes.
    #[serde(default)]
    writing: Option<Box<(RecordingId, KeyRecord)>>,
    /// The record a write carried that went unanswered in time and may still land, over what
    /// `confirmed` says, until a newer write is confirmed (the store keeps the newest).
    #[serde(default)]
    in_doubt: Option<Box<KeyRecord>>,
}

impl StoreRecord {
    // ------------------------------------------------------------------------------------------
    // Reading

    /// What the store's record says, as last confirmed.
    pub(crate) fn confirmed(&self) -> &KeyRecord {
        self.confirmed.as_deref().unwrap_or(&NO_RECORD)
    }

    /// Whether a write is under way.
    pub(crate) fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Whether the write under way is `recording`.
    pub(crate) fn writes(&self, recording: RecordingId) -> bool {
        matches!(&self.writing, Some(w) if w.0 == recording)
    }

    /// Whether the store surely says `record`: it was confirmed, and no write in doubt may
    /// land over it. Otherwise the record is written (again).
    pub(crate) fn says(&self, record: &KeyRecord) -> bool {
        *record == *self.confirmed() && self.in_doubt.is_none()
    }

    /// Whether the store's record may name `sandbox` warm: the confirmed record does, or the
    /// write under way does.
    pub(crate) fn may_name(&self, sandbox: SandboxId) -> bool {
        self.confirmed().warm == Some(sandbox)
            || matches!(&self.writing, Some(w) if w.1.warm == Some(sandbox))
    }

    /// Whether the write under way, or one in doubt, names as warm a sandbox other than
    /// `current`.
    pub(crate) fn names_another(&self, current: Option<SandboxId>) -> bool {
        let another = |r: &KeyRecord| r.warm.is_some_and(|id| Some(id) != current);
        self.writing.as_ref().is_some_and(|w| another(&w.1))
            || self.in_doubt.as_deref().is_some_and(another)
    }

    // ------------------------------------------------------------------------------------------
    // Transitions

    /// The key was claimed with `record`: the store keeps it until this process writes a newer
    /// one, and nothing of an earlier ownership is under way or in doubt.
    pub(crate) fn claimed(&mut self, record: &KeyRecord) {
        self.confirmed = (!record.is_empty()).then(|| Box::new(record.clone()));
        self.writing = None;
        self.in_doubt = None;
    }

    /// The key is no longer this process's (released, or fenced): no write of it is awaited
    /// or in doubt any more.
    pub(crate) fn forgotten(&mut self) {
        self.writing = None;
        self.in_doubt = None;
    }

    /// `record` is being written as `recording`.
    pub(crate) fn write(&mut self, recording: RecordingId, record: KeyRecord) {
        debug_assert!(self.writing.is_none(), "one record write at a time");
        self.writing = Some(Box::new((recording, record)));
    }

    /// The write under way was answered `written`: the store says what it wrote, and no
    /// earlier write in doubt can land over it. Panics without a write under way (the caller
    /// found it by [`writes`](Self::writes)).
    pub(crate) fn written(&mut self) {
        let (_, record) = *self.writing.take().expect("a record write under way");
        self.confirmed = (!record.is_empty()).then(|| Box::new(record));
        self.in_doubt = None;
    }

    /// The write under way failed: nothing landed, what was confirmed stands.
    pub(crate) fn failed(&mut self) {
        self.writing = None;
    }

    /// The write under way went unanswered in time: it may still land. Its id, if one was
    /// under way.
    pub(crate) fn unanswered(&mut self) -> Option<RecordingId> {
        let (recording, record) = *self.writing.take()?;
        self.in_doubt = Some(Box::new(record));
        Some(recording)
    }
}
