//! The registry's side of replicas (`--fleet`, [`crate::replicas`]): the sandbox table kept
//! as the sandboxes change here, paused sandboxes taken in from it (at start, and when a
//! request names one), stale ones let go, and sandboxes interrupted by their server's end
//! continued by the first envd request.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use super::unrecorded::Pending;
use super::{lock, past_limit, Life, Registry, Sandbox};
use crate::auth::Team;
use crate::clock;
use crate::durable::{Record, Replica};
use crate::error::ApiError;
use crate::replicas::{Claimed, Replicas, Retention, Route};

/// How often each replica sweeps the sandbox table ([`Registry::sweep`]).
pub const SWEEP: std::time::Duration = std::time::Duration::from_secs(5);

impl Registry {
    /// Takes back the paused sandboxes of the sandbox table: each is paused here as it was
    /// (same id, team, token, settings), its workspace with the keeper's fleet store until a
    /// resume claims its key, and its retention runs here too. A sandbox whose replica is
    /// gone is paused first ([`crate::replicas`]), and a kill that such a replica left half
    /// done is finished; one running on a live replica is left to it. Answers how many were
    /// taken back; a record that names no valid team or session is kept on disk and left out,
    /// with a warning. The sweep ([`sweep`](Self::sweep)) does the same every few seconds.
    pub async fn restore(self: &Arc<Self>) -> std::io::Result<usize> {
        let Some(replicas) = self.replicas.clone() else {
            return Ok(0);
        };
        let records = replicas.sweep().await?;
        let mut restored = 0;
        for record in records {
            let me = &replicas.me;
            let held_before = |h: &Replica| h != me && crate::replicas::same_host(h, me);
            if record.held_on.as_ref().is_some_and(held_before) {
                // Held by an earlier server on this host: restarted on its root.
                if let Err(e) = replicas.hold_again(&record.id).await {
                    tracing::warn!(sandbox = %record.id, error = %e, "a sandbox held on this host not taken back");
                }
            }
            let adopted = if record.runs_on.is_none() && !record.killing {
                self.adopt(record).is_some()
            } else {
                // Its replica died: paused here as interrupted (or its kill finished); or a
                // kill no replica holds: tried again here.
                let id = record.id.clone();
                matches!(self.route(&id, None).await, Ok(None)) && self.any(&id).is_some()
            };
            restored += usize::from(adopted);
        }
        Ok(restored)
    }

    /// One pass of the sweep (`--fleet`, every [`SWEEP`] on each replica): the paused
    /// sandboxes of the table this replica did not know are taken in (their retention runs
    /// here too), and those of dead replicas are paused, or their kills finished, as a
    /// request for them would. A table that cannot be read is logged.
    pub async fn sweep(self: &Arc<Self>) {
        self.interrupt_lost();
        self.record_again().await;
        if let Err(e) = self.restore().await {
            tracing::warn!(error = %e, "the sandbox table could not be swept");
        }
    }

    /// Puts the paused sandbox of `record` in the table here (a restart, or a replica that
    /// was asked for it), and starts its retention when it was not known here: `None` when
    /// its record names no valid team or session.
    pub(super) fn adopt(self: &Arc<Self>, record: Record) -> Option<Arc<Sandbox>> {
        // Known already (each sweep passes every paused record): nothing to build.
        if let Some(here) = self.any(&record.id) {
            return Some(here);
        }
        let sandbox = match Sandbox::of_record(record, true) {
            Ok(sandbox) => Arc::new(sandbox),
            Err((id, why)) => {
                tracing::warn!(sandbox = %id, %why, "a paused sandbox's record is not usable: left on disk");
                return None;
            }
        };
        {
            let mut inner = lock(&self.inner);
            if let Some(here) = inner.sandboxes.get(&sandbox.id) {
                return Some(here.clone());
            }
            inner.sandboxes.insert(sandbox.id.clone(), sandbox.clone());
        }
        self.metrics.paused.inc();
        self.start_retention(&sandbox);
        Some(sandbox)
    }

    /// Finishes the kill of the sandbox of `record`, which a replica that died left half
    /// done, or which could not reach its workspace before (its record, marked as being
    /// killed, names this replica now): its keeper takes the key over, and the sandbox is
    /// deleted as a kill of a paused one is (or let go again, if still out of reach).
    async fn finish_cut_off_kill(self: &Arc<Self>, record: Record) {
        let id = record.id.clone();
        let sandbox = match Sandbox::of_record(record, true) {
            Ok(sandbox) => Arc::new(sandbox),
            Err((id, why)) => {
                tracing::warn!(sandbox = %id, %why, "a cut-off kill's record is not usable: left on disk");
                return;
            }
        };
        if self.runs_here(&id) {
            // Its record names a kill, yet it runs here: never ended on a record's word.
            tracing::error!(sandbox = %id, "a kill to finish names a sandbox running here: left as it is");
            return;
        }
        // A paused view this replica had of it goes first.
        self.evict(&id).await;
        self.metrics.paused.inc();
        let finished = self.finish(sandbox, "continued").await;
        tracing::info!(sandbox = %id, ?finished, "a kill cut off by its replica's end finished");
    }

    /// Takes a paused sandbox this replica knew out of its table: it was resumed by another
    /// replica, or killed. Its timers find it gone and do nothing.
    pub(super) async fn evict(&self, id: &str) {
        let here = lock(&self.inner).sandboxes.get(id).cloned();
        let Some(sandbox) = here.filter(|s| s.is_paused()) else {
            return;
        };
        let mut life = sandbox.life.write().await;
        if !matches!(*life, Life::Paused) {
            return;
        }
        *life = Life::Ended;
        sandbox.paused.store(false, Ordering::Release);
        self.take_out(&sandbox);
        self.metrics.paused.dec();
        tracing::info!(sandbox = %id, "no longer paused here: another replica has it, or it was killed");
    }

    /// Returns once no pause, resume or kill of the sandbox `id` here is under way (each holds
    /// its life for writing), when this replica knows it paused.
    pub async fn settled(&self, id: &str) {
        if let Some(sandbox) = self.any(id).filter(|s| s.is_paused()) {
            drop(sandbox.life.read().await);
        }
    }

    /// Whether the sandbox `id` runs on this replica.
    pub fn runs_here(&self, id: &str) -> bool {
        self.any(id).is_some_and(|s| !s.is_paused())
    }

    /// Where a request for the sandbox `id` goes (`--fleet`; [`crate::replicas`]), for a
    /// sandbox that does not run here: this replica's view follows the table's (a paused
    /// sandbox it has not seen is taken in; one it thought paused and that runs elsewhere, or
    /// is gone, is let go). `Ok(None)`: this replica answers.
    ///
    /// `token`: an envd request's access token. A sandbox interrupted by its server's end is
    /// resumed here first (`continue_interrupted`) for a request that carries its own token,
    /// and for no other: a request that cannot use it does not wake it.
    pub async fn route(
        self: &Arc<Self>,
        id: &str,
        token: Option<&[u8]>,
    ) -> Result<Option<Replica>, ApiError> {
        let Some(replicas) = self.replicas.clone() else {
            return Ok(None);
        };
        match replicas.route(id).await {
            Ok(Route::Mine) => Ok(None),
            Ok(Route::Paused { record, orphaned }) => {
                let interrupted = record.interrupted.then_some(record.end_ms);
                let again = Recorded::interrupted_as(&record, clock::from_unix_ms(record.end_ms));
                if orphaned {
                    // Paused just now: whatever this replica knew of it is older.
                    self.evict(id).await;
                }
                let Some(sandbox) = self.adopt(record) else {
                    return Ok(None);
                };
                match interrupted {
                    Some(end_ms) if token.is_some_and(|t| sandbox.token_matches(t)) => {
                        let registry = self.clone();
                        let end = clock::from_unix_ms(end_ms);
                        tokio::spawn(async move {
                            registry.continue_interrupted(sandbox, end, again).await
                        })
                        .await
                        .map_err(|e| ApiError::internal(format!("a resume's task failed: {e}")))?
                    }
                    _ => Ok(None),
                }
            }
            Ok(Route::Unknown) => {
                self.evict(id).await;
                Ok(None)
            }
            Ok(Route::Killing(record)) => {
                // Answered as gone (404) at once; the kill goes on on its own task.
                let registry = self.clone();
                tokio::spawn(async move { registry.finish_cut_off_kill(record).await });
                Ok(None)
            }
            Ok(Route::There(replica)) => {
                self.evict(id).await;
                Ok(Some(replica))
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                e.to_string(),
            )),
            Err(e) => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("the sandbox table could not be read: {e}"),
            )),
        }
    }

    /// The sandbox in the table (`--fleet`) whose access token made the signature `signed`
    /// for `op`, with that token: a signed URL names no sandbox. A table that cannot be read
    /// is logged, and nothing found.
    pub async fn signed_by(
        &self,
        signed: &crate::envd::signed::Signed,
        op: crate::envd::signed::Operation,
    ) -> Option<(String, Vec<u8>)> {
        let replicas = self.replicas.as_ref()?;
        let records = match replicas.table.load().await {
            Ok(records) => records,
            Err(e) => {
                tracing::error!(error = %e, "the sandbox table could not be read for a signed URL");
                return None;
            }
        };
        records
            .into_iter()
            .find(|r| !r.killing && signed.by(op, &r.token))
            .map(|r| (r.id, r.token.into_bytes()))
    }

    /// Resumes `sandbox`, interrupted by its server's end, until `end` (its timeout as it
    /// was). Past it, its timeout acts now: an `autoPause` sandbox stays paused (by its user,
    /// now; one held on this host's disk stays as it is recorded), another is killed. Where a
    /// request for it goes then: here (`None`), or the replica that took it meanwhile. A
    /// resume that fails leaves it recorded as `again` says (still interrupted).
    async fn continue_interrupted(
        self: Arc<Self>,
        sandbox: Arc<Sandbox>,
        end: SystemTime,
        again: Recorded,
    ) -> Result<Option<Replica>, ApiError> {
        let left = end
            .duration_since(clock::now())
            .ok()
            .filter(|d| !d.is_zero());
        let Some(left) = left else {
            if sandbox.auto_pause && matches!(again, Recorded::Interrupted { .. }) {
                sandbox.paused_now();
                self.record(&sandbox, Recorded::Paused).await;
            } else if sandbox.auto_pause {
                // Held on this host's disk: left as it is recorded (paused, held here), for a
                // connect to resume.
            } else if let Err(e) = self.kill(&sandbox.team, &sandbox.id).await {
                tracing::warn!(sandbox = %sandbox.id, error = %e.message, "an interrupted sandbox past its end not killed");
            }
            return Ok(None);
        };
        tracing::info!(sandbox = %sandbox.id, "interrupted by its server's end: resumed by a request");
        match self.clone().resume_now(sandbox.clone(), left, again).await {
            Ok(_) => Ok(None),
            Err(e) if e.status == axum::http::StatusCode::CONFLICT => {
                // Another replica resumed it meanwhile: the request goes there.
                let Some(replicas) = self.replicas.clone() else {
                    return Err(e);
                };
                match replicas.route(&sandbox.id).await {
                    Ok(Route::There(replica)) => Ok(Some(replica)),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Records `sandbox` in the table as `how` says (`--fleet`): a sandbox made or resumed
    /// here as it is; a paused one only if the table does not say
    /// another replica runs it (`RunsOn` then: this replica lost it, its lease having lapsed).
    /// A failure to write is logged and taken as done: the sandbox stays as it is here, and
    /// the write is made again by the sweeps until it lands ([`super::unrecorded`]).
    pub(super) async fn record(&self, sandbox: &Arc<Sandbox>, how: Recorded) -> Claimed {
        match self.try_record(sandbox, how).await {
            Ok(claimed) => {
                self.recorded(sandbox);
                claimed
            }
            Err(e) => {
                tracing::error!(sandbox = %sandbox.id, error = %e.message, "a sandbox could not be recorded: written again by the sweeps");
                self.unrecorded(sandbox, Pending::Record(how));
                Claimed::Done
            }
        }
    }

    /// [`record`](Self::record), a failure to write answered as 503 (a create refuses it).
    pub(super) async fn try_record(
        &self,
        sandbox: &Sandbox,
        how: Recorded,
    ) -> Result<Claimed, ApiError> {
        let Some(replicas) = self.replicas.clone() else {
            return Ok(Claimed::Done);
        };
        let record = match how {
            Recorded::Running => running_here(sandbox, &replicas),
            Recorded::Paused => sandbox.record(),
            Recorded::Interrupted { end } => Record {
                end_ms: clock::unix_ms(end),
                interrupted: true,
                ..sandbox.record()
            },
            Recorded::Stranded { end } => Record {
                end_ms: clock::unix_ms(end),
                interrupted: true,
                held_on: replicas.me.host.is_some().then(|| replicas.me.clone()),
                ..sandbox.record()
            },
        };
        let running = matches!(how, Recorded::Running);
        let written = if running {
            replicas.table.put(record).await.map(|()| Claimed::Done)
        } else {
            replicas.pause(record).await
        };
        written.map_err(|e| unwritten(&sandbox.id, &e))
    }

    /// Records the new end of `sandbox`, running here (`--fleet`), unless its record says it
    /// no longer does (paused or killed meanwhile): written after the timeout changed, on its
    /// own task, so it may come late.
    pub(super) async fn record_end(&self, sandbox: &Arc<Sandbox>) {
        let Some(replicas) = self.replicas.clone() else {
            return;
        };
        let record = running_here(sandbox, &replicas);
        let written = replicas.refresh(record).await;
        if written.is_ok() {
            self.recorded(sandbox);
        } else {
            tracing::error!(sandbox = %sandbox.id, ?written, "a sandbox's new end could not be recorded: written again by the sweeps");
            self.unrecorded(sandbox, Pending::Record(Recorded::Running));
        }
    }

    /// Removes `sandbox`'s record (`--fleet`) if it is paused or runs here, under the table's
    /// lock (a kill, once the keeper deleted it: [`Replicas::kill`] marked it before). What
    /// the lock found; a failure to write is logged and taken as done.
    pub(super) async fn forget_record(&self, sandbox: &Arc<Sandbox>) -> Claimed {
        self.change_record(sandbox, Op::Forget).await
    }

    /// Whether the retention of `sandbox`, paused at `paused_ms`, may end it: without
    /// `--fleet`, yes; with it, as the table says ([`Replicas::retain`]). A table that
    /// cannot be changed answers `Moved` (logged): nothing is deleted on a guess.
    pub(super) async fn retain(&self, sandbox: &Sandbox, paused_ms: u64) -> Retention {
        let Some(replicas) = self.replicas.clone() else {
            return Retention::Kill;
        };
        match replicas.retain(&sandbox.id, paused_ms).await {
            Ok(retention) => retention,
            failed => {
                tracing::error!(sandbox = %sandbox.id, ?failed, "a retention could not read the table: the sandbox is kept");
                Retention::Moved
            }
        }
    }

    /// `op` on `sandbox`'s record (`--fleet`; without: done). A failure to change it is
    /// logged and taken as done, and the change is made again by the sweeps.
    pub(super) async fn change_record(&self, sandbox: &Arc<Sandbox>, op: Op) -> Claimed {
        match self.try_change_record(sandbox, op).await {
            Ok(claimed) => {
                self.recorded(sandbox);
                claimed
            }
            Err(e) => {
                tracing::error!(sandbox = %sandbox.id, error = %e.message, ?op, "a sandbox's record could not be changed: changed again by the sweeps");
                self.unrecorded(sandbox, Pending::Change(op));
                Claimed::Done
            }
        }
    }

    /// `op` on `sandbox`'s record (`--fleet`; without: done); a failure to change it is 503,
    /// and nothing was done (a take or a kill refuses it).
    pub(super) async fn try_change_record(
        &self,
        sandbox: &Sandbox,
        op: Op,
    ) -> Result<Claimed, ApiError> {
        let Some(replicas) = &self.replicas else {
            return Ok(Claimed::Done);
        };
        let changed = match op {
            Op::Take => replicas.take(&sandbox.id).await,
            Op::Kill => replicas.kill(&sandbox.id).await,
            Op::Forget => replicas.forget(&sandbox.id).await,
            Op::LetKillGo => replicas.let_kill_go(&sandbox.id).await,
        };
        changed.map_err(|e| unwritten(&sandbox.id, &e))
    }
}

impl Registry {
    /// `--fleet`: 429 when `team` has its limit of running sandboxes across the replicas, as
    /// the table counts them (`Counted::With`: with the one just recorded running here, so
    /// past the limit; two creates racing for the last place may then both be refused, never
    /// both made). A table that cannot be read: 503. Without `--fleet`, the reservation here
    /// counted them all.
    pub(super) async fn within_fleet_limit(
        &self,
        team: &Team,
        counted: Counted,
    ) -> Result<(), ApiError> {
        let Some(replicas) = &self.replicas else {
            return Ok(());
        };
        let running = replicas
            .table
            .running(team.as_str())
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    format!("the sandbox table could not be read to count team {team}'s sandboxes ({e}): nothing was done; retry"),
                )
            })?;
        let limit = self.limits.sandboxes_per_team;
        let over = match counted {
            Counted::Without => running >= limit,
            Counted::With => running > limit,
        };
        if over {
            return Err(past_limit(team, limit));
        }
        Ok(())
    }
}

/// Whether a count of a team's sandboxes includes the one being made or resumed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Counted {
    /// Before it is recorded.
    Without,
    /// Once it is recorded running here.
    With,
}

/// 503: the table could not be written for sandbox `id`, so nothing was done.
fn unwritten(id: &str, e: &std::io::Error) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "sandbox {id}: the sandbox table could not be written ({e}): nothing was done; retry"
        ),
    )
}

/// A change of a sandbox's record that depends on what it says ([`Replicas`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// [`Replicas::take`]: a resume here.
    Take,
    /// [`Replicas::kill`]: a kill here begins.
    Kill,
    /// [`Replicas::forget`]: a kill here ended.
    Forget,
    /// [`Replicas::let_kill_go`]: a kill here could not reach the workspace.
    LetKillGo,
}

/// The record of `sandbox` running on this replica, until its end.
pub(super) fn running_here(sandbox: &Sandbox, replicas: &Replicas) -> Record {
    Record {
        runs_on: Some(replicas.me.clone()),
        end_ms: clock::unix_ms(sandbox.end_at()),
        paused_ms: 0,
        ..sandbox.record()
    }
}

/// How a sandbox is recorded in the sandbox table (`--fleet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Running on this replica, until its end.
    Running,
    /// Paused by its user (or its timeout).
    Paused,
    /// Paused by this server's end, to be resumed by its next envd request until `end`.
    Interrupted {
        /// When it expires.
        end: SystemTime,
    },
    /// As `Interrupted`, its workspace left on this replica's disk, not on the shelf: its
    /// keeper call lost it ([`lost`](super::lost)). On hosts of their own it is held here
    /// ([`Record::held_on`]); on one root, any replica continues it.
    Stranded {
        /// When it expires.
        end: SystemTime,
    },
}

impl Recorded {
    /// How a sandbox interrupted until `end` is recorded again when a resume of it failed:
    /// still held here if `record` says it was held (on this host).
    fn interrupted_as(record: &Record, end: SystemTime) -> Recorded {
        match record.held_on {
            Some(_) => Recorded::Stranded { end },
            None => Recorded::Interrupted { end },
        }
    }
}

/// 503: the sandbox `id` was interrupted with its workspace on `replica`'s disk alone, and
/// that replica is down (a live one is sent the request).
pub(super) fn held(id: &str, replica: &crate::durable::Replica) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "sandbox {id} was interrupted with its workspace on the host at {}, which is down: it continues once that host is back; retry then",
            replica.url
        ),
    )
}

/// 409: the paused sandbox `id` was taken by `replica` while this one acted on it.
pub(super) fn moved(id: &str, replica: &crate::durable::Replica) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::CONFLICT,
        format!(
            "sandbox {id} was resumed meanwhile by the replica at {}: retry, and the request goes there",
            replica.url
        ),
    )
}
