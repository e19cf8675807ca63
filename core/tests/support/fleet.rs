//! Fleet-mode set-up: a leased core with this process's fleet settings, and helpers that claim
//! keys, answer ways down and read the records written.

use std::time::Duration;

use sandkeeper::*;

pub fn fleet() -> Fleet {
    Fleet {
        incarnation: 3,
        lease: Duration::from_secs(10),
        renew_every: Duration::from_secs(3),
        margin: Duration::from_secs(2),
        claim_retry: Duration::from_millis(500),
        handover: Handover::Warm,
    }
}

pub fn config(release: ReleasePolicy) -> Config {
    Config {
        fleet: Some(fleet()),
        release,
        wait_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

pub fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

pub fn session(name: &str) -> SessionId {
    SessionId::new(name).unwrap()
}

pub fn key(name: &str) -> Key {
    Key::Session(session(name))
}

/// A core whose lease is valid (its first renewal confirmed at 0).
pub fn leased(release: ReleasePolicy) -> Lifecycle {
    let mut core = Lifecycle::new(config(release)).unwrap();
    core.handle_timeout(ms(0)).unwrap();
    let Some(StoreCommand::Renew { renewal, .. }) = core.poll_store() else {
        panic!("the first renewal")
    };
    core.handle_renewed(ms(0), renewal, &[]).unwrap();
    core
}

pub fn commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

pub fn store(core: &mut Lifecycle) -> Vec<StoreCommand> {
    std::iter::from_fn(|| core.poll_store()).collect()
}

pub fn events(core: &mut Lifecycle) -> Vec<Event> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

pub fn acquire(core: &mut Lifecycle, t: Instant, call: &str, s: &str) {
    core.acquire(t, CallSpec::new(CallId::new(call).unwrap(), session(s)))
        .unwrap();
}

pub fn release(core: &mut Lifecycle, t: Instant, call: &str) {
    core.release(t, &CallId::new(call).unwrap()).unwrap();
}

/// A call of `s1` at 0 ms; its claim answered at 1 ms with token 11 and a record handing over
/// the warm sandbox of another process: that sandbox.
pub fn claimed_with_warm(core: &mut Lifecycle) -> SandboxId {
    acquire(core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(core);
    let warm = SandboxId((5 << 32) + 1);
    let record = KeyRecord {
        snapshot: None,
        warm: Some(warm),
    };
    core.handle_claimed(ms(1), claim, &k, Token(11), record)
        .unwrap();
    warm
}

/// The renewal due at 3 s is confirmed at 3.001 s, naming `wanted` as wanted elsewhere.
pub fn wanted_at_next_renewal(core: &mut Lifecycle, wanted: &[Key]) {
    core.handle_timeout(ms(3_000)).unwrap();
    let renewal = match store(core).as_slice() {
        [StoreCommand::Renew { renewal, .. }] => *renewal,
        other => panic!("only the renewal: {other:?}"),
    };
    core.handle_renewed(ms(3_001), renewal, wanted).unwrap();
}

/// Answers every write of an owned key's record ordered so far as written, at `t`: the writes.
pub fn records_written(core: &mut Lifecycle, t: Instant) -> Vec<KeyRecord> {
    let mut written = vec![];
    for work in store(core) {
        match work {
            StoreCommand::Record {
                recording,
                key,
                record,
                ..
            } => {
                core.handle_recorded(t, recording, &key).unwrap();
                written.push(record);
            }
            other => panic!("only record writes expected, got {other:?}"),
        }
    }
    written
}

/// The one claim ordered, by number.
pub fn claim_of(core: &mut Lifecycle) -> (ClaimId, Key) {
    match store(core).as_slice() {
        [StoreCommand::Claim { claim, key, .. }] => (*claim, key.clone()),
        other => panic!("one claim expected, got {other:?}"),
    }
}

/// Claims and starts the key of `s` for call `call`: the started sandbox.
pub fn owned_and_ready(
    core: &mut Lifecycle,
    t: Instant,
    call: &str,
    s: &str,
    token: u64,
) -> SandboxId {
    acquire(core, t, call, s);
    assert_eq!(commands(core), vec![], "no start before the key is claimed");
    let (claim, k) = claim_of(core);
    core.handle_claimed(t, claim, &k, Token(token), KeyRecord::default())
        .unwrap();
    let Some(Command::Start {
        sandbox, token: tk, ..
    }) = commands(core).pop()
    else {
        panic!("a start")
    };
    assert_eq!(
        tk,
        Some(Token(token)),
        "the Start carries the owner's token"
    );
    core.handle_start_ok(t, sandbox).unwrap();
    assert_eq!(
        records_written(core, t),
        vec![KeyRecord {
            snapshot: None,
            warm: Some(sandbox)
        }],
        "the key's record names the sandbox its owner runs"
    );
    sandbox
}

/// Claims the key of `s` for call `call` under `token` and starts its sandbox at `t`, leaving
/// the write of the key's record that follows unanswered in the store queue: the sandbox and
/// the key.
pub fn started_with_record_out(
    core: &mut Lifecycle,
    t: Instant,
    call: &str,
    s: &str,
    token: u64,
) -> (SandboxId, Key) {
    acquire(core, t, call, s);
    let (claim, k) = claim_of(core);
    core.handle_claimed(t, claim, &k, Token(token), KeyRecord::default())
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = commands(core).pop() else {
        panic!("a start")
    };
    core.handle_start_ok(t, sandbox).unwrap();
    (sandbox, k)
}

/// Answers one command of a way down at `t` (a Drain needs no answer; a Stop answered with
/// `snapshot`; a Persist; a Shutdown): `None`, or the command back when it is not one of them.
pub fn answer_way_down(
    core: &mut Lifecycle,
    t: Instant,
    c: Command,
    snapshot: Option<&str>,
) -> Option<Command> {
    match c {
        Command::Drain { .. } => {}
        Command::Stop { sandbox, .. } => core
            .handle_stop_ok(t, sandbox, snapshot.map(Snapshot::new))
            .unwrap(),
        Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
        Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
        other => return Some(other),
    }
    None
}

/// Answers the way down of `x` (Stop, Persist, Shutdown) at `t`, with `snapshot` from the Stop,
/// and the record writes ordered meanwhile: the records written, and the other store work.
pub fn way_down(
    core: &mut Lifecycle,
    t: Instant,
    x: SandboxId,
    snapshot: Option<&str>,
    token: u64,
) -> (Vec<KeyRecord>, Vec<StoreCommand>) {
    let (mut records, mut rest) = (vec![], vec![]);
    loop {
        let cmds = commands(core);
        let mut answered = false;
        while let Some(work) = core.poll_store() {
            match work {
                StoreCommand::Record {
                    recording,
                    key,
                    record,
                    ..
                } => {
                    core.handle_recorded(t, recording, &key).unwrap();
                    records.push(record);
                    answered = true;
                }
                other => rest.push(other),
            }
        }
        if cmds.is_empty() && !answered {
            return (records, rest);
        }
        for c in cmds {
            assert!(
                c.token().is_none_or(|tk| tk == Token(token)),
                "every command carries the owner's token: {c:?}"
            );
            match c {
                Command::Stop { sandbox, .. } => {
                    assert_eq!(sandbox, x);
                    core.handle_stop_ok(t, x, snapshot.map(Snapshot::new))
                        .unwrap()
                }
                Command::Persist { sandbox, .. } => core.handle_persist_ok(t, sandbox).unwrap(),
                Command::Shutdown { sandbox, .. } => core.handle_shutdown_ok(t, sandbox).unwrap(),
                Command::Drain { .. } | Command::Discard { .. } => {}
                other => panic!("not on the way down: {other:?}"),
            }
        }
    }
}

/// Lets the lease lapse: no renewal is confirmed until 8 s.
pub fn lapse(core: &mut Lifecycle) -> Vec<Command> {
    let mut seen = vec![];
    while core.lease_valid_until().is_some() {
        let t = core.poll_timeout().unwrap();
        core.handle_timeout(t).unwrap();
        store(core);
        seen.extend(commands(core));
    }
    seen
}

/// Fires timers, confirming every renewal, until a release that went unanswered is asked again:
/// that release, and when (ms).
pub fn release_asked_again(core: &mut Lifecycle) -> (ReleaseId, u64) {
    loop {
        let t = core.poll_timeout().unwrap().as_nanos() / 1_000_000;
        core.handle_timeout(ms(t)).unwrap();
        let mut released = None;
        for c in store(core) {
            match c {
                StoreCommand::Renew { renewal, .. } => {
                    core.handle_renewed(ms(t), renewal, &[]).unwrap()
                }
                StoreCommand::Release { release, .. } => released = Some(release),
                other => panic!("{other:?}"),
            }
        }
        if let Some(r) = released {
            return (r, t);
        }
    }
}
