//! [`WorkloadOptions`]: the shape of a workload run (also the harness binaries' flags).

use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{Handover, ReleasePolicy, SessionId, Tiers, WayDown};

/// The shape of a harness workload run. With clap, `#[command(flatten)]` it into a binary's
/// arguments.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct WorkloadOptions {
    /// Sessions (conversations).
    #[arg(long, default_value_t = 64)]
    pub sessions: usize,
    /// Users; sessions are spread over them, and a user's calls share one sandbox.
    #[arg(long, default_value_t = 12)]
    pub users: usize,
    /// Calls per session, one after another.
    #[arg(long, default_value_t = 6)]
    pub calls: usize,
    /// Turns per call (each appends a JSON line to the session log and flushes it).
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Sessions running at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Chance that a call's sandbox is killed from outside during the call.
    #[arg(long, default_value_t = 0.03)]
    pub death_rate: f64,
    /// Keep a user's sandbox warm this many milliseconds after its last call (0: no warm tier).
    /// Then it goes the Shutdown way, or with `--suspend` the Suspend way (idle-pause).
    #[arg(long, default_value_t = 0)]
    pub warm_ms: u64,
    /// Suspend a user's sandbox after its last call (after `--warm-ms`, when given) instead of
    /// shutting it down: stopped and persisted, kept by the backend, resumed by the user's next
    /// call.
    #[arg(long)]
    pub suspend: bool,
    /// Keep a user's snapshot (a suspended sandbox, or what a Stop kept) this many milliseconds
    /// for the user's next call, then discard it (0: until the next call).
    #[arg(long, default_value_t = 0)]
    pub retain_ms: u64,
    /// Wait this many milliseconds between a session's calls, as a user reading an answer
    /// does (0: the next call at once). In a fleet, a key another process wants is handed
    /// over only once its calls here have all ended, so a session that never pauses keeps its
    /// user's key from the other process for as long as it runs.
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
    /// The seed of the workload's choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Close deadline, in seconds.
    #[arg(long, default_value_t = 5)]
    pub close_deadline: u64,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl WorkloadOptions {
    /// Checks that sessions, users, calls and concurrency are at least 1.
    pub fn check(&self) -> Result<(), super::WorkloadError> {
        if self.sessions == 0 || self.users == 0 || self.calls == 0 || self.concurrency == 0 {
            Err(super::WorkloadError::Options)
        } else {
            Ok(())
        }
    }

    /// The release policy the workload's core runs with, by its common name where it has one:
    /// `Shutdown` (no flag), `KeepWarm` (`--warm-ms`), `Suspend` (`--suspend`), and the tiers
    /// otherwise (`--warm-ms` with `--suspend`: idle-pause; `--retain-ms`: a retention).
    pub fn release_policy(&self) -> ReleasePolicy {
        let idle = Duration::from_millis(self.warm_ms);
        match (self.warm_ms, self.suspend, self.retain_ms) {
            (0, false, 0) => ReleasePolicy::Shutdown,
            (_, false, 0) => ReleasePolicy::KeepWarm { idle },
            (0, true, 0) => ReleasePolicy::Suspend,
            (_, suspend, retain) => ReleasePolicy::Tiered(Tiers {
                idle,
                then: if suspend {
                    WayDown::Suspend
                } else {
                    WayDown::Shutdown
                },
                retain: (retain > 0).then(|| Duration::from_millis(retain)),
            }),
        }
    }
}

/// What one process of a fleet adds to a workload run ([`run_fleet`](super::run_fleet)). With
/// clap, `#[command(flatten)]` it beside [`WorkloadOptions`]; the harness binaries use it only
/// in fleet mode.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct FleetOptions {
    /// This process's name in the fleet: its sessions are `<replica>-session-<n>`, while the
    /// users (whose keys the processes share) are the same in every process.
    #[arg(long, default_value = "r0")]
    pub replica: String,
    /// The process lease, in milliseconds (renewals every third of it, a fifth as margin).
    #[arg(long, default_value_t = 3_000)]
    pub lease_ms: u64,
    /// Append each session-log version the backend acknowledged to this file, one JSON line
    /// each (`session`, `user`, `version`, `sandbox`, `log`), as it is acknowledged, so that
    /// what a process killed mid-run was told is known afterwards (`harness --verify`).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// How a key another process wants leaves this one (the core's `Fleet::handover`): warm
    /// where every process reaches every sandbox (one root), suspended where each host has
    /// its own root (`harness-pg` sets it). Not a flag: the backend decides.
    #[arg(skip)]
    pub handover: Handover,
}

impl FleetOptions {
    /// The process lease.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// Checks that the replica's name makes valid session names and the lease is at least
    /// 100 ms.
    pub fn check(&self) -> Result<(), super::WorkloadError> {
        SessionId::new(format!("{}-session-0", self.replica))
            .map_err(|e| super::WorkloadError::Fleet(format!("--replica: {e}")))?;
        if self.lease_ms < 100 {
            return Err(super::WorkloadError::Fleet(format!(
                "--lease-ms {} is below 100",
                self.lease_ms
            )));
        }
        Ok(())
    }
}

impl FleetOptions {
    /// Checks that a ledger is asked for only without deaths: a death loses what its sandbox
    /// held, acknowledged versions included, so the fleet's check of the ledgers could not
    /// hold.
    pub fn check_ledger(&self, workload: &WorkloadOptions) -> Result<(), super::WorkloadError> {
        match &self.ledger {
            Some(_) if workload.death_rate > 0.0 => Err(super::WorkloadError::Fleet(format!(
                "--ledger needs --death-rate 0 (it is {}): a death loses its sandbox's workspace, \
                 acknowledged versions included",
                workload.death_rate
            ))),
            _ => Ok(()),
        }
    }
}

impl Default for FleetOptions {
    /// The binaries' defaults.
    fn default() -> Self {
        FleetOptions {
            replica: "r0".to_string(),
            lease_ms: 3_000,
            ledger: None,
            handover: Handover::Warm,
        }
    }
}

impl Default for WorkloadOptions {
    /// The binaries' defaults.
    fn default() -> Self {
        WorkloadOptions {
            sessions: 64,
            users: 12,
            calls: 6,
            turns: 4,
            concurrency: 32,
            death_rate: 0.03,
            warm_ms: 0,
            suspend: false,
            retain_ms: 0,
            think_ms: 0,
            seed: 1,
            close_deadline: 5,
            quiet: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        options: WorkloadOptions,
    }

    #[test]
    fn default_is_the_flags_defaults() {
        let parsed = Wrap::parse_from(["harness"]).options;
        assert_eq!(parsed, WorkloadOptions::default());
        let fleet = WrapFleet::parse_from(["harness"]).fleet;
        assert_eq!(fleet, FleetOptions::default());
        assert!(fleet.check().is_ok());
    }

    #[derive(Parser)]
    struct WrapFleet {
        #[command(flatten)]
        fleet: FleetOptions,
    }

    #[test]
    fn a_fleet_replica_needs_a_valid_name_and_a_real_lease() {
        let parse = |args: &[&str]| WrapFleet::parse_from(args).fleet;
        let bad_name = parse(&["harness", "--replica", "a/b"]).check().unwrap_err();
        assert!(bad_name.to_string().contains("--replica"), "{bad_name}");
        let short = parse(&["harness", "--lease-ms", "50"]).check().unwrap_err();
        assert!(short.to_string().contains("--lease-ms 50"), "{short}");
        assert!(parse(&["harness", "--replica", "b", "--lease-ms", "1500"])
            .check()
            .is_ok());
        let ledger = parse(&["harness", "--ledger", "/tmp/l.jsonl"]);
        let deaths = WorkloadOptions::default();
        let refused = ledger.check_ledger(&deaths).unwrap_err();
        assert!(refused.to_string().contains("--death-rate 0"), "{refused}");
        let none = WorkloadOptions {
            death_rate: 0.0,
            ..deaths.clone()
        };
        assert!(ledger.check_ledger(&none).is_ok());
        assert!(parse(&["harness"]).check_ledger(&deaths).is_ok());
    }

    #[test]
    fn one_release_policy_from_the_flags() {
        let parse = |args: &[&str]| Wrap::parse_from(args).options;
        assert_eq!(
            parse(&["harness"]).release_policy(),
            ReleasePolicy::Shutdown
        );
        assert_eq!(
            parse(&["harness", "--warm-ms", "250"]).release_policy(),
            ReleasePolicy::KeepWarm {
                idle: Duration::from_millis(250)
            }
        );
        let suspend = parse(&["harness", "--suspend"]);
        assert_eq!(suspend.release_policy(), ReleasePolicy::Suspend);
        assert!(suspend.check().is_ok());
        let tiers = parse(&[
            "harness",
            "--suspend",
            "--warm-ms",
            "250",
            "--retain-ms",
            "900",
        ]);
        assert!(tiers.check().is_ok());
        assert_eq!(
            tiers.release_policy(),
            ReleasePolicy::Tiered(Tiers {
                idle: Duration::from_millis(250),
                then: WayDown::Suspend,
                retain: Some(Duration::from_millis(900)),
            })
        );
        assert_eq!(
            parse(&["harness", "--retain-ms", "900"]).release_policy(),
            ReleasePolicy::Tiered(Tiers {
                idle: Duration::ZERO,
                then: WayDown::Shutdown,
                retain: Some(Duration::from_millis(900)),
            })
        );
    }
}
