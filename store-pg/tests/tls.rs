//! The store over TLS, against a real server that requires it: a throwaway cluster serving TLS
//! on a loopback port with a certificate made here. The store keeps the fleet store contract
//! over it, and the server says the store's session is encrypted; a store that trusts another
//! certificate, or speaks no TLS, is refused with an error that says why.

mod common;

use common::*;
use sandkeeper_pg::throwaway::Throwaway;
use sandkeeper_pg::{PgError, PgStore, StoreTls, Timeouts};

/// A throwaway cluster serving TLS for `localhost`, and its certificate (PEM).
fn tls_cluster() -> (Throwaway, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (made.cert.pem(), made.key_pair.serialize_pem());
    let cluster = Throwaway::start_tls(&cert, &key).unwrap_or_else(|e| panic!("{e}"));
    (cluster, cert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_its_contract_over_tls_and_the_server_says_it_is_encrypted() {
    let (cluster, cert) = tls_cluster();
    let tls = StoreTls::trusting_pem(cert.as_bytes()).unwrap();
    let config = cluster.tls_config().expect("a TLS cluster");
    let store = PgStore::connect_tls(&config, LEASE, Timeouts::default(), tls)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()));
    sandkeeper_tokio::store::contract::check_all(&store, LEASE)
        .await
        .unwrap();
    let pid = store.backend_pid().await.unwrap();
    let admin = admin(&cluster, None).await;
    let row = admin
        .query_one(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    let (ssl, version): (bool, Option<String>) = (row.get(0), row.get(1));
    assert!(ssl, "the store's session is encrypted");
    assert!(
        version.as_deref().is_some_and(|v| v.starts_with("TLSv1.")),
        "{version:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_trusts_another_certificate_or_speaks_no_tls_is_refused() {
    let (cluster, _) = tls_cluster();
    let config = cluster.tls_config().expect("a TLS cluster");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let stranger = StoreTls::trusting_pem(other.cert.pem().as_bytes()).unwrap();
    let Err(refused) = PgStore::connect_tls(&config, LEASE, Timeouts::default(), stranger).await
    else {
        panic!("a store trusting another certificate connected");
    };
    assert!(
        refused.to_string().contains("invalid peer certificate"),
        "{refused}"
    );
    // sslmode=require without TLS: refused before anything is sent in the clear.
    let Err(plain) = PgStore::connect(&config, LEASE, Timeouts::default()).await else {
        panic!("a store without TLS connected where TLS is required");
    };
    assert!(plain.to_string().contains("TLS"), "{plain}");
}

#[test]
fn a_pem_without_a_certificate_is_a_typed_error() {
    for pem in [
        &b""[..],
        b"not a certificate",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    ] {
        match StoreTls::trusting_pem(pem) {
            Err(PgError::Tls(why)) => assert!(!why.is_empty()),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(pem)),
        }
    }
}
