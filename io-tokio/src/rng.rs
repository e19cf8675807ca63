//! A small seeded random source (SplitMix64) for the fault backend and the harness: the same
//! seed gives the same draws, on every machine.

/// SplitMix64: fast, seedable, good enough for choosing faults and workloads (not for secrets).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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
}
