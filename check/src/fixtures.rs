//! What the checkers' unit tests share: the verdict as a check's name, a session's path, and an
//! Upload command.

use sandkeeper::{Command, Instant, PathName, Payload, SandboxId, SessionId, UploadId, Version};

use crate::violation::Violation;

/// The name of the check `r` broke, or `"ok"`.
pub(crate) fn check<T>(r: Result<T, Violation>) -> &'static str {
    r.err().map_or("ok", |v| v.check)
}

/// Session `s` and its path `log`.
pub(crate) fn names() -> (SessionId, PathName) {
    (SessionId::new("s").unwrap(), PathName::new("log").unwrap())
}

/// `Upload` `id` of `s`/`log` `version` into sandbox `x`, due at `deadline`.
pub(crate) fn upload_at(id: u64, version: u64, x: u64, deadline: Instant) -> Command {
    let (session, path) = names();
    Command::Upload {
        upload: UploadId(id),
        sandbox: SandboxId(x),
        session,
        path,
        version: Version(version),
        payload: Payload::new(&b""[..]),
        deadline,
        token: None,
    }
}

/// `Upload` `id` of `s`/`log` `version` into sandbox `x` (its deadline is not looked at).
pub(crate) fn upload(id: u64, version: u64, x: u64) -> Command {
    upload_at(id, version, x, Instant::ZERO)
}
