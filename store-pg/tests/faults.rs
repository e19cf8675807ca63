//! Faults against a real PostgreSQL server: the store's connection killed
//! (`pg_terminate_backend`), the server restarted (`pg_ctl restart`), each while a keeper is at
//! work on its key; and a client paused inside a transaction holding a key's row and a process
//! lease's row. Nothing is lost in any of them, no operation hangs, and the paused client holds
//! the others back no longer than the stated bound.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sandkeeper::{Key, SandboxId, Token};
use sandkeeper_pg::throwaway::Throwaway;
use sandkeeper_pg::{PgStore, Timeouts};
use sandkeeper_tokio::store::{Claim, StoredRecord};
use tokio::time::Instant;

fn warm(n: u64) -> StoredRecord {
    StoredRecord {
        snapshot: None,
        warm: Some(SandboxId(n)),
    }
}

/// What a keeper at work saw: the newest record write the store confirmed, how many operations
/// failed, and the longest any operation took.
#[derive(Debug, Default)]
struct Worked {
    confirmed: u64,
    failures: u64,
    longest: Duration,
}

/// A keeper at work on its one key: renews its lease and writes the key's record, numbered
/// 1, 2, ..., over and over, until stopped. `progress` tells its confirmed writes as they land,
/// so that the test waits on its work rather than on a clock.
struct Keeper {
    stop: Arc<AtomicBool>,
    progress: tokio::sync::watch::Receiver<u64>,
    failures: Arc<AtomicU64>,
    work: tokio::task::JoinHandle<Worked>,
    incarnation: u32,
    token: Token,
    key: Key,
}

impl Keeper {
    async fn start(store: PgStore, name: &str) -> Keeper {
        let incarnation = store.register().await.unwrap();
        store.renew(incarnation, 1, at(0)).await.unwrap();
        let key = key(name);
        let Claim::Claimed(token, _) = store.claim(&key, incarnation, 1, at(0)).await.unwrap()
        else {
            panic!("a new key is free")
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (confirmed, progress) = tokio::sync::watch::channel(0u64);
        let failures = Arc::new(AtomicU64::new(0));
        let work = tokio::spawn({
            let (stop, failures, key) = (stop.clone(), failures.clone(), key.clone());
            async move {
                let mut worked = Worked::default();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let renewed = store.renew(incarnation, 1, at(1)).await;
                    let recorded = match renewed {
                        Ok(_) => {
                            store
                                .record(&key, incarnation, token, n, &warm(n), at(1))
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    worked.longest = worked.longest.max(started.elapsed());
                    match recorded {
                        Ok(true) => {
                            worked.confirmed = n;
                            confirmed.send_modify(|count| *count += 1);
                        }
                        Ok(false) => panic!("write {n} fenced: the key was lost"),
                        Err(_) => {
                            worked.failures += 1;
                            failures.fetch_add(1, Ordering::Relaxed);
                            // A keeper retries on its timers; here, soon: the server is coming
                            // back (a real process restarting), and a failed connect is instant.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                worked
            }
        });
        Keeper {
            stop,
            progress,
            failures,
            work,
            incarnation,
            token,
            key,
        }
    }

    /// Waits until `more` writes beyond the count now are confirmed (at most 30 s: the server
    /// comes back within seconds, and each operation is bounded by the store).
    async fn confirms(&mut self, more: u64) {
        let target = *self.progress.borrow() + more;
        let waited = tokio::time::timeout(
            Duration::from_secs(30),
            self.progress.wait_for(|count| *count >= target),
        )
        .await;
        match waited {
            Ok(Ok(_)) => {}
            // The sender went with the keeper's task: it panicked (a write fenced).
            Ok(Err(_)) => panic!("the keeper at work ended: {:?}", self.work.is_finished()),
            Err(_) => panic!(
                "no write confirmed after the fault ({} failures): the store did not come back",
                self.failures.load(Ordering::Relaxed)
            ),
        }
    }

    async fn stop(self) -> (Worked, u32, Token, Key) {
        self.stop.store(true, Ordering::Relaxed);
        let worked = self.work.await.unwrap();
        (worked, self.incarnation, self.token, self.key)
    }
}

/// After a fault: the key is still the keeper's under its token, its record is the newest it
/// wrote (at or after the newest confirmed: an answer lost to the fault may have landed), and
/// no operation took longer than the store's bound.
async fn nothing_lost(cluster: &Throwaway, keeper: Keeper) -> Worked {
    let (worked, inc, token, key) = keeper.stop().await;
    let store = store(cluster).await;
    let entry = store
        .entries()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.key == key.to_string())
        .expect("the key's entry");
    assert_eq!((entry.owner, entry.token), (Some((inc, 1)), token.0));
    let recording = entry.recording.expect("records written");
    assert!(
        recording >= worked.confirmed,
        "{recording} < {}",
        worked.confirmed
    );
    assert_eq!(entry.record, warm(recording));
    let bound = Timeouts::default().operation + Duration::from_secs(1);
    assert!(
        worked.longest < bound,
        "an operation took {:?}",
        worked.longest
    );
    worked
}

/// The store's connection killed by the server mid-run: the operation that meets it fails, a
/// later one connects again; nothing is lost. Without the reconnect every later operation
/// fails, and `confirms` reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_loses_nothing_and_the_store_connects_again() {
    let cluster = cluster();
    let store = store(&cluster).await;
    let pid = store.backend_pid().await.unwrap();
    let mut keeper = Keeper::start(store.clone(), "killed").await;
    keeper.confirms(20).await;
    let admin = admin(&cluster, None).await;
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    keeper.confirms(20).await;
    assert_ne!(store.backend_pid().await.unwrap(), pid, "a new connection");
    let worked = nothing_lost(&cluster, keeper).await;
    eprintln!("killed connection: {worked:?}");
}

/// The server restarted (`pg_ctl restart -m fast`) mid-run: operations fail while it is down,
/// then succeed on a new connection; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing_and_the_store_connects_again() {
    let cluster = Arc::new(cluster());
    let store = store(&cluster).await;
    let mut keeper = Keeper::start(store, "restarted").await;
    keeper.confirms(20).await;
    let restarting = cluster.clone();
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .unwrap()
        .unwrap();
    keeper.confirms(20).await;
    let worked = nothing_lost(&cluster, keeper).await;
    assert!(worked.failures > 0, "the restart was seen: {worked:?}");
    eprintln!("restarted server: {worked:?}");
}

/// A client of the store (its sessions under the store's timeouts) paused inside a transaction
/// that locked a key's row and a process lease's row: another process's claim of that key and
/// the lease's renewal wait for it, and go through once the server ends the idle session
/// (`idle_in_transaction_session_timeout`), well within the bound the docs state: that timeout
/// plus a second. Work on other keys is not held up at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_paused_inside_a_transaction_holds_others_back_at_most_the_bound() {
    let cluster = cluster();
    let timeouts = Timeouts::default();
    let owner = store(&cluster).await;
    let other = store(&cluster).await;
    let (a, b) = (
        owner.register().await.unwrap(),
        other.register().await.unwrap(),
    );
    owner.renew(a, 1, at(0)).await.unwrap();
    other.renew(b, 1, at(0)).await.unwrap();
    let held = key("held");
    assert!(matches!(
        owner.claim(&held, a, 1, at(0)).await.unwrap(),
        Claim::Claimed(..)
    ));
    let paused = admin(&cluster, Some(&timeouts.session_options())).await;
    paused
        .batch_execute(&format!(
            "BEGIN; \
             SELECT 1 FROM sandkeeper_fleet.key_entry WHERE key = '{held}' FOR UPDATE; \
             SELECT 1 FROM sandkeeper_fleet.process WHERE incarnation = {a} FOR UPDATE;"
        ))
        .await
        .unwrap();
    let paused_at = Instant::now();
    // Work on another key goes through at once.
    let started = Instant::now();
    other.claim(&key("free"), b, 1, at(1)).await.unwrap();
    let unrelated = started.elapsed();
    // The renewal of the locked lease and the claim of the locked key wait for the pause.
    let until_done = |op: &'static str| {
        let (owner, other, held) = (owner.clone(), other.clone(), held.clone());
        async move {
            loop {
                let done = match op {
                    "renew" => owner.renew(a, 1, at(1)).await.map(|_| Claim::Busy),
                    _ => other.claim(&held, b, 1, at(1)).await,
                };
                if let Ok(answer) = done {
                    return (answer, paused_at.elapsed());
                }
            }
        }
    };
    let bound = timeouts.idle_in_transaction + Duration::from_secs(1);
    // Waited for at most ten bounds: a paused client that is never ended (a session without the
    // idle timeout) holds both forever, and the test fails here rather than hanging.
    let both = tokio::time::timeout(10 * bound, async {
        tokio::join!(until_done("renew"), until_done("claim"))
    })
    .await;
    let Ok(((_, renewed_after), (claim, claimed_after))) = both else {
        panic!(
            "the paused client held the renewal and the claim for {:?}",
            10 * bound
        )
    };
    eprintln!(
        "paused client: unrelated work {unrelated:?}, renewal {renewed_after:?}, claim \
         {claimed_after:?}, bound {bound:?}"
    );
    // Not held (its usual time is a few milliseconds; half the idle limit leaves room for a
    // loaded machine) ...
    assert!(
        unrelated < timeouts.idle_in_transaction / 2,
        "{unrelated:?}"
    );
    for stall in [renewed_after, claimed_after] {
        // ... while these were (the locks were real) ...
        assert!(stall >= timeouts.idle_in_transaction / 2, "{stall:?}");
        // ... and no longer than the bound.
        assert!(stall < bound, "{stall:?} >= {bound:?}");
    }
    assert_eq!(
        claim,
        Claim::Busy,
        "the owner's lease is live: the key stays its own"
    );
    assert!(
        paused.query("SELECT 1", &[]).await.is_err(),
        "the server ended the paused session"
    );
}
