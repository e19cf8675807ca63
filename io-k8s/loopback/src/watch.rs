//! Watch streams: newline-delimited `{"type", "object"}` events over a chunked response, with
//! selector transitions (an object that stops matching is sent as DELETED, with its previous
//! content), 410 Gone as an ERROR event for expired resourceVersions, `timeoutSeconds`, the
//! watch-drop fault switch, and the held-events fault (`Fault::HoldEvents`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::server::{param, Body, Query, Shared};
use crate::status::ApiError;
use crate::store::{Event, EventType};

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

struct Filter {
    rt: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, o: &Value) -> bool {
        self.labels.matches(o) && self.fields.matches(o)
    }

    /// The event a watcher with this filter sees for a change, if any. An object that stops
    /// matching is sent as DELETED with its *previous* content (which matched) at the change's
    /// resourceVersion, as the API server's watch cache does (`cacheWatcher.convertToWatchEvent`):
    /// a watcher cannot tell from the event alone whether the object was removed or only
    /// relabelled.
    fn translate(&self, ev: &Event) -> Option<Bytes> {
        if ev.resource != self.rt || self.namespace.as_deref().is_some_and(|n| n != ev.namespace) {
            return None;
        }
        let now = self.matches(&ev.object);
        let kind = match (ev.kind, &ev.previous) {
            (EventType::Modified, Some(prev)) => match (self.matches(prev), now) {
                (true, true) => "MODIFIED",
                (false, true) => "ADDED",
                (true, false) => {
                    let mut left = prev.clone();
                    left["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                    return Some(line("DELETED", &left));
                }
                (false, false) => return None,
            },
            (k, _) if now => k.as_str(),
            _ => return None,
        };
        Some(line(kind, &ev.object))
    }
}

/// Starts a watch response. With `hold`, live events wait for the next
/// `Faults::release_held_events`.
pub(crate) fn serve(
    shared: Arc<Shared>,
    rt: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    q: &Query,
    hold: bool,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter {
        rt,
        namespace,
        labels,
        fields,
    };
    let rv_param = param(q, "resourceVersion").unwrap_or("");
    let timeout = param(q, "timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut initial: Vec<Bytes> = Vec::new();
    let subscription = if rv_param.is_empty() || rv_param == "0" {
        let (items, rv) = shared.store.list(
            &filter.rt,
            filter.namespace.as_deref(),
            &filter.labels,
            &filter.fields,
        );
        initial.extend(items.iter().map(|o| line("ADDED", o)));
        shared.store.watch_from(rv)
    } else {
        let rv = rv_param
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv_param}")))?;
        shared.store.watch_from(rv)
    };
    shared.watches_opened.send_modify(|n| *n += 1);
    if subscription.is_err() {
        shared.watches_expired.send_modify(|n| *n += 1);
    }
    let mut epoch = shared.faults.watch_epoch();
    epoch.mark_unchanged();
    let mut releases = shared.faults.releases();
    releases.mark_unchanged();
    let mut held = hold;
    tokio::spawn(async move {
        let (backlog, mut live) = match subscription {
            Ok(s) => s,
            Err(e) => {
                // As the real server does: 200 with one ERROR event carrying the 410 Status.
                let _ = tx.send(line("ERROR", &e.to_status())).await;
                return;
            }
        };
        let mut last_rv = 0;
        for b in initial {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        for ev in backlog {
            last_rv = ev.rv;
            if let Some(b) = filter.translate(&ev) {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                // A dropped watch ends before it sends anything newer (tests rely on it).
                biased;
                _ = epoch.changed() => return,
                ev = live.recv() => match ev {
                    Ok(ev) if ev.rv <= last_rv => {}
                    Ok(ev) => {
                        last_rv = ev.rv;
                        if let Some(b) = filter.translate(&ev) {
                            if held {
                                // Order is kept: nothing newer is read until this one is sent.
                                tokio::select! {
                                    _ = releases.changed() => held = false,
                                    _ = tx.closed() => return,
                                }
                            }
                            if tx.send(b).await.is_err() { return; }
                        }
                    }
                    // A watcher too slow for the event rate is closed; it re-watches.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
