//! # sandkeeper-shell: the runtime-neutral shell around the core
//!
//! The [`sandkeeper`] core is a pure state machine: it takes one input at a time and must be
//! drained after each (its crate docs, "The drain contract"). Every driver needs the same small
//! layer around it: hand inputs from many threads to the one core under one lock, execute its
//! commands in its order, wake whoever waits on a decision (an acquire, a release, a session's
//! mirror, a close), release a call exactly once even when its owner is dropped, and keep the
//! timer. This crate is that layer, written once and checked by loom models, with no runtime in
//! it: [`Shared`] holds the core, and an [`Executor`] you write connects it to yours.
//!
//! ## Embedding the core behind a runtime
//!
//! 1. **Write an [`Executor`]**: `now` (your clock as the core's [`Instant`](sandkeeper::Instant),
//!    from an origin you pick), `execute` (start a command on your threads or tasks, never in
//!    place: it is called with the core lock held), `observe` (see events) and `rearm` (wake
//!    your timer).
//! 2. **Make the shell**: `let shared = Shared::new(Lifecycle::new(config)?, executor);` and
//!    share the `Arc` with everything that talks to the core.
//! 3. **Answer commands**: when a Start, Upload, Stop, Persist or Shutdown ends, call
//!    [`Shared::answer`] with its [`Input`](sandkeeper::Input) (`StartOk`, `UploadFailed`, ...);
//!    run one sandbox's lifecycle commands in order, uploads beside everything, and drop an
//!    operation at its deadline without answering. Report a sandbox that vanished with
//!    `Input::Died`.
//! 4. **Keep the timer**: a thread or task that sleeps until [`Shared::next_deadline`] (woken
//!    early by `rearm`), checks the clock, and calls [`Shared::timeout`].
//! 5. **Serve the application**: [`Shared::acquire`] gives a [`PendingCall`]; its
//!    [`ready`](PendingCall::ready) (async) or [`wait`](PendingCall::wait) (blocking) gives a
//!    [`CallTicket`] bound to a sandbox, released by [`CallTicket::release`] or its drop;
//!    [`Shared::flush`], [`Shared::resolve`], [`Shared::mirror_settled`] and
//!    [`Shared::close`] do the rest. Every waiter is a [`Wait`]: a future, or
//!    [`Wait::wait`] on a plain thread.
//!
//! `examples/std_threads.rs` does all five with no async runtime at all (std threads, std
//! channels, sandboxes as directories): `cargo run -p sandkeeper-shell --example std_threads`.
//! `sandkeeper-tokio` is the second runtime on the same layer: its `TokioExecutor` runs
//! commands on tokio tasks, and its `Keeper` wraps `Shared` in an async API.
//!
//! ## Files
//!
//! - `executor.rs`: the [`Executor`] trait, the contract between the shell and a runtime.
//! - `shared/`: [`Shared`] (the core and its waiters under one lock, the drain, the close
//!   handshake), [`PendingCall`] and [`CallTicket`] (release exactly once, on drop too);
//!   `shared/models.rs`: the loom models of all of it.
//! - `signal.rs`: the one-shot signal behind every [`Wait`].
//! - `sync.rs`: the std/loom shim (mutex, `Arc`, blocking a thread on a future).
//! - `tally.rs`: [`Tally`], counts of the core's events for reports.
//! - `error.rs`: [`KeeperError`], [`CallEnd`], [`Released`].
//!
//! ## Loom
//!
//! The models check the real code on loom's primitives, with the real core inside (no lost
//! wake-up, release exactly once, nothing accepted after close):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
//!     cargo test -p sandkeeper-shell --release -- --nocapture
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod executor;
mod shared;
mod signal;
mod sync;
mod tally;

pub use error::{CallEnd, KeeperError, Released};
pub use executor::Executor;
pub use shared::{CallTicket, PendingCall, Shared};
pub use signal::Wait;
pub use tally::Tally;
