//! [`WorkloadOptions`]: the shape of a workload run (also the harness binaries' flags).

use std::time::Duration;

use sandkeeper::ReleasePolicy;

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
    /// Keep a user's sandbox warm this many milliseconds after its last call (0: shut down).
    #[arg(long, default_value_t = 0)]
    pub warm_ms: u64,
    /// Suspend a user's sandbox after its last call instead of shutting it down: stopped and
    /// persisted, kept by the backend, resumed by the user's next call. Not with `--warm-ms`.
    #[arg(long)]
    pub suspend: bool,
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
    /// Checks that sessions, users, calls and concurrency are at least 1, and that at most one
    /// release policy is asked for.
    pub fn check(&self) -> Result<(), super::WorkloadError> {
        if self.sessions == 0 || self.users == 0 || self.calls == 0 || self.concurrency == 0 {
            Err(super::WorkloadError::Options)
        } else if self.suspend && self.warm_ms > 0 {
            Err(super::WorkloadError::ReleasePolicies)
        } else {
            Ok(())
        }
    }

    /// The release policy the workload's core runs with: `Suspend` with `--suspend`,
    /// `KeepWarm` with `--warm-ms`, else `Shutdown`. A backend that must know the policy (the
    /// Kubernetes one) takes this same value.
    pub fn release_policy(&self) -> ReleasePolicy {
        if self.suspend {
            ReleasePolicy::Suspend
        } else if self.warm_ms > 0 {
            ReleasePolicy::KeepWarm {
                idle: Duration::from_millis(self.warm_ms),
            }
        } else {
            ReleasePolicy::Shutdown
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
        let both = parse(&["harness", "--suspend", "--warm-ms", "250"]);
        assert!(matches!(
            both.check(),
            Err(crate::workload::WorkloadError::ReleasePolicies)
        ));
    }
}
