//! The [`Executor`] trait: what the shell needs from the runtime around it. Implementing it is
//! the whole of embedding the core behind a runtime (see the crate docs).

use std::sync::Arc;

use sandkeeper::{Command, Event, Instant, StoreCommand};

use crate::shared::Shared;

/// What the shell needs from the runtime around it: a clock, a way to start commands, a look at
/// events, and a timer to re-arm.
///
/// # The contract
///
/// - **Called with the core lock held.** Every method runs inside the critical section of the
///   input that caused it. None may block, sleep, await, do IO in place, or call back into
///   [`Shared`] (that would deadlock on the lock): hand the work to a thread, a task or a
///   queue, and return.
/// - **`execute` receives commands in the core's order**, whichever thread applied the input,
///   so a driver that keeps one sandbox's lifecycle commands in that order (a queue or a task
///   per sandbox, or one worker for all) keeps the core's drain contract. The rest of that
///   contract (`sandkeeper`'s crate docs, "The drain contract") is the driver's too: answer
///   Start, Upload, Stop, Persist and Shutdown exactly once with
///   [`Shared::answer`] (from outside the lock) unless the command was dropped at its deadline
///   or abandoned, run uploads beside everything, drop an operation at its deadline and answer
///   nothing then, report deaths with [`Input::Died`](sandkeeper::Input::Died).
/// - **The clock is the driver's.** [`now`](Self::now) maps the runtime's clock to the core's
///   [`Instant`] (nanoseconds since an origin the driver chose); it must never go backwards by
///   much (an earlier `now` counts as the latest the core has seen).
/// - **Store work runs on its own** (fleet mode, [`Config::fleet`](sandkeeper::Config::fleet)).
///   [`store`](Self::store) receives the core's [`StoreCommand`]s: run each concurrently with
///   everything (never queued behind a sandbox's work or another store command), answer it
///   once with its input ([`Input::Renewed`](sandkeeper::Input::Renewed), `Claimed`, ...)
///   through [`Shared::answer`], and drop it unanswered at its deadline. The core orders store
///   work only in fleet mode; an executor that runs no store refuses a fleet configuration
///   when it is made.
/// - **The timer is the driver's.** After every input, if the core's earliest deadline changed,
///   [`rearm`](Self::rearm) is told; the driver's timer then calls [`Shared::timeout`] once its
///   clock reached the deadline (early or twice is harmless). Check the clock before sleeping.
pub trait Executor: Send + Sync + Sized + 'static {
    /// The driver's clock, as the core's instant.
    fn now(&self) -> Instant;

    /// Starts one command, in the core's order, without waiting for it. `shared` is the handle
    /// the command's answer goes to (clone it, or downgrade it, into the task that runs it).
    fn execute(&self, shared: &Arc<Shared<Self>>, command: Command);

    /// Starts one piece of store work (fleet mode), without waiting for it; its answer goes to
    /// `shared`. Never called for a core without [`Config::fleet`](sandkeeper::Config::fleet).
    fn store(&self, shared: &Arc<Shared<Self>>, command: StoreCommand);

    /// Sees every event, in the core's order, before the shell routes it to its waiters (for a
    /// driver's subscribers, logs or counts).
    fn observe(&self, event: &Event);

    /// The core's earliest deadline changed (`None`: no deadline). Wake the timer.
    fn rearm(&self, deadline: Option<Instant>);
}
