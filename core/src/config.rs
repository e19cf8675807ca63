//! Configuration: isolation scope, same-key policy, release policy, deadlines and limits.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::fleet::Fleet;

/// Which calls share an isolation key, and so a sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Every call gets a fresh sandbox.
    Call,
    /// Calls of one session share a key.
    #[default]
    Session,
    /// Calls of one user share a key (a call must name its user).
    User,
    /// All calls of the agent this core serves share one key.
    Agent,
    /// All calls share one key, which a backend may share beyond this core.
    Global,
}

/// What happens when a call's key already has a live call.
///
/// Calls naming one external sandbox always share it, whatever the policy: the application
/// supplied it for all of them, and releasing it tears nothing down.
///
/// Under either policy, a call whose key's previous sandbox is still stopping or persisting
/// queues until that sandbox's snapshot is persisted (so its Start resumes from it), within
/// `max_waiters` and `wait_timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SameKey {
    /// Both calls are bound to the one sandbox, which is released only after the last of them.
    #[default]
    Share,
    /// The later call waits, first in first out, until the earlier one has released.
    Serialize,
}

/// What happens to a managed sandbox when its last call has released.
///
/// Every policy is a set of [`Tiers`] ([`ReleasePolicy::tiers`]): warm for a while, then down
/// the Shutdown way or the Suspend way, and the key's snapshot kept for a while. The first three
/// variants are the common shapes by name; [`ReleasePolicy::Tiered`] says all of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleasePolicy {
    /// Drain, Stop, Persist (when Stop returned a snapshot), Shutdown. (No warm tier; the way
    /// down is Shutdown; a snapshot is kept until the key's next start.)
    #[default]
    Shutdown,
    /// Stay up, idle, for the next call with the same key; after `idle` without a call, or at
    /// close, go the `Shutdown` way.
    KeepWarm {
        /// How long an idle sandbox waits for its next call.
        idle: Duration,
    },
    /// Drain, Stop, Persist; no Shutdown. The backend keeps the persisted sandbox; the next Start
    /// of the key carries the snapshot as `resume_from`. (No warm tier; kept until the key's
    /// next start.)
    Suspend,
    /// Warm for `idle`, then the way down `then` names, and a snapshot kept for `retain`.
    Tiered(Tiers),
}

/// The tiers a managed sandbox goes through after its last call, each decided by the core's own
/// timers:
///
/// ```text
///  last call released
///        │
///        ▼
///  warm (Idle) ──── a call of the key ────▶ bound at once
///        │ idle passed (or close)
///        ▼
///  drain ─▶ Stop ─▶ Persist ─┬─ then = Shutdown ─▶ Shutdown (a snapshot, if Stop took one,
///                            │                     is the key's)
///                            └─ then = Suspend ──▶ suspended: the backend keeps it
///        key's snapshot ──── a call of the key ────▶ Start { resume_from } takes it
///              │ retain passed
///              ▼
///           Discard (the backend deletes it)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tiers {
    /// How long a sandbox whose last call ended stays warm (idle, bound again at once by a call
    /// of its key). Zero: it goes down at its last release.
    pub idle: Duration,
    /// The way down after the warm tier.
    pub then: WayDown,
    /// How long the key's snapshot (a suspended sandbox, or the snapshot a Stop took) is kept
    /// for the key's next start; then the core orders it discarded. `None`: until the key's
    /// next start (or, past close, as long as the backend keeps it).
    pub retain: Option<Duration>,
}

/// Which way a managed sandbox goes down after its warm tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WayDown {
    /// Drain, Stop, Persist (when Stop returned a snapshot), Shutdown.
    #[default]
    Shutdown,
    /// Drain, Stop, Persist; the backend keeps the sandbox suspended.
    Suspend,
}

impl ReleasePolicy {
    /// The policy as tiers.
    pub fn tiers(&self) -> Tiers {
        match *self {
            ReleasePolicy::Shutdown => Tiers {
                idle: Duration::ZERO,
                then: WayDown::Shutdown,
                retain: None,
            },
            ReleasePolicy::KeepWarm { idle } => Tiers {
                idle,
                then: WayDown::Shutdown,
                retain: None,
            },
            ReleasePolicy::Suspend => Tiers {
                idle: Duration::ZERO,
                then: WayDown::Suspend,
                retain: None,
            },
            ReleasePolicy::Tiered(tiers) => tiers,
        }
    }

    /// Whether a managed sandbox's way down ends suspended (Stop, Persist, kept) rather than in
    /// Shutdown.
    pub fn suspends(&self) -> bool {
        self.tiers().then == WayDown::Suspend
    }
}

/// The application's hooks at a sandbox's transitions, each with its timeout (`None`: no hook
/// there). The core orders each as a [`Command::Hook`](crate::Command::Hook) at its place:
///
/// - after start / after resume: once the Start succeeded and before any call is bound ready
///   (the sandbox stays `starting`); a failure or a timeout fails its calls with `hook-failed`
///   and the sandbox goes down unused;
/// - before suspend / before stop: once the drain ended (the mirror's last uploads settled or
///   were dropped) and before the Stop (the sandbox is `stopping`); a failure or a timeout is
///   reported ([`Event::HookFailed`](crate::Event::HookFailed)) and the way down goes on, a
///   suspend as a suspend unless [`SuspendHookFailure::Shutdown`].
///
/// Hooks of one sandbox never overlap each other, an upload or a Stop; none is ordered for a
/// sandbox the core knows dead (one outstanding when it dies is abandoned). A hook holds no
/// call, so it cannot deadlock the keeper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hooks {
    /// After a fresh start.
    pub after_start: Option<Duration>,
    /// After a start that resumed a snapshot (credentials a suspension dropped go back here).
    pub after_resume: Option<Duration>,
    /// Before the Stop of a suspension (sync state out: commit, upload artifacts).
    pub before_suspend: Option<Duration>,
    /// Before the Stop of a sandbox going the Shutdown way.
    pub before_stop: Option<Duration>,
    /// What a failed or late before-suspend hook does to the suspension.
    pub on_suspend_failure: SuspendHookFailure,
}

/// What a failed or late before-suspend hook does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SuspendHookFailure {
    /// It is reported; the suspension goes on.
    #[default]
    Suspend,
    /// It is reported; the sandbox goes the Shutdown way instead (its state may not be safe
    /// to resume).
    Shutdown,
}

/// Explicit limits on everything that grows with input. Crossing one is a typed error
/// ([`Error::LimitExceeded`]), never an unbounded queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Live calls (waiting, starting or bound).
    pub max_calls: usize,
    /// Sandboxes the core tracks at once, in any state.
    pub max_sandboxes: usize,
    /// Session records with something live (a call, mirror work, a hold).
    pub max_active_sessions: usize,
    /// Idle session records kept (they remember the last version of each path); the oldest
    /// idle record is forgotten beyond this, and its next flush starts again at version 1.
    pub max_idle_sessions: usize,
    /// Mirrored paths per session.
    pub max_paths_per_session: usize,
    /// Bytes in one flushed payload.
    pub max_payload_bytes: usize,
    /// Holds per session.
    pub max_holds_per_session: u32,
    /// Work entered into one sandbox at once ([`Lifecycle::enter`](crate::Lifecycle::enter));
    /// 1,024 by default, and when a serialised configuration leaves it out.
    #[serde(default = "default_max_operations_per_sandbox")]
    pub max_operations_per_sandbox: u32,
    /// Ended call names remembered, so that a second release says `AlreadyReleased` rather than
    /// `UnknownCall`.
    pub remembered_ended_calls: usize,
}

fn default_max_operations_per_sandbox() -> u32 {
    1024
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_calls: 1 << 20,
            max_sandboxes: 1 << 20,
            max_active_sessions: 1 << 20,
            max_idle_sessions: 1 << 21,
            max_paths_per_session: 32,
            max_payload_bytes: 64 << 20,
            max_holds_per_session: 64,
            max_operations_per_sandbox: default_max_operations_per_sandbox(),
            remembered_ended_calls: 4096,
        }
    }
}

/// The whole configuration of a [`Lifecycle`](crate::Lifecycle).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Which calls share a key.
    pub scope: Scope,
    /// What a second live call with the same key gets.
    pub same_key: SameKey,
    /// What happens to a managed sandbox after its last call.
    pub release: ReleasePolicy,
    /// How long a Start may take before its calls fail with `StartTimeout`.
    pub start_timeout: Duration,
    /// How long the attempts of one version may take together, from its first attempt. An
    /// attempt still unanswered then is cancelled and its version dropped (`upload-timeout`); a
    /// retry whose backoff would end later is not made (`upload-failed`).
    pub upload_timeout: Duration,
    /// Transient upload failures retried per version, within `upload_timeout`, before it is
    /// dropped (`upload-failed`).
    pub upload_retries: u32,
    /// The first retry's delay; each further retry doubles it.
    pub retry_backoff: Duration,
    /// How long a draining sandbox waits for its mirror work and holds.
    pub drain_deadline: Duration,
    /// How long a queued call waits for its key before it fails with `WaitTimeout`.
    pub wait_timeout: Duration,
    /// Queued calls per key; one more is refused with `QueueFull`.
    pub max_waiters: usize,
    /// How long a Stop, Persist or Shutdown may go unanswered. A Stop or Persist that times out
    /// counts as failed; a Shutdown that times out is reported unconfirmed.
    pub command_timeout: Duration,
    /// The second close deadline: after the first one revoked what was left, how long close waits
    /// for shutdown acknowledgements before it reports the rest unconfirmed.
    pub close_grace: Duration,
    /// The application's hooks at a sandbox's transitions.
    #[serde(default)]
    pub hooks: Hooks,
    /// Fleet mode: this process shares its backend with other sandkeeper processes
    /// ([`Fleet`]). `None`: it is the backend's only keeper.
    #[serde(default)]
    pub fleet: Option<Fleet>,
    /// Limits on everything that grows.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scope: Scope::default(),
            same_key: SameKey::default(),
            release: ReleasePolicy::default(),
            start_timeout: Duration::from_secs(30),
            upload_timeout: Duration::from_secs(10),
            upload_retries: 3,
            retry_backoff: Duration::from_millis(100),
            drain_deadline: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(30),
            max_waiters: 8,
            command_timeout: Duration::from_secs(30),
            close_grace: Duration::from_secs(30),
            hooks: Hooks::default(),
            fleet: None,
            limits: Limits::default(),
        }
    }
}

impl Config {
    /// Checks that every deadline is positive and every limit at least one.
    pub fn validate(&self) -> Result<(), Error> {
        let durations = [
            ("start_timeout", self.start_timeout),
            ("upload_timeout", self.upload_timeout),
            ("drain_deadline", self.drain_deadline),
            ("wait_timeout", self.wait_timeout),
            ("command_timeout", self.command_timeout),
            ("close_grace", self.close_grace),
        ];
        for (name, d) in durations {
            if d.is_zero() {
                return Err(Error::InvalidConfig {
                    field: name,
                    why: "must be longer than zero",
                });
            }
        }
        let hooks = [
            ("hooks.after_start", self.hooks.after_start),
            ("hooks.after_resume", self.hooks.after_resume),
            ("hooks.before_suspend", self.hooks.before_suspend),
            ("hooks.before_stop", self.hooks.before_stop),
        ];
        for (name, timeout) in hooks {
            if timeout.is_some_and(|t| t.is_zero()) {
                return Err(Error::InvalidConfig {
                    field: name,
                    why: "a hook's timeout must be longer than zero",
                });
            }
        }
        if let ReleasePolicy::KeepWarm { idle } = self.release {
            if idle.is_zero() {
                return Err(Error::InvalidConfig {
                    field: "release.keep_warm.idle",
                    why: "must be longer than zero",
                });
            }
        }
        if let ReleasePolicy::Tiered(Tiers {
            retain: Some(retain),
            ..
        }) = self.release
        {
            if retain.is_zero() {
                return Err(Error::InvalidConfig {
                    field: "release.tiered.retain",
                    why: "must be longer than zero (None keeps the snapshot until the next start)",
                });
            }
        }
        if let Some(fleet) = &self.fleet {
            fleet.validate()?;
        }
        let l = &self.limits;
        let limits = [
            ("limits.max_calls", l.max_calls),
            ("limits.max_sandboxes", l.max_sandboxes),
            ("limits.max_active_sessions", l.max_active_sessions),
            ("limits.max_paths_per_session", l.max_paths_per_session),
            ("limits.max_payload_bytes", l.max_payload_bytes),
            (
                "limits.max_holds_per_session",
                l.max_holds_per_session as usize,
            ),
        ];
        for (name, n) in limits {
            if n == 0 {
                return Err(Error::InvalidConfig {
                    field: name,
                    why: "must be at least 1",
                });
            }
        }
        Ok(())
    }
}
