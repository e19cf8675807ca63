//! Virtual time: the core never reads a clock, every input carries `now`.

use std::ops::Add;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time as the driver tells it to the core: nanoseconds since an origin the driver
/// chose (a tokio `Instant` at start-up, or zero in the simulator).
///
/// The core only compares instants and adds durations to them; it never asks what time it is.
/// Instants saturate instead of overflowing.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant; used as "never".
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// The instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, rhs: Duration) -> Instant {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl std::fmt::Display for Instant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", Duration::from_nanos(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_saturates_instead_of_wrapping() {
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(
            Instant::from_millis(1) + Duration::from_millis(2),
            Instant::from_millis(3)
        );
        assert_eq!(
            Instant::from_millis(1).saturating_duration_since(Instant::from_millis(5)),
            Duration::ZERO
        );
    }

    #[test]
    fn an_instant_reads_as_the_time_since_the_cores_zero() {
        assert_eq!(Instant::from_millis(1500).to_string(), "1.5s");
        assert_eq!(Instant::ZERO.to_string(), "0ns");
    }
}
