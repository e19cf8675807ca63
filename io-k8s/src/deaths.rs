//! Deaths from watches: a pod of this owner that is deleted, finished or failed, or a claim that
//! is deleted or reaches a terminal reason, is reported with its sandbox number (from the
//! `sandkeeper.io/sandbox` label), routed through [`DeathRoutes`]. Duplicate reports are
//! harmless (the core ignores stale ones).

use std::collections::HashMap;
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
use crate::pod::{pod_state, uid_of, PodState};

/// One sandbox found gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// The sandbox number on the object's `sandkeeper.io/sandbox` label.
    pub sandbox: u64,
    /// The object it was seen on.
    pub seen_on: SeenOn,
    /// The object is deleted: no later event names it.
    pub deleted: bool,
    /// What was seen.
    pub reason: String,
}

/// The kind of object a death was seen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenOn {
    /// A pod, with its UID.
    Pod {
        /// `metadata.uid` (empty if the server sent none).
        uid: String,
    },
    /// A claim (agent-sandbox mode).
    Claim,
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
    let (p, deleted, why) = match event {
        Event::Delete(p) => (p, true, "deleted".to_string()),
        Event::Apply(p) | Event::InitApply(p) => match pod_state(&p) {
            PodState::Finished(why) => (p, false, why),
            _ => return None,
        },
        _ => return None,
    };
    Some(Death {
        sandbox: sandbox_of(&p)?,
        seen_on: SeenOn::Pod { uid: uid_of(&p) },
        deleted,
        reason: format!("pod {} {why}", p.name_any()),
    })
}

fn claim_death(event: Event<SandboxClaim>) -> Option<Death> {
    let (c, deleted, why) = match event {
        Event::Delete(c) => (c, true, "deleted".to_string()),
        Event::Apply(c) | Event::InitApply(c) => match c.state() {
            ClaimState::Failed { reason, .. } => (c, false, reason),
            _ => return None,
        },
        _ => return None,
    };
    Some(Death {
        sandbox: sandbox_of(&c)?,
        seen_on: SeenOn::Claim,
        deleted,
        reason: format!("claim {} {why}", c.name_any()),
    })
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
    /// Held back: deaths of suspended sandboxes (the suspension deletes the pod), and events
    /// of the pods suspensions removed.
    pub held_back: u64,
    /// Of those held back: events of a pod a suspension removed that the watch delivered after
    /// the claim had resumed. By its label alone such an event names the resumed sandbox; only
    /// the pod's UID shows it is the old pod's.
    pub late_pod_events: u64,
}

/// The routing state, under one lock.
#[derive(Debug, Default)]
struct Table {
    /// By the sandbox number on an object's label.
    routes: HashMap<u64, Route>,
    /// The UIDs of the pods suspensions removed, each with the sandbox number that stands for
    /// its claim now (rewritten by a resume as the routes are). An event of such a pod is
    /// never a death: the pod was the suspension's to remove. An entry goes with the pod's
    /// Delete event (its last) or when its claim ends; one whose Delete a restarted watch never
    /// delivered stays until then.
    retired_pods: HashMap<String, u64>,
}

impl Table {
    /// The sandbox a death on `label` names, or `None` when that sandbox is suspended.
    fn target(&self, label: u64) -> Option<u64> {
        match self.routes.get(&label) {
            Some(Route::Suspended) => None,
            Some(Route::Now(x)) => match self.routes.get(x) {
                Some(Route::Suspended) => None,
                _ => Some(*x),
            },
            None => Some(label),
        }
    }

    /// The suspended sandbox `label` leads to, if any.
    fn suspended_root(&self, label: u64) -> Option<u64> {
        let root = match self.routes.get(&label) {
            Some(Route::Now(x)) => *x,
            _ => label,
        };
        (self.routes.get(&root) == Some(&Route::Suspended)).then_some(root)
    }

    fn forget(&mut self, sandbox: u64) {
        self.routes.remove(&sandbox);
        self.routes.retain(|_, v| *v != Route::Now(sandbox));
        self.retired_pods.retain(|_, v| *v != sandbox);
    }
}

/// The backend's map from the objects a death is seen on to the sandbox it is reported for.
///
/// - Suspended sandboxes are held back: their pod's deletion is the suspension's doing.
/// - The labels a resumed claim's objects still carry (its Sandbox's pod template keeps the
///   first number) name the sandbox that resumed it. Chains stay one step long: a resume
///   rewrites every route to the resumed number.
/// - Events of a pod a suspension removed are held back by the pod's UID, whenever they come.
///   The watch may deliver the old pod's Delete after the resume; its labels, and its name
///   (agent-sandbox names the pod after its Sandbox), are the resumed pod's too.
#[derive(Debug)]
pub struct DeathRoutes {
    table: std::sync::Mutex<Table>,
    counts: tokio::sync::watch::Sender<DeathCounts>,
}

impl Default for DeathRoutes {
    fn default() -> Self {
        DeathRoutes {
            table: Default::default(),
            counts: tokio::sync::watch::channel(DeathCounts::default()).0,
        }
    }
}

impl DeathRoutes {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds back deaths of `sandbox` from now on, and every event of its pod `pod_uid` (the
    /// one the suspension removes) for good.
    pub fn suspend(&self, sandbox: u64, pod_uid: &str) {
        let mut t = self.table();
        t.routes.insert(sandbox, Route::Suspended);
        if !pod_uid.is_empty() {
            t.retired_pods.insert(pod_uid.to_string(), sandbox);
        }
    }

    /// Objects labelled `label` (and every number routed to it) now serve `sandbox`.
    pub fn resume(&self, label: u64, sandbox: u64) {
        let mut t = self.table();
        for v in t.routes.values_mut() {
            if *v == Route::Now(label) {
                *v = Route::Now(sandbox);
            }
        }
        for v in t.retired_pods.values_mut() {
            if *v == label {
                *v = sandbox;
            }
        }
        t.routes.insert(label, Route::Now(sandbox));
        t.routes.remove(&sandbox);
    }

    /// `sandbox` is shut down: its routes and retired pods go.
    pub fn forget(&self, sandbox: u64) {
        self.table().forget(sandbox);
    }

    /// The sandbox to report `death` for, or `None` to hold it back. Counts either way.
    pub fn route(&self, death: &Death) -> Option<u64> {
        let (target, late) = {
            let mut t = self.table();
            let by_label = t.target(death.sandbox);
            let retired = match &death.seen_on {
                SeenOn::Pod { uid } => {
                    let retired = t.retired_pods.contains_key(uid);
                    if retired && death.deleted {
                        t.retired_pods.remove(uid);
                    }
                    retired
                }
                SeenOn::Claim => {
                    if death.deleted {
                        // A suspended claim deleted (swept, expired, by hand): its chain ends.
                        if let Some(root) = t.suspended_root(death.sandbox) {
                            t.forget(root);
                        }
                    }
                    false
                }
            };
            if retired {
                (None, by_label.is_some())
            } else {
                (by_label, false)
            }
        };
        self.counts.send_modify(|c| match target {
            Some(_) => c.reported += 1,
            None => {
                c.held_back += 1;
                c.late_pod_events += u64::from(late);
            }
        });
        target
    }

    /// The counts so far, updated as deaths are seen.
    pub fn counts(&self) -> tokio::sync::watch::Receiver<DeathCounts> {
        self.counts.subscribe()
    }

    /// How many routes and retired pods are kept.
    #[cfg(test)]
    fn entries(&self) -> (usize, usize) {
        let t = self.table();
        (t.routes.len(), t.retired_pods.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(label: u64, uid: &str, deleted: bool) -> Death {
        Death {
            sandbox: label,
            seen_on: SeenOn::Pod { uid: uid.into() },
            deleted,
            reason: String::new(),
        }
    }

    fn claim(label: u64, deleted: bool) -> Death {
        Death {
            sandbox: label,
            seen_on: SeenOn::Claim,
            deleted,
            reason: String::new(),
        }
    }

    /// Routes by label alone: a pod event under `label` from a pod no suspension removed.
    fn by_label(r: &DeathRoutes, label: u64) -> Option<u64> {
        r.route(&pod(label, "", false))
    }

    #[test]
    fn routes_hold_back_suspended_and_follow_resumes() {
        let r = DeathRoutes::default();
        assert_eq!(by_label(&r, 1), Some(1));
        r.suspend(1, "");
        assert_eq!(by_label(&r, 1), None);
        r.resume(1, 5);
        assert_eq!(
            by_label(&r, 1),
            Some(5),
            "old labels name the resumed sandbox"
        );
        assert_eq!(by_label(&r, 5), Some(5));
        r.suspend(5, "");
        assert_eq!(
            by_label(&r, 1),
            None,
            "the first label follows a second suspension"
        );
        assert_eq!(by_label(&r, 5), None);
        r.resume(5, 9);
        assert_eq!(
            (by_label(&r, 1), by_label(&r, 5), by_label(&r, 9)),
            (Some(9), Some(9), Some(9))
        );
        r.forget(9);
        assert_eq!((by_label(&r, 1), by_label(&r, 5)), (Some(1), Some(5)));
        assert_eq!(r.entries(), (0, 0));
        let c = *r.counts().borrow();
        assert_eq!(
            c,
            DeathCounts {
                reported: 8,
                held_back: 3,
                late_pod_events: 0,
            }
        );
    }

    #[test]
    fn a_retired_pod_is_never_a_death_even_after_the_resume() {
        let r = DeathRoutes::default();
        r.suspend(1, "uid-a");
        // During the suspension: held back by label and by UID.
        assert_eq!(r.route(&pod(1, "uid-a", false)), None);
        r.resume(1, 5);
        // The resumed pod (same name, same first label, new UID) dies: reported as 5's.
        assert_eq!(r.route(&pod(1, "uid-b", false)), Some(5));
        // The old pod's late events: held back, counted as late.
        assert_eq!(r.route(&pod(1, "uid-a", false)), None);
        assert_eq!(r.route(&pod(1, "uid-a", true)), None);
        assert_eq!(
            r.entries(),
            (1, 0),
            "the Delete was the old pod's last event"
        );
        assert_eq!(
            *r.counts().borrow(),
            DeathCounts {
                reported: 1,
                held_back: 3,
                late_pod_events: 2,
            }
        );
        // The claim's own events follow its label.
        assert_eq!(r.route(&claim(5, false)), Some(5));
    }

    #[test]
    fn retired_pods_follow_a_chain_of_resumes_and_end_with_it() {
        let r = DeathRoutes::default();
        r.suspend(1, "uid-a");
        r.resume(1, 5);
        r.suspend(5, "uid-b");
        r.resume(5, 9);
        assert_eq!(r.route(&pod(1, "uid-a", false)), None);
        assert_eq!(r.route(&pod(1, "uid-b", false)), None);
        assert_eq!(r.route(&pod(1, "uid-c", false)), Some(9));
        assert_eq!(r.entries().1, 2);
        r.forget(9);
        assert_eq!(r.entries(), (0, 0), "the chain's shutdown forgets its pods");
    }

    #[test]
    fn deleting_a_suspended_claim_ends_its_chain() {
        let r = DeathRoutes::default();
        r.suspend(1, "uid-a");
        r.resume(1, 5);
        r.suspend(5, "uid-b");
        // Another chain stays.
        r.suspend(7, "uid-c");
        assert_eq!(
            r.route(&claim(5, false)),
            None,
            "a suspended claim's failure"
        );
        assert_eq!(r.entries(), (3, 3));
        assert_eq!(r.route(&claim(5, true)), None, "swept while suspended");
        assert_eq!(r.entries(), (1, 1), "only the other chain is left");
        assert_eq!(r.route(&pod(7, "uid-c", true)), None);
        assert_eq!(r.entries(), (1, 0));
        // A claim deleted while it serves a sandbox is that sandbox's death, chain untouched.
        r.resume(7, 8);
        assert_eq!(r.route(&claim(8, true)), Some(8));
        assert_eq!(r.entries(), (1, 0));
    }
}
