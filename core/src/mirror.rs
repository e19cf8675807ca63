//! The mirror: background writes of session-scoped files (the session log, transcript segments,
//! memory files) into the session's sandbox, with versions, coalescing, retries, holds and drain.
//!
//! Per (session, path) at most one upload is in flight; a newer flush supersedes the pending one;
//! versions reach a sandbox in increasing order; every version settles exactly once. A session's
//! mirror targets the sandbox of its earliest ready call, else the sandbox its last call was
//! released from while that one still accepts uploads ("linger"): never another session's.
//!
//! Also here: [`Slot`], the mirror state of one (session, path), kept in the session's record,
//! and [`Mirror`], the view of the lifecycle mirror work runs on: the inputs (on [`Lifecycle`])
//! check and hand on; everything after runs on the view, which cannot change a call or a key.

use crate::call::Calls;
use crate::close::CloseState;
use crate::command::Command;
use crate::config::Config;
use crate::error::{DropReason, Error};
use crate::event::{Event, Settlement};
use crate::ids::{Payload, SandboxId, UploadId, Version};
use crate::input::UploadFailure;
use crate::lifecycle::{Lifecycle, Reconcile};
use crate::name::{PathName, SessionId};
use crate::output::Outputs;
use crate::sandbox::{SandboxIx, SandboxState, Sandboxes};
use crate::session::{Session, SessionIx, Sessions, Spare};
use crate::small_set::Few;
use crate::time::Instant;
use crate::timer::{Timer, TimerRef, Timers};
use crate::upload::{Upload, UploadIx, Uploads};
use serde::{Deserialize, Serialize};
use std::ops::{Deref, DerefMut};

impl Lifecycle {
    // ------------------------------------------------------------------------------------------
    // Application inputs

    /// Records the next version of (session, path) and returns it. Never waits on an upload.
    ///
    /// The version is uploaded to the session's sandbox when the path has no upload in flight,
    /// else it waits and is superseded by any newer flush. A session with no sandbox, none
    /// coming and none to linger on settles the version at once as `Dropped(no-sandbox)`
    /// (`sandbox-gone` when its calls' sandboxes died). In fleet mode, a session one of whose
    /// calls lost its key to a fence (bound or waiting), or came while its key was not this
    /// process's (unclaimed, claimed elsewhere, or its release under way), settles it
    /// `Dropped(fenced)` until a call of it is ready: what this process writes before it owns
    /// the key is not written over the owner's. O(log n + paths of the session).
    ///
    /// Errors: `Closed` after close finished, or during close for a session with no live call
    /// and no sandbox to drain into; `LimitExceeded` (payload size, paths per session, sessions).
    pub fn flush(
        &mut self,
        now: Instant,
        session: &SessionId,
        path: &PathName,
        payload: Payload,
    ) -> Result<Version, Error> {
        self.time_passes(now);
        self.check_not_closed("flush")?;
        let limits = &self.config.limits;
        if payload.len() > limits.max_payload_bytes {
            return Err(Error::LimitExceeded {
                limit: "max_payload_bytes",
                max: limits.max_payload_bytes,
            });
        }
        let found = self.sessions.find(session);
        let existing = found.map(|ix| &self.sessions[ix]);
        let slot = existing.and_then(|s| s.slot(path));
        if self.is_closing() && !existing.is_some_and(Session::is_live) {
            return Err(Error::Closed { what: "flush" });
        }
        match existing {
            None if self.sessions.active() >= limits.max_active_sessions => {
                return Err(Error::LimitExceeded {
                    limit: "max_active_sessions",
                    max: limits.max_active_sessions,
                })
            }
            Some(s) if slot.is_none() && s.paths.len() >= limits.max_paths_per_session => {
                return Err(Error::LimitExceeded {
                    limit: "max_paths_per_session",
                    max: limits.max_paths_per_session,
                })
            }
            _ => {}
        }

        self.advance(now);
        let version = self
            .mirror()
            .record_flush(found, slot, session, path, payload);
        self.finish_input();
        Ok(version)
    }

    /// A background writer of `session` (a memory flush, a transcript writer) promises a write:
    /// while held, a draining sandbox of the session waits for it (up to the drain deadline),
    /// and the session's released calls do not complete their release. O(1).
    ///
    /// Errors: `NoActiveSandbox` when the session has no live call and no sandbox to linger on;
    /// `LimitExceeded`; `Closed` after close finished.
    pub fn hold(&mut self, now: Instant, session: &SessionId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("hold")?;
        let Some(ix) = self
            .sessions
            .find(session)
            .filter(|ix| self.sessions[*ix].is_live())
        else {
            return Err(Error::NoActiveSandbox {
                session: session.clone(),
            });
        };
        let s = &self.sessions[ix];
        let max = self.config.limits.max_holds_per_session;
        if s.holds >= max {
            return Err(Error::LimitExceeded {
                limit: "max_holds_per_session",
                max: max as usize,
            });
        }
        self.advance(now);
        tracing::debug!(session = %session, "hold");
        self.sessions[ix].holds += 1;
        self.session_changed(ix);
        self.finish_input();
        Ok(())
    }

    /// Lets one hold of `session` go (its write was submitted with [`flush`](Self::flush), or
    /// will not come). O(1).
    ///
    /// Errors: `NotHeld`; `Closed` after close finished.
    pub fn unhold(&mut self, now: Instant, session: &SessionId) -> Result<(), Error> {
        self.time_passes(now);
        self.check_not_closed("unhold")?;
        let Some(ix) = self
            .sessions
            .find(session)
            .filter(|ix| self.sessions[*ix].holds > 0)
        else {
            return Err(Error::NotHeld {
                session: session.clone(),
            });
        };
        self.advance(now);
        tracing::debug!(session = %session, "unhold");
        self.sessions[ix].holds -= 1;
        self.session_changed(ix);
        self.finish_input();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Backend inputs

    /// The upload was written. Its version settles `Uploaded`; the path's next pending version
    /// goes out. An upload that is no longer awaited (timed out, cancelled) is stale and ignored.
    ///
    /// Errors: `UnknownUpload` for an id never handed out; `Closed` after close finished.
    pub fn handle_upload_ok(&mut self, now: Instant, upload: UploadId) -> Result<(), Error> {
        self.time_passes(now);
        let Some(up) = self.answered_upload(upload)? else {
            return Ok(());
        };
        self.advance(now);
        let mut m = self.mirror();
        m.out.stats.versions_uploaded += 1;
        let sandbox = up.sandbox;
        m.settle(
            up.session,
            up.slot,
            up.version,
            Settlement::Uploaded {
                sandbox: m.sid(sandbox),
            },
        );
        m.pump(up.session);
        m.session_changed(up.session);
        self.finish_input();
        Ok(())
    }

    /// The upload failed. `Gone` means the sandbox is gone (treated as its death). `Transient`
    /// retries the version with backoff up to `upload_retries` times, unless a newer version
    /// supersedes it; then it is dropped (`upload-failed`).
    ///
    /// Errors: as [`handle_upload_ok`](Self::handle_upload_ok).
    pub fn handle_upload_failed(
        &mut self,
        now: Instant,
        upload: UploadId,
        failure: UploadFailure,
    ) -> Result<(), Error> {
        self.time_passes(now);
        let Some(up) = self.answered_upload(upload)? else {
            return Ok(());
        };
        self.advance(now);
        let session = up.session;
        match failure {
            UploadFailure::Gone => {
                let sandbox = up.sandbox;
                self.mirror().settle(
                    session,
                    up.slot,
                    up.version,
                    Settlement::Dropped {
                        reason: DropReason::SandboxGone,
                    },
                );
                // A sandbox whose instance was lost keeps its workspace: an upload that found
                // no instance says nothing new.
                let record = &self.sandboxes[sandbox];
                if record.state() != SandboxState::Dead && !record.instance_lost {
                    self.died(sandbox);
                }
            }
            UploadFailure::Transient => self.mirror().retry_or_drop(up),
        }
        // A version kept for a retry needs somewhere to go: with no sandbox and none coming,
        // it fails now.
        self.mirror().retarget(session, DropReason::UploadFailed);
        self.finish_input();
        Ok(())
    }

    /// Checks an upload answer and removes the upload it answers from every record; `None` for
    /// a stale answer (the upload timed out or was cancelled).
    #[inline(always)]
    fn answered_upload(&mut self, upload: UploadId) -> Result<Option<Upload>, Error> {
        self.check_not_closed("answer")?;
        let Some(ix) = self.uploads.find(upload) else {
            if self.uploads.was_handed_out(upload) {
                tracing::debug!(upload = %upload, "stale upload answer ignored");
                self.out.stats.stale_answers += 1;
                return Ok(None);
            }
            return Err(Error::UnknownUpload { upload });
        };
        Ok(Some(self.mirror().take_upload(ix)))
    }

    /// The mirror's view of the lifecycle: what mirror work may change. It reads the calls
    /// (their records, the memory of ended calls, the waiting count) and the configuration, and
    /// cannot reach the keys at all, so no change to the mirror can touch a call or a key.
    pub(crate) fn mirror(&mut self) -> Mirror<'_> {
        Mirror {
            config: &self.config,
            now: self.now,
            calls: &self.calls,
            sessions: &mut self.sessions,
            uploads: &mut self.uploads,
            sandboxes: &mut self.sandboxes,
            timers: &mut self.timers,
            out: &mut self.out,
            close: &mut self.close,
            reconcile: &mut self.reconcile,
        }
    }
}

/// The part of the lifecycle that mirror work may change, borrowed for one step of an input
/// ([`Lifecycle::mirror`]). Session records are shared with the calls (a session lists its
/// ready calls), so the mirror cannot own them outright; the view is where the core says what
/// mirror code may touch: the session records and uploads, the sandboxes' upload bookkeeping,
/// the timers and the outputs. Calls are read-only here, keys are out of reach.
pub(crate) struct Mirror<'a> {
    pub(crate) config: &'a Config,
    pub(crate) now: Instant,
    pub(crate) calls: &'a Calls,
    pub(crate) sessions: &'a mut Sessions,
    pub(crate) uploads: &'a mut Uploads,
    pub(crate) sandboxes: &'a mut Sandboxes,
    pub(crate) timers: &'a mut Timers,
    pub(crate) out: &'a mut Outputs,
    pub(crate) close: &'a mut CloseState,
    pub(crate) reconcile: &'a mut Reconcile,
}

impl Mirror<'_> {
    /// Records the next version of (session, path): settled at once when the session's mirror
    /// has nowhere to go and nothing coming, else pending (superseding the one pending before)
    /// and pumped. `found` and `slot` are the session's record and the path's slot in it, as
    /// [`Lifecycle::flush`] found them in this input (`None`: there is none yet).
    #[inline(always)]
    fn record_flush(
        &mut self,
        found: Option<SessionIx>,
        slot: Option<usize>,
        session: &SessionId,
        path: &PathName,
        payload: Payload,
    ) -> Version {
        self.out.stats.versions_flushed += 1;
        let ix = self.sessions.take_up(found, session);
        let (s, spares) = self.sessions.with_spares(ix);
        debug_assert_eq!(slot, s.slot(path), "found in this very input");
        let i = match slot {
            Some(i) => i,
            None => {
                s.add_path(path.clone());
                s.paths.len() - 1
            }
        };
        let stale = s.stale;
        let nowhere = stale || (s.target.is_none() && s.coming == 0);
        let none_ready = s.ready.is_empty();
        let slot = &mut s.paths[i];
        slot.last += 1;
        let version = Version(slot.last);
        tracing::trace!(session = %session, path = %path, version = %version, "flush");
        if nowhere {
            let reason = if stale {
                DropReason::Fenced
            } else if none_ready {
                DropReason::NoSandbox
            } else {
                DropReason::SandboxGone
            };
            self.settle(ix, i, version, Settlement::Dropped { reason });
        } else {
            slot.busy(&mut spares.works);
            let superseded = slot.pending.replace((version, payload));
            if let Some((old, _)) = superseded {
                slot.attempts = 0;
                slot.since = None;
                self.settle(ix, i, old, Settlement::Superseded { by: version });
            }
            self.pump(ix);
        }
        self.session_changed(ix);
        version
    }

    /// A transient failure of the upload `up`: the version is retried with backoff while
    /// attempts and its window last and no newer version supersedes it, else dropped
    /// (`upload-failed`).
    fn retry_or_drop(&mut self, up: Upload) {
        let Upload {
            session,
            slot: i,
            version,
            payload,
            attempts,
            since,
            ..
        } = up;
        let delay = self.retry_delay(attempts);
        let in_time = self.now + delay < since + self.config.upload_timeout;
        let s = &mut self.sessions[session];
        let slot = &mut s.paths[i];
        if let Some((newer, _)) = &slot.pending {
            let by = *newer;
            self.settle(session, i, version, Settlement::Superseded { by });
        } else if attempts < self.config.upload_retries && in_time {
            let at = self.now + delay;
            tracing::debug!(session = %s.id, path = %slot.path, version = %version, attempt = attempts + 1, "upload retry");
            slot.pending = Some((version, payload));
            slot.attempts = attempts + 1;
            slot.since = Some(since);
            slot.retry_at = Some(self.timers.set(at, Timer::Retry(session, i)));
            self.out.stats.upload_retries += 1;
        } else {
            self.settle(
                session,
                i,
                version,
                Settlement::Dropped {
                    reason: DropReason::UploadFailed,
                },
            );
        }
    }

    /// The id of a tracked sandbox, as outputs and logs name it.
    pub(crate) fn sid(&self, sandbox: SandboxIx) -> SandboxId {
        self.sandboxes[sandbox].id
    }

    /// Notes that the session's derived bookkeeping needs reconciling once the input is done.
    pub(crate) fn session_changed(&mut self, session: SessionIx) {
        self.reconcile.session(session);
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// The delay before retry number `attempts + 1`: the backoff, doubled per failed attempt.
    fn retry_delay(&self, attempts: u32) -> std::time::Duration {
        let factor = 1u32.checked_shl(attempts).unwrap_or(u32::MAX);
        self.config.retry_backoff.saturating_mul(factor)
    }

    /// Removes an awaited upload from every record.
    #[inline(always)]
    fn take_upload(&mut self, ix: UploadIx) -> Upload {
        let up = self.uploads.remove(ix);
        self.timers.cancel(up.deadline);
        let record = self
            .sandboxes
            .get_mut(up.sandbox)
            .expect("sandbox of an upload");
        record.uploads.remove(&ix);
        self.reconcile.sandbox(up.sandbox);
        let slot = &mut self.sessions[up.session].paths[up.slot];
        slot.inflight = None;
        slot.attempts = 0;
        up
    }

    pub(crate) fn upload_timed_out(&mut self, upload: UploadIx) {
        let deadline = self.uploads[upload].deadline;
        // take_upload cancels the timer, which has already fired: harmless.
        let up = self.take_upload(upload);
        let upload = up.id;
        debug_assert!(deadline.at <= self.now);
        tracing::debug!(upload = %upload, session = %self.sessions[up.session].id, "upload timed out");
        self.out.commands.push_back(Command::CancelUpload {
            upload,
            sandbox: self.sid(up.sandbox),
        });
        self.settle(
            up.session,
            up.slot,
            up.version,
            Settlement::Dropped {
                reason: DropReason::UploadTimeout,
            },
        );
        self.pump(up.session);
        self.session_changed(up.session);
    }

    pub(crate) fn retry_due(&mut self, session: SessionIx, slot: usize) {
        self.sessions[session].paths[slot].retry_at = None;
        self.retarget(session, DropReason::UploadFailed);
    }

    /// Emits a settlement of a version of the session's path in `slot`.
    pub(crate) fn settle(
        &mut self,
        session: SessionIx,
        slot: usize,
        version: Version,
        outcome: Settlement,
    ) {
        let s = &self.sessions[session];
        let (session, path) = (s.id.clone(), s.paths[slot].path.clone());
        match &outcome {
            Settlement::Uploaded { .. } => {}
            Settlement::Superseded { .. } => self.out.stats.versions_superseded += 1,
            Settlement::Dropped { reason } => {
                self.out.stats.versions_dropped += 1;
                if *reason == DropReason::Closed {
                    if let Some(report) = self.close.report_mut() {
                        report
                            .dropped_versions
                            .push((session.clone(), path.clone(), version));
                    }
                }
            }
        }
        tracing::debug!(session = %session, path = %path, version = %version, outcome = ?outcome, "settled");
        self.out.events.push_back(Event::Settled {
            session,
            path,
            version,
            outcome,
        });
    }

    /// Orders the uploads the session's target can take now. Most calls find nothing to order
    /// (no target, or no version waiting): that test is kept inline, and the ordering is out of
    /// line in `pump_slots`.
    #[inline]
    pub(crate) fn pump(&mut self, session: SessionIx) {
        let Some(s) = self.sessions.get(session) else {
            return;
        };
        let Some(target) = s.target else {
            return;
        };
        if s.paths.iter().any(Slot::may_order) {
            self.pump_slots(session, target);
        }
    }

    /// [`pump`](Self::pump)'s ordering, for a session with a target and a slot that may order.
    fn pump_slots(&mut self, session: SessionIx, target: SandboxIx) {
        let record = self.sandboxes.get_mut(target).expect("target sandbox");
        debug_assert!(
            record.accepts_uploads(),
            "target {target:?} is {:?}",
            record.state()
        );
        let target_id = record.id;
        let target_token = record.token;
        let mut expired = Few::<(usize, Version)>::new();
        let s = &mut self.sessions[session];
        for (i, slot) in s.paths.iter_mut().enumerate() {
            // A slot with no work box has nothing pending (its box is looked at once).
            let Some(work) = slot.work.as_deref_mut() else {
                continue;
            };
            if work.inflight.is_some() || work.retry_at.is_some() {
                continue;
            }
            let Some((version, payload)) = work.pending.take() else {
                continue;
            };
            // Every attempt of a version ends within the upload timeout of its first attempt. A
            // version whose window closed while it waited for a sandbox (a retry due while its
            // sandbox was gone) is dropped, never ordered with a deadline already past.
            let since = work.since.take().unwrap_or(self.now);
            if since + self.config.upload_timeout <= self.now {
                work.attempts = 0;
                expired.push((i, version));
                continue;
            }
            let upload = self.uploads.next_id();
            let until = since + self.config.upload_timeout;
            let ix = self.uploads.insert(Upload {
                id: upload,
                session,
                slot: i,
                version,
                sandbox: target,
                payload: payload.clone(),
                deadline: TimerRef::UNSET,
                attempts: work.attempts,
                since,
            });
            let deadline = self.timers.set(until, Timer::Upload(ix));
            self.uploads[ix].deadline = deadline;
            work.inflight = Some(ix);
            record.uploads.insert(ix);
            self.out.stats.uploads_ordered += 1;
            tracing::trace!(upload = %upload, session = %s.id, sandbox = %target_id, version = %version, "upload");
            self.out.commands.push_back(Command::Upload {
                upload,
                sandbox: target_id,
                session: s.id.clone(),
                path: slot.path.clone(),
                version,
                payload,
                deadline: until,
                token: target_token,
            });
        }
        if !expired.is_empty() {
            for (i, version) in expired {
                tracing::debug!(version = %version, "upload window closed while waiting");
                self.settle(
                    session,
                    i,
                    version,
                    Settlement::Dropped {
                        reason: DropReason::UploadTimeout,
                    },
                );
            }
            self.session_changed(session);
        }
    }

    /// Recomputes where the session's mirror goes; with nowhere to go and no sandbox coming,
    /// its pending versions are dropped with `reason`.
    pub(crate) fn retarget(&mut self, session: SessionIx, reason: DropReason) {
        let Some(s) = self.sessions.get(session) else {
            return;
        };
        let mut target = s.first_up(self.calls, self.sandboxes);
        let s = &mut self.sessions[session];
        if target.is_none() {
            if let Some(linger) = s.linger {
                if self
                    .sandboxes
                    .get(linger)
                    .is_some_and(|record| record.accepts_uploads())
                {
                    target = Some(linger);
                } else {
                    s.linger = None;
                }
            }
        }
        if target != s.target {
            if let Some(old) = s.target {
                let record = self.sandboxes.get_mut(old).expect("old target");
                record.targeting.remove(&session);
            }
            if let Some(new) = target {
                let record = self.sandboxes.get_mut(new).expect("new target");
                record.targeting.insert(session);
            }
            tracing::trace!(session = %s.id, target = ?target, "mirror target");
            s.target = target;
        }
        if target.is_none() && s.coming == 0 {
            self.drop_pending(session, reason);
        }
        self.pump(session);
        self.session_changed(session);
    }

    /// Fleet mode: a call of `session` waits for a key this process was just fenced from. What
    /// the session flushed so far and flushes until a call of it is ready was not made after
    /// the key's next owner's writes: it is stale, and with no sandbox to go to, what waits is
    /// dropped (`fenced`) rather than written over the owner's newer log once the key is
    /// claimed back.
    pub(crate) fn fenced_waiting(&mut self, session: SessionIx) {
        let s = &mut self.sessions[session];
        s.stale = true;
        if s.target.is_none() {
            self.drop_pending(session, DropReason::Fenced);
            self.session_changed(session);
        }
    }

    fn drop_pending(&mut self, session: SessionIx, reason: DropReason) {
        let s = &mut self.sessions[session];
        let mut dropped = Few::<(usize, Version)>::new();
        for (i, slot) in s.paths.iter_mut().enumerate() {
            if slot.is_quiet() {
                continue;
            }
            if let Some(at) = slot.retry_at.take() {
                self.timers.cancel(at);
            }
            slot.attempts = 0;
            slot.since = None;
            if let Some((version, _)) = slot.pending.take() {
                dropped.push((i, version));
            }
        }
        for (i, version) in dropped {
            self.settle(session, i, version, Settlement::Dropped { reason });
        }
    }

    /// The sandbox no longer accepts uploads (its state already says so): uploads in flight into
    /// it are cancelled and dropped with `reason`, and the sessions that targeted it move on.
    /// Often none did: that test is kept inline, the leaving out of line in `leave_sandbox`.
    #[inline(always)]
    pub(crate) fn leave_uploads(&mut self, sandbox: SandboxIx, reason: DropReason) {
        let record = &self.sandboxes[sandbox];
        debug_assert!(!record.accepts_uploads());
        if !(record.uploads.is_empty() && record.targeting.is_empty()) {
            self.leave_sandbox(sandbox, reason);
        }
    }

    /// [`leave_uploads`](Self::leave_uploads)' work, for a sandbox some upload or session is on.
    fn leave_sandbox(&mut self, sandbox: SandboxIx, reason: DropReason) {
        let record = self.sandboxes.get_mut(sandbox).expect("live");
        let uploads = self.uploads.in_id_order(record.uploads.take());
        let sessions = self.sessions.by_name_order(record.targeting.to_few());
        let mut touched = Few::<SessionIx>::new();
        for upload in uploads {
            let up = self.uploads.remove(upload);
            let upload = up.id;
            self.timers.cancel(up.deadline);
            let slot = &mut self.sessions[up.session].paths[up.slot];
            slot.inflight = None;
            slot.attempts = 0;
            self.out.commands.push_back(Command::CancelUpload {
                upload,
                sandbox: self.sid(sandbox),
            });
            self.settle(
                up.session,
                up.slot,
                up.version,
                Settlement::Dropped { reason },
            );
            touched.push(up.session);
        }
        for session in sessions {
            self.retarget(session, reason);
        }
        for session in touched {
            self.pump(session);
            self.session_changed(session);
        }
    }
}

/// The mirror state of one (session, path).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Slot {
    pub(crate) path: PathName,
    /// The last version flushed.
    pub(crate) last: u64,
    work: Option<Box<SlotWork>>,
}

/// What a slot has in progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct SlotWork {
    /// The newest flushed version not yet ordered uploaded.
    pub(crate) pending: Option<(Version, Payload)>,
    /// The upload in flight, if any.
    pub(crate) inflight: Option<UploadIx>,
    /// Failed attempts of the pending version.
    pub(crate) attempts: u32,
    /// When the pending version's first attempt began: all its attempts end by this plus the
    /// upload timeout.
    pub(crate) since: Option<Instant>,
    /// When the pending version may be tried again.
    pub(crate) retry_at: Option<TimerRef>,
}

static NO_WORK: SlotWork = SlotWork {
    pending: None,
    inflight: None,
    attempts: 0,
    since: None,
    retry_at: None,
};

impl Slot {
    pub(crate) fn new(path: PathName) -> Self {
        Slot {
            path,
            last: 0,
            work: None,
        }
    }

    /// Its work in progress, when it has a box for some (read once, not through `Deref`).
    pub(crate) fn work(&self) -> Option<&SlotWork> {
        self.work.as_deref()
    }

    /// Whether a version waits to be ordered: pending, with no upload in flight and no retry
    /// due later (what [`Mirror::pump`] orders).
    #[inline]
    pub(crate) fn may_order(&self) -> bool {
        self.work
            .as_deref()
            .is_some_and(|w| w.pending.is_some() && w.inflight.is_none() && w.retry_at.is_none())
    }

    /// Whether nothing is in progress: no pending version, no upload, no retry.
    pub(crate) fn is_quiet(&self) -> bool {
        self.pending.is_none() && self.inflight.is_none() && self.retry_at.is_none()
    }

    /// Takes out the work box once nothing is in progress, for reuse.
    pub(crate) fn compact(&mut self) -> Option<Box<SlotWork>> {
        if self.is_quiet() {
            self.work.take()
        } else {
            None
        }
    }

    /// Makes the work box exist, taking a spare one when there is.
    pub(crate) fn busy(&mut self, spares: &mut Spare<SlotWork>) {
        if self.work.is_none() {
            self.work = Some(spares.take());
        }
    }
}

impl Deref for Slot {
    type Target = SlotWork;

    fn deref(&self) -> &SlotWork {
        self.work.as_deref().unwrap_or(&NO_WORK)
    }
}

impl DerefMut for Slot {
    fn deref_mut(&mut self) -> &mut SlotWork {
        self.work.get_or_insert_with(Box::default)
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    /// A slot that gets work takes a spare box when there is one.
    #[test]
    fn a_busy_slot_takes_a_spare_work_box() {
        let mut spares = Spare::<SlotWork>::default();
        spares.give(Box::default());
        let mut slot = Slot::new(PathName::session_log());
        slot.busy(&mut spares);
        assert_eq!(spares.len(), 0, "the spare box was taken");
        assert!(slot.work.is_some());
        slot.busy(&mut spares);
        assert_eq!(spares.len(), 0, "a slot with a box takes no other");
    }
}
