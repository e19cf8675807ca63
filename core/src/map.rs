//! Hash maps with a fixed hasher (`rustc-hash`'s FxHash).
//!
//! The core looks things up by name in O(1); it never lets a map's iteration order decide what it
//! emits (ordered things live in `BTreeSet`s and queues). The hasher is fixed anyway, so a
//! serialised state, a debug dump and a test failure read the same on every run.

use std::collections::HashMap;

/// The hasher: rustc's FxHash from the `rustc-hash` crate (2.x, whose `finish` spreads the well
/// mixed bits into both ends of the word: hashbrown takes the bucket from the low bits and a
/// 7-bit tag from the top ones). Not resistant to chosen collisions: names are validated and
/// bounded, and the limits bound every map.
pub(crate) type FixedState = rustc_hash::FxBuildHasher;

/// A `HashMap` with the fixed hasher.
pub(crate) type Map<K, V> = HashMap<K, V, FixedState>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hash};

    use super::*;
    use crate::ids::{Key, SandboxId};
    use crate::name::{SessionId, UserId};

    fn hash_of(x: &impl Hash) -> u64 {
        FixedState::default().hash_one(x)
    }

    #[test]
    fn names_and_keys_of_every_kind_hash_apart() {
        // The variant counts: a session and a user of the same name are different keys.
        let session = Key::Session(SessionId::new("alice").unwrap());
        let user = Key::User(UserId::new("alice").unwrap());
        assert_ne!(hash_of(&session), hash_of(&user));
        // Names that differ only in their last, partial word.
        assert_ne!(
            hash_of(&SessionId::new("session-1").unwrap()),
            hash_of(&SessionId::new("session-2").unwrap())
        );
    }

    /// hashbrown takes the bucket from the low bits and a 7-bit tag from the top bits: both must
    /// spread for the names and ids the core sees (sequential numbers, names differing in a
    /// suffix), or lookups degrade into scans.
    #[test]
    fn low_bits_and_top_bits_both_spread() {
        let names: Vec<u64> = (0..4096)
            .map(|i| hash_of(&SessionId::new(format!("session-{i}")).unwrap()))
            .collect();
        let ids: Vec<u64> = (0..4096).map(|i| hash_of(&SandboxId(i))).collect();
        for (what, hashes) in [("names", &names), ("ids", &ids)] {
            let mut distinct = hashes.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), hashes.len(), "{what}: collisions");
            // Buckets: 4096 hashes over 1024 buckets by the low 10 bits.
            let mut buckets = vec![0u32; 1024];
            for h in hashes.iter() {
                buckets[(h & 1023) as usize] += 1;
            }
            let fullest = *buckets.iter().max().unwrap();
            assert!(fullest <= 16, "{what}: a bucket holds {fullest} of 4096");
            // Tags: the top 7 bits take most of their 128 values.
            let mut tags = [false; 128];
            for h in hashes.iter() {
                tags[(h >> 57) as usize] = true;
            }
            let used = tags.iter().filter(|t| **t).count();
            assert!(used >= 120, "{what}: only {used} of 128 tags");
        }
    }
}
