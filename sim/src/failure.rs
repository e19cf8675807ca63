//! A broken invariant or expectation: what stops a run.

use std::fmt;

/// Why a run stopped failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The invariant's name (`no-upload-after-stop`, `core:<name>` for the core's own check,
    /// `liveness-*`), or `expectation` for a failed `expect` line.
    pub invariant: String,
    /// The step (1-based) at which it was seen.
    pub step: usize,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant {} broken at step {}: {}",
            self.invariant, self.step, self.detail
        )
    }
}
