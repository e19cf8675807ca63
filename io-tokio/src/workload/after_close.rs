//! The checks after a workload's keeper closed: the core's invariants, every call and version
//! ended once, nothing left behind, each session's tools and writes in its own sandbox, each
//! call's credential its own sandbox's, and on the local backend each snapshot's session logs
//! the last versions uploaded into the sandbox that left it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use sandkeeper::{PathName, SandboxId, SessionId, Settlement, Stats, Version};

use super::{FleetOptions, Ran, WorkloadError, WorkloadTarget};
use crate::{Keeper, Tally};

/// What the checks after close found, for the summary.
pub(super) struct Checked {
    /// The core's counters after close.
    pub(super) stats: Stats,
    /// The settlement tally after close.
    pub(super) tally: Tally,
    /// Checks passed, those of the run included.
    pub(super) passed: u64,
    /// Checks failed, each described.
    pub(super) failures: Vec<String>,
    /// Calls that found their own sandbox's credential.
    pub(super) credentials: u64,
    /// Resumes that found their checkpoint.
    pub(super) checkpoints: u64,
    /// Session logs in snapshots that hold the last version uploaded (local backend).
    pub(super) logs_verified: u64,
    /// Snapshots left (local backend).
    pub(super) snapshots_left: u64,
}

/// Checks what the run `ran` on `keeper` left, once it closed.
pub(super) async fn check<B: WorkloadTarget>(
    keeper: &Keeper<B>,
    fleet: Option<&FleetOptions>,
    ran: &Ran,
    checkpoints: &AtomicU64,
) -> Result<Checked, WorkloadError> {
    let mut failures: Vec<String> = Vec::new();
    let mut passed = ran.passed;
    let (records, report) = (&ran.records, &ran.report);
    let mut check = |ok: bool, what: String| {
        if ok {
            passed += 1;
        } else {
            failures.push(what);
        }
    };
    check(
        keeper.check_invariants().is_ok(),
        format!(
            "core invariants after close: {:?}",
            keeper.check_invariants()
        ),
    );
    let stats = keeper.stats();
    let tally = keeper.tally();
    check(
        stats.calls_acquired == stats.calls_released + stats.calls_failed + stats.calls_revoked,
        "every call ended exactly once".into(),
    );
    check(
        tally.settled_total() == stats.versions_flushed,
        format!(
            "every flushed version settled exactly once ({} of {})",
            tally.settled_total(),
            stats.versions_flushed
        ),
    );
    // On a shared root, what is left and the snapshots are the whole fleet's: checked once
    // every process ended (`verify_local_fleet`).
    let local = keeper.backend().as_local().filter(|_| fleet.is_none());
    if let Some(local) = local {
        let left = local.sandbox_dirs_present()?;
        // A stopped sandbox's workspace became its snapshot (a rename), a suspended one's too:
        // no sandbox directory remains.
        check(
            left.is_empty(),
            format!("no sandbox directory remains ({} left)", left.len()),
        );
    }
    check(
        report.unconfirmed.is_empty(),
        format!("every shutdown confirmed ({:?})", report.unconfirmed),
    );
    let mismatches: u64 = records.values().map(|r| r.tool_mismatches).sum();
    check(
        mismatches == 0,
        format!("every tool file read back holds its own session's name ({mismatches} did not)"),
    );
    let misroutes: u64 = records.values().map(|r| r.bus_misroutes).sum();
    check(
        misroutes == 0,
        format!("context-free writes landed in their own session's sandbox ({misroutes} did not)"),
    );
    let credentials: u64 = records.values().map(|r| r.credentials_current).sum();
    let killed: BTreeSet<SandboxId> = records.values().flat_map(|r| r.killed.clone()).collect();
    let missing = records.values().flat_map(|r| r.credentials_missing.iter());
    let wrong: u64 = records.values().map(|r| r.credentials_wrong).sum::<u64>()
        + missing.filter(|x| !killed.contains(x)).count() as u64;
    check(
        wrong == 0 && credentials > 0,
        format!(
            "every call found the credential its own sandbox's after-start or after-resume hook \
             wrote ({credentials} did, {wrong} did not)"
        ),
    );
    let checkpoints = checkpoints.load(Ordering::Relaxed);

    // A fleet's process owns its keys only for a while, and its backend's close deletes
    // nothing: the single-owner checks do not hold there, the fleet's own do.
    let backend_checks = match (fleet, keeper.incarnation()) {
        (Some(_), Some(incarnation)) => keeper.backend().after_fleet_close(incarnation).await,
        _ => keeper.backend().after_close().await,
    };
    for (ok, what) in backend_checks {
        check(ok, what);
    }

    // Only the latest snapshot of each key remains (a start takes its key's snapshot, a
    // retention that ends discards it), and each holds, for every session log in it, the last
    // version uploaded into the sandbox that left it (or, for a session that wrote nothing
    // into that one, a version uploaded earlier along the key's sandboxes).
    let timeline = &ran.timeline;
    check(
        timeline.settled_twice == 0,
        "no version settled twice".into(),
    );
    if let Some(e) = &timeline.ledger_error {
        check(false, format!("the ledger was written: {e}"));
    }
    let mut logs_verified = 0u64;
    let mut snapshots_left = 0u64;
    if let Some(local) = local {
        let mut last_into: BTreeMap<(SandboxId, SessionId), Version> = BTreeMap::new();
        let mut uploaded: BTreeSet<(SessionId, Version)> = BTreeSet::new();
        for ((session, path, version), outcome) in &timeline.settled {
            if let Settlement::Uploaded { sandbox } = outcome {
                if *path == PathName::session_log() {
                    let slot = last_into
                        .entry((*sandbox, session.clone()))
                        .or_insert(*version);
                    *slot = (*slot).max(*version);
                    uploaded.insert((session.clone(), *version));
                }
            }
        }
        let content = |session: &SessionId, version: &Version| {
            records
                .get(session)
                .and_then(|r| r.versions.get(version))
                .cloned()
        };
        let mut keys = BTreeSet::new();
        for snapshot in local.snapshot_dirs_present()? {
            snapshots_left += 1;
            let meta = snapshot.join(".sandkeeper");
            // Whose it is, as the keeper recorded it (outside the workspace).
            let name = snapshot.file_name().unwrap_or_default().to_string_lossy();
            let record = local.snapshot_record(&sandkeeper::Snapshot::new(name));
            let Ok(Some(record)) = record else {
                check(
                    false,
                    format!("{} has a keeper record ({record:?})", snapshot.display()),
                );
                continue;
            };
            let (key, by) = (record.taken_from.key.as_str(), record.taken_from.sandbox);
            check(
                keys.insert(key.to_string()),
                format!("one snapshot of key {key} ({})", snapshot.display()),
            );
            for (session, record) in records {
                let file = meta.join(session.as_str()).join("session.log");
                let Ok(on_disk) = std::fs::read_to_string(&file) else {
                    continue;
                };
                let holds = match last_into.get(&(SandboxId(by), session.clone())) {
                    Some(version) => content(session, version).as_deref() == Some(&on_disk),
                    None => record.versions.iter().any(|(v, text)| {
                        *text == on_disk && uploaded.contains(&(session.clone(), *v))
                    }),
                };
                logs_verified += u64::from(holds);
                check(
                    holds,
                    format!(
                        "{} holds the last version uploaded into sbx-{by}",
                        file.display()
                    ),
                );
            }
        }
    }
    for (session, record) in records {
        if let Some((last, _)) = record.versions.iter().next_back() {
            let outcome = timeline
                .settled
                .get(&(session.clone(), PathName::session_log(), *last));
            check(
                matches!(
                    outcome,
                    Some(Settlement::Uploaded { .. } | Settlement::Dropped { .. })
                ),
                format!("{session}'s last log version {last} was uploaded or reported dropped ({outcome:?})"),
            );
        }
    }
    Ok(Checked {
        stats,
        tally,
        passed,
        failures,
        credentials,
        checkpoints,
        logs_verified,
        snapshots_left,
    })
}
