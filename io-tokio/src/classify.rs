//! How a backend's answer becomes the core's input. The one place where failure classes meet
//! the lifecycle:
//!
//! | command | ok | `Gone` | `Timeout`, `Transient`, `Fatal` | `Elsewhere` |
//! |---|---|---|---|---|
//! | Start | `StartOk` | `Died` (its calls fail `sandbox-gone`) | `StartFailed` | `StartFailed` |
//! | Upload | `UploadOk` | `UploadFailed(Gone)` (treated as death) | `UploadFailed(Transient)` | `UploadFailed(Transient)` |
//! | Stop | `StopOk(snapshot)` | `Died` | `StopFailed` | `StopFailed` |
//! | Persist | `PersistOk` | `Died` | `PersistFailed` | `PersistFailed` |
//! | Adopt (fleet) | `StartOk` | `StartFailed` (gone: the key starts afresh) | `StartFailed` | `InstanceGone` (on another host: left to the key's next adoption) |
//! | Shutdown | `ShutdownOk` | `ShutdownOk` (already gone is done) | `ShutdownFailed` | `ShutdownFailed` |
//!
//! `Fenced` (fleet mode: a newer token owns the key) is the core's `Fenced` for every command.
//! `Elsewhere` (fleet mode across hosts: not on this host's root, maybe on another's) matters
//! only to an Adopt: its workspace may hold the key's history, so it is never shut down.
//!
//! A fatal upload is retried like a transient one: the core bounds retries (`upload_retries`)
//! and then drops the version with `upload-failed`, so nothing is lost silently, and a sandbox
//! is only declared dead by evidence that it is gone.

use sandkeeper::{Input, SandboxId, Snapshot, UploadFailure, UploadId};

use crate::backend::{BackendError, FailureClass};

/// A Start's answer.
pub(crate) fn start(sandbox: SandboxId, result: Result<(), BackendError>) -> Input {
    match result {
        Ok(()) => Input::StartOk { sandbox },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) if e.class == FailureClass::Gone => Input::Died { sandbox },
        Err(_) => Input::StartFailed { sandbox },
    }
}

/// An Adopt's answer: like a Start's, except that a sandbox found gone is a failed adoption
/// (the core starts the key afresh for its calls), not a death of something they were bound to;
/// and one on another host is an instance lost with its workspace intact (the core leaves it,
/// named in the key's record, to the key's next adoption).
pub(crate) fn adopt(sandbox: SandboxId, result: Result<(), BackendError>) -> Input {
    match result {
        Ok(()) => Input::StartOk { sandbox },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) if e.class == FailureClass::Elsewhere => Input::InstanceGone { sandbox },
        Err(_) => Input::StartFailed { sandbox },
    }
}

/// An Upload's answer.
pub(crate) fn upload(
    upload: UploadId,
    sandbox: SandboxId,
    result: Result<(), BackendError>,
) -> Input {
    match result {
        Ok(()) => Input::UploadOk { upload },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) => Input::UploadFailed {
            upload,
            failure: match e.class {
                FailureClass::Gone => UploadFailure::Gone,
                FailureClass::Timeout
                | FailureClass::Transient
                | FailureClass::Fatal
                | FailureClass::Fenced
                | FailureClass::Elsewhere => UploadFailure::Transient,
            },
        },
    }
}

/// A Stop's answer.
pub(crate) fn stop(sandbox: SandboxId, result: Result<Option<Snapshot>, BackendError>) -> Input {
    match result {
        Ok(snapshot) => Input::StopOk { sandbox, snapshot },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) if e.class == FailureClass::Gone => Input::Died { sandbox },
        Err(_) => Input::StopFailed { sandbox },
    }
}

/// A Persist's answer.
pub(crate) fn persist(sandbox: SandboxId, result: Result<(), BackendError>) -> Input {
    match result {
        Ok(()) => Input::PersistOk { sandbox },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) if e.class == FailureClass::Gone => Input::Died { sandbox },
        Err(_) => Input::PersistFailed { sandbox },
    }
}

/// A Shutdown's answer.
pub(crate) fn shutdown(sandbox: SandboxId, result: Result<(), BackendError>) -> Input {
    match result {
        Ok(()) => Input::ShutdownOk { sandbox },
        Err(e) if e.class == FailureClass::Fenced => Input::Fenced { sandbox },
        Err(e) if e.class == FailureClass::Gone => Input::ShutdownOk { sandbox },
        Err(_) => Input::ShutdownFailed { sandbox },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_maps_to_the_documented_input() {
        let x = SandboxId(3);
        let u = UploadId(7);
        let err = |c| Err(BackendError::new(c, "x"));
        assert_eq!(start(x, Ok(())), Input::StartOk { sandbox: x });
        assert_eq!(
            start(x, err(FailureClass::Gone)),
            Input::Died { sandbox: x }
        );
        for c in [
            FailureClass::Timeout,
            FailureClass::Transient,
            FailureClass::Fatal,
        ] {
            assert_eq!(start(x, err(c)), Input::StartFailed { sandbox: x });
            assert_eq!(
                upload(u, x, err(c)),
                Input::UploadFailed {
                    upload: u,
                    failure: UploadFailure::Transient
                }
            );
            assert_eq!(
                stop(x, err(c).map(|()| None)),
                Input::StopFailed { sandbox: x }
            );
            assert_eq!(persist(x, err(c)), Input::PersistFailed { sandbox: x });
            assert_eq!(shutdown(x, err(c)), Input::ShutdownFailed { sandbox: x });
        }
        // An Adopt: gone or failing is a failed start; on another host, an instance lost.
        assert_eq!(adopt(x, Ok(())), Input::StartOk { sandbox: x });
        for c in [
            FailureClass::Gone,
            FailureClass::Timeout,
            FailureClass::Transient,
            FailureClass::Fatal,
        ] {
            assert_eq!(adopt(x, err(c)), Input::StartFailed { sandbox: x });
        }
        assert_eq!(
            adopt(x, err(FailureClass::Elsewhere)),
            Input::InstanceGone { sandbox: x }
        );
        assert_eq!(
            start(x, err(FailureClass::Elsewhere)),
            Input::StartFailed { sandbox: x }
        );
        // Fleet mode: a refusal for an old token is the core's `fenced`, whatever the command.
        let fenced = Input::Fenced { sandbox: x };
        assert_eq!(start(x, err(FailureClass::Fenced)), fenced);
        assert_eq!(upload(u, x, err(FailureClass::Fenced)), fenced);
        assert_eq!(stop(x, err(FailureClass::Fenced).map(|()| None)), fenced);
        assert_eq!(persist(x, err(FailureClass::Fenced)), fenced);
        assert_eq!(shutdown(x, err(FailureClass::Fenced)), fenced);
        assert_eq!(adopt(x, err(FailureClass::Fenced)), fenced);
        assert_eq!(
            upload(u, x, err(FailureClass::Gone)),
            Input::UploadFailed {
                upload: u,
                failure: UploadFailure::Gone
            }
        );
        assert_eq!(
            stop(x, err(FailureClass::Gone).map(|()| None)),
            Input::Died { sandbox: x }
        );
        assert_eq!(
            persist(x, err(FailureClass::Gone)),
            Input::Died { sandbox: x }
        );
        assert_eq!(
            shutdown(x, err(FailureClass::Gone)),
            Input::ShutdownOk { sandbox: x }
        );
        assert_eq!(shutdown(x, Ok(())), Input::ShutdownOk { sandbox: x });
    }
}
