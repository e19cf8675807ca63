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
