//! A fleet across hosts, checked whole: [`verify_hosts`] is `harness-pg --verify`, the check of
//! a run of several `harness-pg` processes, each host with its own local root, sharing one
//! PostgreSQL store and one shelf in object storage. Run it once every process ended; it waits
//! until the sweep counts none of them live (at most three leases), sweeps (every root and the
//! shelf, as the hosts' own sweeps would), then checks what no single process can see:
//!
//! - no key is held by a live process;
//! - on each root, no sandbox was changed by two tokens out of order (the roots' token logs);
//! - every key's record names what is there: its warm sandbox on some host's root, its snapshot
//!   on the shelf or on some host's disk;
//! - nothing is leaked: every sandbox directory on a root is one a record names; every
//!   snapshot, on a root or on the shelf, is one a record names or whose own retention is ahead;
//! - every session's last acknowledged session-log version (the processes' ledgers) is where its
//!   user's key continues: in the warm sandbox its record names, else in its snapshot (read from
//!   a host's copy, or fetched from the shelf).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sandkeeper::{PathName, SandboxId, Snapshot, SweepObject};
use sandkeeper_snapshots::{ObjectSnapshots, SnapshotName};
use sandkeeper_tokio::local::inventory::object_dir;
use sandkeeper_tokio::local::{meta, session_file, token_log_in_order};
use sandkeeper_tokio::store::unix_ms;
use sandkeeper_tokio::workload::{last_acknowledged, FleetVerdict};

use crate::PgStore;

/// Where a key continues from, as found.
enum Continues {
    /// A directory on some host: a sandbox's, a snapshot's, or a shelf snapshot fetched here.
    At(PathBuf),
    /// What the record names is nowhere.
    Missing(String),
}

/// The checks of a fleet across hosts (see the module docs). `store` sweeps what the roots and
/// the shelf hold (its inventory: every root's and the shelf's); `roots` are the hosts' roots,
/// `shelf` the fleet's shelf, `ledgers` the processes' ledgers. Snapshots fetched for the check
/// go to a temporary directory, removed after.
///
/// Errors: the store, a root, the shelf or a ledger could not be read.
pub async fn verify_hosts(
    store: &PgStore,
    roots: &[PathBuf],
    shelf: &ObjectSnapshots,
    ledgers: &[PathBuf],
) -> Result<FleetVerdict, String> {
    let now = after_every_lease(store).await?;
    let swept = store.sweep(now).await.map_err(|e| e.to_string())?;
    let entries = store.entries().await.map_err(|e| e.to_string())?;
    let processes = store.processes().await.map_err(|e| e.to_string())?;
    let mut checks = Vec::new();
    let mut check = |ok: bool, what: String| checks.push((ok, what));

    let on_shelf: BTreeMap<String, Option<u64>> = shelf
        .list()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(name, manifest)| (name.to_string(), manifest.retain_until))
        .collect();
    let fetched = std::env::temp_dir().join(format!("sk-verify-hosts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fetched);
    std::fs::create_dir_all(&fetched).map_err(|e| e.to_string())?;

    let now_ms = unix_ms(now);
    let mut continues = BTreeMap::new();
    let (mut named_sandboxes, mut named_snapshots) = (Vec::new(), Vec::new());
    for entry in &entries {
        if let Some((inc, epoch)) = entry.owner {
            let live = processes
                .get(&inc)
                .is_some_and(|(e, expires)| *e == epoch && now_ms < *expires);
            check(
                !live,
                format!("{} is held by no live process (owner {inc})", entry.key),
            );
        }
        let found = if let Some(sandbox) = entry.record.warm {
            named_sandboxes.push(sandbox);
            match on_a_root(roots, &sandbox_object(sandbox)) {
                Some(dir) => Continues::At(dir),
                None => Continues::Missing(format!("its warm sandbox {sandbox}")),
            }
        } else if let Some(s) = &entry.record.snapshot {
            named_snapshots.push(s.snapshot.clone());
            let object = snapshot_object(&s.snapshot, s.by);
            match on_a_root(roots, &object) {
                Some(dir) => Continues::At(dir),
                None if on_shelf.contains_key(s.snapshot.as_str()) => {
                    let target = fetched.join(s.snapshot.as_str());
                    let name =
                        SnapshotName::from_snapshot(&s.snapshot).map_err(|e| e.to_string())?;
                    shelf
                        .download(&name, &target)
                        .await
                        .map_err(|e| format!("fetching {}: {e}", s.snapshot.as_str()))?;
                    Continues::At(target)
                }
                None => Continues::Missing(format!("its snapshot {}", s.snapshot.as_str())),
            }
        } else {
            continue;
        };
        if let Continues::Missing(what) = &found {
            check(
                false,
                format!("{}'s record names {what}: it is nowhere", entry.key),
            );
        }
        continues.insert(entry.key.clone(), found);
    }

    for root in roots {
        let log = token_log_in_order(root).map_err(|e| e.to_string())?;
        check(
            log.out_of_order.is_empty(),
            format!(
                "on {}, no sandbox was changed by two tokens out of order ({} changes of {} \
                 sandboxes; the first out of order: {:?})",
                root.display(),
                log.changes,
                log.sandboxes,
                log.out_of_order.first()
            ),
        );
    }

    let leaked = leaked(roots, &on_shelf, (&named_sandboxes, &named_snapshots), now)?;
    check(
        leaked.is_empty(),
        format!("nothing is leaked on any root or the shelf ({leaked:?} are not referenced)"),
    );

    let acknowledged = last_acknowledged(ledgers).map_err(|e| e.to_string())?;
    let log_name = PathName::session_log();
    let users = acknowledged.check_logs(
        |key, session| match continues.get(key)? {
            Continues::At(dir) => {
                let file = session_file(dir, session, &log_name);
                let log = std::fs::read_to_string(&file).ok();
                Some((file.display().to_string(), log))
            }
            Continues::Missing(_) => None,
        },
        &mut check,
    );
    let _ = std::fs::remove_dir_all(&fetched);
    let figures = format!(
        "{} keys in the store, {} sessions' last acknowledged versions ({} ledger lines) over {} \
         users, {} roots, {} snapshots on the shelf; this sweep removed {} sandboxes and {} \
         snapshots",
        entries.len(),
        acknowledged.last.len(),
        acknowledged.lines,
        users,
        roots.len(),
        on_shelf.len(),
        swept.sandboxes,
        swept.snapshots
    );
    Ok(FleetVerdict { checks, figures })
}

/// Waits until the sweep counts no process live: a process that ended counts live to the
/// sweep until a lease after its lease's end (the sweep judges as of `now - lease`), and what
/// only a live maker keeps (a snapshot another host resumed, say) would look leaked before.
/// Bounded by three leases past the newest lease's end on the caller's clock; returns the
/// clock's reading after the wait.
async fn after_every_lease(store: &PgStore) -> Result<SystemTime, String> {
    let processes = store.processes().await.map_err(|e| e.to_string())?;
    let last_end = processes.values().map(|(_, expires)| *expires).max();
    let lease = store.lease();
    // The one clock the processes share, as every store operation reads it.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    let Some(last_end) = last_end else {
        return Ok(now);
    };
    let judged_free = last_end.saturating_add(unix_ms_of(lease));
    let wait = judged_free.saturating_sub(unix_ms(now));
    let bound = unix_ms_of(lease).saturating_mul(3);
    tokio::time::sleep(std::time::Duration::from_millis(wait.min(bound) + 1)).await;
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    Ok(now)
}

fn unix_ms_of(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The first root that holds `object`'s directory.
fn on_a_root(roots: &[PathBuf], object: &SweepObject) -> Option<PathBuf> {
    roots
        .iter()
        .filter_map(|root| object_dir(root, object).ok())
        .find(|dir| dir.is_dir())
}

fn sandbox_object(id: SandboxId) -> SweepObject {
    SweepObject::Sandbox {
        id,
        key: None,
        resumed_from: None,
    }
}

fn snapshot_object(snapshot: &Snapshot, by: SandboxId) -> SweepObject {
    SweepObject::Snapshot {
        snapshot: snapshot.clone(),
        by,
        key: None,
        expires: None,
    }
}

/// What no record names and no retention keeps: sandbox directories on the roots, snapshots on
/// the roots (their retention in their host's record) and on the shelf (in their manifest).
fn leaked(
    roots: &[PathBuf],
    on_shelf: &BTreeMap<String, Option<u64>>,
    (sandboxes, snapshots): (&[SandboxId], &[Snapshot]),
    now: SystemTime,
) -> Result<Vec<String>, String> {
    let now_secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let retained = |until: Option<u64>| until.is_some_and(|until| until > now_secs);
    let mut leaked = Vec::new();
    for root in roots {
        let listed =
            sandkeeper_tokio::local::inventory::sweep_objects(root).map_err(|e| e.to_string())?;
        for object in listed {
            let kept = match &object {
                SweepObject::Sandbox { id, .. } => sandboxes.contains(id),
                SweepObject::Snapshot { snapshot, .. } => {
                    let record =
                        meta::snapshot_record(root, snapshot).map_err(|e| e.to_string())?;
                    snapshots.contains(snapshot) || retained(record.and_then(|r| r.expires))
                }
            };
            if !kept {
                leaked.push(in_root(root, &object));
            }
        }
    }
    for (snapshot, until) in on_shelf {
        let named = snapshots.iter().any(|s| s.as_str() == snapshot);
        if !named && !retained(*until) {
            leaked.push(format!("the shelf's {snapshot}"));
        }
    }
    Ok(leaked)
}

fn in_root(root: &Path, object: &SweepObject) -> String {
    object_dir(root, object).map_or_else(|_| format!("{object:?}"), |d| d.display().to_string())
}

/// The shelf of a run, as `harness-pg` opens it: `url` with the `AWS_*` (or `GOOGLE_*`,
/// `AZURE_*`) settings of the environment.
pub fn open_shelf(url: &str) -> Result<Arc<ObjectSnapshots>, String> {
    ObjectSnapshots::open(url, Default::default())
        .map(Arc::new)
        .map_err(|e| format!("snapshots {url}: {e}"))
}
