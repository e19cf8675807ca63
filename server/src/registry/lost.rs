//! Sandboxes whose keeper call lost them (`--fleet`). A replica frozen past its lease (a VM
//! paused, a long stall) finds at its thaw that its keeper was fenced off every key: its calls
//! lost their sandboxes, which were relinquished (their processes stopped, their workspaces
//! left on the disk for the key's next owner). Its registry, which still held those calls as
//! running sandboxes, learns of it from the keeper's `SandboxLost` ([`Registry::watch_lost`]),
//! and every sweep looks again (a notice a lagging subscription missed).
//!
//! Such a sandbox is paused here as interrupted ([`Recorded::Stranded`]), as a restart leaves
//! the sandboxes it ran, unless the table says another replica took it meanwhile: it is then
//! let go here, and requests for it go there. The first envd request for it continues it. On
//! hosts of their own its workspace is on this host's disk alone (it went to no shelf), so the
//! record says it is held here ([`crate::durable::Record::held_on`]) and the other hosts send
//! requests for it here.
//!
//! Without `--fleet`, nothing: no other process takes a key, and a sandbox that died is
//! answered by its operations failing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sandkeeper::Event;
use sandkeeper_tokio::Notice;
use tokio::sync::broadcast::error::RecvError;

use super::{Life, Recorded, Registry, Sandbox};
use crate::replicas::Claimed;

impl Registry {
    /// Watches the keeper's notices for calls that lost their sandbox, until the keeper
    /// closes (`--fleet`; without it, returns at once).
    pub async fn watch_lost(self: Arc<Self>) {
        if self.replicas.is_none() {
            return;
        }
        let mut notices = self.keeper.subscribe();
        loop {
            match notices.recv().await {
                Ok(Notice::Event(Event::SandboxLost { .. })) | Err(RecvError::Lagged(_)) => {
                    self.interrupt_lost();
                }
                Ok(_) => {}
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Pauses as interrupted, each on a task of its own, every sandbox running here whose
    /// keeper call lost it (`--fleet`). One in the middle of a transition is left to it (and to
    /// the next sweep).
    pub(super) fn interrupt_lost(self: &Arc<Self>) {
        if self.replicas.is_none() {
            return;
        }
        for sandbox in self.all() {
            let lost = sandbox
                .life
                .try_read()
                .is_ok_and(|life| matches!(&*life, Life::Running(guard) if guard.is_lost()));
            if lost {
                let generation = sandbox.resumes.load(Ordering::Acquire);
                tokio::spawn(self.clone().interrupt(sandbox, generation));
            }
        }
    }

    /// Pauses `sandbox`, whose call of `generation` lost it, as interrupted with its
    /// workspace left here (see the module docs).
    async fn interrupt(self: Arc<Self>, sandbox: Arc<Sandbox>, generation: u32) {
        if sandbox.resumes.load(Ordering::Acquire) != generation {
            return;
        }
        // Its processes were stopped with it; their streams and the watches end here.
        sandbox.processes.kill_all();
        sandbox.watchers.stop_all();
        let mut life = sandbox.life.write().await;
        let guard = match std::mem::replace(&mut *life, Life::Paused) {
            Life::Running(guard) if guard.is_lost() => guard,
            was => {
                *life = was;
                return;
            }
        };
        sandbox.paused.store(true, Ordering::Release);
        sandbox.paused_now();
        // The call is released; its sandbox is no longer this process's to act on.
        drop(guard);
        self.metrics.sandboxes.dec();
        self.metrics.paused.inc();
        self.give_back_slot(&sandbox.team);
        let end = sandbox.end_at();
        let claimed = self.record(&sandbox, Recorded::Stranded { end }).await;
        drop(life);
        match claimed {
            Claimed::Done => {
                tracing::warn!(sandbox = %sandbox.id, team = %sandbox.team, "the keeper lost the sandbox (its lease lapsed): paused as interrupted, its next envd request continues it");
                self.start_retention(&sandbox);
            }
            Claimed::RunsOn(_) | Claimed::Gone | Claimed::Held(_) => {
                tracing::warn!(sandbox = %sandbox.id, ?claimed, "the keeper lost the sandbox (its lease lapsed), and another replica has it now");
                self.evict(&sandbox.id).await;
            }
        }
    }
}
