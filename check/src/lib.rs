//! The core's output contract as incremental checkers, one concern per file.
//!
//! Four places watch what the core orders and must agree on what is allowed: the simulator's
//! history (`sim/src/history.rs`), the core's scripted tests (`core/tests/support`), the fault
//! backend of io-tokio (which sees the commands from the backend's side) and the agreement test
//! (`tests/tests/agreement.rs`, whose scripted backend does the same). Each used to write the
//! rules again. The rules live here once; each checker is fed one item at a time, keeps only
//! what its rule needs, and answers with a [`Violation`] naming the broken check.
//!
//! | file | concern | checks |
//! |---|---|---|
//! | `lane.rs` | [`Lane`], [`Lanes`]: the order of backend-facing operations on one sandbox (Start, Upload, Stop, Persist, Shutdown) | `start-once`, `no-command-after-shutdown`, `no-upload-after-stop`, `stop-managed-only`, `stop-once`, `persist-after-stop`, `no-shutdown-of-external`, `liveness-shutdown-every-started` |
//! | `uploads.rs` | [`UploadChecker`]: uploads in flight | `one-upload-per-path`, `no-upload-after-stop` (none awaited at Stop or Shutdown), `uploaded-is-acknowledged` |
//! | `versions.rs` | [`PathVersions`], [`Versions`]: the numbering and settlement of one path's versions | `versions-numbered`, `settle-once`, `versions-increase`, `superseded-by-newer`, `liveness-settled` |
//! | `calls.rs` | [`CallChecker`]: call events against the live calls ([`LiveCalls`], `live.rs`), and what the core answers about them when asked | `call-names-unique`, `typed-errors`, `release-live`, `call-events`, `ready-on-live-sandbox`, `serialize-fifo`, `release-completes-once`, `binding-stable`, `no-teardown-under-live-call`, `serialize-one-per-key`, `resolve-own-sandbox`, `liveness-release-completes` |
//! | `deadlines.rs` | [`Deadlines`]: every deadline the core documents holds | `command-deadline`, `upload-within-timeout`, `drain-within-deadline`, `wait-within-timeout`, `close-within-deadlines` |
//! | `mirror.rs` | [`MirrorChecker`]: where and when a session's versions are written | `upload-routing`, `mirror-independent`, `release-drains-mirror`, `mirror-settled-true` |
//! | `snapshots.rs` | [`Snapshots`]: what a key keeps for its next start, and when the core lets it go (in fleet mode also what a claim hands over, until a key is let go) | `discard-unreferenced`, `discard-after-retention`, `snapshot-released` |
//! | `conservation.rs` | [`Conservation`]: nothing acknowledged is lost: each key's acknowledged work is held by a workspace the key may continue from, through every transition, but for the core's documented excuses | `conservation` |
//! | `progress.rs` | [`Progress`]: a queued call waits only while something real holds its key back (a sandbox of the key on its way down or handed over, a `Serialize` holder, in fleet mode a key not owned or a release under way) | `progress`, `wait-timeout-held` |
//! | `outputs.rs` | [`OutputChecker`]: the shape of the stream: nothing after `Closed`, an `Abandon` followed at once by its Shutdown | `nothing-after-closed`, `abandon-then-shutdown` |
//! | `violation.rs` | [`Violation`]: a broken check, by its stable name | |
//!
//! The names are stable: the simulator reports them (`FAIL seed N: invariant <name>`), its
//! canaries and `docs/scenarios.md` refer to them.
//!
//! The lane and the versions come in two forms: a per-record state with a pure transition
//! ([`Lane`], [`PathVersions`]) for a user that keeps its own record per sandbox or path (the
//! simulator embeds a lane in its sandbox record and pays no extra lookup), and a table of them
//! ([`Lanes`], [`Versions`]) for a user that keeps none.
//!
//! Who runs what:
//!
//! | user | checkers |
//! |---|---|
//! | the simulator's history | all, on every input of every seed |
//! | the simulator's fleet world | per incarnation: [`Lane`] (an Adopt starts a new lane), [`OutputChecker`], [`UploadChecker`], [`Snapshots`] (with a claim's handed-over snapshot and a key let go), [`Versions`] and [`Progress`] |
//! | the core's scripted tests (`core/tests/support`) | all but the after-input time bounds (a script moves its clock freely, so only command deadlines are judged): the getter checks after every input |
//! | io-tokio's `FaultBackend` | [`Lanes`], on the operations it receives |
//! | the agreement test | [`Lanes`] on what its scripted backend receives; [`Versions`] and [`OutputChecker`] on the keeper's versions and events |
//!
//! A checker judges; it never panics and never fixes anything up: after a violation it goes on
//! from the state the item implies, so a caller that keeps going sees each break once.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod calls;
mod conservation;
mod deadlines;
#[cfg(test)]
mod fixtures;
mod lane;
mod live;
mod mirror;
mod outputs;
mod progress;
mod snapshots;
mod uploads;
mod versions;
mod violation;

pub use calls::CallChecker;
pub use conservation::{Conservation, Content, Work};
pub use deadlines::Deadlines;
pub use lane::{Lane, Lanes, Op};
pub use live::{CallRecord, LiveCalls, Phase};
pub use mirror::MirrorChecker;
pub use outputs::OutputChecker;
pub use progress::Progress;
pub use snapshots::Snapshots;
pub use uploads::{Flight, UploadChecker};
pub use versions::{PathVersions, Versions};
pub use violation::Violation;
