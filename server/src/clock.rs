//! The wall clock, read in one place: sandboxes' start and end times as the API shows them.

use std::time::{Duration, SystemTime};

/// Now, by the wall clock.
#[allow(clippy::disallowed_methods)] // a driver: the API reports wall-clock times (startedAt, endAt).
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// A time as RFC 3339 (UTC, with milliseconds), as the E2B API writes times.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// `t` plus `d`, saturating far in the future.
pub fn after(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d).unwrap_or(t)
}
