//! Counts of what the core told the application, kept by the shell for reports ([`Tally`]).

use std::collections::BTreeMap;

use sandkeeper::{Event, Settlement};

/// Counts of the core's events since the shell was made. Drops are counted per reason
/// (`sandbox-gone`, `drain-deadline`, `closed`, `no-sandbox`, `upload-failed`,
/// `upload-timeout`), call failures per error kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `CallReady` events.
    pub calls_ready: u64,
    /// `CallFailed` events, per error kind.
    pub calls_failed: BTreeMap<String, u64>,
    /// `CallReleased` events.
    pub calls_released: u64,
    /// `CallRevoked` events.
    pub calls_revoked: u64,
    /// `SandboxLost` events.
    pub sandboxes_lost: u64,
    /// Versions settled `Uploaded`.
    pub uploaded: u64,
    /// Versions settled `Superseded`.
    pub superseded: u64,
    /// Versions settled `Dropped`, per reason.
    pub dropped: BTreeMap<String, u64>,
    /// `MirrorSettled` events.
    pub mirrors_settled: u64,
    /// `ShutdownUnconfirmed` events.
    pub shutdowns_unconfirmed: u64,
    /// `HookFailed` events, per hook (`after-start`, ...), failed and late together.
    pub hooks_failed: BTreeMap<String, u64>,
    /// `KeyFenced` events (fleet mode: keys this process lost).
    pub keys_fenced: u64,
    /// `WayDownFailed` events: sandboxes left to the backend as they were.
    pub ways_down_failed: u64,
    /// Of `ways_down_failed`, those whose key keeps their snapshot.
    pub salvaged: u64,
    /// `WorkspaceLost` events: sandboxes whose storage the backend reported destroyed.
    pub workspaces_lost: u64,
}

impl Tally {
    /// Counts one event.
    pub fn count(&mut self, event: &Event) {
        match event {
            Event::CallReady { .. } => self.calls_ready += 1,
            Event::CallFailed { error, .. } => {
                *self.calls_failed.entry(error.to_string()).or_default() += 1
            }
            Event::CallReleased { .. } => self.calls_released += 1,
            Event::CallRevoked { .. } => self.calls_revoked += 1,
            Event::SandboxLost { .. } => self.sandboxes_lost += 1,
            Event::Settled { outcome, .. } => match outcome {
                Settlement::Uploaded { .. } => self.uploaded += 1,
                Settlement::Superseded { .. } => self.superseded += 1,
                Settlement::Dropped { reason } => {
                    *self.dropped.entry(reason.to_string()).or_default() += 1
                }
            },
            Event::MirrorSettled { .. } => self.mirrors_settled += 1,
            Event::ShutdownUnconfirmed { .. } => self.shutdowns_unconfirmed += 1,
            Event::HookFailed { hook, .. } => {
                *self
                    .hooks_failed
                    .entry(hook.as_str().to_string())
                    .or_default() += 1
            }
            Event::KeyFenced { .. } => self.keys_fenced += 1,
            Event::WayDownFailed { kept, .. } => {
                self.ways_down_failed += 1;
                self.salvaged += u64::from(kept.is_some());
            }
            Event::WorkspaceLost { .. } => self.workspaces_lost += 1,
            Event::Closed { .. } => {}
        }
    }

    /// Versions dropped, all reasons together.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// Versions settled, every outcome together.
    pub fn settled_total(&self) -> u64 {
        self.uploaded + self.superseded + self.dropped_total()
    }
}
