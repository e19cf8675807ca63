//! Fleet mode, this process's lease and the fencing it guards: renewals on their own timer,
//! validity by the core's clock with the margin taken off, lapse and a new epoch, stale and
//! unknown answers; a claim waits for a valid lease and is not taken under a lapsed one; a lapse
//! or a backend's refusal fences the key (nothing more goes out under its token, its calls fail or
//! claim it again), and answers that come after the fence or the lease are stale.

mod support;

use std::time::Duration;

use sandkeeper::*;
use support::fleet::*;

fn fleet() -> Fleet {
    Fleet {
        incarnation: 7,
        lease: Duration::from_secs(10),
        renew_every: Duration::from_secs(3),
        margin: Duration::from_secs(2),
        claim_retry: Duration::from_millis(500),
        handover: sandkeeper::Handover::Warm,
    }
}

/// Scope `Call`: calls start at once, no key to claim (ownership is `fleet_ownership.rs`'s).
fn core() -> Lifecycle {
    Lifecycle::new(Config {
        scope: Scope::Call,
        fleet: Some(fleet()),
        ..Config::default()
    })
    .unwrap()
}

fn at(secs: u64) -> Instant {
    Instant::from_millis(secs * 1000)
}

/// Fires due timers at `t` and returns the renewals ordered.
fn tick(core: &mut Lifecycle, t: Instant) -> Vec<(RenewalId, u64, Instant)> {
    core.handle_timeout(t).unwrap();
    std::iter::from_fn(|| core.poll_store())
        .map(|c| match c {
            StoreCommand::Renew {
                renewal,
                epoch,
                deadline,
            } => {
                assert_eq!(c.deadline(), deadline);
                (renewal, epoch, deadline)
            }
            other => panic!("only renewals here: {other:?}"),
        })
        .collect()
}

#[test]
fn the_first_renewal_is_due_at_once_and_the_next_ones_on_their_own_timer() {
    let mut core = core();
    assert_eq!(core.poll_timeout(), Some(Instant::ZERO));
    assert_eq!(
        core.lease_valid_until(),
        None,
        "no lease before a confirmation"
    );
    let first = tick(&mut core, at(0));
    assert_eq!(
        first,
        vec![(RenewalId(0), 1, at(8))],
        "deadline: lease - margin"
    );
    assert_eq!(core.poll_timeout(), Some(at(3)));
    assert_eq!(tick(&mut core, at(3)), vec![(RenewalId(1), 1, at(11))]);
    core.handle_renewed(at(3), RenewalId(1), &[]).unwrap();
    assert_eq!(
        core.lease_valid_until(),
        Some(at(11)),
        "sent + lease - margin"
    );
    // The older renewal's late confirmation is stale: a later one was confirmed.
    let stale = core.stats().stale_answers;
    core.handle_renewed(at(4), RenewalId(0), &[]).unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1);
    assert_eq!(core.lease_valid_until(), Some(at(11)));
    // Nothing else the core does moves the renewals: a call comes and goes.
    let call = CallId::new("c1").unwrap();
    core.acquire(
        at(5),
        CallSpec::new(call.clone(), SessionId::new("s").unwrap()),
    )
    .unwrap();
    core.release(at(5), &call).unwrap();
    assert_eq!(tick(&mut core, at(6)), vec![(RenewalId(2), 1, at(14))]);
    assert_eq!(core.stats().renewals_ordered, 3);
    assert_eq!(core.stats().renewals_ok, 1);
}

#[test]
fn a_lease_not_confirmed_in_time_lapses_and_the_next_renewal_opens_a_new_epoch() {
    let mut core = core();
    tick(&mut core, at(0));
    core.handle_renewed(at(0), RenewalId(0), &[]).unwrap();
    assert_eq!(core.lease_valid_until(), Some(at(8)));
    // Every later renewal fails.
    for t in [3, 6] {
        let ordered = tick(&mut core, at(t));
        let (renewal, epoch, _) = ordered[0];
        assert_eq!(epoch, 1);
        core.handle_renew_failed(at(t), renewal).unwrap();
        assert_eq!(
            core.lease_valid_until(),
            Some(at(8)),
            "a failure keeps what was confirmed"
        );
    }
    assert_eq!(core.stats().renewals_failed, 2);
    assert_eq!(
        core.poll_timeout(),
        Some(at(8)),
        "the lapse comes before the next renewal"
    );
    let ordered = tick(&mut core, at(8));
    assert_eq!(core.lease_valid_until(), None);
    assert_eq!(core.lease_epoch(), Some(2));
    assert_eq!(core.stats().lease_lapses, 1);
    assert_eq!(
        ordered,
        vec![(RenewalId(3), 2, at(16))],
        "a renewal of the new epoch at once"
    );
    // The old epoch's renewals are stale now, even one confirmed.
    let stale = core.stats().stale_answers;
    core.handle_renewed(at(8), RenewalId(2), &[]).unwrap();
    assert_eq!(core.stats().stale_answers, stale + 1);
    assert_eq!(core.lease_valid_until(), None);
    core.handle_renewed(at(9), RenewalId(3), &[]).unwrap();
    assert_eq!(core.lease_valid_until(), Some(at(16)));
}

/// A renewal answered after the next one was ordered still counts, while its confirmation can
/// extend the lease.
#[test]
fn a_renewal_answered_after_the_next_was_ordered_still_counts() {
    let mut core = core();
    tick(&mut core, at(0));
    assert_eq!(tick(&mut core, at(3)), vec![(RenewalId(1), 1, at(11))]);
    core.handle_renewed(at(4), RenewalId(0), &[]).unwrap();
    assert_eq!(core.lease_valid_until(), Some(at(8)));
    assert_eq!(core.stats().renewals_ok, 1);
    core.handle_renewed(at(4), RenewalId(1), &[]).unwrap();
    assert_eq!(core.lease_valid_until(), Some(at(11)));
}

#[test]
fn a_confirmation_too_late_to_count_is_stale() {
    let mut core = core();
    tick(&mut core, at(0));
    // Confirmed at 8 s: sent at 0, valid until 8: nothing gained.
    core.handle_renewed(at(8), RenewalId(0), &[]).unwrap();
    assert_eq!(core.lease_valid_until(), None);
    assert_eq!(core.stats().renewals_ok, 0);
    assert_eq!(core.stats().stale_answers, 1);
}

#[test]
fn store_answers_for_work_never_ordered_are_typed_errors_that_change_nothing() {
    let mut core = core();
    let before = format!("{core:?}");
    assert_eq!(
        core.handle_renewed(at(0), RenewalId(0), &[]),
        Err(Error::UnknownStoreWork {
            what: "renewal",
            id: 0
        })
    );
    assert_eq!(format!("{core:?}"), before);
    // Without fleet mode there is no renewal at all.
    let mut single = Lifecycle::new(Config::default()).unwrap();
    assert!(matches!(
        single.handle_renew_failed(at(0), RenewalId(0)),
        Err(Error::UnknownStoreWork { .. })
    ));
    assert_eq!(single.poll_timeout(), None);
}

#[test]
fn sandbox_ids_carry_the_incarnation_and_others_are_unknown() {
    let mut core = core();
    let call = CallId::new("c1").unwrap();
    core.acquire(at(0), CallSpec::new(call, SessionId::new("s").unwrap()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("a start")
    };
    assert_eq!(sandbox, SandboxId(7 << 32));
    assert_eq!(
        core.handle_start_ok(at(0), SandboxId(0)),
        Err(Error::UnknownSandbox {
            sandbox: SandboxId(0)
        })
    );
}

#[test]
fn fleet_timing_that_cannot_hold_a_lease_is_refused() {
    let bad = [
        (
            Fleet {
                incarnation: 0,
                ..fleet()
            },
            "fleet.incarnation",
        ),
        (
            Fleet {
                margin: Duration::from_secs(10),
                ..fleet()
            },
            "fleet.margin",
        ),
        (
            Fleet {
                renew_every: Duration::from_secs(8),
                ..fleet()
            },
            "fleet.renew_every",
        ),
        (
            Fleet {
                renew_every: Duration::ZERO,
                ..fleet()
            },
            "fleet.renew_every",
        ),
    ];
    for (fleet, field) in bad {
        let e = Lifecycle::new(Config {
            fleet: Some(fleet),
            ..Config::default()
        })
        .err();
        assert!(
            matches!(e, Some(Error::InvalidConfig { field: f, .. }) if f == field),
            "{fleet:?}: {e:?}"
        );
    }
}

#[test]
fn close_ends_the_renewals() {
    let mut core = core();
    tick(&mut core, at(0));
    core.close(at(1), Duration::from_secs(1)).unwrap();
    while let Some(t) = core.poll_timeout() {
        tick(&mut core, t);
    }
    assert!(core.is_closed());
    assert_eq!(core.poll_timeout(), None);
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
