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

/// Where a death seen on an object goes, by the sandbox number on its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Suspended by this backend (or being suspended): the pod deletion is the suspension's own
    /// doing, and nothing of this sandbox is the core's any more. Held back.
    Suspended,
    /// Resumed as another sandbox: report that one.
    Now(u64),
}

/// Counts of the deaths the backend's watch saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeathCounts {
    /// Reported to the keeper.
    pub reported: u64,
    /// Held back: deaths of suspended sandboxes (the suspension deletes the pod).
    pub held_back: u64,
}

/// The backend's map from the sandbox numbers on objects' labels to the sandbox a death is
/// reported for: suspended sandboxes are held back, and the labels a resumed claim's objects
/// still carry (its Sandbox's pod template keeps the first number) name the sandbox that
/// resumed it. Chains stay one step long: a resume rewrites every route to the resumed number.
#[derive(Debug)]
pub struct DeathRoutes {
    routes: std::sync::Mutex<std::collections::HashMap<u64, Route>>,
    counts: tokio::sync::watch::Sender<DeathCounts>,
}

impl Default for DeathRoutes {
    fn default() -> Self {
        DeathRoutes {
            routes: Default::default(),
            counts: tokio::sync::watch::channel(DeathCounts::default()).0,
        }
    }
}

impl DeathRoutes {
    fn routes(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds back deaths of `sandbox` from now on.
    pub fn suspend(&self, sandbox: u64) {
        self.routes().insert(sandbox, Route::Suspended);
    }

    /// Objects labelled `label` (and every number routed to it) now serve `sandbox`.
    pub fn resume(&self, label: u64, sandbox: u64) {
        let mut r = self.routes();
        for v in r.values_mut() {
            if *v == Route::Now(label) {
                *v = Route::Now(sandbox);
            }
        }
        r.insert(label, Route::Now(sandbox));
        r.remove(&sandbox);
    }

    /// `sandbox` is shut down: its routes go.
    pub fn forget(&self, sandbox: u64) {
        let mut r = self.routes();
        r.remove(&sandbox);
        r.retain(|_, v| *v != Route::Now(sandbox));
    }

    /// The sandbox to report a death seen on `label` for, or `None` to hold it back. Counts
    /// either way.
    pub fn route(&self, label: u64) -> Option<u64> {
        let target = {
            let r = self.routes();
            match r.get(&label) {
                Some(Route::Suspended) => None,
                Some(Route::Now(x)) => match r.get(x) {
                    Some(Route::Suspended) => None,
                    _ => Some(*x),
                },
                None => Some(label),
            }
        };
        self.counts.send_modify(|c| match target {
            Some(_) => c.reported += 1,
            None => c.held_back += 1,
        });
        target
    }

    /// The counts so far, updated as deaths are seen.
    pub fn counts(&self) -> tokio::sync::watch::Receiver<DeathCounts> {
        self.counts.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_hold_back_suspended_and_follow_resumes() {
        let r = DeathRoutes::default();
        assert_eq!(r.route(1), Some(1));
        r.suspend(1);
        assert_eq!(r.route(1), None);
        r.resume(1, 5);
        assert_eq!(r.route(1), Some(5), "old labels name the resumed sandbox");
        assert_eq!(r.route(5), Some(5));
        r.suspend(5);
        assert_eq!(
            r.route(1),
            None,
            "the first label follows a second suspension"
        );
        assert_eq!(r.route(5), None);
        r.resume(5, 9);
        assert_eq!(
            (r.route(1), r.route(5), r.route(9)),
            (Some(9), Some(9), Some(9))
        );
        r.forget(9);
        assert_eq!((r.route(1), r.route(5)), (Some(1), Some(5)));
        let c = *r.counts().borrow();
        assert_eq!(
            c,
            DeathCounts {
                reported: 8,
                held_back: 3
            }
        );
    }
}
