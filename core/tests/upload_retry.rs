//! Transient upload failures are retried with doubling backoff, all within the upload timeout
//! of the version's first attempt.

use std::time::Duration;

use sandkeeper::*;

fn up(core: &mut Lifecycle) -> (UploadId, Version) {
    loop {
        match core.poll_command() {
            Some(Command::Upload {
                upload, version, ..
            }) => return (upload, version),
            Some(_) => continue,
            None => panic!("no upload ordered"),
        }
    }
}

#[test]
fn retries_stop_at_the_upload_timeout_of_the_first_attempt() {
    let mut core = Lifecycle::new(Config {
        upload_timeout: Duration::from_millis(1000),
        upload_retries: 10,
        retry_backoff: Duration::from_millis(300),
        ..Config::default()
    })
    .unwrap();
    let (call, session) = (CallId::new("c").unwrap(), SessionId::new("s").unwrap());
    let log = PathName::session_log();
    core.acquire(Instant::ZERO, CallSpec::new(call, session.clone()))
        .unwrap();
    let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
        panic!("no start")
    };
    core.handle_start_ok(Instant::ZERO, sandbox).unwrap();
    core.flush(Instant::ZERO, &session, &log, Payload::new(b"x".to_vec()))
        .unwrap();
    let (first, v) = up(&mut core);
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(1000)));

    // Failure at 100 ms: retried after 300 ms.
    core.handle_upload_failed(Instant::from_millis(100), first, UploadFailure::Transient)
        .unwrap();
    assert_eq!(core.poll_command(), None);
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(400)));
    core.handle_timeout(Instant::from_millis(400)).unwrap();
    let (second, v2) = up(&mut core);
    assert_eq!(v2, v, "the same version is retried");
    // The retry's deadline is the first attempt's, not a fresh upload timeout.
    assert_eq!(core.poll_timeout(), Some(Instant::from_millis(1000)));

    // Failure at 500 ms: the next delay (600 ms) would end past 1000 ms, so the version fails.
    while core.poll_event().is_some() {}
    core.handle_upload_failed(Instant::from_millis(500), second, UploadFailure::Transient)
        .unwrap();
    let settled: Vec<Event> = std::iter::from_fn(|| core.poll_event()).collect();
    assert!(
        settled.contains(&Event::Settled {
            session: session.clone(),
            path: log.clone(),
            version: v,
            outcome: Settlement::Dropped {
                reason: DropReason::UploadFailed
            },
        }),
        "{settled:?}"
    );
    assert_eq!(core.stats().upload_retries, 1);
    assert!(core.is_mirror_settled(&session));
}
