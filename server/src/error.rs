//! The two error shapes the SDKs read: the REST API's `{code, message}` with the HTTP status
//! as `code` ([`ApiError`]), and Connect's `{code: "not_found", message}` on envd's RPC paths
//! ([`ConnectError`]). Plus the edge's answer for envd traffic to a sandbox that is not there
//! ([`SandboxNotFound`]).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error of the REST API (and of envd's plain HTTP endpoints, `/files`): answered as
/// `{"code": <status>, "message": "..."}`, which the SDKs map to their exceptions (401 →
/// authentication, 404 → not found, 429 → rate limit, others → a generic sandbox error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status, also the body's `code`.
    pub status: StatusCode,
    /// What went wrong, for the user.
    pub message: String,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// 400: the request is malformed or asks for something invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: no API key, or one this server does not know.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 404 for a sandbox: unknown, gone, or another team's (the same answer for all three).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {} not found", shown(id)),
        )
    }

    /// 413: a body or an upload over its bound.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 501: an E2B operation this server does not implement (yet, or at all).
    pub fn not_supported(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{what} is not supported by sandkeeperd"),
        )
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "code": self.status.as_u16(), "message": self.message });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // A refusal by a limit: the Python SDK would retry a 429 three times otherwise.
            response
                .headers_mut()
                .insert("should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

/// A Connect error code (the ones this server answers), with its HTTP status for unary calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The request is invalid (400).
    InvalidArgument,
    /// Not found (404).
    NotFound,
    /// Already exists (409).
    AlreadyExists,
    /// A limit (429).
    ResourceExhausted,
    /// The target is not in the state the operation needs (400): input to a command whose
    /// standard input is not open.
    FailedPrecondition,
    /// The operation is not implemented (501).
    Unimplemented,
    /// The sandbox cannot take the work now (503).
    Unavailable,
    /// A timeout (504).
    DeadlineExceeded,
    /// The server failed (500).
    Internal,
}

impl Code {
    /// The code as Connect writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status of a unary answer with this code.
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error of an envd RPC, answered as Connect's JSON error (unary), or carried in a stream's
/// end-of-stream frame ([`crate::connect`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// What went wrong.
    pub message: String,
}

impl ConnectError {
    /// An error with this code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// The error as Connect's JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({ "code": self.code.as_str(), "message": self.message })
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.code.status(), Json(self.to_json())).into_response()
    }
}

/// envd traffic for a sandbox that is not there for the caller (unknown, gone, or a token that
/// is not its own): what E2B's edge answers, 502, which the SDKs read as "not running".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxNotFound(pub String);

impl IntoResponse for SandboxNotFound {
    fn into_response(self) -> Response {
        let body = json!({
            "sandboxId": shown(&self.0),
            "message": "The sandbox was not found",
            "code": 502,
        });
        (StatusCode::BAD_GATEWAY, Json(body)).into_response()
    }
}

/// At most 128 characters of a request-chosen string, for a message.
pub fn shown(s: &str) -> String {
    s.chars().take(128).collect()
}
