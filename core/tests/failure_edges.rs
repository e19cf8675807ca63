//! Edges of failure handling: what state a sandbox is left in when its start fails or it dies
//! while starting, and the exact boundary of the upload retry window.

use std::time::Duration;

use sandkeeper::*;

mod support;
use support::start_call;

fn commands(core: &mut Lifecycle) -> Vec<Command> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

fn events(core: &mut Lifecycle) -> Vec<Event> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

#[test]
fn a_failed_start_is_shut_down_once_to_clean_up() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_start_failed(Instant::ZERO, x).unwrap();
    // Not dead: the backend may hold something of it, so it is shut down, once.
    assert_eq!(core.sandbox_state(x), Some(SandboxState::ShuttingDown));
    // The start answered, so nothing is abandoned.
    let deadline = Instant::ZERO + Config::default().command_timeout;
    assert_eq!(
        commands(&mut core),
        vec![Command::Shutdown {
            sandbox: x,
            deadline,
            token: None,
        }]
    );
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: a,
        error: ErrorKind::StartFailed,
    }));
}

#[test]
fn a_death_while_starting_is_dead_and_shut_down_once() {
    let mut core = Lifecycle::new(Config::default()).unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_died(Instant::ZERO, x).unwrap();
    // Dead for the core (the backend said so), and still one Shutdown to free what is left.
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Dead));
    // The start is abandoned (its answer is no longer awaited) and the Shutdown runs at once.
    let deadline = Instant::ZERO + Config::default().command_timeout;
    assert_eq!(
        commands(&mut core),
        vec![
            Command::Abandon { sandbox: x },
            Command::Shutdown {
                sandbox: x,
                deadline,
                token: None,
            }
        ]
    );
    assert!(events(&mut core).contains(&Event::CallFailed {
        call: a,
        error: ErrorKind::SandboxGone,
    }));
    // A second report changes nothing.
    core.handle_died(Instant::ZERO, x).unwrap();
    assert_eq!(commands(&mut core), vec![]);
}

/// A transient failure is retried only if the retry would begin strictly before the version's
/// upload timeout (counted from its first attempt) runs out.
fn fail_first_attempt_at(at: Duration) -> (Vec<Command>, Vec<Event>) {
    let mut core = Lifecycle::new(Config {
        upload_timeout: Duration::from_secs(10),
        retry_backoff: Duration::from_secs(1),
        ..Config::default()
    })
    .unwrap();
    let (_, x) = start_call(&mut core, "a", "s");
    let t0 = Instant::ZERO;
    core.handle_start_ok(t0, x).unwrap();
    let s = SessionId::new("s").unwrap();
    core.flush(t0, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    events(&mut core);
    let t = Instant::from_millis(at.as_millis() as u64);
    core.handle_upload_failed(t, upload, UploadFailure::Transient)
        .unwrap();
    (commands(&mut core), events(&mut core))
}

#[test]
fn a_retry_that_would_begin_at_the_timeout_is_not_made() {
    // Failed at 9 s; the retry would begin at 9 + 1 = 10 s, the timeout: dropped now.
    let (_, events) = fail_first_attempt_at(Duration::from_secs(9));
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Settled {
                outcome: Settlement::Dropped {
                    reason: DropReason::UploadFailed
                },
                ..
            }
        )),
        "{events:?}"
    );
}

#[test]
fn a_retry_that_begins_before_the_timeout_is_made() {
    // Failed at 8.999 s; the retry begins at 9.999 s, inside the window: nothing settles yet.
    let (_, events) = fail_first_attempt_at(Duration::from_millis(8_999));
    assert!(
        !events.iter().any(|e| matches!(e, Event::Settled { .. })),
        "{events:?}"
    );
}

#[test]
fn a_drain_waits_for_a_version_waiting_to_be_retried() {
    let t0 = Instant::ZERO;
    let mut core = Lifecycle::new(Config {
        retry_backoff: Duration::from_secs(1),
        ..Config::default()
    })
    .unwrap();
    let (a, x) = start_call(&mut core, "a", "s");
    core.handle_start_ok(t0, x).unwrap();
    let s = SessionId::new("s").unwrap();
    core.flush(t0, &s, &PathName::session_log(), Payload::default())
        .unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no upload")
    };
    core.handle_upload_failed(t0, upload, UploadFailure::Transient)
        .unwrap();
    // Nothing in flight; the version waits for its retry. The release drains and waits for it.
    core.release(t0, &a).unwrap();
    let cmds = commands(&mut core);
    assert!(
        cmds.iter().all(|c| !matches!(c, Command::Stop { .. })),
        "{cmds:?}"
    );
    assert_eq!(core.sandbox_state(x), Some(SandboxState::Draining));
    let retry = core.poll_timeout().expect("the retry");
    core.handle_timeout(retry).unwrap();
    let Some(Command::Upload { upload, .. }) = core.poll_command() else {
        panic!("no retry upload")
    };
    core.handle_upload_ok(retry, upload).unwrap();
    assert!(commands(&mut core).contains(&Command::Stop {
        sandbox: x,
        suspend: false,
        deadline: retry + Config::default().command_timeout,
        token: None,
    }));
    assert!(events(&mut core).iter().any(|e| matches!(
        e,
        Event::Settled {
            outcome: Settlement::Uploaded { .. },
            ..
        }
    )));
}
