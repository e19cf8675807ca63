//! `record-parity`: an owned key's durable record names what its owner would continue from, so
//! that the next owner, should the owner crash, continues from there too.
//!
//! The core writes an owned key's record one write at a time, when what it should say changed,
//! and not while the key's sandbox is on its way up (an adoption or a resume continues from
//! what the record names) or on its way down (the way down's end writes it once, or releases
//! the key with it). So the record is judged only where the core has no reason to wait:
//!
//! - the key's owner in the store is a replica's current incarnation, alive, with a live lease
//!   in the store, and its core holds the key under the store's token;
//! - no record write or release of the key by that incarnation is in flight or in doubt: each
//!   one it ordered counts until its answer reached the core (one its driver dropped past its
//!   deadline, until the core's timers next run, which end it there: by then the store has
//!   applied it or never will), and one answered failed until the core writes again (its retry
//!   waits `claim_retry`);
//! - every sandbox the owner started or adopted for the key under that token is up (running,
//!   idle or draining) or forgotten by the core: none starting (or running its after hook),
//!   stopping, persisting, shutting down, handed over or dead.
//!
//! Then the record must name exactly what the core would continue from: as `warm`, the key's
//! sandbox that is up, else the one its next call adopts though it is not up here (left as it
//! was after a failed way down, or named by the claim's record while this process still
//! tracked it: [`Intent::left`]), else none, and as its snapshot the one the key keeps for its
//! next start (`sandkeeper_check::Snapshots`, fed by [`super::intent`]: its last persist, or
//! the snapshot its claim was handed), by name and by the sandbox that persisted it (the
//! retention's instant is carried across clocks and not compared).
//!
//! Checked after every input of a replica and every store write.

use std::collections::BTreeMap;

use sandkeeper::{Input, Key, KeyRecord, Lifecycle, SandboxState, StoreCommand, Token};

use super::intent::Intent;

/// One incarnation's record writes and releases, per key: how many are in flight, the token
/// of the last one ordered, and whether it was answered failed (its retry not ordered yet).
#[derive(Clone, Debug, Default)]
pub(super) struct Writes {
    keys: BTreeMap<Key, Flight>,
    /// Keys with an answer the driver dropped past its deadline: in doubt until the core's
    /// timers next run (its next wake-up, past that deadline, ends the write there).
    dropped: Vec<Key>,
}

/// The writes of one key.
#[derive(Clone, Copy, Debug, Default)]
struct Flight {
    in_flight: u32,
    token: Option<Token>,
    failed: bool,
}

impl Writes {
    /// The core ordered store work.
    pub(super) fn ordered(&mut self, cmd: &StoreCommand) {
        if let StoreCommand::Record { key, token, .. } | StoreCommand::Release { key, token, .. } =
            cmd
        {
            let e = self.keys.entry(key.clone()).or_default();
            e.in_flight += 1;
            e.token = Some(*token);
            e.failed = false;
        }
    }

    /// An answer to store work reached the driver; `taken`: its core took it (not dropped past
    /// its deadline).
    pub(super) fn answered(&mut self, input: &Input, taken: bool) {
        let (key, failed) = match input {
            Input::Recorded { key, .. }
            | Input::RecordFenced { key, .. }
            | Input::KeyReleased { key, .. }
            | Input::ReleaseFenced { key, .. } => (key, false),
            Input::RecordFailed { key, .. } | Input::ReleaseFailed { key, .. } => (key, true),
            _ => return,
        };
        if let Some(e) = self.keys.get_mut(key) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.failed |= failed && taken;
        }
        if !taken {
            self.dropped.push(key.clone());
        }
    }

    /// The core's due timers ran: it ended every write whose answer was dropped.
    pub(super) fn timers_ran(&mut self) {
        self.dropped.clear();
    }

    /// Whether a write of `key`, owned under `token`, is in flight or in doubt.
    fn busy(&self, key: &Key, token: Token) -> bool {
        self.keys
            .get(key)
            .is_some_and(|e| e.in_flight > 0 || (e.failed && e.token == Some(token)))
            || self.dropped.contains(key)
    }
}

/// `record-parity` for `key`, owned under `token` by the process `core` (its `intent` and
/// `writes`), whose stored record is `stored`: `Err` with what differs, when judged.
pub(super) fn check(
    key: &Key,
    token: Token,
    stored: &KeyRecord,
    core: &Lifecycle,
    intent: &Intent,
    writes: &Writes,
) -> Result<(), String> {
    if core.key_token(key) != Some(token) || writes.busy(key, token) {
        return Ok(());
    }
    let mut warm = None;
    for x in intent.of_key.get(key).into_iter().flatten() {
        if intent.key_of(*x).is_none_or(|(_, t)| *t != Some(token)) {
            continue;
        }
        let state = core.sandbox_state(*x);
        if state.is_none() {
            continue; // forgotten by the core
        }
        // On its way up or down (or a second one up, which is not the core's to have: other
        // checks say so): not judged.
        if !state.is_some_and(SandboxState::accepts_uploads) || warm.is_some() {
            return Ok(());
        }
        warm = Some(*x);
    }
    // Nothing up: the sandbox the key's next call adopts, if one was left to it.
    let warm = warm.or_else(|| intent.left.get(key).copied());
    let kept = intent.snapshots.kept(key);
    let recorded = stored.snapshot.as_ref().map(|s| (&s.snapshot, s.by));
    if stored.warm == warm && recorded == kept {
        return Ok(());
    }
    Err(format!(
        "the record of {key} names warm {:?} and snapshot {:?}; its owner, quiet, would continue from warm {warm:?} and snapshot {kept:?}",
        stored.warm, recorded
    ))
}
