//! Swarm configuration: one seed draws the core's configuration, the workload mix and the fault
//! rates, so that different seeds stress different corners (some faults off entirely, some
//! policies only reachable with others).

use std::fmt;
use std::time::Duration;

use sandkeeper::{
    Config, Hooks, ReleasePolicy, SameKey, Scope, SuspendHookFailure, Tiers, WayDown,
};

use crate::rng::Rng;

/// Rates are per mille; durations in milliseconds.
#[derive(Clone, Debug)]
pub struct Swarm {
    /// The core's configuration.
    pub config: Config,
    /// The deadline `close` is given.
    pub close_deadline: Duration,
    /// Random steps before the liveness phase.
    pub steps: usize,
    /// At which random step the application closes, if it does.
    pub close_at: Option<usize>,
    /// Session names drawn from.
    pub sessions: u32,
    /// User names drawn from.
    pub users: u32,
    /// External sandbox names drawn from (0: none).
    pub externals: u32,
    /// Mirrored paths per session (the session log and `p1`..).
    pub paths: u32,
    /// Live calls the application keeps at most.
    pub max_live: usize,
    /// Step weights: acquire, release, flush, resolve, hold, unhold, answer, die, advance, misuse.
    pub weights: [u32; 10],
    /// Share of acquires naming an external sandbox.
    pub external_rate: u32,
    /// Start answers that fail.
    pub start_fail: u32,
    /// Starts that hang (never answered before the liveness phase).
    pub start_hang: u32,
    /// Upload answers that fail transiently.
    pub upload_fail: u32,
    /// Upload answers that report the sandbox gone.
    pub upload_gone: u32,
    /// Uploads that hang.
    pub upload_hang: u32,
    /// Stop answers that fail.
    pub stop_fail: u32,
    /// Stops that carry a snapshot.
    pub snapshot: u32,
    /// Persist answers that fail.
    pub persist_fail: u32,
    /// Shutdown answers that fail.
    pub shutdown_fail: u32,
    /// Stops, persists and shutdowns that hang.
    pub command_hang: u32,
    /// Hook answers that fail.
    pub hook_fail: u32,
    /// Hooks that hang (past their timeout).
    pub hook_hang: u32,
    /// Cancelled uploads answered late anyway.
    pub late_answer: u32,
    /// Answers given twice.
    pub duplicate: u32,
    /// The longest backend latency.
    pub latency_ms: u64,
    /// The longest single time jump.
    pub jump_ms: u64,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Swarm {
    /// The swarm configuration of `seed`.
    pub fn new(seed: u64) -> Self {
        // A stream of its own, so the world's stream does not shift when this grows.
        let mut r = Rng::new(seed ^ 0x5357_4152_4d5f_5345);
        let scope = [
            Scope::Call,
            Scope::Session,
            Scope::User,
            Scope::Agent,
            Scope::Global,
        ][r.index(5)];
        let same_key = if r.chance(500) {
            SameKey::Share
        } else {
            SameKey::Serialize
        };
        let release = match r.below(3) {
            0 => ReleasePolicy::Shutdown,
            1 => ReleasePolicy::KeepWarm {
                idle: ms(r.range(10, 2000)),
            },
            // Tiers with a retention: warm, then suspended (or shut down, keeping the snapshot
            // its Stop took), then discarded. A draw only on this branch, so the seeds of the
            // other policies play as before.
            _ => match r.below(3) {
                0 => ReleasePolicy::Suspend,
                n => ReleasePolicy::Tiered(Tiers {
                    idle: ms(r.range(0, 2000)),
                    then: if n == 1 {
                        WayDown::Suspend
                    } else {
                        WayDown::Shutdown
                    },
                    retain: Some(ms(r.range(10, 3000))),
                }),
            },
        };
        let mut config = Config {
            scope,
            same_key,
            release,
            start_timeout: ms(r.range(50, 3000)),
            upload_timeout: ms(r.range(50, 2000)),
            upload_retries: r.below(4) as u32,
            retry_backoff: ms(r.range(5, 200)),
            drain_deadline: ms(r.range(20, 2000)),
            wait_timeout: ms(r.range(50, 5000)),
            max_waiters: r.range(1, 4) as usize,
            command_timeout: ms(r.range(100, 3000)),
            close_grace: ms(r.range(100, 3000)),
            ..Config::default()
        };
        // Sometimes a tiny memory of ended calls, so that forgetting them is exercised.
        config.limits.remembered_ended_calls = if r.chance(300) {
            r.range(1, 8) as usize
        } else {
            4096
        };
        // A fault is off entirely in a third of the seeds, else up to its cap.
        let mut rate = |cap: u64| -> u32 {
            if r.below(3) == 0 {
                0
            } else {
                r.range(1, cap) as u32
            }
        };
        let start_fail = rate(200);
        let start_hang = rate(60);
        let upload_fail = rate(250);
        let upload_gone = rate(40);
        let upload_hang = rate(60);
        let stop_fail = rate(200);
        let snapshot = rate(900);
        let persist_fail = rate(200);
        let shutdown_fail = rate(150);
        let command_hang = rate(60);
        let late_answer = rate(500);
        let duplicate = rate(50);
        let steps = r.range(50, 600) as usize;
        let close_at = r.chance(450).then(|| r.below(steps as u64) as usize);
        let mut w = |lo: u64, hi: u64| r.range(lo, hi) as u32;
        let weights = [
            w(5, 40),  // acquire
            w(5, 40),  // release
            w(5, 60),  // flush
            w(0, 10),  // resolve
            w(0, 10),  // hold
            w(0, 10),  // unhold
            w(20, 80), // answer
            w(0, 6),   // die
            w(10, 50), // advance
            w(0, 4),   // misuse
        ];
        let mut swarm = Swarm {
            close_deadline: ms(r.range(10, 3000)),
            steps,
            close_at,
            sessions: r.range(1, 6) as u32,
            users: r.range(1, 3) as u32,
            externals: if r.chance(300) {
                r.range(1, 2) as u32
            } else {
                0
            },
            paths: r.range(1, 3) as u32,
            max_live: r.range(1, 10) as usize,
            weights,
            external_rate: r.range(50, 400) as u32,
            start_fail,
            start_hang,
            upload_fail,
            upload_gone,
            upload_hang,
            stop_fail,
            snapshot,
            persist_fail,
            shutdown_fail,
            command_hang,
            late_answer,
            duplicate,
            latency_ms: r.range(1, 2500),
            jump_ms: r.range(1, 3000),
            hook_fail: 0,
            hook_hang: 0,
            config,
        };
        // Hooks (issue 14) in two fifths of the seeds, drawn last: a seed without them plays
        // as before.
        if r.chance(400) {
            let mut hook = || r.chance(700).then(|| ms(r.range(10, 2000)));
            let hooks = Hooks {
                after_start: hook(),
                after_resume: hook(),
                before_suspend: hook(),
                before_stop: hook(),
                on_suspend_failure: if r.chance(500) {
                    SuspendHookFailure::Shutdown
                } else {
                    SuspendHookFailure::Suspend
                },
            };
            swarm.config.hooks = hooks;
            swarm.hook_fail = r.range(0, 300) as u32;
            swarm.hook_hang = r.range(0, 100) as u32;
        }
        swarm
    }
}

impl fmt::Display for Swarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        write!(
            f,
            "scope={:?} same-key={:?} release={:?} start-timeout={:?} upload-timeout={:?} retries={} \
             drain={:?} wait={:?} max-waiters={} command-timeout={:?} close-grace={:?} close={:?}@{:?} | \
             steps={} sessions={} users={} externals={} paths={} max-live={} weights={:?} | \
             faults/1000: start-fail={} start-hang={} upload-fail={} upload-gone={} upload-hang={} \
             stop-fail={} snapshot={} persist-fail={} shutdown-fail={} command-hang={} late={} dup={} \
             latency<={}ms jump<={}ms | hooks={:?} hook-fail={} hook-hang={}",
            c.scope,
            c.same_key,
            c.release,
            c.start_timeout,
            c.upload_timeout,
            c.upload_retries,
            c.drain_deadline,
            c.wait_timeout,
            c.max_waiters,
            c.command_timeout,
            c.close_grace,
            self.close_deadline,
            self.close_at,
            self.steps,
            self.sessions,
            self.users,
            self.externals,
            self.paths,
            self.max_live,
            self.weights,
            self.start_fail,
            self.start_hang,
            self.upload_fail,
            self.upload_gone,
            self.upload_hang,
            self.stop_fail,
            self.snapshot,
            self.persist_fail,
            self.shutdown_fail,
            self.command_hang,
            self.late_answer,
            self.duplicate,
            self.latency_ms,
            self.jump_ms,
            c.hooks,
            self.hook_fail,
            self.hook_hang,
        )
    }
}
