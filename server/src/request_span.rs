//! One span around every request: `request`, with its method, its path (never its query, which
//! carries signed URLs' signatures), the sandbox an envd request names, the team once its key
//! or token is checked ([`record_team`]) and, at its end, the status (with a debug event,
//! `answered`, that shows it). The spans of the work a
//! request does (create, pause, resume, kill, a command) are its children. Values that come
//! from the request are cut to [`MAX_FIELD`] characters and written escaped (`?`), so a
//! hostile path or header neither floods the log nor forges lines in it.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The most characters of a request's path or sandbox id a span keeps.
pub const MAX_FIELD: usize = 128;

/// Runs the request inside its span, and records its status there.
pub async fn layer(request: Request, next: Next) -> Response {
    let sandbox = request
        .headers()
        .get("e2b-sandbox-id")
        .map(|v| cut(&String::from_utf8_lossy(v.as_bytes())));
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = ?cut(request.uri().path()),
        sandbox = ?sandbox,
        team = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let response = next.run(request).instrument(span.clone()).await;
    span.record("status", response.status().as_u16());
    span.in_scope(|| tracing::debug!("answered"));
    response
}

/// Records the team a request acts for in its span (called where its key or sandbox token
/// was checked).
pub fn record_team(team: &crate::auth::Team) {
    tracing::Span::current().record("team", tracing::field::display(team));
}

fn cut(s: &str) -> String {
    s.chars().take(MAX_FIELD).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_cut_at_the_bound() {
        let long = "x".repeat(10 * MAX_FIELD);
        assert_eq!(cut(&long).chars().count(), MAX_FIELD);
        assert_eq!(cut("/sandboxes"), "/sandboxes");
        assert_eq!(cut("é".repeat(200).as_str()).chars().count(), MAX_FIELD);
    }
}
