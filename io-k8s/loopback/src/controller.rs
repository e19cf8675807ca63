//! The scripted controllers: a kubelet that runs pods (Pending → Running on the one node,
//! `activeDeadlineSeconds` → Failed/DeadlineExceeded) and removes deleted ones once their
//! containers stopped (at once, or after the grace period when they ignore SIGTERM: the store
//! marks a deleted pod `Terminating` as the API server does); an agent-sandbox controller
//! (claim → Sandbox → Pod, `Ready` conditions, `status.sandbox.name`, the
//! `agents.x-k8s.io/pod-name` annotation, terminal reasons, `shutdownTime` expiry,
//! `operatingMode: Suspended`: the pod is deleted and the Sandbox kept, `Ready=False` reason
//! `SandboxSuspended` at once, `Suspended` `PodTerminating` while the pod terminates and
//! `PodTerminated`, with the pod-name annotation cleared, once it is gone; `Running` makes the
//! pod again under the Sandbox's name, and the Sandbox goes Ready once it runs); and a garbage
//! collector for Sandboxes and Pods whose controlling owner is gone.
//!
//! Auto-suspension, as the newest upstream source models it (kubernetes-sigs/agent-sandbox
//! pull request 1296 at `add2ae38`, not merged into `main` when read; an earlier revision of it
//! had a separate `auto_suspension_controller.go` that set `operatingMode: Suspended` and read
//! an `agents.x-k8s.io/idle-timeout-seconds` annotation). Off by default, as upstream's
//! `--enable-auto-suspend-and-resume` is ([`Loopback::enable_auto_suspension`](crate::Loopback::enable_auto_suspension)).
//! When on, a Sandbox with `spec.autoSuspension.inactivityTimeoutSeconds` gets
//! `status.lastActivityTime` set to now when it has none (its creation), and again when it
//! runs after a suspension by `operatingMode` (`Running` while its `Ready` reason still says
//! `SandboxUserSuspended`); once the timeout has passed since then (server clock) the
//! controller suspends it *without touching `operatingMode`*, which stays `Running`: its pod
//! is deleted, `Ready=False` reason `SandboxAutoSuspended`, `Suspended` as for any
//! suspension; the volumes stay. `operatingMode: Suspended` overrides it (reason
//! `SandboxUserSuspended`). Only `lastActivityTime` brings an auto-suspended Sandbox back.
//! Not modelled: the suspension server (`POST /v1/sandboxes/resume` and `/activity`, which
//! set `lastActivityTime` for the Sandbox Router on traffic; a test may write the status
//! itself), the router and gateway, and the requeue timer (a pass runs on every store event
//! and clock advance instead). As upstream, nothing a client execs in the pod is activity.
//!
//! Pod labels flow as in the real agent-sandbox controllers: a claim's
//! `spec.additionalPodMetadata.labels` are kept on its Sandbox's `spec.podTemplate` (a change
//! of the claim reaches the Sandbox, and a Sandbox edited against its claim is set back), a
//! Sandbox makes its pod with its pod template's labels, and keeps those labels on the pod it
//! has (a pod relabelled by hand against its template is set back).
//!
//! A pod's directory on the host is its `/workspace`. It outlives the pod only where the real
//! one would: when the Sandbox's `volumeClaimTemplates` make a volume mounted there (a
//! PersistentVolumeClaim, which the real controller keeps while the Sandbox is suspended), a
//! suspended Sandbox's pod comes back under the same name and finds its files; otherwise (a
//! container filesystem, an `emptyDir`) the pod made again starts empty.
//!
//! Every pass reconciles every object (idempotent; writes only on change), after each store event
//! and after every clock advance. A pass works from the objects as it listed them at its start,
//! as a real controller works from its informer cache, which can be behind the API server: labels
//! patched on a claim, its Sandbox's template and its pod after the pass listed the claim (or the
//! Sandbox) may be set back to the labels as listed, template first, then pod (agent-sandbox's
//! `updatePodMetadata` copies the cached Sandbox's template labels onto the pod), and are set
//! forward again by the next pass. A watcher selecting on such a label sees the pod leave and
//! come back (`io-k8s/src/deaths.rs` tells that from a death; the Kubernetes fleet harness test
//! met it about once in 20 to 40 runs).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::resources::{PODS, SANDBOXES, SANDBOX_CLAIMS, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS};
use crate::store::{Propagation, Store};

/// Annotation naming the pod of a Sandbox adopted from a warm pool.
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";

/// The node every pod of the loopback runs on.
pub const NODE_NAME: &str = "loopback-node";

/// `Ready=False` reason of a Sandbox suspended by `operatingMode: Suspended`, by a controller
/// that runs with auto-suspension (without it the reason is `SandboxSuspended`).
pub const USER_SUSPENDED: &str = "SandboxUserSuspended";

/// `Ready=False` reason of a Sandbox the controller suspended for inactivity.
pub const AUTO_SUSPENDED: &str = "SandboxAutoSuspended";

/// Annotation on a claim naming the warm-pool Sandbox it adopted.
pub const SANDBOX_NAME_ANNOTATION: &str = "agents.x-k8s.io/sandbox-name";

/// Switches of the scripted controllers.
#[derive(Default)]
pub struct ControllerSwitches {
    /// While set, nothing is reconciled: pods stay Pending, claims unready.
    pub paused: AtomicBool,
    /// While set, new pods fail (`phase: Failed`) instead of running.
    pub fail_pods: AtomicBool,
    /// Held for the whole of a reconcile pass.
    pass: std::sync::Mutex<()>,
    /// While set, containers ignore SIGTERM: a terminating pod stays for its grace period.
    pub ignore_sigterm: AtomicBool,
    /// While set, the Sandbox controller runs with auto-suspension (the upstream flag
    /// `--enable-auto-suspend-and-resume=true`; see the module docs).
    pub auto_suspend: AtomicBool,
    /// The claim controller's label-domain allowlist (empty: the default).
    pub allowed_label_domains: std::sync::Mutex<Vec<String>>,
}

impl ControllerSwitches {
    /// Sets `paused`; a pause also waits for a pass in progress to end, so that no change is
    /// reconciled once this returns.
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        if paused {
            drop(self.pass.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

/// Handle to the running controllers.
pub struct Controller {
    pub(crate) store: Arc<Store>,
    pub(crate) switches: Arc<ControllerSwitches>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) pods_root: PathBuf,
}

fn meta_str<'a>(o: &'a Value, ptr: &str) -> Option<&'a str> {
    o.pointer(ptr).and_then(Value::as_str)
}

fn name(o: &Value) -> String {
    meta_str(o, "/metadata/name").unwrap_or("").to_string()
}

fn ns(o: &Value) -> String {
    meta_str(o, "/metadata/namespace").unwrap_or("").to_string()
}

fn condition(o: &Value, ty: &str) -> Option<(String, String)> {
    o.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
        .map(|c| {
            (
                c.get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                c.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )
        })
}

/// Sets a condition, keeping `lastTransitionTime` when the status does not change.
fn set_condition(o: &mut Value, ty: &str, status: bool, reason: &str, message: &str, now: &str) {
    let status = if status { "True" } else { "False" };
    if !o.get("status").is_some_and(Value::is_object) {
        o["status"] = json!({});
    }
    if !o["status"].get("conditions").is_some_and(Value::is_array) {
        o["status"]["conditions"] = json!([]);
    }
    let conds = o["status"]["conditions"]
        .as_array_mut()
        .expect("made an array above");
    let prev = conds
        .iter()
        .position(|c| c.get("type").and_then(Value::as_str) == Some(ty));
    let since = prev
        .and_then(|i| {
            (conds[i].get("status").and_then(Value::as_str) == Some(status))
                .then(|| conds[i].get("lastTransitionTime").cloned())
                .flatten()
        })
        .unwrap_or_else(|| json!(now));
    let c = json!({"type": ty, "status": status, "reason": reason, "message": message, "lastTransitionTime": since});
    match prev {
        Some(i) => conds[i] = c,
        None => conds.push(c),
    }
}

fn owner_ref(o: &Value) -> Value {
    json!({
        "apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
        "uid": o["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    })
}

/// Claim reasons the controller never reconciles away (agent-sandbox v0.5.6
/// `sandboxclaim_controller.go`: suppressed errors and expiries). `WarmPoolNotFound` and
/// `TemplateNotFound` are not final there: the claim is requeued, and a pool's creation wakes
/// it (here every store change is a pass, so a pool or template created later is seen at once;
/// the real v0.5.6 controller may take up to its one-minute requeue for a template).
const TERMINAL: &[&str] = &["ClaimExpired", "SandboxExpired", "InvalidMetadata"];

/// The `(key, value)` pairs of `want` that `have` lacks or holds with another value.
fn labels_to_set(want: Option<&Value>, have: Option<&Value>) -> Vec<(String, Value)> {
    let Some(want) = want.and_then(Value::as_object) else {
        return Vec::new();
    };
    want.iter()
        .filter(|(k, v)| have.and_then(|h| h.get(k.as_str())) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sets `labels` in the map at `ptr` (made if missing) of `o`.
fn set_labels(o: &mut Value, ptr: &[&str], labels: &[(String, Value)]) {
    let mut at = o;
    for key in ptr {
        if !at.get(*key).is_some_and(Value::is_object) {
            at[*key] = json!({});
        }
        at = &mut at[*key];
    }
    for (k, v) in labels {
        at[k.as_str()] = v.clone();
    }
}

fn expired(store: &Store, at: Option<&str>) -> bool {
    at.and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some_and(|t| t <= store.now())
}

impl Controller {
    /// Runs reconcile passes until the store is dropped.
    pub(crate) async fn run(self) {
        let mut events = self.store.subscribe();
        loop {
            {
                let _pass = self.switches.pass.lock().unwrap_or_else(|e| e.into_inner());
                if !self.switches.paused.load(Ordering::SeqCst) {
                    self.reconcile_all();
                }
            }
            tokio::select! {
                r = events.recv() => if let Err(tokio::sync::broadcast::error::RecvError::Closed) = r { return },
                _ = self.wake.notified() => {}
            }
            while events.try_recv().is_ok() {}
        }
    }

    fn reconcile_all(&self) {
        self.collect_garbage();
        for claim in self.store.all(&SANDBOX_CLAIMS) {
            self.reconcile_claim(&claim);
        }
        for sb in self.store.all(&SANDBOXES) {
            self.reconcile_sandbox(&sb);
        }
        for pod in self.store.all(&PODS) {
            self.reconcile_pod(&pod);
        }
        // Status flows up again once pods and sandboxes moved.
        for sb in self.store.all(&SANDBOXES) {
            self.reconcile_sandbox(&sb);
        }
        for claim in self.store.all(&SANDBOX_CLAIMS) {
            self.reconcile_claim(&claim);
        }
    }

    /// The garbage collector: a Sandbox or Pod whose controlling owner no longer exists (by
    /// name and uid) is deleted, with its own dependents. This catches objects a controller
    /// pass made for an owner deleted meanwhile, as the real garbage collector does.
    fn collect_garbage(&self) {
        for rt in [&SANDBOXES, &PODS] {
            for o in self.store.all(rt) {
                let Some(refs) = o
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                else {
                    continue;
                };
                let namespace = ns(&o);
                let orphan = refs.iter().any(|r| {
                    let owner_rt = r
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .zip(r.get("kind").and_then(Value::as_str))
                        .and_then(|(av, kind)| crate::resources::find_kind(av, kind));
                    let (Some(owner_rt), Some(owner), Some(uid)) = (
                        owner_rt,
                        r.get("name").and_then(Value::as_str),
                        r.get("uid").and_then(Value::as_str),
                    ) else {
                        return false;
                    };
                    match self.store.get(&owner_rt, &namespace, owner) {
                        Ok(existing) => meta_str(&existing, "/metadata/uid") != Some(uid),
                        Err(_) => true,
                    }
                });
                if orphan {
                    let _ = self.store.delete(
                        rt,
                        &namespace,
                        &name(&o),
                        Propagation::Background,
                        meta_str(&o, "/metadata/uid"),
                    );
                }
            }
        }
    }

    fn set_status(
        &self,
        rt: &crate::resources::ResourceType,
        o: &Value,
        f: impl FnMut(&mut Value),
    ) {
        let _ = self.store.modify(rt, &ns(o), &name(o), f);
    }

    /// The kubelet, for one pod: runs a pending pod (binding it to the loopback's one node) or
    /// fails it, fails a running pod past its `activeDeadlineSeconds`, and removes a
    /// terminating pod once its containers stopped: at once when they honour SIGTERM, else
    /// when the grace period ends (the real kubelet kills them then).
    fn reconcile_pod(&self, pod: &Value) {
        let now = self.store.now_rfc3339();
        let phase = meta_str(pod, "/status/phase").unwrap_or("Pending");
        let (n, namespace) = (name(pod), ns(pod));
        if let Some(ends) = meta_str(pod, "/metadata/deletionTimestamp") {
            let killed = !self.switches.ignore_sigterm.load(Ordering::SeqCst)
                || expired(&self.store, Some(ends));
            if killed {
                let _ = self.store.delete_with_grace(
                    &PODS,
                    &namespace,
                    &n,
                    Propagation::Background,
                    meta_str(pod, "/metadata/uid"),
                    Some(0),
                );
            }
            return;
        }
        match phase {
            "Pending" => {
                let _ = std::fs::create_dir_all(
                    crate::exec::pod_dir(&self.pods_root, &namespace, &n).join("workspace"),
                );
                let fail = self.switches.fail_pods.load(Ordering::SeqCst);
                self.set_status(&PODS, pod, |p| {
                    let seq = p
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(|u| u.len() as u64 + u.bytes().map(u64::from).sum::<u64>() % 200)
                        .unwrap_or(1);
                    p["spec"]["nodeName"] = json!(NODE_NAME);
                    p["status"]["phase"] = json!(if fail { "Failed" } else { "Running" });
                    p["status"]["startTime"] = json!(now);
                    p["status"]["podIP"] = json!(format!("10.0.0.{}", 1 + seq % 250));
                    p["status"]["podIPs"] = json!([{"ip": format!("10.0.0.{}", 1 + seq % 250)}]);
                    if fail {
                        p["status"]["reason"] = json!("Error");
                    }
                    set_condition(p, "Ready", !fail, "", "", &now);
                });
            }
            "Running" => {
                let deadline = pod
                    .pointer("/spec/activeDeadlineSeconds")
                    .and_then(Value::as_i64);
                let started = meta_str(pod, "/status/startTime")
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                if let (Some(d), Some(s)) = (deadline, started) {
                    if s.checked_add(jiff::SignedDuration::from_secs(d))
                        .is_ok_and(|end| end <= self.store.now())
                    {
                        self.set_status(&PODS, pod, |p| {
                            p["status"]["phase"] = json!("Failed");
                            p["status"]["reason"] = json!("DeadlineExceeded");
                            p["status"]["message"] = json!(format!(
                                "Pod was active on the node longer than the specified deadline"
                            ));
                            set_condition(p, "Ready", false, "PodFailed", "", &now);
                        });
                    }
                }
            }
            _ => {}
        }
    }

    /// The pod a Sandbox tracks (`resolvePodName`, `reconcilePod`): the one its
    /// `agents.x-k8s.io/pod-name` annotation names, else one named after it. An annotation
    /// naming a pod that no longer exists is cleared, and the Sandbox's own name is used.
    fn tracked_pod(&self, sb: &Value) -> (String, Option<Value>) {
        let namespace = ns(sb);
        let ptr = format!(
            "/metadata/annotations/{}",
            POD_NAME_ANNOTATION.replace('/', "~1")
        );
        if let Some(annotated) = meta_str(sb, &ptr) {
            if let Ok(pod) = self.store.get(&PODS, &namespace, annotated) {
                return (annotated.to_string(), Some(pod));
            }
            self.annotate_pod_name(sb, None);
        }
        let own = name(sb);
        let pod = self.store.get(&PODS, &namespace, &own).ok();
        (own, pod)
    }

    /// Sets (`ensurePodNameAnnotation`) or clears (`clearPodNameAnnotation`) a Sandbox's
    /// `agents.x-k8s.io/pod-name` annotation.
    fn annotate_pod_name(&self, sb: &Value, pod: Option<&str>) {
        let _ = self
            .store
            .modify(&SANDBOXES, &ns(sb), &name(sb), |s| match pod {
                Some(p) => s["metadata"]["annotations"][POD_NAME_ANNOTATION] = json!(p),
                None => {
                    if let Some(a) = s
                        .pointer_mut("/metadata/annotations")
                        .and_then(Value::as_object_mut)
                    {
                        a.remove(POD_NAME_ANNOTATION);
                    }
                }
            });
    }

    /// Whether the loopback's pod directory (the containers' `/workspace`) is on a volume of
    /// the Sandbox's `volumeClaimTemplates`: some container mounts one at `/workspace` or
    /// above it. The real controller makes one PersistentVolumeClaim per template and never
    /// deletes it while the Sandbox lives (`reconcilePVCs`), so such files outlive the pod; a
    /// container filesystem or an `emptyDir` does not.
    fn workspace_on_claim_volume(&self, sb: &Value) -> bool {
        let claims: Vec<&str> = sb
            .pointer("/spec/volumeClaimTemplates")
            .and_then(Value::as_array)
            .map(|v| {
                v.iter()
                    .filter_map(|t| t.pointer("/metadata/name").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let containers = sb
            .pointer("/spec/podTemplate/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        containers.iter().any(|c| {
            c.get("volumeMounts")
                .and_then(Value::as_array)
                .is_some_and(|ms| {
                    ms.iter().any(|m| {
                        let at = meta_str(m, "/mountPath")
                            .unwrap_or("")
                            .trim_end_matches('/');
                        let name = meta_str(m, "/name").unwrap_or("");
                        (at.is_empty() || at == "/workspace") && claims.contains(&name)
                    })
                })
        })
    }

    /// Whether the controller runs with auto-suspension (`--enable-auto-suspend-and-resume`).
    fn auto_suspension(&self) -> bool {
        self.switches.auto_suspend.load(Ordering::SeqCst)
    }

    /// A Sandbox's `spec.autoSuspension.inactivityTimeoutSeconds`, when auto-suspension is on
    /// and the Sandbox asks for it.
    fn inactivity_timeout(&self, sb: &Value) -> Option<i64> {
        if !self.auto_suspension() {
            return None;
        }
        sb.pointer("/spec/autoSuspension/inactivityTimeoutSeconds")
            .and_then(Value::as_i64)
            .filter(|secs| *secs > 0)
    }

    /// The start of `Reconcile` with auto-suspension: `status.lastActivityTime` is set to now
    /// when it is missing (the Sandbox's creation counts as activity) and when the Sandbox
    /// runs again after a suspension by `operatingMode` (its `Ready` reason still says so).
    /// Returns the Sandbox as the rest of the pass sees it.
    fn note_activity(&self, sb: &Value) -> Value {
        let mut sb = sb.clone();
        if self.inactivity_timeout(&sb).is_none() {
            return sb;
        }
        let user_suspended = condition(&sb, "Ready").is_some_and(|(status, reason)| {
            status == "False" && (reason == USER_SUSPENDED || reason == "SandboxSuspended")
        });
        let running = meta_str(&sb, "/spec/operatingMode") != Some("Suspended");
        if sb.pointer("/status/lastActivityTime").is_none() || (running && user_suspended) {
            let now = json!(self.store.now_rfc3339());
            self.set_status(&SANDBOXES, &sb, |s| {
                if !s.get("status").is_some_and(Value::is_object) {
                    s["status"] = json!({});
                }
                s["status"]["lastActivityTime"] = now.clone();
            });
            if !sb.get("status").is_some_and(Value::is_object) {
                sb["status"] = json!({});
            }
            sb["status"]["lastActivityTime"] = now;
        }
        sb
    }

    /// `shouldSuspend` for a Sandbox whose `operatingMode` is `Running`: its inactivity
    /// timeout has passed since `status.lastActivityTime` (on the server clock).
    fn inactive(&self, sb: &Value) -> bool {
        let Some(secs) = self.inactivity_timeout(sb) else {
            return false;
        };
        meta_str(sb, "/status/lastActivityTime")
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .and_then(|at| at.checked_add(jiff::SignedDuration::from_secs(secs)).ok())
            .is_some_and(|until| until <= self.store.now())
    }

    fn reconcile_sandbox(&self, sb: &Value) {
        let sb = &self.note_activity(sb);
        let now = self.store.now_rfc3339();
        let namespace = ns(sb);
        let (pod_name, pod) = self.tracked_pod(sb);
        if expired(&self.store, meta_str(sb, "/spec/shutdownTime")) {
            if let Some(p) = &pod {
                let _ =
                    self.store
                        .delete(&PODS, &namespace, &name(p), Propagation::Background, None);
            }
            if meta_str(sb, "/spec/shutdownPolicy") == Some("Delete") {
                let _ = self.store.delete(
                    &SANDBOXES,
                    &namespace,
                    &name(sb),
                    Propagation::Background,
                    None,
                );
            } else {
                self.set_status(&SANDBOXES, sb, |s| {
                    set_condition(
                        s,
                        "Ready",
                        false,
                        "SandboxExpired",
                        "the sandbox reached its shutdownTime",
                        &now,
                    )
                });
            }
            return;
        }
        let mode_suspended = meta_str(sb, "/spec/operatingMode") == Some("Suspended");
        let auto_suspended = !mode_suspended && self.inactive(sb);
        // `computeSuspendedCondition`, `computeReadyCondition`: `Ready=False` with reason
        // `SandboxSuspended` (with auto-suspension: `SandboxUserSuspended`, or
        // `SandboxAutoSuspended` when the controller suspended it) from the moment the
        // Sandbox should be suspended; `Suspended` turns True only once the pod is gone, and
        // is `PodTerminating` while it terminates.
        if mode_suspended || auto_suspended {
            let suspended = match &pod {
                Some(p) => {
                    if meta_str(p, "/metadata/deletionTimestamp").is_none() {
                        let _ = self.store.delete(
                            &PODS,
                            &namespace,
                            &name(p),
                            Propagation::Background,
                            None,
                        );
                    }
                    false
                }
                None => true,
            };
            self.set_status(&SANDBOXES, sb, |s| {
                let (reason, message) = if suspended {
                    (
                        "PodTerminated",
                        "Pod has been terminated. Sandbox is suspended",
                    )
                } else {
                    (
                        "PodTerminating",
                        "Pod is terminating. Sandbox is suspending",
                    )
                };
                set_condition(s, "Suspended", suspended, reason, message, &now);
                let message = if suspended {
                    "Sandbox is suspended"
                } else {
                    "Sandbox is suspending"
                };
                let reason = match (auto_suspended, self.auto_suspension()) {
                    (true, _) => AUTO_SUSPENDED,
                    (false, true) => USER_SUSPENDED,
                    (false, false) => "SandboxSuspended",
                };
                set_condition(s, "Ready", false, reason, message, &now)
            });
            return;
        }
        let not_suspended = |s: &mut Value| {
            set_condition(
                s,
                "Suspended",
                false,
                "NotSuspended",
                "Sandbox is not suspended",
                &now,
            )
        };
        let Some(pod) = pod else {
            let template = sb
                .pointer("/spec/podTemplate")
                .cloned()
                .unwrap_or(json!({}));
            // A pod made again under the same name (a resume) finds only what was on its
            // Sandbox's claim volumes: the rest went with the pod it replaces.
            if !self.workspace_on_claim_volume(sb) {
                let _ = std::fs::remove_dir_all(
                    crate::exec::pod_dir(&self.pods_root, &namespace, &pod_name).join("workspace"),
                );
            }
            let mut p = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": template.get("metadata").cloned().unwrap_or(json!({})),
                "spec": template.get("spec").cloned().unwrap_or(json!({})),
            });
            p["metadata"]["name"] = json!(pod_name);
            p["metadata"]["namespace"] = json!(namespace);
            p["metadata"]["ownerReferences"] = json!([owner_ref(sb)]);
            if let Err(e) = self.store.create(&PODS, &namespace, p) {
                self.set_status(&SANDBOXES, sb, |s| {
                    not_suspended(s);
                    set_condition(s, "Ready", false, "ReconcilerError", &e.message, &now)
                });
            } else {
                self.annotate_pod_name(sb, Some(&pod_name));
                self.set_status(&SANDBOXES, sb, |s| {
                    not_suspended(s);
                    set_condition(
                        s,
                        "Ready",
                        false,
                        "DependenciesNotReady",
                        "the pod is not ready",
                        &now,
                    )
                });
            }
            return;
        };
        // The pod keeps its template's labels.
        let relabel = labels_to_set(
            sb.pointer("/spec/podTemplate/metadata/labels"),
            pod.pointer("/metadata/labels"),
        );
        if !relabel.is_empty() {
            let _ = self.store.modify(&PODS, &namespace, &name(&pod), |p| {
                set_labels(p, &["metadata", "labels"], &relabel)
            });
        }
        let (ready, reason) = match meta_str(&pod, "/status/phase") {
            Some("Running") => (true, "DependenciesReady"),
            Some("Failed") => (false, "PodFailed"),
            Some("Succeeded") => (false, "PodSucceeded"),
            _ => (false, "DependenciesNotReady"),
        };
        let ips = pod.pointer("/status/podIPs").cloned().unwrap_or(json!([]));
        self.set_status(&SANDBOXES, sb, |s| {
            not_suspended(s);
            set_condition(s, "Ready", ready, reason, "", &now);
            s["status"]["podIPs"] = json!(ips
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|i| i.get("ip").cloned())
                    .collect::<Vec<_>>())
                .unwrap_or_default());
        });
    }

    fn reconcile_claim(&self, claim: &Value) {
        let now = self.store.now_rfc3339();
        let namespace = ns(claim);
        let claim_name = name(claim);
        if condition(claim, "Ready").is_some_and(|(_, r)| TERMINAL.contains(&r.as_str())) {
            return;
        }
        if expired(&self.store, meta_str(claim, "/spec/lifecycle/shutdownTime")) {
            match meta_str(claim, "/spec/lifecycle/shutdownPolicy") {
                Some("Retain") => {
                    if let Some(sb) = meta_str(claim, "/status/sandbox/name") {
                        let _ = self.store.delete(
                            &SANDBOXES,
                            &namespace,
                            sb,
                            Propagation::Background,
                            None,
                        );
                    }
                    self.set_status(&SANDBOX_CLAIMS, claim, |c| {
                        set_condition(
                            c,
                            "Ready",
                            false,
                            "ClaimExpired",
                            "the claim reached its shutdownTime",
                            &now,
                        )
                    });
                }
                _ => {
                    let _ = self.store.delete(
                        &SANDBOX_CLAIMS,
                        &namespace,
                        &claim_name,
                        Propagation::Background,
                        None,
                    );
                }
            }
            return;
        }
        let fail = |reason: &str, message: String| {
            self.set_status(&SANDBOX_CLAIMS, claim, |c| {
                set_condition(c, "Ready", false, reason, &message, &now)
            });
        };
        let allowed = self
            .switches
            .allowed_label_domains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Err(message) = crate::metadata::validate(claim, &allowed) {
            return fail("InvalidMetadata", message);
        }
        // The claim's Sandbox: the one adoption named on the claim, else its recorded one,
        // else one named after the claim (`getOrCreateSandbox`'s order).
        let sandbox_name = meta_str(
            claim,
            &format!(
                "/metadata/annotations/{}",
                SANDBOX_NAME_ANNOTATION.replace('/', "~1")
            ),
        )
        .or_else(|| meta_str(claim, "/status/sandbox/name"))
        .unwrap_or(&claim_name)
        .to_string();
        let sandbox = match self.store.get(&SANDBOXES, &namespace, &sandbox_name) {
            Ok(sb) => sb,
            Err(_) => {
                let Some(pool_name) = meta_str(claim, "/spec/warmPoolRef/name") else {
                    return fail(
                        "InvalidMetadata",
                        "spec.warmPoolRef.name is required".into(),
                    );
                };
                let Ok(pool) = self.store.get(&SANDBOX_WARM_POOLS, &namespace, pool_name) else {
                    return fail(
                        "WarmPoolNotFound",
                        format!("SandboxWarmPool {pool_name:?} not found"),
                    );
                };
                let template_name = meta_str(&pool, "/spec/sandboxTemplateRef/name").unwrap_or("");
                let Ok(template) = self
                    .store
                    .get(&SANDBOX_TEMPLATES, &namespace, template_name)
                else {
                    return fail(
                        "TemplateNotFound",
                        format!("SandboxTemplate {template_name:?} not found"),
                    );
                };
                // As if adopted from the warm pool: the pool made the Sandbox with
                // `generateName: <pool>-` (here the claim's UID's last five characters stand in
                // for the random suffix), its pod has the Sandbox's name, and adoption names
                // the Sandbox on the claim and the pod on the Sandbox. The pool's own
                // replicas, made ahead of claims, are not modelled: the Sandbox is made here.
                let uid = meta_str(claim, "/metadata/uid").unwrap_or("0");
                let adopted = format!("{pool_name}-{}", &uid[uid.len().saturating_sub(5)..]);
                let mut pod_template = template
                    .pointer("/spec/podTemplate")
                    .cloned()
                    .unwrap_or(json!({}));
                if let Some(extra) = claim
                    .pointer("/spec/additionalPodMetadata/labels")
                    .and_then(Value::as_object)
                {
                    for (k, v) in extra {
                        pod_template["metadata"]["labels"][k] = v.clone();
                    }
                }
                let sb = json!({
                    "apiVersion": SANDBOXES.api_version(), "kind": "Sandbox",
                    "metadata": {
                        "name": adopted, "namespace": namespace,
                        "labels": {"agents.x-k8s.io/launch-type": "warm"},
                        "annotations": {POD_NAME_ANNOTATION: adopted},
                        "ownerReferences": [owner_ref(claim)],
                    },
                    "spec": {
                        "podTemplate": pod_template,
                        "operatingMode": "Running",
                        "volumeClaimTemplates": template
                            .pointer("/spec/volumeClaimTemplates")
                            .cloned()
                            .unwrap_or(json!([])),
                    },
                });
                if let Err(e) = self.store.create(&SANDBOXES, &namespace, sb) {
                    return fail("ReconcilerError", e.message);
                }
                let _ = self
                    .store
                    .modify(&SANDBOX_CLAIMS, &namespace, &claim_name, |c| {
                        c["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION] = json!(adopted);
                    });
                return fail("SandboxNotReady", "Sandbox is not ready".into());
            }
        };
        // The Sandbox's pod template keeps the labels the claim asks its pod to carry.
        let relabel = labels_to_set(
            claim.pointer("/spec/additionalPodMetadata/labels"),
            sandbox.pointer("/spec/podTemplate/metadata/labels"),
        );
        if !relabel.is_empty() {
            let _ = self
                .store
                .modify(&SANDBOXES, &namespace, &sandbox_name, |sb| {
                    set_labels(sb, &["spec", "podTemplate", "metadata", "labels"], &relabel)
                });
        }
        let (ready, reason) =
            condition(&sandbox, "Ready").unwrap_or(("False".into(), "DependenciesNotReady".into()));
        let ready = ready == "True";
        let ips = sandbox.pointer("/status/podIPs").cloned();
        self.set_status(&SANDBOX_CLAIMS, claim, |c| {
            // `computeAndSetStatus`: the Sandbox's name and pod IPs, whenever it exists.
            c["status"]["sandbox"] =
                json!({"name": sandbox_name, "podIPs": ips.clone().unwrap_or(json!([]))});
            set_condition(c, "Ready", ready, &reason, "", &now);
        });
    }
}
