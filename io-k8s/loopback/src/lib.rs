//! # k8s-loopback: a loopback Kubernetes API server for tests
//!
//! No Kubernetes API server can run on the machines this workspace is built on, so the io-k8s
//! backend is tested against this crate: plain HTTP on `127.0.0.1` speaking real Kubernetes JSON
//! for the parts of the API io-k8s uses. It is checked against the real `kubectl`
//! (`tests/kubectl.rs`).
//!
//! What it serves:
//! - discovery: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>`, `/apis/<group>/<version>`;
//! - namespaced `Pod` (`v1`, with `status` and `exec`), `Lease` (`coordination.k8s.io/v1`),
//!   agent-sandbox `Sandbox` (`agents.x-k8s.io/v1beta1`), `SandboxClaim`, `SandboxWarmPool`,
//!   `SandboxTemplate` (`extensions.agents.x-k8s.io/v1beta1`);
//! - create, get, list (`labelSelector`, `fieldSelector`, `limit`/`continue`), replace, patch
//!   (merge, strategic-as-merge, server-side apply as create-or-merge), delete (with
//!   `propagationPolicy`: ownerReference cascade; `preconditions` on `uid` and
//!   `resourceVersion`) and deletecollection, with resourceVersions,
//!   409 on stale writes and `Status` error bodies (400/403/404/405/409/410/415/422/429/5xx);
//! - watch: newline-delimited events; selector transitions; an expired resourceVersion yields an
//!   `ERROR` event with a 410 `Status` (as the real server does) — [`Loopback::store`]`.compact()`
//!   expires everything older than now;
//! - `pods/exec` over a websocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`) running the argv as a
//!   local process in the pod's directory (see [`exec`]);
//! - scripted controllers: a kubelet and agent-sandbox (see [`controller`]);
//! - fault switches ([`faults`]) and optional RBAC enforcement ([`PolicyRule`]); every request's
//!   (verb, group, resource, subresource) is logged for RBAC coverage checks;
//! - an audit log of chosen annotations (the analog of the real API server's audit log, read in
//!   process): [`Store::audit_annotation`] names one, [`Store::annotation_audit`] lists every
//!   accepted write that changed it, in resourceVersion order (the fleet tests audit the
//!   fencing-token annotation this way).
//!
//! Simplifications (documented, not hidden): one process, no authentication, no admission; the
//! garbage collector and the kubelet act at once (the collector also deletes Sandboxes and Pods
//! whose controlling owner is gone); a pod's directory outlives the pod, like a volume (a
//! suspended Sandbox's pod comes back under the same name and finds its files); strategic merge patch is a merge patch;
//! server-side apply tracks no field managers; deletes are immediate (no grace period); `Table`
//! output is not served (kubectl falls back to its own printing of plain objects).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod controller;
pub mod exec;
pub mod faults;
pub mod metadata;
pub mod openapi;
pub mod patch;
pub mod resources;
pub mod selector;
mod server;
pub mod status;
pub mod store;
mod watch;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use faults::{Fault, Faults, Matcher, RequestInfo, Verb};
pub use server::PolicyRule;
pub use store::{AnnotationWrite, Store};

use controller::{Controller, ControllerSwitches};
use server::Shared;

/// A running loopback API server. Dropping it stops accepting connections and the controllers.
pub struct Loopback {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    switches: Arc<ControllerSwitches>,
    wake: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Loopback {
    /// Starts a server on an ephemeral port of 127.0.0.1, with its pods' directories in a fresh
    /// temporary directory and `/workspace` as the container root.
    pub async fn start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::new());
        let shared = Arc::new(Shared {
            store: store.clone(),
            faults: Faults::default(),
            requests: Mutex::new(BTreeSet::new()),
            request_counts: Mutex::new(std::collections::BTreeMap::new()),
            rbac: Mutex::new(None),
            agent_sandbox: Mutex::new(resources::AgentSandboxApi::default()),
            pods_root: dir.path().join("pods"),
            container_root: "/workspace".into(),
            watches_opened: tokio::sync::watch::channel(0).0,
            watches_expired: tokio::sync::watch::channel(0).0,
        });
        let switches = Arc::new(ControllerSwitches::default());
        let wake = Arc::new(Notify::new());
        let controller = Controller {
            store,
            switches: switches.clone(),
            wake: wake.clone(),
            pods_root: shared.pods_root.clone(),
        };
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| server::handle(shared.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        let ctl = tokio::spawn(controller.run());
        Ok(Loopback {
            addr,
            shared,
            switches,
            wake,
            tasks: vec![accept, ctl],
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The object store (direct reads and writes for assertions and simulated events).
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The fault switches.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Every distinct (verb, group, resource, subresource) requested so far (names cleared).
    pub fn requests(&self) -> BTreeSet<RequestInfo> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests served so far, counted by (verb, group, resource, subresource); names cleared.
    /// Discovery documents (`/apis`, `/version`, ...) are not counted.
    pub fn request_counts(&self) -> std::collections::BTreeMap<RequestInfo, u64> {
        self.shared
            .request_counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Watch requests served so far.
    pub fn watches_opened(&self) -> u64 {
        *self.shared.watches_opened.borrow()
    }

    /// Watches answered with 410 Gone (an expired resourceVersion) so far.
    pub fn watches_expired(&self) -> u64 {
        *self.shared.watches_expired.borrow()
    }

    /// Waits until at least `n` watch requests have been served (no polling, no sleeping).
    pub async fn wait_for_watches(&self, n: u64) {
        let mut rx = self.shared.watches_opened.subscribe();
        let _ = rx.wait_for(|v| *v >= n).await;
    }

    /// Enforces RBAC: from now on, requests no rule allows answer 403 Forbidden.
    pub fn enforce_rbac(&self, rules: Vec<PolicyRule>) {
        *self.shared.rbac.lock().unwrap_or_else(|e| e.into_inner()) = Some(rules);
    }

    /// Serves the API of another agent-sandbox release (or none): what a cluster with an older
    /// install looks like to a client.
    pub fn serve_agent_sandbox(&self, api: resources::AgentSandboxApi) {
        *self
            .shared
            .agent_sandbox
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = api;
    }

    /// The claim controller's label-domain allowlist, as the ConfigMap `agent-sandbox-config`
    /// (key `allowed-label-domains`) sets it; empty: the default, `sandbox.users.io`.
    pub fn allow_label_domains(&self, domains: Vec<String>) {
        *self
            .switches
            .allowed_label_domains
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = domains;
        self.wake.notify_one();
    }

    /// Pauses or resumes the controllers (paused: pods stay Pending, claims unready). A pause
    /// waits for a reconcile pass in progress: nothing is reconciled after it returns.
    pub fn pause_controllers(&self, paused: bool) {
        self.switches.pause(paused);
        self.wake.notify_one();
    }

    /// Runs the Sandbox controller with auto-suspension, as upstream's
    /// `--enable-auto-suspend-and-resume=true` does (see [`controller`]): a Sandbox with
    /// `spec.autoSuspension.inactivityTimeoutSeconds` is suspended (its pod deleted,
    /// `operatingMode` left `Running`) once that long passed on the server clock since its
    /// `status.lastActivityTime`.
    pub fn enable_auto_suspension(&self, on: bool) {
        self.switches.auto_suspend.store(on, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Makes new pods fail instead of running.
    pub fn fail_new_pods(&self, fail: bool) {
        self.switches.fail_pods.store(fail, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Whether the pods' containers ignore SIGTERM, as `sleep infinity` as PID 1 does (PID 1
    /// has no default signal handlers): a deleted pod then stays `Terminating` until its grace
    /// period ends on the server clock ([`Loopback::advance_clock`]). By default they exit at
    /// once, and the kubelet removes a deleted pod at its next pass.
    pub fn pods_ignore_sigterm(&self, ignore: bool) {
        self.switches.ignore_sigterm.store(ignore, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Advances the server clock (expiries: claim/sandbox `shutdownTime`, pod
    /// `activeDeadlineSeconds`, the grace periods of terminating pods) and runs the
    /// controllers.
    pub fn advance_clock(&self, by: Duration) {
        self.shared.store.advance(by);
        self.wake.notify_one();
    }

    /// The host directory of a pod (its `/workspace` is `<dir>/workspace`).
    pub fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        exec::pod_dir(&self.shared.pods_root, namespace, pod)
    }

    /// The host path of an absolute path inside a pod's container (under `/workspace`).
    pub fn pod_path(&self, namespace: &str, pod: &str, container_path: &str) -> PathBuf {
        self.pod_dir(namespace, pod)
            .join(Path::new(container_path.trim_start_matches('/')))
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
