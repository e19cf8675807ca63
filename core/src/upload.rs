//! Uploads in flight: one record per Upload command the core awaits an answer to.

use serde::{Deserialize, Serialize};

use crate::id_index::IdIndex;
use crate::ids::{Payload, UploadId, Version};
use crate::sandbox::SandboxIx;
use crate::session::SessionIx;
use crate::small_set::Few;
use crate::time::Instant;
use crate::timer::TimerRef;

slotmap::new_key_type! {
    /// An upload's place in the upload table. Records refer to uploads by it; an answer's
    /// [`UploadId`] is looked up once ([`Uploads::find`]).
    pub(crate) struct UploadIx;
}

/// One upload in flight.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Upload {
    /// Its id, as the Upload command and its answer name it.
    pub(crate) id: UploadId,
    pub(crate) session: SessionIx,
    /// The path's slot in its session (slots are never removed, so the place is stable).
    pub(crate) slot: usize,
    pub(crate) version: Version,
    pub(crate) sandbox: SandboxIx,
    pub(crate) payload: Payload,
    pub(crate) deadline: TimerRef,
    /// Failed attempts before this one.
    pub(crate) attempts: u32,
    /// When the version's first attempt began.
    pub(crate) since: Instant,
}

/// The uploads in flight: records in a generational slab, the index from ids to places, and the
/// next id (ids are never reused, so a late answer names an upload that is gone, never another).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Uploads {
    records: slotmap::SlotMap<UploadIx, Upload>,
    by_id: IdIndex<UploadId, UploadIx>,
    next_id: u64,
}

impl Uploads {
    /// The id the next upload gets.
    pub(crate) fn next_id(&self) -> UploadId {
        UploadId(self.next_id)
    }

    /// Tracks an upload under the next id (`upload.id` must be [`Uploads::next_id`]).
    #[inline(always)]
    pub(crate) fn insert(&mut self, upload: Upload) -> UploadIx {
        debug_assert_eq!(upload.id, self.next_id());
        self.next_id += 1;
        let id = upload.id;
        let ix = self.records.insert(upload);
        self.by_id.insert(id, ix);
        ix
    }

    /// The place of the upload `id`, if it is in flight. The one lookup of an upload id per
    /// answer.
    pub(crate) fn find(&self, id: UploadId) -> Option<UploadIx> {
        self.by_id.get(id)
    }

    /// Whether `id` was ever handed out.
    pub(crate) fn was_handed_out(&self, id: UploadId) -> bool {
        id.0 < self.next_id
    }

    /// The upload at `ix`, if it is still in flight.
    pub(crate) fn get(&self, ix: UploadIx) -> Option<&Upload> {
        self.records.get(ix)
    }

    /// Ends an upload.
    #[inline(always)]
    pub(crate) fn remove(&mut self, ix: UploadIx) -> Upload {
        let up = self.records.remove(ix).expect("an upload in flight");
        self.by_id.remove(up.id);
        up
    }

    /// Uploads in flight.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every upload, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (UploadIx, &Upload)> {
        self.records.iter()
    }

    /// `uploads` in id order: the order in which several uploads reach an output.
    pub(crate) fn in_id_order(&self, mut uploads: Few<UploadIx>) -> Few<UploadIx> {
        uploads.sort_by_key(|u| self.records[*u].id);
        uploads
    }

    /// Whether the id index and the records agree (for the invariant check).
    pub(crate) fn index_agrees(&self) -> bool {
        self.by_id.len() == self.records.len()
            && self
                .by_id
                .iter()
                .all(|(id, ix)| self.records.get(ix).is_some_and(|u| u.id == id))
    }
}

impl std::ops::Index<UploadIx> for Uploads {
    type Output = Upload;

    fn index(&self, ix: UploadIx) -> &Upload {
        &self.records[ix]
    }
}

impl std::ops::IndexMut<UploadIx> for Uploads {
    fn index_mut(&mut self, ix: UploadIx) -> &mut Upload {
        &mut self.records[ix]
    }
}
