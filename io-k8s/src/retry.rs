//! Retrying API calls: 409 (after a fresh read, done by the operation), 429 and 5xx and
//! transport failures with exponential backoff and jitter, all under one deadline.

use std::future::Future;
use std::time::Duration;

use crate::error::{ErrorClass, K8sError};

/// How long and how often to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total budget from the first attempt.
    pub deadline: Duration,
    /// First pause; doubles up to [`RetryPolicy::max_delay`].
    pub base: Duration,
    /// Longest pause.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// A policy with `deadline` and `base`, pauses capped at 2 s.
    pub fn new(deadline: Duration, base: Duration) -> Self {
        RetryPolicy {
            deadline,
            base,
            max_delay: Duration::from_secs(2),
        }
    }

    /// The pause before attempt `n + 1`: half of the exponential step plus a random half.
    pub fn pause(&self, attempt: u32) -> Duration {
        let step = self
            .base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_delay);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// Runs `op` until it succeeds, fails with a class that is not worth retrying, or the
    /// deadline would pass; the last error is returned as it was.
    pub async fn run<T, F, Fut>(&self, mut op: F) -> Result<T, K8sError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, K8sError>>,
    {
        let start = tokio::time::Instant::now();
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if matches!(e.class(), ErrorClass::Retryable | ErrorClass::Conflict) => {
                    let pause = self.pause(attempt);
                    if start.elapsed() + pause > self.deadline {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, ?pause, attempt, "retrying a Kubernetes API call");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn retries_transient_failures_and_stops_at_fatal_ones_or_the_deadline() {
        let p = RetryPolicy::new(Duration::from_secs(5), Duration::from_millis(100));
        let tries = Cell::new(0);
        let ok = p
            .run(|| {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move {
                    if n < 3 {
                        Err(K8sError::Retryable {
                            code: 429,
                            message: "slow down".into(),
                        })
                    } else {
                        Ok(n)
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!(ok, 3);

        tries.set(0);
        let fatal: Result<(), _> = p
            .run(|| {
                tries.set(tries.get() + 1);
                async {
                    Err(K8sError::Invalid {
                        code: 422,
                        reason: "Invalid".into(),
                        message: "bad".into(),
                    })
                }
            })
            .await;
        assert!(matches!(fatal, Err(K8sError::Invalid { .. })));
        assert_eq!(tries.get(), 1, "a fatal error is not retried");

        let start = tokio::time::Instant::now();
        let forever: Result<(), _> = p
            .run(|| async {
                Err(K8sError::Retryable {
                    code: 503,
                    message: "down".into(),
                })
            })
            .await;
        assert!(matches!(
            forever,
            Err(K8sError::Retryable { code: 503, .. })
        ));
        assert!(
            start.elapsed() <= Duration::from_secs(5),
            "gave up within the deadline"
        );
        for a in 0..20 {
            let d = p.pause(a);
            assert!(
                d <= Duration::from_secs(2) && d >= Duration::from_millis(50),
                "{d:?}"
            );
        }
    }
}
