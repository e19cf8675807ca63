//! The backend's losses in a fleet: a sandbox that is up loses its running instance with its
//! workspace intact (a pod evicted while its claim and volumes stay), or dies with its workspace
//! (a claim deleted, a directory removed). The backend reports it to the process that runs the
//! sandbox (the incarnation whose Start or Adopt it last took), after a latency, as a real
//! backend's watch does; a paused process hears it when it resumes.
//!
//! In half the seeds, during the faults, every 5 to 20 s (a stream of its own, so a seed's
//! other draws stay as they were): one sandbox up in the backend and driven by a live
//! incarnation, its instance only in half the losses. A sandbox whose driver crashed is never
//! lost here (nobody would hear it; its next owner's Adopt answers for it).
//!
//! What the world checks of it (`intent.rs`, as the one-process history does):
//! `workspace-lost-reported` (a `WorkspaceLost` names a sandbox reported dead to that process,
//! of its key), `instance-loss-suspends` (a sandbox whose instance was lost while up goes down
//! as a suspension), `suspension-keeps-workspace` (the input that loses an instance, with the
//! workspace intact, abandons and shuts down nothing of it); and `conservation` over the
//! backend: a death excuses what only its workspace held, a lost instance excuses nothing.

use std::time::Duration;

use sandkeeper::{Input, SandboxId};

use super::{backend, Ev, Run, World, FAULTS_NS, MS};
use crate::step::fleet::{BackendAnswer, FleetStep};
use crate::step::{Answer, Step};

impl World {
    /// Draws the instants of the seed's losses, for the fault phase.
    pub(super) fn draw_losses(&mut self) {
        if !self.loss_rng.chance(500) {
            return;
        }
        let mut t = self.loss_rng.range(2_000, 15_000) * MS;
        while t < FAULTS_NS {
            self.push(t, Ev::Lose);
            t += self.loss_rng.range(5_000, 20_000) * MS;
        }
    }

    /// A drawn loss: one sandbox up in the backend, driven by a live incarnation, loses its
    /// instance or dies; its driver hears it 1 to 50 ms later.
    pub(super) fn lose_drawn(&mut self) {
        let candidates: Vec<(SandboxId, usize)> = (self.backend.sandboxes.iter())
            .filter(|(_, s)| s.life == backend::Life::Up)
            .filter_map(|(x, _)| {
                let (r, inc) = *self.drivers.get(x)?;
                let replica = &self.replicas[r];
                let live = replica.incarnation == inc && replica.run != Run::Crashed;
                (live && !replica.closed).then_some((*x, r))
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let (x, r) = candidates[self.loss_rng.index(candidates.len())];
        let kept = self.loss_rng.chance(500);
        let after = Duration::from_millis(self.loss_rng.range(1, 50));
        self.lose(r, x, kept, Some(after));
    }

    /// The backend loses `x` (its instance only when `kept`, else with its workspace) and
    /// replica `r`'s current incarnation hears it `after` later (at once when `None`), written
    /// out as the step that does the same (`[rN] instance-gone @call` or `[rN] die @call`).
    /// A sandbox not up loses nothing more, but the report still comes (a late one).
    pub(super) fn lose(&mut self, r: usize, x: SandboxId, kept: bool, after: Option<Duration>) {
        if self.trace {
            let what = if kept {
                "its instance"
            } else {
                "with its workspace"
            };
            println!(
                "{:>9} ms   the backend loses {x} ({what}), r{r} hears it",
                self.now / MS
            );
        }
        if self.backend.lose(x, kept) {
            if kept {
                self.report.marks.insert("instance-lost");
            } else {
                self.report.marks.insert("death");
                self.conservation.died(x);
            }
        }
        if self.recorder.is_some() {
            self.record_loss(r, x, kept, after);
        }
        let input = if kept {
            Input::InstanceGone { sandbox: x }
        } else {
            Input::Died { sandbox: x }
        };
        let inc = self.replicas[r].incarnation;
        let heard = Ev::Answer(r, inc, input, sandkeeper::Instant::MAX);
        match after {
            None => self.process(heard),
            Some(d) => self.push(self.now + d.as_nanos() as u64, heard),
        }
    }

    fn record_loss(&mut self, r: usize, x: SandboxId, kept: bool, after: Option<Duration>) {
        let Some(call) = self.names.as_ref().and_then(|n| n.call_for(x)) else {
            let text = format!("r{r}: the backend lost {x} (instance only: {kept})");
            return self.record(None, Step::Unspellable(text));
        };
        let answer = if kept {
            Answer::InstanceGone
        } else {
            Answer::Die
        };
        let step = FleetStep::Backend {
            answer: BackendAnswer::Plain(answer),
            call,
            run: None,
            after,
            shelf: None,
        };
        self.record(Some(r), Step::Fleet(step));
    }

    /// Replica `r` is about to take `input`: a report that a sandbox died or lost its instance
    /// is fed to the checks first (what the one-process history does before its core sees it).
    pub(super) fn loss_told(&mut self, r: usize, input: &Input) {
        let (x, dead) = match input {
            Input::Died { sandbox } => (*sandbox, true),
            Input::InstanceGone { sandbox } => (*sandbox, false),
            _ => return,
        };
        if let (true, Some(script)) = (dead, self.script.as_mut()) {
            // A scenario's bookkeeping of the replica's lanes: dead once the core hears it.
            script.died(r, x);
        }
        let replica = &mut self.replicas[r];
        let state = replica.core.sandbox_state(x);
        let up = replica.intent.told_lost(x, dead, state);
        if dead || up {
            replica.process.lost(x);
        }
        if up {
            replica.progress.instance_lost(x);
            self.conservation.instance_lost(x);
        }
    }
}
