//! The index from the ids the core hands out (sandboxes, uploads) to their records' places.
//!
//! An open-addressing table with linear probing, written here rather than a `HashMap` because
//! these keys need no hashing of text and are looked up on every answer: a lookup is a
//! multiply, a shift and, almost always, one compare (a call cycle makes an insert, three
//! finds and a remove for its sandbox, and an insert, a find and a remove per upload). Deletion
//! shifts the probe run back (no
//! tombstones), and the table stays at most half full, so a probe run is short whatever the
//! ids.

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::ids::{SandboxId, UploadId};

/// An id the core hands out: a `u64` that names one record for the life of the core.
pub(crate) trait Id: Copy + Eq + Ord {
    /// Its number.
    fn number(self) -> u64;
}

impl Id for SandboxId {
    fn number(self) -> u64 {
        self.0
    }
}

impl Id for UploadId {
    fn number(self) -> u64 {
        self.0
    }
}

/// The smallest table, once one entry is in.
const MIN_SLOTS: usize = 8;

/// Ids to places (`V`: a table's slab key). See the module's doc.
#[derive(Clone, Debug)]
pub(crate) struct IdIndex<K, V> {
    /// A power of two long (or empty); at most half of them full.
    slots: Vec<Option<(K, V)>>,
    len: usize,
}

impl<K, V> Default for IdIndex<K, V> {
    fn default() -> Self {
        IdIndex {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Id, V: Copy> IdIndex<K, V> {
    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot where `id`'s probe run starts (the table is not empty): Fibonacci hashing,
    /// the product's top bits, so that consecutive ids spread.
    #[inline]
    fn home(&self, id: K) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (id.number().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        (i + 1) & (self.slots.len() - 1)
    }

    /// The slot holding `id`, if any.
    #[inline]
    fn slot_of(&self, id: K) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut i = self.home(id);
        loop {
            match &self.slots[i] {
                None => return None,
                Some((k, _)) if *k == id => return Some(i),
                Some(_) => i = self.next(i),
            }
        }
    }

    /// The place of `id`.
    #[inline]
    pub(crate) fn get(&self, id: K) -> Option<V> {
        self.slot_of(id).and_then(|i| self.slots[i].map(|(_, v)| v))
    }

    /// Whether `id` is held.
    pub(crate) fn contains_key(&self, id: K) -> bool {
        self.slot_of(id).is_some()
    }

    /// Holds `id` at `place`; `id` must not be held already (ids are handed out once).
    #[inline]
    pub(crate) fn insert(&mut self, id: K, place: V) {
        debug_assert!(!self.contains_key(id), "an id is indexed once");
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(id);
        while self.slots[i].is_some() {
            i = self.next(i);
        }
        self.slots[i] = Some((id, place));
        self.len += 1;
    }

    /// Doubles the table (or makes the first one) and places every entry again.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![None; size]);
        self.len = 0;
        for (id, place) in old.into_iter().flatten() {
            self.insert(id, place);
        }
    }

    /// Forgets `id`, returning its place.
    #[inline]
    pub(crate) fn remove(&mut self, id: K) -> Option<V> {
        let mut hole = self.slot_of(id)?;
        let (_, place) = self.slots[hole].take().expect("found");
        self.len -= 1;
        // Shift the rest of the probe run back over the hole: an entry moves when the hole
        // lies between its home and where it is (cyclically), so every entry stays reachable
        // from its home without passing an empty slot.
        let mask = self.slots.len() - 1;
        let mut i = self.next(hole);
        while let Some((k, _)) = self.slots[i] {
            let home = self.home(k);
            if i.wrapping_sub(home) & mask >= i.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[i].take();
                hole = i;
            }
            i = self.next(i);
        }
        Some(place)
    }

    /// Every entry, in no order that may reach an output.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (K, V)> + '_ {
        self.slots.iter().flatten().copied()
    }

    /// Forgets every entry.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }
}

/// Serialised as a map from id to place in id order, so a serialised state does not depend on
/// the table's layout.
impl<K: Id + Serialize, V: Copy + Serialize> Serialize for IdIndex<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<(K, V)> = self.iter().collect();
        entries.sort_by_key(|(id, _)| *id);
        let mut map = s.serialize_map(Some(entries.len()))?;
        for (id, place) in &entries {
            map.serialize_entry(id, place)?;
        }
        map.end()
    }
}

impl<'de, K, V> Deserialize<'de> for IdIndex<K, V>
where
    K: Id + Deserialize<'de>,
    V: Copy + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries: Vec<(K, V)> = std::collections::BTreeMap::<K, V>::deserialize(d)?
            .into_iter()
            .collect();
        let mut index = IdIndex::default();
        for (id, place) in entries {
            index.insert(id, place);
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    proptest::proptest! {
        /// The table against a `BTreeMap`: any mix of inserts of new ids, removes and lookups
        /// (ids from a narrow range, so that probe runs collide and wrap) agrees at every step.
        #[test]
        fn the_index_agrees_with_a_map(ops in proptest::collection::vec((0u8..3, 0u64..48), 0..300)) {
            let mut index: IdIndex<SandboxId, u32> = IdIndex::default();
            let mut model: BTreeMap<u64, u32> = BTreeMap::new();
            for (step, (op, n)) in ops.into_iter().enumerate() {
                let id = SandboxId(n * 8);
                match op {
                    0 if !model.contains_key(&id.0) => {
                        index.insert(id, step as u32);
                        model.insert(id.0, step as u32);
                    }
                    1 => {
                        proptest::prop_assert_eq!(index.remove(id), model.remove(&id.0));
                    }
                    _ => {}
                }
                proptest::prop_assert_eq!(index.len(), model.len());
                for k in 0..48 {
                    let id = SandboxId(k * 8);
                    proptest::prop_assert_eq!(index.get(id), model.get(&id.0).copied());
                    proptest::prop_assert_eq!(index.contains_key(id), model.contains_key(&id.0));
                }
                let mut held: Vec<(u64, u32)> = index.iter().map(|(k, v)| (k.0, v)).collect();
                held.sort_unstable();
                let expected: Vec<(u64, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                proptest::prop_assert_eq!(held, expected);
            }
        }
    }

    /// Ids handed out one after another spread over the table: no probe run is long, as the
    /// module's doc promises (every id hashed to one slot would still be correct, and slow).
    #[test]
    fn consecutive_ids_spread_over_the_table() {
        for first in [0, 1 << 32, u64::MAX - 5000] {
            let mut index: IdIndex<SandboxId, u32> = IdIndex::default();
            for n in 0..3000u64 {
                index.insert(SandboxId(first.wrapping_add(n)), n as u32);
                assert!(index.slots.len() >= 2 * index.len(), "at most half full");
            }
            let mask = index.slots.len() - 1;
            let longest = index
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| slot.map(|(id, _)| i.wrapping_sub(index.home(id)) & mask))
                .max()
                .unwrap();
            assert!(longest <= 4, "an entry {longest} slots from its home");
            // Removing every other one keeps the rest reachable.
            for n in (0..3000u64).step_by(2) {
                assert_eq!(
                    index.remove(SandboxId(first.wrapping_add(n))),
                    Some(n as u32)
                );
            }
            for n in 0..3000u64 {
                let expected = (n % 2 == 1).then_some(n as u32);
                assert_eq!(index.get(SandboxId(first.wrapping_add(n))), expected);
            }
        }
    }

    #[test]
    fn it_serialises_as_a_map_in_id_order_and_back() {
        let mut index: IdIndex<UploadId, u32> = IdIndex::default();
        for n in [9, 2, 40, 7] {
            index.insert(UploadId(n), n as u32 * 10);
        }
        let json = serde_json::to_string(&index).unwrap();
        assert_eq!(json, r#"{"2":20,"7":70,"9":90,"40":400}"#);
        let back: IdIndex<UploadId, u32> = serde_json::from_str(&json).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.get(UploadId(40)), Some(400));
        assert_eq!(back.get(UploadId(41)), None);
    }

    #[test]
    fn an_empty_index_finds_nothing_and_clears() {
        let mut index: IdIndex<SandboxId, u32> = IdIndex::default();
        assert_eq!(index.get(SandboxId(0)), None);
        assert_eq!(index.remove(SandboxId(0)), None);
        index.insert(SandboxId(0), 1);
        assert_eq!(index.get(SandboxId(0)), Some(1));
        index.clear();
        assert_eq!(index.len(), 0);
        assert_eq!(index.get(SandboxId(0)), None);
        index.insert(SandboxId(0), 2);
        assert_eq!(index.get(SandboxId(0)), Some(2));
    }
}
