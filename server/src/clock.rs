//! The wall clock, read in one place: sandboxes' start and end times as the API shows them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, by the wall clock.
#[allow(clippy::disallowed_methods)] // a driver: the API reports wall-clock times (startedAt, endAt).
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const LAST: Duration = Duration::from_millis(253_402_300_799_999);

/// A time as RFC 3339 (UTC, with milliseconds), as the E2B API writes times; clamped to the
/// years 1970 to 9999 (the formatter fails outside them).
pub fn rfc3339(t: SystemTime) -> String {
    let t = t.clamp(UNIX_EPOCH, UNIX_EPOCH + LAST);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `t` plus `d`, saturating far in the future.
pub fn after(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d).unwrap_or(t)
}

/// `t` in Unix milliseconds (0 before the epoch, saturating far after it).
pub fn unix_ms(t: SystemTime) -> u64 {
    let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The time `ms` Unix milliseconds name (clamped to what RFC 3339 can write).
pub fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms).min(LAST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_of_range_are_clamped_not_panicked_on() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z"
        );
        let far = UNIX_EPOCH + Duration::from_secs(u64::MAX / 4);
        assert_eq!(rfc3339(far), "9999-12-31T23:59:59.999Z");
    }
}
