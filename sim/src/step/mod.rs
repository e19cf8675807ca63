//! Steps: one thing the application or the backend does, or one expectation. The random world
//! makes them, scenario files spell them, the harness applies them, the shrinker writes them back
//! out as scenario lines (their `Display` is the scenario syntax). A fleet scenario's steps add
//! [`fleet`]'s: a step on one replica ([`Step::On`]) and what only a fleet has
//! ([`Step::Fleet`]).

pub mod fleet;

use std::fmt;
use std::time::Duration;

use sandkeeper::{CallId, ExternalId, Key, PathName, SessionId, Snapshot, UserId, WayDown};

/// What a `resolve` step expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveExpect {
    /// The sandbox of this call.
    Call(CallId),
    /// `NoActiveSandbox`.
    None,
    /// `SandboxGone`.
    Gone,
}

/// A backend answer, naming its sandbox through a call (`@call`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `start-ok`
    StartOk,
    /// `start-fail`
    StartFail,
    /// `upload-ok` (the oldest upload outstanding to the sandbox)
    UploadOk,
    /// `upload-fail [gone]`
    UploadFail {
        /// The sandbox is gone rather than the failure being transient.
        gone: bool,
    },
    /// `stop-ok [snapshot=..]`
    StopOk {
        /// The snapshot the stop took.
        snapshot: Option<Snapshot>,
    },
    /// `stop-fail`
    StopFail,
    /// `persist-ok`
    PersistOk,
    /// `persist-fail`
    PersistFail,
    /// `shutdown-ok`
    ShutdownOk,
    /// `shutdown-fail`
    ShutdownFail,
    /// `hook-ok`: the application's hook ran through.
    HookOk,
    /// `hook-fail`: the application's hook failed.
    HookFail,
    /// `die`: the backend reports the sandbox gone (needs no outstanding command).
    Die,
    /// `instance-gone`: the backend reports the sandbox's running instance gone, its workspace
    /// perhaps kept (a pod of a claim; needs no outstanding command).
    InstanceGone,
}

/// The kind of command an answer answers: the check crate's [`Op`](sandkeeper_check::Op), so
/// the simulator and the checkers name operations alike.
pub use sandkeeper_check::Op as OpKind;

impl Answer {
    /// The command kind it answers; `None` for `die` and `instance-gone`.
    pub fn op(&self) -> Option<OpKind> {
        Some(match self {
            Answer::StartOk | Answer::StartFail => OpKind::Start,
            Answer::UploadOk | Answer::UploadFail { .. } => OpKind::Upload,
            Answer::StopOk { .. } | Answer::StopFail => OpKind::Stop,
            Answer::PersistOk | Answer::PersistFail => OpKind::Persist,
            Answer::ShutdownOk | Answer::ShutdownFail => OpKind::Shutdown,
            Answer::HookOk | Answer::HookFail => OpKind::Hook,
            Answer::Die | Answer::InstanceGone => return None,
        })
    }

    /// The successful answer to a command of `kind`.
    pub fn success(kind: OpKind) -> Answer {
        match kind {
            OpKind::Start => Answer::StartOk,
            OpKind::Upload => Answer::UploadOk,
            OpKind::Stop => Answer::StopOk { snapshot: None },
            OpKind::Persist => Answer::PersistOk,
            OpKind::Shutdown => Answer::ShutdownOk,
            OpKind::Hook => Answer::HookOk,
            OpKind::Relinquish => unreachable!("a Relinquish wants no answer: never outstanding"),
        }
    }
}

/// A call's observed outcome, for `expect failed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `expect ready <call>`
    Ready(CallId),
    /// `expect waiting <call>`
    Waiting(CallId),
    /// `expect failed <call> [error=<kind>]`. The call is its name as written: a name the core
    /// refuses (`..`) is a call that failed with `invalid-name`.
    Failed(String, Option<String>),
    /// `expect uploaded <session> [path=] version=<n> into=@<call>`
    Uploaded {
        /// The session.
        session: SessionId,
        /// The path (`None`: the session log).
        path: Option<PathName>,
        /// The version.
        version: u64,
        /// The call whose sandbox received it.
        into: CallId,
    },
    /// `expect dropped <session> [path=] version=<n> [reason=<kind>]`
    Dropped {
        /// The session.
        session: SessionId,
        /// The path (`None`: the session log).
        path: Option<PathName>,
        /// The version.
        version: u64,
        /// The reason, kebab case (`superseded` included).
        reason: Option<String>,
    },
    /// `expect running @<call>`: up, with no Stop, Shutdown or death ordered or reported (warm
    /// and draining count).
    Running(CallId),
    /// `expect state @<call> <state>`: the core's exact state of the sandbox.
    State(CallId, sandkeeper::SandboxState),
    /// `expect stop @<call>`
    Stop(CallId),
    /// `expect no-stop @<call>`
    NoStop(CallId),
    /// `expect shutdown @<call>`
    Shutdown(CallId),
    /// `expect no-shutdown @<call>`
    NoShutdown(CallId),
    /// `expect resumed @<call> from=<snapshot>`
    Resumed(CallId, String),
    /// `expect discarded <snapshot>`: a Discard of it was ordered (tiers' retention).
    Discarded(String),
    /// `expect no-discard <snapshot>`
    NoDiscard(String),
    /// `expect closed`
    Closed,
    /// `expect error <kind>`
    Error(String),
}

/// One step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `acquire <call> session=<s> [user=<u>] [external=<name>]`
    Acquire {
        /// The call.
        call: CallId,
        /// Its session.
        session: SessionId,
        /// Its user.
        user: Option<UserId>,
        /// The external sandbox it names.
        external: Option<ExternalId>,
    },
    /// `release <call>`
    Release(CallId),
    /// `release <call> as=<suspend|shutdown>`: a release that asks its sandbox's way down
    /// (`Lifecycle::release_as`).
    ReleaseAs(CallId, WayDown),
    /// `drop-snapshot <key>`: the application lets go of what the key keeps
    /// (`Lifecycle::drop_snapshot`).
    DropSnapshot(Key),
    /// `flush <session> [path=<p>] [bytes=<n>]`
    Flush {
        /// The session.
        session: SessionId,
        /// The path (`None`: the session log).
        path: Option<PathName>,
        /// The payload size.
        bytes: usize,
    },
    /// `resolve <session> expect=...`
    Resolve(SessionId, ResolveExpect),
    /// `hold <session>`
    Hold(SessionId),
    /// `unhold <session>`
    Unhold(SessionId),
    /// `enter <session>`: work of the session enters its sandbox (the core's `enter`).
    Enter(SessionId),
    /// `leave <session>`: the session's oldest entered work leaves its sandbox.
    Leave(SessionId),
    /// `close [deadline=<d>]`
    Close(Option<Duration>),
    /// `advance <d>`
    Advance(Duration),
    /// A backend answer to the sandbox of `@call`.
    Answer(Answer, CallId),
    /// `settle [@call]`
    Settle(Option<CallId>),
    /// `expect ...`
    Expect(Expect),
    /// An application step whose names fit the grammar but that the core refuses (a name it
    /// does not accept, like `..`): applied as the input the core rejects with `invalid-name`.
    Refused {
        /// The line as written.
        text: String,
        /// The call it acquires, as written (an `acquire` only).
        call: Option<String>,
        /// Why the core refuses the name.
        why: String,
    },
    /// A random-world step a scenario cannot spell (a duplicate answer, a late answer to a
    /// cancelled upload): written out as a comment.
    Unspellable(String),
    /// `[rN] <step>`: a step that happens on one replica of a fleet (an application step, a
    /// backend or store answer, an expectation, the replica's pause, crash or restart).
    On(fleet::ReplicaNo, Box<Step>),
    /// A step only a fleet has (inside [`Step::On`] when it happens on one replica).
    Fleet(fleet::FleetStep),
}

/// The scenario word of a sandbox state (kebab case, as it serialises).
pub fn state_word(state: sandkeeper::SandboxState) -> &'static str {
    use sandkeeper::SandboxState as S;
    match state {
        S::Starting => "starting",
        S::Running => "running",
        S::Idle => "idle",
        S::Draining => "draining",
        S::Stopping => "stopping",
        S::Persisting => "persisting",
        S::Persisted => "persisted",
        S::ShuttingDown => "shutting-down",
        S::Dead => "dead",
        S::HandingOver => "handing-over",
    }
}

/// Every sandbox state, for parsing.
pub const STATES: [sandkeeper::SandboxState; 10] = [
    sandkeeper::SandboxState::Starting,
    sandkeeper::SandboxState::Running,
    sandkeeper::SandboxState::Idle,
    sandkeeper::SandboxState::Draining,
    sandkeeper::SandboxState::Stopping,
    sandkeeper::SandboxState::Persisting,
    sandkeeper::SandboxState::Persisted,
    sandkeeper::SandboxState::ShuttingDown,
    sandkeeper::SandboxState::Dead,
    sandkeeper::SandboxState::HandingOver,
];

impl Step {
    /// The way down a release asks (`release … as=`); `None` for a plain release or another step.
    pub fn asked_way(&self) -> Option<WayDown> {
        match self {
            Step::ReleaseAs(_, way) => Some(*way),
            _ => None,
        }
    }
}

/// A way down as `release … as=` spells it.
pub fn way_name(way: WayDown) -> &'static str {
    match way {
        WayDown::Suspend => "suspend",
        WayDown::Shutdown => "shutdown",
    }
}

/// Writes a duration the way scenario files spell it.
pub fn fmt_duration(d: Duration) -> String {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        // Finer than a millisecond: only a fleet's `advance` takes it.
        return format!("{}ns", d.as_nanos());
    }
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn path_word(path: &Option<PathName>) -> String {
    match path {
        Some(p) => format!(" path={p}"),
        None => String::new(),
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::StartOk => "start-ok",
            Answer::StartFail => "start-fail",
            Answer::UploadOk => "upload-ok",
            Answer::UploadFail { .. } => "upload-fail",
            Answer::StopOk { .. } => "stop-ok",
            Answer::StopFail => "stop-fail",
            Answer::PersistOk => "persist-ok",
            Answer::PersistFail => "persist-fail",
            Answer::ShutdownOk => "shutdown-ok",
            Answer::ShutdownFail => "shutdown-fail",
            Answer::HookOk => "hook-ok",
            Answer::HookFail => "hook-fail",
            Answer::Die => "die",
            Answer::InstanceGone => "instance-gone",
        })
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Ready(c) => write!(f, "expect ready {c}"),
            Expect::Waiting(c) => write!(f, "expect waiting {c}"),
            Expect::Failed(c, None) => write!(f, "expect failed {c}"),
            Expect::Failed(c, Some(e)) => write!(f, "expect failed {c} error={e}"),
            Expect::Uploaded {
                session,
                path,
                version,
                into,
            } => write!(
                f,
                "expect uploaded {session}{} version={version} into=@{into}",
                path_word(path)
            ),
            Expect::Dropped {
                session,
                path,
                version,
                reason,
            } => {
                write!(
                    f,
                    "expect dropped {session}{} version={version}",
                    path_word(path)
                )?;
                if let Some(r) = reason {
                    write!(f, " reason={r}")?;
                }
                Ok(())
            }
            Expect::Running(c) => write!(f, "expect running @{c}"),
            Expect::State(c, s) => write!(f, "expect state @{c} {}", state_word(*s)),
            Expect::Stop(c) => write!(f, "expect stop @{c}"),
            Expect::NoStop(c) => write!(f, "expect no-stop @{c}"),
            Expect::Shutdown(c) => write!(f, "expect shutdown @{c}"),
            Expect::NoShutdown(c) => write!(f, "expect no-shutdown @{c}"),
            Expect::Resumed(c, s) => write!(f, "expect resumed @{c} from={s}"),
            Expect::Discarded(s) => write!(f, "expect discarded {s}"),
            Expect::NoDiscard(s) => write!(f, "expect no-discard {s}"),
            Expect::Closed => write!(f, "expect closed"),
            Expect::Error(k) => write!(f, "expect error {k}"),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Acquire {
                call,
                session,
                user,
                external,
            } => {
                write!(f, "acquire {call} session={session}")?;
                if let Some(u) = user {
                    write!(f, " user={u}")?;
                }
                if let Some(e) = external {
                    write!(f, " external={e}")?;
                }
                Ok(())
            }
            Step::Release(c) => write!(f, "release {c}"),
            Step::ReleaseAs(c, way) => write!(f, "release {c} as={}", way_name(*way)),
            Step::DropSnapshot(key) => write!(f, "drop-snapshot {key}"),
            Step::Flush {
                session,
                path,
                bytes,
            } => write!(f, "flush {session}{} bytes={bytes}", path_word(path)),
            Step::Resolve(s, e) => match e {
                ResolveExpect::Call(c) => write!(f, "resolve {s} expect=@{c}"),
                ResolveExpect::None => write!(f, "resolve {s} expect=none"),
                ResolveExpect::Gone => write!(f, "resolve {s} expect=gone"),
            },
            Step::Hold(s) => write!(f, "hold {s}"),
            Step::Unhold(s) => write!(f, "unhold {s}"),
            Step::Enter(s) => write!(f, "enter {s}"),
            Step::Leave(s) => write!(f, "leave {s}"),
            Step::Close(None) => write!(f, "close"),
            Step::Close(Some(d)) => write!(f, "close deadline={}", fmt_duration(*d)),
            Step::Advance(d) => write!(f, "advance {}", fmt_duration(*d)),
            Step::Answer(a, c) => {
                write!(f, "{a} @{c}")?;
                match a {
                    Answer::UploadFail { gone: true } => write!(f, " gone"),
                    Answer::StopOk { snapshot: Some(s) } => write!(f, " snapshot={}", s.as_str()),
                    _ => Ok(()),
                }
            }
            Step::Settle(None) => write!(f, "settle"),
            Step::Settle(Some(c)) => write!(f, "settle @{c}"),
            Step::Expect(e) => write!(f, "{e}"),
            Step::Refused { text, .. } => f.write_str(text),
            Step::Unspellable(text) => write!(f, "# not expressible in a scenario: {text}"),
            Step::On(r, step) => write!(f, "[{r}] {step}"),
            Step::Fleet(step) => write!(f, "{step}"),
        }
    }
}
