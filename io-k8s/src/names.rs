//! Object names and labels. Every object io-k8s creates carries the owner instance, a hash of
//! the session (session names may not fit label values) and the core's sandbox number, so an
//! owner can find, watch and sweep exactly its own objects.
//!
//! The labels' domain is [`LABEL_DOMAIN`], `sandkeeper.sandbox.users.io`: a claim asks the
//! controller to put them on its pod (`spec.additionalPodMetadata`), and agent-sandbox (v0.5.0
//! on) admits only label domains of its allowlist there, by default `sandbox.users.io` and its
//! subdomains; any other domain leaves the claim `Ready=False`, reason `InvalidMetadata`, for
//! good. A cluster whose ConfigMap `agent-sandbox-config` (key `allowed-label-domains`)
//! replaces the default must list `sandbox.users.io` or `sandkeeper.sandbox.users.io`.
//! `app.kubernetes.io/managed-by` goes on the objects io-k8s writes itself, never through the
//! claim (the controller refuses that domain).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Label: the tool that manages the object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`].
pub const MANAGER: &str = "sandkeeper";
/// The domain of sandkeeper's labels and annotations: a subdomain of the one label domain
/// agent-sandbox admits on a claim's pod by default.
pub const LABEL_DOMAIN: &str = "sandkeeper.sandbox.users.io";
/// Label: the owning sandkeeper instance.
pub const OWNER: &str = "sandkeeper.sandbox.users.io/owner";
/// Label: a hash of the session (or isolation key) the sandbox serves.
pub const SESSION_HASH: &str = "sandkeeper.sandbox.users.io/session-hash";
/// Label: the core's sandbox number.
pub const SANDBOX: &str = "sandkeeper.sandbox.users.io/sandbox";
/// Annotation on pods: RFC 3339 time after which a sweeper may delete it.
pub const EXPIRES_AT: &str = "sandkeeper.sandbox.users.io/expires-at";

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

/// Labels of every object of `owner` serving `session_key` as sandbox `sandbox`: the
/// [`pod_labels`] and [`MANAGED_BY`].
pub fn labels(owner: &str, session_key: &str, sandbox: u64) -> BTreeMap<String, String> {
    let mut labels = pod_labels(owner, session_key, sandbox);
    labels.insert(MANAGED_BY.to_string(), MANAGER.to_string());
    labels
}

/// The labels a claim asks for on its pod (`additionalPodMetadata`): only
/// [`LABEL_DOMAIN`]'s, which the controller's default allowlist admits.
pub fn pod_labels(owner: &str, session_key: &str, sandbox: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OWNER.to_string(), owner.to_string()),
        (SESSION_HASH.to_string(), session_hash(session_key)),
        (SANDBOX.to_string(), sandbox.to_string()),
    ])
}

/// Label selector of every object of `owner` (a claim's pod carries no [`MANAGED_BY`]).
pub fn owner_selector(owner: &str) -> String {
    format!("{OWNER}={owner}")
}

/// Label selector of every object of every owner.
pub fn managed_selector() -> String {
    OWNER.to_string()
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
        assert!(
            pod_labels("o", "s", 3)
                .keys()
                .all(|k| k.starts_with(&format!("{LABEL_DOMAIN}/"))),
            "a claim asks only for labels of the allowed domain"
        );
    }
}
