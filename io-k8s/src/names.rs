//! Object names and labels. Every object io-k8s creates carries the owner instance, a hash of
//! the session (session names may not fit label values) and the core's sandbox number, so an
//! owner can find, watch and sweep exactly its own objects.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Label: the tool that manages the object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`].
pub const MANAGER: &str = "sandkeeper";
/// Label: the owning sandkeeper instance.
pub const OWNER: &str = "sandkeeper.io/owner";
/// Label: a hash of the session (or isolation key) the sandbox serves.
pub const SESSION_HASH: &str = "sandkeeper.io/session-hash";
/// Label: the core's sandbox number.
pub const SANDBOX: &str = "sandkeeper.io/sandbox";
/// Annotation on pods: RFC 3339 time after which a sweeper may delete it.
pub const EXPIRES_AT: &str = "sandkeeper.io/expires-at";

/// The longest owner name: object names (`sk-<owner>-<number>`) stay within 63 characters.
pub const MAX_OWNER_LEN: usize = 32;

/// An owner instance name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid owner name {0:?}: use 1 to 32 lower-case letters, digits or '-', starting and ending with a letter or digit")]
pub struct InvalidOwner(pub String);

/// Checks an owner instance name (a DNS-1123 label of at most [`MAX_OWNER_LEN`] characters).
pub fn check_owner(owner: &str) -> Result<(), InvalidOwner> {
    let ok = !owner.is_empty()
        && owner.len() <= MAX_OWNER_LEN
        && owner
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !owner.starts_with('-')
        && !owner.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(InvalidOwner(owner.to_string()))
    }
}

/// First 16 hex digits of SHA-256 of the session key: a valid label value for any session.
pub fn session_hash(session_key: &str) -> String {
    let digest = Sha256::digest(session_key.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Name of the claim or pod of a sandbox: `sk-<owner>-<number>`.
pub fn object_name(owner: &str, sandbox: u64) -> String {
    format!("sk-{owner}-{sandbox}")
}

/// Name of an owner's Lease.
pub fn lease_name(owner: &str) -> String {
    format!("sandkeeper-owner-{owner}")
}

/// Labels of every object of `owner` serving `session_key` as sandbox `sandbox`.
pub fn labels(owner: &str, session_key: &str, sandbox: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (OWNER.to_string(), owner.to_string()),
        (SESSION_HASH.to_string(), session_hash(session_key)),
        (SANDBOX.to_string(), sandbox.to_string()),
    ])
}

/// Label selector of every object of `owner`.
pub fn owner_selector(owner: &str) -> String {
    format!("{MANAGED_BY}={MANAGER},{OWNER}={owner}")
}

/// Label selector of every object of every owner.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={MANAGER}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_valid_kubernetes_values() {
        assert!(check_owner("worker-1").is_ok());
        for bad in ["", "Worker", "-a", "a-", "a_b", &"a".repeat(33)] {
            assert!(check_owner(bad).is_err(), "{bad}");
        }
        let h = session_hash(
            "a session/with odd chars and a very long name"
                .repeat(5)
                .as_str(),
        );
        assert_eq!(h.len(), 16);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(session_hash("s1"), session_hash("s2"));
        let name = object_name(&"a".repeat(MAX_OWNER_LEN), u64::MAX);
        assert!(name.len() <= 63, "{name}");
        assert_eq!(labels("o", "s", 3)[SANDBOX], "3");
    }
}
