//! What one process (one incarnation of a replica) does with its keys' sandboxes, judged by the
//! one-process world's rules: the order of each sandbox's commands (`sandkeeper_check::Lane`),
//! the shape of its output stream (`OutputChecker`), its uploads in flight (`UploadChecker`: one per path,
//! none at a Stop, Shutdown or Relinquish, `Uploaded` only for the upload just acknowledged; an
//! answer its driver dropped past its deadline ends the upload here too, leniently, though the
//! core awaits it until its upload timeout), what each key keeps for its next start and when
//! it lets it go (`Snapshots`, with `resume-latest-snapshot` on every Start), and its hooks
//! (`hook-before-bind`, `hook-before-stop`, and the fleet's own `hook-not-again`). Three checks
//! of the one-process history are kept here as it keeps them (`sim/src/history.rs`, which this
//! world does not run): `drain-before-stop` (a first Stop comes after a Drain or a before hook),
//! `persist-after-stop` (a Persist only once its Stop was answered ok) and `start-after-persist`
//! (no Start for a key while its previous sandbox still stops or persists).
//!
//! The rules are `sandkeeper_check`'s; this file feeds them what a fleet adds:
//!
//! - An Adopt starts a new lane (a key's record may hand a process a sandbox it let go), and
//!   binds without a hook: the sandbox's first owner ran its after hook (`hook-not-again`: an
//!   adopted sandbox gets no after-start or after-resume hook here).
//! - A claim the core accepted hands the key its record's snapshot, retained until the record
//!   says (`Snapshots::handed`); a key the process no longer owns (released with its record,
//!   fenced, its lease lapsed) keeps nothing here (`Snapshots::let_go`).
//!
//! Which answers the core accepted is read from the core after the input, never guessed: a
//! sandbox's state moves on when its Stop, Persist or hook answer is taken (a stale one
//! changes nothing), and a claim is the core's when it then holds the key under the claim's
//! token. What an input settled is fed before the commands it caused are judged.
//!
//! One record per incarnation: a restart starts an empty one.

use std::collections::BTreeMap;

use sandkeeper::{
    Command, Config, Event, HookPoint, Hooks, Input, Instant, Key, Lifecycle, ReleasePolicy,
    SandboxId, SandboxState, Snapshot, Token,
};
use sandkeeper_check::{Flight, Lane, Op, OutputChecker, Snapshots, UploadChecker, Violation};

/// What this process ordered for one sandbox, as the checks need it.
#[derive(Clone, Debug, Default)]
struct Sbx {
    lane: Lane,
    /// Its key and the token it was started or adopted under.
    key: Option<(Key, Option<Token>)>,
    /// Taken over from another owner (Adopt) rather than started here.
    adopted: bool,
    /// The snapshot its Start resumed.
    resume_from: Option<Snapshot>,
    /// The sandbox that persisted it (the Start's `resumes`).
    resumes: Option<SandboxId>,
    /// The snapshot its Persist keeps.
    persisting: Option<Snapshot>,
    /// The earliest instant the core can have given its way down up at, salvaging the
    /// snapshot: its last Persist's deadline (a timeout runs at it or later), or the failed
    /// answer that ended it. In a fleet the salvage's `WayDownFailed` waits for the record
    /// to name the snapshot, while the key's retention counts from the salvage.
    salvaged_from: Option<Instant>,
    /// The key was found keeping its salvaged snapshot before the salvage's `WayDownFailed`
    /// came (its retention ran out while the record was still to name it).
    salvage_kept: bool,
    /// Its hook outstanding: which, and its deadline.
    hook: Option<(HookPoint, Instant)>,
    /// Its after hook answered ok.
    hook_passed: bool,
    /// A before hook was ordered for it.
    before_hook: bool,
    /// A Drain was ordered for it.
    drained: bool,
    /// Stops ordered for it.
    stops: u8,
    /// Its Stop was answered ok while awaited.
    stop_ok: bool,
    /// The core was told it died (a death report, or an upload answered `gone` while its
    /// instance was not lost): a `WorkspaceLost` may name it.
    reported_dead: bool,
    /// The core was told its instance was lost while it was up: it goes down as a suspension.
    instance_lost: bool,
    /// Its last Stop asked for a suspension (the policy's, or a lost instance's).
    stop_suspend: bool,
}

/// What an answer found before the core took it (see [`Intent::before`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Before {
    /// Nothing to look at.
    Nothing,
    /// The state of the sandbox the answer is about.
    State(SandboxId, Option<SandboxState>),
    /// The token the core held the claimed key under.
    Token(Option<Token>),
}

/// One incarnation's intent checks. See the module docs.
#[derive(Debug)]
pub(super) struct Intent {
    release: ReleasePolicy,
    hooks: Hooks,
    sandboxes: BTreeMap<SandboxId, Sbx>,
    /// Per key, its sandbox stopping or persisting (its snapshot not in yet), until its
    /// Shutdown, Relinquish, suspension or the end of its failed way down.
    retiring: BTreeMap<Key, SandboxId>,
    /// Per key, the sandboxes started or adopted for it, oldest first (for record parity).
    pub(super) of_key: BTreeMap<Key, Vec<SandboxId>>,
    outputs: OutputChecker,
    /// Uploads in flight (`one-upload-per-path`, `no-upload-after-stop`,
    /// `uploaded-is-acknowledged`).
    uploads: UploadChecker,
    /// What each key keeps for its next start.
    pub(super) snapshots: Snapshots,
    /// Per owned key, the sandbox its next call adopts though it is not up here (for record
    /// parity): one left as it was after its way down failed with nothing salvaged, or the one
    /// a claim's record named while this process still tracked it (relinquished, its lost
    /// calls not released). Until the key's next Adopt or Start, or the key is no longer held.
    pub(super) left: BTreeMap<Key, SandboxId>,
    /// The sandbox whose instance the current input lost with its workspace intact (not while
    /// starting): none of the input's commands may abandon or shut it down.
    spared: Option<SandboxId>,
}

impl Intent {
    /// An empty record for a process running `config`.
    pub(super) fn new(config: &Config) -> Self {
        Intent {
            release: config.release,
            hooks: config.hooks,
            sandboxes: BTreeMap::new(),
            retiring: BTreeMap::new(),
            of_key: BTreeMap::new(),
            outputs: OutputChecker::new(),
            uploads: UploadChecker::new(),
            snapshots: Snapshots::new(config.release.tiers().retain),
            left: BTreeMap::new(),
            spared: None,
        }
    }

    /// What `input` is about, looked at in `core` before it takes it.
    pub(super) fn before(core: &Lifecycle, input: &Input) -> Before {
        match input {
            Input::StopOk { sandbox, .. }
            | Input::PersistOk { sandbox }
            | Input::PersistFailed { sandbox }
            | Input::HookOk { sandbox }
            | Input::HookFailed { sandbox } => {
                Before::State(*sandbox, core.sandbox_state(*sandbox))
            }
            Input::Claimed { key, .. } => Before::Token(core.key_token(key)),
            _ => Before::Nothing,
        }
    }

    /// `core` took `input` at `now` (its clock), having found `before`: what it accepted is
    /// fed to the checks, before the commands it caused.
    pub(super) fn answered(
        &mut self,
        core: &Lifecycle,
        input: &Input,
        before: Before,
        now: Instant,
    ) {
        match (input, before) {
            (
                Input::Claimed {
                    key, token, record, ..
                },
                Before::Token(was),
            ) => {
                let now_held = core.key_token(key);
                if now_held == Some(*token) && was != now_held {
                    // Adopted by this input's commands, or later (`command` clears it).
                    if let Some(x) = record.warm {
                        self.left.insert(key.clone(), x);
                    }
                    if let Some(s) = &record.snapshot {
                        let (snapshot, by) = (s.snapshot.clone(), s.by);
                        self.snapshots
                            .handed(key, snapshot, by, s.retain_until, now);
                    }
                }
            }
            (_, Before::State(x, was)) => {
                let Some(s) = self.sandboxes.get_mut(&x) else {
                    return;
                };
                match input {
                    // Taken: the sandbox moved on (shutting down, or kept suspended).
                    Input::PersistOk { .. }
                        if was == Some(SandboxState::Persisting)
                            && core.sandbox_state(x) != was =>
                    {
                        if let (Some((key, _)), Some(snapshot)) = (&s.key, s.persisting.clone()) {
                            self.snapshots.persisted(key, snapshot, x, now);
                        }
                        if s.stop_suspend {
                            // Kept suspended: its way down ended.
                            let key = s.key.as_ref().map(|(k, _)| k);
                            if let Some(key) = key.filter(|k| self.retiring.get(*k) == Some(&x)) {
                                self.retiring.remove(key);
                            }
                        }
                    }
                    Input::StopOk { .. }
                        if was == Some(SandboxState::Stopping) && core.sandbox_state(x) != was =>
                    {
                        s.stop_ok = true;
                    }
                    // Perhaps the last failure, salvaging the snapshot now (a Persist ordered
                    // again sets a later instant).
                    Input::PersistFailed { .. } if was == Some(SandboxState::Persisting) => {
                        s.salvaged_from = Some(now);
                    }
                    // Taken while awaited: by its deadline (the driver drops a later one), the
                    // sandbox still starting (an after hook) or stopping (a before hook), not
                    // dead, relinquished or shutting down.
                    Input::HookOk { .. } | Input::HookFailed { .. }
                        if matches!(was, Some(SandboxState::Starting | SandboxState::Stopping))
                            && s.hook.is_some_and(|(_, due)| now <= due) =>
                    {
                        if let Some((point, _)) = s.hook.take() {
                            if point.is_after() && matches!(input, Input::HookOk { .. }) {
                                s.hook_passed = true;
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The events of an input, before its commands are judged: a way down that failed with a
    /// snapshot salvaged leaves the key that snapshot (a superseded one's Discard comes among
    /// the commands); a resumed start that failed gives its key back the snapshot it took,
    /// persisted by the sandbox it continued.
    pub(super) fn events_first(&mut self, events: &[Event], now: Instant) {
        for ev in events {
            if let Event::WayDownFailed {
                sandbox,
                key,
                kept: Some(snapshot),
            } = ev
            {
                let given_back = self
                    .sandboxes
                    .get(sandbox)
                    .filter(|s| s.resume_from.as_ref() == Some(snapshot))
                    .and_then(|s| s.resumes);
                let by = given_back.unwrap_or(*sandbox);
                let salvaged = self.sandboxes.get(sandbox);
                // Kept, and perhaps let go, already (`salvaged_early`).
                if !salvaged.is_some_and(|s| s.salvage_kept) {
                    let since = salvaged.and_then(|s| s.salvaged_from);
                    let since = since.map_or(now, |at| at.min(now));
                    self.snapshots.persisted(key, snapshot.clone(), by, since);
                }
            }
            if let Event::WayDownFailed {
                sandbox,
                key,
                kept: None,
            } = ev
            {
                self.left.insert(key.clone(), *sandbox);
            }
            if let Event::WayDownFailed { sandbox, .. } = ev {
                if let Some(s) = self.sandboxes.get_mut(sandbox) {
                    s.lane.leave_as_is();
                }
                self.lets_go(*sandbox);
            }
        }
    }

    /// A Discard of `snapshot` of `key` that the key does not keep here, which a sandbox of the
    /// key was persisting when its way down was given up: in a fleet the key keeps the
    /// salvaged snapshot from then on, though its `WayDownFailed` waits for a record naming it
    /// (and the key's retention may end first). Kept from the earliest instant the salvage
    /// can have come at, before the Discard is judged.
    fn salvaged_early(&mut self, key: &Key, snapshot: &Snapshot) {
        if self.snapshots.kept(key).is_some_and(|(s, _)| s == snapshot) {
            return;
        }
        let salvaged = self.sandboxes.iter_mut().find(|(_, s)| {
            s.persisting.as_ref() == Some(snapshot)
                && s.key.as_ref().is_some_and(|(k, _)| k == key)
                && !s.salvage_kept
        });
        let Some((x, s)) = salvaged else {
            return;
        };
        let Some(since) = s.salvaged_from else {
            return;
        };
        s.salvage_kept = true;
        self.snapshots.persisted(key, snapshot.clone(), *x, since);
    }

    /// One command, ordered at `now`.
    pub(super) fn command(&mut self, cmd: &Command, now: Instant) -> Result<(), Violation> {
        let x = cmd.sandbox();
        if let Command::Adopt { .. } = cmd {
            // Taken over (perhaps again): a new lane here.
            self.sandboxes.remove(&x);
        }
        if let Command::Adopt { key, .. } | Command::Start { key, .. } = cmd {
            self.left.remove(key);
        }
        let lane = self.sandboxes.get(&x).map(|s| s.lane);
        let mut verdict = self.outputs.command(cmd, lane.as_ref());
        let mut also = |r: Result<(), Violation>| {
            if verdict.is_ok() {
                verdict = r;
            }
        };
        also(self.uploads.command(cmd));
        if self.spared == Some(x)
            && matches!(cmd, Command::Abandon { .. } | Command::Shutdown { .. })
        {
            also(Err(Violation::new(
                "suspension-keeps-workspace",
                format!(
                    "{}: the loss of {x}'s instance, its workspace intact, is not a death",
                    cmd.name()
                ),
            )));
        }
        if let Some((x, op)) = Op::of(cmd) {
            let s = self.sandboxes.entry(x).or_default();
            also(s.lane.take(x, op));
        }
        match cmd {
            Command::Start {
                sandbox,
                key,
                resume_from,
                resumes,
                token,
                ..
            } => {
                if let Some(old) = self.retiring.get(key) {
                    also(Err(Violation::new(
                        "start-after-persist",
                        format!("Start {sandbox} for key {key} while its previous sandbox {old} still stops or persists"),
                    )));
                }
                let expected = self.snapshots.kept(key).map(|(s, by)| (s.clone(), by));
                if resume_from.as_ref() != expected.as_ref().map(|(s, _)| s)
                    || *resumes != expected.as_ref().map(|(_, by)| *by)
                {
                    also(Err(Violation::new(
                        "resume-latest-snapshot",
                        format!("Start {sandbox} for key {key} resumes {resume_from:?} (continuing {resumes:?}), the key keeps {expected:?}"),
                    )));
                }
                also(self.snapshots.command(cmd, now));
                let s = self.sandboxes.entry(*sandbox).or_default();
                s.key = Some((key.clone(), *token));
                s.resume_from = resume_from.clone();
                s.resumes = *resumes;
                self.of_key.entry(key.clone()).or_default().push(*sandbox);
            }
            Command::Adopt {
                sandbox,
                key,
                token,
                ..
            } => {
                let s = self.sandboxes.entry(*sandbox).or_default();
                s.key = Some((key.clone(), Some(*token)));
                s.adopted = true;
                let of_key = self.of_key.entry(key.clone()).or_default();
                of_key.retain(|y| y != sandbox);
                of_key.push(*sandbox);
            }
            Command::Discard {
                key,
                snapshot,
                reason,
                ..
            } => {
                if *reason != sandkeeper::DiscardReason::Taken {
                    self.salvaged_early(key, snapshot);
                }
                also(self.snapshots.command(cmd, now));
            }
            Command::Persist {
                snapshot, deadline, ..
            } => {
                if let Some(s) = self.sandboxes.get_mut(&x) {
                    s.persisting = snapshot.clone();
                    s.salvaged_from = Some(*deadline);
                    if !s.stop_ok {
                        also(Err(Violation::new(
                            "persist-after-stop",
                            format!("Persist for {x} before its Stop succeeded"),
                        )));
                    }
                }
            }
            Command::Drain { .. } => self.sandboxes.entry(x).or_default().drained = true,
            Command::Shutdown { .. } | Command::Relinquish { .. } => self.lets_go(x),
            Command::Hook { hook, deadline, .. } => {
                let s = self.sandboxes.entry(x).or_default();
                if hook.is_after() && s.adopted {
                    also(Err(Violation::new(
                        "hook-not-again",
                        format!(
                            "{} hook for {x}, which this process adopted: its first owner ran it",
                            hook.as_str()
                        ),
                    )));
                }
                s.hook = Some((*hook, *deadline));
                if !hook.is_after() {
                    s.before_hook = true;
                }
            }
            Command::Stop { suspend, .. } => {
                // A Stop that suspends had the before-suspend hook, the policy's or not (a key
                // handed over to another host goes suspended whatever the policy).
                let wanted = if self.release.suspends() || *suspend {
                    self.hooks.before_suspend
                } else {
                    self.hooks.before_stop
                };
                let s = self.sandboxes.entry(x).or_default();
                if s.instance_lost && !suspend {
                    also(Err(Violation::new(
                        "instance-loss-suspends",
                        format!("Stop for {x}, whose instance was lost with its workspace intact, does not suspend it"),
                    )));
                }
                // A Stop ordered again after a failed one needs no new Drain; a lost instance
                // goes down with none (nothing runs in it to finish).
                if !s.drained && !s.before_hook && s.stops == 0 && !s.instance_lost {
                    also(Err(Violation::new(
                        "drain-before-stop",
                        format!("Stop for {x} without a Drain first"),
                    )));
                }
                s.stops = s.stops.saturating_add(1);
                s.stop_suspend = *suspend;
                if let Some((key, _)) = &s.key {
                    self.retiring.insert(key.clone(), x);
                }
                let s = self.sandboxes.entry(x).or_default();
                if let Some((point, due)) = s.hook.take() {
                    if now < due {
                        also(Err(Violation::new(
                            "hook-before-stop",
                            format!(
                                "Stop for {x} at {now:?} while its {} hook runs (until {due:?})",
                                point.as_str()
                            ),
                        )));
                    }
                }
                if wanted.is_some() && !s.before_hook && !s.instance_lost {
                    also(Err(Violation::new(
                        "hook-before-stop",
                        format!("Stop for {x} without its before hook"),
                    )));
                }
            }
            _ => {}
        }
        verdict
    }

    /// An upload's answer reaches the core (`taken`), or its driver dropped it past its
    /// deadline: it is no longer awaited here either way (a dropped one, awaited by the core
    /// until its upload timeout, is let go leniently).
    /// The upload it ends, if it was awaited here.
    pub(super) fn upload_answered(&mut self, input: &Input, taken: bool) -> Option<Flight> {
        match input {
            Input::UploadOk { upload } => self.uploads.answered(*upload, taken),
            Input::UploadFailed { upload, .. } => self.uploads.answered(*upload, false),
            _ => None,
        }
    }

    /// The core is about to be told that `x`, in `state`, died (`dead`) or lost its running
    /// instance with its workspace intact, as the one-process history judges it: a death lets
    /// a `WorkspaceLost` name it; a lost instance spares it in this input (not while starting:
    /// its start failed), and while it was up (running, idle or draining) it must go down
    /// as a suspension. Whether the core takes it as an instance lost while up (its calls lost,
    /// its workspace kept). A second report changes nothing.
    pub(super) fn told_lost(
        &mut self,
        x: SandboxId,
        dead: bool,
        state: Option<SandboxState>,
    ) -> bool {
        let Some(s) = self.sandboxes.get_mut(&x) else {
            return false;
        };
        if dead {
            s.lane.die();
            s.reported_dead = true;
            self.lets_go(x);
            return false;
        }
        if s.instance_lost || matches!(state, None | Some(SandboxState::Dead)) {
            return false;
        }
        if state != Some(SandboxState::Starting) {
            self.spared = Some(x);
        }
        let up = matches!(
            state,
            Some(SandboxState::Running | SandboxState::Idle | SandboxState::Draining)
        );
        s.instance_lost = up;
        up
    }

    /// An upload into `x` was answered `gone`: the core takes it as `x`'s death unless its
    /// instance was lost (it keeps its workspace then).
    pub(super) fn upload_gone(&mut self, x: SandboxId) {
        if let Some(s) = self.sandboxes.get_mut(&x) {
            if !s.instance_lost {
                s.reported_dead = true;
            }
        }
    }

    /// The uploads in flight.
    pub(super) fn uploads(&self) -> &UploadChecker {
        &self.uploads
    }

    /// `x`'s lane here, if this process ordered anything for it.
    pub(super) fn lane(&self, x: SandboxId) -> Option<Lane> {
        self.sandboxes.get(&x).map(|s| s.lane)
    }

    /// One event.
    pub(super) fn event(&mut self, ev: &Event) -> Result<(), Violation> {
        self.outputs.event(ev)?;
        match ev {
            Event::Settled {
                session,
                path,
                version,
                outcome,
            } => self.uploads.settled(session, path, version.0, outcome)?,
            Event::Closed { .. } => self.uploads.closed(),
            Event::WorkspaceLost { sandbox, key } => {
                let reported = self.sandboxes.get(sandbox).is_some_and(|s| {
                    s.reported_dead && s.key.as_ref().is_some_and(|(k, _)| k == key)
                });
                if !reported {
                    return Err(Violation::new(
                        "workspace-lost-reported",
                        format!("WorkspaceLost for {sandbox} of key {key}, which was not reported dead here (or is of another key)"),
                    ));
                }
            }
            _ => {}
        }
        if let Event::CallReady { call, sandbox } = ev {
            if let Some(s) = self.sandboxes.get(sandbox) {
                let wanted = if s.resume_from.is_some() {
                    self.hooks.after_resume
                } else {
                    self.hooks.after_start
                };
                let hooked = s.adopted || s.hook_passed || wanted.is_none();
                if s.lane.is_started() && !hooked {
                    return Err(Violation::new(
                        "hook-before-bind",
                        format!("{call} ready on {sandbox}, whose after hook has not succeeded"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// An input ended: the stream's shape, then what the keys keep, judged at `timers_at`, when
    /// the core's timers last ran (a retention ends at its timer). A key `core` no longer holds
    /// keeps nothing here.
    pub(super) fn input_done(
        &mut self,
        core: &Lifecycle,
        timers_at: Instant,
    ) -> Result<(), Violation> {
        self.outputs.input_done()?;
        self.spared = None;
        let gone: Vec<Key> = self
            .snapshots
            .keys()
            .filter(|k| core.key_token(k).is_none())
            .cloned()
            .collect();
        for key in gone {
            self.snapshots.let_go(&key);
        }
        if !self.left.is_empty() {
            self.left.retain(|k, _| core.key_token(k).is_some());
        }
        // What the core forgot is no key's any more (kept short for `record-parity`).
        for of_key in self.of_key.values_mut() {
            if of_key.len() > 2 {
                of_key.retain(|x| core.sandbox_state(*x).is_some());
            }
        }
        self.snapshots.input_done(timers_at, core.is_closed())
    }

    /// `x`'s way down ended (shut down, relinquished, suspended, left as it was): its key no
    /// longer waits for it.
    fn lets_go(&mut self, x: SandboxId) {
        if let Some((key, _)) = self.sandboxes.get(&x).and_then(|s| s.key.as_ref()) {
            if self.retiring.get(key) == Some(&x) {
                self.retiring.remove(key);
            }
        }
    }

    /// The token `x` was started or adopted under, and its key.
    pub(super) fn key_of(&self, x: SandboxId) -> Option<&(Key, Option<Token>)> {
        self.sandboxes.get(&x).and_then(|s| s.key.as_ref())
    }
}
