//! # sandkeeper-k8s: sandboxes on Kubernetes
//!
//! The Kubernetes operations a sandkeeper backend needs, as plain async methods of [`Cluster`]
//! (a `kube::Client` bound to one namespace and one owner instance). Two modes ([`Mode`]):
//!
//! - **agent-sandbox** (kubernetes-sigs/agent-sandbox): one `SandboxClaim`
//!   (`extensions.agents.x-k8s.io/v1beta1`) per sandbox against a warm pool; ready when
//!   `status.sandbox.name` is set and `Ready=True`; terminal reasons fail fast; the pod is named
//!   by the Sandbox's `agents.x-k8s.io/pod-name` annotation (else the Sandbox's name); deleting
//!   the claim ends it all (the claim owns the Sandbox, which owns the Pod). Typed CRDs: [`crd`].
//! - **pod**: a plain `Pod` per sandbox from a user template.
//!
//! The backend executes the core's commands and keeps no table to interpret them: each
//! command says what it needs, and the release policy is the core's alone.
//! [`K8sBackend::connect`] takes no policy; the keeper asks the backend once whether its mode
//! can serve the core's configuration (`Backend::check_config`: pod mode refuses `Suspend`).
//! A `Stop`/`Persist` that suspends (agent-sandbox mode) patches the Sandbox
//! `operatingMode: Suspended` (pod deleted, claim and Sandbox with its volumes kept) and hands
//! the claim's name to the core as the snapshot; the `Start` that carries it as `resume_from`
//! resumes that same claim (`Running`); a claim lost meanwhile means a fresh start and a
//! warning (`suspend.rs`).
//!
//! Deaths are reported by the sandbox number an object's `sandkeeper.sandbox.users.io/sandbox` label carries
//! (`deaths.rs`): a claim's pod lost is a lost instance, a claim (or a plain pod) lost is a lost
//! sandbox, and the core decides what either means. There is no table of incarnations: a
//! resume labels the claim's objects with the new sandbox number before the new pod exists,
//! so every event of the suspended pod, however late, names the suspended sandbox, which the
//! core no longer tracks and ignores; a pod lost while its sandbox is being suspended is the
//! suspension's own doing, and the core knows it.
//!
//! ## A lost instance keeps its workspace
//!
//! A claim's pod lost while the claim and its volumes remain (evicted, drained off its node,
//! OOM-killed, deleted by hand) is made again by the controller on the same volumes. The core
//! suspends such a sandbox at once (`Stop` and `Persist` with `suspend`, its calls told
//! `SandboxLost`), and neither needs the pod: admission is checked on the claim's annotation,
//! and `operatingMode: Suspended` stops the pod made again. Nothing is deleted; the key's next
//! `Start` resumes the claim, and a resume that finds the Sandbox running (its pod made again,
//! never suspended) waits until the controller carried the new sandbox number onto that pod.
//!
//! Newer controllers suspend a Sandbox by themselves after
//! `spec.autoSuspension.inactivityTimeoutSeconds` without activity (upstream pull request 1296,
//! behind the controller's `--enable-auto-suspend-and-resume`): the pod goes, `operatingMode`
//! stays `Running`, the `Ready` reason is `SandboxAutoSuspended` ([`crd::Suspension`]). Only
//! the Sandbox Router's traffic is activity to it, not a keeper's execs. The backend never
//! takes that for a death: the pod's loss is a lost instance (and the claim's reason is not
//! terminal), so the core suspends the sandbox as the controller did; a `Persist` that
//! suspends waits until the controller shows the keeper's mode; a resume or a fleet adoption
//! that finds a Sandbox the controller suspended takes the suspension over by mode, then sets
//! `Running` (which the controller counts as activity) and runs it on its volumes.
//!
//! A keeper that ends (crashes, or is killed) leaves its warm sandboxes running, and the
//! controller may suspend them after it. At connect, and in a fleet's sweeps, such a claim is
//! judged exactly as a claim its keeper suspended is in the same place, and never as dead
//! because its pod is gone: a keeper alive when the controller suspended it would have
//! suspended it by mode (the core suspends a sandbox whose instance was lost), so the claim
//! the controller leaves is judged as the one that keeper would have left.
//! - [`K8sBackend::connect`]'s orphan sweep judges every claim by its owner alone (`lease.rs`):
//!   a dead owner's claims go, suspended or not, and a live owner's and this owner's own stay.
//!   Each claim it finds the controller suspended, a dead owner's (swept) or this owner's own
//!   from an earlier run (kept), is counted in [`SweepReport::auto_suspended`] and named in a
//!   warning: its keeper ended with it running, and the controller paused it since.
//! - A fleet's sweep ([`K8sStore::sweep`], the first at once when its keeper starts; its
//!   backend's [`K8sBackend::connect_fleet`] sweeps nothing) sees such a claim as a sandbox and
//!   as a suspended claim whose retention is its `shutdownTime` (`fleet_sweep.rs`): it stays
//!   while its key's owner lives or its key's record names it, and, named by nothing, until its
//!   `shutdownTime`, as a claim its keeper suspended without a retention does.
//!
//! Behaviour:
//! - [`K8sBackend::connect`] first checks the install (`install.rs`): in agent-sandbox mode the
//!   API is served at `v1beta1` (agent-sandbox v0.5.0 on), the warm pool and its template
//!   exist, and the template's pod takes an exec by the API server's container rule
//!   (`container.rs`: with several containers, [`K8sConfig::container`] must name one); a
//!   cluster that cannot work is refused with [`K8sError::Install`], which names the fix;
//! - files go in through `pods/exec`, all or nothing per file: `timeout -s KILL <secs> tar -x -C
//!   <workdir>` of a temporary name beside the final one, with the tar stream on stdin, then
//!   `timeout -s KILL <secs> mv -f -T -- <tmp> <final>` (`upload.rs`); an exec without a status
//!   frame is [`K8sError::OutcomeUnknown`], never success; payloads over the limit are refused;
//! - every object carries owner, session-hash and sandbox labels ([`names`]) and a server-side
//!   expiry backstop (claim `shutdownTime`, pod `activeDeadlineSeconds`);
//! - each owner keeps a `Lease`; [`Cluster::sweep_orphans`] deletes objects of owners whose
//!   Lease is gone (`lease.rs`), and reports the claims among them and among this owner's own
//!   whose Sandbox the controller suspended (see above);
//! - fleet mode's store ([`K8sStore`], `fleet_store.rs`): process leases, key entries with
//!   fencing tokens and durable records, in Leases changed under their `resourceVersion`
//!   and the backend's token checks (`fence.rs`: the newest token a sandbox has seen, on its
//!   claim or pod, raised under the read's `resourceVersion`; a start checked against its
//!   key's newest on the store's Lease), adoption (`adopt.rs`) and the fleet sweep
//!   (`fleet_sweep.rs`); a fleet's backend is [`K8sBackend::connect_fleet`];
//! - readiness and deaths come from `kube::runtime` watches (`wait.rs`, `deaths.rs`); a 410 Gone
//!   relists;
//! - API errors are classified ([`ErrorClass`]): 404 gone, 409 retried after a fresh read, 429
//!   and 5xx retried with backoff and jitter under a deadline (`retry.rs`), 401/403 fatal with
//!   the missing permission named. `deploy/rbac.yaml` grants exactly [`cluster::calls::ALL`].
//!
//! ## The main job on a cluster
//!
//! [`workload::run_workload`] runs the io-tokio harness workload on a [`K8sBackend`]; the
//! `harness-k8s` binary wraps it:
//! `cargo run --release -p sandkeeper-k8s --bin harness-k8s -- --namespace NS --warm-pool POOL`
//! (or `--pod-template FILE`; `--kubeconfig FILE`, `--server URL`). With `--fleet` it runs as
//! one process of a fleet ([`run_fleet_workload`]); [`verify_fleet`] checks the fleet's
//! namespace once every process ended.
//!
//! ## Kubernetes version
//!
//! `k8s-openapi` is built with the `v1_33` feature: the earliest version kube 5 supports, so the
//! client works with every cluster from 1.33 on (the Pod, Lease and exec APIs used here are
//! stable across 1.33–1.37). Exactly one version feature is enabled in the workspace.
//!
//! ## Testing
//!
//! Tests run against `k8s-loopback` (a loopback Kubernetes API over real HTTP with real watch
//! framing and a real exec websocket). Tests against a real cluster are `#[ignore]`d:
//! `KUBECONFIG=... cargo test -p sandkeeper-k8s -- --ignored`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adopt;
mod archive;
mod backend;
mod claim;
mod cluster;
mod config;
mod container;
pub mod crd;
mod deaths;
mod error;
mod fence;
mod fleet_store;
mod fleet_sweep;
mod fleet_verify;
mod install;
mod lease;
pub mod names;
mod pod;
mod retry;
mod sandbox;
mod shelf;
mod suspend;
mod upload;
mod wait;
mod work;
mod workload;

pub use backend::{failure, K8sBackend};
pub use cluster::{calls, Cluster};
pub use config::{ConfigError, K8sConfig, Mode};
pub use deaths::{Death, DeathWatch, LossCounts};
pub use error::{Call, ErrorClass, K8sError};
pub use fleet_store::K8sStore;
pub use fleet_verify::verify_fleet;
pub use install::{Install, API_VERSION};
pub use lease::{LeaseRenewal, SweepReport};
pub use sandbox::SandboxHandle;
pub use suspend::{Resumable, SuspendedClaim, SUSPENDED_REASON};
pub use upload::{Captured, UploadFile, EXEC_GRACE};
pub use workload::{run_fleet_workload, run_workload, HarnessError};
