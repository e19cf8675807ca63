//! The Kubernetes backend's cost on the API server (issue 12), counted by the loopback API
//! (`k8s-loopback`), which counts every request by verb and resource:
//!
//! - `k8s.requests_per_call_cycle_<mode>` (`claims`, `pods`): the requests one call makes
//!   through a keeper on a [`K8sBackend`] (acquire, start, one flushed file uploaded,
//!   release, shutdown), watch requests included, `pods/exec` not; beside it
//!   `k8s.writes_per_call_cycle_<mode>` (create, update, patch, delete) and
//!   `k8s.execs_per_call_cycle_<mode>` (an upload is two execs: extract, rename).
//! - `k8s.idle_requests_per_min`: requests made while nothing happens (a keeper connected, no
//!   call), watches and Lease renewals excluded, over a few seconds of wall time scaled to a
//!   minute.
//!
//! Counts, not times: they do not depend on the machine.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_loopback::resources::{SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use k8s_loopback::{Loopback, RequestInfo, Verb};
use sandkeeper::{CallId, CallSpec, Config, PathName, SessionId};
use sandkeeper_k8s::{Cluster, K8sBackend, K8sConfig, Mode};
use sandkeeper_tokio::{Keeper, KeeperConfig};
use serde_json::json;

use crate::measure::Sink;

const NS: &str = "perf";
/// How long nothing happens while idle requests are counted.
const IDLE: Duration = Duration::from_secs(3);

/// A loopback with a warm pool `pool` (one container, working directory on a claim volume).
async fn loopback() -> Result<Loopback, String> {
    let server = Loopback::start().await.map_err(|e| e.to_string())?;
    let store = server.store();
    store
        .create(
            &SANDBOX_TEMPLATES,
            NS,
            json!({"metadata": {"name": "tpl"}, "spec": {
                "podTemplate": {"spec": {"terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "busybox",
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "workspace"}}]}}),
        )
        .map_err(|e| e.message)?;
    store
        .create(
            &SANDBOX_WARM_POOLS,
            NS,
            json!({"metadata": {"name": "pool"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "tpl"}}}),
        )
        .map_err(|e| e.message)?;
    Ok(server)
}

fn config(mode: Mode) -> K8sConfig {
    let mut c = K8sConfig::new(NS, "perf", mode);
    c.retry_base_millis = 5;
    c
}

fn pod_mode() -> Mode {
    let template = serde_json::from_value(json!({
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .expect("a pod template");
    Mode::Pod {
        template: Box::new(template),
    }
}

async fn connect(server: &Loopback, mode: Mode) -> Result<K8sBackend, String> {
    let mut kube = kube::Config::new(server.url().parse().map_err(|e| format!("{e}"))?);
    kube.default_namespace = NS.into();
    let client = Cluster::make_client(kube).map_err(|e| e.to_string())?;
    let cluster = Cluster::new(client, config(mode)).map_err(|e| e.to_string())?;
    let (backend, _) = K8sBackend::connect(cluster)
        .await
        .map_err(|e| e.to_string())?;
    Ok(backend)
}

/// The counts that grew from `before` to `after`.
fn grown(
    before: &BTreeMap<RequestInfo, u64>,
    after: &BTreeMap<RequestInfo, u64>,
) -> Vec<(RequestInfo, u64)> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn is_exec(r: &RequestInfo) -> bool {
    r.subresource.as_deref() == Some("exec")
}

fn is_write(r: &RequestInfo) -> bool {
    matches!(
        r.verb,
        Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
    )
}

/// One call through a keeper on `mode`: (requests without exec, writes, execs).
async fn call_cycle(mode: Mode) -> Result<(u64, u64, u64), String> {
    let server = loopback().await?;
    let keeper = Keeper::new(
        KeeperConfig::with_core(Config::default()),
        connect(&server, mode).await?,
    )
    .map_err(|e| e.to_string())?;
    let before = server.request_counts();
    let session = SessionId::new("s").map_err(|e| e.to_string())?;
    let guard = tokio::time::timeout(
        Duration::from_secs(30),
        keeper.acquire(CallSpec::new(
            CallId::new("c").map_err(|e| e.to_string())?,
            session.clone(),
        )),
    )
    .await
    .map_err(|_| "the call was not ready in time".to_string())?
    .map_err(|e| e.to_string())?;
    keeper
        .flush(&session, &PathName::session_log(), b"turn 1".to_vec())
        .map_err(|e| e.to_string())?;
    guard.release().await;
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        while keeper.stats().shutdowns_ok < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    settled
        .await
        .map_err(|_| "the sandbox was not shut down in time".to_string())?;
    let grew = grown(&before, &server.request_counts());
    let count = |f: &dyn Fn(&RequestInfo) -> bool| {
        grew.iter()
            .filter(|(r, _)| f(r))
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    // The breakdown, to stderr: which requests make up the figure.
    let detail: Vec<String> = grew
        .iter()
        .map(|(r, n)| {
            let sub = r
                .subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            format!("{} {}{sub} x{n}", r.verb.as_str(), r.resource)
        })
        .collect();
    eprintln!("# k8s call cycle: {}", detail.join(", "));
    let requests = count(&|r| !is_exec(r));
    let writes = count(&|r| !is_exec(r) && is_write(r));
    let execs = count(&|r| is_exec(r));
    keeper.close(Duration::from_secs(10)).await;
    Ok((requests, writes, execs))
}

/// Requests per minute while a connected keeper has nothing to do, watches and Lease
/// renewals excluded.
async fn idle() -> Result<f64, String> {
    let server = loopback().await?;
    let keeper = Keeper::new(
        KeeperConfig::with_core(Config::default()),
        connect(
            &server,
            Mode::AgentSandbox {
                warm_pool: "pool".into(),
            },
        )
        .await?,
    )
    .map_err(|e| e.to_string())?;
    // Let the death watch open its watches first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = server.request_counts();
    tokio::time::sleep(IDLE).await;
    let grew = grown(&before, &server.request_counts());
    let n: u64 = grew
        .iter()
        .filter(|(r, _)| r.verb != Verb::Watch && r.resource != "leases")
        .map(|(_, n)| n)
        .sum();
    keeper.close(Duration::from_secs(10)).await;
    Ok(n as f64 * 60.0 / IDLE.as_secs_f64())
}

/// Measures the figures above on a runtime of its own.
pub fn k8s_figures(report: Sink) {
    let Some(runtime) = crate::measure::runtime("k8s") else {
        return;
    };
    let modes = [
        (
            "claims",
            Mode::AgentSandbox {
                warm_pool: "pool".into(),
            },
        ),
        ("pods", pod_mode()),
    ];
    for (name, mode) in modes {
        match runtime.block_on(call_cycle(mode)) {
            Ok((requests, writes, execs)) => {
                report(
                    &format!("k8s.requests_per_call_cycle_{name}"),
                    requests as f64,
                    "requests",
                );
                report(
                    &format!("k8s.writes_per_call_cycle_{name}"),
                    writes as f64,
                    "requests",
                );
                report(
                    &format!("k8s.execs_per_call_cycle_{name}"),
                    execs as f64,
                    "requests",
                );
            }
            Err(e) => eprintln!("k8s call cycle ({name}) not measured: {e}"),
        }
    }
    match runtime.block_on(idle()) {
        Ok(per_min) => report("k8s.idle_requests_per_min", per_min, "requests/min"),
        Err(e) => eprintln!("k8s idle requests not measured: {e}"),
    }
}

/// Waits (bounded) until `done` holds for the keeper.
async fn until<B: sandkeeper_tokio::Backend>(
    keeper: &Keeper<B>,
    what: &str,
    done: impl Fn(&Keeper<B>) -> bool,
) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done(keeper) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .map_err(|_| format!("not {what} in time"))
}

/// On claims (issue 14): the requests of a call that finds its key's sandbox warm (no upload),
/// watches and Lease renewals excluded; and a resuming call's acquire time against a fresh
/// one's (`Suspend`).
pub async fn warm_hit_and_resume() -> Result<(u64, f64), String> {
    use sandkeeper::{ReleasePolicy, SandboxState};
    let claims = || Mode::AgentSandbox {
        warm_pool: "pool".into(),
    };
    let spec = |c: &str| -> Result<CallSpec, String> {
        Ok(CallSpec::new(
            CallId::new(c).map_err(|e| e.to_string())?,
            SessionId::new("s").map_err(|e| e.to_string())?,
        ))
    };
    // A warm hit.
    let server = loopback().await?;
    let core = Config {
        release: ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(600),
        },
        ..Config::default()
    };
    let keeper = Keeper::new(
        KeeperConfig::with_core(core),
        connect(&server, claims()).await?,
    )
    .map_err(|e| e.to_string())?;
    let guard = keeper
        .acquire(spec("c1")?)
        .await
        .map_err(|e| e.to_string())?;
    let x = guard.sandbox();
    guard.release().await;
    until(&keeper, "warm", |k| {
        k.sandbox_state(x) == Some(SandboxState::Idle)
    })
    .await?;
    let before = server.request_counts();
    let guard = keeper
        .acquire(spec("c2")?)
        .await
        .map_err(|e| e.to_string())?;
    if guard.sandbox() != x {
        return Err("the second call did not find the warm sandbox".into());
    }
    guard.release().await;
    until(&keeper, "warm again", |k| {
        k.sandbox_state(x) == Some(SandboxState::Idle)
    })
    .await?;
    let warm: u64 = grown(&before, &server.request_counts())
        .iter()
        .filter(|(r, _)| r.verb != Verb::Watch && r.resource != "leases")
        .map(|(_, n)| n)
        .sum();
    keeper.close(Duration::from_secs(10)).await;

    // A resume against a fresh start.
    let server = loopback().await?;
    let core = Config {
        release: ReleasePolicy::Suspend,
        ..Config::default()
    };
    let keeper = Keeper::new(
        KeeperConfig::with_core(core),
        connect(&server, claims()).await?,
    )
    .map_err(|e| e.to_string())?;
    let mut fresh = Vec::new();
    let mut resumed = Vec::new();
    for round in 0..3 {
        let at = crate::measure::wall();
        let guard = keeper
            .acquire(spec(&format!("r{round}"))?)
            .await
            .map_err(|e| e.to_string())?;
        if round == 0 {
            fresh.push(at.elapsed());
        } else {
            resumed.push(at.elapsed());
        }
        guard.release().await;
        until(&keeper, "suspended", |k| k.stats().suspended > round).await?;
    }
    // A second key's fresh starts, for a fair median.
    for round in 0..2 {
        let at = crate::measure::wall();
        let guard = keeper
            .acquire(CallSpec::new(
                CallId::new(format!("f{round}")).map_err(|e| e.to_string())?,
                SessionId::new(format!("t{round}")).map_err(|e| e.to_string())?,
            ))
            .await
            .map_err(|e| e.to_string())?;
        fresh.push(at.elapsed());
        guard.release().await;
    }
    keeper.close(Duration::from_secs(10)).await;
    fresh.sort();
    resumed.sort();
    let ratio = resumed[resumed.len() / 2].as_secs_f64() / fresh[fresh.len() / 2].as_secs_f64();
    Ok((warm, ratio))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writes and execs of one call are exact (the reads may vary with watch timing): a
    /// claim or pod created and deleted, an upload's extract and rename.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_writes_twice_and_execs_twice_in_either_mode() {
        for mode in [
            Mode::AgentSandbox {
                warm_pool: "pool".into(),
            },
            pod_mode(),
        ] {
            let (requests, writes, execs) = call_cycle(mode).await.unwrap();
            assert_eq!((writes, execs), (2, 2));
            assert!(requests >= writes, "{requests}");
        }
    }
}
