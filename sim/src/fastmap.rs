//! A small deterministic hash map: FxHash-style hashing with no per-process random state, so a
//! run's behaviour never depends on the process it runs in.

use std::collections::HashMap;

/// A `HashMap` with deterministic hashing: `rustc-hash`'s FxHash, no per-process random state.
pub type FastMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// FNV-1a over bytes, folded into `hash`: the trace hash.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The FNV-1a offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
