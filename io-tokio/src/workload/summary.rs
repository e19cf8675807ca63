//! [`Summary`]: what a workload run measured and checked, and how it is printed.

use std::collections::BTreeMap;

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
