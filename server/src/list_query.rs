//! The list query of `GET /v2/sandboxes` (and `/sandboxes`): the filters as the SDKs send them
//! (`state`, `metadata` doubly encoded, `template`, `startedAfter`), the order, and the pages
//! (`limit`, `nextToken`).

use std::time::{Duration, SystemTime};

use percent_encoding::percent_decode_str;

use crate::error::ApiError;
use crate::registry::Sandbox;

/// A list's query, checked.
pub struct ListQuery {
    /// Whether running sandboxes are asked for.
    running: bool,
    /// Whether paused sandboxes are asked for.
    paused: bool,
    metadata: Vec<(String, String)>,
    template: Option<String>,
    started_after: Option<SystemTime>,
    /// Newest first (the default), or oldest first (`order=asc`).
    pub descending: bool,
    /// The most sandboxes on one page (1 to 1000; 100 by default).
    pub limit: usize,
    /// Where the page starts (`nextToken`: the previous page's end).
    pub offset: usize,
}

impl ListQuery {
    /// Parses a raw query string; 400 for a bad `limit`, `nextToken`, `order`, `metadata` or
    /// `startedAfter`. Unknown keys are ignored.
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut q = ListQuery {
            running: true,
            paused: true,
            metadata: Vec::new(),
            template: None,
            started_after: None,
            // Newest first unless asked otherwise, as E2B's list.
            descending: true,
            limit: 100,
            offset: 0,
        };
        for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
            match k.as_ref() {
                "state" => {
                    q.running = v.split(',').any(|s| s == "running");
                    q.paused = v.split(',').any(|s| s == "paused");
                }
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| ApiError::bad_request("limit must be 1 to 1000"))?;
                }
                "nextToken" => {
                    q.offset = v
                        .parse()
                        .map_err(|_| ApiError::bad_request("invalid nextToken"))?;
                }
                "metadata" => q.metadata.extend(metadata_filter(&v)?),
                "template" => q.template = Some(v.into_owned()),
                "order" => {
                    q.descending = match v.as_ref() {
                        "asc" => false,
                        "desc" => true,
                        _ => return Err(ApiError::bad_request("order is asc or desc")),
                    };
                }
                "startedAfter" => q.started_after = Some(parse_time(&v)?),
                _ => {}
            }
        }
        Ok(q)
    }

    /// Whether the sandbox is one the query asks for.
    pub fn matches(&self, s: &Sandbox) -> bool {
        (if s.is_paused() {
            self.paused
        } else {
            self.running
        }) && self
            .metadata
            .iter()
            .all(|(k, v)| s.metadata.get(k) == Some(v))
            && self.template.as_ref().is_none_or(|t| t == &s.template)
            && self.started_after.is_none_or(|t| s.started >= t)
    }
}

/// The `metadata` filter: a form whose keys and values are percent-encoded once more (as the
/// SDKs send it).
fn metadata_filter(form: &str) -> Result<Vec<(String, String)>, ApiError> {
    let decode = |s: &str| percent_decode_str(s).decode_utf8().map(|c| c.into_owned());
    form_urlencoded::parse(form.as_bytes())
        .map(|(k, v)| match (decode(&k), decode(&v)) {
            (Ok(k), Ok(v)) => Ok((k, v)),
            _ => Err(ApiError::bad_request("invalid metadata filter")),
        })
        .collect()
}

/// An ISO 8601 / RFC 3339 time with a `Z` or `±hh:mm` offset (Python's `isoformat()`).
fn parse_time(text: &str) -> Result<SystemTime, ApiError> {
    let bad = || ApiError::bad_request("startedAfter: an RFC 3339 time with an offset");
    let (local, offset) = match text.strip_suffix('Z') {
        Some(local) => (local, 0i64),
        None => {
            let at = text.len().checked_sub(6).ok_or_else(bad)?;
            let (local, off) = text.split_at_checked(at).ok_or_else(bad)?;
            let sign = match off.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return Err(bad()),
            };
            let (h, m) = off[1..].split_once(':').ok_or_else(bad)?;
            let minutes =
                h.parse::<i64>().map_err(|_| bad())? * 60 + m.parse::<i64>().map_err(|_| bad())?;
            (local, sign * minutes * 60)
        }
    };
    let t = humantime::parse_rfc3339_weak(local).map_err(|_| bad())?;
    let shift = Duration::from_secs(offset.unsigned_abs());
    // Local time minus its offset is UTC.
    let utc = if offset >= 0 {
        t.checked_sub(shift)
    } else {
        t.checked_add(shift)
    };
    utc.ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_with_offsets_and_metadata_filters_parse() {
        let utc = parse_time("2026-12-06T19:00:00Z").unwrap();
        assert_eq!(parse_time("2026-12-06T20:00:00.000+01:00").unwrap(), utc);
        assert_eq!(parse_time("2026-12-06T18:30:00-00:30").unwrap(), utc);
        for bad in [
            "",
            "2026-12-06",
            "2026-12-06T19:00:00+0100",
            "yesterday+01:00",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?}");
        }
        let pairs = metadata_filter("a%20b=c%26d&k=v").unwrap();
        assert_eq!(
            pairs,
            [("a b".into(), "c&d".into()), ("k".into(), "v".into())]
        );
    }
}
