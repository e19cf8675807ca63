//! The fleet's own checks of a workload run on one namespace, once every process ended: what
//! no single process can see. The Kubernetes twin of
//! `sandkeeper_tokio::workload::verify_local_fleet`.
//!
//! [`verify_fleet`] is a library function, not a `harness-k8s --verify` flag, because one of
//! its checks cannot be made over the API: whether each session's last acknowledged log
//! version is in its user's recorded sandbox needs the workspace's files, and a recorded
//! sandbox is mostly a suspended claim, which has no pod to exec into (resuming it to look
//! would change what is checked). The caller reads the files (`read_file`): a test against
//! the loopback API reads the pod's host directory (`k8s_loopback::Loopback::pod_path`), which
//! outlives a suspended Sandbox's pod as its claim volume would. The other check no API call
//! gives, that no sandbox was changed by two tokens out of order, reads the API server's audit
//! log of the token annotation (`fence.rs`), which the loopback keeps in process
//! (`Store::annotation_audit`); the tests check it there.
//!
//! Over the API it checks:
//! - no key is held by a live process (every process ended, or released what it held);
//! - every object a key's record references is there (the sweep removed nothing referenced);
//! - nothing is leaked: after one [`K8sStore::sweep`], every claim or pod left is referenced
//!   by a key's record, or was made by a process the sweep still counts as live (a lease
//!   later than a claim would, as every sweep judges). An unrecorded suspended claim is
//!   leaked too, although the sweep keeps it until its `shutdownTime` (its retention, or the
//!   backstop): in a fleet whose processes ended, every suspended claim is some key's record;
//! - with the ledgers of the processes (`harness-k8s --fleet --ledger FILE`), every session's
//!   last acknowledged session-log version is in its user's recorded sandbox (the log there
//!   starts with it: a later version of the same log, whose acknowledgement a killed process
//!   never saw, may have landed after it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use sandkeeper::PathName;
use sandkeeper_tokio::store::unix_ms;
use sandkeeper_tokio::workload::{last_acknowledged, FleetVerdict};

use crate::fleet_store::K8sStore;
use crate::fleet_sweep::FleetObject;
use crate::workload::HarnessError;

/// The fleet's checks of the namespace of `store`, whose processes ran with `store`'s process
/// lease and wrote the ledgers `ledgers`: the checks, and the figures apart.
/// `read_file(pod, path)` reads a file of a pod's container by its absolute path (see
/// the module docs for why the caller reads it); `None`: not there. Run it once every process
/// ended: it sweeps the namespace first (judged as of now minus the lease, as every sweep),
/// which is what any process of the fleet would do next.
///
/// Errors: the cluster could not be read or swept ([`HarnessError::Verify`]), or a ledger could
/// not be read (a malformed line names its file and line).
pub async fn verify_fleet(
    store: &K8sStore,
    ledgers: &[PathBuf],
    read_file: impl Fn(&str, &str) -> Option<String>,
) -> Result<FleetVerdict, HarnessError> {
    let acknowledged = last_acknowledged(ledgers)?;
    // The one clock the processes share, as every store operation reads it.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    let swept = store.sweep(now).await.map_err(HarnessError::Verify)?;
    let entries = store.entries().await.map_err(HarnessError::Verify)?;
    let processes = store.processes().await.map_err(HarnessError::Verify)?;
    let cluster = store.cluster();
    let objects = cluster
        .fleet_objects()
        .await
        .map_err(HarnessError::Verify)?;
    let mut checks = Vec::new();
    let mut check = |ok: bool, what: String| checks.push((ok, what));

    // Who holds what, and what each key's record references.
    let find = |warm: Option<u64>, snapshot: Option<&str>| -> Option<&FleetObject> {
        objects
            .iter()
            .find(|o| warm.is_some_and(|n| o.sandbox == n) || snapshot.is_some_and(|s| o.name == s))
    };
    let mut referenced: BTreeSet<&str> = BTreeSet::new();
    let mut by_key: BTreeMap<String, &FleetObject> = BTreeMap::new();
    for entry in &entries {
        if let Some(owner) = entry.owner {
            let live = store
                .is_live(owner, now)
                .await
                .map_err(HarnessError::Verify)?;
            check(
                !live,
                format!("{} is held by no live process (owner {owner:?})", entry.key),
            );
        }
        let snapshot = entry.record.snapshot.as_ref().map(|s| s.snapshot.as_str());
        if let Some(sandbox) = entry.record.warm {
            let found = find(Some(sandbox.0), None);
            check(
                found.is_some(),
                format!(
                    "{}'s recorded sandbox {sandbox} is there ({})",
                    entry.key,
                    found.map_or("no claim or pod carries its number", |o| &o.name)
                ),
            );
            if let Some(o) = found {
                referenced.insert(&o.name);
                by_key.insert(entry.key.clone(), o);
            }
        }
        if let Some(snapshot) = snapshot {
            let found = find(None, Some(snapshot));
            check(
                found.is_some(),
                format!("{}'s recorded snapshot {snapshot} is there", entry.key),
            );
            if let Some(o) = found {
                referenced.insert(&o.name);
                by_key.entry(entry.key.clone()).or_insert(o);
            }
        }
    }

    // Nothing leaked.
    let judged_ms = unix_ms(now.checked_sub(store.lease()).unwrap_or(UNIX_EPOCH));
    let maker_live = |o: &FleetObject| {
        let incarnation = u32::try_from(o.sandbox >> 32).unwrap_or(u32::MAX);
        processes
            .get(&incarnation)
            .is_some_and(|(_, expires)| judged_ms < *expires)
    };
    let leaked: Vec<String> = objects
        .iter()
        .filter(|o| !referenced.contains(o.name.as_str()) && !maker_live(o))
        .map(|o| {
            let state = if o.suspended { " (suspended)" } else { "" };
            format!("{}{state}", o.name)
        })
        .collect();
    check(
        leaked.is_empty(),
        format!(
            "nothing is leaked: every claim or pod left is referenced by a key's record or \
             made by a live process ({} are not: {leaked:?})",
            leaked.len()
        ),
    );

    // Every session's last acknowledged version is where its user's key continues from.
    let workdir = &cluster.config().workdir;
    let users = acknowledged.check_logs(
        |key, session| {
            let object = by_key.get(key)?;
            let path = format!("{workdir}/{session}/{}", PathName::session_log().as_str());
            let log = object.pod.as_deref().and_then(|pod| read_file(pod, &path));
            let place = format!(
                "{path} of {} (pod {})",
                object.name,
                object.pod.as_deref().unwrap_or("none")
            );
            Some((place, log))
        },
        &mut check,
    );
    let figures = format!(
        "{} keys in the store, {} claims or pods left ({} suspended), {} sessions' last \
         acknowledged versions ({} ledger lines) over {users} users; this sweep removed {} \
         sandboxes and {} snapshots",
        entries.len(),
        objects.len(),
        objects.iter().filter(|o| o.suspended).count(),
        acknowledged.last.len(),
        acknowledged.lines,
        swept.sandboxes,
        swept.snapshots
    );
    Ok(FleetVerdict { checks, figures })
}
