//! The fleet store on Kubernetes Leases (`K8sStore`), against the loopback API server: it keeps
//! the contract every fleet store keeps (the checks the local root's store passes too), its
//! Leases are what `kubectl` shows, and concurrent claimants of one key get one owner.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use sandkeeper::{Key, SessionId};
use sandkeeper_k8s::K8sStore;
use sandkeeper_tokio::store::{Claim, FleetStore};

#[tokio::test]
async fn the_kubernetes_store_keeps_the_fleet_store_contract() {
    let server = server().await;
    let store = K8sStore::new(
        cluster(&server, claim_config("fleet")),
        Duration::from_secs(10),
    );
    sandkeeper_tokio::store::contract::check_all(&store, Duration::from_secs(10))
        .await
        .unwrap();
    // What the checks left is in Leases, as kubectl sees them: the counter, one Lease per
    // process, one per key, each labelled as the fleet's.
    let leases: kube::Api<Lease> = kube::Api::namespaced(client(&server), NS);
    let mut count = std::collections::BTreeMap::new();
    for kind in ["counter", "process", "key"] {
        let selector = format!("sandkeeper.sandbox.users.io/fleet={kind}");
        let list = leases
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap();
        count.insert(kind, list.items.len());
    }
    assert_eq!(count["counter"], 1, "{count:?}");
    // Twelve incarnations registered, ten of them renewed; six keys.
    assert_eq!((count["process"], count["key"]), (10, 6), "{count:?}");
}

#[tokio::test]
async fn concurrent_claims_of_one_key_make_one_owner() {
    let server = server().await;
    let store = K8sStore::new(
        cluster(&server, claim_config("fleet")),
        Duration::from_secs(10),
    );
    let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let key = Key::Session(SessionId::new("contended").unwrap());
    let mut incarnations = vec![];
    for _ in 0..6 {
        let inc = FleetStore::register(&store).await.unwrap();
        FleetStore::renew(&store, inc, 1, now).await.unwrap();
        incarnations.push(inc);
    }
    let claims = incarnations.iter().map(|inc| {
        let store = store.clone();
        let key = key.clone();
        let inc = *inc;
        tokio::spawn(async move { (inc, FleetStore::claim(&store, key, inc, 1, now).await) })
    });
    let mut owners = vec![];
    for claim in claims {
        let (inc, answer) = claim.await.unwrap();
        if let Claim::Claimed(..) = answer.unwrap() {
            owners.push(inc);
        }
    }
    assert_eq!(owners.len(), 1, "exactly one owner: {owners:?}");
    // The others' wants reach the owner at its next renewal.
    let wanted = FleetStore::renew(&store, owners[0], 1, now).await.unwrap();
    assert_eq!(wanted, Some(vec![key]));
}
