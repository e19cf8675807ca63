//! envd, the data plane inside a sandbox: `/health`, the process and filesystem services
//! (Connect, JSON codec) and file transfer on `/files`. One origin serves it beside the REST
//! API: a request names its sandbox by the `E2b-Sandbox-Id` header and proves its right to it
//! by the sandbox's `X-Access-Token` (the one create and connect answered). An unknown
//! sandbox, a gone one, and a token that is not the sandbox's own all answer the same 502 "The
//! sandbox was not found", so another team's sandbox ids reveal nothing.
//!
//! Every operation goes through the sandbox's keeper call ([`crate::registry::Lease`]).

pub mod files;
pub mod filesystem;
mod input;
pub mod process;
pub mod processes;
pub mod signed;
pub mod watch;
pub mod watchers;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sandkeeper_tokio::OpError;

use crate::error::{ApiError, Code, ConnectError, SandboxNotFound};
use crate::registry::{Lease, Sandbox};
use crate::server::AppState;

/// Why an envd request was refused before it did anything.
pub enum Refused {
    /// No sandbox of this id with this token (502, as E2B's edge).
    NotFound(SandboxNotFound),
    /// The sandbox's team is over its request rate (429).
    RateLimited(ApiError),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::NotFound(e) => e.into_response(),
            Refused::RateLimited(e) => e.into_response(),
        }
    }
}

/// The sandbox a request names, if its token is that sandbox's and it runs (a paused one
/// answers as an unknown one, 502, as E2B's edge does for a sandbox it cannot reach), within
/// its team's rate.
pub fn sandbox(app: &AppState, headers: &HeaderMap) -> Result<Arc<Sandbox>, Refused> {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let token = headers
        .get("x-access-token")
        .map(|v| v.as_bytes())
        .unwrap_or(b"");
    match app.registry.any(id) {
        Some(s) if s.token_matches(token) && !s.is_paused() => {
            crate::request_span::record_team(&s.team);
            app.admit(&s.team).map_err(Refused::RateLimited)?;
            Ok(s)
        }
        _ => Err(Refused::NotFound(SandboxNotFound(id.to_string()))),
    }
}

/// The sandbox's call for one piece of work, or `unavailable` once it is being killed.
pub async fn lease(sandbox: &Sandbox) -> Result<Lease, ConnectError> {
    sandbox
        .lease()
        .await
        .ok_or_else(|| ConnectError::new(Code::Unavailable, "The sandbox was not found"))
}

/// `GET /health`: 204 while the sandbox is there.
pub async fn health(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<StatusCode, Refused> {
    sandbox(&app, &headers)?;
    Ok(StatusCode::NO_CONTENT)
}

/// An operation's error as Connect's.
pub fn op_error(e: OpError) -> ConnectError {
    let code = match &e {
        OpError::NotFound { .. } => Code::NotFound,
        OpError::InvalidPath { .. }
        | OpError::Escapes { .. }
        | OpError::NotAFile { .. }
        | OpError::NotADirectory { .. }
        | OpError::EmptyArgv
        | OpError::InvalidEnv { .. }
        | OpError::Spawn { .. } => Code::InvalidArgument,
        OpError::Unsupported { .. } => Code::Unimplemented,
        OpError::Timeout { .. } => Code::DeadlineExceeded,
        OpError::TooLarge { .. }
        | OpError::QuotaExceeded { .. }
        | OpError::CpuBudgetSpent { .. } => Code::ResourceExhausted,
        OpError::SandboxGone { .. }
        | OpError::Stopped { .. }
        | OpError::Fenced { .. }
        | OpError::Unbound { .. }
        | OpError::NoActiveSandbox { .. } => {
            return ConnectError::new(Code::Unavailable, "The sandbox was not found");
        }
        OpError::Backend { .. } | OpError::Keeper(_) => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}
