//! Per-team request rates: a token bucket per team, refilled at `rate` requests a second up to
//! a burst of twice that. A request past it is refused with 429 (and `Should-Retry: false`,
//! so the SDK raises its rate-limit exception at once) before it does anything.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

use crate::auth::Team;

/// The buckets of every team that made a request.
#[derive(Debug)]
pub struct RateLimit {
    /// Requests a second; 0: no limit.
    rate: u32,
    buckets: Mutex<HashMap<Team, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// `rate` requests a second for each team (0: unlimited).
    pub fn new(rate: u32) -> Self {
        RateLimit {
            rate,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request of `team` now: `false` when it is over its rate.
    pub fn admit(&self, team: &Team) -> bool {
        self.admit_at(team, Instant::now())
    }

    fn admit_at(&self, team: &Team, now: Instant) -> bool {
        if self.rate == 0 {
            return true;
        }
        let rate = f64::from(self.rate);
        let burst = rate * 2.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets.entry(team.clone()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_team_gets_its_burst_then_its_rate_and_other_teams_are_apart() {
        let limit = RateLimit::new(2);
        let (a, b) = (Team::new("a").unwrap(), Team::new("b").unwrap());
        let t0 = Instant::now();
        assert!(
            (0..4).all(|_| limit.admit_at(&a, t0)),
            "a burst of twice the rate"
        );
        assert!(!limit.admit_at(&a, t0));
        assert!(limit.admit_at(&b, t0), "another team's bucket is its own");
        assert!(
            limit.admit_at(&a, t0 + Duration::from_millis(500)),
            "one more after 1/rate"
        );
        assert!(!limit.admit_at(&a, t0 + Duration::from_millis(500)));
        assert!(RateLimit::new(0).admit_at(&a, t0));
    }
}
