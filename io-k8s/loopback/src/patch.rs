//! Patch semantics: JSON merge patch (RFC 7386), and the approximations the loopback uses for
//! strategic merge patch and server-side apply.

use serde_json::Value;

/// How a PATCH body is applied, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`: RFC 7386.
    Merge,
    /// `application/strategic-merge-patch+json`: applied as a merge patch (lists are replaced,
    /// `$patch` directives are not interpreted) — enough for the fields kubectl and kube-rs
    /// change on the served types.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply) with a JSON body: creates the object
    /// when absent, else merges the applied fields (no field-manager ownership tracking).
    Apply,
}

impl PatchKind {
    /// Recognises a patch media type.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// Applies an RFC 7386 merge patch to `target` in place.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge(
            &mut t,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            t,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchKind::Merge)
        );
        assert_eq!(
            PatchKind::from_content_type("application/json-patch+json"),
            None
        );
    }
}
