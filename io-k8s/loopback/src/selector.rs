//! Label and field selectors, parsed from their query-string form.

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector` (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn set_values(rest: &str, raw: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!("unable to parse requirement: found '{raw}'"))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e,!f,g in (h,i),j notin (k)`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for raw in split_top(s) {
            let t = raw.trim();
            if let Some(k) = t.strip_prefix('!') {
                reqs.push(Requirement::NotExists(k.trim().to_string()));
            } else if let Some((k, v)) = t.split_once("!=") {
                reqs.push(Requirement::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = t.split_once("==") {
                reqs.push(Requirement::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = t.split_once('=') {
                reqs.push(Requirement::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                reqs.push(Requirement::NotIn(k.trim().into(), set_values(rest, t)?));
            } else if let Some((k, rest)) = t.split_once(" in ") {
                reqs.push(Requirement::In(k.trim().into(), set_values(rest, t)?));
            } else if !t.is_empty() && !t.contains(' ') {
                reqs.push(Requirement::Exists(t.to_string()));
            } else {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: found '{t}'"
                )));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        })
    }
}

/// A parsed `fieldSelector` over the fields the loopback indexes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

const FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "spec.nodeName",
];

impl FieldSelector {
    /// Parses `metadata.name=x,status.phase!=Running`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for raw in split_top(s) {
            let t = raw.trim();
            let (field, eq, value) = if let Some((f, v)) = t.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = t.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = t.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{t}'; can't understand '{t}'"
                )));
            };
            let field = field.trim();
            if !FIELDS.contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Whether the object's fields satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, want)| {
            let ptr = format!("/{}", field.replace('.', "/"));
            let got = obj.pointer(&ptr).and_then(Value::as_str).unwrap_or("");
            (got == want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_follow_the_kubernetes_grammar() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        for (sel, want) in [
            ("a=1", true),
            ("a==1,b=x", true),
            ("a!=1", false),
            ("c", false),
            ("!c", true),
            ("b in (x,y)", true),
            ("b notin (x)", false),
            ("a=1,b in (y, z)", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in x").is_err());
    }

    #[test]
    fn field_selectors_reject_unknown_fields() {
        let o = json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("metadata.name=p").unwrap().matches(&o));
        assert!(!FieldSelector::parse("status.phase!=Running")
            .unwrap()
            .matches(&o));
        assert_eq!(FieldSelector::parse("spec.foo=1").unwrap_err().code, 400);
    }
}
