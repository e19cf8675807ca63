//! A seed's fleet run written out as a fleet scenario (`FleetOptions::transcript`): what each
//! of its events did, as the step that makes a scenario-driven world do the same, at the same
//! instant. The shrinker replays it and removes steps while it still fails the same check.
//!
//! | the seed's event | the step |
//! |---|---|
//! | a call arrives, is released, flushes | `[rN] acquire cK session=S`, `[rN] release cK`, `[rN] flush S bytes=B` |
//! | the backend runs a command | `[rN] <answer> @<call> ... after=<latency>` (the answer it gave; `fenced @<call> <command>`) |
//! | the store takes a piece of work | `[rN] <store answer> <key> id=<n> after=<latency>` (the store's link is `hold` throughout) |
//! | a pause, a crash, a restart, a sweep, a close | `[rN] pause <d>`, `[rN] crash`, `[rN] restart drift=<ppm>`, `[rN] sweep`, `[rN] close deadline=5s` |
//! | time passes | `advance <d>` (to the nanosecond: `1500ns`) |
//!
//! Timers, the end of a pause and an answer's arrival are the scenario world's own doing, at
//! the instants the seed had them. What cannot be named (a command to a sandbox no call was
//! ever bound to) is written as a comment, and the replay may then differ.

use std::time::Duration;

use sandkeeper::{Command, Config, Input, Key};

use super::World;
use crate::step::fleet::{BackendAnswer, FleetSpec, FleetStep, ReplicaNo, ShelfFault, StoreAnswer};
use crate::step::{Answer, Step};

/// A seed's run as a fleet scenario.
#[derive(Clone, Debug)]
pub struct FleetTranscript {
    /// The configuration, its `fleet` the timing.
    pub config: Config,
    /// The fleet line: the replicas, their first clocks, every store link `hold`, calm after
    /// the faults.
    pub spec: FleetSpec,
    /// The steps.
    pub steps: Vec<Step>,
}

/// The steps written so far, the instant of the last, and what came due since.
#[derive(Clone, Debug, Default)]
pub(super) struct Recorder {
    pub(super) steps: Vec<Step>,
    at: u64,
    /// The instant of the last event that came due (a timer, the end of a pause, an answer),
    /// and how many came due at that instant since the last step.
    due_at: u64,
    due: usize,
    /// Each replica's incarnations, in the order they started.
    runs: Vec<Vec<u32>>,
}

impl Recorder {
    /// Replica `r` started as incarnation `inc`.
    pub(super) fn booted(&mut self, r: usize, inc: u32) {
        if self.runs.len() <= r {
            self.runs.resize(r + 1, Vec::new());
        }
        self.runs[r].push(inc);
    }

    /// An event came due at `now` and happened.
    pub(super) fn came_due(&mut self, now: u64) {
        if now != self.due_at {
            self.due_at = now;
            self.due = 0;
        }
        self.due += 1;
    }
}

impl World {
    /// Writes `step` (on replica `r`, when given) at now, after the time that passed.
    pub(super) fn record(&mut self, r: Option<usize>, step: Step) {
        let now = self.now;
        let Some(rec) = self.recorder.as_mut() else {
            return;
        };
        // Time to now, and of what came due at now only what happened before this step.
        let at_target = if rec.due_at == now { rec.due } else { 0 };
        if now > rec.at || at_target > 0 {
            rec.steps.push(Step::Fleet(FleetStep::Advance {
                by: Duration::from_nanos(now - rec.at),
                at_target,
            }));
            rec.at = now;
            rec.due = 0;
        }
        rec.steps.push(match r {
            Some(r) => Step::On(ReplicaNo(r), Box::new(step)),
            None => step,
        });
    }

    /// Writes the time that passed up to now, and what came due at now, with no step after it:
    /// the end of a failing run, so that its replay reaches the event that broke the check
    /// before the scenario's end changes the world (every store link `auto`).
    pub(super) fn record_time(&mut self) {
        let now = self.now;
        let Some(rec) = self.recorder.as_mut() else {
            return;
        };
        let at_target = if rec.due_at == now { rec.due } else { 0 };
        if now > rec.at || at_target > 0 {
            rec.steps.push(Step::Fleet(FleetStep::Advance {
                by: Duration::from_nanos(now - rec.at),
                at_target,
            }));
            rec.at = now;
            rec.due = 0;
        }
    }

    /// Which run of replica `r` incarnation `inc` is, when it is not the current one.
    fn run_of(&self, r: usize, inc: u32) -> Option<usize> {
        if inc == self.replicas[r].incarnation {
            return None;
        }
        let rec = self.recorder.as_ref()?;
        rec.runs.get(r)?.iter().position(|i| *i == inc)
    }

    /// The backend ran `cmd`, which incarnation `inc` of replica `r` ordered, and answered
    /// `input`, which arrives `after` later.
    pub(super) fn record_backend(
        &mut self,
        r: usize,
        inc: u32,
        cmd: &Command,
        input: &Input,
        after: u64,
    ) {
        let Some(call) = self.names.as_ref().and_then(|n| n.call_for(cmd.sandbox())) else {
            let text = format!("r{r}: the backend answered {input:?} to {}", cmd.name());
            return self.record(None, Step::Unspellable(text));
        };
        // With hosts, a fault of the object store's in the command is spelled on the step that
        // runs it (`shelf=`), whatever the backend then answered.
        let shelf = match (cmd, input) {
            (_, Input::Fenced { .. }) => None,
            (Command::Start { .. }, _) if self.last_draw.fail => Some(ShelfFault::Fail),
            (Command::Persist { .. }, _) if self.last_draw.fail => Some(ShelfFault::Fail),
            (Command::Persist { .. }, _) if self.last_draw.late => Some(ShelfFault::Late),
            _ => None,
        };
        let ran = match cmd {
            Command::Start { .. } => Answer::StartOk,
            _ => Answer::PersistOk,
        };
        let answer = match input {
            _ if shelf.is_some() => BackendAnswer::Plain(ran),
            Input::Fenced { .. } => BackendAnswer::Fenced(Some(cmd.name().to_string())),
            Input::StartOk { .. } => BackendAnswer::Plain(Answer::StartOk),
            // With hosts: an Adopt of a sandbox on another host, run by the replica's host's
            // backend (`start-ok` runs it; that backend answers `InstanceGone`).
            Input::InstanceGone { .. } if matches!(cmd, Command::Adopt { .. }) => {
                BackendAnswer::Plain(Answer::StartOk)
            }
            Input::StartFailed { .. } => BackendAnswer::Plain(Answer::StartFail),
            Input::UploadOk { .. } => BackendAnswer::Plain(Answer::UploadOk),
            Input::UploadFailed { failure, .. } => BackendAnswer::Plain(Answer::UploadFail {
                gone: *failure == sandkeeper::UploadFailure::Gone,
            }),
            Input::StopOk { snapshot, .. } => BackendAnswer::Plain(Answer::StopOk {
                snapshot: snapshot.clone(),
            }),
            Input::StopFailed { .. } => BackendAnswer::Plain(Answer::StopFail),
            Input::PersistOk { .. } => BackendAnswer::Plain(Answer::PersistOk),
            Input::PersistFailed { .. } => BackendAnswer::Plain(Answer::PersistFail),
            Input::ShutdownOk { .. } => BackendAnswer::Plain(Answer::ShutdownOk),
            Input::ShutdownFailed { .. } => BackendAnswer::Plain(Answer::ShutdownFail),
            Input::HookOk { .. } => BackendAnswer::Plain(Answer::HookOk),
            Input::HookFailed { .. } => BackendAnswer::Plain(Answer::HookFail),
            other => {
                let text = format!("r{r}: the backend answered {other:?}");
                return self.record(None, Step::Unspellable(text));
            }
        };
        let step = FleetStep::Backend {
            answer,
            call,
            run: self.run_of(r, inc),
            after: Some(Duration::from_nanos(after)),
            shelf,
        };
        self.record(Some(r), Step::Fleet(step));
    }

    /// The store took a piece of the work of incarnation `inc` of replica `r` and answered
    /// `input`, which arrives `after` later (`None`: the process that asked crashed, nobody
    /// hears it).
    pub(super) fn record_store(&mut self, r: usize, inc: u32, input: &Input, after: Option<u64>) {
        let (answer, key, id): (StoreAnswer, Option<&Key>, u64) = match input {
            Input::Renewed { renewal, .. } => (StoreAnswer::Renewed, None, renewal.0),
            Input::RenewFailed { renewal } => (StoreAnswer::RenewFailed, None, renewal.0),
            Input::Claimed { claim, key, .. } => (StoreAnswer::Claimed, Some(key), claim.0),
            Input::ClaimBusy { claim, key } => (StoreAnswer::ClaimBusy, Some(key), claim.0),
            Input::ClaimFailed { claim, key } => (StoreAnswer::ClaimFailed, Some(key), claim.0),
            Input::Recorded { recording, key } => (StoreAnswer::Recorded, Some(key), recording.0),
            Input::RecordFailed { recording, key } => {
                (StoreAnswer::RecordFailed, Some(key), recording.0)
            }
            Input::RecordFenced { recording, key } => {
                (StoreAnswer::RecordFenced, Some(key), recording.0)
            }
            Input::KeyReleased { release, key } => (StoreAnswer::Released, Some(key), release.0),
            Input::ReleaseFailed { release, key } => {
                (StoreAnswer::ReleaseFailed, Some(key), release.0)
            }
            Input::ReleaseFenced { release, key } => {
                (StoreAnswer::ReleaseFenced, Some(key), release.0)
            }
            other => {
                let text = format!("r{r}: the store answered {other:?}");
                return self.record(None, Step::Unspellable(text));
            }
        };
        let step = FleetStep::Store {
            answer,
            key: key.cloned(),
            id: Some(id),
            run: self.run_of(r, inc),
            after: after.map(Duration::from_nanos),
        };
        self.record(Some(r), Step::Fleet(step));
    }
}
