//! Table writes that failed after the keeper acted (`--fleet`). A pause, a resume, a new end,
//! the end of a kill, a kill let go and a lost sandbox's pause are done by the keeper before
//! their record is written: a write that fails then (the table unreachable) cannot take the
//! act back, so it is answered as done and the sandbox's record says what it was before. Such
//! a write is kept here ([`Registry::unrecorded`]) and written again by every sweep until it
//! lands or is superseded: a later write of the same sandbox (its state changed since), or a
//! record another replica changed meanwhile (never written over: each retry is the same
//! compare-and-set the first write was).

use std::sync::Arc;

use super::replicated::{running_here, Op, Recorded};
use super::{lock, Life, Registry, Sandbox};
use crate::replicas::Claimed;

/// A write to make again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pending {
    /// The sandbox's record as `Recorded` says (running here, or paused one way or another).
    Record(Recorded),
    /// A change of its record ([`Op::Forget`], [`Op::LetKillGo`]: a kill that ended, or that
    /// could not reach the workspace).
    Change(Op),
}

impl Registry {
    /// Keeps `pending`, the write of `sandbox`'s record that just failed, for the sweeps: it
    /// replaces any earlier one of the sandbox (the newest says what the sandbox is now).
    pub(super) fn unrecorded(&self, sandbox: &Arc<Sandbox>, pending: Pending) {
        if self.replicas.is_none() {
            return;
        }
        lock(&self.pending).insert(sandbox.id.clone(), (sandbox.clone(), pending));
    }

    /// A later write of `sandbox` landed: an earlier failed one is not made again.
    pub(super) fn recorded(&self, sandbox: &Sandbox) {
        if self.replicas.is_some() {
            let mut pending = lock(&self.pending);
            if pending
                .get(&sandbox.id)
                .is_some_and(|(s, _)| std::ptr::eq(Arc::as_ptr(s), sandbox))
            {
                pending.remove(&sandbox.id);
            }
        }
    }

    /// Writes again every write kept (one sweep's pass); those that fail again are kept.
    pub(super) async fn record_again(self: &Arc<Self>) {
        let Some(replicas) = self.replicas.clone() else {
            return;
        };
        let kept: Vec<_> = lock(&self.pending).values().cloned().collect();
        for (sandbox, pending) in kept {
            let life = sandbox.life.read().await;
            let current = match (&*life, pending) {
                (Life::Running(_), Pending::Record(Recorded::Running)) => true,
                (Life::Paused, Pending::Record(how)) => !matches!(how, Recorded::Running),
                (Life::Ended, Pending::Change(_)) => true,
                _ => false,
            };
            let written = if !current {
                // Its state changed since: the write that changed it said the rest.
                Ok(())
            } else {
                match pending {
                    Pending::Record(Recorded::Running) => replicas
                        .refresh(running_here(&sandbox, &replicas))
                        .await
                        .map(drop),
                    Pending::Record(how) => self
                        .try_record(&sandbox, how)
                        .await
                        .map(drop)
                        .map_err(|e| std::io::Error::other(e.message)),
                    Pending::Change(op) => self
                        .try_change_record(&sandbox, op)
                        .await
                        .map(|_: Claimed| ())
                        .map_err(|e| std::io::Error::other(e.message)),
                }
            };
            drop(life);
            match written {
                Ok(()) => {
                    tracing::info!(sandbox = %sandbox.id, ?pending, current, "a record that could not be written is written now");
                    let mut kept = lock(&self.pending);
                    if kept
                        .get(&sandbox.id)
                        .is_some_and(|(s, p)| Arc::ptr_eq(s, &sandbox) && *p == pending)
                    {
                        kept.remove(&sandbox.id);
                    }
                }
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox.id, ?pending, error = %e, "a record still cannot be written: tried again at the next sweep");
                }
            }
        }
    }
}
