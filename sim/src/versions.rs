//! The unsettled versions of one path: a short vector (a path has a few versions open at once),
//! whose buffer stays with the path, so a flush allocates nothing once the path has been used.

/// A set of version numbers.
#[derive(Clone, Debug, Default)]
pub struct VersionSet(Vec<u64>);

impl VersionSet {
    /// Adds `v`; false when it was already in.
    pub fn insert(&mut self, v: u64) -> bool {
        if self.0.contains(&v) {
            return false;
        }
        self.0.push(v);
        true
    }

    /// Removes `v`; false when it was not in.
    pub fn remove(&mut self, v: &u64) -> bool {
        match self.0.iter().position(|x| x == v) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether `v` is in.
    pub fn contains(&self, v: &u64) -> bool {
        self.0.contains(v)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many versions are in.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_set() {
        let mut s = VersionSet::default();
        assert!(s.is_empty());
        assert!(s.insert(1));
        assert!(s.insert(3));
        assert!(!s.insert(1));
        assert_eq!(s.len(), 2);
        assert!(s.contains(&3));
        assert!(s.remove(&1));
        assert!(!s.remove(&1));
        assert!(!s.contains(&1));
        assert_eq!(s.len(), 1);
    }
}
