//! The steps of a fleet scenario that the one-process format has no word for: the fleet line
//! (how many replicas, their lease timing and clocks), the store's answers, the backend's
//! answers with their delivery delay and `fenced`, the replica's own fate (pause, crash,
//! restart), the sweep, and the expectations about ownership. Their `Display` is the scenario
//! syntax, as for [`Step`](super::Step).
//!
//! A step that happens on one replica is written after the replica's name in brackets,
//! `[r1] acquire a session=s1`; [`Step::On`](super::Step::On) carries it.

use std::fmt;
use std::time::Duration;

use sandkeeper::{CallId, FenceReason, Key};

use super::{fmt_duration, Answer};

/// A replica of a fleet scenario by its number, `r0`, `r1`, ...: the simulator's replica index
/// (its reports say `replica 1` for `r1`). A replica keeps its number across crashes and
/// restarts; each start is a new incarnation of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaNo(pub usize);

impl fmt::Display for ReplicaNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// How a replica's store work is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// The store takes every piece of work the moment it is ordered and answers at once, as it
    /// decides (granted, busy, fenced, ...).
    Auto,
    /// The store is unreachable: every piece of work fails at once (the store's error answer:
    /// `renew-failed`, `claim-failed`, `record-failed`, `release-failed`).
    Down,
    /// Work waits for a store step that answers it (or for nothing: its deadline passes).
    Hold,
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Link::Auto => "auto",
            Link::Down => "down",
            Link::Hold => "hold",
        })
    }
}

/// The `fleet` line: the replicas, their clocks and their store link (its lease timing is the
/// configuration's [`Fleet`](sandkeeper::Fleet)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetSpec {
    /// How many replicas (at least 1), `r0` to `r<n-1>`.
    pub replicas: usize,
    /// How far each replica's clock drifts from the store's, in parts per million (positive:
    /// it runs fast), by replica.
    pub drift_ppm: Vec<i64>,
    /// How every replica's store work is answered at the start.
    pub link: Link,
    /// From this instant on the scenario injects no fault, and the seed world's
    /// `lapse-without-fault` check runs (a replica whose clock drifts within the margin and
    /// that ran a lease and more undisturbed never lapses); `None`: never (`calm-after=`).
    pub calm_after: Option<Duration>,
    /// What comes due (a timer, a delayed answer, the end of a pause) happens only on
    /// `advance`, not before every step (`events=on-advance`; default `events=before-steps`):
    /// a transcript's exact order at one instant.
    pub on_advance: bool,
    /// The simulated backend refuses a change under a token older than one it has seen
    /// (`backend-fencing=on`, the default); `off` is the hand-made canary of that check,
    /// whose breaks `token-order` catches.
    pub backend_fencing: bool,
    /// The `conservation` check judges the run (`conservation=on`, the default); `off` runs
    /// a scenario written before the check, or one that shows what it would miss.
    pub conservation: bool,
    /// Each replica is a host with its own disk over a shared object store (`hosts=on`;
    /// default off: one backend root; `sim/src/fleet/hosts.rs`). The object store's faults
    /// are a seed's; a scenario answers with what the backend does.
    pub hosts: bool,
}

/// A store answer, to a replica's oldest held piece of store work of its kind (for that key,
/// with that number, when given). The store decides what a granted or written answer holds;
/// an answer the store would not give is an error of the scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreAnswer {
    /// `renewed`: the lease renewal written.
    Renewed,
    /// `renew-failed`: the store erred; nothing written.
    RenewFailed,
    /// `claimed <key>`: the key granted, with the next token and the key's record.
    Claimed,
    /// `claim-busy <key>`: another live process owns the key; the want is recorded.
    ClaimBusy,
    /// `claim-failed <key>`: the store erred.
    ClaimFailed,
    /// `recorded <key>`: the owned key's record written.
    Recorded,
    /// `record-failed <key>`: the store erred.
    RecordFailed,
    /// `record-fenced <key>`: refused, the key is no longer the writer's under its token.
    RecordFenced,
    /// `released <key>`: the key let go with its record.
    Released,
    /// `release-failed <key>`: the store erred.
    ReleaseFailed,
    /// `release-fenced <key>`: refused, the key is no longer the releaser's under its token.
    ReleaseFenced,
}

impl StoreAnswer {
    /// Every store answer, for parsing.
    pub const ALL: [StoreAnswer; 11] = [
        StoreAnswer::Renewed,
        StoreAnswer::RenewFailed,
        StoreAnswer::Claimed,
        StoreAnswer::ClaimBusy,
        StoreAnswer::ClaimFailed,
        StoreAnswer::Recorded,
        StoreAnswer::RecordFailed,
        StoreAnswer::RecordFenced,
        StoreAnswer::Released,
        StoreAnswer::ReleaseFailed,
        StoreAnswer::ReleaseFenced,
    ];

    /// Its verb.
    pub fn verb(self) -> &'static str {
        match self {
            StoreAnswer::Renewed => "renewed",
            StoreAnswer::RenewFailed => "renew-failed",
            StoreAnswer::Claimed => "claimed",
            StoreAnswer::ClaimBusy => "claim-busy",
            StoreAnswer::ClaimFailed => "claim-failed",
            StoreAnswer::Recorded => "recorded",
            StoreAnswer::RecordFailed => "record-failed",
            StoreAnswer::RecordFenced => "record-fenced",
            StoreAnswer::Released => "released",
            StoreAnswer::ReleaseFailed => "release-failed",
            StoreAnswer::ReleaseFenced => "release-fenced",
        }
    }

    /// Whether it is the store's error: nothing is written and the store is not asked.
    pub fn is_error(self) -> bool {
        matches!(
            self,
            StoreAnswer::RenewFailed
                | StoreAnswer::ClaimFailed
                | StoreAnswer::RecordFailed
                | StoreAnswer::ReleaseFailed
        )
    }

    /// Whether it answers a renewal (which names no key).
    pub fn is_renewal(self) -> bool {
        matches!(self, StoreAnswer::Renewed | StoreAnswer::RenewFailed)
    }
}

/// With hosts, the object store's fault in one command (`shelf=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShelfFault {
    /// The upload or download fails (`shelf=fail`).
    Fail,
    /// The upload lands and its answer is lost: answered as a failure (`shelf=late`).
    Late,
}

impl ShelfFault {
    /// The word after `shelf=`.
    pub fn word(self) -> &'static str {
        match self {
            ShelfFault::Fail => "fail",
            ShelfFault::Late => "late",
        }
    }
}

/// A backend answer in a fleet: one of the one-process answers, or `fenced`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendAnswer {
    /// `start-ok`, `upload-fail`, `stop-ok [snapshot=]`, `die`, ...: as in one process. A
    /// success is what the simulated backend must then do (it refuses an old token: answer
    /// `fenced`); a failure is the backend's, and changes nothing in it.
    Plain(Answer),
    /// `fenced [<command>]`: the backend refuses the oldest outstanding command to the sandbox
    /// that carries a token (of that name: `start`, `adopt`, `upload`, `stop`, `persist`,
    /// `shutdown`, `hook`), for it has seen a newer token for the sandbox or its key.
    Fenced(Option<String>),
}

/// What happens in a fleet and has no one-process word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetStep {
    /// `[rN] <answer> @<call> [after=<d>]`: the backend runs the replica's outstanding command
    /// now; its answer reaches the replica now, or `after` later.
    Backend {
        /// The answer.
        answer: BackendAnswer,
        /// The call whose sandbox it names.
        call: CallId,
        /// Which of the replica's runs ordered the command (0: its first start); default: its
        /// current run's, then its earlier runs'.
        run: Option<usize>,
        /// The delivery delay.
        after: Option<Duration>,
        /// With hosts: the object store's fault in this command's upload or download
        /// (`shelf=fail|late`; `sim/src/fleet/hosts.rs`).
        shelf: Option<ShelfFault>,
    },
    /// `[rN] <store answer> [<key>] [id=<n>] [after=<d>]`: the store takes the replica's held
    /// work now; its answer reaches the replica now, or `after` later.
    Store {
        /// The answer.
        answer: StoreAnswer,
        /// The key (every answer but a renewal's names one).
        key: Option<Key>,
        /// The number the core gave the work (its renewal, claim, recording or release).
        id: Option<u64>,
        /// Which of the replica's runs ordered the work (0: its first start); default: its
        /// current run's, then its earlier runs'.
        run: Option<usize>,
        /// The delivery delay.
        after: Option<Duration>,
    },
    /// `[rN] store auto|down|hold`: how the replica's store work is answered from now on
    /// (`auto` and `down` take what is held at once).
    Link(Link),
    /// `[rN] pause <d>`: the process stops for `d` (a long GC, a stopped VM): it takes no
    /// input, timers and answers wait for it.
    Pause(Duration),
    /// `[rN] crash`: the process dies; its memory is lost, its requests in flight still land.
    Crash,
    /// `[rN] restart [drift=<ppm>]`: a crashed replica starts again as a new incarnation.
    Restart {
        /// Its clock's drift (default 0).
        drift_ppm: Option<i64>,
    },
    /// `[rN] sweep`: a sweep of the backend on the replica's clock, by the drivers' decision.
    Sweep,
    /// `[rN] expect ...` (ownership) and `expect owner|record ...` (the store).
    Expect(FleetExpect),
    /// `advance <d> at-target=<k>`: time moves on by `by`; what comes due before then happens,
    /// and of what comes due exactly then only the first `at_target` (a transcript's order).
    Advance {
        /// How far.
        by: Duration,
        /// How many of the events due exactly at the target happen.
        at_target: usize,
    },
}

/// Expectations about ownership: on a replica, or (`owner`, `record`) about the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetExpect {
    /// `[rN] expect lost <call>`: the call is ready on a sandbox it lost (dead or taken away).
    Lost(CallId),
    /// `[rN] expect claim <key>`: the replica ordered a claim of the key.
    Claim(Key),
    /// `[rN] expect token <key> <n>|none`: the replica owns the key under that token (or not).
    Token(Key, Option<u64>),
    /// `[rN] expect adopt @<call>`: the replica ordered the sandbox's adoption.
    Adopt(CallId),
    /// `[rN] expect relinquish @<call>`: the replica let the sandbox go (Relinquish).
    Relinquish(CallId),
    /// `[rN] expect fenced <key> [reason=lapse|refused]`: the replica reported the key fenced.
    Fenced(Key, Option<FenceReason>),
    /// `expect owner <key> <rN>|none [token=<n>]`: the store's owner of the key with a live
    /// lease now (any incarnation of that replica), and the key's newest token.
    Owner(Key, Option<ReplicaNo>, Option<u64>),
    /// `expect record <key> [warm=@<call>|none] [snapshot=<name>|none]`: what the store keeps
    /// as the key's durable record.
    Record {
        /// The key.
        key: Key,
        /// The warm sandbox it names (`Some(None)`: none).
        warm: Option<Option<CallId>>,
        /// The snapshot it names (`Some(None)`: none).
        snapshot: Option<Option<String>>,
    },
}

impl FleetExpect {
    /// Whether it is about the store rather than one replica.
    pub fn is_fleet_wide(&self) -> bool {
        matches!(self, FleetExpect::Owner(..) | FleetExpect::Record { .. })
    }
}

/// The scenario word of a fence reason.
pub fn reason_word(reason: FenceReason) -> &'static str {
    match reason {
        FenceReason::LeaseLapsed => "lapse",
        FenceReason::Refused => "refused",
    }
}

/// A signed drift in parts per million, as scenarios write it (`+20000`, `-300`, `0`).
pub fn fmt_ppm(ppm: i64) -> String {
    if ppm > 0 {
        format!("+{ppm}")
    } else {
        ppm.to_string()
    }
}

fn after_word(after: &Option<Duration>) -> String {
    match after {
        Some(d) => format!(" after={}", fmt_duration(*d)),
        None => String::new(),
    }
}

impl fmt::Display for FleetStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetStep::Backend {
                answer,
                call,
                run,
                after,
                shelf,
            } => {
                match answer {
                    BackendAnswer::Fenced(None) => write!(f, "fenced @{call}")?,
                    BackendAnswer::Fenced(Some(command)) => write!(f, "fenced @{call} {command}")?,
                    BackendAnswer::Plain(a) => {
                        write!(f, "{}", super::Step::Answer(a.clone(), call.clone()))?
                    }
                }
                if let Some(k) = run {
                    write!(f, " run={k}")?;
                }
                if let Some(fault) = shelf {
                    write!(f, " shelf={}", fault.word())?;
                }
                f.write_str(&after_word(after))
            }
            FleetStep::Store {
                answer,
                key,
                id,
                run,
                after,
            } => {
                f.write_str(answer.verb())?;
                if let Some(k) = key {
                    write!(f, " {k}")?;
                }
                if let Some(n) = id {
                    write!(f, " id={n}")?;
                }
                if let Some(k) = run {
                    write!(f, " run={k}")?;
                }
                f.write_str(&after_word(after))
            }
            FleetStep::Link(link) => write!(f, "store {link}"),
            FleetStep::Pause(d) => write!(f, "pause {}", fmt_duration(*d)),
            FleetStep::Crash => f.write_str("crash"),
            FleetStep::Restart { drift_ppm: None } => f.write_str("restart"),
            FleetStep::Restart {
                drift_ppm: Some(ppm),
            } => write!(f, "restart drift={}", fmt_ppm(*ppm)),
            FleetStep::Sweep => f.write_str("sweep"),
            FleetStep::Advance { by, at_target } => {
                write!(f, "advance {} at-target={at_target}", fmt_duration(*by))
            }
            FleetStep::Expect(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Display for FleetExpect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetExpect::Lost(c) => write!(f, "expect lost {c}"),
            FleetExpect::Claim(k) => write!(f, "expect claim {k}"),
            FleetExpect::Token(k, Some(n)) => write!(f, "expect token {k} {n}"),
            FleetExpect::Token(k, None) => write!(f, "expect token {k} none"),
            FleetExpect::Adopt(c) => write!(f, "expect adopt @{c}"),
            FleetExpect::Relinquish(c) => write!(f, "expect relinquish @{c}"),
            FleetExpect::Fenced(k, None) => write!(f, "expect fenced {k}"),
            FleetExpect::Fenced(k, Some(r)) => {
                write!(f, "expect fenced {k} reason={}", reason_word(*r))
            }
            FleetExpect::Owner(k, owner, token) => {
                match owner {
                    Some(r) => write!(f, "expect owner {k} {r}")?,
                    None => write!(f, "expect owner {k} none")?,
                }
                if let Some(t) = token {
                    write!(f, " token={t}")?;
                }
                Ok(())
            }
            FleetExpect::Record {
                key,
                warm,
                snapshot,
            } => {
                write!(f, "expect record {key}")?;
                match warm {
                    Some(Some(c)) => write!(f, " warm=@{c}")?,
                    Some(None) => write!(f, " warm=none")?,
                    None => {}
                }
                match snapshot {
                    Some(Some(s)) => write!(f, " snapshot={s}")?,
                    Some(None) => write!(f, " snapshot=none")?,
                    None => {}
                }
                Ok(())
            }
        }
    }
}
