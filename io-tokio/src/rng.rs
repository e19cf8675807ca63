//! A small seeded random source (SplitMix64, from `rand_xoshiro`) for the fault backend and the
//! harness: the same seed gives the same draws, on every machine.

use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

/// SplitMix64 (`rand_xoshiro`'s): fast, seedable, good enough for choosing faults and
/// workloads (not for secrets).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    inner: rand_xoshiro::SplitMix64,
}

impl SplitMix64 {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 {
            inner: rand_xoshiro::SplitMix64::seed_from_u64(seed),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `p` (0 never, 1 always).
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 random bits as a fraction in [0, 1).
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// A duration between `lo` and `hi` (inclusive of `lo`), in whole microseconds.
    pub fn between(
        &mut self,
        lo: std::time::Duration,
        hi: std::time::Duration,
    ) -> std::time::Duration {
        let lo_us = lo.as_micros() as u64;
        let hi_us = hi.as_micros() as u64;
        if hi_us <= lo_us {
            return lo;
        }
        std::time::Duration::from_micros(lo_us + self.below(hi_us - lo_us + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_draws() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(SplitMix64::new(8).next_u64(), xs[0]);
        assert!(!a.chance(0.0));
        assert!(a.chance(1.0));
        assert_eq!(a.below(0), 0);
        assert!(a.below(10) < 10);
    }

    /// The stream the crate's own copy gave before it was replaced: seeds keep their runs.
    #[test]
    fn seeds_give_the_stream_they_always_gave() {
        let mut r = SplitMix64::new(7);
        let got = [r.next_u64(), r.next_u64(), r.next_u64()];
        assert_eq!(
            got,
            [0x63cbe1e459320dd7, 0x044c3cd7f43c661c, 0xe6984080bab12a02]
        );
    }
}
