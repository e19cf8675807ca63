//! Hash maps with a fixed hasher.
//!
//! The core looks things up by name in O(1); it never lets a map's iteration order decide what it
//! emits (ordered things live in `BTreeSet`s and queues). The hasher is fixed anyway, so a
//! serialised state, a debug dump and a test failure read the same on every run.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A small multiply-rotate hasher (the FxHash construction). Not resistant to chosen collisions:
/// names are validated and bounded, and the limits bound every map.
#[derive(Clone, Copy, Default)]
pub(crate) struct FixedHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FixedHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FixedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: hashbrown takes its control byte from the top.
        self.0 ^ (self.0 >> 32)
    }
}

/// A `HashMap` with the fixed hasher.
pub(crate) type Map<K, V> = HashMap<K, V, BuildHasherDefault<FixedHasher>>;
/// A `HashSet` with the fixed hasher.
#[allow(dead_code)]
pub(crate) type Set<K> = HashSet<K, BuildHasherDefault<FixedHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hash};

    use super::*;
    use crate::ids::{Key, SandboxId};
    use crate::name::{SessionId, UserId};

    fn hash_of(x: &impl Hash) -> u64 {
        BuildHasherDefault::<FixedHasher>::default().hash_one(x)
    }

    #[test]
    fn every_write_moves_the_state() {
        let fresh = FixedHasher::default().finish();
        let mut h = FixedHasher::default();
        h.write_u8(1);
        assert_ne!(h.finish(), fresh, "write_u8");
        let mut h = FixedHasher::default();
        h.write_u32(1);
        assert_ne!(h.finish(), fresh, "write_u32");
        let mut h = FixedHasher::default();
        h.write_u64(1);
        assert_ne!(h.finish(), fresh, "write_u64");
        let mut h = FixedHasher::default();
        h.write_usize(1);
        assert_ne!(h.finish(), fresh, "write_usize");
        let mut h = FixedHasher::default();
        h.write(b"abc");
        assert_ne!(h.finish(), fresh, "write (short)");
        let mut h = FixedHasher::default();
        h.write(b"abcdefgh");
        let whole_words = h.finish();
        assert_ne!(whole_words, fresh, "write (a word)");
        h.write(b"i");
        assert_ne!(h.finish(), whole_words, "write (a word and a rest)");
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
