//! `Status` bodies: the error (and delete-success) documents of the Kubernetes API.

use serde_json::{json, Value};

/// An API failure, answered as a `Status` body with its HTTP code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded as the real API server words it.
    pub message: String,
    /// `details` of the Status (name, group, kind, causes, retryAfterSeconds).
    pub details: Value,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Value) -> Self {
        ApiError {
            code,
            reason,
            message,
            details,
        }
    }

    /// 404 for an object that does not exist.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let q = qualified(group, plural);
        Self::new(
            404,
            "NotFound",
            format!("{q} \"{name}\" not found"),
            json!({"name": name, "group": group, "kind": plural}),
        )
    }

    /// 404 for a path the server does not serve.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
            json!({}),
        )
    }

    /// 409 for a create of a name already taken.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let q = qualified(group, plural);
        Self::new(
            409,
            "AlreadyExists",
            format!("{q} \"{name}\" already exists"),
            json!({"name": name, "group": group, "kind": plural}),
        )
    }

    /// 409 for a write with a stale `resourceVersion` (or an injected conflict).
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let q = qualified(group, plural);
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {q} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"), json!({"name": name, "group": group, "kind": plural}))
    }

    /// 410 for an expired resourceVersion.
    pub fn gone(message: &str) -> Self {
        Self::new(410, "Expired", message.to_string(), json!({}))
    }

    /// 422 for an invalid object, with one cause per bad field.
    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let causes: Vec<Value> = causes
            .into_iter()
            .map(|(field, message)| json!({"reason": "FieldValueInvalid", "message": message, "field": field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", text.join(", ")),
            json!({"name": name, "kind": kind, "causes": causes}),
        )
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message.into(), json!({}))
    }

    /// 405 for a verb the path does not take.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
            json!({}),
        )
    }

    /// 415 for a patch type the loopback does not implement.
    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml ({ct} is not implemented by the loopback)"),
            json!({}),
        )
    }

    /// 403 for a verb the caller may not use.
    pub fn forbidden(verb: &str, group: &str, resource: &str, namespace: &str) -> Self {
        Self::new(403, "Forbidden", format!("{resource} is forbidden: User \"system:serviceaccount:{namespace}:sandkeeper\" cannot {verb} resource \"{resource}\" in API group \"{group}\" in the namespace \"{namespace}\""), json!({"kind": resource, "group": group}))
    }

    /// An injected failure with the given code (429, 500, 503, 401, ...).
    pub fn injected(code: u16) -> Self {
        match code {
            429 => Self::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later"
                    .into(),
                json!({"retryAfterSeconds": 1}),
            ),
            401 => Self::new(401, "Unauthorized", "Unauthorized".into(), json!({})),
            403 => Self::new(
                403,
                "Forbidden",
                "forbidden by the loopback fault switch".into(),
                json!({}),
            ),
            409 => Self::new(409, "Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again".into(), json!({})),
            503 => Self::new(503, "ServiceUnavailable", "the server is currently unable to handle the request".into(), json!({})),
            504 => Self::new(504, "Timeout", "the server was unable to return a response in the time allotted".into(), json!({})),
            c => Self::new(c, "InternalError", "Internal error occurred: injected by the loopback fault switch".into(), json!({})),
        }
    }

    /// The `Status` document.
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "details": self.details, "code": self.code,
        })
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The `Status` of a successful delete.
pub fn delete_success(group: &str, plural: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "group": group, "kind": plural, "uid": uid},
    })
}
