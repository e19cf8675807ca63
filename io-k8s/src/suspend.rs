//! Suspending and resuming an agent-sandbox claim (`Stop`/`Persist` with `suspend`, a `Start`
//! with `resume_from`): `Sandbox.spec.operatingMode: Suspended` deletes the Sandbox's pod and
//! keeps the Sandbox (its identity, volumes and Service) under its claim; `Running` brings a pod
//! back.
//!
//! The snapshot the core keeps for a key is the claim's name (`sk-<owner>-<number>`, the number
//! of the sandbox that first made it): the claim owns the Sandbox whose volumes survive the
//! suspension. A resume checks the claim is still there and ours, then names the claim's
//! objects after the new sandbox *before* a new pod exists: the claim's `sandkeeper.sandbox.users.io/sandbox`
//! label, the label it asks its pod to carry (`spec.additionalPodMetadata`, from which the
//! claim controller keeps the Sandbox's pod template), and the label of the Sandbox's pod
//! template itself, from which the Sandbox controller makes the pod. So the new pod carries
//! the new number from birth, and every event of the suspended pod, however late the watch
//! delivers it, carries the old one. The resume then pushes the `shutdownTime` backstop out
//! again, sets `Running` and waits until the Sandbox is Ready and its pod runs.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::cluster::{calls, err, Cluster};
use crate::config::Mode;
use crate::crd::{ClaimState, Sandbox, Suspension, AUTO_SUSPENDED_REASON, READY, TERMINAL_REASONS};
use crate::error::K8sError;
use crate::names::{self, OWNER, SANDBOX};
use crate::pod::{pod_state, uid_of, PodState};
use crate::sandbox::SandboxHandle;
use crate::wait::{wait_for, Step};

pub use crate::crd::SUSPENDED_REASON;

/// A suspended claim found again for a resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspendedClaim {
    /// The claim.
    pub claim: String,
    /// Its Sandbox.
    pub sandbox_name: String,
    /// The sandbox number its `sandkeeper.sandbox.users.io/sandbox` label carries (the sandbox it served
    /// last, which the start's `resumes` names), when readable.
    pub label: Option<u64>,
}

/// What a resume found under a snapshot's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumable {
    /// The claim is there, ours, and not failed.
    Claim(SuspendedClaim),
    /// It is not (swept, expired, deleted by hand, or another owner's): start fresh.
    Lost(String),
}

/// The `Ready` condition of a Sandbox: (status, reason).
fn ready_of(s: &Sandbox) -> Option<(&str, &str)> {
    s.status.as_ref().and_then(|st| {
        st.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| (c.status.as_str(), c.reason.as_str()))
    })
}

fn bad_snapshot(snapshot: &str, why: &str) -> K8sError {
    K8sError::BadSnapshot {
        snapshot: snapshot.to_string(),
        why: why.to_string(),
    }
}

impl Cluster {
    /// The claim a snapshot names. Only `sk-<this owner>-<number>` is accepted (the references
    /// this backend hands out); anything else is [`K8sError::BadSnapshot`].
    pub fn claim_of_snapshot(&self, snapshot: &str) -> Result<String, K8sError> {
        let (owner, name) = self.claim_name(snapshot)?;
        if owner != self.config.owner {
            return Err(bad_snapshot(
                snapshot,
                &format!("expected a claim of owner {:?}", self.config.owner),
            ));
        }
        Ok(name)
    }

    /// The claim a snapshot of a fleet names: `sk-<owner>-<number>` of any valid owner, as
    /// every process of a fleet hands out its own claims' names and the key's next owner
    /// resumes (or discards) what the last one suspended. Anything else is
    /// [`K8sError::BadSnapshot`].
    pub fn claim_of_fleet_snapshot(&self, snapshot: &str) -> Result<String, K8sError> {
        self.claim_name(snapshot).map(|(_, name)| name)
    }

    /// A snapshot read as the claim name `sk-<owner>-<number>` in canonical form, in
    /// agent-sandbox mode: its owner and the name.
    fn claim_name<'s>(&self, snapshot: &'s str) -> Result<(&'s str, String), K8sError> {
        let bad = |why: &str| bad_snapshot(snapshot, why);
        if !matches!(self.config.mode, Mode::AgentSandbox { .. }) {
            return Err(bad("snapshots are claims, and this backend is in pod mode"));
        }
        let (owner, number) = snapshot
            .strip_prefix("sk-")
            .and_then(|rest| rest.rsplit_once('-'))
            .ok_or_else(|| bad("expected sk-<owner>-<number>"))?;
        names::check_owner(owner).map_err(|e| bad(&e.to_string()))?;
        let n: u64 = number
            .parse()
            .map_err(|_| bad("expected a sandbox number after the owner"))?;
        let name = names::object_name(owner, n);
        if name != snapshot {
            return Err(bad("not in canonical form"));
        }
        Ok((owner, name))
    }

    /// Suspends a started claim: patches its Sandbox to `Suspended`, then waits (under the
    /// ready timeout) until the Sandbox reports it is no longer ready and the pod is gone.
    /// Fails fast when the Sandbox reaches a terminal reason (`SandboxExpired`, ...).
    pub async fn suspend_sandbox(&self, handle: &SandboxHandle) -> Result<(), K8sError> {
        let Some(sb) = handle.sandbox_name.as_deref() else {
            return Err(K8sError::Invalid {
                code: 0,
                reason: "WrongMode".into(),
                message: format!("{} has no Sandbox to suspend (pod mode)", handle.object),
            });
        };
        self.set_operating_mode(sb, true).await?;
        let deadline = tokio::time::Instant::now() + self.config.ready_timeout();
        let claim = handle.object.clone();
        wait_for(
            self.sandboxes(),
            sb,
            &format!("sandbox {sb} to suspend"),
            self.config.ready_timeout(),
            calls::WATCH_SANDBOXES,
            self.retry,
            |s: &Sandbox| match ready_of(s) {
                Some(("True", _)) => Step::Wait,
                Some((_, reason)) if TERMINAL_REASONS.contains(&reason) => {
                    Step::Fail(K8sError::Terminal {
                        claim: claim.clone(),
                        reason: reason.to_string(),
                        message: "while suspending".into(),
                    })
                }
                // Suspended by the controller, which has not seen the keeper's mode yet: a
                // resume that set `Running` before it does would find it still suspended by
                // the controller, which `Running` does not end.
                Some((_, AUTO_SUSPENDED_REASON)) => Step::Wait,
                Some((_, SUSPENDED_REASON)) => Step::Done(()),
                // Not ready for another reason: the pod is on its way out; its absence decides.
                Some(_) => Step::Done(()),
                None => Step::Wait,
            },
        )
        .await?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.wait_pod_gone(&handle.pod, left).await
    }

    /// Waits (at most `within`) until the pod `pod` is gone; at once when it is already.
    pub(crate) async fn wait_pod_gone(
        &self,
        pod: &str,
        within: std::time::Duration,
    ) -> Result<(), K8sError> {
        let gone = wait_for(
            self.pods(),
            pod,
            &format!("pod {pod} to go"),
            within,
            calls::WATCH_PODS,
            self.retry,
            |_: &k8s_openapi::api::core::v1::Pod| Step::<()>::Wait,
        )
        .await;
        match gone {
            Err(e) if e.is_gone() => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Ok(()),
        }
    }

    /// Looks up the claim a snapshot names for a resume: [`Resumable::Lost`] when it is gone,
    /// not ours, failed (it is deleted then), or never got a Sandbox.
    pub async fn find_suspended(&self, claim: &str) -> Result<Resumable, K8sError> {
        self.find_suspended_of(claim, true).await
    }

    /// [`find_suspended`](Self::find_suspended) in a fleet: the claim may be any process's
    /// (the key's last owner suspended it, and the key's record names it), so its owner label
    /// is not checked; the resume relabels it with this owner.
    pub async fn find_fleet_suspended(&self, claim: &str) -> Result<Resumable, K8sError> {
        self.find_suspended_of(claim, false).await
    }

    async fn find_suspended_of(&self, claim: &str, owned: bool) -> Result<Resumable, K8sError> {
        let what = format!("claim {claim}");
        let found = self
            .retry
            .run(|| async {
                self.claims()
                    .get_opt(claim)
                    .await
                    .map_err(|e| err(e, calls::GET_CLAIM, &what))
            })
            .await?;
        let Some(c) = found else {
            return Ok(Resumable::Lost(format!("{what} is gone")));
        };
        let labels = c.metadata.labels.clone().unwrap_or_default();
        if owned && labels.get(OWNER).map(String::as_str) != Some(self.config.owner.as_str()) {
            return Ok(Resumable::Lost(format!("{what} belongs to another owner")));
        }
        let sandbox_name = c
            .status
            .as_ref()
            .and_then(|s| s.sandbox.as_ref())
            .map(|s| s.name.clone())
            .filter(|n| !n.is_empty());
        let failed = match c.state() {
            ClaimState::Failed { reason, .. } => Some(reason),
            _ => None,
        };
        match (failed, sandbox_name) {
            (None, Some(sandbox_name)) => Ok(Resumable::Claim(SuspendedClaim {
                claim: claim.to_string(),
                sandbox_name,
                label: labels.get(SANDBOX).and_then(|v| v.parse().ok()),
            })),
            (failed, _) => {
                if let Err(e) = self.delete_claim(claim).await {
                    tracing::warn!(error = %e, %claim, "deleting a claim that cannot be resumed");
                }
                Ok(Resumable::Lost(match failed {
                    Some(reason) => format!("{what} failed: {reason}"),
                    None => format!("{what} has no Sandbox"),
                }))
            }
        }
    }

    /// Sets a suspended claim's `spec.lifecycle.shutdownTime` to `until` (rounded up to whole
    /// seconds, so never earlier) with policy `Delete`: the end of its retention, which the
    /// claim controller enforces by itself.
    pub async fn set_claim_expiry(
        &self,
        claim: &str,
        until: std::time::SystemTime,
    ) -> Result<(), K8sError> {
        let since = until
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
        let at = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
            .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
        let patch = json!({
            "spec": {"lifecycle": {"shutdownTime": at.to_string(), "shutdownPolicy": "Delete"}},
        });
        self.merge_patch_claim(claim, &patch).await
    }

    /// Merge-patches a claim, retried.
    pub(crate) async fn merge_patch_claim(
        &self,
        claim: &str,
        patch: &serde_json::Value,
    ) -> Result<(), K8sError> {
        let what = format!("claim {claim}");
        self.retry
            .run(|| async {
                self.claims()
                    .patch(claim, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(|_| ())
                    .map_err(|e| err(e, calls::PATCH_CLAIM, &what))
            })
            .await
    }

    /// Resumes a suspended claim as `sandbox`: its objects are labelled with `sandbox` before
    /// its new pod is made (see the module docs), its `shutdownTime` is pushed out to
    /// `maxLifetimeSecs` from now, its Sandbox is set `Running`, and the (new) pod is found
    /// once the Sandbox is Ready. On failure the claim is deleted (the core will not offer
    /// this snapshot again).
    pub async fn resume_sandbox(
        &self,
        sandbox: u64,
        found: &SuspendedClaim,
    ) -> Result<SandboxHandle, K8sError> {
        let r = self.resume_steps(sandbox, found).await;
        if r.is_err() {
            if let Err(e) = self.delete_claim(&found.claim).await {
                tracing::warn!(error = %e, claim = %found.claim, "deleting the claim of a failed resume");
            }
        }
        r
    }

    async fn resume_steps(
        &self,
        sandbox: u64,
        found: &SuspendedClaim,
    ) -> Result<SandboxHandle, K8sError> {
        let claim = &found.claim;
        let sb = &found.sandbox_name;
        let number = sandbox.to_string();
        // The claim first: the claim controller keeps the Sandbox's pod template labels in
        // line with `additionalPodMetadata`, so the Sandbox's label must not be reverted. The
        // owner label too: in a fleet the claim may be another process's (the key's last
        // owner suspended it), and this owner's death watch selects by it.
        let labels = json!({SANDBOX: number, OWNER: self.config.owner});
        let patch = json!({
            "metadata": {"labels": labels},
            "spec": {
                "lifecycle": {"shutdownTime": self.claim_shutdown_time()},
                "additionalPodMetadata": {"labels": labels},
            },
        });
        self.merge_patch_claim(claim, &patch).await?;
        // Then the Sandbox's pod template, which its new pod is made from: still suspended,
        // so no pod exists yet that could carry the old number.
        self.label_pod_template(sb, sandbox).await?;
        self.run_again(sb).await?;
        wait_for(
            self.sandboxes(),
            sb,
            &format!("sandbox {sb} to resume"),
            self.config.ready_timeout(),
            calls::WATCH_SANDBOXES,
            self.retry,
            |s: &Sandbox| match ready_of(s) {
                Some(("True", _)) => Step::Done(()),
                Some((_, reason)) if TERMINAL_REASONS.contains(&reason) => {
                    Step::Fail(K8sError::Terminal {
                        claim: claim.clone(),
                        reason: reason.to_string(),
                        message: "while resuming".into(),
                    })
                }
                _ => Step::Wait,
            },
        )
        .await?;
        let (pod, _) = self.find_pod(sb).await?;
        // A Sandbox that was never suspended (its pod lost and made again by the controller
        // before the suspension) or runs again already keeps the pod it has: the resume goes
        // on once the controller has carried the new number from the template onto it, so
        // that its loss names the sandbox it serves now.
        let pod_uid = self.wait_pod_labelled(&pod, sandbox).await?;
        Ok(SandboxHandle {
            sandbox,
            object: claim.clone(),
            sandbox_name: Some(sb.clone()),
            pod,
            pod_uid,
        })
    }

    /// Sets a suspended Sandbox running again. One the controller suspended by itself
    /// ([`Suspension::ByController`]: `operatingMode` is still `Running`, so setting it does
    /// nothing) is first suspended by mode, and set `Running` once the controller says so:
    /// a controller with auto-suspension counts `Running` after a suspension by mode as
    /// activity (`status.lastActivityTime`, on its own clock) and makes the pod again.
    pub(crate) async fn run_again(&self, sandbox_name: &str) -> Result<(), K8sError> {
        let sb = self.sandbox(sandbox_name).await?;
        if sb.suspension() == Suspension::ByController {
            tracing::info!(sandbox = %sandbox_name,
                "the controller suspended this Sandbox for inactivity; taking the suspension over");
            self.set_operating_mode(sandbox_name, true).await?;
            wait_for(
                self.sandboxes(),
                sandbox_name,
                &format!("sandbox {sandbox_name} to be suspended by its mode"),
                self.config.ready_timeout(),
                calls::WATCH_SANDBOXES,
                self.retry,
                |s: &Sandbox| match ready_of(s) {
                    Some(("False", AUTO_SUSPENDED_REASON)) | None => Step::Wait,
                    Some(_) => Step::Done(()),
                },
            )
            .await?;
        }
        self.set_operating_mode(sandbox_name, false).await
    }

    /// Waits (under the ready timeout) until the pod `pod` carries sandbox number `sandbox`
    /// and this owner on its labels, as the controller copies them from its Sandbox's
    /// template; returns its UID. A pod that is gone or finished meanwhile is an error.
    async fn wait_pod_labelled(&self, pod: &str, sandbox: u64) -> Result<String, K8sError> {
        let number = sandbox.to_string();
        let owner = self.config.owner.clone();
        wait_for(
            self.pods(),
            pod,
            &format!("pod {pod} to carry sandbox {sandbox}"),
            self.config.ready_timeout(),
            calls::WATCH_PODS,
            self.retry,
            |p: &Pod| {
                if let PodState::Finished(why) = pod_state(p) {
                    return Step::Fail(K8sError::Gone {
                        what: format!("pod {pod}"),
                        message: why,
                    });
                }
                let labels = p.metadata.labels.as_ref();
                let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
                if label(SANDBOX) == Some(number.as_str()) && label(OWNER) == Some(owner.as_str()) {
                    Step::Done(uid_of(p))
                } else {
                    Step::Waiting(format!("labelled sandbox {:?}", label(SANDBOX)))
                }
            },
        )
        .await
    }

    /// Sets the `sandkeeper.sandbox.users.io/sandbox` label of a Sandbox's pod template (its
    /// next pod's), and its owner label to this owner (a fleet's process resumes what another
    /// suspended).
    pub async fn label_pod_template(
        &self,
        sandbox_name: &str,
        sandbox: u64,
    ) -> Result<(), K8sError> {
        let labels = json!({SANDBOX: sandbox.to_string(), OWNER: self.config.owner});
        self.label_pod_template_with(sandbox_name, labels).await
    }

    /// Merges `labels` into a Sandbox's pod template's labels: what the Sandbox keeps on its
    /// pod (a pod label patched against the template is set back).
    pub(crate) async fn label_pod_template_with(
        &self,
        sandbox_name: &str,
        labels: serde_json::Value,
    ) -> Result<(), K8sError> {
        let patch = json!({"spec": {"podTemplate": {"metadata": {"labels": labels}}}});
        self.patch_sandbox(sandbox_name, patch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::K8sConfig;

    fn cluster(mode: Mode) -> Cluster {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Cluster::make_client(config).unwrap();
        Cluster::new(client, K8sConfig::new("ns", "me", mode)).unwrap()
    }

    #[tokio::test]
    async fn only_this_owners_claim_names_are_snapshots() {
        let k = cluster(Mode::AgentSandbox {
            warm_pool: "pool".into(),
        });
        assert_eq!(k.claim_of_snapshot("sk-me-12").unwrap(), "sk-me-12");
        for bad in [
            "",
            "sk-me-",
            "sk-me-x",
            "sk-me-012",
            "sk-me-1-2",
            "sk-other-1",
            "sk-me-99999999999999999999999",
            "/etc/passwd",
        ] {
            let e = k.claim_of_snapshot(bad).unwrap_err();
            assert!(matches!(e, K8sError::BadSnapshot { .. }), "{bad:?}: {e}");
            assert_eq!(e.class(), crate::error::ErrorClass::Fatal);
        }
    }

    #[tokio::test]
    async fn a_fleet_takes_any_owners_claim_names_as_snapshots() {
        let k = cluster(Mode::AgentSandbox {
            warm_pool: "pool".into(),
        });
        for good in ["sk-me-12", "sk-other-1", "sk-a-b-4294967296"] {
            assert_eq!(k.claim_of_fleet_snapshot(good).unwrap(), good);
        }
        for bad in [
            "",
            "sk-",
            "sk-me-",
            "sk--1",
            "sk-Me-1",
            "sk-me-x",
            "sk-me-012",
            "sk-me-99999999999999999999999",
            "/etc/passwd",
            "sk-../x-1",
        ] {
            let e = k.claim_of_fleet_snapshot(bad).unwrap_err();
            assert!(matches!(e, K8sError::BadSnapshot { .. }), "{bad:?}: {e}");
        }
        let template = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        }))
        .unwrap();
        let pods = cluster(Mode::Pod {
            template: Box::new(template),
        });
        assert!(pods.claim_of_fleet_snapshot("sk-me-1").is_err());
    }
}
