//! The cost of the release tiers (issue 14):
//!
//! - `tiers.local_suspend_resume_ms_1mb` and `_100mb`: one suspension and one resume through a
//!   keeper on the local backend (`Suspend`: the last release drains, stops and persists; the
//!   next call resumes), with a workspace of 1 MB and of 100 MB; the median of 5. Their ratio,
//!   `tiers.local_suspend_resume_100mb_vs_1mb` (goal ≤ 1.5), says whether the cost grows with
//!   the workspace: a rename does not, a copy would (by ~100x).
//! - `tiers.local_resume_vs_fresh_start`: a resuming call's acquire against a fresh one's.
//! - `k8s.requests_per_warm_hit_claims`: the API requests of a call that finds its key's
//!   sandbox warm (`KeepWarm`), with no upload: goal 0. `k8s.resume_vs_fresh_start_claims`: a
//!   resuming call's acquire against a fresh one's on the loopback cluster.
//!
//! Times are compared as ratios measured in the same run.

use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, ReleasePolicy, SessionId};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{Backend, Keeper, KeeperConfig, LocalBackend};

use crate::measure::Sink;

const RUNS: usize = 5;

fn spec(call: &str, session: &str) -> Result<CallSpec, String> {
    Ok(CallSpec::new(
        CallId::new(call).map_err(|e| e.to_string())?,
        SessionId::new(session).map_err(|e| e.to_string())?,
    ))
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Waits (bounded) until the keeper counts `n` suspensions.
async fn suspended<B: Backend>(keeper: &Keeper<B>, n: u64) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(120), async {
        while keeper.stats().suspended < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .map_err(|_| "not suspended in time".to_string())
}

/// One suspension and resume of a workspace of `bytes`, on the local backend: (the time from
/// the release to the suspension, plus the resuming acquire; the resuming acquire alone; a
/// fresh acquire).
async fn local_round(bytes: usize, run: usize) -> Result<(Duration, Duration, Duration), String> {
    let root = std::env::temp_dir().join(format!("sk-perf-tiers-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let backend = LocalBackend::new(LocalConfig::new(&root)).map_err(|e| e.to_string())?;
    let core = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    let keeper = Keeper::new(KeeperConfig::with_core(core), backend).map_err(|e| e.to_string())?;
    let fresh_at = crate::measure::wall();
    let guard = keeper
        .acquire(spec("c1", "s")?)
        .await
        .map_err(|e| e.to_string())?;
    let fresh = fresh_at.elapsed();
    let dir = keeper.backend().sandbox_dir(guard.sandbox());
    std::fs::write(dir.join("workspace.bin"), vec![1u8; bytes]).map_err(|e| e.to_string())?;
    let at = crate::measure::wall();
    guard.release().await;
    suspended(&keeper, 1).await?;
    let suspend = at.elapsed();
    let at = crate::measure::wall();
    let guard = keeper
        .acquire(spec("c2", "s")?)
        .await
        .map_err(|e| e.to_string())?;
    let resume = at.elapsed();
    let back = std::fs::metadata(
        keeper
            .backend()
            .sandbox_dir(guard.sandbox())
            .join("workspace.bin"),
    )
    .map_err(|e| e.to_string())?;
    if back.len() != bytes as u64 {
        return Err(format!("the resumed workspace holds {} bytes", back.len()));
    }
    guard.release().await;
    suspended(&keeper, 2).await?;
    keeper.close(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&root);
    Ok((suspend + resume, resume, fresh))
}

/// Measures the figures above on a runtime of its own.
pub fn tiers_figures(report: Sink) {
    let Some(runtime) = crate::measure::runtime("tiers") else {
        return;
    };
    let cycle = |bytes: usize| -> Result<(Duration, Duration, Duration), String> {
        let mut rounds = Vec::new();
        for run in 0..RUNS {
            rounds.push(runtime.block_on(local_round(bytes, run))?);
        }
        Ok((
            median(rounds.iter().map(|r| r.0).collect()),
            median(rounds.iter().map(|r| r.1).collect()),
            median(rounds.iter().map(|r| r.2).collect()),
        ))
    };
    match (cycle(1 << 20), cycle(100 << 20)) {
        (Ok(small), Ok(large)) => {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            report("tiers.local_suspend_resume_ms_1mb", ms(small.0), "ms");
            report("tiers.local_suspend_resume_ms_100mb", ms(large.0), "ms");
            report(
                "tiers.local_suspend_resume_100mb_vs_1mb",
                large.0.as_secs_f64() / small.0.as_secs_f64(),
                "x",
            );
            report(
                "tiers.local_resume_vs_fresh_start",
                small.1.as_secs_f64() / small.2.as_secs_f64(),
                "x",
            );
        }
        (a, b) => eprintln!(
            "local suspend/resume not measured: {:?}",
            a.err().or(b.err())
        ),
    }
    match runtime.block_on(crate::perf_k8s::warm_hit_and_resume()) {
        Ok((requests, resume_vs_fresh)) => {
            report(
                "k8s.requests_per_warm_hit_claims",
                requests as f64,
                "requests",
            );
            report("k8s.resume_vs_fresh_start_claims", resume_vs_fresh, "x");
        }
        Err(e) => eprintln!("k8s warm hit and resume not measured: {e}"),
    }
}
