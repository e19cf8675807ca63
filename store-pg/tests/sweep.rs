//! The sweep as a composition: a PostgreSQL store (leases, records) given one host's inventory
//! (here an in-memory one, as a backend would list its sandboxes and snapshots) removes what
//! [`sandkeeper::sweep_verdict`] dooms, drops a record's expired snapshot before removing it,
//! and never leaves a claim holding a record that names what it removed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use sandkeeper::{Key, SandboxId, Snapshot, SweepObject};
use sandkeeper_pg::{Inventory, InventoryFuture, PgStore};
use sandkeeper_tokio::store::{unix_ms, Claim, StoredRecord, StoredSnapshot, Swept};

/// What one host's backend holds, in memory.
#[derive(Default)]
struct Held(Mutex<Vec<SweepObject>>);

impl Held {
    fn add(&self, object: SweepObject) {
        self.0.lock().unwrap().push(object);
    }

    fn has_snapshot(&self, name: &str) -> bool {
        self.0.lock().unwrap().iter().any(
            |o| matches!(o, SweepObject::Snapshot { snapshot, .. } if snapshot.as_str() == name),
        )
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl Inventory for Held {
    fn objects(&self) -> InventoryFuture<'_, Vec<SweepObject>> {
        let objects = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(objects) })
    }

    fn remove<'a>(&'a self, object: &'a SweepObject) -> InventoryFuture<'a, bool> {
        Box::pin(async move {
            let mut held = self.0.lock().unwrap();
            let before = held.len();
            held.retain(|o| o != object);
            Ok(held.len() < before)
        })
    }
}

fn sandbox(incarnation: u32, n: u64, key: &Key) -> SweepObject {
    SweepObject::Sandbox {
        id: SandboxId(u64::from(incarnation) << 32 | n),
        key: Some(key.clone()),
        resumed_from: None,
    }
}

fn snapshot(name: &str, incarnation: u32, key: &Key) -> SweepObject {
    SweepObject::Snapshot {
        snapshot: Snapshot::new(name),
        by: SandboxId(u64::from(incarnation) << 32 | 9),
        key: Some(key.clone()),
        expires: None,
    }
}

fn recording(name: &str, incarnation: u32, retain_until_ms: u64) -> StoredRecord {
    StoredRecord {
        snapshot: Some(StoredSnapshot {
            snapshot: Snapshot::new(name),
            by: SandboxId(u64::from(incarnation) << 32 | 9),
            retain_until_ms: Some(retain_until_ms),
        }),
        warm: None,
    }
}

async fn claimed(store: &PgStore, k: &Key, inc: u32, secs: u64) -> sandkeeper::Token {
    match store.claim(k, inc, 1, at(secs)).await.unwrap() {
        Claim::Claimed(token, _) => token,
        Claim::Busy => panic!("{k} busy"),
    }
}

/// A live owner's sandbox stays; a dead process's sandbox of a key no live process owns goes;
/// a snapshot a record names past its retention goes and leaves the record; one still retained
/// stays. A store with no inventory sweeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_what_no_live_process_holds_and_no_record_keeps() {
    let cluster = cluster();
    let bare = store(&cluster).await;
    let held = Arc::new(Held::default());
    let store = bare.clone().with_inventory(held.clone());
    let (live, dead) = (
        store.register().await.unwrap(),
        store.register().await.unwrap(),
    );
    let [owned, orphaned, expired, retained] =
        ["owned", "orphaned", "expired", "retained"].map(key);
    // The dead process renewed once, at 0, and claimed two keys; its lease ended at 10.
    store.renew(dead, 1, at(0)).await.unwrap();
    claimed(&store, &orphaned, dead, 0).await;
    for (k, name, until) in [
        (&expired, "snap-old", at(50)),
        (&retained, "snap-kept", at(1_000)),
    ] {
        let token = claimed(&store, k, dead, 0).await;
        let record = recording(name, dead, unix_ms(until));
        assert!(store.release(k, dead, token, &record, at(0)).await.unwrap());
    }
    // The live process renews at 100 and owns a key.
    store.renew(live, 1, at(100)).await.unwrap();
    claimed(&store, &owned, live, 100).await;
    held.add(sandbox(live, 1, &owned));
    held.add(sandbox(dead, 1, &orphaned));
    held.add(snapshot("snap-old", dead, &expired));
    held.add(snapshot("snap-kept", dead, &retained));

    assert_eq!(bare.sweep(at(105)).await.unwrap(), Swept::default());
    assert_eq!(
        held.len(),
        4,
        "a store without an inventory removes nothing"
    );

    // Judged a lease (10 s) before 105: the live lease (to 110) is live, the dead one is not.
    let swept = store.sweep(at(105)).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sandboxes: 1,
            snapshots: 1,
            unrecorded: 1
        }
    );
    let left = held.0.lock().unwrap().clone();
    assert_eq!(
        left,
        vec![
            sandbox(live, 1, &owned),
            snapshot("snap-kept", dead, &retained)
        ]
    );
    let entries = store.entries().await.unwrap();
    let record_of = |k: &Key| {
        entries
            .iter()
            .find(|e| e.key == k.to_string())
            .map(|e| e.record.clone())
            .unwrap()
    };
    assert_eq!(record_of(&expired), StoredRecord::default(), "unrecorded");
    assert_eq!(
        record_of(&retained),
        recording("snap-kept", dead, unix_ms(at(1_000)))
    );
    // Swept again: nothing more.
    assert_eq!(store.sweep(at(105)).await.unwrap(), Swept::default());
}

/// Sweeps race claims and releases of a key whose record names a snapshot whose retention
/// ended: a claim handed a record naming a snapshot must find it still held. The sweep drops
/// the snapshot from the record by a compare-and-set before removing it, so a claim that took
/// the record first makes the sweep leave the snapshot (for the next sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_racing_the_sweep_never_gets_a_record_naming_a_removed_snapshot() {
    let cluster = cluster();
    let held = Arc::new(Held::default());
    let sweeper = store(&cluster).await.with_inventory(held.clone());
    let claimant = store(&cluster).await;
    let (owner, maker) = (
        claimant.register().await.unwrap(),
        claimant.register().await.unwrap(),
    );
    let k = key("raced");
    let stop = Arc::new(AtomicBool::new(false));
    // Sweeps done, so that some rounds let a whole sweep run between a release and the next
    // claim (the sweeper then surely wins those; a loaded machine may otherwise never let it).
    let (done, mut sweeps_done) = tokio::sync::watch::channel(0u64);
    let sweeps = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut swept = Swept::default();
            while !stop.load(Ordering::Relaxed) {
                swept += sweeper.sweep(at(1_000)).await.unwrap();
                done.send_modify(|n| *n += 1);
                tokio::task::yield_now().await;
            }
            swept
        }
    });
    let mut claims_naming = 0;
    for n in 0..150 {
        if n % 10 == 9 {
            // Two sweeps more: the second started after the last release.
            let after = *sweeps_done.borrow() + 2;
            let waited = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                sweeps_done.wait_for(|done| *done >= after),
            )
            .await;
            assert!(matches!(waited, Ok(Ok(_))), "the sweeper stopped sweeping");
        }
        // Renewed at the sweep's instant: live (the maker of the snapshots never is).
        claimant.renew(owner, 1, at(1_000)).await.unwrap();
        let Claim::Claimed(token, taken) = claimant.claim(&k, owner, 1, at(1_000)).await.unwrap()
        else {
            panic!("the key is free")
        };
        if let Some(named) = taken.snapshot {
            claims_naming += 1;
            // Held when handed, and still held while the key is owned (a round trip later).
            for _ in 0..2 {
                assert!(
                    held.has_snapshot(named.snapshot.as_str()),
                    "handed {:?}, which a sweep removed",
                    named.snapshot
                );
                claimant.renew(owner, 1, at(1_000)).await.unwrap();
            }
        }
        let name = format!("snap-{n}");
        held.add(snapshot(&name, maker, &k));
        let record = recording(&name, maker, 0);
        assert!(claimant
            .release(&k, owner, token, &record, at(1_000))
            .await
            .unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let swept = sweeps.await.unwrap();
    // Both sides won sometimes (the sweeper at least in the rounds it was let), else the race
    // was not run.
    assert!(swept.unrecorded > 0, "{swept:?}");
    assert!(
        claims_naming > 0,
        "no claim took a record naming a snapshot"
    );
}
