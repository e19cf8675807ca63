//! The fleet's store cost when nothing happens (issue 15):
//!
//! - `fleet.store_writes_per_min`: the store work one process orders in a minute while it holds
//!   1,000 keys (each with a suspended sandbox's snapshot: owned, nobody wants them) and no call
//!   comes. Every store command is one write (a renewal, a claim, a release).
//! - `fleet.store_writes_per_min_10_keys`: the same with 10 keys, and
//!   `fleet.store_writes_1000_vs_10_keys`, their ratio (goal ≤ 1: the cost grows with
//!   processes, not keys, because keys ride on their owner's one process lease).
//!
//! Counted on the real core in virtual time: a count, not a timing, so the same on any machine.

use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Command, Config, Fleet, Instant, KeyRecord, Lifecycle, ReleasePolicy,
    SessionId, StoreCommand, Token,
};

use crate::measure::Sink;

/// A core holding `keys` suspended keys, idle, at `t`; the store writes it orders in the next
/// minute.
fn idle_minute_writes(keys: usize) -> Result<u64, String> {
    let fleet = Fleet::default();
    let mut core = Lifecycle::new(Config {
        fleet: Some(fleet),
        release: ReleasePolicy::Suspend,
        max_waiters: 8,
        ..Config::default()
    })
    .map_err(|e| e.to_string())?;
    let e = |e: sandkeeper::Error| e.to_string();
    let mut t = Instant::ZERO;
    // The first renewal, confirmed.
    core.handle_timeout(t).map_err(e)?;
    answer_store(&mut core, t)?;
    for i in 0..keys {
        let call = CallId::new(format!("c{i}")).map_err(|e| e.to_string())?;
        let session = SessionId::new(format!("s{i}")).map_err(|e| e.to_string())?;
        core.acquire(t, CallSpec::new(call.clone(), session))
            .map_err(e)?;
        // Claimed, started, recorded (the call is ready once the record names its sandbox).
        settle(&mut core, t)?;
        core.release(t, &call).map_err(e)?;
        settle(&mut core, t)?;
    }
    if core.stats().suspended != keys as u64 || core.tracked_keys() != keys {
        return Err(format!(
            "{} suspended, {} keys held; {keys} expected",
            core.stats().suspended,
            core.tracked_keys()
        ));
    }
    // One idle minute: every timer fired, every store command answered and counted.
    let end = t + Duration::from_secs(60);
    let mut writes = 0;
    while let Some(next) = core.poll_timeout().filter(|n| *n <= end) {
        t = next;
        core.handle_timeout(t).map_err(e)?;
        writes += answer_store(&mut core, t)?;
        answer_commands(&mut core, t)?;
    }
    if core.tracked_keys() != keys {
        return Err(format!(
            "{} keys held after the minute",
            core.tracked_keys()
        ));
    }
    Ok(writes)
}

/// Answers store and sandbox commands at `t` until the core orders nothing more.
fn settle(core: &mut Lifecycle, t: Instant) -> Result<(), String> {
    loop {
        let store = answer_store(core, t)?;
        let commands = answer_commands(core, t)?;
        if store == 0 && commands == 0 {
            return Ok(());
        }
    }
}

/// Answers every store command as a store that grants everything would; how many there were.
fn answer_store(core: &mut Lifecycle, t: Instant) -> Result<u64, String> {
    let mut n = 0;
    let mut token = 0;
    while let Some(cmd) = core.poll_store() {
        n += 1;
        let r = match cmd {
            StoreCommand::Renew { renewal, .. } => core.handle_renewed(t, renewal, &[]),
            StoreCommand::Claim { claim, key, .. } => {
                token += 1;
                core.handle_claimed(t, claim, &key, Token(token), KeyRecord::default())
            }
            StoreCommand::Record { recording, key, .. } => core.handle_recorded(t, recording, &key),
            StoreCommand::Release { release, key, .. } => {
                core.handle_key_released(t, release, &key)
            }
        };
        r.map_err(|e| e.to_string())?;
    }
    Ok(n)
}

/// Answers every sandbox command successfully (a Stop with a snapshot); how many there were.
fn answer_commands(core: &mut Lifecycle, t: Instant) -> Result<u64, String> {
    let mut n = 0;
    while let Some(cmd) = core.poll_command() {
        n += 1;
        let r = match cmd {
            Command::Start { sandbox, .. } | Command::Adopt { sandbox, .. } => {
                core.handle_start_ok(t, sandbox)
            }
            Command::Stop { sandbox, .. } => core.handle_stop_ok(
                t,
                sandbox,
                Some(sandkeeper::Snapshot::new(format!("snap-{sandbox}"))),
            ),
            Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox),
            Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox),
            Command::Upload { upload, .. } => core.handle_upload_ok(t, upload),
            Command::Hook { sandbox, .. } => core.handle_hook_ok(t, sandbox),
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Discard { .. }
            | Command::Abandon { .. }
            | Command::Relinquish { .. } => Ok(()),
        };
        r.map_err(|e| e.to_string())?;
    }
    while core.poll_event().is_some() {}
    Ok(n)
}

/// The fleet figures.
pub fn fleet_figures(report: Sink) {
    match (idle_minute_writes(1_000), idle_minute_writes(10)) {
        (Ok(many), Ok(few)) => {
            report("fleet.store_writes_per_min", many as f64, "writes");
            report("fleet.store_writes_per_min_10_keys", few as f64, "writes");
            report(
                "fleet.store_writes_1000_vs_10_keys",
                many as f64 / (few as f64).max(1.0),
                "x",
            );
        }
        (Err(e), _) | (_, Err(e)) => eprintln!("fleet figures: {e}"),
    }
}

#[cfg(test)]
mod tests {
    /// The figure's claim, as a test that can fail: idle keys cost no store writes.
    #[test]
    fn idle_keys_cost_no_store_writes() {
        let many = super::idle_minute_writes(200).unwrap();
        let few = super::idle_minute_writes(2).unwrap();
        assert_eq!(many, few, "store writes grew with the keys held");
        assert_eq!(many, 12, "one renewal every 5 s for a minute");
    }
}
