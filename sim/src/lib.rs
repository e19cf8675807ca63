//! # sim: the deterministic simulator of sandkeeper
//!
//! Drives the real `sandkeeper` core (never a copy) through a simulated application and backend,
//! in virtual time, from one `u64` seed, in the manner of TigerBeetle's VOPR:
//!
//! - [`swarm`]: the seed draws a configuration (scope, same-key and release policies, deadlines,
//!   fault rates, workload mix); it is printed at the start of a run.
//! - `world.rs`: the application (sessions, users, concurrent calls, same-key collisions,
//!   externals, flushes of several paths, resolves, holds, cancellations, close at any moment)
//!   and the backend (start and upload latency, failures, hangs, deaths at any moment, stop,
//!   persist and shutdown failures, late and duplicate answers).
//! - [`harness`]: applies steps to the core and, after every input, drains its output and checks
//!   the invariants: the history invariants every input (`history.rs` feeds the checkers of
//!   `sandkeeper_check`, one per concern: lanes, versions, deadlines, outputs, calls, uploads,
//!   mirror, and adds what needs the simulator's whole world), and the core's own
//!   `check_invariants` every input while the state is small (at most
//!   [`HarnessOptions::small_state`](harness::HarnessOptions) calls plus sandboxes), else every
//!   `full_check_every` inputs.
//! - [`run`]: one seed, then the liveness phase (faults off, everything answered, time runs;
//!   every call ready or failed, every release complete, every version settled, the core quiet,
//!   close complete).
//! - [`scenario`]: scenario files (`.scn`, see `docs/scenarios.md`): parser with
//!   line-numbered errors, runner, expectations; a file with a `fleet` line runs on the fleet
//!   world (`fleet::script`), its steps naming their replica (`[r1] acquire ...`).
//! - [`fleet`]: `--replicas N`, several real cores over one simulated store and backend.
//! - [`shrink`]: reduces a failing seed to a short scenario failing the same invariant.
//!
//! The command line is `cargo run --release -p sim -- explore|replay|shrink|run`. The public
//! modules are what a caller uses (the command line, the tests, the agreement test); the world,
//! the history and its checkers, the ledger and the helpers stay inside.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
pub mod batch;
mod by_sandbox;
mod failure;
mod fastmap;
pub mod fleet;
pub mod harness;
mod history;
pub mod marks;
mod panics;
mod rng;
pub mod run;
pub mod scenario;
pub mod shrink;
pub mod step;
pub mod swarm;
mod touched;
mod world;

pub use backend::{Fate, Ledger, Op};
pub use failure::Failure;
pub use history::History;
pub use world::World;
