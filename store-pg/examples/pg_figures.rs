//! The PostgreSQL fleet store's figures for `docs/performance.md` (`docs/fleet-postgres.md`),
//! on a throwaway cluster of the machine's PostgreSQL:
//!
//! - `pg.store_writes_per_min`: rows the store writes in a minute of renewals (every 5 s, the
//!   default `renew_every`) by a process owning 10, then 1,000 idle keys; counted from the
//!   server's statistics (`pg_stat_user_tables`: inserted + updated + deleted rows of the
//!   store's tables), read once the renewing session ended (`throwaway::rows_written`).
//! - `pg.claim_ms`: p50 / p99 of a claim of a new key, on the local server over its socket,
//!   with `fsync` off (the tests' cluster) and on (each commit waits for its WAL flush).
//! - `pg.paused_stall_ms`: the worst time another process's renewal or claim waited on a client
//!   paused inside a transaction holding the lease's and the key's rows (5 trials).
//!
//! Run: `cargo run --release -p sandkeeper-pg --example pg_figures`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{Key, SessionId};
use sandkeeper_pg::throwaway::{rows_written, Throwaway};
use sandkeeper_pg::{PgStore, Timeouts};
use sandkeeper_tokio::store::Claim;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(15);
const RENEW_EVERY: u64 = 5;

type Failed = Box<dyn std::error::Error>;

fn key(name: &str) -> Result<Key, Failed> {
    Ok(Key::Session(SessionId::new(name)?))
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000) + Duration::from_millis(ms)
}

async fn store(cluster: &Throwaway) -> Result<PgStore, Failed> {
    Ok(PgStore::connect(&cluster.config(), LEASE, Timeouts::default()).await?)
}

async fn admin(
    cluster: &Throwaway,
    options: Option<&str>,
) -> Result<tokio_postgres::Client, Failed> {
    let mut config = cluster.config();
    if let Some(options) = options {
        config.options(options);
    }
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Rows written in one minute of renewals by a process owning `keys` idle keys.
async fn writes_per_min(cluster: &Throwaway, keys: usize) -> Result<i64, Failed> {
    let admin = admin(cluster, None).await?;
    let setup = store(cluster).await?;
    let inc = setup.register().await?;
    setup.renew(inc, 1, at(0)).await?;
    for n in 0..keys {
        let claimed = setup
            .claim(&key(&format!("idle-{inc}-{n}"))?, inc, 1, at(0))
            .await?;
        if !matches!(claimed, Claim::Claimed(..)) {
            return Err(format!("idle key {n} busy").into());
        }
    }
    let pid = setup.backend_pid().await?;
    drop(setup);
    let before = rows_written(&admin, &[pid]).await?;
    let renewer = store(cluster).await?;
    for r in 1..=(60 / RENEW_EVERY) {
        renewer.renew(inc, 1, at(r * RENEW_EVERY * 1_000)).await?;
    }
    let pid = renewer.backend_pid().await?;
    drop(renewer);
    Ok(rows_written(&admin, &[pid]).await? - before)
}

/// Claim latencies of `n` new keys, sorted, in milliseconds.
async fn claim_ms(cluster: &Throwaway, n: usize) -> Result<Vec<f64>, Failed> {
    let store = store(cluster).await?;
    let inc = store.register().await?;
    store.renew(inc, 1, at(0)).await?;
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let k = key(&format!("claimed-{i}"))?;
        let started = Instant::now();
        store.claim(&k, inc, 1, at(0)).await?;
        took.push(started.elapsed().as_secs_f64() * 1e3);
    }
    took.sort_by(f64::total_cmp);
    Ok(took)
}

/// The longest another process's renewal or claim waited on a client paused inside a
/// transaction holding the lease's and the key's rows.
async fn paused_stall(cluster: &Throwaway, trial: u32) -> Result<Duration, Failed> {
    let timeouts = Timeouts::default();
    let (owner, other) = (store(cluster).await?, store(cluster).await?);
    let (a, b) = (owner.register().await?, other.register().await?);
    owner.renew(a, 1, at(0)).await?;
    other.renew(b, 1, at(0)).await?;
    let held = key(&format!("held-{trial}"))?;
    owner.claim(&held, a, 1, at(0)).await?;
    let paused = admin(cluster, Some(&timeouts.session_options())).await?;
    paused
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM sandkeeper_fleet.key_entry WHERE key = '{held}' FOR UPDATE; \
             SELECT 1 FROM sandkeeper_fleet.process WHERE incarnation = {a} FOR UPDATE;"
        ))
        .await?;
    let paused_at = Instant::now();
    let renewal = async {
        while owner.renew(a, 1, at(1)).await.is_err() {}
        paused_at.elapsed()
    };
    let claim = async {
        while other.claim(&held, b, 1, at(1)).await.is_err() {}
        paused_at.elapsed()
    };
    let (renewed, claimed) = tokio::join!(renewal, claim);
    Ok(renewed.max(claimed))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Failed> {
    let cluster = Throwaway::start()?;
    let version = admin(&cluster, None)
        .await?
        .query_one("SHOW server_version", &[])
        .await?
        .get::<_, String>(0);
    println!("PostgreSQL {version}, throwaway cluster over a unix socket");
    for keys in [10, 1_000] {
        let writes = writes_per_min(&cluster, keys).await?;
        println!("pg.store_writes_per_min{{owned_idle_keys={keys}}} = {writes}");
    }
    let took = claim_ms(&cluster, 2_000).await?;
    println!(
        "pg.claim_ms p50 = {:.3} p99 = {:.3} (n = {}, new keys, fsync off)",
        percentile(&took, 0.50),
        percentile(&took, 0.99),
        took.len()
    );
    {
        let durable = Throwaway::start_durable()?;
        let took = claim_ms(&durable, 2_000).await?;
        println!(
            "pg.claim_ms p50 = {:.3} p99 = {:.3} (n = {}, new keys, fsync on: each claim's \
             commit waits for its WAL flush)",
            percentile(&took, 0.50),
            percentile(&took, 0.99),
            took.len()
        );
    }
    let mut worst = Duration::ZERO;
    for trial in 0..5 {
        worst = worst.max(paused_stall(&cluster, trial).await?);
    }
    let t = Timeouts::default();
    println!(
        "pg.paused_stall_ms worst = {} (5 trials; idle_in_transaction_session_timeout {} ms, \
         lock_timeout {} ms, statement_timeout {} ms, operation bound {} ms)",
        worst.as_millis(),
        t.idle_in_transaction.as_millis(),
        t.lock.as_millis(),
        t.statement.as_millis(),
        t.operation.as_millis()
    );
    Ok(())
}
