//! Notices: what a keeper tells subscribers (the core's events, and drains).

use sandkeeper::{Event, SandboxId, SessionList};

/// One notice for subscribers of [`Keeper::subscribe`](crate::Keeper::subscribe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// An event of the core, in the core's order.
    Event(Event),
    /// The sandbox is draining: these sessions' background writers should submit their last
    /// writes now (the core's `Drain` command).
    Drain {
        /// The draining sandbox.
        sandbox: SandboxId,
        /// The sessions whose mirror targets it.
        sessions: SessionList,
    },
}
