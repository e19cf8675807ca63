//! Forwarding a request to the replica that runs its sandbox ([`crate::replicas`]): the
//! request goes as it came (method, path, query, headers, its body streamed), marked with
//! [`HOP`], and the answer comes back as it is sent (a command's stream included). The
//! replica there checks the API key or access token itself. A request already marked is never
//! forwarded again (a replica answers it from what it runs), so two replicas with stale views
//! cannot bounce one between them.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::uri::{PathAndQuery, Uri};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::durable::Replica;
use crate::error::ApiError;

/// The header a forwarded request carries: the incarnation of the replica that forwarded it.
pub const HOP: &str = "x-sandkeeperd-forwarded-by";

/// The longest a connection to another replica takes to open.
pub const CONNECT: Duration = Duration::from_secs(5);

/// The longest a forwarded request waits for the head of its answer (a replica that is
/// stopped still accepts connections, and would hold the request for ever): a command's
/// stream starts at once, and a pause or resume ends well within it. An upload's answer comes
/// only once the client sent it all, so an upload waits as long as the client takes.
pub const ANSWER: Duration = Duration::from_secs(60);

/// Headers of one connection, not of the request (RFC 9110 §7.6.1), and `host`, which is
/// the replica's own: never passed on.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The client the replicas talk to each other with (HTTP/1.1, connections kept and reused).
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, Body>,
    me: u32,
}

impl Forwarder {
    /// A forwarder for the replica of incarnation `me`.
    pub fn new(me: u32) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT));
        Forwarder {
            client: Client::builder(TokioExecutor::new()).build(connector),
            me,
        }
    }

    /// Sends `request` to `to` and answers what it answers; 502 naming the replica when it
    /// cannot be reached.
    pub async fn forward(&self, to: &Replica, request: Request) -> Response {
        let (mut parts, body) = request.into_parts();
        let uri = match target(&to.url, parts.uri.path_and_query()) {
            Ok(uri) => uri,
            Err(e) => return e.into_response(),
        };
        for name in HOP_BY_HOP {
            parts.headers.remove(name);
        }
        parts.headers.insert(
            HeaderName::from_static(HOP),
            HeaderValue::from(u64::from(self.me)),
        );
        let upload = parts.method == axum::http::Method::POST && parts.uri.path() == "/files";
        parts.uri = uri;
        parts.version = axum::http::Version::HTTP_11;
        tracing::debug!(to = %to.url, incarnation = to.incarnation, "forwarded to the sandbox's replica");
        let sent = self.client.request(Request::from_parts(parts, body));
        let answered = if upload {
            sent.await
        } else {
            match tokio::time::timeout(ANSWER, sent).await {
                Ok(answered) => answered,
                Err(_) => {
                    return ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        format!(
                            "the replica that runs this sandbox ({}) did not answer within {} s",
                            to.url,
                            ANSWER.as_secs()
                        ),
                    )
                    .into_response()
                }
            }
        };
        match answered {
            Ok(answer) => {
                let (mut parts, body) = answer.into_parts();
                for name in HOP_BY_HOP {
                    parts.headers.remove(name);
                }
                Response::from_parts(parts, Body::new(body))
            }
            Err(e) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!(
                    "the replica that runs this sandbox ({}) did not answer: {e}",
                    to.url
                ),
            )
            .into_response(),
        }
    }
}

/// `base` (a replica's URL) with the request's path and query.
fn target(base: &str, path: Option<&PathAndQuery>) -> Result<Uri, ApiError> {
    let base = base.trim_end_matches('/');
    let path = path.map_or("/", PathAndQuery::as_str);
    format!("{base}{path}")
        .parse()
        .map_err(|e| ApiError::internal(format!("a replica's URL {base:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_keeps_the_path_and_query() {
        let pq: PathAndQuery = "/files?path=/home/user/a%20b&username=user"
            .parse()
            .unwrap();
        assert_eq!(
            target("http://127.0.0.1:9/", Some(&pq))
                .unwrap()
                .to_string(),
            "http://127.0.0.1:9/files?path=/home/user/a%20b&username=user"
        );
        assert_eq!(
            target("http://127.0.0.1:9", None).unwrap().to_string(),
            "http://127.0.0.1:9/"
        );
        assert!(target("not a url", Some(&pq)).is_err());
    }
}
