//! A fleet scenario's steps, applied to the world: the application's on a replica, the
//! backend's and the store's answers, the replica's own fate, the fleet's time.
//!
//! A step the world cannot take as written is an error of the scenario ([`Stop::Misuse`]),
//! found before anything changes: an answer to a command the replica did not order (or a
//! command its driver dropped), an answer the simulated backend or store would not give, input
//! for a replica that is paused or crashed, a call name another replica used.

use sandkeeper::{
    CallId, CallSpec, Command, ErrorKind, Input, Instant, Key, Lifecycle, PathName, Payload,
    SandboxId, StoreCommand, UploadFailure,
};

use super::{bounded, ns};
use crate::fleet::backend::Outcome;
use crate::fleet::hosts::Draw;
use crate::fleet::process::Told;
use crate::fleet::{Ev, Phase, Run, World, MS};
use crate::harness::Stop;
use crate::step::fleet::{BackendAnswer, FleetStep, Link, ShelfFault, StoreAnswer};
use crate::step::{Answer, OpKind, ResolveExpect, Step};

impl World {
    /// Applies one step of a fleet scenario, after whatever was due by now happened.
    pub(super) fn script_step(&mut self, step: &Step) -> Result<(), Stop> {
        if !self.script_ref().on_advance {
            self.run_until(self.now);
        }
        match step {
            Step::Advance(d) => self.run_until(self.now + ns(bounded("advance", *d)?)),
            Step::Fleet(FleetStep::Advance { by, at_target }) => {
                let target = self.now + ns(bounded("advance", *by)?);
                self.run_to(target, Some(*at_target));
            }
            Step::Settle(only) => {
                let x = only.as_ref().map(|c| self.sandbox_of(c)).transpose()?;
                self.settle(None, x)?;
            }
            Step::Fleet(FleetStep::Expect(e)) => self.expect_fleet(None, e)?,
            Step::On(r, _) if r.0 >= self.replicas.len() => {
                return Err(Stop::Misuse(format!(
                    "unknown replica {r}: the fleet has {}",
                    self.replicas.len()
                )))
            }
            Step::On(r, inner) => self.on_replica(r.0, inner)?,
            other => {
                return Err(Stop::Misuse(format!(
                    "`{other}` needs its replica in a fleet: [r0] {other}"
                )))
            }
        }
        self.pump();
        Ok(())
    }

    fn on_replica(&mut self, r: usize, step: &Step) -> Result<(), Stop> {
        match step {
            Step::Acquire {
                call,
                session,
                user,
                external,
            } => {
                let mut spec = CallSpec::new(call.clone(), session.clone());
                spec.user = user.clone();
                spec.external = external.clone();
                self.acquire(r, call, spec)
            }
            Step::Release(call) => self
                .app(r, Told::Release(call), |core, t| core.release(t, call))
                .map(drop),
            // The fleet's checkers follow the policy's way down: the fleet worlds never ask
            // one, and a scenario that does is judged by them as if the policy had.
            Step::DropSnapshot(key) => self
                .app(r, Told::Nothing, |core, t| {
                    core.drop_snapshot(t, key).map(drop)
                })
                .map(drop),
            Step::ReleaseAs(call, way) => self
                .app(r, Told::Release(call), |core, t| {
                    core.release_as(t, call, *way)
                })
                .map(drop),
            Step::Flush {
                session,
                path,
                bytes,
            } => self.flush_on(r, session, path.clone(), *bytes),
            Step::Resolve(session, expect) => self.resolve_on(r, session, expect),
            Step::Hold(session) => self
                .app(r, Told::Hold(session), |core, t| core.hold(t, session))
                .map(drop),
            Step::Unhold(session) => self
                .app(r, Told::Unhold(session), |core, t| core.unhold(t, session))
                .map(drop),
            Step::Enter(session) => {
                if let Some(x) = self.app(r, Told::Nothing, |core, t| core.enter(t, session))? {
                    self.replicas[r].process.entered(x);
                    let order = self.operation_made();
                    let seen = &mut self.script_mut().seen[r];
                    seen.entered
                        .entry(session.clone())
                        .or_default()
                        .push_back((x, order));
                }
                Ok(())
            }
            Step::Leave(session) => {
                self.up(r)?;
                let entered = self.script_mut().seen[r]
                    .entered
                    .get_mut(session)
                    .and_then(std::collections::VecDeque::pop_front);
                match entered {
                    Some((x, order)) => {
                        // Its file is written first, under the token the replica holds.
                        let wrote = self.operation_writes(r, session, x, order);
                        let left = self.app(r, Told::Leave(x), |core, t| core.leave(t, x))?;
                        if left.is_some() && wrote {
                            let work = crate::fleet::operation_work(session);
                            self.conservation.acknowledged(x, work, order);
                        }
                        Ok(())
                    }
                    None => {
                        self.script_mut().seen[r].last_error = Some(ErrorKind::NotEntered);
                        Ok(())
                    }
                }
            }
            Step::Close(deadline) => {
                let d = deadline.unwrap_or(self.script_ref().close_deadline);
                self.app(r, Told::Close(d), |core, t| core.close(t, d))
                    .map(drop)
            }
            Step::Refused { call, .. } => {
                let seen = &mut self.script_mut().seen[r];
                seen.last_error = Some(ErrorKind::InvalidName);
                if let Some(c) = call {
                    seen.refused_calls.push(c.clone());
                }
                Ok(())
            }
            Step::Settle(only) => {
                let x = only.as_ref().map(|c| self.sandbox_of(c)).transpose()?;
                self.settle(Some(r), x)
            }
            Step::Expect(e) => self.expect_on(r, e),
            Step::Fleet(step) => self.fleet_step(r, step),
            other => Err(Stop::Misuse(format!(
                "`{other}` does not happen on one replica"
            ))),
        }
    }

    fn fleet_step(&mut self, r: usize, step: &FleetStep) -> Result<(), Stop> {
        match step {
            FleetStep::Backend {
                answer,
                call,
                run,
                after,
                shelf,
            } => {
                let after = after.map(|d| bounded("after", d)).transpose()?;
                // The object store's fault in the command the step runs, if any.
                self.shelf_next = shelf.map(|fault| Draw {
                    fail: fault == ShelfFault::Fail,
                    late: fault == ShelfFault::Late,
                });
                let done = self.backend_answers(r, answer, call, *run, after);
                self.shelf_next = None;
                done
            }
            FleetStep::Store {
                answer,
                key,
                id,
                run,
                after,
            } => {
                let after = after.map(|d| bounded("after", d)).transpose()?;
                self.store_answers(r, *answer, key.as_ref(), *id, *run, after)
            }
            FleetStep::Link(link) => {
                self.link(r, *link);
                Ok(())
            }
            FleetStep::Pause(d) => {
                self.alive(r)?;
                if let Run::Paused { until } = self.replicas[r].run {
                    return Err(Stop::Misuse(format!(
                        "r{r} is paused already, until {} ms",
                        until / MS
                    )));
                }
                self.process(Ev::Pause(r, ns(bounded("pause", *d)?)));
                Ok(())
            }
            FleetStep::Crash => {
                self.alive(r)?;
                self.replicas[r].run = Run::Crashed;
                self.crashed.insert(self.replicas[r].incarnation);
                Ok(())
            }
            FleetStep::Restart { drift_ppm } => {
                if self.replicas[r].run != Run::Crashed {
                    return Err(Stop::Misuse(format!(
                        "r{r} did not crash: only a crashed replica restarts"
                    )));
                }
                let replica = self.start_incarnation(r, drift_ppm.unwrap_or(0));
                self.replicas[r] = replica;
                self.script_mut().seen[r] = super::Seen::default();
                self.push(self.now, Ev::Wake(r));
                Ok(())
            }
            FleetStep::Sweep => {
                self.up(r)?;
                self.sweep_on(r);
                Ok(())
            }
            FleetStep::Expect(e) => self.expect_fleet(Some(r), e),
            FleetStep::Advance { .. } => Err(Stop::Misuse(
                "advance moves the whole fleet's time: write it without a replica".into(),
            )),
        }
    }

    // ------------------------------------------------------------------------------------------
    // The application

    /// Replica `r` runs: it takes input now.
    fn up(&self, r: usize) -> Result<(), Stop> {
        match self.replicas[r].run {
            Run::Up => Ok(()),
            Run::Paused { until } => Err(Stop::Misuse(format!(
                "r{r} is paused until {} ms: it takes no input",
                until / MS
            ))),
            Run::Crashed => Err(Stop::Misuse(format!(
                "r{r} crashed: it takes no input until it restarts"
            ))),
        }
    }

    /// Replica `r` did not crash.
    fn alive(&self, r: usize) -> Result<(), Stop> {
        match self.replicas[r].run {
            Run::Crashed => Err(Stop::Misuse(format!("r{r} crashed already"))),
            _ => Ok(()),
        }
    }

    /// Gives replica `r`'s core an application input: its answer, or `None` when the core
    /// refused it (the error kind is kept for `expect error`).
    fn app<R>(
        &mut self,
        r: usize,
        told: Told<'_>,
        f: impl FnOnce(&mut Lifecycle, Instant) -> Result<R, sandkeeper::Error>,
    ) -> Result<Option<R>, Stop> {
        self.up(r)?;
        match self.apply_input(r, f) {
            Ok((answer, local)) => {
                self.script_mut().seen[r].last_error = None;
                self.told(r, told, Ok(()), local);
                self.drain(r, local);
                Ok(Some(answer))
            }
            Err(e) => {
                let local = self.replicas[r].local(self.now);
                self.told(r, told, Err(e.kind()), local);
                self.script_mut().seen[r].last_error = Some(e.kind());
                Ok(None)
            }
        }
    }

    fn acquire(&mut self, r: usize, call: &CallId, spec: CallSpec) -> Result<(), Stop> {
        if let Some((other, _)) = self.names().get(call) {
            if other != r {
                return Err(Stop::Misuse(format!(
                    "call {call} was acquired on r{other}: a call's name names one call in the whole fleet"
                )));
            }
        }
        self.up(r)?;
        let fresh = !self.replicas[r].calls.contains_key(call);
        if fresh {
            let key = super::super::key_of(self.config.scope, call, &spec.session);
            self.replicas[r]
                .calls
                .insert(call.clone(), (spec.session.clone(), Phase::Waiting, key));
        }
        let (session, user, external) = (
            spec.session.clone(),
            spec.user.clone(),
            spec.external.clone(),
        );
        let told = Told::Acquire(call, &session, user.as_ref(), external.as_ref());
        let done = self.app(r, told, |core, t| core.acquire(t, spec))?;
        match done {
            Some(()) => {
                if let Some(names) = self.names.as_mut() {
                    names.acquired(call, r);
                }
            }
            None if fresh => {
                self.replicas[r].calls.remove(call);
            }
            None => {}
        }
        Ok(())
    }

    fn flush_on(
        &mut self,
        r: usize,
        session: &sandkeeper::SessionId,
        path: Option<PathName>,
        bytes: usize,
    ) -> Result<(), Stop> {
        self.up(r)?;
        let path = path.unwrap_or_else(PathName::session_log);
        let payload = Payload::new(vec![b'x'; bytes]);
        match self.apply_input(r, |core, t| core.flush(t, session, &path, payload)) {
            Ok((version, local)) => {
                self.script_mut().seen[r].last_error = None;
                // Recorded before the drain, whose events may settle it.
                self.note_flush(r, session, &path, version.0);
                if let Err(v) = self.replicas[r].versions.flushed(session, &path, version.0) {
                    self.fail(v.check, format!("replica {r}: {}", v.detail));
                }
                let replica = &mut self.replicas[r];
                (replica.process).flushed(session, &path, version.0, replica.intent.uploads());
                self.drain(r, local);
            }
            Err(e) => self.script_mut().seen[r].last_error = Some(e.kind()),
        }
        Ok(())
    }

    fn resolve_on(
        &mut self,
        r: usize,
        session: &sandkeeper::SessionId,
        expect: &ResolveExpect,
    ) -> Result<(), Stop> {
        let got = self.replicas[r].core.resolve(session);
        let fits = match (expect, &got) {
            (ResolveExpect::Call(c), Ok(x)) => self.sandbox_of(c)? == *x,
            (ResolveExpect::None, Err(sandkeeper::Error::NoActiveSandbox { .. })) => true,
            (ResolveExpect::Gone, Err(sandkeeper::Error::SandboxGone { .. })) => true,
            _ => false,
        };
        if fits {
            return Ok(());
        }
        Err(self.expectation(format!(
            "r{r}: resolve {session}: expected {expect:?}, got {got:?}"
        )))
    }

    /// The sandbox `@call` names: the one the call is, or was last, bound to, on whichever
    /// replica.
    pub(super) fn sandbox_of(&self, call: &CallId) -> Result<SandboxId, Stop> {
        match self.names().get(call) {
            Some((_, Some(x))) => Ok(x),
            Some((r, None)) => Err(Stop::Misuse(format!(
                "@{call} names no sandbox: {call} (on r{r}) was never bound"
            ))),
            None => Err(Stop::Misuse(format!(
                "@{call} names no sandbox: no replica acquired {call}"
            ))),
        }
    }

    // ------------------------------------------------------------------------------------------
    // The backend

    /// The incarnations of replica `r` whose work a step may answer, in the order it looks:
    /// its `run`-th (counting from 0, its first start) when given, else its current one, then
    /// its earlier ones, oldest first.
    fn runs_of(&self, r: usize, run: Option<usize>) -> Result<Vec<u32>, Stop> {
        let runs = &self.script_ref().runs[r];
        match run {
            Some(k) => match runs.get(k) {
                Some(inc) => Ok(vec![*inc]),
                None => Err(Stop::Misuse(format!(
                    "run={k}: r{r} started {} times so far (run=0 is its first)",
                    runs.len()
                ))),
            },
            None => {
                let current = self.replicas[r].incarnation;
                let mut order = vec![current];
                order.extend(runs.iter().copied().filter(|inc| *inc != current));
                Ok(order)
            }
        }
    }

    /// The oldest command to `x` that `fits`, of the incarnations `runs` in that order, that
    /// its driver still holds: its place among the outstanding commands.
    fn outstanding_at(
        &self,
        r: usize,
        runs: &[u32],
        x: SandboxId,
        fits: impl Fn(&Command) -> bool,
    ) -> Option<usize> {
        let s = self.script_ref();
        runs.iter().find_map(|inc| {
            s.outstanding.iter().position(|o| {
                o.r == r
                    && o.inc == *inc
                    && o.cmd.sandbox() == x
                    && fits(&o.cmd)
                    && !self.dropped(o.r, o.inc, &o.cmd, o.seq)
            })
        })
    }

    fn backend_answers(
        &mut self,
        r: usize,
        answer: &BackendAnswer,
        call: &CallId,
        run: Option<usize>,
        after: Option<std::time::Duration>,
    ) -> Result<(), Stop> {
        let x = self.sandbox_of(call)?;
        let runs = self.runs_of(r, run)?;
        let answer = match answer {
            BackendAnswer::Fenced(command) => {
                return self.refused(r, &runs, x, call, command.as_deref(), after)
            }
            BackendAnswer::Plain(a) => a,
        };
        let Some(kind) = answer.op() else {
            return match answer {
                Answer::Die => self.died(r, x, after),
                Answer::InstanceGone => {
                    self.lose(r, x, true, after);
                    Ok(())
                }
                other => Err(Stop::Misuse(format!(
                    "{other} is not modelled in a fleet: the backend reports losses with `die` and `instance-gone`"
                ))),
            };
        };
        let fits = |cmd: &Command| match kind {
            OpKind::Start => matches!(cmd, Command::Start { .. } | Command::Adopt { .. }),
            OpKind::Upload => matches!(cmd, Command::Upload { .. }),
            OpKind::Stop => matches!(cmd, Command::Stop { .. }),
            OpKind::Persist => matches!(cmd, Command::Persist { .. }),
            OpKind::Shutdown => matches!(cmd, Command::Shutdown { .. }),
            OpKind::Hook => matches!(cmd, Command::Hook { .. }),
            OpKind::Relinquish => false,
        };
        let success = matches!(
            answer,
            Answer::StartOk
                | Answer::UploadOk
                | Answer::StopOk { .. }
                | Answer::PersistOk
                | Answer::ShutdownOk
        );
        let Some(i) = self.outstanding_at(r, &runs, x, fits) else {
            return Err(Stop::Misuse(format!(
                "{answer} @{call}: r{r} ordered no {kind:?} for {x} that is still unanswered"
            )));
        };
        if success {
            // What the backend would do, asked first: a wrong answer changes nothing.
            let (cmd, host) = {
                let o = &self.script_ref().outstanding[i];
                (&o.cmd, o.r)
            };
            let draw = self.shelf_next.unwrap_or_default();
            match self.backend.clone().apply(cmd, host, draw) {
                Outcome::Fenced => {
                    return Err(Stop::Misuse(format!(
                        "{answer} @{call}: the backend refuses it, having seen a newer token for {x} or its key: answer `fenced @{call}`"
                    )))
                }
                // With the object store's fault the step says, the step runs the command and
                // the backend answers what it does (its transcript spells the fault whatever
                // the answer: a start may also find its snapshot nowhere).
                _ if self.shelf_next.is_some() => {}
                Outcome::Unavailable => {
                    return Err(Stop::Misuse(format!(
                        "{answer} @{call}: {x}'s instance is lost: answer with the failure"
                    )))
                }
                Outcome::Gone if kind != OpKind::Shutdown => {
                    return Err(Stop::Misuse(format!(
                        "{answer} @{call}: the backend has no {x} up to do it to: answer with the failure"
                    )))
                }
                _ => {}
            }
        }
        let o = self.script_mut().outstanding.remove(i);
        let sandbox = x;
        let input = match answer {
            Answer::StartOk
            | Answer::UploadOk
            | Answer::StopOk { .. }
            | Answer::PersistOk
            | Answer::ShutdownOk => {
                let outcome = self.backend_runs(o.r, o.inc, &o.cmd);
                let outcome = match (answer, outcome) {
                    (Answer::StopOk { snapshot: Some(s) }, Outcome::Ok(_)) => {
                        self.conservation.renamed(sandbox, s);
                        Outcome::Ok(Some(s.clone()))
                    }
                    (_, outcome) => outcome,
                };
                World::answer_of(&o.cmd, outcome).map(|(input, _)| input)
            }
            Answer::HookOk => Some(Input::HookOk { sandbox }),
            Answer::HookFail => Some(Input::HookFailed { sandbox }),
            Answer::StartFail => Some(Input::StartFailed { sandbox }),
            Answer::StopFail => Some(Input::StopFailed { sandbox }),
            Answer::PersistFail => Some(Input::PersistFailed { sandbox }),
            Answer::ShutdownFail => Some(Input::ShutdownFailed { sandbox }),
            Answer::UploadFail { gone } => match &o.cmd {
                Command::Upload { upload, .. } => Some(Input::UploadFailed {
                    upload: *upload,
                    failure: if *gone {
                        UploadFailure::Gone
                    } else {
                        UploadFailure::Transient
                    },
                }),
                _ => None,
            },
            Answer::Die | Answer::InstanceGone => None,
        };
        if self.token_order_broken() {
            return Ok(());
        }
        if let (Some(input), Some(deadline)) = (input, o.cmd.deadline()) {
            self.deliver(o.r, o.inc, input, deadline, after);
        }
        Ok(())
    }

    /// `fenced @call [<command>]`: the backend refuses the oldest outstanding command to `x`
    /// that carries a token (of that name, when given).
    fn refused(
        &mut self,
        r: usize,
        runs: &[u32],
        x: SandboxId,
        call: &CallId,
        command: Option<&str>,
        after: Option<std::time::Duration>,
    ) -> Result<(), Stop> {
        let tokened =
            |cmd: &Command| cmd.token().is_some() && command.is_none_or(|c| c == cmd.name());
        let Some(i) = self.outstanding_at(r, runs, x, tokened) else {
            return Err(Stop::Misuse(format!(
                "fenced @{call}: r{r} ordered nothing for {x} under a token that is still unanswered"
            )));
        };
        let cmd = self.script_ref().outstanding[i].cmd.clone();
        let host = self.script_ref().outstanding[i].r;
        // What the backend would do, asked first. A backend that takes the old token breaks
        // `token-order` (the run's failure, not the scenario's error); one that takes it
        // rightly makes the answer wrong.
        let mut probe = self.backend.clone();
        if probe.apply(&cmd, host, Draw::default()) != Outcome::Fenced && probe.violation.is_none()
        {
            return Err(Stop::Misuse(format!(
                "fenced @{call}: the backend accepts {} under {:?}: it has seen no newer token for {x} or its key",
                cmd.name(),
                cmd.token()
            )));
        }
        let o = self.script_mut().outstanding.remove(i);
        let outcome = self.backend_runs(o.r, o.inc, &o.cmd);
        if self.token_order_broken() {
            return Ok(());
        }
        if let Some((input, deadline)) = World::answer_of(&o.cmd, outcome) {
            self.deliver(o.r, o.inc, input, deadline, after);
        }
        Ok(())
    }

    /// The backend broke `token-order`: reported as the run's failure.
    fn token_order_broken(&mut self) -> bool {
        match self.backend.violation.take() {
            Some(v) => {
                self.fail("token-order", v);
                true
            }
            None => false,
        }
    }

    /// `die @call`: the sandbox dies with its workspace; the replica hears it.
    fn died(
        &mut self,
        r: usize,
        x: SandboxId,
        after: Option<std::time::Duration>,
    ) -> Result<(), Stop> {
        self.lose(r, x, false, after);
        Ok(())
    }

    /// Answers every outstanding command (of replica `only_r`, to sandbox `only_x`, when given)
    /// as the backend decides, each at once, until none is left.
    pub(super) fn settle(
        &mut self,
        only_r: Option<usize>,
        only_x: Option<SandboxId>,
    ) -> Result<(), Stop> {
        for _ in 0..100_000 {
            self.pump();
            if self.report.failure.is_some() {
                return Ok(());
            }
            let next = self.script_ref().outstanding.iter().position(|o| {
                only_r.is_none_or(|r| o.r == r) && only_x.is_none_or(|x| o.cmd.sandbox() == x)
            });
            let Some(i) = next else {
                return Ok(());
            };
            let o = self.script_mut().outstanding.remove(i);
            if self.dropped(o.r, o.inc, &o.cmd, o.seq) {
                continue;
            }
            let answer = match &o.cmd {
                // Hooks are the application's: settled as run through.
                Command::Hook {
                    sandbox, deadline, ..
                } => Some((Input::HookOk { sandbox: *sandbox }, *deadline)),
                cmd => {
                    let outcome = self.backend_runs(o.r, o.inc, cmd);
                    World::answer_of(cmd, outcome)
                }
            };
            if self.token_order_broken() {
                return Ok(());
            }
            if let Some((input, deadline)) = answer {
                self.deliver(o.r, o.inc, input, deadline, None);
            }
        }
        Err(Stop::Misuse("settle never ran out of commands".into()))
    }

    // ------------------------------------------------------------------------------------------
    // The store

    /// How replica `r`'s store work goes from now on; `auto` and `down` take what is held.
    pub(super) fn link(&mut self, r: usize, link: Link) {
        let s = self.script_mut();
        s.links[r] = link;
        if link == Link::Hold {
            return;
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut s.held)
            .into_iter()
            .partition(|(hr, _, _)| *hr == r);
        s.held = rest;
        for (hr, inc, cmd) in mine {
            s.due.push_back((hr, inc, cmd, link == Link::Down));
        }
    }

    fn store_answers(
        &mut self,
        r: usize,
        answer: StoreAnswer,
        key: Option<&Key>,
        id: Option<u64>,
        run: Option<usize>,
        after: Option<std::time::Duration>,
    ) -> Result<(), Stop> {
        let runs = self.runs_of(r, run)?;
        let s = self.script_ref();
        let found = runs.iter().find_map(|inc| {
            s.held.iter().position(|(hr, held_inc, cmd)| {
                *hr == r && held_inc == inc && answers(answer, key, id, cmd)
            })
        });
        let Some(i) = found else {
            let link = s.links[r];
            let what = match key {
                Some(k) => format!("{} of {k}", kind_word(answer)),
                None => kind_word(answer).to_string(),
            };
            return Err(Stop::Misuse(format!(
                "{}: r{r} has no {what} held for the store (its store link is {link}{})",
                answer.verb(),
                if link == Link::Hold {
                    ""
                } else {
                    ": its work is answered at once"
                }
            )));
        };
        let (_, inc, cmd) = s.held[i].clone();
        if !answer.is_error() {
            // What the store would answer, asked first: a wrong answer changes nothing.
            let mut probe = self.store.clone();
            let would = store_would(&mut probe, inc, &cmd, self.now);
            if would != answer {
                return Err(Stop::Misuse(format!(
                    "{}: the store answers {:?} with `{}`",
                    answer.verb(),
                    cmd,
                    would.verb()
                )));
            }
        }
        self.script_mut().held.remove(i);
        let (input, deadline) = self.store_runs(r, inc, cmd, answer.is_error());
        self.deliver(r, inc, input, deadline, after);
        Ok(())
    }
}

/// Whether a store answer answers `cmd` (of that kind, for that key, with that number).
fn answers(answer: StoreAnswer, key: Option<&Key>, id: Option<u64>, cmd: &StoreCommand) -> bool {
    let (kind, k, n) = match cmd {
        StoreCommand::Renew { renewal, .. } => ("renewal", None, renewal.0),
        StoreCommand::Claim { claim, key, .. } => ("claim", Some(key), claim.0),
        StoreCommand::Record { recording, key, .. } => ("record", Some(key), recording.0),
        StoreCommand::Release { release, key, .. } => ("release", Some(key), release.0),
    };
    kind == kind_word(answer) && k == key && id.is_none_or(|id| id == n)
}

/// The kind of store work an answer answers.
fn kind_word(answer: StoreAnswer) -> &'static str {
    match answer {
        StoreAnswer::Renewed | StoreAnswer::RenewFailed => "renewal",
        StoreAnswer::Claimed | StoreAnswer::ClaimBusy | StoreAnswer::ClaimFailed => "claim",
        StoreAnswer::Recorded | StoreAnswer::RecordFailed | StoreAnswer::RecordFenced => "record",
        StoreAnswer::Released | StoreAnswer::ReleaseFailed | StoreAnswer::ReleaseFenced => {
            "release"
        }
    }
}

/// What the store answers `cmd` of incarnation `inc` at `now` (it may change `store`: ask a
/// copy).
fn store_would(
    store: &mut crate::fleet::store::Store,
    inc: u32,
    cmd: &StoreCommand,
    now: u64,
) -> StoreAnswer {
    use crate::fleet::store::ClaimAnswer;
    match cmd {
        StoreCommand::Renew { epoch, .. } => match store.renew(inc, *epoch, now) {
            Some(_) => StoreAnswer::Renewed,
            None => StoreAnswer::RenewFailed,
        },
        StoreCommand::Claim { key, epoch, .. } => match store.claim(key, inc, *epoch, now) {
            ClaimAnswer::Claimed(..) => StoreAnswer::Claimed,
            ClaimAnswer::Busy => StoreAnswer::ClaimBusy,
        },
        StoreCommand::Record {
            key,
            token,
            recording,
            record,
            ..
        } => {
            if store.record(key, inc, *token, recording.0, record.clone(), now) {
                StoreAnswer::Recorded
            } else {
                StoreAnswer::RecordFenced
            }
        }
        StoreCommand::Release {
            key, token, record, ..
        } => {
            if store.release(key, inc, *token, record.clone(), now) {
                StoreAnswer::Released
            } else {
                StoreAnswer::ReleaseFenced
            }
        }
    }
}
