//! Close: refuse new work, drain to the deadline, revoke what is left, shut everything down,
//! report.
//!
//! Phases: `Open` → `close()` → `Draining` (live calls may still flush and end; warm sandboxes go
//! down; queued calls are refused) → the deadline, or nothing left to drain → `Revoked` (live
//! calls revoked, drains cut, pending versions dropped with `closed`, every managed sandbox on its
//! way down, waiting for acknowledgements) → every sandbox answered, or the second deadline →
//! `Closed` (the `Closed` event; no command ever again; every input refused).

use crate::call::{CallIx, EndHow};
use crate::error::{DropReason, Error, ErrorKind};
use crate::event::{CloseReport, Event};
use crate::lifecycle::Lifecycle;
use crate::sandbox::{Awaiting, SandboxIx, SandboxState};
use crate::session::SessionIx;
use crate::small_set::Few;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum CloseState {
    Open,
    Draining {
        deadline: TimerRef,
        report: CloseReport,
        /// A sandbox seen still up the last time close looked, checked first next time.
        blocked_by: Option<SandboxIx>,
    },
    Revoked {
        grace: TimerRef,
        report: CloseReport,
    },
    Closed,
}

impl CloseState {
    /// The report being gathered, while close is under way.
    pub(crate) fn report_mut(&mut self) -> Option<&mut CloseReport> {
        match self {
            CloseState::Draining { report, .. } | CloseState::Revoked { report, .. } => {
                Some(report)
            }
            CloseState::Open | CloseState::Closed => None,
        }
    }
}

impl Lifecycle {
    /// Begins close: new calls are refused (`Closed`), queued calls fail with `closed`, warm
    /// sandboxes go down, flushes are refused for sessions with no live call and no sandbox to
    /// drain into. Live calls may still flush and end, and mirror work drains, until `deadline`
    /// from now; then what is left is revoked (`CallRevoked`, versions dropped with `closed`),
    /// every managed sandbox is stopped and shut down (warm ones included), and `Closed
    /// { report }` comes once every Shutdown is answered, or after the second deadline
    /// (`close_grace`) with the rest reported unconfirmed. O(n log n), once.
    ///
    /// Errors: `Closed` if close was already called.
    pub fn close(&mut self, now: Instant, deadline: Duration) -> Result<(), Error> {
        self.time_passes(now);
        if self.is_closing() {
            return Err(Error::Closed { what: "close" });
        }
        self.advance(now);
        let at = self.timers.set(self.now + deadline, Timer::Close);
        tracing::info!(deadline = ?deadline, "close");
        self.close = CloseState::Draining {
            deadline: at,
            report: CloseReport::default(),
            blocked_by: None,
        };

        let mut waiters: Few<CallIx> = Few::new();
        for (_, slot) in self.keys.iter_mut() {
            waiters.extend(std::mem::take(&mut slot.waiters));
        }
        for call in self.calls.by_name_order(waiters) {
            let name = self.calls[call].id.clone();
            if let Some(report) = self.close_report() {
                report.refused_waiters.push(name);
            }
            self.end_call(call, EndHow::Failed(ErrorKind::Closed));
        }

        let warm = self
            .sandboxes
            .in_id_order(|sandbox| sandbox.state() == SandboxState::Idle);
        for sandbox in warm {
            self.way_down().cancel_sandbox_timer(sandbox);
            self.begin_drain(sandbox);
        }
        self.finish_input();
        Ok(())
    }

    /// The close timer fired: the first deadline revokes, the second ends close.
    pub(crate) fn close_deadline(&mut self) {
        match self.close {
            CloseState::Draining { .. } => self.revoke(),
            CloseState::Revoked { .. } => self.grace_expired(),
            CloseState::Open | CloseState::Closed => unreachable!("close timer while not closing"),
        }
    }

    /// Checks, after each input during close, whether close can move on.
    pub(crate) fn close_progress(&mut self) {
        match &mut self.close {
            CloseState::Draining {
                deadline,
                blocked_by,
                ..
            } => {
                if !self.calls.is_empty() || !self.uploads.is_empty() {
                    return;
                }
                let up = |sandbox: &crate::sandbox::Sandbox| {
                    sandbox.accepts_uploads() || sandbox.state() == SandboxState::Starting
                };
                if let Some(b) = *blocked_by {
                    if self.sandboxes.get(b).is_some_and(up) {
                        return;
                    }
                }
                if let Some((id, _)) = self.sandboxes.iter().find(|(_, sandbox)| up(sandbox)) {
                    *blocked_by = Some(id);
                    return;
                }
                let at = *deadline;
                self.timers.cancel(at);
                self.revoke();
            }
            CloseState::Revoked { .. } => {
                if self.sandboxes.is_empty() && self.keys_let_go_for_close() {
                    self.finish_close();
                }
            }
            CloseState::Open | CloseState::Closed => {}
        }
    }

    /// The first deadline, or nothing left to drain: revoke calls and holds, cut drains, send
    /// every managed sandbox down.
    fn revoke(&mut self) {
        let CloseState::Draining { report, .. } =
            std::mem::replace(&mut self.close, CloseState::Closed)
        else {
            unreachable!("revoke outside the draining phase")
        };
        let grace = self
            .timers
            .set(self.now + self.config.close_grace, Timer::Close);
        tracing::info!("close: revoking what is left");
        self.close = CloseState::Revoked { grace, report };

        let live: Few<CallIx> = self.calls.iter().map(|(ix, _)| ix).collect();
        for call in self.calls.by_name_order(live) {
            let name = self.calls[call].id.clone();
            if let Some(report) = self.close_report() {
                report.revoked_calls.push(name);
            }
            self.end_call(call, EndHow::Revoked);
        }

        let held: Few<SessionIx> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.holds > 0)
            .map(|(ix, _)| ix)
            .collect();
        for session in self.sessions.by_name_order(held) {
            let s = &mut self.sessions[session];
            let holds = std::mem::take(&mut s.holds);
            let name = s.id.clone();
            if let Some(report) = self.close_report() {
                report.revoked_holds.push((name, holds));
            }
            self.session_changed(session);
        }

        for sandbox in self.sandboxes.in_id_order(|_| true) {
            let Some(record) = self.sandboxes.get(sandbox) else {
                continue;
            };
            debug_assert!(
                !matches!(record.state(), SandboxState::Idle | SandboxState::Running),
                "no call is live and warm sandboxes drain at close"
            );
            match record.state() {
                SandboxState::Draining => self.end_drain(sandbox, DropReason::Closed),
                SandboxState::Starting => {
                    // Its calls were revoked; waiting for the start to answer could outlast
                    // close, so it is shut down now and the start's answer will be stale.
                    self.way_down().abandon(sandbox);
                    self.shutdown(sandbox);
                }
                _ => {}
            }
        }
        self.finish_input();
    }

    /// The second deadline: whatever has not answered is reported, and close ends.
    fn grace_expired(&mut self) {
        let left = self.sandboxes.in_id_order(|_| true);
        tracing::warn!(sandboxes = left.len(), "close: second deadline passed");
        for sandbox in left {
            let record = &self.sandboxes[sandbox];
            if record.awaiting() == Awaiting::Record {
                // Persisted, its key's record may still name it: left as it is (the next
                // owner adopts it, or the sweep removes it once nothing names it).
                let kept = self.keys[record.key]
                    .snapshot
                    .as_ref()
                    .map(|(s, _)| s.clone());
                self.left_as_it_is(sandbox, kept);
                continue;
            }
            if record.is_managed() && !record.shutdown_ordered() {
                // Still stopping or persisting: it is ordered down now, its one Shutdown.
                self.way_down().abandon(sandbox);
                self.shutdown(sandbox);
            }
            if self.sandboxes[sandbox].awaiting() == Awaiting::Shutdown {
                self.way_down().unconfirmed(sandbox);
            }
        }
        self.finish_close();
    }

    fn finish_close(&mut self) {
        let CloseState::Revoked { report, .. } =
            std::mem::replace(&mut self.close, CloseState::Closed)
        else {
            unreachable!("close finishes after revoking")
        };
        tracing::info!(?report, "closed");
        // Revoking ended every call, and every sandbox left the way uploads go: no call and no
        // upload is left to forget.
        debug_assert!(self.calls.is_empty() && self.uploads.is_empty());
        // The snapshots the keys keep (fleet keys released theirs into their records, noted
        // as they were released).
        let mut retained = report.retained;
        for (_, slot) in self.keys.iter() {
            if let Some((snapshot, _)) = &slot.snapshot {
                retained.push(crate::event::Retained {
                    key: slot.key.clone(),
                    snapshot: snapshot.clone(),
                    until: slot.retain.map(|at| at.at),
                });
            }
        }
        retained.sort_by(|a, b| a.key.cmp(&b.key));
        retained.dedup_by(|a, b| a.key == b.key);
        let report = CloseReport { retained, ..report };
        // No timer is cleared: each goes stale with its owner's record, and the pruning at the
        // end of this input drops them all (the `closed` invariant checks it).
        self.sandboxes.clear();
        self.keys.clear();
        self.sessions.clear();
        self.reconcile.forget_sandboxes();
        if let Some(live) = self.liveness.as_mut() {
            // No renewal after close: the store lets the lease expire.
            live.renew = None;
            live.lapse = None;
            live.valid_until = None;
            live.in_flight.clear();
        }
        self.out.events.push_back(Event::Closed {
            report: Box::new(report),
        });
    }

    fn close_report(&mut self) -> Option<&mut CloseReport> {
        self.close.report_mut()
    }
}
