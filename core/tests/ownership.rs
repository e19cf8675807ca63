//! Fleet mode, key ownership: a key is claimed before its sandbox is started or adopted, every
//! command changing the key's sandbox carries the token, the key is released with its durable
//! record when this process is done with it, handed over (warm) when another process wants it,
//! and continued from a record another process left.

use std::time::Duration;

use sandkeeper::*;

fn fleet() -> Fleet {
    Fleet {
        incarnation: 3,
        lease: Duration::from_secs(10),
        renew_every: Duration::from_secs(3),
        margin: Duration::from_secs(2),
        claim_retry: Duration::from_millis(500),
    }
}

fn config(release: ReleasePolicy) -> Config {
    Config {
        fleet: Some(fleet()),
        release,
        wait_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn session(name: &str) -> SessionId {
    SessionId::new(name).unwrap()
}

fn key(name: &str) -> Key {
    Key::Session(session(name))
}

/// A core whose lease is valid (its first renewal confirmed at 0).
fn leased(release: ReleasePolicy) -> Lifecycle {
    let mut core = Lifecycle::new(config(release)).unwrap();
    core.handle_timeout(ms(0)).unwrap();
    let Some(StoreCommand::Renew { renewal, .. }) = core.poll_store() else {
        panic!("the first renewal")
    };
    core.handle_renewed(ms(0), renewal, &[]).unwrap();
    core
}

fn commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

fn store(core: &mut Lifecycle) -> Vec<StoreCommand> {
    std::iter::from_fn(|| core.poll_store()).collect()
}

fn events(core: &mut Lifecycle) -> Vec<Event> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

fn acquire(core: &mut Lifecycle, t: Instant, call: &str, s: &str) {
    core.acquire(t, CallSpec::new(CallId::new(call).unwrap(), session(s)))
        .unwrap();
}

fn release(core: &mut Lifecycle, t: Instant, call: &str) {
    core.release(t, &CallId::new(call).unwrap()).unwrap();
}

/// A call of `s1` at 0 ms; its claim answered at 1 ms with token 11 and a record handing over
/// the warm sandbox of another process: that sandbox.
fn claimed_with_warm(core: &mut Lifecycle) -> SandboxId {
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
fn wanted_at_next_renewal(core: &mut Lifecycle, wanted: &[Key]) {
    core.handle_timeout(ms(3_000)).unwrap();
    let renewal = match store(core).as_slice() {
        [StoreCommand::Renew { renewal, .. }] => *renewal,
        other => panic!("only the renewal: {other:?}"),
    };
    core.handle_renewed(ms(3_001), renewal, wanted).unwrap();
}

/// Answers every write of an owned key's record ordered so far as written, at `t`: the writes.
fn records_written(core: &mut Lifecycle, t: Instant) -> Vec<KeyRecord> {
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
fn claim_of(core: &mut Lifecycle) -> (ClaimId, Key) {
    match store(core).as_slice() {
        [StoreCommand::Claim { claim, key, .. }] => (*claim, key.clone()),
        other => panic!("one claim expected, got {other:?}"),
    }
}

/// Claims and starts the key of `s` for call `call`: the started sandbox.
fn owned_and_ready(core: &mut Lifecycle, t: Instant, call: &str, s: &str, token: u64) -> SandboxId {
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
fn started_with_record_out(
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
fn answer_way_down(
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
fn way_down(
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

#[test]
fn a_key_is_claimed_before_its_start_and_released_with_its_record_when_its_way_down_ends() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(10), "c1", "s1", 4);
    assert_eq!(x, SandboxId(3 << 32));
    assert_eq!(core.key_token(&key("s1")), Some(Token(4)));
    assert!(matches!(
        events(&mut core).as_slice(),
        [Event::CallReady { .. }]
    ));
    release(&mut core, ms(20), "c1");
    let (records, rest) = way_down(&mut core, ms(20), x, None, 4);
    assert_eq!(
        records,
        vec![],
        "released at once: its record goes with the release"
    );
    match rest.as_slice() {
        [StoreCommand::Release {
            key: k,
            token,
            record,
            ..
        }] => {
            assert_eq!((k, *token), (&key("s1"), Token(4)));
            assert!(record.is_empty(), "nothing to continue from: {record:?}");
        }
        other => panic!("the release: {other:?}"),
    }
    assert_eq!(
        core.tracked_keys(),
        1,
        "owned until the release is confirmed"
    );
    core.handle_key_released(ms(30), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(core.tracked_keys(), 0);
    assert_eq!(core.key_token(&key("s1")), None);
    let s = core.stats();
    assert_eq!((s.claims_ordered, s.claims_ok, s.keys_released), (1, 1, 1));
}

#[test]
fn a_claim_waits_for_a_valid_lease() {
    let mut core = Lifecycle::new(config(ReleasePolicy::Shutdown)).unwrap();
    acquire(&mut core, ms(0), "c1", "s1");
    assert_eq!(commands(&mut core), vec![]);
    core.handle_timeout(ms(0)).unwrap();
    let renewal = match store(&mut core).as_slice() {
        [StoreCommand::Renew { renewal, .. }] => *renewal,
        other => panic!("only the renewal, no claim without a lease: {other:?}"),
    };
    core.handle_renewed(ms(5), renewal, &[]).unwrap();
    let (_, k) = claim_of(&mut core);
    assert_eq!(k, key("s1"));
}

#[test]
fn a_busy_key_is_claimed_again_while_its_call_waits_and_the_wait_is_bounded() {
    let mut core = leased(ReleasePolicy::Shutdown);
    acquire(&mut core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(&mut core);
    core.handle_claim_busy(ms(0), claim, &k).unwrap();
    let stale = core.stats().stale_answers;
    core.handle_claim_busy(ms(0), claim, &k).unwrap();
    assert_eq!(
        core.stats().stale_answers,
        stale + 1,
        "a claim answered twice: the second is stale"
    );
    assert_eq!(core.poll_timeout(), Some(ms(500)), "the retry");
    core.handle_timeout(ms(500)).unwrap();
    let (again, _) = claim_of(&mut core);
    assert_ne!(again, claim);
    core.handle_claim_failed(ms(600), again, &k).unwrap();
    assert_eq!(
        (core.stats().claims_busy, core.stats().claims_failed),
        (1, 1)
    );
    assert_eq!(
        core.poll_timeout(),
        Some(ms(1_100)),
        "a failed claim is retried as a busy one"
    );
    // The call's wait timeout (2 s) ends it; no start was ever ordered.
    let mut t = 600;
    while t < 2_000 {
        t = core.poll_timeout().unwrap().as_nanos() / 1_000_000;
        core.handle_timeout(ms(t)).unwrap();
        for c in store(&mut core) {
            if let StoreCommand::Claim { claim, key, .. } = c {
                core.handle_claim_busy(ms(t), claim, &key).unwrap();
            }
        }
        assert!(
            commands(&mut core).is_empty(),
            "never a start without the key"
        );
    }
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: CallId::new("c1").unwrap(),
        error: ErrorKind::WaitTimeout
    }));
    // Nothing waits any more: the next retry lets the key go.
    while let Some(t) = core.poll_timeout() {
        if core.tracked_keys() == 0 {
            break;
        }
        core.handle_timeout(t).unwrap();
        for c in store(&mut core) {
            assert!(
                !matches!(c, StoreCommand::Claim { .. }),
                "no claim for nobody"
            );
        }
    }
    assert_eq!(core.tracked_keys(), 0);
}

#[test]
fn a_claimed_record_continues_the_key_from_its_snapshot() {
    let mut core = leased(ReleasePolicy::Suspend);
    acquire(&mut core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(&mut core);
    let by = SandboxId((9 << 32) + 4);
    let record = KeyRecord {
        snapshot: Some(RecordedSnapshot {
            snapshot: Snapshot::new("snap-a"),
            by,
            retain_until: None,
        }),
        warm: None,
    };
    core.handle_claimed(ms(1), claim, &k, Token(8), record)
        .unwrap();
    match commands(&mut core).as_slice() {
        [Command::Start {
            resume_from,
            resumes,
            token,
            ..
        }] => {
            assert_eq!(resume_from, &Some(Snapshot::new("snap-a")));
            assert_eq!((*resumes, *token), (Some(by), Some(Token(8))));
        }
        other => panic!("a start that resumes: {other:?}"),
    }
}

#[test]
fn a_suspended_key_stays_owned_until_another_process_wants_it_then_goes_with_its_snapshot() {
    let mut core = leased(ReleasePolicy::Suspend);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 2);
    release(&mut core, ms(10), "c1");
    let (records, rest) = way_down(&mut core, ms(10), x, Some("snap-1"), 2);
    assert_eq!(rest, vec![], "a suspended key stays owned");
    // Its record says what a next owner continues from, should this process crash: the
    // snapshot (the sandbox is suspended, no longer up).
    match records.as_slice() {
        [KeyRecord {
            snapshot: Some(recorded),
            warm: None,
        }] => assert_eq!((recorded.snapshot.as_str(), recorded.by), ("snap-1", x)),
        other => panic!("one record write, with the snapshot: {other:?}"),
    }
    assert_eq!(store(&mut core), vec![], "then owning it costs nothing");
    assert_eq!(core.key_token(&key("s1")), Some(Token(2)));
    // The next renewal says another process wants it.
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    match store(&mut core).as_slice() {
        [StoreCommand::Release { record, token, .. }] => {
            assert_eq!(*token, Token(2));
            let recorded = record.snapshot.as_ref().expect("the snapshot goes along");
            assert_eq!((recorded.snapshot.as_str(), recorded.by), ("snap-1", x));
            assert_eq!(record.warm, None);
        }
        other => panic!("{other:?}"),
    }
    core.handle_key_released(ms(3_002), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(core.tracked_keys(), 0);
    assert_eq!(
        commands(&mut core),
        vec![],
        "the snapshot is the next owner's: no Discard"
    );
}

#[test]
fn a_warm_sandbox_is_drained_and_handed_over_not_destroyed() {
    let mut core = leased(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    });
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    release(&mut core, ms(10), "c1");
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Idle));
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    // Drained (nothing pending), then handed over: no Stop, no Shutdown.
    assert!(matches!(
        commands(&mut core).as_slice(),
        [Command::Drain { .. }]
    ));
    assert_eq!(core.sandbox_state(x), Some(SandboxState::HandingOver));
    match store(&mut core).as_slice() {
        [StoreCommand::Release { record, .. }] => assert_eq!(record.warm, Some(x)),
        other => panic!("{other:?}"),
    }
    // A call of the key that comes meanwhile waits for the key.
    acquire(&mut core, ms(3_002), "c2", "s1");
    assert_eq!(commands(&mut core), vec![]);
    core.handle_key_released(ms(3_003), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(
        commands(&mut core),
        vec![Command::Relinquish { sandbox: x }]
    );
    assert_eq!(core.sandbox_state(x), None);
    let (_, k) = claim_of(&mut core);
    assert_eq!(k, key("s1"), "the waiting call claims the key back");
    assert_eq!(core.stats().handovers, 1);
}

/// Found by the first two-keeper test on the local backend: a sandbox handed over and handed
/// back is adopted by the process that started it (it was refused as "ours already", and the
/// key started a second sandbox while the first stayed up, referenced by nothing).
#[test]
fn a_sandbox_handed_back_to_the_process_that_started_it_is_adopted() {
    let mut core = leased(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    });
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    release(&mut core, ms(10), "c1");
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    commands(&mut core);
    store(&mut core);
    core.handle_key_released(ms(3_002), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(
        commands(&mut core),
        vec![Command::Relinquish { sandbox: x }]
    );
    // The other process used it and hands it back.
    acquire(&mut core, ms(4_000), "c2", "s1");
    let (claim, k) = claim_of(&mut core);
    let record = KeyRecord {
        snapshot: None,
        warm: Some(x),
    };
    core.handle_claimed(ms(4_001), claim, &k, Token(8), record)
        .unwrap();
    match commands(&mut core).as_slice() {
        [Command::Adopt { sandbox, token, .. }] => assert_eq!((*sandbox, *token), (x, Token(8))),
        other => panic!("the adoption of its own sandbox: {other:?}"),
    }
    core.handle_start_ok(ms(4_002), x).unwrap();
    assert!(events(&mut core).contains(&Event::CallReady {
        call: CallId::new("c2").unwrap(),
        sandbox: x
    }));
    assert_eq!(core.stats().starts_ordered, 1, "no second sandbox");
}

#[test]
fn a_failed_release_keeps_the_key_and_the_sandbox_warm_and_is_tried_again() {
    let mut core = leased(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    });
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    release(&mut core, ms(10), "c1");
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    commands(&mut core);
    store(&mut core);
    events(&mut core);
    core.handle_release_failed(ms(3_002), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(core.stats().releases_failed, 1);
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Idle));
    // Its answer again is stale: the release is no longer awaited.
    let stale = core.stats().stale_answers;
    core.handle_key_released(ms(3_002), ReleaseId(0), &key("s1"))
        .unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1);
    assert_eq!(core.key_token(&key("s1")), Some(Token(6)), "still owned");
    // A call now binds to it at once: the key is still this process's.
    acquire(&mut core, ms(3_003), "c2", "s1");
    assert_eq!(
        events(&mut core),
        vec![Event::CallReady {
            call: CallId::new("c2").unwrap(),
            sandbox: x
        }]
    );
    release(&mut core, ms(3_004), "c2");
    commands(&mut core);
    // The retry hands it over.
    core.handle_timeout(ms(3_502)).unwrap();
    assert!(matches!(
        commands(&mut core).as_slice(),
        [Command::Drain { .. }]
    ));
    match store(&mut core).as_slice() {
        [StoreCommand::Release {
            release, record, ..
        }] => {
            assert_eq!((*release, record.warm), (ReleaseId(1), Some(x)))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_handed_over_sandbox_is_adopted_and_its_calls_bind_without_a_hook() {
    let mut core = Lifecycle::new(Config {
        hooks: Hooks {
            after_start: Some(Duration::from_secs(1)),
            ..Hooks::default()
        },
        ..config(ReleasePolicy::KeepWarm {
            idle: Duration::from_secs(60),
        })
    })
    .unwrap();
    core.handle_timeout(ms(0)).unwrap();
    let Some(StoreCommand::Renew { renewal, .. }) = core.poll_store() else {
        panic!()
    };
    core.handle_renewed(ms(0), renewal, &[]).unwrap();
    let warm = claimed_with_warm(&mut core);
    assert_eq!(
        commands(&mut core),
        vec![Command::Adopt {
            sandbox: warm,
            key: key("s1"),
            token: Token(11),
            deadline: ms(1) + Config::default().start_timeout,
        }]
    );
    core.handle_start_ok(ms(2), warm).unwrap();
    assert_eq!(
        commands(&mut core),
        vec![],
        "no after-start hook for an adopted sandbox"
    );
    assert_eq!(
        events(&mut core),
        vec![Event::CallReady {
            call: CallId::new("c1").unwrap(),
            sandbox: warm
        }]
    );
    assert_eq!(core.stats().adoptions_ordered, 1);
}

#[test]
fn a_sandbox_that_cannot_be_adopted_is_cleaned_up_and_the_key_starts_afresh() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let warm = claimed_with_warm(&mut core);
    commands(&mut core);
    core.handle_start_failed(ms(2), warm).unwrap();
    let cmds = commands(&mut core);
    assert!(
        matches!(cmds.as_slice(), [Command::Shutdown { sandbox, token: Some(Token(11)), .. }, Command::Start { token: Some(Token(11)), .. }] if *sandbox == warm),
        "{cmds:?}"
    );
    assert!(events(&mut core).is_empty(), "the call did not fail");
}

#[test]
fn a_key_owned_here_unknowingly_is_claimed_and_released_when_wanted() {
    let mut core = leased(ReleasePolicy::Shutdown);
    wanted_at_next_renewal(&mut core, &[key("lost")]);
    let (claim, k) = claim_of(&mut core);
    assert_eq!(k, key("lost"));
    core.handle_claimed(ms(3_001), claim, &k, Token(3), KeyRecord::default())
        .unwrap();
    assert!(matches!(
        store(&mut core).as_slice(),
        [StoreCommand::Release {
            token: Token(3),
            ..
        }]
    ));
}

#[test]
fn close_releases_every_owned_key_with_its_record() {
    let mut core = leased(ReleasePolicy::Suspend);
    for (call, s, token) in [("c1", "s1", 2), ("c2", "s2", 3)] {
        let x = owned_and_ready(&mut core, ms(0), call, s, token);
        release(&mut core, ms(10), call);
        let snapshot = format!("snap-{s}");
        way_down(&mut core, ms(10), x, Some(&snapshot), token);
    }
    assert_eq!(store(&mut core), vec![]);
    let ordered = core.stats().releases_ordered;
    core.close(ms(20), Duration::from_secs(1)).unwrap();
    let releases: Vec<(ReleaseId, Key)> = store(&mut core)
        .into_iter()
        .map(|c| match c {
            StoreCommand::Release {
                release,
                key,
                record,
                ..
            } => {
                assert!(record.snapshot.is_some(), "{record:?}");
                (release, key)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(releases.len(), 2, "{releases:?}");
    assert_eq!(core.stats().releases_ordered, ordered + 2);
    for (release, k) in &releases {
        assert!(!core.is_closed(), "close waits for every release");
        core.handle_key_released(ms(21), *release, k).unwrap();
    }
    assert!(core.is_closed());
    // The report names the snapshot each key's record carries on.
    let retained = events(&mut core).into_iter().find_map(|e| match e {
        Event::Closed { report } => Some(report.retained),
        _ => None,
    });
    let kept = |s: &str| Retained {
        key: key(s),
        snapshot: Snapshot::new(format!("snap-{s}")),
        until: None,
    };
    assert_eq!(retained, Some(vec![kept("s1"), kept("s2")]));
}

#[test]
fn per_call_keys_and_external_sandboxes_are_never_claimed() {
    let mut core = Lifecycle::new(Config {
        scope: Scope::Call,
        ..config(ReleasePolicy::Shutdown)
    })
    .unwrap();
    acquire(&mut core, ms(0), "c1", "s1");
    match commands(&mut core).as_slice() {
        [Command::Start { token, .. }] => assert_eq!(*token, None),
        other => panic!("{other:?}"),
    }
    core.handle_timeout(ms(0)).unwrap();
    assert!(store(&mut core)
        .iter()
        .all(|c| matches!(c, StoreCommand::Renew { .. })));
}

#[test]
fn answers_for_claims_and_releases_never_ordered_are_refused() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let before = format!("{core:?}");
    assert_eq!(
        core.handle_claimed(ms(1), ClaimId(0), &key("s"), Token(1), KeyRecord::default()),
        Err(Error::UnknownStoreWork {
            what: "claim",
            id: 0
        })
    );
    assert_eq!(
        core.handle_key_released(ms(1), ReleaseId(0), &key("s")),
        Err(Error::UnknownStoreWork {
            what: "release",
            id: 0
        })
    );
    assert_eq!(format!("{core:?}"), before);
}

#[test]
fn a_claim_confirmed_after_the_lease_lapsed_is_not_taken() {
    let mut core = leased(ReleasePolicy::Shutdown);
    acquire(&mut core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(&mut core);
    // No renewal is confirmed: the lease lapses at 8 s.
    let mut t = 0;
    while t < 8_000 {
        t = core.poll_timeout().unwrap().as_nanos() / 1_000_000;
        core.handle_timeout(ms(t)).unwrap();
        store(&mut core);
    }
    assert_eq!(core.lease_valid_until(), None);
    core.handle_claimed(ms(8_001), claim, &k, Token(1), KeyRecord::default())
        .unwrap();
    assert_eq!(core.key_token(&k), None);
    assert_eq!(core.stats().claims_failed, 1, "unanswered by its deadline");
    assert!(commands(&mut core)
        .iter()
        .all(|c| !matches!(c, Command::Start { .. })));
}

/// A claim made under an epoch that lapsed is not taken even once the next epoch's lease is
/// valid: the lease it was made under is gone. And the new lease claims only the keys that
/// wait unclaimed, not the one whose old claim is still out.
#[test]
fn a_claim_of_a_lapsed_epoch_is_not_taken_under_the_next_one() {
    let mut core = leased(ReleasePolicy::Shutdown);
    acquire(&mut core, ms(0), "c1", "s1");
    let (old, k1) = claim_of(&mut core);
    // Nothing is answered, no timer is fired, until the lease ran out (8 s): the next input
    // lets it lapse first, and a call of another key waits for a lease.
    acquire(&mut core, ms(8_001), "c2", "s2");
    assert_eq!(core.lease_epoch(), Some(2));
    let renewal = match store(&mut core).as_slice() {
        [StoreCommand::Renew {
            renewal, epoch: 2, ..
        }] => *renewal,
        other => panic!("only the new epoch's renewal: {other:?}"),
    };
    core.handle_renewed(ms(8_002), renewal, &[]).unwrap();
    let (fresh, k2) = claim_of(&mut core);
    assert_eq!(k2, key("s2"), "only the key that waits unclaimed");
    assert_ne!(fresh, old);
    // The old epoch's claim is confirmed now: stale, and tried again later.
    let stale = core.stats().stale_answers;
    core.handle_claimed(ms(8_003), old, &k1, Token(1), KeyRecord::default())
        .unwrap();
    assert_eq!(core.key_token(&k1), None);
    assert_eq!(core.stats().stale_answers, stale + 1);
    assert!(commands(&mut core).is_empty(), "nothing started");
}

/// Lets the lease lapse: no renewal is confirmed until 8 s.
fn lapse(core: &mut Lifecycle) -> Vec<Command> {
    let mut seen = vec![];
    while core.lease_valid_until().is_some() {
        let t = core.poll_timeout().unwrap();
        core.handle_timeout(t).unwrap();
        store(core);
        seen.extend(commands(core));
    }
    seen
}

#[test]
fn a_lapsed_lease_fences_every_key_it_held_and_nothing_more_goes_out_under_its_token() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 4);
    events(&mut core);
    core.flush(
        ms(1),
        &session("s1"),
        &PathName::session_log(),
        Payload::new(b"v1".to_vec()),
    )
    .unwrap();
    let Some(Command::Upload { upload, token, .. }) = core.poll_command() else {
        panic!("an upload")
    };
    assert_eq!(token, Some(Token(4)));
    let seen = lapse(&mut core);
    assert_eq!(
        seen,
        vec![
            Command::CancelUpload { upload, sandbox: x },
            Command::Relinquish { sandbox: x }
        ],
        "no Stop, no Shutdown: the sandbox is the next owner's"
    );
    let evs = events(&mut core);
    assert!(evs.contains(&Event::KeyFenced {
        key: key("s1"),
        token: Token(4),
        reason: FenceReason::LeaseLapsed
    }));
    assert!(evs.contains(&Event::SandboxLost {
        call: CallId::new("c1").unwrap(),
        sandbox: x
    }));
    assert!(evs.contains(&Event::Settled {
        session: session("s1"),
        path: PathName::session_log(),
        version: Version(1),
        outcome: Settlement::Dropped {
            reason: DropReason::Fenced
        }
    }));
    assert_eq!(core.key_token(&key("s1")), None);
    assert_eq!(
        core.resolve(&session("s1")),
        Err(Error::SandboxGone {
            session: session("s1"),
            sandbox: x
        })
    );
    // The late answer of the cancelled upload changes nothing; the call still releases.
    core.handle_upload_ok(ms(9_000), upload).unwrap();
    release(&mut core, ms(9_000), "c1");
    assert!(
        commands(&mut core).is_empty(),
        "nothing more for the relinquished sandbox"
    );
    assert_eq!(core.tracked_sandboxes(), 0);
    assert_eq!(core.stats().fences, 1);
}

#[test]
fn a_call_still_starting_when_its_key_is_fenced_fails_with_fenced() {
    let mut core = leased(ReleasePolicy::Shutdown);
    acquire(&mut core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(&mut core);
    core.handle_claimed(ms(0), claim, &k, Token(2), KeyRecord::default())
        .unwrap();
    let Some(Command::Start { sandbox: x, .. }) = core.poll_command() else {
        panic!()
    };
    let seen = lapse(&mut core);
    assert_eq!(seen, vec![Command::Relinquish { sandbox: x }]);
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: CallId::new("c1").unwrap(),
        error: ErrorKind::Fenced
    }));
    // The start's late answer is stale.
    core.handle_start_ok(ms(9_000), x).unwrap();
    assert!(commands(&mut core).is_empty());
    assert_eq!(core.tracked_sandboxes(), 0);
}

#[test]
fn a_backend_refusal_fences_the_key_and_a_waiting_call_claims_it_again() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 4);
    // Another key of this process, under its own token, is not touched by the fence.
    let other = owned_and_ready(&mut core, ms(0), "c9", "s9", 5);
    events(&mut core);
    // Another process took the key (its token is newer): the backend refused an upload.
    core.flush(
        ms(1),
        &session("s1"),
        &PathName::session_log(),
        Payload::new(b"v1".to_vec()),
    )
    .unwrap();
    commands(&mut core);
    core.handle_fenced(ms(2), x).unwrap();
    assert!(events(&mut core).contains(&Event::KeyFenced {
        key: key("s1"),
        token: Token(4),
        reason: FenceReason::Refused
    }));
    assert_eq!(
        commands(&mut core),
        vec![
            Command::CancelUpload {
                upload: UploadId(0),
                sandbox: x
            },
            Command::Relinquish { sandbox: x }
        ],
        "only the fenced key's sandbox: its upload in flight cancelled, then let go"
    );
    assert_eq!(core.key_token(&key("s9")), Some(Token(5)));
    assert_eq!(core.sandbox_state(other), Some(SandboxState::Running));
    // A second refusal about it is stale.
    let stale = core.stats().stale_answers;
    core.handle_fenced(ms(3), x).unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1);
    // A new call of the key claims it again (it may well be busy: the other process has it).
    acquire(&mut core, ms(4), "c2", "s1");
    let (claim, k) = claim_of(&mut core);
    core.handle_claim_busy(ms(4), claim, &k).unwrap();
    assert!(commands(&mut core).is_empty());
    assert_eq!(
        core.handle_fenced(ms(5), SandboxId(3 << 32 | 77)),
        Err(Error::UnknownSandbox {
            sandbox: SandboxId(3 << 32 | 77)
        })
    );
}

/// The write of an owned key's record: one the store could not make is made again after
/// `claim_retry` (the key stays this process's); one the store refused (a newer token owns the
/// key) fences the key and lets its sandbox go without a Stop or Shutdown.
#[test]
fn a_failed_record_write_is_made_again_and_a_refused_one_fences_the_key() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let (x, k) = started_with_record_out(&mut core, ms(1), "c1", "s1", 4);
    let record = KeyRecord {
        snapshot: None,
        warm: Some(x),
    };
    let write = |core: &mut Lifecycle| match store(core).as_slice() {
        [StoreCommand::Record {
            recording,
            key,
            token,
            record: written,
            ..
        }] => {
            assert_eq!((key, *token, written), (&k, Token(4), &record));
            *recording
        }
        other => panic!("one record write expected, got {other:?}"),
    };
    let first = write(&mut core);
    core.handle_record_failed(ms(2), first, &k).unwrap();
    assert_eq!(core.key_token(&k), Some(Token(4)), "still this process's");
    assert_eq!(core.stats().records_failed, 1);
    let stale = core.stats().stale_answers;
    core.handle_recorded(ms(2), first, &k).unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1, "no longer awaited");
    // A second call of the key binds meanwhile: the write still waits for its retry.
    acquire(&mut core, ms(3), "c2", "s1");
    assert_eq!(
        store(&mut core),
        vec![],
        "not written again before claim_retry"
    );
    assert_eq!(
        core.poll_timeout(),
        Some(ms(502)),
        "written again after claim_retry"
    );
    core.handle_timeout(ms(502)).unwrap();
    let second = write(&mut core);
    assert_ne!(second, first);
    events(&mut core);
    core.handle_record_fenced(ms(503), second, &k).unwrap();
    assert!(events(&mut core).contains(&Event::KeyFenced {
        key: k.clone(),
        token: Token(4),
        reason: FenceReason::Refused
    }));
    assert_eq!(core.key_token(&k), None);
    assert_eq!(
        commands(&mut core),
        vec![Command::Relinquish { sandbox: x }],
        "no Stop or Shutdown under the old token"
    );
    assert_eq!(
        (
            core.stats().records_ordered,
            core.stats().records_fenced,
            core.stats().records_ok
        ),
        (2, 1, 0)
    );
}

/// A record write answered after its key was fenced is stale: the key is no longer this
/// process's.
#[test]
fn a_record_write_answered_after_the_fence_is_stale() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let (x, k) = started_with_record_out(&mut core, ms(1), "c1", "s1", 4);
    let [StoreCommand::Record { recording, .. }] = store(&mut core).as_slice().to_owned()[..]
    else {
        panic!("one record write")
    };
    core.handle_fenced(ms(2), x).unwrap();
    let stale = core.stats().stale_answers;
    core.handle_recorded(ms(3), recording, &k).unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1, "the key was fenced");
    assert_eq!(core.stats().records_ok, 0);
}

/// Found by the fleet simulator: after a pause, an answer (or a timer due before the lapse)
/// reached the core after its lease had run out and ordered work under the old token. Every
/// input now lets the lapse happen first.
#[test]
fn an_answer_that_comes_after_the_lease_ran_out_orders_nothing_under_the_old_token() {
    let mut core = leased(ReleasePolicy::Shutdown);
    acquire(&mut core, ms(0), "c1", "s1");
    let (claim, k) = claim_of(&mut core);
    core.handle_claimed(ms(0), claim, &k, Token(2), KeyRecord::default())
        .unwrap();
    let Some(Command::Start { sandbox: x, .. }) = core.poll_command() else {
        panic!()
    };
    // The process was paused past its lease (valid until 8 s): the Start's answer comes first.
    core.handle_start_ok(ms(9_000), x).unwrap();
    let cmds = commands(&mut core);
    assert!(
        cmds.iter().all(|c| c.token().is_none()),
        "nothing under the old token: {cmds:?}"
    );
    assert_eq!(cmds, vec![Command::Relinquish { sandbox: x }]);
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: CallId::new("c1").unwrap(),
        error: ErrorKind::Fenced
    }));
    assert_eq!(core.lease_epoch(), Some(2));
}

/// Fires timers, confirming every renewal, until a release that went unanswered is asked again:
/// that release, and when (ms).
fn release_asked_again(core: &mut Lifecycle) -> (ReleaseId, u64) {
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

/// Found by the fleet simulator: a release that timed out was taken as not written, and the
/// sandbox being handed over went back into use although the release had landed. Now the key is
/// in doubt until a definite answer.
#[test]
fn a_release_that_went_unanswered_leaves_the_key_in_doubt_until_a_definite_answer() {
    let mut core = leased(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    });
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    release(&mut core, ms(10), "c1");
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    commands(&mut core);
    store(&mut core);
    // No answer by the release's deadline (the command timeout, 30 s): asked again.
    let (again, t) = release_asked_again(&mut core);
    assert_eq!(core.sandbox_state(x), Some(SandboxState::HandingOver));
    events(&mut core);
    // A call meanwhile waits: the key may no longer be this process's.
    acquire(&mut core, ms(t), "c2", "s1");
    assert_eq!(events(&mut core), vec![]);
    assert_eq!(commands(&mut core), vec![]);
    // The second attempt fails outright: still in doubt, the sandbox is not taken back.
    core.handle_release_failed(ms(t), again, &key("s1"))
        .unwrap();
    assert_eq!(
        core.stats().releases_failed,
        2,
        "one unanswered in time, one failed"
    );
    assert_eq!(core.sandbox_state(x), Some(SandboxState::HandingOver));
    assert!(events(&mut core).is_empty());
    // The next attempt is refused: the first had landed. The sandbox is the next owner's.
    let next = loop {
        let at = core.poll_timeout().unwrap();
        core.handle_timeout(at).unwrap();
        if let Some(StoreCommand::Release {
            release, record, ..
        }) = store(&mut core)
            .into_iter()
            .find(|c| matches!(c, StoreCommand::Release { .. }))
        {
            assert_eq!(
                record.warm,
                Some(x),
                "asked again with the sandbox handed over"
            );
            break (release, at);
        }
    };
    core.handle_release_fenced(next.1, next.0, &key("s1"))
        .unwrap();
    assert_eq!(core.stats().releases_fenced, 1);
    assert!(commands(&mut core).contains(&Command::Relinquish { sandbox: x }));
    let (_, k) = claim_of(&mut core);
    assert_eq!(k, key("s1"), "the waiting call claims the key anew");
}

/// Found by the fleet simulator: the calls of a sandbox that could not be adopted were bound
/// again after its Shutdown had already let the key be released. They now queue for the key
/// first, so the key stays owned and they bind to a fresh start under its token.
#[test]
fn calls_of_a_failed_adoption_keep_the_key_and_bind_to_a_fresh_start() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let warm = claimed_with_warm(&mut core);
    commands(&mut core);
    core.handle_start_failed(ms(2), warm).unwrap();
    assert_eq!(
        store(&mut core),
        vec![],
        "no release: the call still wants the key"
    );
    assert_eq!(core.key_token(&key("s1")), Some(Token(11)));
    let Some(Command::Start { sandbox, .. }) = commands(&mut core).pop() else {
        panic!("a fresh start")
    };
    core.handle_start_ok(ms(3), sandbox).unwrap();
    assert_eq!(
        records_written(&mut core, ms(4)),
        vec![KeyRecord {
            snapshot: None,
            warm: Some(sandbox)
        }]
    );
    assert!(events(&mut core).contains(&Event::CallReady {
        call: CallId::new("c1").unwrap(),
        sandbox
    }));
}

/// Found by the conservation check of the fleet simulator: calls made ready in a sandbox the
/// key's record did not name yet acknowledged work (mirror versions) that a process ending
/// before the record write landed lost: the next owner started from the older record. The
/// calls are now ready only once the record naming the sandbox is confirmed; a failed write is
/// made again, the calls still waiting.
#[test]
fn calls_are_ready_only_once_the_record_names_their_sandbox() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let (sandbox, k) = started_with_record_out(&mut core, ms(1), "c1", "s1", 3);
    assert_eq!(
        core.sandbox_state(sandbox),
        Some(SandboxState::Starting),
        "up, waiting for its record"
    );
    assert!(events(&mut core).is_empty(), "no call ready yet");
    let Some(StoreCommand::Record {
        recording, record, ..
    }) = core.poll_store()
    else {
        panic!("the record write naming the sandbox")
    };
    assert_eq!(record.warm, Some(sandbox));
    core.handle_record_failed(ms(2), recording, &k).unwrap();
    assert!(events(&mut core).is_empty(), "still not ready");
    // Written again once the store's retry is due.
    let again = loop {
        let at = core.poll_timeout().expect("a retry is due");
        core.handle_timeout(at).unwrap();
        if let Some(StoreCommand::Record { recording, .. }) = core.poll_store() {
            break (recording, at);
        }
    };
    core.handle_recorded(again.1, again.0, &k).unwrap();
    assert_eq!(core.sandbox_state(sandbox), Some(SandboxState::Running));
    assert!(events(&mut core).contains(&Event::CallReady {
        call: CallId::new("c1").unwrap(),
        sandbox
    }));
}

/// Found by the conservation check of the fleet simulator: a persisted sandbox was shut down
/// while the write of the record naming its snapshot was still out; the write failed, the
/// process ended, and the next owner found a record naming the deleted sandbox and started
/// afresh. The Shutdown now waits until the record no longer names the sandbox.
#[test]
fn a_persisted_sandbox_is_shut_down_only_once_the_record_names_its_snapshot() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(1), "c1", "s1", 3);
    release(&mut core, ms(2), "c1");
    events(&mut core);
    loop {
        let cmds = commands(&mut core);
        assert!(!cmds.is_empty(), "the way down goes on to its Persist");
        let persisted = cmds.iter().any(|c| matches!(c, Command::Persist { .. }));
        for c in cmds {
            assert_eq!(answer_way_down(&mut core, ms(3), c, Some("ws1")), None);
        }
        if persisted {
            break;
        }
    }
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Persisted));
    assert_eq!(
        commands(&mut core),
        vec![],
        "no Shutdown while the record names it"
    );
    let Some(StoreCommand::Record {
        recording,
        key: k,
        record,
        ..
    }) = core.poll_store()
    else {
        panic!("the record write naming the snapshot")
    };
    assert_eq!(record.warm, None);
    assert_eq!(
        record.snapshot.map(|s| s.snapshot),
        Some(Snapshot::new("ws1"))
    );
    core.handle_recorded(ms(4), recording, &k).unwrap();
    assert!(matches!(
        commands(&mut core).as_slice(),
        [Command::Shutdown { sandbox, .. }] if *sandbox == x
    ));
}

/// A call that comes while its key's sandbox goes down waits; the key stays this process's (no
/// release while a call waits for it) and the call binds to a fresh start under the same token.
#[test]
fn a_call_waiting_for_its_keys_way_down_keeps_the_key() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 4);
    release(&mut core, ms(10), "c1");
    acquire(&mut core, ms(11), "c2", "s1");
    let mut started = None;
    for _ in 0..10 {
        for c in commands(&mut core) {
            match answer_way_down(&mut core, ms(12), c, None) {
                None => {}
                Some(Command::Start { sandbox, token, .. }) => {
                    assert_eq!(token, Some(Token(4)), "under the same token");
                    started = Some(sandbox);
                }
                Some(other) => panic!("{other:?}"),
            }
        }
        for c in store(&mut core) {
            match c {
                StoreCommand::Record { recording, key, .. } => {
                    core.handle_recorded(ms(12), recording, &key).unwrap()
                }
                other => panic!("no release while a call waits for the key: {other:?}"),
            }
        }
        if started.is_some() {
            break;
        }
    }
    let y = started.expect("the waiting call's start");
    assert_ne!(y, x);
    assert_eq!(core.key_token(&key("s1")), Some(Token(4)));
}

/// A release whose outcome is in doubt (unanswered in time, then failed) of a key with no
/// sandbox to hand over: a call that comes meanwhile waits (the key may be another process's
/// already); nothing starts under the old token.
#[test]
fn a_key_in_doubt_without_a_sandbox_binds_nothing() {
    let mut core = leased(ReleasePolicy::Suspend);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 2);
    release(&mut core, ms(10), "c1");
    way_down(&mut core, ms(10), x, Some("snap-1"), 2);
    // Wanted elsewhere: released with its snapshot; the store does not answer in time.
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    let first = match store(&mut core).as_slice() {
        [StoreCommand::Release {
            release, record, ..
        }] => {
            assert_eq!(record.warm, None);
            *release
        }
        other => panic!("{other:?}"),
    };
    let (again, t) = release_asked_again(&mut core);
    assert_ne!(again, first);
    core.handle_release_failed(ms(t), again, &key("s1"))
        .unwrap();
    events(&mut core);
    acquire(&mut core, ms(t), "c2", "s1");
    assert_eq!(commands(&mut core), vec![], "nothing starts while in doubt");
    assert!(events(&mut core)
        .iter()
        .all(|e| !matches!(e, Event::CallReady { .. })));
}

/// A fence lets go the key's sandboxes whose last command is not out yet; one whose Shutdown is
/// out keeps it (no Relinquish for it).
#[test]
fn a_fence_leaves_a_sandbox_whose_shutdown_is_out() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 4);
    release(&mut core, ms(10), "c1");
    // The way down answered up to its Shutdown, which stays out.
    let mut shutdown_out = false;
    while !shutdown_out {
        let cmds = commands(&mut core);
        assert!(!cmds.is_empty(), "the way down goes on");
        for c in cmds {
            match c {
                Command::Shutdown { sandbox, .. } => shutdown_out = sandbox == x,
                c => assert_eq!(answer_way_down(&mut core, ms(10), c, None), None),
            }
        }
    }
    events(&mut core);
    core.handle_fenced(ms(11), x).unwrap();
    assert!(events(&mut core).iter().any(|e| matches!(
        e,
        Event::KeyFenced {
            reason: FenceReason::Refused,
            ..
        }
    )));
    assert_eq!(commands(&mut core), vec![], "its Shutdown is out already");
}

/// Close waits for a record write in flight before it releases the key (the store keeps one
/// write per key at a time); a record write unanswered in time is written again; a key other
/// processes want is noted only if it is a fleet key.
#[test]
fn close_waits_for_a_record_write_in_flight_before_releasing_the_key() {
    let mut core = leased(ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    });
    let (_, k2) = started_with_record_out(&mut core, ms(1), "c2", "s2", 7);
    let record_write = |core: &mut Lifecycle| -> RecordingId {
        let writes: Vec<RecordingId> = store(core)
            .into_iter()
            .filter_map(|c| match c {
                StoreCommand::Record { recording, .. } => Some(recording),
                StoreCommand::Renew { .. } => None,
                other => panic!("{other:?}"),
            })
            .collect();
        match writes.as_slice() {
            [w] => *w,
            other => panic!("one record write expected: {other:?}"),
        }
    };
    let first = record_write(&mut core);
    // Unanswered by its deadline (the lease's end, 8 s, before the command timeout): written
    // again, under a new number. The renewal at 3 s is confirmed meanwhile, naming a per-call
    // key (never a fleet key: not tracked) as wanted.
    core.handle_timeout(ms(3_000)).unwrap();
    let renewal = match store(&mut core).as_slice() {
        [StoreCommand::Renew { renewal, .. }] => *renewal,
        other => panic!("only the renewal: {other:?}"),
    };
    let tracked = core.tracked_keys();
    let per_call = Key::Call(CallId::new("elsewhere").unwrap());
    core.handle_renewed(ms(3_001), renewal, &[per_call])
        .unwrap();
    assert_eq!(
        core.tracked_keys(),
        tracked,
        "a per-call key is not tracked"
    );
    // Timers fire (renewals confirmed) until the write's deadline passed.
    let mut rewrites = vec![];
    let mut t = ms(3_001);
    while core.stats().records_failed == 0 {
        t = core.poll_timeout().unwrap();
        assert!(
            t <= ms(8_000),
            "the write's deadline is the lease's end then"
        );
        core.handle_timeout(t).unwrap();
        for c in store(&mut core) {
            match c {
                StoreCommand::Renew { renewal, .. } => {
                    core.handle_renewed(t, renewal, &[]).unwrap()
                }
                StoreCommand::Record { recording, .. } => rewrites.push(recording),
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(t, ms(8_000));
    let [second] = rewrites[..] else {
        panic!("written again once: {rewrites:?}")
    };
    assert_ne!(second, first);

    // The call ends (the sandbox stays warm, the key quiet) and close comes while the second
    // write is out: no release until it is answered.
    release(&mut core, ms(8_001), "c2");
    core.close(ms(8_002), Duration::from_secs(1)).unwrap();
    let early: Vec<StoreCommand> = store(&mut core)
        .into_iter()
        .filter(|c| matches!(c, StoreCommand::Release { .. }))
        .collect();
    assert_eq!(early, vec![], "no release while the record write is out");
    core.handle_recorded(ms(8_003), second, &k2).unwrap();
    let mut released = vec![];
    for _ in 0..10 {
        for c in commands(&mut core) {
            match answer_way_down(&mut core, ms(8_004), c, None) {
                None | Some(Command::Relinquish { .. }) => {}
                Some(other) => panic!("{other:?}"),
            }
        }
        for c in store(&mut core) {
            match c {
                StoreCommand::Release { key, .. } => released.push(key),
                StoreCommand::Record { recording, key, .. } => {
                    core.handle_recorded(ms(8_004), recording, &key).unwrap()
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(released, vec![k2], "released once the write was answered");
}

/// Close lets go an owned key with no sandbox (only its snapshot) only once the record write
/// in flight for it is answered.
#[test]
fn close_lets_go_a_key_with_only_its_snapshot_after_its_record_write() {
    let mut core = leased(ReleasePolicy::Suspend);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 2);
    release(&mut core, ms(10), "c1");
    // The way down, answered; the record write it leads to (the snapshot) stays out.
    let mut writes = vec![];
    for _ in 0..10 {
        for c in commands(&mut core) {
            assert_eq!(answer_way_down(&mut core, ms(10), c, Some("snap-1")), None);
        }
        for c in store(&mut core) {
            match c {
                StoreCommand::Record {
                    recording, record, ..
                } => writes.push((recording, record)),
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(
        core.sandbox_state(x),
        Some(SandboxState::Persisted),
        "persisted, suspended only once the record no longer names it"
    );
    let [(recording, ref record)] = writes[..] else {
        panic!("one record write: {writes:?}")
    };
    assert_eq!((record.warm, record.snapshot.is_some()), (None, true));
    core.close(ms(20), Duration::from_secs(1)).unwrap();
    assert_eq!(
        store(&mut core),
        vec![],
        "no release while the write is out"
    );
    core.handle_recorded(ms(21), recording, &key("s1")).unwrap();
    assert_eq!(core.sandbox_state(x), None, "suspended");
    assert_eq!(
        core.stats().records_ok,
        2,
        "the sandbox's, then the snapshot's"
    );
    assert!(matches!(
        store(&mut core).as_slice(),
        [StoreCommand::Release { key: k, .. }] if *k == key("s1")
    ));
}

/// The checker is checked: a fleet key whose sandbox runs and that this process does not own
/// (here edited to `Local`, as if never claimed) is reported under `ownership`.
#[test]
fn a_running_fleet_key_not_owned_is_reported() {
    let mut core = leased(ReleasePolicy::Shutdown);
    owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    core.check_invariants().unwrap();
    let mut state = serde_json::to_value(&core).unwrap();
    let slot = &mut state["keys"]["records"][1]["value"];
    assert_ne!(slot["own"], serde_json::Value::Null, "the key slot: {slot}");
    slot["own"] = serde_json::json!("Local");
    let broken: Lifecycle = serde_json::from_value(state).unwrap();
    assert_eq!(
        broken.check_invariants().unwrap_err().invariant,
        "ownership"
    );
}

/// Close lets go of a key whose claim was busy (another process has it) at once: its waiting
/// call was revoked, so nothing is left to remember of it, while the owned key is still being
/// released with its record. The busy key's slot is forgotten then, not kept empty until close
/// ends.
#[test]
fn close_forgets_a_busy_key_while_the_owned_one_is_released() {
    let mut core = leased(ReleasePolicy::Suspend);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 2);
    release(&mut core, ms(10), "c1");
    way_down(&mut core, ms(10), x, Some("snap-s1"), 2);
    acquire(&mut core, ms(11), "c2", "s2");
    let (claim, k2) = claim_of(&mut core);
    core.handle_claim_busy(ms(11), claim, &k2).unwrap();
    assert_eq!(core.tracked_keys(), 2);
    core.close(ms(20), Duration::from_secs(1)).unwrap();
    let released: Vec<Key> = store(&mut core)
        .into_iter()
        .filter_map(|c| match c {
            StoreCommand::Release { key, .. } => Some(key),
            _ => None,
        })
        .collect();
    assert_eq!(released, vec![key("s1")]);
    assert!(!core.is_closed(), "close waits for the release");
    assert_eq!(core.tracked_keys(), 1, "the busy key is forgotten");
    core.check_invariants().unwrap();
}

/// A call queued behind its key (the key's sandbox on its way down) when a refusal fences the
/// key claims it again at once, while the lease is valid: it does not sit out its wait and fail
/// `wait-timeout` (the simulator's progress check found that, fleet seeds 1329, 1809, 1972).
#[test]
fn a_call_queued_when_a_refusal_fences_its_key_claims_it_again_at_once() {
    let mut core = leased(ReleasePolicy::Shutdown);
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 4);
    release(&mut core, ms(1), "c1");
    let cmds = commands(&mut core);
    assert!(
        cmds.iter().any(|c| matches!(c, Command::Stop { .. })),
        "{cmds:?}"
    );
    // The way down is under way (its Stop ordered): a new call of the key queues.
    acquire(&mut core, ms(2), "c2", "s1");
    assert_eq!(
        core.call_status(&CallId::new("c2").unwrap()),
        Some(CallStatus::Waiting)
    );
    store(&mut core);
    // The backend refuses the Stop: another process owns the key now.
    core.handle_fenced(ms(3), x).unwrap();
    let claims: Vec<StoreCommand> = store(&mut core)
        .into_iter()
        .filter(|c| matches!(c, StoreCommand::Claim { .. }))
        .collect();
    assert_eq!(
        claims.len(),
        1,
        "the queued call claims its key again: {claims:?}"
    );
}
