//! The driver's clocks: the core's [`Instant`] is tokio's clock since the keeper's origin; what
//! outlives the process (a snapshot's expiry, a process lease, a key record's retention) is on
//! the wall clock, which every process shares. [`WallClock`] maps one to the other from one
//! reading of the wall clock per process (the first keeper's), so the mapping is monotonic (a
//! wall clock that jumps later moves nothing), the same for every keeper of the process, and,
//! under tokio's paused time, as virtual as the core's clock (keepers of one test agree on it).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use sandkeeper::Instant;

/// The core's time and the wall clock, anchored at one instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WallClock {
    /// The keeper's origin on tokio's clock: the core's `Instant::ZERO`.
    origin: tokio::time::Instant,
    /// The wall clock at the origin.
    wall: SystemTime,
}

impl WallClock {
    /// Anchors the core's clock (from `origin`) to the wall clock read now.
    pub(crate) fn new(origin: tokio::time::Instant) -> Self {
        /// The process's one reading of the wall clock, with tokio's clock then.
        static ANCHOR: OnceLock<(tokio::time::Instant, SystemTime)> = OnceLock::new();
        let (at, wall) = *ANCHOR.get_or_init(|| {
            // A driver may read the clock: what outlives this process is recorded on the wall
            // clock. Read once; every later wall time is derived from tokio's clock.
            #[allow(clippy::disallowed_methods)]
            let wall = SystemTime::now();
            (tokio::time::Instant::now(), wall)
        });
        let wall = if origin >= at {
            wall + (origin - at)
        } else {
            wall - (at - origin)
        };
        WallClock { origin, wall }
    }

    /// The tokio instant of a core instant.
    pub(crate) fn tokio(&self, at: Instant) -> tokio::time::Instant {
        self.origin + Duration::from_nanos(at.as_nanos())
    }

    /// The core's instant now.
    pub(crate) fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        Instant::from_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A core instant on the wall clock.
    pub(crate) fn wall(&self, at: Instant) -> SystemTime {
        self.wall + Duration::from_nanos(at.as_nanos())
    }

    /// A wall-clock time as a core instant (the origin for one before it).
    pub(crate) fn core(&self, wall: SystemTime) -> Instant {
        let since = wall.duration_since(self.wall).unwrap_or_default();
        Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_mapping_is_anchored_and_round_trips() {
        let clock = WallClock::new(tokio::time::Instant::now());
        let at = Instant::from_nanos(90_000_000_000);
        let wall = clock.wall(at);
        assert_eq!(clock.core(wall), at);
        assert_eq!(
            clock.wall(Instant::from_nanos(0)) + Duration::from_secs(90),
            wall
        );
        // Virtual time moves the core's clock; the anchor does not move.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(clock.now(), Instant::from_nanos(5_000_000_000));
        assert_eq!(
            clock.wall(clock.now()),
            clock.wall(Instant::from_nanos(0)) + Duration::from_secs(5)
        );
        // A wall time before the anchor maps to the origin.
        assert_eq!(clock.core(SystemTime::UNIX_EPOCH), Instant::from_nanos(0));
    }
}
