//! A reference-model property: the client-visible history (ready and failed calls, releases,
//! lost sandboxes, resolve answers, flush versions and settlements, revocations) matches a simple
//! sequential model of the spec.
//!
//! The model covers scopes `Session` and `Call` under `Share` and the `Shutdown` policy, with a
//! backend that answers every command at once (starts fail when the step says so): there, the
//! spec reduces to a few maps, written here from docs/design.md without looking at the core.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use sandkeeper::*;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        call: u8,
        session: u8,
        start_ok: bool,
    },
    Release {
        call: u8,
    },
    Flush {
        session: u8,
    },
    Resolve {
        session: u8,
    },
    Die {
        call: u8,
    },
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..5u8, 0..3u8, prop::bool::weighted(0.85))
            .prop_map(|(call, session, start_ok)| Op::Acquire { call, session, start_ok }),
        4 => (0..5u8).prop_map(|call| Op::Release { call }),
        4 => (0..3u8).prop_map(|session| Op::Flush { session }),
        3 => (0..3u8).prop_map(|session| Op::Resolve { session }),
        1 => (0..5u8).prop_map(|call| Op::Die { call }),
        1 => Just(Op::Close),
    ]
}

fn call(i: u8) -> CallId {
    CallId::new(format!("c{i}")).unwrap()
}
fn session(i: u8) -> SessionId {
    SessionId::new(format!("s{i}")).unwrap()
}

/// What the client sees of one step, order-free within the step.
type Seen = BTreeSet<String>;

fn seen_event(e: &Event) -> Option<String> {
    Some(match e {
        Event::CallReady { call, sandbox } => format!("ready {call} {sandbox}"),
        Event::CallFailed { call, error } => format!("failed {call} {error}"),
        Event::CallReleased { call } => format!("released {call}"),
        Event::CallRevoked { call } => format!("revoked {call}"),
        Event::SandboxLost { call, sandbox } => format!("lost {call} {sandbox}"),
        Event::Settled {
            session,
            version,
            outcome,
            ..
        } => match outcome {
            Settlement::Uploaded { sandbox } => format!("uploaded {session} {version} {sandbox}"),
            Settlement::Superseded { by } => format!("superseded {session} {version} {by}"),
            Settlement::Dropped { reason } => format!("dropped {session} {version} {reason}"),
        },
        Event::MirrorSettled { session } => format!("mirror-settled {session}"),
        Event::Closed { report } => format!("closed revoked={:?}", report.revoked_calls),
        Event::KeyFenced { key, .. } => format!("fenced {key}"),
        Event::ShutdownUnconfirmed { .. }
        | Event::HookFailed { .. }
        | Event::WayDownFailed { .. }
        | Event::WorkspaceLost { .. } => return None,
    })
}

/// The sequential model.
#[derive(Default)]
struct Model {
    per_call_scope: bool,
    next_sandbox: u64,
    /// Live calls: session and sandbox (every live call is bound: starts answer at once).
    calls: BTreeMap<CallId, (SessionId, u64)>,
    /// Per session, its live calls in the order they became ready.
    ready: BTreeMap<SessionId, Vec<CallId>>,
    alive: BTreeSet<u64>,
    /// The alive sandbox serving each key, with its calls.
    current: BTreeMap<String, u64>,
    bound: BTreeMap<u64, BTreeSet<CallId>>,
    versions: BTreeMap<SessionId, u64>,
    ended: BTreeSet<CallId>,
    closed: bool,
}

impl Model {
    fn key(&self, c: &CallId, s: &SessionId) -> String {
        if self.per_call_scope {
            format!("call:{c}")
        } else {
            format!("session:{s}")
        }
    }

    fn target(&self, s: &SessionId) -> Result<u64, ErrorKind> {
        let ready = self.ready.get(s).map(Vec::as_slice).unwrap_or(&[]);
        for c in ready {
            let x = self.calls[c].1;
            if self.alive.contains(&x) {
                return Ok(x);
            }
        }
        if ready.is_empty() {
            Err(ErrorKind::NoActiveSandbox)
        } else {
            Err(ErrorKind::SandboxGone)
        }
    }

    fn acquire(
        &mut self,
        c: CallId,
        s: SessionId,
        start_ok: bool,
        seen: &mut Seen,
    ) -> Result<(), ErrorKind> {
        if self.closed {
            return Err(ErrorKind::Closed);
        }
        if self.calls.contains_key(&c) {
            return Err(ErrorKind::DuplicateCall);
        }
        self.ended.remove(&c);
        let key = self.key(&c, &s);
        let x = match self.current.get(&key) {
            Some(x) => *x,
            None => {
                let x = self.next_sandbox;
                self.next_sandbox += 1;
                if !start_ok {
                    seen.insert(format!("failed {c} start-failed"));
                    self.ended.insert(c);
                    return Ok(());
                }
                self.current.insert(key, x);
                self.alive.insert(x);
                x
            }
        };
        seen.insert(format!("ready {c} sbx-{x}"));
        self.bound.entry(x).or_default().insert(c.clone());
        self.ready.entry(s.clone()).or_default().push(c.clone());
        self.calls.insert(c, (s, x));
        Ok(())
    }

    fn release(&mut self, c: CallId, seen: &mut Seen) -> Result<(), ErrorKind> {
        if self.closed {
            return Err(ErrorKind::Closed);
        }
        let Some((s, x)) = self.calls.remove(&c) else {
            return Err(if self.ended.contains(&c) {
                ErrorKind::AlreadyReleased
            } else {
                ErrorKind::UnknownCall
            });
        };
        self.ended.insert(c.clone());
        self.ready.get_mut(&s).unwrap().retain(|r| r != &c);
        let calls = self.bound.get_mut(&x).unwrap();
        calls.remove(&c);
        if calls.is_empty() && self.alive.remove(&x) {
            // Last call: drain (nothing pending), stop, shut down, all answered at once.
            self.current.retain(|_, v| *v != x);
        }
        seen.insert(format!("released {c}"));
        Ok(())
    }

    fn flush(&mut self, s: SessionId, seen: &mut Seen) -> Result<u64, ErrorKind> {
        if self.closed {
            return Err(ErrorKind::Closed);
        }
        let v = self.versions.entry(s.clone()).or_default();
        *v += 1;
        let v = *v;
        match self.target(&s) {
            Ok(x) => {
                seen.insert(format!("uploaded {s} v{v} sbx-{x}"));
                seen.insert(format!("mirror-settled {s}"));
            }
            Err(ErrorKind::SandboxGone) => {
                seen.insert(format!("dropped {s} v{v} sandbox-gone"));
            }
            Err(_) => {
                seen.insert(format!("dropped {s} v{v} no-sandbox"));
            }
        }
        Ok(v)
    }

    fn die(&mut self, x: u64, seen: &mut Seen) {
        self.alive.remove(&x);
        self.current.retain(|_, v| *v != x);
        for c in &self.bound[&x] {
            seen.insert(format!("lost {c} sbx-{x}"));
        }
    }

    fn close(&mut self, seen: &mut Seen) {
        let revoked: Vec<CallId> = self.calls.keys().cloned().collect();
        for c in &revoked {
            seen.insert(format!("revoked {c}"));
        }
        seen.insert(format!("closed revoked={revoked:?}"));
        self.calls.clear();
        self.closed = true;
    }
}

/// Answers every command at once, successfully except Starts when `start_ok` is false.
fn settle(core: &mut Lifecycle, now: Instant, start_ok: bool, seen: &mut Seen) {
    loop {
        while let Some(e) = core.poll_event() {
            seen.extend(seen_event(&e));
        }
        let Some(cmd) = core.poll_command() else {
            return;
        };
        let r = match cmd {
            Command::Start { sandbox, .. } if start_ok => core.handle_start_ok(now, sandbox),
            Command::Start { sandbox, .. } => core.handle_start_failed(now, sandbox),
            Command::Upload { upload, .. } => core.handle_upload_ok(now, upload),
            Command::Stop { sandbox, .. } => core.handle_stop_ok(now, sandbox, None),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(now, sandbox),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(now, sandbox),
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Hook { .. }
            | Command::Abandon { .. } => Ok(()),
            Command::Adopt { .. } | Command::Relinquish { .. } => panic!("no fleet here: {cmd:?}"),
        };
        // Answers after Closed are refused, as they must be.
        assert!(r.is_ok() || core.is_closed(), "answer refused: {r:?}");
    }
}

fn kind<T>(r: &Result<T, Error>) -> Result<(), ErrorKind> {
    r.as_ref().map(|_| ()).map_err(Error::kind)
}

fn run(per_call_scope: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let config = Config {
        scope: if per_call_scope {
            Scope::Call
        } else {
            Scope::Session
        },
        ..Config::default()
    };
    let mut core = Lifecycle::new(config).unwrap();
    let mut model = Model {
        per_call_scope,
        ..Model::default()
    };
    let now = Instant::ZERO;
    for (step, op) in ops.into_iter().enumerate() {
        let mut got = Seen::new();
        let mut want = Seen::new();
        match op {
            Op::Acquire {
                call: c,
                session: s,
                start_ok,
            } => {
                let r = core.acquire(now, CallSpec::new(call(c), session(s)));
                settle(&mut core, now, start_ok, &mut got);
                let m = model.acquire(call(c), session(s), start_ok, &mut want);
                prop_assert_eq!(kind(&r), m, "step {}: acquire", step);
            }
            Op::Release { call: c } => {
                let r = core.release(now, &call(c));
                settle(&mut core, now, true, &mut got);
                let m = model.release(call(c), &mut want);
                prop_assert_eq!(kind(&r), m, "step {}: release", step);
            }
            Op::Flush { session: s } => {
                let r = core.flush(
                    now,
                    &session(s),
                    &PathName::session_log(),
                    Payload::new(vec![s]),
                );
                settle(&mut core, now, true, &mut got);
                let m = model.flush(session(s), &mut want);
                prop_assert_eq!(
                    r.map(|v| v.0).map_err(|e| e.kind()),
                    m,
                    "step {}: flush",
                    step
                );
            }
            Op::Resolve { session: s } => {
                let r = core.resolve(&session(s));
                let m = if model.closed {
                    Err(ErrorKind::Closed)
                } else {
                    model.target(&session(s))
                };
                prop_assert_eq!(
                    r.map(|x| x.0).map_err(|e| e.kind()),
                    m,
                    "step {}: resolve",
                    step
                );
            }
            Op::Die { call: c } => {
                let Some(&(_, x)) = model.calls.get(&call(c)) else {
                    continue;
                };
                if !model.alive.contains(&x) {
                    continue;
                }
                core.handle_died(now, SandboxId(x)).unwrap();
                settle(&mut core, now, true, &mut got);
                model.die(x, &mut want);
            }
            Op::Close => {
                if model.closed {
                    prop_assert!(core.close(now, Duration::from_secs(1)).is_err());
                    continue;
                }
                core.close(now, Duration::from_secs(1)).unwrap();
                settle(&mut core, now, true, &mut got);
                while !core.is_closed() {
                    let t = core.poll_timeout().expect("close keeps a timer");
                    core.handle_timeout(t).unwrap();
                    settle(&mut core, t, true, &mut got);
                }
                model.close(&mut want);
                // The core drops nothing here: every version was settled at its flush.
                prop_assert!(core.is_closed());
            }
        }
        if std::env::var_os("REF_TRACE").is_some() {
            eprintln!("{step}: {got:?}");
        }
        prop_assert_eq!(got, want, "step {}: what the client saw", step);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn session_scope_matches_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(false, ops)?;
    }

    #[test]
    fn call_scope_matches_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(true, ops)?;
    }
}
