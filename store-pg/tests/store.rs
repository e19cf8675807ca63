//! The PostgreSQL fleet store against a real server (a throwaway cluster per test): the
//! contract every fleet store keeps, six concurrent claimants of one key, one write per renewal
//! whatever the keys, tokens never reused, migrations applied once, typed errors.

mod common;

use common::*;
use sandkeeper::{SandboxId, Token};
use sandkeeper_pg::throwaway::rows_written;
use sandkeeper_pg::{PgError, PgStore, Timeouts};
use sandkeeper_tokio::store::{Claim, FleetStore, StoredRecord};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_fleet_store_contract() {
    let cluster = cluster();
    let store = store(&cluster).await;
    sandkeeper_tokio::store::contract::check_all(&store, LEASE)
        .await
        .unwrap();
    // What the checks left, as psql sees it: twelve incarnations registered, ten of them
    // renewed; six keys.
    let admin = admin(&cluster, None).await;
    let count = |table: &'static str| {
        let admin = &admin;
        async move {
            let row = admin
                .query_one(
                    &format!("SELECT count(*) FROM sandkeeper_fleet.{table}"),
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };
    assert_eq!((count("process").await, count("key_entry").await), (10, 6));
}

/// Six processes (each its own store, its own connection) claim one key at once: one owns it,
/// the others are busy and their wants reach the owner at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_concurrent_claims_of_one_key_make_one_owner() {
    let cluster = cluster();
    let now = at(0);
    let contended = key("contended");
    let mut claimants = vec![];
    for _ in 0..6 {
        let store = store(&cluster).await;
        let inc = store.register().await.unwrap();
        store.renew(inc, 1, now).await.unwrap();
        claimants.push((inc, store));
    }
    // Every claimant waits at the barrier, so the six claims reach the server together.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(6));
    let claims: Vec<_> = claimants
        .iter()
        .map(|(inc, store)| {
            let (inc, store, key, barrier) =
                (*inc, store.clone(), contended.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                (inc, store.claim(&key, inc, 1, now).await)
            })
        })
        .collect();
    let mut owners = vec![];
    let mut busy = vec![];
    for claim in claims {
        let (inc, answer) = claim.await.unwrap();
        match answer.unwrap() {
            Claim::Claimed(..) => owners.push(inc),
            Claim::Busy => busy.push(inc),
        }
    }
    assert_eq!(owners.len(), 1, "exactly one owner: {owners:?}");
    let (_, owner_store) = claimants.iter().find(|(i, _)| *i == owners[0]).unwrap();
    let wanted = owner_store.renew(owners[0], 1, now).await.unwrap();
    assert_eq!(wanted, Some(vec![contended.clone()]));
    let entry = &owner_store.entries().await.unwrap()[0];
    assert_eq!(entry.owner, Some((owners[0], 1)));
    busy.sort();
    assert_eq!(entry.wants.iter().copied().collect::<Vec<_>>(), busy);
}

/// A renewal writes its process's row and nothing else, whether it owns one key or fifty.
/// Writes are counted from the server's statistics, which a session's counts reach when it
/// ends: each phase runs on a store (a connection) of its own, ended before counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_one_write_whatever_the_keys_owned() {
    let cluster = cluster();
    let admin = admin(&cluster, None).await;
    let inc = {
        let store = store(&cluster).await;
        let inc = store.register().await.unwrap();
        store.renew(inc, 1, at(0)).await.unwrap();
        inc
    };
    let mut per_renewal = vec![];
    for (round, keys) in [(0u64, 1usize), (1, 50)] {
        let claimant = store(&cluster).await;
        for n in 0..keys {
            let k = key(&format!("owned-{round}-{n}"));
            assert!(matches!(
                claimant.claim(&k, inc, 1, at(round)).await.unwrap(),
                Claim::Claimed(..)
            ));
        }
        let pid = claimant.backend_pid().await.unwrap();
        drop(claimant);
        let before = rows_written(&admin, &[pid]).await.unwrap();
        let renewer = store(&cluster).await;
        for r in 0..10 {
            renewer.renew(inc, 1, at(round * 100 + r)).await.unwrap();
        }
        let pid = renewer.backend_pid().await.unwrap();
        drop(renewer);
        let after = rows_written(&admin, &[pid]).await.unwrap();
        per_renewal.push((after - before) as f64 / 10.0);
    }
    assert_eq!(
        per_renewal,
        vec![1.0, 1.0],
        "rows written per renewal owning 1, then 51 keys"
    );
}

/// Tokens come from one sequence: a key whose row is removed (by hand: the store never removes
/// one) and claimed again gets a token above every one handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_never_handed_out_twice_even_after_its_entry_is_removed() {
    let cluster = cluster();
    let store = store(&cluster).await;
    let admin = admin(&cluster, None).await;
    let inc = store.register().await.unwrap();
    store.renew(inc, 1, at(0)).await.unwrap();
    let k = key("removed");
    let Claim::Claimed(first, _) = store.claim(&k, inc, 1, at(0)).await.unwrap() else {
        panic!("a new key is free")
    };
    admin
        .execute(
            "DELETE FROM sandkeeper_fleet.key_entry WHERE key = $1",
            &[&k.to_string()],
        )
        .await
        .unwrap();
    let Claim::Claimed(second, record) = store.claim(&k, inc, 1, at(0)).await.unwrap() else {
        panic!("a removed key is free")
    };
    assert!(second > first, "{second:?} after {first:?}");
    assert_eq!(record, StoredRecord::default());
}

/// Keepers starting together against an empty database: each migration is applied once, and
/// every store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_when_keepers_start_together() {
    let cluster = cluster();
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let config = cluster.config();
            tokio::spawn(async move { PgStore::connect(&config, LEASE, Timeouts::default()).await })
        })
        .collect();
    for start in starts {
        let store = start.await.unwrap().unwrap();
        store.register().await.unwrap();
    }
    let admin = admin(&cluster, None).await;
    let versions: Vec<i32> = admin
        .query(
            "SELECT version FROM sandkeeper_fleet.schema_version ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, vec![sandkeeper_pg::schema::SCHEMA_VERSION]);
    // A schema newer than this build is refused, not run against.
    admin
        .execute(
            "INSERT INTO sandkeeper_fleet.schema_version (version, name) VALUES (99, 'future')",
            &[],
        )
        .await
        .unwrap();
    let refused = PgStore::connect(&cluster.config(), LEASE, Timeouts::default()).await;
    assert!(
        matches!(refused, Err(PgError::SchemaTooNew { found: 99, .. })),
        "{:?}",
        refused.err()
    );
}

/// Numbers the store cannot keep, a claim without a lease, and a record row written by hand
/// are typed errors naming what is wrong, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_bad_rows_are_typed_errors() {
    let cluster = cluster();
    let store = store(&cluster).await;
    let inc = store.register().await.unwrap();
    assert!(matches!(
        store.renew(inc, u64::MAX, at(0)).await,
        Err(PgError::OutOfRange { what: "epoch", .. })
    ));
    assert!(matches!(
        store.claim(&key("k"), inc, 1, at(0)).await,
        Err(PgError::NoLease { incarnation }) if incarnation == inc
    ));
    store.renew(inc, 1, at(0)).await.unwrap();
    let Claim::Claimed(token, _) = store.claim(&key("k"), inc, 1, at(0)).await.unwrap() else {
        panic!("free")
    };
    let record = StoredRecord {
        snapshot: None,
        warm: Some(SandboxId(5)),
    };
    assert!(matches!(
        store
            .record(&key("k"), inc, token, u64::MAX, &record, at(0))
            .await,
        Err(PgError::OutOfRange {
            what: "recording",
            ..
        })
    ));
    assert!(!store
        .release(&key("k"), inc, Token(token.0 + 1), &record, at(0))
        .await
        .unwrap());
    let admin = admin(&cluster, None).await;
    admin
        .execute(
            "UPDATE sandkeeper_fleet.key_entry SET record = '{\"warm\": \"x\"}'",
            &[],
        )
        .await
        .unwrap();
    let e = store.entries().await.unwrap_err();
    assert!(
        matches!(&e, PgError::Malformed { what, .. } if what.contains("session:k")),
        "{e}"
    );
    // The store's failure reaches the core as a StoreFailure naming it.
    let failure = FleetStore::claim(&store, key("k"), inc, 1, at(0)).await;
    assert!(failure.is_err(), "{failure:?}");
    // A server's error says what the server said (tokio-postgres alone shows "db error").
    admin
        .batch_execute("ALTER TABLE sandkeeper_fleet.key_entry RENAME TO moved")
        .await
        .unwrap();
    let e = store
        .release(&key("k"), inc, token, &record, at(0))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("42P01") && e.to_string().contains("does not exist"),
        "{e}"
    );
}

/// The store needs no superuser: a role allowed only to create a schema in the database (not
/// in `public`, which since PostgreSQL 15 only the database's owner may) migrates and keeps the
/// contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_allowed_only_to_create_a_schema_runs_the_store() {
    let cluster = cluster();
    let admin = admin(&cluster, None).await;
    admin
        .batch_execute(
            "CREATE ROLE keeper LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE; \
             GRANT CREATE ON DATABASE postgres TO keeper;",
        )
        .await
        .unwrap();
    let mut config = cluster.config();
    config.user("keeper");
    let store = PgStore::connect(&config, LEASE, Timeouts::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    sandkeeper_tokio::store::contract::check_all(&store, LEASE)
        .await
        .unwrap();
}
