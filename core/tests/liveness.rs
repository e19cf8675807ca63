//! Fleet mode, this process's lease: renewals on their own timer, validity by the core's clock
//! with the margin taken off, lapse and a new epoch, stale and unknown answers.

use std::time::Duration;

use sandkeeper::*;

fn fleet() -> Fleet {
    Fleet {
        incarnation: 7,
        lease: Duration::from_secs(10),
        renew_every: Duration::from_secs(3),
        margin: Duration::from_secs(2),
        claim_retry: Duration::from_millis(500),
    }
}

/// Scope `Call`: calls start at once, no key to claim (ownership is `ownership.rs`'s).
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
