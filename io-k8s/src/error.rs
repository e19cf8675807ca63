//! API errors, classified: what a caller should do about each.

use std::time::Duration;

/// What to do about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The object (or sandbox) is gone: 404, a deleted or failed pod, an expired claim.
    Gone,
    /// A write raced another: read again and retry (409).
    Conflict,
    /// Worth retrying after a pause: 429, 5xx, a dropped connection, an outcome unknown.
    Retryable,
    /// Took too long.
    Timeout,
    /// Will not work if tried again: 401/403 (permissions), 400/422 (bad request), a terminal
    /// claim reason, a payload over the limit.
    Fatal,
    /// Fleet mode: refused for an older fencing token than the object, or its key, has seen.
    Fenced,
}

/// A failed Kubernetes operation.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// 404, or the sandbox's pod or claim is gone.
    #[error("{what} is gone: {message}")]
    Gone {
        /// What is gone.
        what: String,
        /// Why we think so.
        message: String,
    },
    /// 409: the object changed under the write.
    #[error("conflict on {what}: {message}")]
    Conflict {
        /// What was written.
        what: String,
        /// The server's message.
        message: String,
    },
    /// 429 or 5xx, or a transport failure.
    #[error("the API server failed transiently ({code}): {message}")]
    Retryable {
        /// HTTP code, 0 for a transport failure.
        code: u16,
        /// The server's or transport's message.
        message: String,
    },
    /// 401 or 403.
    #[error("permission denied ({code}): {message}; the service account needs `{verb}` on `{resource}` (see io-k8s/deploy/rbac.yaml)")]
    Forbidden {
        /// HTTP code.
        code: u16,
        /// RBAC verb that was refused.
        verb: &'static str,
        /// RBAC resource (`pods/exec`, `sandboxclaims.extensions.agents.x-k8s.io`).
        resource: &'static str,
        /// The server's message.
        message: String,
    },
    /// Another 4xx: the request itself is wrong.
    #[error("the API server rejected the request ({code} {reason}): {message}")]
    Invalid {
        /// HTTP code.
        code: u16,
        /// Status reason.
        reason: String,
        /// The server's message.
        message: String,
    },
    /// Fleet mode: a change under a fencing token older than the newest its sandbox's object,
    /// or its key, has seen (another process owns the key now; `fence.rs`).
    #[error("{object}: token {token} is older than the newest seen, {newest}: another process owns its key")]
    Fenced {
        /// The object (or the key's Lease).
        object: String,
        /// The token refused.
        token: u64,
        /// The newest seen.
        newest: u64,
    },
    /// A fleet store's Lease does not hold what it should (`fleet_store.rs`).
    #[error("fleet lease {lease}: {why}")]
    FleetLease {
        /// The Lease.
        lease: String,
        /// What is wrong with it.
        why: String,
    },
    /// A claim will never become ready (`WarmPoolNotFound`, `ClaimExpired`, ...).
    #[error("claim {claim} failed: {reason}: {message}")]
    Terminal {
        /// The claim.
        claim: String,
        /// The condition reason.
        reason: String,
        /// The condition message.
        message: String,
    },
    /// An exec closed without a status frame: the command may or may not have run.
    #[error("exec into {pod} ended without a status frame: the outcome is unknown")]
    OutcomeUnknown {
        /// The pod.
        pod: String,
    },
    /// The command ran and failed.
    #[error("command in {pod} exited with code {code}: {stderr}")]
    CommandFailed {
        /// The pod.
        pod: String,
        /// Exit code.
        code: i32,
        /// The start of its stderr.
        stderr: String,
    },
    /// A deadline passed.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// What timed out.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// A payload over the configured limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The upload archive could not be built.
    #[error("building the upload archive: {0}")]
    Archive(String),
    /// The cluster lacks what the configured mode needs (found at connect).
    #[error("{problem}: {fix}")]
    Install {
        /// What is missing or wrong.
        problem: String,
        /// What to do about it.
        fix: String,
    },
    /// The shelf a pod-mode suspension keeps workspaces on failed (`shelf.rs`).
    #[error("the shelf: {message}")]
    Shelf {
        /// Whether the same operation may succeed later (a store failure that may pass, an
        /// archive cut in transit).
        retryable: bool,
        /// What it said.
        message: String,
    },
    /// A snapshot reference this backend did not make (not `sk-<owner>-<number>` of this owner).
    #[error("snapshot {snapshot:?} is not a claim of this owner: {why}")]
    BadSnapshot {
        /// The reference as given.
        snapshot: String,
        /// What is wrong with it.
        why: String,
    },
}

impl K8sError {
    /// What to do about it.
    pub fn class(&self) -> ErrorClass {
        match self {
            K8sError::Gone { .. } => ErrorClass::Gone,
            K8sError::Conflict { .. } => ErrorClass::Conflict,
            K8sError::Fenced { .. } => ErrorClass::Fenced,
            K8sError::Retryable { .. } | K8sError::OutcomeUnknown { .. } => ErrorClass::Retryable,
            K8sError::Shelf {
                retryable: true, ..
            } => ErrorClass::Retryable,
            K8sError::Timeout { .. } => ErrorClass::Timeout,
            K8sError::Forbidden { .. }
            | K8sError::Invalid { .. }
            | K8sError::Terminal { .. }
            | K8sError::CommandFailed { .. }
            | K8sError::TooLarge { .. }
            | K8sError::Archive(_)
            | K8sError::Install { .. }
            | K8sError::FleetLease { .. }
            | K8sError::BadSnapshot { .. }
            | K8sError::Shelf {
                retryable: false, ..
            } => ErrorClass::Fatal,
        }
    }

    /// Whether the object is gone.
    pub fn is_gone(&self) -> bool {
        self.class() == ErrorClass::Gone
    }
}

/// What an API call was doing, for classification and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// RBAC verb.
    pub verb: &'static str,
    /// RBAC resource.
    pub resource: &'static str,
}

impl Call {
    /// A call of `verb` on `resource`.
    pub const fn new(verb: &'static str, resource: &'static str) -> Self {
        Call { verb, resource }
    }
}

/// Classifies a `kube` error for `call` on object `what`.
pub fn classify(err: kube::Error, call: Call, what: &str) -> K8sError {
    match err {
        kube::Error::Api(status) => {
            from_status(status.code, &status.reason, &status.message, call, what)
        }
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
            code,
        )) => from_status(
            code.as_u16(),
            "",
            &format!("exec upgrade answered {code}"),
            call,
            what,
        ),
        other => K8sError::Retryable {
            code: 0,
            message: other.to_string(),
        },
    }
}

/// Classifies an HTTP status answer.
pub fn from_status(code: u16, reason: &str, message: &str, call: Call, what: &str) -> K8sError {
    let message = message.to_string();
    match code {
        404 | 410 => K8sError::Gone {
            what: what.to_string(),
            message,
        },
        409 => K8sError::Conflict {
            what: what.to_string(),
            message,
        },
        401 | 403 => K8sError::Forbidden {
            code,
            verb: call.verb,
            resource: call.resource,
            message,
        },
        429 | 500..=599 => K8sError::Retryable { code, message },
        _ => K8sError::Invalid {
            code,
            reason: reason.to_string(),
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        let c = Call::new("get", "pods");
        for (code, class) in [
            (404, ErrorClass::Gone),
            (409, ErrorClass::Conflict),
            (429, ErrorClass::Retryable),
            (500, ErrorClass::Retryable),
            (503, ErrorClass::Retryable),
            (401, ErrorClass::Fatal),
            (403, ErrorClass::Fatal),
            (422, ErrorClass::Fatal),
            (400, ErrorClass::Fatal),
        ] {
            assert_eq!(
                from_status(code, "", "m", c, "pod x").class(),
                class,
                "{code}"
            );
        }
        let e = from_status(
            403,
            "Forbidden",
            "no",
            Call::new("create", "pods/exec"),
            "pod x",
        );
        let text = e.to_string();
        assert!(text.contains("`create` on `pods/exec`"), "{text}");
    }
}
