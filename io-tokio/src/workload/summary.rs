//! [`Summary`]: what a workload run measured and checked, and how it is printed.

use sandkeeper::{CloseReport, Stats};

use crate::Tally;

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
