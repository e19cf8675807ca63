//! # sandkeeper-tokio: the async driver
//!
//! Runs the [`sandkeeper`] core behind one cloneable handle, [`Keeper`], and executes its
//! commands on a [`Backend`]. [`LocalBackend`] (sandboxes as local directories, commands as
//! real processes) is the embedded default; [`FaultBackend`] is a seeded world of failures,
//! hangs and deaths for tests.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandkeeper_tokio::KeeperError> {
//! use std::time::Duration;
//! use sandkeeper::{CallId, CallSpec, PathName, SessionId};
//! use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend};
//!
//! let keeper = Keeper::new(KeeperConfig::default(), LocalBackend::new_temp().unwrap())?;
//! let session = SessionId::new("s1").unwrap();
//! let guard = keeper.acquire(CallSpec::new(CallId::new("c1").unwrap(), session.clone())).await?;
//! keeper.flush(&session, &PathName::session_log(), b"{\"turn\":1}\n".to_vec())?;
//! guard.release().await; // the log is in the sandbox (or reported dropped) when this returns
//! let report = keeper.close(Duration::from_secs(5)).await;
//! # let _ = report; Ok(()) }
//! ```
//!
//! ## Shape
//!
//! - The core behind one lock, waiters, the close handshake and release on drop are
//!   [`sandkeeper_shell`]'s `Shared`, the runtime-neutral layer this driver is built on (and
//!   checked there by loom models). [`KeeperError`], [`Released`] and [`Tally`] are its types,
//!   re-exported here.
//! - `executor.rs`: the shell's `Executor` for tokio: commands on tokio tasks (a lane per
//!   sandbox for its lifecycle, a task per upload), with explicit concurrency limits (a pool
//!   for lifecycle operations; uploads bounded by the core's per-(session, path) rule, never by
//!   a pool that sessions share). It decides nothing: every command carries its deadline (the
//!   operation is dropped then, unanswered), `Abandon` drops an outstanding start, stop or
//!   persist so the Shutdown after it runs at once, and `suspend` says when a Persist is a
//!   sandbox's last command; `classify.rs`: backend failures into core inputs; `timer.rs`: the
//!   core's deadlines.
//! - `keeper.rs`, `guard.rs`: the application's API; `ops/`: the application's own work in its
//!   sandbox ([`SandboxOps`], [`SandboxWork`], [`SessionWork`]).
//! - `local/`: [`LocalBackend`]; `fault/`: [`FaultBackend`].
//! - `workload/`: the main job's workload on any backend ([`workload::run`]); the `harness`
//!   binary runs it on [`LocalBackend`].
//!
//! ## Tracing
//!
//! Spans: `call` (call, session) around an acquire and its guard's release; `sandbox`
//! (sandbox) around each sandbox's lifecycle commands; `upload` (upload, sandbox, session,
//! path, version) around each upload; `timer`, `deaths`, `close`.
// Denied, not forbidden: `local/isolation.rs`'s `before_exec` (a pre-exec hook that closes the
// keeper's descriptors and joins a cgroup before bubblewrap runs) is the one function that
// allows it, with its reason beside it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod classify;
mod clock;
mod executor;
pub mod fault;
mod guard;
mod keeper;
pub mod local;
mod notice;
pub mod ops;
pub mod rng;
pub mod store;
mod timer;
pub mod workload;

pub use backend::{
    AdoptRequest, Backend, BackendError, DeathSink, DiscardRequest, FailureClass, Loss,
    PersistRequest, StartRequest, StopRequest, UploadRequest,
};
pub use fault::FaultBackend;
pub use guard::CallGuard;
pub use keeper::{Keeper, KeeperConfig, Load};
pub use local::LocalBackend;
pub use notice::Notice;
pub use ops::{
    Chunk, Entry, EntryKind, EntryMeta, ExecOptions, ExecOutput, Input, OpError, OpErrorClass,
    SandboxOps, SandboxWork, SessionWork, WorkPath,
};
pub use sandkeeper_shell::{KeeperError, Released, Tally};
