//! A broken check: its stable name and what was seen.

use std::fmt;

/// A broken check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The check's name (`no-upload-after-stop`, `settle-once`, ...): stable, the simulator's
    /// failures, canaries and docs refer to it.
    pub check: &'static str,
    /// What was seen.
    pub detail: String,
}

impl Violation {
    /// A violation of `check`.
    pub fn new(check: &'static str, detail: String) -> Self {
        Violation { check, detail }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.detail)
    }
}

impl std::error::Error for Violation {}
