//! Two hosts on one machine: two `harness-pg` processes, each with its own local root, one
//! throwaway PostgreSQL (the fleet's store) and one moto S3 bucket (the shelf), all started
//! here and stopped after. Host `a` runs alone until it was told of 24 uploads, `b` joins
//! wanting the same users' keys, and `a` is killed with SIGKILL mid-run. `b` takes over `a`'s
//! keys once `a`'s lease expired: a key `a` had suspended resumes on `b` from the shelf; a key
//! whose warm sandbox is on `a`'s root is never taken for gone (its calls fail on `b`, its record
//! keeps naming the sandbox). Host `a` restarts on its own root and continues its keys. Then
//! `harness-pg --verify` checks the whole fleet from the three ledgers: every session's last
//! acknowledged version is where its key continues (on a root, or on the shelf), nothing is
//! leaked, no sandbox changed by two tokens out of order.
//!
//! Real time (the lease is 1.5 s): the waits are bounded polls for what the processes write,
//! never fixed sleeps.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::process::Command;

use sandkeeper_pg::throwaway::Throwaway;
use sandkeeper_snapshots::moto::Moto;
use sandkeeper_tokio::workload::child::{fleet_row, lines, ran, until, HarnessChild};

const LEASE_MS: &str = "1500";

/// What every `harness-pg` of the test is given: the store, the shelf and its credentials.
struct Fleet {
    store: String,
    shelf: String,
    env: Vec<(String, String)>,
}

impl Fleet {
    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness-pg"));
        cmd.args(["--store", &self.store, "--snapshots", &self.shelf])
            .args(["--lease-ms", LEASE_MS])
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// A host's `harness-pg`. Its sessions wait `think_ms` between calls: a key wanted
    /// elsewhere is handed over only once its calls here have all ended, so a host whose
    /// sessions never pause would keep its keys from the other one until it finished.
    fn host(
        &self,
        root: &Path,
        replica: &str,
        calls: usize,
        think_ms: u64,
        ledger: &Path,
    ) -> HarnessChild {
        let mut cmd = self.command();
        cmd.arg("--root")
            .arg(root)
            .args(["--replica", replica])
            .args(["--think-ms", &think_ms.to_string()])
            .args(["--suspend", "--death-rate", "0", "--quiet"])
            .args(["--sessions", "8", "--users", "4", "--concurrency", "8"])
            .args(["--calls", &calls.to_string(), "--turns", "3"])
            .arg("--ledger")
            .arg(ledger);
        HarnessChild::spawn(cmd)
    }

    /// `harness-pg --verify` over the roots and the ledgers: its report, after it succeeded.
    fn verified(&self, roots: &[&Path], ledgers: &[&Path]) -> String {
        let mut cmd = self.command();
        for root in roots {
            cmd.arg("--root").arg(root);
        }
        cmd.arg("--verify").args(ledgers);
        ran(cmd)
    }
}

#[test]
fn a_host_killed_mid_run_loses_nothing_its_keys_move_through_the_shelf() {
    let dir = std::env::temp_dir().join(format!("sk-two-hosts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pg = Throwaway::start().expect("a throwaway PostgreSQL");
    let moto = Moto::start("fleet");
    let fleet = Fleet {
        store: pg.connection_string(),
        shelf: moto.url("snapshots"),
        env: moto.environment(),
    };
    let (root_a, root_b): (PathBuf, PathBuf) = (dir.join("host-a"), dir.join("host-b"));
    let ledger = |name: &str| -> PathBuf { dir.join(format!("ledger-{name}.jsonl")) };
    let (la, lb, la2) = (ledger("a"), ledger("b"), ledger("a2"));

    // a runs alone until it was told of 24 uploads; b joins, wanting the same users' keys,
    // and runs until it was told of 24 of its own (keys moved from a to b through the shelf,
    // in the pauses between a's calls: 400 calls with 100 ms between them outlast this).
    let mut a = fleet.host(&root_a, "a", 400, 100, &la);
    let ia = a.incarnation();
    until("a made no progress", || {
        if a.child.try_wait().unwrap().is_some() {
            panic!("a ended early:\n{}", a.output());
        }
        lines(&la) >= 24
    });
    let mut b = fleet.host(&root_b, "b", 30, 0, &lb);
    let ib = b.incarnation();
    assert_ne!(ia, ib);
    until("b made no progress", || {
        if a.child.try_wait().unwrap().is_some() {
            panic!("a ended before the kill:\n{}", a.output());
        }
        lines(&lb) >= 24
    });
    // Then a is killed mid-run: no close, no release, no last renewal. Its keys go to b once
    // its lease expired: a suspended one resumes on b from the shelf; one whose warm sandbox is
    // on a's root fails its calls on b and stays named in its record, never taken for gone.
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    let survivor = b.succeeded();
    assert!(survivor.contains("all checks passed"), "{survivor}");
    let row_b = fleet_row(&survivor);
    assert!(
        row_b["resumed"] > 0,
        "keys moved to b through the shelf: {row_b:?}"
    );

    // Host a comes back on its own root: it continues what b left suspended (from the shelf)
    // and adopts what is warm on its own disk.
    let mut a2 = fleet.host(&root_a, "a2", 3, 0, &la2);
    assert!(a2.incarnation() > ia.max(ib));
    let restarted = a2.succeeded();
    assert!(restarted.contains("all checks passed"), "{restarted}");
    let row_a2 = fleet_row(&restarted);
    assert!(row_a2["resumed"] + row_a2["adopted"] > 0, "{row_a2:?}");

    let report = fleet.verified(&[&root_a, &root_b], &[&la, &lb, &la2]);
    assert!(
        report.contains("a-session-000's last acknowledged"),
        "{report}"
    );
    assert!(report.contains("nothing is leaked"), "{report}");
    drop(moto);
    drop(pg);
    std::fs::remove_dir_all(&dir).unwrap();
}
