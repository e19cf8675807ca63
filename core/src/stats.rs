//! Counters of what the core has done, for reports and tests.

use serde::{Deserialize, Serialize};

/// Counters since the core was made. Every counter only grows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // each field says what it counts
pub struct Stats {
    pub calls_acquired: u64,
    pub calls_ready: u64,
    pub calls_failed: u64,
    pub calls_released: u64,
    pub calls_revoked: u64,
    pub starts_ordered: u64,
    pub starts_ok: u64,
    pub starts_failed: u64,
    pub starts_timed_out: u64,
    /// Starts answered after every call they were for had ended: shut down at once.
    pub orphan_starts: u64,
    /// Warm or draining sandboxes taken back into use by the next call of their key.
    pub revivals: u64,
    pub stops_failed: u64,
    pub persists_failed: u64,
    pub shutdowns_ordered: u64,
    pub shutdowns_ok: u64,
    pub shutdowns_unconfirmed: u64,
    pub suspended: u64,
    /// Sandboxes whose every Stop or Persist failed, left to the backend as they were (their
    /// key's history; `Event::WayDownFailed`).
    #[serde(default)]
    pub left_as_is: u64,
    /// Starts that resume a key's snapshot (`resume_from`).
    #[serde(default)]
    pub resumes_ordered: u64,
    /// Snapshots ordered discarded (retention over, or superseded).
    #[serde(default)]
    pub discards: u64,
    /// Hooks ordered, and how they ended: ok, failed (answered so), late (past their timeout).
    #[serde(default)]
    pub hooks_ordered: u64,
    #[serde(default)]
    pub hooks_ok: u64,
    #[serde(default)]
    pub hooks_failed: u64,
    #[serde(default)]
    pub hooks_late: u64,
    pub deaths: u64,
    /// Losses of a running instance reported while its sandbox was being suspended: the
    /// suspension's own doing, not deaths.
    pub instance_losses_suspending: u64,
    /// Instances lost while their sandbox was up, its workspace kept: the sandbox was
    /// suspended in place for its key's next call, not shut down (`death.rs`).
    #[serde(default)]
    pub instance_losses_kept: u64,
    /// Outstanding Starts, Stops and Persists the core stopped awaiting (`Abandon` ordered).
    pub abandoned: u64,
    pub drain_deadlines: u64,
    pub versions_flushed: u64,
    pub uploads_ordered: u64,
    pub versions_uploaded: u64,
    pub versions_superseded: u64,
    pub versions_dropped: u64,
    pub upload_retries: u64,
    /// Answers for commands no longer awaited (late, duplicate, after death).
    pub stale_answers: u64,
    pub sessions_forgotten: u64,
    /// Fleet mode: renewals of this process's lease ordered, confirmed in time, failed; and
    /// lapses (no confirmation in time).
    #[serde(default)]
    pub renewals_ordered: u64,
    #[serde(default)]
    pub renewals_ok: u64,
    #[serde(default)]
    pub renewals_failed: u64,
    #[serde(default)]
    pub lease_lapses: u64,
    /// Fleet mode: claims of keys ordered, and how they ended.
    #[serde(default)]
    pub claims_ordered: u64,
    #[serde(default)]
    pub claims_ok: u64,
    #[serde(default)]
    pub claims_busy: u64,
    #[serde(default)]
    pub claims_failed: u64,
    /// Fleet mode: releases of keys ordered, and how they ended.
    #[serde(default)]
    pub releases_ordered: u64,
    #[serde(default)]
    pub keys_released: u64,
    #[serde(default)]
    pub releases_failed: u64,
    #[serde(default)]
    pub releases_fenced: u64,
    /// Fleet mode: writes of owned keys' durable records ordered, and how they ended.
    #[serde(default)]
    pub records_ordered: u64,
    #[serde(default)]
    pub records_ok: u64,
    #[serde(default)]
    pub records_failed: u64,
    #[serde(default)]
    pub records_fenced: u64,
    /// Fleet mode: warm sandboxes handed over to another process, and adopted from one.
    #[serde(default)]
    pub handovers: u64,
    #[serde(default)]
    pub adoptions_ordered: u64,
    /// Fleet mode: keys this process lost and fenced itself from (lapse or refusal).
    #[serde(default)]
    pub fences: u64,
}
