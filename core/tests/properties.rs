//! Property tests over random input sequences, valid and invalid: no panic; the state invariants
//! and the history invariants (docs/design.md) hold after every step; every flushed version settles
//! exactly once; a rejected input changes nothing; after a final close and its answers nothing is
//! left running and no timer is set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use sandkeeper::*;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        call: u8,
        session: u8,
        user: u8,
        external: Option<u8>,
    },
    Release {
        call: u8,
    },
    Flush {
        session: u8,
        path: u8,
    },
    Hold {
        session: u8,
    },
    Unhold {
        session: u8,
    },
    Resolve {
        session: u8,
    },
    Answer {
        pick: u8,
        ok: bool,
        snapshot: bool,
    },
    AnswerStale {
        pick: u8,
    },
    UploadGone {
        pick: u8,
    },
    Die {
        pick: u8,
    },
    Advance {
        ms: u16,
    },
    Close {
        deadline_ms: u16,
    },
    Nonsense {
        kind: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, 0..3u8, 0..2u8, prop::option::weighted(0.1, 0..2u8)).prop_map(
            |(call, session, user, external)| Op::Acquire { call, session, user, external }
        ),
        3 => (0..6u8).prop_map(|call| Op::Release { call }),
        4 => (0..3u8, 0..2u8).prop_map(|(session, path)| Op::Flush { session, path }),
        1 => (0..3u8).prop_map(|session| Op::Hold { session }),
        1 => (0..3u8).prop_map(|session| Op::Unhold { session }),
        1 => (0..3u8).prop_map(|session| Op::Resolve { session }),
        8 => (any::<u8>(), prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(pick, ok, snapshot)| Op::Answer { pick, ok, snapshot }),
        1 => any::<u8>().prop_map(|pick| Op::AnswerStale { pick }),
        1 => any::<u8>().prop_map(|pick| Op::UploadGone { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Die { pick }),
        3 => (0..4000u16).prop_map(|ms| Op::Advance { ms }),
        1 => (0..3000u16).prop_map(|deadline_ms| Op::Close { deadline_ms }),
        1 => (0..6u8).prop_map(|kind| Op::Nonsense { kind }),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (0..5u8, any::<bool>(), 0..3u8, 1..3u32, 0..3u32).prop_map(
        |(scope, serialize, release, waiters, retries)| Config {
            scope: [
                Scope::Call,
                Scope::Session,
                Scope::User,
                Scope::Agent,
                Scope::Global,
            ][scope as usize],
            same_key: if serialize {
                SameKey::Serialize
            } else {
                SameKey::Share
            },
            release: [
                ReleasePolicy::Shutdown,
                ReleasePolicy::KeepWarm {
                    idle: Duration::from_millis(1500),
                },
                ReleasePolicy::Suspend,
            ][release as usize],
            start_timeout: Duration::from_millis(3000),
            upload_timeout: Duration::from_millis(2000),
            upload_retries: retries,
            retry_backoff: Duration::from_millis(100),
            drain_deadline: Duration::from_millis(2500),
            wait_timeout: Duration::from_millis(3500),
            max_waiters: waiters as usize,
            command_timeout: Duration::from_millis(5000),
            close_grace: Duration::from_millis(4000),
            hooks: Hooks::default(),
            fleet: None,
            limits: Limits {
                max_paths_per_session: 2,
                max_holds_per_session: 2,
                remembered_ended_calls: 4,
                ..Limits::default()
            },
        },
    )
}

fn call(i: u8) -> CallId {
    CallId::new(format!("c{i}")).unwrap()
}
fn session(i: u8) -> SessionId {
    SessionId::new(format!("s{i}")).unwrap()
}
fn path(i: u8) -> PathName {
    PathName::new(format!("p{i}")).unwrap()
}

/// What the test has seen: the history the invariants are about.
#[derive(Default)]
struct World {
    now: u64,
    /// Commands ordered and not answered yet (answer-wanting kinds only).
    outstanding: Vec<Command>,
    /// Commands already answered, for stale re-answers.
    answered: Vec<Command>,
    started: BTreeSet<SandboxId>,
    externals: BTreeSet<SandboxId>,
    shutdowns: BTreeMap<SandboxId, u32>,
    stopped: BTreeSet<SandboxId>,
    stop_acked: BTreeSet<SandboxId>,
    dead: BTreeSet<SandboxId>,
    /// Suspended, or left as they were after their way down failed: never shut down.
    suspended: BTreeSet<SandboxId>,
    /// Sessions ever bound to each sandbox (through a ready call).
    bound_sessions: BTreeMap<SandboxId, BTreeSet<SessionId>>,
    call_session: BTreeMap<CallId, SessionId>,
    /// Live calls as the events tell, with their sandbox once ready.
    live: BTreeMap<CallId, Option<SandboxId>>,
    unsettled: BTreeSet<(SessionId, PathName, Version)>,
    settled: BTreeSet<(SessionId, PathName, Version)>,
    last_uploaded: BTreeMap<(SessionId, PathName), Version>,
    closed: bool,
    suspend_policy: bool,
}

impl World {
    fn t(&self) -> Instant {
        Instant::from_millis(self.now)
    }

    /// Drains the core and checks every history invariant on what comes out.
    fn drain(&mut self, core: &mut Lifecycle) -> Result<(), TestCaseError> {
        let commands: Vec<Command> = std::iter::from_fn(|| core.poll_command()).collect();
        let events: Vec<Event> = std::iter::from_fn(|| core.poll_event()).collect();
        // Bindings made by this input count for its commands (a CallReady and the Upload it
        // released come out of the same input).
        for event in &events {
            if let Event::CallReady { call, sandbox } = event {
                let s = self.call_session[call].clone();
                self.bound_sessions.entry(*sandbox).or_default().insert(s);
            }
        }
        for cmd in commands {
            prop_assert!(!self.closed, "command after Closed: {cmd:?}");
            let x = cmd.sandbox();
            // A Discard names the sandbox that persisted a snapshot, shut down or not.
            prop_assert!(
                !self.shutdowns.contains_key(&x) || matches!(cmd, Command::Discard { .. }),
                "invariant 1: command after Shutdown of {x}: {cmd:?}"
            );
            match &cmd {
                Command::Start { sandbox, .. } => {
                    prop_assert!(self.started.insert(*sandbox), "two Starts for {sandbox}");
                }
                Command::Upload {
                    sandbox,
                    session,
                    path,
                    version,
                    ..
                } => {
                    prop_assert!(
                        !self.stopped.contains(sandbox) && !self.dead.contains(sandbox),
                        "invariant 1: Upload into {sandbox} after its Stop or death"
                    );
                    prop_assert!(
                        self.bound_sessions
                            .get(sandbox)
                            .is_some_and(|s| s.contains(session)),
                        "invariant 2: Upload for {session} into {sandbox}, never bound to it"
                    );
                    prop_assert!(
                        self.unsettled
                            .contains(&(session.clone(), path.clone(), *version)),
                        "Upload of a version that is not unsettled"
                    );
                }
                Command::Abandon { sandbox } => {
                    prop_assert!(
                        self.started.contains(sandbox),
                        "Abandon of a never started sandbox"
                    );
                }
                Command::Hook { .. } => prop_assert!(false, "a hook without hooks configured"),
                Command::Discard { sandbox, .. } => {
                    prop_assert!(
                        self.started.contains(sandbox),
                        "Discard of a snapshot no started sandbox persisted"
                    );
                }
                Command::Stop { sandbox, .. } => {
                    prop_assert!(!self.externals.contains(sandbox), "external stopped");
                    self.stopped.insert(*sandbox);
                }
                Command::Persist { sandbox, .. } => {
                    prop_assert!(
                        self.stop_acked.contains(sandbox),
                        "R12: Persist of {sandbox} before its Stop was acknowledged"
                    );
                }
                Command::Shutdown { sandbox, .. } => {
                    prop_assert!(
                        !self.externals.contains(sandbox),
                        "invariant 3: external shut down"
                    );
                    prop_assert!(
                        self.started.contains(sandbox),
                        "Shutdown of a never started sandbox"
                    );
                    *self.shutdowns.entry(*sandbox).or_default() += 1;
                    // A Shutdown supersedes any answer still outstanding for the sandbox.
                    self.outstanding.retain(|c| {
                        c.sandbox() != *sandbox || matches!(c, Command::Shutdown { .. })
                    });
                }
                Command::CancelUpload { upload, .. } => {
                    self.outstanding
                        .retain(|c| !matches!(c, Command::Upload { upload: u, .. } if u == upload));
                }
                Command::Drain { .. } => {}
                Command::Adopt { .. } | Command::Relinquish { .. } => {
                    prop_assert!(false, "fleet work without a fleet configured: {cmd:?}")
                }
            }
            if !matches!(
                cmd,
                Command::Drain { .. }
                    | Command::CancelUpload { .. }
                    | Command::Discard { .. }
                    | Command::Abandon { .. }
            ) {
                self.outstanding.push(cmd);
            }
        }
        for event in events {
            match event {
                Event::CallReady { call, sandbox } => {
                    prop_assert!(self.live.contains_key(&call), "ready for a call not live");
                    self.live.insert(call, Some(sandbox));
                }
                Event::CallFailed { call, .. } | Event::CallRevoked { call } => {
                    prop_assert!(self.live.remove(&call).is_some(), "{call} ended twice");
                }
                Event::Settled {
                    session,
                    path,
                    version,
                    outcome,
                } => {
                    let key = (session.clone(), path.clone(), version);
                    prop_assert!(
                        self.unsettled.remove(&key),
                        "invariant 6: {key:?} settled twice or never flushed"
                    );
                    self.settled.insert(key);
                    if let Settlement::Uploaded { .. } = outcome {
                        let last = self
                            .last_uploaded
                            .insert((session.clone(), path.clone()), version);
                        prop_assert!(
                            last.is_none_or(|l| l < version),
                            "invariant 5: uploaded versions of {session}/{path} do not increase"
                        );
                    }
                }
                Event::Closed { .. } => self.closed = true,
                Event::CallReleased { .. }
                | Event::SandboxLost { .. }
                | Event::MirrorSettled { .. }
                | Event::HookFailed { .. }
                | Event::ShutdownUnconfirmed { .. }
                | Event::WorkspaceLost { .. } => {}
                // Left to the backend as it was (its key's history): never shut down.
                Event::WayDownFailed { sandbox, .. } => {
                    self.suspended.insert(sandbox);
                }
                Event::KeyFenced { .. } => prop_assert!(false, "no fleet here: {event:?}"),
            }
        }
        if let Err(v) = core.check_invariants() {
            return Err(TestCaseError::fail(v.to_string()));
        }
        Ok(())
    }

    fn answer(
        &mut self,
        core: &mut Lifecycle,
        cmd: &Command,
        ok: bool,
        snapshot: bool,
    ) -> Result<(), Error> {
        let t = self.t();
        match cmd {
            Command::Start { sandbox, .. } if ok => core.handle_start_ok(t, *sandbox),
            Command::Start { sandbox, .. } => core.handle_start_failed(t, *sandbox),
            Command::Upload { upload, .. } if ok => core.handle_upload_ok(t, *upload),
            Command::Upload { upload, .. } => {
                core.handle_upload_failed(t, *upload, UploadFailure::Transient)
            }
            Command::Stop { sandbox, .. } if ok => {
                self.stop_acked.insert(*sandbox);
                core.handle_stop_ok(
                    t,
                    *sandbox,
                    snapshot.then(|| Snapshot::new(format!("snap-{sandbox}"))),
                )
            }
            Command::Stop { sandbox, .. } => core.handle_stop_failed(t, *sandbox),
            Command::Persist { sandbox, .. } if ok => {
                if self.suspend_policy
                    && core.sandbox_state(*sandbox) == Some(SandboxState::Persisting)
                {
                    self.suspended.insert(*sandbox);
                }
                core.handle_persist_ok(t, *sandbox)
            }
            Command::Persist { sandbox, .. } => core.handle_persist_failed(t, *sandbox),
            Command::Shutdown { sandbox, .. } if ok => core.handle_shutdown_ok(t, *sandbox),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_failed(t, *sandbox),
            Command::Hook { sandbox, .. } if ok => core.handle_hook_ok(t, *sandbox),
            Command::Hook { sandbox, .. } => core.handle_hook_failed(t, *sandbox),
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Abandon { .. } => Ok(()),
            Command::Adopt { .. } | Command::Relinquish { .. } => {
                unreachable!("no fleet configured: {cmd:?}")
            }
        }
    }
}

fn run(config: Config, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let suspend_policy = config.release == ReleasePolicy::Suspend;
    let mut core = Lifecycle::new(config).unwrap();
    let mut w = World {
        suspend_policy,
        ..World::default()
    };
    for op in ops {
        if w.closed {
            // Invariant 9 is checked below, on every kind of input.
            break;
        }
        let before = serde_json::to_string(&core).unwrap();
        let t = w.t();
        let result: Result<(), Error> = match op {
            Op::Acquire {
                call: c,
                session: s,
                user,
                external,
            } => {
                let mut spec = CallSpec::new(call(c), session(s))
                    .with_user(UserId::new(format!("u{user}")).unwrap());
                if let Some(e) = external {
                    spec = spec.with_external(ExternalId::new(format!("ext{e}")).unwrap());
                }
                let r = core.acquire(t, spec);
                if r.is_ok() {
                    w.call_session.insert(call(c), session(s));
                    w.live.insert(call(c), None);
                    if external.is_some() {
                        // Bound at once: the CallReady names the external sandbox.
                        if let Some(CallStatus::Ready(x)) = core.call_status(&call(c)) {
                            w.externals.insert(x);
                        }
                    }
                }
                r
            }
            Op::Release { call: c } => {
                let r = core.release(t, &call(c));
                if r.is_ok() {
                    w.live.remove(&call(c));
                }
                r
            }
            Op::Flush {
                session: s,
                path: p,
            } => {
                let r = core.flush(t, &session(s), &path(p), Payload::new(vec![s, p]));
                if let Ok(v) = r {
                    w.unsettled.insert((session(s), path(p), v));
                }
                r.map(|_| ())
            }
            Op::Hold { session: s } => core.hold(t, &session(s)),
            Op::Unhold { session: s } => core.unhold(t, &session(s)),
            Op::Resolve { session: s } => {
                let r = core.resolve(&session(s));
                if let Ok(x) = r {
                    // Invariant 4: the sandbox of a live, ready call of that session.
                    let ok = w
                        .live
                        .iter()
                        .any(|(c, bound)| *bound == Some(x) && w.call_session[c] == session(s));
                    prop_assert!(
                        ok,
                        "invariant 4: resolve(s{s}) gave {x}, not a live call's of s{s}"
                    );
                    prop_assert!(!w.dead.contains(&x), "resolve gave dead {x}");
                }
                r.map(|_| ())
            }
            Op::Answer { pick, ok, snapshot } => {
                if w.outstanding.is_empty() {
                    Ok(())
                } else {
                    let cmd = w.outstanding.remove(pick as usize % w.outstanding.len());
                    let r = w.answer(&mut core, &cmd, ok, snapshot);
                    w.answered.push(cmd);
                    r
                }
            }
            Op::AnswerStale { pick } => {
                if w.answered.is_empty() {
                    Ok(())
                } else {
                    let cmd = w.answered[pick as usize % w.answered.len()].clone();
                    // A Stop or Persist ordered again after a failure is awaited under the
                    // same sandbox: an answer given twice to the first would answer the
                    // second (a driver answers each command once; only the model repeats).
                    let again = w.outstanding.iter().any(|o| {
                        o.sandbox() == cmd.sandbox()
                            && std::mem::discriminant(o) == std::mem::discriminant(&cmd)
                    });
                    if again {
                        Ok(())
                    } else {
                        let before_stale = core.stats().stale_answers;
                        let r = w.answer(&mut core, &cmd, true, false);
                        if r.is_ok() {
                            prop_assert_eq!(core.stats().stale_answers, before_stale + 1);
                        }
                        r
                    }
                }
            }
            Op::UploadGone { pick } => {
                let uploads: Vec<usize> = (0..w.outstanding.len())
                    .filter(|i| matches!(w.outstanding[*i], Command::Upload { .. }))
                    .collect();
                if uploads.is_empty() {
                    Ok(())
                } else {
                    let cmd = w.outstanding.remove(uploads[pick as usize % uploads.len()]);
                    let Command::Upload {
                        upload, sandbox, ..
                    } = cmd
                    else {
                        unreachable!()
                    };
                    let r = core.handle_upload_failed(t, upload, UploadFailure::Gone);
                    if r.is_ok() {
                        w.dead.insert(sandbox);
                    }
                    r
                }
            }
            Op::Die { pick } => {
                let n = core.stats().starts_ordered + w.externals.len() as u64 + 1;
                let x = SandboxId(pick as u64 % n);
                let tracked = core.sandbox_state(x).is_some();
                let r = core.handle_died(t, x);
                if r.is_ok() && tracked {
                    w.dead.insert(x);
                }
                r
            }
            Op::Advance { ms } => {
                w.now += ms as u64;
                core.handle_timeout(w.t())
            }
            Op::Close { deadline_ms } => core.close(t, Duration::from_millis(deadline_ms as u64)),
            Op::Nonsense { kind } => match kind {
                0 => core.release(t, &CallId::new("never").unwrap()),
                1 => core.handle_died(t, SandboxId(1_000_000)),
                2 => core.handle_upload_ok(t, UploadId(1_000_000)),
                3 => core.handle_start_ok(t, SandboxId(1_000_000)),
                4 => core.unhold(t, &session(9)),
                _ => core.resolve(&session(9)).map(|_| ()),
            },
        };
        if let Err(e) = &result {
            let after = serde_json::to_string(&core).unwrap();
            prop_assert!(before == after, "rejected input ({e}) changed the state");
            prop_assert!(core.poll_command().is_none() && core.poll_event().is_none());
        }
        w.drain(&mut core)?;
    }

    // Final close: answer everything, let time run, until Closed.
    if !core.is_closing() {
        core.close(w.t(), Duration::from_millis(1000)).unwrap();
        w.drain(&mut core)?;
    }
    let mut rounds = 0;
    while !w.closed {
        rounds += 1;
        prop_assert!(rounds < 1000, "close does not complete");
        if let Some(cmd) = w.outstanding.pop() {
            w.answer(&mut core, &cmd, true, false).unwrap();
        } else if let Some(at) = core.poll_timeout() {
            w.now = w.now.max(at.as_nanos() / 1_000_000 + 1);
            core.handle_timeout(w.t()).unwrap();
        } else {
            prop_assert!(false, "not closed, nothing outstanding and no timer");
        }
        w.drain(&mut core)?;
    }
    prop_assert!(core.is_closed());
    prop_assert!(core.poll_timeout().is_none(), "a timer is set after Closed");
    prop_assert!(
        w.unsettled.is_empty(),
        "unsettled after close: {:?}",
        w.unsettled
    );
    prop_assert!(w.live.is_empty(), "calls live after close: {:?}", w.live);
    for x in &w.started {
        let n = w.shutdowns.get(x).copied().unwrap_or(0);
        if w.suspended.contains(x) {
            prop_assert!(n == 0, "suspended {x} shut down");
        } else {
            prop_assert!(n == 1, "invariant 3: {x} started and shut down {n} times");
        }
    }
    // Invariant 9: after Closed every input is refused and no command comes.
    let t = w.t();
    let refused = [
        core.acquire(t, CallSpec::new(call(0), session(0))),
        core.release(t, &call(0)),
        core.flush(t, &session(0), &path(0), Payload::default())
            .map(|_| ()),
        core.hold(t, &session(0)),
        core.resolve(&session(0)).map(|_| ()),
        core.close(t, Duration::ZERO),
        core.handle_timeout(t),
        core.handle_start_ok(t, SandboxId(0)),
        core.handle_upload_ok(t, UploadId(0)),
        core.handle_shutdown_ok(t, SandboxId(0)),
        core.handle_died(t, SandboxId(0)),
    ];
    for r in refused {
        prop_assert!(
            matches!(r, Err(Error::Closed { .. })),
            "input after Closed answered {:?}",
            r
        );
    }
    prop_assert!(core.poll_command().is_none());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, max_shrink_iters: 4000, .. ProptestConfig::default() })]

    #[test]
    fn random_inputs_keep_every_invariant(config in config(), ops in prop::collection::vec(op(), 1..120)) {
        run(config, ops)?;
    }
}
