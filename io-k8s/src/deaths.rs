//! Deaths from watches: a pod of this owner that is deleted, finished or failed, or a claim that
//! is deleted or reaches a terminal reason, is reported with its sandbox number (from the
//! `sandkeeper.io/sandbox` label). Duplicate reports are harmless (the core ignores stale ones).

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};

use crate::cluster::{calls, Cluster};
use crate::config::Mode;
use crate::crd::{ClaimState, SandboxClaim};
use crate::error::{Call, ErrorClass};
use crate::names::{self, SANDBOX};
use crate::pod::{pod_state, PodState};

/// One sandbox found gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// The core's sandbox number.
    pub sandbox: u64,
    /// What was seen.
    pub reason: String,
}

/// The running death watch; stops when dropped, or when the report callback answers `false`.
pub struct DeathWatch(Vec<tokio::task::JoinHandle<()>>);

impl Drop for DeathWatch {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn sandbox_of<K: Resource>(o: &K) -> Option<u64> {
    o.labels().get(SANDBOX).and_then(|s| s.parse().ok())
}

fn pod_death(event: Event<Pod>) -> Option<Death> {
    match event {
        Event::Delete(p) => Some(Death {
            sandbox: sandbox_of(&p)?,
            reason: format!("pod {} deleted", p.name_any()),
        }),
        Event::Apply(p) | Event::InitApply(p) => match pod_state(&p) {
            PodState::Finished(why) => Some(Death {
                sandbox: sandbox_of(&p)?,
                reason: format!("pod {} {why}", p.name_any()),
            }),
            _ => None,
        },
        _ => None,
    }
}

fn claim_death(event: Event<SandboxClaim>) -> Option<Death> {
    match event {
        Event::Delete(c) => Some(Death {
            sandbox: sandbox_of(&c)?,
            reason: format!("claim {} deleted", c.name_any()),
        }),
        Event::Apply(c) | Event::InitApply(c) => match c.state() {
            ClaimState::Failed { reason, .. } => Some(Death {
                sandbox: sandbox_of(&c)?,
                reason: format!("claim {} {reason}", c.name_any()),
            }),
            _ => None,
        },
        _ => None,
    }
}

async fn run<K, F>(
    api: kube::Api<K>,
    selector: String,
    call: Call,
    retry: crate::retry::RetryPolicy,
    death: fn(Event<K>) -> Option<Death>,
    report: Arc<F>,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(Death) -> bool + Send + Sync + 'static,
{
    let mut stream = watcher::watcher(api, watcher::Config::default().labels(&selector)).boxed();
    let mut failures = 0;
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                failures = 0;
                if let Some(d) = death(ev) {
                    if !report(d) {
                        return;
                    }
                }
            }
            Err(watcher::Error::WatchError(s)) if s.code == 410 => {}
            Err(e) => {
                let e = crate::wait::classify_watch(e, call, "death watch");
                tracing::warn!(error = %e, "death watch failed; retrying");
                if e.class() == ErrorClass::Fatal {
                    // Permissions do not come back by themselves; keep trying slowly.
                    tokio::time::sleep(retry.max_delay).await;
                } else {
                    tokio::time::sleep(retry.pause(failures)).await;
                    failures += 1;
                }
            }
        }
    }
}

impl Cluster {
    /// Starts watching this owner's pods (and claims, in agent-sandbox mode) for deaths.
    pub fn spawn_death_watch(
        &self,
        report: impl Fn(Death) -> bool + Send + Sync + 'static,
    ) -> DeathWatch {
        let report = Arc::new(report);
        let selector = names::owner_selector(&self.config.owner);
        let mut tasks = vec![tokio::spawn(run(
            self.pods(),
            selector.clone(),
            calls::WATCH_PODS,
            self.retry,
            pod_death,
            report.clone(),
        ))];
        if matches!(self.config.mode, Mode::AgentSandbox { .. }) {
            tasks.push(tokio::spawn(run(
                self.claims(),
                selector,
                calls::WATCH_CLAIMS,
                self.retry,
                claim_death,
                report,
            )));
        }
        DeathWatch(tasks)
    }
}
