//! Deaths from watches. A pod of this owner that is deleted, finished or failed, or a claim that
//! is deleted or reaches a terminal reason, is reported as a loss of the sandbox whose number
//! its `sandkeeper.sandbox.users.io/sandbox` label carries:
//!
//! | mode | object | loss |
//! |---|---|---|
//! | agent-sandbox | pod | [`Loss::Instance`]: only the running instance; the claim, its Sandbox and their volumes remain (an eviction, a node drain, an OOM kill, a pod deleted by hand, the controller's own suspension) |
//! | agent-sandbox | claim | [`Loss::Sandbox`] |
//! | pod | pod | [`Loss::Sandbox`]: the pod is all there is |
//!
//! The watch keeps no table of incarnations and interprets nothing: every object of a
//! sandbox is labelled with that sandbox's number from birth (a resume relabels the claim and
//! its Sandbox's pod template before the new pod exists, see [`crate::suspend`]), so a late
//! event of an earlier incarnation names the earlier sandbox. The core decides what a report
//! means: a pod lost while its sandbox is being suspended is the suspension's own doing, and a
//! report about a sandbox the core no longer tracks (suspended, or an earlier incarnation of a
//! resumed one) is stale and ignored. Each object is reported once ([`Reported`]: a deleted pod
//! shows its loss while `Terminating` and again when removed); a report repeated after a
//! re-list is harmless for the same reason. A DELETED event is checked against the object as it
//! is now ([`removed_or_left`]): an object that only left the owner's selector (relabelled, in
//! a fleet) is not a loss.
//!
//! A pod's loss is never more than the instance's, whoever deleted it: the controller makes
//! the pod again on the same volumes (or, for a suspension, keeps the volumes for the next
//! resume), so the core keeps the workspace (it suspends the sandbox, and the key's next start
//! resumes the claim). That holds for the controller's own auto-suspension too
//! ([`crate::crd::Suspension::ByController`]): it deletes the pod and leaves the claim, whose
//! `Ready` reason (`SandboxAutoSuspended`, forwarded from the Sandbox) is not terminal, so the
//! claim's watch reports nothing and the pod's watch a lost instance. Only a claim deleted or
//! failed for good ends the sandbox.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use sandkeeper_tokio::Loss;

use crate::cluster::{calls, Cluster};
use crate::config::Mode;
use crate::crd::{ClaimState, SandboxClaim};
use crate::error::{Call, ErrorClass};
use crate::names::{self, SANDBOX};
use crate::pod::{pod_state, PodState};

/// A loss seen on an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// The sandbox number on the object's `sandkeeper.sandbox.users.io/sandbox` label.
    pub sandbox: u64,
    /// What of that sandbox is lost.
    pub loss: Loss,
    /// What was seen.
    pub reason: String,
}

/// Counts of the losses a backend's death watch reported, by kind. Plain counts: whether a
/// report was a death, the suspension's own doing or stale is the core's to say (its stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    /// Reported as [`Loss::Sandbox`].
    pub sandboxes: u64,
    /// Reported as [`Loss::Instance`].
    pub instances: u64,
}

impl LossCounts {
    /// Counts one more report of `loss`.
    pub fn add(&mut self, loss: Loss) {
        match loss {
            Loss::Sandbox => self.sandboxes += 1,
            Loss::Instance => self.instances += 1,
        }
    }

    /// Every report.
    pub fn total(&self) -> u64 {
        self.sandboxes + self.instances
    }
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

/// What losing a pod loses in `mode`: the running instance of a claim, or the whole sandbox
/// of a plain pod.
pub fn pod_loss(mode: &Mode) -> Loss {
    match mode {
        Mode::AgentSandbox { .. } => Loss::Instance,
        Mode::Pod { .. } => Loss::Sandbox,
    }
}

/// The loss a pod event shows in `mode`, if any: a deletion, or a pod finished, failed or
/// being deleted.
pub fn pod_death(event: Event<Pod>, mode: &Mode) -> Option<Death> {
    let (p, why) = match event {
        Event::Delete(p) => (p, "deleted".to_string()),
        Event::Apply(p) | Event::InitApply(p) => match pod_state(&p) {
            PodState::Finished(why) => (p, why),
            _ => return None,
        },
        _ => return None,
    };
    Some(Death {
        sandbox: sandbox_of(&p)?,
        loss: pod_loss(mode),
        reason: format!("pod {} {why}", p.name_any()),
    })
}

/// The loss a claim event shows (agent-sandbox mode), if any: a deletion or a terminal
/// reason ends the whole sandbox.
pub fn claim_death(event: Event<SandboxClaim>) -> Option<Death> {
    let (c, why) = match event {
        Event::Delete(c) => (c, "deleted".to_string()),
        Event::Apply(c) | Event::InitApply(c) => match c.state() {
            ClaimState::Failed { reason, .. } => (c, reason),
            _ => return None,
        },
        _ => return None,
    };
    Some(Death {
        sandbox: sandbox_of(&c)?,
        loss: Loss::Sandbox,
        reason: format!("claim {} {why}", c.name_any()),
    })
}

/// Which objects a watch has already reported, so that each object (by UID) is reported once:
/// a pod being deleted shows its loss twice, once `Terminating` (its `deletionTimestamp` set,
/// for the whole grace period) and once removed, and a failed pod or claim once more when it
/// is deleted. A UID is forgotten at its object's deletion, its last event, so the set holds
/// only objects that still exist; a re-list (after a watch expired) starts it afresh, and may
/// report an object again, which the core takes as a duplicate.
#[derive(Default)]
struct Reported(std::collections::HashSet<String>);

/// What [`Reported`] needs of an event.
enum Seen {
    /// A re-list starts.
    Relist,
    /// The object (UID) exists.
    Exists(String),
    /// The object (UID) was deleted.
    Deleted(String),
    /// Nothing to note.
    Other,
}

impl Seen {
    fn of<K: Resource>(ev: &Event<K>) -> Seen {
        match ev {
            Event::Init => Seen::Relist,
            Event::Apply(o) | Event::InitApply(o) => Seen::Exists(o.uid().unwrap_or_default()),
            Event::Delete(o) => Seen::Deleted(o.uid().unwrap_or_default()),
            Event::InitDone => Seen::Other,
        }
    }
}

impl Reported {
    /// Notes an event; with `loss`, answers whether it is the first report of its object.
    fn first(&mut self, seen: Seen, loss: bool) -> bool {
        match seen {
            Seen::Relist => {
                self.0.clear();
                false
            }
            Seen::Exists(uid) => loss && self.0.insert(uid),
            Seen::Deleted(uid) => !self.0.remove(&uid) && loss,
            Seen::Other => false,
        }
    }
}

/// What a DELETED event means. The API server sends DELETED both when an object is removed and
/// when it stops matching the watch's selector, and in both cases with the content the object
/// had while it matched (`cacheWatcher.convertToWatchEvent`), so the event alone cannot tell
/// them apart. In a fleet an object leaves an owner's selector without dying: a controller
/// working from a stale cache sets an adopted pod's owner label back to its last owner's for
/// one pass (the loopback's controllers do the same), or the key is handed over. So the object
/// is looked up again: the same object (UID) still there is seen as it is now (an `Apply`: a
/// loss only if it is terminating or finished); one that is not there (or is another object
/// under the same name) was removed.
///
/// While an object is outside the selector its losses are not seen. A relabel by a stale
/// controller is undone on its next pass, and the object comes back into the selector; a pod
/// deleted in that window (a second fault within one controller pass) comes back as a new pod
/// that is not reported. A lookup that keeps failing is taken as a removal, as before.
async fn removed_or_left<K>(
    api: &kube::Api<K>,
    gone: K,
    call: Call,
    retry: &crate::retry::RetryPolicy,
) -> Event<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let name = gone.name_any();
    let what = format!("{} {name}", call.resource);
    let now = retry
        .run(|| async {
            api.get_opt(&name)
                .await
                .map_err(|e| crate::cluster::err(e, call, &what))
        })
        .await;
    match now {
        Ok(now) => still_there(gone, now),
        Err(e) => {
            tracing::warn!(error = %e, object = %name,
                "death watch: a deleted object could not be looked up; taken as removed");
            Event::Delete(gone)
        }
    }
}

/// The event a DELETED event stands for once the object was looked up again (`now`): see
/// [`removed_or_left`].
fn still_there<K: Resource>(gone: K, now: Option<K>) -> Event<K> {
    match now {
        Some(now) if now.uid().is_some() && now.uid() == gone.uid() => Event::Apply(now),
        _ => Event::Delete(gone),
    }
}

async fn run<K, F>(
    api: kube::Api<K>,
    selector: String,
    (call, lookup): (Call, Call),
    retry: crate::retry::RetryPolicy,
    death: impl Fn(Event<K>) -> Option<Death> + Send + 'static,
    report: Arc<F>,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(Death) -> bool + Send + Sync + 'static,
{
    let mut stream =
        watcher::watcher(api.clone(), watcher::Config::default().labels(&selector)).boxed();
    let mut failures = 0;
    let mut reported = Reported::default();
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                failures = 0;
                let ev = match ev {
                    Event::Delete(gone) => removed_or_left(&api, gone, lookup, &retry).await,
                    ev => ev,
                };
                let seen = Seen::of(&ev);
                let d = death(ev);
                if reported.first(seen, d.is_some()) {
                    if let Some(d) = d {
                        if !report(d) {
                            return;
                        }
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
    /// Starts watching this owner's pods (and claims, in agent-sandbox mode) for losses, each
    /// reported to `report` as `pod_death` and `claim_death` in `deaths.rs` map it.
    pub fn spawn_death_watch(
        &self,
        report: impl Fn(Death) -> bool + Send + Sync + 'static,
    ) -> DeathWatch {
        let report = Arc::new(report);
        let selector = names::owner_selector(&self.config.owner);
        let mode = self.config.mode.clone();
        let mut tasks = vec![tokio::spawn(run(
            self.pods(),
            selector.clone(),
            (calls::WATCH_PODS, calls::GET_POD),
            self.retry,
            move |ev| pod_death(ev, &mode),
            report.clone(),
        ))];
        if matches!(self.config.mode, Mode::AgentSandbox { .. }) {
            tasks.push(tokio::spawn(run(
                self.claims(),
                selector,
                (calls::WATCH_CLAIMS, calls::GET_CLAIM),
                self.retry,
                claim_death,
                report,
            )));
        }
        DeathWatch(tasks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(sandbox: Option<u64>, phase: &str) -> Pod {
        let labels = sandbox.map_or(json!({}), |n| json!({SANDBOX: n.to_string()}));
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "labels": labels},
            "status": {"phase": phase, "reason": "Error"},
        }))
        .unwrap()
    }

    fn claim(sandbox: u64, ready: Option<(&str, &str)>) -> SandboxClaim {
        let conditions = ready.map_or(
            json!([]),
            |(status, reason)| json!([{"type": "Ready", "status": status, "reason": reason}]),
        );
        serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": "c", "labels": {SANDBOX: sandbox.to_string()}},
            "spec": {"warmPoolRef": {"name": "pool"}},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    /// A pod deleted with a grace period shows its loss twice (`Terminating`, then removed):
    /// reported once. A pod removed without a `Terminating` event, a pod that lived and died
    /// again under a new UID, and an object seen again after a re-list are reported anew.
    #[test]
    fn each_object_is_reported_once_until_a_relist() {
        let mut r = Reported::default();
        let live = |uid: &str| Seen::Exists(uid.into());
        let gone = |uid: &str| Seen::Deleted(uid.into());
        assert!(!r.first(live("a"), false), "alive: nothing to report");
        assert!(r.first(live("a"), true), "terminating: the first report");
        assert!(!r.first(live("a"), true), "still terminating");
        assert!(!r.first(gone("a"), true), "removed: reported already");
        assert!(
            r.first(gone("b"), true),
            "removed at once: the first report"
        );
        assert!(r.first(live("a2"), true), "a new UID is a new object");
        assert!(!r.first(Seen::Relist, false));
        assert!(r.first(live("a2"), true), "after a re-list, reported again");
        assert!(!r.first(Seen::Other, true));
        assert!(r.0.len() == 1, "removed objects are forgotten");
    }

    /// A DELETED event of an object that is still there under the same UID (it left the
    /// selector: a stale controller set its owner label back, found by the Kubernetes fleet
    /// harness test) is seen as the object is now: no loss while it runs, its loss once it
    /// terminates. One that is gone, or replaced by another object under the same name, was
    /// removed.
    #[test]
    fn a_deleted_object_still_there_left_the_selector() {
        let mode = Mode::AgentSandbox {
            warm_pool: "pool".into(),
        };
        let running = pod(Some(7), "Running");
        let left = still_there(running.clone(), Some(running.clone()));
        assert!(matches!(left, Event::Apply(_)));
        assert_eq!(pod_death(left, &mode), None, "relabelled, not dead");

        let mut terminating = running.clone();
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-12-04T00:00:00Z".parse().unwrap(),
            ));
        let d = pod_death(still_there(running.clone(), Some(terminating)), &mode);
        assert_eq!(loss(d), Some((7, Loss::Instance)), "terminating: a loss");

        let removed = still_there(running.clone(), None);
        assert!(matches!(removed, Event::Delete(_)));
        assert_eq!(loss(pod_death(removed, &mode)), Some((7, Loss::Instance)));

        let mut successor = running.clone();
        successor.metadata.uid = Some("u2".into());
        let replaced = still_there(running.clone(), Some(successor));
        assert!(
            matches!(replaced, Event::Delete(_)),
            "another object: removed"
        );

        let mut no_uid = running.clone();
        no_uid.metadata.uid = None;
        let unknown = still_there(no_uid.clone(), Some(no_uid));
        assert!(
            matches!(unknown, Event::Delete(_)),
            "no UID to compare: removed"
        );
    }

    fn loss(d: Option<Death>) -> Option<(u64, Loss)> {
        d.map(|d| (d.sandbox, d.loss))
    }

    #[test]
    fn events_map_to_the_labelled_sandbox_and_the_loss_of_their_mode() {
        let claims = Mode::AgentSandbox {
            warm_pool: "pool".into(),
        };
        let pods = Mode::Pod {
            template: Box::default(),
        };
        // A pod of a claim is only the running instance; a plain pod is the whole sandbox.
        for (mode, expected) in [(&claims, Loss::Instance), (&pods, Loss::Sandbox)] {
            let deleted = pod_death(Event::Delete(pod(Some(7), "Running")), mode);
            assert_eq!(loss(deleted), Some((7, expected)), "{mode:?}");
            let failed = pod_death(Event::Apply(pod(Some(7), "Failed")), mode).unwrap();
            assert_eq!((failed.sandbox, failed.loss), (7, expected));
            assert!(failed.reason.contains("Failed Error"), "{}", failed.reason);
            let listed = pod_death(Event::InitApply(pod(Some(8), "Succeeded")), mode);
            assert_eq!(loss(listed), Some((8, expected)));
            for alive in ["Pending", "Running"] {
                assert_eq!(pod_death(Event::Apply(pod(Some(7), alive)), mode), None);
            }
            assert_eq!(
                pod_death(Event::Delete(pod(None, "Running")), mode),
                None,
                "an object without a sandbox number names nobody"
            );
            assert_eq!(pod_death(Event::Init, mode), None);
        }
        // A claim (agent-sandbox mode only) deleted or failed for good ends the whole sandbox.
        assert_eq!(
            loss(claim_death(Event::Delete(claim(3, None)))),
            Some((3, Loss::Sandbox))
        );
        let expired = claim_death(Event::Apply(claim(3, Some(("False", "ClaimExpired")))));
        assert_eq!(loss(expired), Some((3, Loss::Sandbox)));
        for passing in [
            None,
            Some(("True", "DependenciesReady")),
            Some(("False", "DependenciesNotReady")),
            Some(("False", "SandboxSuspended")),
            // Auto-suspension's controllers: a suspension by mode, and the controller's own
            // suspension for inactivity; the claim forwards its Sandbox's reason. Neither ends
            // the sandbox: its pod's loss is an instance's.
            Some(("False", "SandboxUserSuspended")),
            Some(("False", "SandboxAutoSuspended")),
        ] {
            assert_eq!(
                claim_death(Event::Apply(claim(3, passing))),
                None,
                "{passing:?}"
            );
        }
    }
}
