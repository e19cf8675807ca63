//! An ordered set that holds one element without allocating.
//!
//! Most sandboxes have one call, one session and at most one upload in flight; a `BTreeSet`
//! allocates a node for each of those. `SmallSet` keeps a lone element inline and switches to a
//! `BTreeSet` from the second one. Iteration is in ascending order either way.
//!
//! Kept hand-written rather than taken from `smallvec`: the core's output order depends on the
//! ascending iteration, and a set may grow large (every call of an agent bound to its one
//! sandbox), where a sorted `SmallVec` would make each insert and remove O(n) instead of
//! O(log n).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A short list kept inline (no allocation up to four elements): the calls, sessions or
/// uploads that one input hands on in order, and a session's ready calls.
pub(crate) type Few<T> = smallvec::SmallVec<[T; 4]>;

/// An ordered set, inline while it has at most one element.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) enum SmallSet<T: Ord> {
    #[default]
    Empty,
    One(T),
    Many(BTreeSet<T>),
}

impl<T: Ord + Clone> SmallSet<T> {
    /// Adds `item`; false when it was there already.
    #[inline]
    pub(crate) fn insert(&mut self, item: T) -> bool {
        match self {
            SmallSet::Empty => {
                *self = SmallSet::One(item);
                true
            }
            SmallSet::One(one) => {
                if *one == item {
                    return false;
                }
                let mut many = BTreeSet::new();
                many.insert(one.clone());
                many.insert(item);
                *self = SmallSet::Many(many);
                true
            }
            SmallSet::Many(many) => many.insert(item),
        }
    }

    /// Removes `item`; false when it was not there.
    #[inline]
    pub(crate) fn remove(&mut self, item: &T) -> bool {
        match self {
            SmallSet::Empty => false,
            SmallSet::One(one) => {
                if one == item {
                    *self = SmallSet::Empty;
                    true
                } else {
                    false
                }
            }
            SmallSet::Many(many) => {
                let removed = many.remove(item);
                if many.is_empty() {
                    *self = SmallSet::Empty;
                }
                removed
            }
        }
    }

    pub(crate) fn contains(&self, item: &T) -> bool {
        match self {
            SmallSet::Empty => false,
            SmallSet::One(one) => one == item,
            SmallSet::Many(many) => many.contains(item),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            SmallSet::Empty => 0,
            SmallSet::One(_) => 1,
            SmallSet::Many(many) => many.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, SmallSet::Empty)
    }

    /// The elements in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        let (one, many) = match self {
            SmallSet::Empty => (None, None),
            SmallSet::One(one) => (Some(one), None),
            SmallSet::Many(many) => (None, Some(many.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Takes every element out, in ascending order, inline while there are few.
    pub(crate) fn take(&mut self) -> Few<T> {
        match std::mem::take(self) {
            SmallSet::Empty => Few::new(),
            SmallSet::One(one) => smallvec::smallvec![one],
            SmallSet::Many(many) => many.into_iter().collect(),
        }
    }

    /// The elements in ascending order, copied out inline while there are few. (Collecting
    /// [`SmallSet::iter`] goes through a chained iterator, which costs several times more for
    /// the usual lone element.)
    pub(crate) fn to_few(&self) -> Few<T>
    where
        T: Copy,
    {
        match self {
            SmallSet::Empty => Few::new(),
            SmallSet::One(one) => smallvec::smallvec![*one],
            SmallSet::Many(many) => many.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_an_ordered_set() {
        let mut s = SmallSet::default();
        assert!(s.is_empty());
        assert!(s.insert(5));
        assert!(!s.insert(5));
        assert!(s.insert(3));
        assert!(s.insert(9));
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), vec![3, 5, 9]);
        assert_eq!(s.len(), 3);
        assert!(s.remove(&5));
        assert!(!s.remove(&5));
        assert!(s.contains(&9) && !s.contains(&5));
        assert!(s.remove(&3) && s.remove(&9));
        assert!(s.is_empty());
        s.insert(1);
        assert_eq!(s.to_few().as_slice(), &[1]);
        assert_eq!(s.take().as_slice(), &[1]);
        assert!(s.is_empty());
        assert!(s.to_few().is_empty() && s.take().is_empty());
        for x in [4, 2, 8] {
            s.insert(x);
        }
        assert_eq!(s.to_few().as_slice(), &[2, 4, 8]);
        assert_eq!(s.take().as_slice(), &[2, 4, 8]);
    }
}
