//! The routing layer (`--fleet`, [`crate::replicas`]): a request that names a sandbox this
//! replica does not run is forwarded to the replica that runs it, or answered here (paused,
//! or unknown). A request names its sandbox by its REST path (`/sandboxes/{id}…`,
//! `/v2/sandboxes/{id}…`) or, for envd, by the `E2b-Sandbox-Id` header; a signed `/files` URL
//! names none, and goes to the sandbox whose access token made its signature (found in the
//! table when no sandbox here made it). A request another replica forwarded ([`HOP`]) is
//! answered here whatever the table says (an envd request for an interrupted sandbox held
//! here, [`crate::durable::Record::held_on`], first continues it). A REST request answered
//! here with 409 because another replica took its paused sandbox meanwhile (two connects
//! racing) is sent to that replica after all.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::envd::signed::{Operation, Signed};
use crate::forward::{Forwarder, HOP};
use crate::server::AppState;

/// The layer: see the module docs.
pub async fn layer(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let Some(forwarder) = app.forwarder.clone() else {
        return next.run(request).await;
    };
    let (id, data_plane, signer) = match sandbox_named(&request) {
        Some((id, data_plane)) => (id, data_plane, None),
        None => match signed_elsewhere(&app, signed_files(&request)).await {
            Some((id, token)) => (id, true, Some(token)),
            None => return next.run(request).await,
        },
    };
    if data_plane {
        // A resume here under way (this replica won the sandbox, and the request may have been
        // sent here by the one that lost it): the request waits for it, not refused meanwhile.
        app.registry.settled(&id).await;
    }
    let hop = request.headers().contains_key(HOP);
    if hop && !data_plane {
        return next.run(request).await;
    }
    if app.registry.runs_here(&id) {
        return if data_plane {
            next.run(request).await
        } else {
            here_or_moved(&app, &forwarder, &id, request, next).await
        };
    }
    // An envd request's access token (a signed URL's proves its signer's): an interrupted
    // sandbox is resumed only for its own.
    let token = data_plane.then(|| {
        signer.unwrap_or_else(|| {
            request
                .headers()
                .get("x-access-token")
                .map(|v| v.as_bytes().to_vec())
                .unwrap_or_default()
        })
    });
    match app.registry.route(&id, token.as_deref()).await {
        Ok(None) if token.is_none() => here_or_moved(&app, &forwarder, &id, request, next).await,
        Ok(None) => next.run(request).await,
        // Forwarded here once already: answered here, never sent on.
        Ok(Some(_)) if hop => next.run(request).await,
        Ok(Some(replica)) => forwarder.forward(&replica, request).await,
        Err(e) => e.into_response(),
    }
}

/// A REST request for a sandbox, answered here; when the answer is 409 and the sandbox now runs
/// on another replica, sent there after all: a connect that lost the race for a paused sandbox
/// to another replica, or a kill or pause on a replica whose lease had lapsed while another
/// took the sandbox over. Its body (bounded JSON) is kept for that.
async fn here_or_moved(
    app: &AppState,
    forwarder: &Forwarder,
    id: &str,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match crate::body::read(&parts.headers, body, app.limits.json_body).await {
        Ok(bytes) => bytes,
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let answer = next
        .run(Request::from_parts(
            parts.clone(),
            Body::from(bytes.clone()),
        ))
        .await;
    if answer.status() != StatusCode::CONFLICT {
        return answer;
    }
    match app.registry.route(id, None).await {
        Ok(Some(replica)) => {
            forwarder
                .forward(&replica, Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        _ => answer,
    }
}

/// What a signed `/files` request (no sandbox header, a signature in its query) carries, and
/// for what.
fn signed_files(request: &Request) -> Option<(Signed, Operation)> {
    if request.uri().path() != "/files" || request.headers().contains_key("e2b-sandbox-id") {
        return None;
    }
    let op = match *request.method() {
        axum::http::Method::GET => Operation::Read,
        axum::http::Method::POST => Operation::Write,
        _ => return None,
    };
    Some((Signed::of_query(request.uri().query())?, op))
}

/// The sandbox in the table whose access token made a signed request's signature, with that
/// token, when no sandbox running here made it. The request's own handler answers the rest (a
/// signer here, or none: 401).
async fn signed_elsewhere(
    app: &AppState,
    signed: Option<(Signed, Operation)>,
) -> Option<(String, Vec<u8>)> {
    let (signed, op) = signed?;
    if app
        .registry
        .all()
        .iter()
        .any(|s| !s.is_paused() && signed.by(op, s.token()))
    {
        return None;
    }
    app.registry.signed_by(&signed, op).await
}

/// The sandbox id a request names, if any (checked later, by the table and the handlers), and
/// whether it is envd's (by header) rather than the REST API's (by path).
fn sandbox_named(request: &Request) -> Option<(String, bool)> {
    if let Some(id) = request.headers().get("e2b-sandbox-id") {
        return id.to_str().ok().map(|id| (id.to_string(), true));
    }
    let path = request.uri().path();
    let rest = path
        .strip_prefix("/v2/sandboxes/")
        .or_else(|| path.strip_prefix("/sandboxes/"))?;
    let id = rest.split('/').next().unwrap_or("");
    (!id.is_empty()).then(|| (id.to_string(), false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn named(uri: &str, header: Option<&str>) -> Option<String> {
        let mut request = Request::builder().uri(uri);
        if let Some(id) = header {
            request = request.header("e2b-sandbox-id", id);
        }
        sandbox_named(&request.body(Body::empty()).unwrap()).map(|(id, _)| id)
    }

    #[test]
    fn a_request_names_its_sandbox_by_path_or_header() {
        let x = Some("sbx0123456789abcdef0123".to_string());
        assert_eq!(named("/sandboxes/sbx0123456789abcdef0123", None), x);
        assert_eq!(named("/sandboxes/sbx0123456789abcdef0123/pause", None), x);
        assert_eq!(
            named("/v2/sandboxes/sbx0123456789abcdef0123/connect", None),
            x
        );
        assert_eq!(
            named("/process.Process/Start", Some("sbx0123456789abcdef0123")),
            x
        );
        assert_eq!(named("/sandboxes", None), None);
        assert_eq!(named("/v2/sandboxes?limit=3", None), None);
        assert_eq!(named("/files?signature=x", None), None);
        assert_eq!(named("/metrics", None), None);
    }
}
