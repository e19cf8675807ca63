//! Running a fleet scenario: each step on the scenario-driven world, every check after every
//! step, then liveness as a seed's world ends: faults stop (every store link back to `auto`,
//! every outstanding command answered as the backend decides), a minute of calm with every
//! answer given at once, every replica that did not crash closed, and the world's liveness
//! checks (every call ended, every version settled, every replica closed, no key left owned
//! once the leases ran out).

use std::time::Duration;

use crate::failure::Failure;
use crate::fleet::process::Told;
use crate::fleet::{Ev, Run, World};
use crate::harness::Stop;
use crate::scenario::{RunMode, Scenario, Verdict};
use crate::step::fleet::{FleetSpec, Link};

use super::ns;

/// The calm after the last step, before every replica closes.
const CALM: Duration = Duration::from_secs(60);
/// How long closing may take.
const CLOSING: Duration = Duration::from_secs(40);

/// Runs the fleet scenario `scenario` (its `fleet` line `spec`). `log` receives each step and
/// what it caused. Also returns the indices of the steps that took effect (in lenient mode, a
/// step that is an error of the scenario is skipped).
pub fn run_fleet_scenario(
    scenario: &Scenario,
    spec: &FleetSpec,
    mode: RunMode,
    mut log: Option<&mut dyn FnMut(&str)>,
) -> (Verdict, Vec<usize>) {
    if scenario.config.fleet.is_none() {
        let message = "a fleet scenario's configuration has no fleet timing".to_string();
        return (Verdict::Misuse { line: 0, message }, Vec::new());
    }
    let mut w = World::scripted(scenario.config.clone(), spec);
    w.script_mut().close_deadline = scenario.close_deadline;
    let mut effective = Vec::new();
    for (i, (line, step)) in scenario.steps.iter().enumerate() {
        w.script_mut().step = i + 1;
        let r = crate::panics::catch(|| {
            let done = w.script_step(step);
            w.judge_conservation();
            done
        });
        if let Some(log) = log.as_mut() {
            log(&format!("{line:>4}  {step}"));
            w.flush_log(&mut **log);
        } else {
            w.script_mut().log.clear();
        }
        let stopped = match r {
            Ok(Ok(())) => w.failure(),
            Ok(Err(Stop::Failed(f))) => Some(f),
            Ok(Err(Stop::Misuse(message))) => match mode {
                RunMode::Strict => {
                    return (
                        Verdict::Misuse {
                            line: *line,
                            message,
                        },
                        effective,
                    )
                }
                RunMode::Lenient => continue,
            },
            Err(panic) => Some(panicked(panic, &w)),
        };
        effective.push(i);
        if let Some(failure) = stopped {
            return (
                Verdict::Fail {
                    line: *line,
                    failure,
                },
                effective,
            );
        }
    }
    let r = crate::panics::catch(|| w.script_end());
    if let Some(log) = log.as_mut() {
        log("   -  (liveness: every store answers, every command is answered, a minute of calm, every replica closes)");
        w.flush_log(&mut **log);
    }
    let verdict = match r {
        Ok(Ok(())) => match w.failure() {
            None => Verdict::Pass,
            Some(failure) => Verdict::Fail { line: 0, failure },
        },
        Ok(Err(Stop::Failed(failure))) => Verdict::Fail { line: 0, failure },
        Ok(Err(Stop::Misuse(message))) => Verdict::Misuse { line: 0, message },
        Err(panic) => Verdict::Fail {
            line: 0,
            failure: panicked(panic, &w),
        },
    };
    (verdict, effective)
}

fn panicked(detail: String, w: &World) -> Failure {
    Failure {
        invariant: "panic".into(),
        step: w.script_ref().step,
        detail,
    }
}

impl World {
    /// The first broken check, if any.
    fn failure(&self) -> Option<Failure> {
        self.failed.as_ref().map(|(check, detail)| Failure {
            invariant: check.clone(),
            step: self.script_ref().step,
            detail: detail.clone(),
        })
    }

    /// Hands what happened since the last look to `log`, indented.
    fn flush_log(&mut self, log: &mut dyn FnMut(&str)) {
        for line in std::mem::take(&mut self.script_mut().log) {
            log(&format!("        {line}"));
        }
    }

    /// After the last step: faults stop, a calm, every replica that is alive closes, and the
    /// world's liveness checks.
    fn script_end(&mut self) -> Result<(), Stop> {
        self.script_mut().quiet_renewals = true;
        self.lose_stale_requests();
        for r in 0..self.replicas.len() {
            self.link(r, Link::Auto);
        }
        self.calm_until(self.now + ns(CALM))?;
        let deadline = self.script_ref().close_deadline;
        for r in 0..self.replicas.len() {
            if self.report.failure.is_some() {
                return Ok(());
            }
            match self.replicas[r].run {
                Run::Crashed => {}
                _ if self.replicas[r].core.is_closing() => {}
                Run::Up => self.input(r, Told::Close(deadline), |core, t| core.close(t, deadline)),
                // Its driver closes it when it comes back.
                Run::Paused { .. } => self.push(self.now, Ev::Close(r)),
            }
        }
        self.calm_until(self.now + ns(CLOSING))?;
        if self.report.failure.is_none() {
            self.liveness();
        }
        Ok(())
    }

    /// What no step answered and its driver gave up on (past its deadline, or ordered by a
    /// process that crashed since) never reached the store or the backend: lost in transit,
    /// as a request that lands no later than the seed world's latencies allow.
    fn lose_stale_requests(&mut self) {
        let stale = |w: &World, r: usize, inc: u32, deadline: Option<sandkeeper::Instant>| {
            let replica = &w.replicas[r];
            replica.incarnation != inc
                || deadline.is_some_and(|d| replica.local(w.now) > d.as_nanos())
        };
        let s = self.script_ref();
        let held: Vec<_> = s
            .held
            .iter()
            .filter(|(r, inc, cmd)| !stale(self, *r, *inc, Some(cmd.deadline())))
            .cloned()
            .collect();
        let outstanding: Vec<_> = s
            .outstanding
            .iter()
            .filter(|o| !stale(self, o.r, o.inc, o.cmd.deadline()))
            .cloned()
            .collect();
        let s = self.script_mut();
        s.held = held;
        s.outstanding = outstanding;
    }

    /// Time runs to `end` with every outstanding command answered at once, as the backend
    /// decides.
    fn calm_until(&mut self, end: u64) -> Result<(), Stop> {
        loop {
            self.settle(None, None)?;
            if self.report.failure.is_some() {
                return Ok(());
            }
            let next = self.queue.peek().map(|std::cmp::Reverse((at, _, _))| *at);
            match next {
                Some(at) if at <= end => self.run_until(at),
                _ => {
                    self.now = self.now.max(end);
                    return Ok(());
                }
            }
        }
    }
}
