//! [`Summary`]: what a workload run measured and checked, and how it is printed.

use std::collections::BTreeMap;
use std::time::Duration;

use sandkeeper::{CloseReport, Stats};

use super::after_close::Checked;
use super::{percentiles, FleetOptions, Ran, WorkloadOptions, WorkloadTarget};
use crate::{Keeper, Tally};

/// The outcome of one workload run.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The first line: the workload's shape.
    pub header: String,
    /// The table: (name, value) rows.
    pub rows: Vec<(String, String)>,
    /// The core's counters after close.
    pub stats: Stats,
    /// The settlement tally after close.
    pub tally: Tally,
    /// What close did.
    pub close: CloseReport,
    /// Checks that passed.
    pub passed: u64,
    /// Checks that failed, each described.
    pub failures: Vec<String>,
}

impl Summary {
    /// Every check passed.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Every call ended exactly once (released, failed or revoked).
    pub fn calls_all_ended(&self) -> bool {
        self.stats.calls_acquired
            == self.stats.calls_released + self.stats.calls_failed + self.stats.calls_revoked
    }

    /// Every flushed version settled exactly once.
    pub fn versions_all_settled(&self) -> bool {
        self.tally.settled_total() == self.stats.versions_flushed
    }

    /// The numbers of row `row` of a printed summary ([`print`](Self::print)), each by the word
    /// after it: `0 failed,` is `("failed", 0)`, `(12 waits` is `("waits", 12)`. For what runs
    /// a harness binary and reads its output (the fleet tests). `None`: no such row.
    pub fn figures_of(printed: &str, row: &str) -> Option<BTreeMap<String, u64>> {
        let line = printed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(row))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut out = BTreeMap::new();
        for pair in words.windows(2) {
            if let Ok(n) = pair[0].trim_start_matches('(').parse::<u64>() {
                out.insert(pair[1].trim_end_matches(',').to_string(), n);
            }
        }
        Some(out)
    }

    /// Prints the summary table and the verdict on standard output.
    pub fn print(&self) {
        println!();
        println!("{}", self.header);
        println!("{}", "-".repeat(72));
        for (name, value) in &self.rows {
            println!("{name:<24} {value}");
        }
        println!("{}", "-".repeat(72));
        if self.failures.is_empty() {
            println!("all checks passed");
        } else {
            for f in &self.failures {
                println!("FAILED: {f}");
            }
        }
    }
}

/// The summary of the run `ran` on `keeper` (fleet `replica`, if any) and of its checks.
pub(super) fn summarize<B: WorkloadTarget>(
    keeper: &Keeper<B>,
    args: &WorkloadOptions,
    fleet: Option<&FleetOptions>,
    replica: Option<&str>,
    ran: &Ran,
    checked: Checked,
) -> Summary {
    let (records, timeline, report) = (&ran.records, &ran.timeline, &ran.report);
    let (workload, close_took) = (ran.workload, ran.close_took);
    let Checked {
        stats,
        tally,
        passed,
        failures,
        credentials,
        checkpoints,
        logs_verified,
        snapshots_left,
    } = checked;
    // On a shared root, what is left and the snapshots are the whole fleet's.
    let local = keeper.backend().as_local().filter(|_| fleet.is_none());
    let mut release: Vec<Duration> = records
        .values()
        .flat_map(|r| r.release_latencies.clone())
        .collect();
    let mut settle = timeline.settle_latencies.clone();
    let calls_ok: u64 = records.values().map(|r| r.calls_ok).sum();
    let calls_failed: u64 = records.values().map(|r| r.calls_failed).sum();
    let bus: u64 = records.values().map(|r| r.bus_writes).sum();
    let mut operations: BTreeMap<&'static str, u64> = BTreeMap::new();
    for r in records.values() {
        for (k, n) in &r.operations {
            *operations.entry(k).or_default() += n;
        }
    }
    let operations = operations
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");

    let mut header = format!(
        "sandkeeper harness: {} sessions, {} users, {} calls each, {} turns per call, seed {}",
        args.sessions, args.users, args.calls, args.turns, args.seed
    );
    if let (Some(replica), Some(incarnation)) = (replica, keeper.incarnation()) {
        header.push_str(&format!(
            ", fleet replica {replica} (incarnation {incarnation})"
        ));
    }
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |name: &str, value: String| rows.push((name.to_string(), value));
    if local.is_none() {
        row("backend", keeper.backend().kind().to_string());
    }
    row("isolation", keeper.backend().isolation());
    if let Some(limits) = keeper.backend().limits() {
        row("limits", limits);
    }
    row(
        "workload time",
        format!("{:.2?} (close {:.2?})", workload, close_took),
    );
    row(
        "calls",
        format!(
            "{} acquired, {} ready, {} failed, {} released, {} revoked",
            stats.calls_acquired, calls_ok, calls_failed, stats.calls_released, stats.calls_revoked
        ),
    );
    row(
        "sandboxes",
        format!(
            "{} started, {} shut down, {} suspended, {} revived (warm or draining), {} died, {} \
             unconfirmed",
            stats.starts_ordered,
            stats.shutdowns_ok,
            stats.suspended,
            stats.revivals,
            stats.deaths,
            stats.shutdowns_unconfirmed
        ),
    );
    row(
        "tiers",
        format!(
            "{} warm hits, {} suspended, {} resumed, {} snapshots discarded at their retention's end",
            stats.revivals, stats.suspended, stats.resumes_ordered, stats.discards
        ),
    );
    row(
        "mirror",
        format!(
            "{} versions flushed, {} uploads ordered, {} uploaded, {} superseded, {} dropped",
            stats.versions_flushed,
            stats.uploads_ordered,
            tally.uploaded,
            tally.superseded,
            tally.dropped_total()
        ),
    );
    let reasons = if tally.dropped.is_empty() {
        "none".to_string()
    } else {
        tally
            .dropped
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    row("drops by reason", reasons);
    if fleet.is_some() {
        row(
            "fleet",
            format!(
                "{} keys claimed ({} waits for another owner), {} adopted, {} resumed, {} handed \
                 over, {} released, {} fenced, {} lease lapses, {} records written",
                stats.claims_ok,
                stats.claims_busy,
                stats.adoptions_ordered,
                stats.resumes_ordered,
                stats.handovers,
                stats.keys_released,
                stats.fences,
                stats.lease_lapses,
                stats.records_ok
            ),
        );
    }
    row(
        "hooks",
        format!(
            "{} ordered: {} ok, {} failed, {} late; {credentials} calls found their sandbox's \
             own credential; {checkpoints} resumes found their checkpoint",
            stats.hooks_ordered, stats.hooks_ok, stats.hooks_failed, stats.hooks_late
        ),
    );
    row(
        "context-free writes",
        format!("{bus} through session work (in the session's own sandbox)"),
    );
    row("operations", operations);
    row("release latency", percentiles(&mut release));
    row("drain (flush→settled)", percentiles(&mut settle));
    row(
        "drains announced",
        format!("{} (notices lagged: {})", timeline.drains, timeline.lagged),
    );
    row(
        "close",
        format!(
            "{} shut down, {} revoked calls, {} dropped versions, {} snapshots kept ({} until a retention ends)",
            report.shut_down,
            report.revoked_calls.len(),
            report.dropped_versions.len(),
            report.retained.len(),
            report.retained.iter().filter(|r| r.until.is_some()).count()
        ),
    );
    row(
        "invariant checks",
        format!("{passed} passed, {} failed", failures.len()),
    );
    if let Some(local) = local {
        row(
            "session logs checked",
            format!("{logs_verified} session logs in {snapshots_left} snapshots (one per key) hold the last uploaded version"),
        );
        row(
            "files",
            format!(
                "{} (a stopped sandbox's workspace is renamed to its snapshot)",
                local.root().display()
            ),
        );
        row(
            "snapshots",
            format!(
                "{}/sbx-<n>-<instance>/.sandkeeper/<session>/session.log",
                local.snapshots_dir().display()
            ),
        );
    }
    Summary {
        header,
        rows,
        stats,
        tally,
        close: report.clone(),
        passed,
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_row_gives_its_numbers_by_the_word_after_each() {
        let printed = "calls                    48 acquired, 48 ready, 0 failed, 48 released\n\
                       fleet                    4 keys claimed (20 waits for another owner), 2 adopted\n";
        let calls = Summary::figures_of(printed, "calls").unwrap();
        assert_eq!((calls["acquired"], calls["failed"]), (48, 0));
        let fleet = Summary::figures_of(printed, "fleet").unwrap();
        assert_eq!(
            (fleet["keys"], fleet["waits"], fleet["adopted"]),
            (4, 20, 2)
        );
        assert!(Summary::figures_of(printed, "mirror").is_none());
    }
}
