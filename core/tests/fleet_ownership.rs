//! Fleet mode, key ownership: a key is claimed before its sandbox is started or adopted, every
//! command changing the key's sandbox carries the token, the key is released with its durable
//! record when this process is done with it, handed over (warm) when another process wants it,
//! and continued from a record another process left.
//!
//! The record comes first: it names a call's sandbox before the call is ready and a persisted
//! snapshot before its sandbox is shut down. A release that went unanswered leaves the key in
//! doubt; close releases every owned key with its record.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::fleet::*;

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

/// Hosts with a root each (`Handover::Suspended`): a sandbox wanted elsewhere is never handed
/// over warm (the next owner's host cannot reach it); it is suspended, whatever the policy, and
/// the key goes with its snapshot, which the next owner resumes from the shared shelf.
#[test]
fn a_sandbox_wanted_on_another_host_is_suspended_and_the_key_goes_with_its_snapshot() {
    let warm = ReleasePolicy::KeepWarm {
        idle: Duration::from_secs(60),
    };
    let fleet = Fleet {
        handover: Handover::Suspended,
        ..fleet()
    };
    let mut core = Lifecycle::new(Config {
        fleet: Some(fleet),
        ..config(warm)
    })
    .unwrap();
    core.handle_timeout(ms(0)).unwrap();
    let Some(StoreCommand::Renew { renewal, .. }) = core.poll_store() else {
        panic!("the first renewal")
    };
    core.handle_renewed(ms(0), renewal, &[]).unwrap();
    let x = owned_and_ready(&mut core, ms(0), "c1", "s1", 6);
    release(&mut core, ms(10), "c1");
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Idle));
    wanted_at_next_renewal(&mut core, &[key("s1")]);
    let mut cmds = commands(&mut core).into_iter();
    assert!(matches!(cmds.next(), Some(Command::Drain { .. })));
    assert!(
        matches!(cmds.next(), Some(Command::Stop { sandbox, suspend: true, .. }) if sandbox == x),
        "stopped to suspend, though the policy keeps warm and shuts down"
    );
    core.handle_stop_ok(ms(3_002), x, Some(Snapshot::new("snap-1")))
        .unwrap();
    let (records, rest) = way_down(&mut core, ms(3_003), x, None, 6);
    assert!(
        records.iter().all(|r| r.warm.is_none()),
        "never recorded warm: {records:?}"
    );
    match rest.as_slice() {
        [StoreCommand::Release { record, .. }] => {
            assert_eq!(record.warm, None);
            let recorded = record.snapshot.as_ref().expect("the snapshot goes along");
            assert_eq!((recorded.snapshot.as_str(), recorded.by), ("snap-1", x));
        }
        other => panic!("released with its snapshot: {other:?}"),
    }
    assert_eq!(core.stats().handovers, 0);
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
