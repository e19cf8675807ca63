//! Request bodies, read within a bound: over it is 413, malformed JSON is 400, both in E2B's
//! error shape. Bodies may come chunked (the SDKs send them so), so the bound is applied while
//! reading, not only to `Content-Length`.

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Over the bound.
    TooLarge(usize),
    /// The connection failed while reading.
    Read(String),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge(limit) => ApiError::too_large(limit),
            BodyError::Read(why) => ApiError::bad_request(format!("reading the body: {why}")),
        }
    }
}

/// The whole body, at most `limit` bytes.
pub async fn read(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge(limit)),
        Err(e) => Err(BodyError::Read(e.to_string())),
    }
}

/// A JSON body of the REST API (an empty body is `{}`).
pub async fn json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = read(headers, body, limit).await?;
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
