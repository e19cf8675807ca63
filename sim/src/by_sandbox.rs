//! The history's records of sandboxes, found by id with no hashing.
//!
//! A core numbers its sandboxes from 0 in the order it makes them (`SandboxId`'s docs), so the
//! ids a run meets are dense: a vector indexed by the id finds a record with one bounds check,
//! where a hash map probed a group of slots (the getter checks look a sandbox up several times
//! per live call after every input). An id far past every one seen so far (only a scenario's
//! made-up id could be) is kept in a map instead, so no id makes the vector huge.

use sandkeeper::SandboxId;

use crate::fastmap::FastMap;

/// How far past the ids seen so far an id may be and still go in the vector.
const DENSE_REACH: u64 = 1024;

/// Records by sandbox id: the vector for dense ids, a map for the rest.
#[derive(Clone, Debug)]
pub struct BySandbox<V> {
    dense: Vec<Option<V>>,
    sparse: FastMap<SandboxId, V>,
}

impl<V> Default for BySandbox<V> {
    fn default() -> Self {
        BySandbox {
            dense: Vec::new(),
            sparse: FastMap::default(),
        }
    }
}

impl<V: Default> BySandbox<V> {
    /// The record of `x`, if one was made.
    #[inline]
    pub fn get(&self, x: &SandboxId) -> Option<&V> {
        match self.dense.get(Self::place(x)) {
            Some(slot) => slot.as_ref(),
            None => self.sparse.get(x),
        }
    }

    /// The record of `x`, made empty when there is none.
    #[inline]
    pub fn entry(&mut self, x: SandboxId) -> &mut V {
        let i = Self::place(&x);
        if i >= self.dense.len() {
            if x.0 >= self.dense.len() as u64 + DENSE_REACH {
                return self.sparse.entry(x).or_default();
            }
            self.grow(i + 1);
        }
        self.dense[i].get_or_insert_with(V::default)
    }

    /// Every record with its id, in no set order.
    pub fn iter(&self) -> impl Iterator<Item = (SandboxId, &V)> {
        let dense = self.dense.iter().enumerate();
        dense
            .filter_map(|(i, v)| Some((SandboxId(i as u64), v.as_ref()?)))
            .chain(self.sparse.iter().map(|(x, v)| (*x, v)))
    }

    /// Lengthens the vector to `len`, taking in the map's records it now covers (the map
    /// holds only ids past the vector's end).
    #[cold]
    fn grow(&mut self, len: usize) {
        self.dense.resize_with(len, || None);
        if !self.sparse.is_empty() {
            let covered: Vec<SandboxId> = self
                .sparse
                .keys()
                .filter(|x| Self::place(x) < len)
                .copied()
                .collect();
            for x in covered {
                self.dense[Self::place(&x)] = self.sparse.remove(&x);
            }
        }
    }

    /// `x`'s place in the vector (`usize::MAX`, past any vector, for an id that has none).
    #[inline]
    fn place(x: &SandboxId) -> usize {
        usize::try_from(x.0).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_far_ids_keep_their_records() {
        let mut m: BySandbox<u32> = BySandbox::default();
        assert_eq!(m.get(&SandboxId(0)), None);
        *m.entry(SandboxId(0)) = 1;
        *m.entry(SandboxId(3)) = 4;
        // Far past every id seen: kept in the map, the vector stays short.
        *m.entry(SandboxId(1 << 40)) = 7;
        *m.entry(SandboxId(u64::MAX)) = 8;
        assert_eq!(m.dense.len(), 4);
        assert_eq!(m.get(&SandboxId(0)), Some(&1));
        assert_eq!(m.get(&SandboxId(1)), None);
        assert_eq!(m.get(&SandboxId(3)), Some(&4));
        assert_eq!(m.get(&SandboxId(1 << 40)), Some(&7));
        assert_eq!(m.get(&SandboxId(u64::MAX)), Some(&8));
        assert_eq!(m.get(&SandboxId(4)), None);
        // A made record is found again, not made twice.
        *m.entry(SandboxId(3)) += 1;
        assert_eq!(m.get(&SandboxId(3)), Some(&5));
        // The vector reaching a far id takes its record in.
        *m.entry(SandboxId(1500)) = 9;
        assert!(m.sparse.contains_key(&SandboxId(1500)));
        *m.entry(SandboxId(1000)) = 10;
        *m.entry(SandboxId(2000)) = 11;
        assert_eq!(m.dense.len(), 2001);
        assert!(!m.sparse.contains_key(&SandboxId(1500)));
        assert_eq!(m.get(&SandboxId(1500)), Some(&9));
        assert_eq!(m.get(&SandboxId(1000)), Some(&10));
        assert_eq!(m.get(&SandboxId(2000)), Some(&11));
        let mut all: Vec<(u64, u32)> = m.iter().map(|(x, v)| (x.0, *v)).collect();
        all.sort();
        let want = [
            (0, 1),
            (3, 5),
            (1000, 10),
            (1500, 9),
            (2000, 11),
            (1 << 40, 7),
            (u64::MAX, 8),
        ];
        assert_eq!(all, want);
        assert_eq!(m.get(&SandboxId(1 << 40)), Some(&7));
    }
}
