//! What the core hands out: the commands for the driver, the store's work (fleet mode), the
//! events for the application, and the counters it keeps. One part of the lifecycle's state,
//! owned here: every other part writes into it and only the `poll_*` getters take from it.

use crate::command::Command;
use crate::event::Event;
use crate::fleet::StoreCommand;
use crate::stats::Stats;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The lifecycle's outputs, queued until the driver drains them, and its counters.
///
/// Serialised flat into the lifecycle's state (its fields keep their names there).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Outputs {
    /// Work for the driver, in the order it must be started; drained with `poll_command`.
    pub(crate) commands: VecDeque<Command>,
    /// Fleet mode: work for the store, drained with `poll_store`.
    pub(crate) store: VecDeque<StoreCommand>,
    /// News for the application; drained with `poll_event`.
    pub(crate) events: VecDeque<Event>,
    /// Counters of what happened, read with `stats`.
    pub(crate) stats: Stats,
}

impl Outputs {
    /// Whether nothing waits to be drained.
    pub(crate) fn is_drained(&self) -> bool {
        self.commands.is_empty() && self.store.is_empty() && self.events.is_empty()
    }
}
