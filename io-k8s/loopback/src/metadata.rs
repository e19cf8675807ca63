//! The claim controller's check of a claim's `spec.additionalPodMetadata` (agent-sandbox
//! v0.5.6, `extensions/controllers/sandboxclaim_controller.go`,
//! `validateAdditionalPodMetadata`), run first on every reconcile of a live claim; a violation
//! sets `Ready=False`, reason `InvalidMetadata`, message `invalid additionalPodMetadata: <why>`,
//! and is never retried.
//!
//! - Labels: a qualified key with a domain prefix; `app=sandbox-router` refused; the domain
//!   (lower-cased) in the allowlist, exactly or as a subdomain; a valid label value. The
//!   allowlist is read once at the controller's start from the ConfigMap
//!   `agent-sandbox-config`, key `allowed-label-domains` (comma or newline separated); a
//!   configured list replaces the default, which is `sandbox.users.io` alone.
//! - Annotations: a qualified key not in the domains `kubernetes.io`, `k8s.io` or
//!   `agents.x-k8s.io` (nor their subdomains), except `cluster-autoscaler.kubernetes.io/safe-to-evict`.
//!
//! Not modelled: the real controller walks Go maps, so with several bad keys which one it
//! names varies; here keys are checked in sorted order (labels first, as there).

use serde_json::Value;

/// The allowlist when none is configured.
pub const DEFAULT_LABEL_DOMAINS: &[&str] = &["sandbox.users.io"];

const RESTRICTED_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io", "agents.x-k8s.io"];
const EXEMPT_KEYS: &[&str] = &["cluster-autoscaler.kubernetes.io/safe-to-evict"];

fn in_domains(domain: &str, domains: &[&str]) -> bool {
    domains
        .iter()
        .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
}

/// A label name part (and label value shape): at most 63 characters, alphanumerics at both
/// ends, `-`, `_` or `.` between.
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: at most 253 characters of lower-case dot-separated labels.
fn subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Kubernetes' qualified name: `[prefix/]name`.
fn qualified(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => subdomain(prefix) && name_part(name),
        None => name_part(key),
    }
}

fn label(key: &str, value: &str, allowed: &[&str]) -> Result<(), String> {
    if !qualified(key) {
        return Err(format!("invalid label key: {key:?}: not a qualified name"));
    }
    if key.eq_ignore_ascii_case("app") && value.eq_ignore_ascii_case("sandbox-router") {
        return Err(format!(
            "restricted system label value: {key:?}={value:?} is not allowed in AdditionalPodMetadata"
        ));
    }
    let Some((domain, _)) = key.split_once('/') else {
        return Err(format!(
            "label {key:?} must have a domain prefix (e.g. 'sandbox.users.io/my-label') to prevent opting into unintended policy domains"
        ));
    };
    let domain = domain.to_ascii_lowercase();
    if !in_domains(&domain, allowed) {
        return Err(format!("label domain {domain:?} is not in the allowlist"));
    }
    if !(value.is_empty() || name_part(value)) {
        return Err(format!(
            "invalid label value: {value:?} does not match allowed pattern"
        ));
    }
    Ok(())
}

fn annotation(key: &str) -> Result<(), String> {
    if !qualified(key) {
        return Err(format!(
            "invalid annotation key: {key:?}: not a qualified name"
        ));
    }
    if EXEMPT_KEYS.contains(&key) {
        return Ok(());
    }
    if let Some((domain, _)) = key.split_once('/') {
        if in_domains(&domain.to_ascii_lowercase(), RESTRICTED_DOMAINS) {
            return Err(format!(
                "restricted system domain: {key:?} is not allowed in AdditionalPodMetadata"
            ));
        }
    }
    Ok(())
}

/// Checks `spec.additionalPodMetadata` of `claim` against `allowed` label domains (empty: the
/// default). `Err` is the condition message.
pub fn validate(claim: &Value, allowed: &[String]) -> Result<(), String> {
    let allowed: Vec<&str> = if allowed.is_empty() {
        DEFAULT_LABEL_DOMAINS.to_vec()
    } else {
        allowed.iter().map(String::as_str).collect()
    };
    let map = |ptr: &str| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = claim
            .pointer(ptr)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    };
    let why = |e: String| format!("invalid additionalPodMetadata: {e}");
    for (k, v) in map("/spec/additionalPodMetadata/labels") {
        label(&k, &v, &allowed).map_err(|e| why(format!("failed to validate label {k:?}: {e}")))?;
    }
    for (k, _) in map("/spec/additionalPodMetadata/annotations") {
        annotation(&k).map_err(|e| why(format!("failed to validate annotation {k:?}: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(labels: Value) -> Value {
        json!({"spec": {"additionalPodMetadata": {"labels": labels}}})
    }

    #[test]
    fn the_default_allowlist_admits_sandbox_users_io_and_its_subdomains_only() {
        assert!(validate(&claim(json!({"sandbox.users.io/x": "1"})), &[]).is_ok());
        assert!(validate(&claim(json!({"a.sandbox.users.io/x": "1"})), &[]).is_ok());
        assert_eq!(
            validate(&claim(json!({"sandkeeper.io/owner": "a"})), &[]).unwrap_err(),
            "invalid additionalPodMetadata: failed to validate label \"sandkeeper.io/owner\": label domain \"sandkeeper.io\" is not in the allowlist"
        );
        assert!(validate(&claim(json!({"evilsandbox.users.io/x": "1"})), &[]).is_err());
        assert!(validate(&claim(json!({"plain": "1"})), &[])
            .unwrap_err()
            .contains("must have a domain prefix"));
        let configured = vec!["example.com".to_string()];
        assert!(validate(&claim(json!({"sandbox.users.io/x": "1"})), &configured).is_err());
        assert!(validate(&claim(json!({"team.example.com/x": "1"})), &configured).is_ok());
    }

    #[test]
    fn annotations_are_checked_against_the_system_domains() {
        let c =
            json!({"spec": {"additionalPodMetadata": {"annotations": {"agents.x-k8s.io/x": "1"}}}});
        assert!(validate(&c, &[])
            .unwrap_err()
            .contains("restricted system domain"));
        let c = json!({"spec": {"additionalPodMetadata": {"annotations": {"mine.io/x": "1", "plain": "2"}}}});
        assert!(validate(&c, &[]).is_ok());
    }
}
