//! Pod mode (a plain `Pod` per sandbox from the configured template), and pod liveness checks
//! shared with agent-sandbox mode.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::SignedDuration;
use kube::api::DeleteParams;

use crate::cluster::{calls, err, wall_clock, Cluster};
use crate::config::Mode;
use crate::error::K8sError;
use crate::names::{self, EXPIRES_AT};
use crate::wait::{wait_for, Step};

/// What a pod's status says about using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Running (and Ready when the condition is reported).
    Running,
    /// Not yet running.
    Pending,
    /// Finished, failed, or being deleted: never usable again.
    Finished(String),
}

/// Reads a pod's state.
pub fn pod_state(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Finished("being deleted".into());
    }
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") => {
            let not_ready = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status != "True");
            if not_ready {
                PodState::Pending
            } else {
                PodState::Running
            }
        }
        Some(p @ ("Failed" | "Succeeded")) => {
            let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
            PodState::Finished(format!("{p} {reason}").trim().to_string())
        }
        _ => PodState::Pending,
    }
}

/// A pod's UID (empty when the server sent none, which a real API server never does).
pub fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl Cluster {
    /// The pod this instance would create for `sandbox` in pod mode: the template with name,
    /// namespace, owner and session labels, an `activeDeadlineSeconds` backstop (and the
    /// [`EXPIRES_AT`] annotation for sweepers), `restartPolicy: Never` unless set.
    pub fn pod_for(&self, sandbox: u64, session_key: &str) -> Result<Pod, K8sError> {
        let Mode::Pod { template } = &self.config.mode else {
            return Err(K8sError::Invalid {
                code: 0,
                reason: "WrongMode".into(),
                message: "pods are only made from a template in pod mode".into(),
            });
        };
        let mut pod = (**template).clone();
        let name = names::object_name(&self.config.owner, sandbox);
        pod.metadata.name = Some(name);
        pod.metadata.generate_name = None;
        pod.metadata.namespace = Some(self.config.namespace.clone());
        pod.metadata.resource_version = None;
        pod.metadata.uid = None;
        let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.extend(names::labels(&self.config.owner, session_key, sandbox));
        let expires = wall_clock()
            .checked_add(SignedDuration::from_secs(
                self.config.max_lifetime_secs as i64,
            ))
            .unwrap_or_else(|_| wall_clock());
        let expires =
            k8s_openapi::jiff::Timestamp::from_second(expires.as_second()).unwrap_or(expires);
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(EXPIRES_AT.to_string(), expires.to_string());
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.active_deadline_seconds = Some(self.config.max_lifetime_secs as i64);
        if spec.restart_policy.is_none() {
            spec.restart_policy = Some("Never".into());
        }
        pod.status = None;
        Ok(pod)
    }

    /// Creates the pod of `sandbox` (idempotent as [`Cluster::create_claim`]). Returns its name.
    pub async fn create_pod(&self, sandbox: u64, session_key: &str) -> Result<String, K8sError> {
        let pod = self.pod_for(sandbox, session_key)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let what = format!("pod {name}");
        self.create_owned(
            self.pods(),
            &pod,
            sandbox,
            (calls::CREATE_POD, calls::GET_POD),
            &what,
        )
        .await?;
        Ok(name)
    }

    /// Waits until the pod runs; a pod that finished, failed or was deleted is gone. Returns
    /// the running pod's UID.
    pub async fn wait_pod_running(&self, pod: &str) -> Result<String, K8sError> {
        let what = format!("pod {pod}");
        wait_for(
            self.pods(),
            pod,
            &what,
            self.config.ready_timeout(),
            calls::WATCH_PODS,
            self.retry,
            |p: &Pod| match pod_state(p) {
                PodState::Running => Step::Done(uid_of(p)),
                PodState::Pending => Step::Wait,
                PodState::Finished(why) => Step::Fail(K8sError::Gone {
                    what: what.clone(),
                    message: why,
                }),
            },
        )
        .await
    }

    /// Reads the pod now: `Ok` with its UID when it runs, `Gone` when it is absent or
    /// finished. A sandbox is never assumed alive because an object said so earlier.
    pub async fn check_pod_alive(&self, pod: &str) -> Result<String, K8sError> {
        let what = format!("pod {pod}");
        let p = self
            .retry
            .run(|| async {
                self.pods()
                    .get(pod)
                    .await
                    .map_err(|e| err(e, calls::GET_POD, &what))
            })
            .await?;
        match pod_state(&p) {
            PodState::Finished(why) => Err(K8sError::Gone { what, message: why }),
            _ => Ok(uid_of(&p)),
        }
    }

    /// Deletes a pod. `Ok(false)` when it was already gone.
    pub async fn delete_pod(&self, pod: &str) -> Result<bool, K8sError> {
        let what = format!("pod {pod}");
        let r = self
            .retry
            .run(|| async {
                self.pods()
                    .delete(pod, &DeleteParams::background())
                    .await
                    .map_err(|e| err(e, calls::DELETE_POD, &what))
            })
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.is_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }
}
