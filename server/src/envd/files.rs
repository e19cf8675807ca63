//! envd's file transfer: `GET /files?path=` (the file's bytes) and `POST /files` (multipart
//! parts named `file`, to the query's `path` or else each to its filename, or one
//! `application/octet-stream` body to `?path=`), through the sandbox's keeper call; the
//! sandbox named by the headers, or by a signed URL (`signed.rs`). An upload is read whole, within its
//! bound (413 beyond), and every destination checked, before anything is written; each file is
//! written atomically (a reader sees the old file or the new one).

use std::sync::Arc;

use axum::extract::{FromRequest, Multipart, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use sandkeeper_tokio::{OpError, WorkPath};
use serde_json::{json, Value};

use super::signed::{self, Operation};
use crate::error::{ApiError, SandboxNotFound};
use crate::paths;
use crate::registry::Sandbox;
use crate::server::AppState;

/// Files one multipart upload may carry.
pub const MAX_FILES: usize = 256;

/// Why a transfer failed: E2B's `{code, message}`, or the sandbox gone (502).
pub enum FilesError {
    /// E2B's `{code, message}`.
    Api(ApiError),
    /// The sandbox is not there (502).
    Gone(SandboxNotFound),
}

impl From<ApiError> for FilesError {
    fn from(e: ApiError) -> Self {
        FilesError::Api(e)
    }
}

impl From<SandboxNotFound> for FilesError {
    fn from(e: SandboxNotFound) -> Self {
        FilesError::Gone(e)
    }
}

impl From<super::Refused> for FilesError {
    fn from(e: super::Refused) -> Self {
        match e {
            super::Refused::NotFound(e) => FilesError::Gone(e),
            super::Refused::RateLimited(e) => FilesError::Api(e),
        }
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        match self {
            FilesError::Api(e) => e.into_response(),
            FilesError::Gone(e) => e.into_response(),
        }
    }
}

/// An operation's error as `/files` answers it.
fn op_error(id: &str, e: OpError) -> FilesError {
    let status = match &e {
        OpError::NotFound { .. } => StatusCode::NOT_FOUND,
        OpError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        OpError::QuotaExceeded { .. } => StatusCode::INSUFFICIENT_STORAGE,
        OpError::Backend { .. } | OpError::Keeper(_) => StatusCode::INTERNAL_SERVER_ERROR,
        OpError::SandboxGone { .. }
        | OpError::Stopped { .. }
        | OpError::Fenced { .. }
        | OpError::Unbound { .. }
        | OpError::NoActiveSandbox { .. } => {
            return FilesError::Gone(SandboxNotFound(id.to_string()));
        }
        _ => StatusCode::BAD_REQUEST,
    };
    FilesError::Api(ApiError::new(status, e.to_string()))
}

/// The `path` of the query, as a workspace path.
fn query_path(query: Option<&str>) -> Result<Option<WorkPath>, ApiError> {
    let found = form_urlencoded::parse(query.unwrap_or("").as_bytes()).find(|(k, _)| k == "path");
    match found {
        None => Ok(None),
        Some((_, p)) => paths::to_work(&p)
            .map(Some)
            .map_err(|e| ApiError::bad_request(e.message)),
    }
}

/// The sandbox a transfer is for: named by its headers (with its token), else by a signed
/// URL's signature.
fn target(
    app: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
    op: Operation,
) -> Result<Arc<Sandbox>, FilesError> {
    if headers.contains_key("e2b-sandbox-id") {
        return Ok(super::sandbox(app, headers)?);
    }
    match signed::sandbox(&app.registry, query, op)? {
        Some(sandbox) => {
            crate::request_span::record_team(&sandbox.team);
            app.admit(&sandbox.team)?;
            Ok(sandbox)
        }
        None => Err(SandboxNotFound(String::new()).into()),
    }
}

/// `GET /files?path=`: the file's bytes.
pub async fn download(
    State(app): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, FilesError> {
    let sandbox = target(&app, &headers, query.as_deref(), Operation::Read)?;
    let path =
        query_path(query.as_deref())?.ok_or_else(|| ApiError::bad_request("missing path"))?;
    let lease = sandbox
        .lease()
        .await
        .ok_or_else(|| FilesError::Gone(SandboxNotFound(sandbox.id.clone())))?;
    let bytes = lease
        .work()
        .read_capped(path.as_str(), app.limits.download)
        .await
        .map_err(|e| op_error(&sandbox.id, e))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `POST /files`: writes the uploaded files; answers what was written.
pub async fn upload(
    state: State<AppState>,
    query: RawQuery,
    request: Request,
) -> Result<Json<Value>, FilesError> {
    let metrics = state.registry.metrics().clone();
    let uploaded = upload_now(state, query, request).await;
    let outcome = match &uploaded {
        Ok(_) => "ok",
        Err(FilesError::Gone(_)) => "gone",
        Err(FilesError::Api(e)) if e.status == StatusCode::PAYLOAD_TOO_LARGE => "too-large",
        Err(FilesError::Api(e)) if e.status.is_client_error() => "refused",
        Err(FilesError::Api(_)) => "error",
    };
    metrics.count(&metrics.uploads, outcome);
    uploaded
}

async fn upload_now(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Json<Value>, FilesError> {
    let headers = request.headers().clone();
    let sandbox = target(&app, &headers, query.as_deref(), Operation::Write)?;
    let gzip = match headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()) {
        None | Some(b"identity") => false,
        Some(b"gzip") => true,
        Some(_) => {
            return Err(ApiError::bad_request("only gzip uploads are supported").into());
        }
    };
    let target = query_path(query.as_deref())?;
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if gzip && multipart {
        return Err(ApiError::bad_request("gzip is for application/octet-stream uploads").into());
    }
    let files = if multipart {
        let form = Multipart::from_request(request, &app)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        parts(form, target, app.limits.upload).await?
    } else {
        let path = target.ok_or_else(|| ApiError::bad_request("missing path"))?;
        let bytes = crate::body::read(&headers, request.into_body(), app.limits.upload)
            .await
            .map_err(ApiError::from)?;
        let bytes = if gzip {
            gunzip(&bytes, app.limits.upload)?
        } else {
            bytes
        };
        vec![(path, bytes)]
    };
    for (path, _) in &files {
        path.writable().map_err(|e| op_error(&sandbox.id, e))?;
    }
    let lease = sandbox
        .lease()
        .await
        .ok_or_else(|| FilesError::Gone(SandboxNotFound(sandbox.id.clone())))?;
    let work = lease.work();
    let mut written = Vec::with_capacity(files.len());
    for (path, bytes) in files {
        work.write(path.as_str(), bytes.to_vec())
            .await
            .map_err(|e| op_error(&sandbox.id, e))?;
        let name = paths::split(&path).map(|(_, n)| n).unwrap_or_default();
        written.push(json!({"name": name, "type": "file", "path": paths::to_e2b(&path)}));
    }
    Ok(Json(Value::Array(written)))
}

/// A gzip body decompressed, at most `limit` bytes of it (413 beyond: no bomb is inflated past
/// the bound).
fn gunzip(bytes: &[u8], limit: usize) -> Result<Bytes, ApiError> {
    use std::io::Read;
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    flate2::read::GzDecoder::new(bytes)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::bad_request(format!("invalid gzip body: {e}")))?;
    if out.len() > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(Bytes::from(out))
}

/// Every `file` part, read whole within `limit` bytes in all; a part's filename is its
/// destination (else the query's `path`).
async fn parts(
    mut form: Multipart,
    target: Option<WorkPath>,
    limit: usize,
) -> Result<Vec<(WorkPath, Bytes)>, FilesError> {
    let mut files = Vec::new();
    let mut total = 0usize;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(multipart_error(&e, limit).into()),
        };
        if field.name() != Some("file") {
            continue;
        }
        // The query's path names the one file (an upload URL's, or the SDK's single write);
        // without it, each part's filename is its destination (the SDK's `write_files`).
        let path = match (&target, field.file_name().filter(|n| !n.is_empty())) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => {
                paths::to_work(name).map_err(|e| ApiError::bad_request(e.message))?
            }
            (None, None) => {
                return Err(
                    ApiError::bad_request("a file part without a filename, and no path").into(),
                );
            }
        };
        let bytes = field
            .bytes()
            .await
            .map_err(|e| multipart_error(&e, limit))?;
        total = total.saturating_add(bytes.len());
        if total > limit {
            return Err(ApiError::too_large(limit).into());
        }
        files.push((path, bytes));
        if files.len() > MAX_FILES {
            return Err(
                ApiError::bad_request(format!("at most {MAX_FILES} files per upload")).into(),
            );
        }
    }
    if files.is_empty() {
        return Err(ApiError::bad_request("no `file` part in the upload").into());
    }
    if target.is_some() && files.len() > 1 {
        return Err(ApiError::bad_request("several files to the one path of the query").into());
    }
    Ok(files)
}

fn multipart_error(e: &axum::extract::multipart::MultipartError, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(limit)
    } else {
        ApiError::bad_request(format!("invalid multipart upload: {}", e.body_text()))
    }
}
