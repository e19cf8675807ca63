//! envd's directory watches (`filesystem.Filesystem/{WatchDir, CreateWatcher,
//! GetWatcherEvents, RemoveWatcher}`), by polling: every [`POLL`] a watch lists its directory
//! (recursively when asked) through the sandbox's keeper call and reports the difference from
//! its last listing ([`super::watchers::diff`]). So it works alike on every backend, and sees
//! what a listing shows: creates, removes, size changes; not a rewrite of equal size, a chmod,
//! nor a rename as one. Each listing holds the sandbox's lease only while it lists, never
//! across a sleep, so a watch never holds up a pause or a kill; a pause or kill ends it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandkeeper_tokio::{Entry, EntryKind, EntryMeta, OpError, WorkPath};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::watchers::{Change, Queue, Seen, Snapshot};
use crate::connect;
use crate::error::{Code, ConnectError};
use crate::paths;
use crate::registry::Sandbox;

/// How long a watch sleeps between listings: short enough that a client polling
/// `GetWatcherEvents` right after a write sees it within a fraction of a second, long enough
/// that [`super::watchers::MAX_WATCHERS`] watches of a sandbox keep its keeper call mostly
/// idle (each listing is a backend call: on Kubernetes a command in the pod).
pub const POLL: Duration = Duration::from_millis(150);

/// The longest `GetWatcherEvents` waits for a listing made after it was asked: a directory
/// that takes longer to list is answered with what is queued.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The most entries one watch lists (as `ListDir`'s): a larger tree ends the watch with
/// `resource_exhausted`, rather than the server holding and diffing it every [`POLL`].
pub const MAX_ENTRIES: usize = super::filesystem::MAX_ENTRIES;

/// How deep a recursive watch looks below its directory: deeper entries are not watched.
pub const MAX_DEPTH: usize = 32;

/// What a watch asks for (`WatchDirRequest`, `CreateWatcherRequest`).
#[derive(Deserialize)]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry", alias = "include_entry")]
    include_entry: bool,
}

/// `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Deserialize)]
struct WatcherRequest {
    #[serde(rename = "watcherId", alias = "watcher_id")]
    watcher_id: String,
}

/// One watch's directory and how it is listed.
struct Spec {
    dir: WorkPath,
    recursive: bool,
    include_entry: bool,
}

/// Why a watch stopped listing.
enum Halt {
    /// It was removed, or its sandbox paused or killed.
    Stopped,
    /// Its listing failed (its directory went, or was too large): it ends with this error.
    Failed(ConnectError),
}

/// Lists a watched directory, and says what changed since the last time.
struct Poller {
    sandbox: Arc<Sandbox>,
    spec: Spec,
    stop: watch::Receiver<bool>,
    before: Snapshot,
    /// A `CreateWatcher` watch's queue: `GetWatcherEvents` may ask for a listing now.
    queue: Option<Arc<Queue>>,
}

impl Poller {
    /// Sleeps [`POLL`] (or until asked to list now, or stopped), lists again, and answers what
    /// changed.
    async fn next(&mut self) -> Result<Vec<Change>, Halt> {
        let poked = async {
            match &self.queue {
                Some(queue) => queue.poked().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = poked => {}
            () = stopped(&mut self.stop) => return Err(Halt::Stopped),
        }
        if let Some(queue) = &self.queue {
            queue.listing();
        }
        let after = snapshot(&self.sandbox, &self.spec, &mut self.stop).await?;
        let changes = super::watchers::diff(&self.before, &after);
        self.before = after;
        Ok(changes)
    }
}

/// The listing of a watched directory (to [`MAX_DEPTH`] when recursive, at most
/// [`MAX_ENTRIES`]), taking the sandbox's lease for each directory's `list` only. Only
/// directories are descended into; a symlink is an entry, never followed (the backend's
/// `list` confines every path to the workspace). A subdirectory gone between the listings
/// of it and its parent is skipped; the watched directory gone fails the watch.
async fn snapshot(
    sandbox: &Sandbox,
    spec: &Spec,
    stop: &mut watch::Receiver<bool>,
) -> Result<Snapshot, Halt> {
    let mut seen = Snapshot::new();
    let mut pending = vec![(spec.dir.clone(), String::new(), 0usize)];
    while let Some((dir, prefix, depth)) = pending.pop() {
        let listed = match list(sandbox, &dir, stop).await {
            Ok(listed) => listed,
            Err(Halt::Failed(e)) if depth > 0 && gone(&e) => continue,
            Err(halt) => return Err(halt),
        };
        for e in listed {
            let name = format!("{prefix}{}", e.name);
            if e.kind == EntryKind::Dir && spec.recursive && depth + 1 < MAX_DEPTH {
                let inner = paths::join(&dir, &e.name).map_err(Halt::Failed)?;
                pending.push((inner, format!("{name}/"), depth + 1));
            }
            seen.insert(
                name,
                Seen {
                    kind: e.kind,
                    size: e.size,
                    modified: e.meta.modified,
                    mode: e.meta.mode,
                },
            );
            if seen.len() > MAX_ENTRIES {
                return Err(Halt::Failed(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("a watch sees at most {MAX_ENTRIES} entries"),
                )));
            }
        }
    }
    Ok(seen)
}

/// Returns once the watch is to stop (told so, or its sender gone with its entry).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Whether a subdirectory's listing failed because it went (or became a file) meanwhile.
fn gone(e: &ConnectError) -> bool {
    matches!(e.code, Code::NotFound | Code::InvalidArgument)
}

/// One directory's entries, the sandbox's lease held for the `list` only.
async fn list(
    sandbox: &Sandbox,
    dir: &WorkPath,
    stop: &mut watch::Receiver<bool>,
) -> Result<Vec<Entry>, Halt> {
    let lease = tokio::select! {
        lease = sandbox.lease() => lease.ok_or(Halt::Stopped)?,
        () = stopped(stop) => return Err(Halt::Stopped),
    };
    let listed = lease.work().list(dir.as_str()).await;
    drop(lease);
    listed.map_err(|e| match e {
        OpError::SandboxGone { .. } | OpError::Stopped { .. } => Halt::Stopped,
        e => Halt::Failed(super::op_error(e)),
    })
}

/// Starts watching: the first listing (a missing directory answers `not_found`, a file
/// `invalid_argument`), then the watch registered with its sandbox.
async fn begin(
    sandbox: &Arc<Sandbox>,
    request: WatchRequest,
    queue: Option<Arc<Queue>>,
) -> Result<(String, Poller), ConnectError> {
    let spec = Spec {
        dir: paths::to_work(&request.path)?,
        recursive: request.recursive,
        include_entry: request.include_entry,
    };
    let id = watcher_id()?;
    let added = sandbox.watchers.add(id.clone(), queue.clone())?;
    let mut stop = added.stop;
    let first = match snapshot(sandbox, &spec, &mut stop).await {
        Ok(first) => first,
        Err(halt) => {
            sandbox.watchers.remove(&id);
            return Err(match halt {
                Halt::Failed(e) => e,
                Halt::Stopped => ConnectError::new(Code::Unavailable, "The sandbox was not found"),
            });
        }
    };
    let poller = Poller {
        sandbox: sandbox.clone(),
        spec,
        stop,
        before: first,
        queue,
    };
    Ok((id, poller))
}

/// A new watcher's id: 16 random bytes as hex (unguessable; only its sandbox knows it).
fn watcher_id() -> Result<String, ConnectError> {
    crate::registry::random_hex(16).map_err(|e| ConnectError::new(Code::Internal, e.message))
}

/// A change as a `FilesystemEvent`, with its entry when asked for and it is there.
fn event_json(spec: &Spec, change: &Change) -> Value {
    let mut event = json!({"name": change.name, "type": change.kind.as_json()});
    if let (true, Some(now)) = (spec.include_entry, change.now) {
        if let Ok(path) = paths::join(&spec.dir, &change.name) {
            let name = change.name.rsplit('/').next().unwrap_or(&change.name);
            let entry = Entry {
                name: name.to_string(),
                kind: now.kind,
                size: now.size,
                meta: EntryMeta {
                    mode: now.mode,
                    modified: now.modified,
                    ..EntryMeta::default()
                },
            };
            event["entry"] = super::filesystem::entry_json(&path, &entry);
        }
    }
    event
}

/// `CreateWatcher`: a watch whose events queue for `GetWatcherEvents`, polled until
/// `RemoveWatcher` or its sandbox is paused or killed.
pub async fn create(sandbox: &Arc<Sandbox>, bytes: &[u8]) -> Response {
    let request: WatchRequest = match connect::decode(bytes) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let queue = Arc::new(Queue::default());
    let (id, mut poller) = match begin(sandbox, request, Some(queue.clone())).await {
        Ok(begun) => begun,
        Err(e) => return e.into_response(),
    };
    tokio::spawn(async move {
        loop {
            match poller.next().await {
                Ok(changes) => queue.push(changes),
                Err(Halt::Stopped) => break,
                Err(Halt::Failed(e)) => {
                    queue.end(e);
                    break;
                }
            }
        }
    });
    Json(json!({ "watcherId": id })).into_response()
}

/// `GetWatcherEvents`: what the watch saw since it was last asked, up to a listing made after
/// this request came ([`Queue::settle`], at most [`SETTLE`]): a change made before the request
/// is in its answer.
pub async fn events(sandbox: &Sandbox, bytes: &[u8]) -> Response {
    let request = match connect::decode::<WatcherRequest>(bytes) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match sandbox.watchers.queue(&request.watcher_id) {
        Ok(queue) => queue.settle(SETTLE).await,
        Err(e) => return e.into_response(),
    }
    match sandbox.watchers.take(&request.watcher_id) {
        Ok(changes) => {
            let events: Vec<Value> = changes
                .iter()
                .map(|c| json!({"name": c.name, "type": c.kind.as_json()}))
                .collect();
            Json(json!({ "events": events })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `RemoveWatcher`: ends the watch (`not_found` for no such watch).
pub fn remove(sandbox: &Sandbox, bytes: &[u8]) -> Response {
    let answer = connect::decode::<WatcherRequest>(bytes).and_then(|r| {
        if sandbox.watchers.remove(&r.watcher_id) {
            Ok(json!({}))
        } else {
            Err(super::watchers::no_such_watcher())
        }
    });
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `WatchDir`: the `start` event, then each event as it is seen, and a `keepalive` as often
/// as the client's `Keepalive-Ping-Interval` asks; it ends when the client goes away, broken
/// off when the sandbox is paused or killed (as a command's stream), and with the error when
/// the watched directory goes.
pub async fn stream(sandbox: &Arc<Sandbox>, headers: &HeaderMap, bytes: &[u8]) -> Response {
    let request: WatchRequest = match connect::single_message(bytes) {
        Ok(r) => r,
        Err(e) => return super::process::stream_error(&e),
    };
    let (id, mut poller) = match begin(sandbox, request, None).await {
        Ok(begun) => begun,
        Err(e) => return super::process::stream_error(&e),
    };
    let keepalive = super::process::keepalive_interval(headers);
    let (tx, rx) = mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    let sandbox = sandbox.clone();
    tokio::spawn(async move {
        let _ = tx.send(Ok(connect::message(&json!({"start": {}})))).await;
        let mut last_sent = Instant::now();
        let last = loop {
            if tx.is_closed() {
                break None;
            }
            let changes = match poller.next().await {
                Ok(changes) => changes,
                Err(Halt::Stopped) => break Some(Err(super::process::broken_off())),
                Err(Halt::Failed(e)) => break Some(Ok(connect::end_stream(Some(&e)))),
            };
            for c in &changes {
                let event = json!({"filesystem": event_json(&poller.spec, c)});
                let _ = tx.send(Ok(connect::message(&event))).await;
                last_sent = Instant::now();
            }
            if keepalive.is_some_and(|k| last_sent.elapsed() >= k) {
                let _ = tx
                    .send(Ok(connect::message(&json!({"keepalive": {}}))))
                    .await;
                last_sent = Instant::now();
            }
        };
        sandbox.watchers.remove(&id);
        if let Some(last) = last {
            let _ = tx.send(last).await;
        }
    });
    super::process::stream_response(Body::from_stream(ReceiverStream::new(rx)))
}
