//! The directory watches of one sandbox (envd's `WatchDir`, `CreateWatcher`): which are live,
//! what each has queued for `GetWatcherEvents`, and how each is told to stop when it is removed
//! or its sandbox is paused or killed. What a watch sees is the difference of two listings
//! ([`diff`]): the server polls the sandbox's `list`, the same on every backend, rather than
//! asking a kernel for notifications it may not have (a pod's files are not the server's).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sandkeeper_tokio::EntryKind;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::error::{Code, ConnectError};

/// Watches one sandbox may have at once (both kinds together): each polls the sandbox, so they
/// are few. A team's are bounded with its sandboxes (`--sandboxes-per-team` times this).
pub const MAX_WATCHERS: usize = 16;

/// Events a `CreateWatcher` watch keeps until `GetWatcherEvents` takes them: past this the
/// oldest are dropped (a client that does not ask for its events loses the old ones, not the
/// server its memory).
pub const QUEUED_EVENTS: usize = 1024;

/// What a watch knows of one entry: enough to tell it was made, removed, written (its size
/// or modification time changed) or had its mode changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes.
    pub size: u64,
    /// When its content last changed, where the backend reads it.
    pub modified: Option<std::time::SystemTime>,
    /// Its permission bits, where the backend reads them.
    pub mode: Option<u32>,
}

/// One listing of a watched directory: each entry by its path relative to the directory
/// (`a/b` for `b` in subdirectory `a`).
pub type Snapshot = BTreeMap<String, Seen>;

/// What happened to an entry, as envd's `EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// It appeared.
    Create,
    /// Its size or modification time changed (or a new file has content: envd reports the
    /// write after the create).
    Write,
    /// Its permission bits changed.
    Chmod,
    /// It went away.
    Remove,
}

impl EventType {
    /// Its name in protobuf's JSON.
    pub fn as_json(self) -> &'static str {
        match self {
            EventType::Create => "EVENT_TYPE_CREATE",
            EventType::Write => "EVENT_TYPE_WRITE",
            EventType::Remove => "EVENT_TYPE_REMOVE",
            EventType::Chmod => "EVENT_TYPE_CHMOD",
        }
    }
}

/// One event: its entry's path relative to the watched directory, and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The entry's path relative to the watched directory.
    pub name: String,
    /// What happened to it.
    pub kind: EventType,
    /// What it is now (`None` once removed).
    pub now: Option<Seen>,
}

/// The events between two listings, by name: a new entry is created (and written, if it is a
/// file with content), a gone one removed, a file whose size or modification time changed
/// written, an entry whose permission bits changed chmodded, an entry whose kind changed
/// removed and created again. A rewrite within the backend's time resolution that keeps the
/// size is not seen; nor is a rename as one (it shows as a remove and a create).
pub fn diff(before: &Snapshot, after: &Snapshot) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut push = |name: &str, kind, now| {
        changes.push(Change {
            name: name.to_string(),
            kind,
            now,
        })
    };
    for (name, old) in before {
        match after.get(name) {
            None => push(name, EventType::Remove, None),
            Some(new) if new.kind != old.kind => push(name, EventType::Remove, None),
            Some(_) => {}
        }
    }
    for (name, new) in after {
        match before.get(name) {
            Some(old) if old.kind == new.kind => {
                let rewritten = old.size != new.size || old.modified != new.modified;
                if new.kind == EntryKind::File && rewritten {
                    push(name, EventType::Write, Some(*new));
                }
                if old.mode != new.mode {
                    push(name, EventType::Chmod, Some(*new));
                }
            }
            _ => {
                push(name, EventType::Create, Some(*new));
                if new.kind == EntryKind::File && new.size > 0 {
                    push(name, EventType::Write, Some(*new));
                }
            }
        }
    }
    changes
}

/// The events a `CreateWatcher` watch has queued, and how it ended (if it did); and the count
/// of its listings begun and done, so that `GetWatcherEvents` can have one made after it was
/// asked ([`settle`](Queue::settle)).
pub struct Queue {
    inner: Mutex<QueueInner>,
    /// Listings done (each followed by a [`push`](Queue::push)); `u64::MAX` once it ended.
    done: watch::Sender<u64>,
    /// Asks the poller to list now rather than at the end of its interval.
    poke: Notify,
}

#[derive(Default)]
struct QueueInner {
    events: VecDeque<Change>,
    ended: Option<ConnectError>,
    /// Listings begun.
    begun: u64,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            inner: Mutex::default(),
            done: watch::channel(0).0,
            poke: Notify::new(),
        }
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The poller begins a listing.
    pub fn listing(&self) {
        self.lock().begun += 1;
    }

    /// Returns when someone asked for a listing now.
    pub async fn poked(&self) {
        self.poke.notified().await;
    }

    /// Queues what a listing found, dropping the oldest past [`QUEUED_EVENTS`].
    pub fn push(&self, changes: Vec<Change>) {
        let mut inner = self.lock();
        for c in changes {
            if inner.events.len() >= QUEUED_EVENTS {
                inner.events.pop_front();
            }
            inner.events.push_back(c);
        }
        drop(inner);
        self.done.send_modify(|n| *n = n.saturating_add(1));
    }

    /// Records why the watch ended (its poller stopped): answered once its events are taken.
    pub fn end(&self, why: ConnectError) {
        self.lock().ended = Some(why);
        self.done.send_replace(u64::MAX);
    }

    /// Has the poller list now, and waits (at most `bound`) until a listing begun after this
    /// call is queued: what changed before the call is then in the queue, as envd's
    /// notifications would have it. Past `bound` (a large directory), what is queued is
    /// answered. A watch that ended waits for nothing.
    pub async fn settle(&self, bound: Duration) {
        let target = self.lock().begun.saturating_add(1);
        let mut done = self.done.subscribe();
        self.poke.notify_one();
        let _ = tokio::time::timeout(bound, done.wait_for(|n| *n >= target)).await;
    }

    /// Takes what is queued; once none is and the watch ended, why it did.
    fn take(&self) -> Result<Vec<Change>, ConnectError> {
        let mut inner = self.lock();
        if inner.events.is_empty() {
            if let Some(why) = &inner.ended {
                return Err(why.clone());
            }
        }
        Ok(inner.events.drain(..).collect())
    }
}

/// The live watches of one sandbox, by id.
#[derive(Default)]
pub struct Watchers {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    live: HashMap<String, Live>,
    /// Set by [`Watchers::stop_all`]: no watch starts after it (the sandbox is paused or
    /// killed), until [`Watchers::reopen`].
    closed: bool,
}

struct Live {
    /// Told `true` when the watch is to stop.
    stop: watch::Sender<bool>,
    /// Its events, for a `CreateWatcher` watch (`None` for a `WatchDir` stream).
    queue: Option<Arc<Queue>>,
}

/// A watch just added: its poller stops when this turns `true`.
pub struct Added {
    /// Turns `true` when the watch is removed or its sandbox paused or killed.
    pub stop: watch::Receiver<bool>,
}

impl Watchers {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds watch `id` (with `queue` for `CreateWatcher`'s); `resource_exhausted` at
    /// [`MAX_WATCHERS`], `unavailable` once the sandbox is paused or being killed.
    pub fn add(&self, id: String, queue: Option<Arc<Queue>>) -> Result<Added, ConnectError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(ConnectError::new(
                Code::Unavailable,
                "The sandbox was not found",
            ));
        }
        if inner.live.len() >= MAX_WATCHERS {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_WATCHERS} watches per sandbox"),
            ));
        }
        let (stop, stopped) = watch::channel(false);
        inner.live.insert(id, Live { stop, queue });
        Ok(Added { stop: stopped })
    }

    /// Removes watch `id` and stops it; `false` if there is none.
    pub fn remove(&self, id: &str) -> bool {
        match self.lock().live.remove(id) {
            Some(live) => {
                live.stop.send_replace(true);
                true
            }
            None => false,
        }
    }

    /// The queue of `CreateWatcher` watch `id`: `not_found` for no such watch (nor a
    /// `WatchDir` stream's id).
    pub fn queue(&self, id: &str) -> Result<Arc<Queue>, ConnectError> {
        self.lock()
            .live
            .get(id)
            .and_then(|l| l.queue.clone())
            .ok_or_else(no_such_watcher)
    }

    /// Takes the queued events of `CreateWatcher` watch `id`: `not_found` for no such watch
    /// (nor a `WatchDir` stream's id); once it ended and its events are taken, why it ended
    /// (and it is removed).
    pub fn take(&self, id: &str) -> Result<Vec<Change>, ConnectError> {
        let queue = self
            .lock()
            .live
            .get(id)
            .and_then(|l| l.queue.clone())
            .ok_or_else(no_such_watcher)?;
        let taken = queue.take();
        if taken.is_err() {
            self.lock().live.remove(id);
        }
        taken
    }

    /// How many watches are live.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes new watches again (the sandbox was paused, and is resumed).
    pub fn reopen(&self) {
        self.lock().closed = false;
    }

    /// Stops and forgets every watch, and refuses new ones (the sandbox is being paused or
    /// killed: a watch does not outlive a pause, as envd's do not).
    pub fn stop_all(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        for (_, live) in inner.live.drain() {
            live.stop.send_replace(true);
        }
    }
}

/// The error for no watch of an id (the SDKs raise their not-found exception).
pub fn no_such_watcher() -> ConnectError {
    ConnectError::new(Code::NotFound, "no such watcher")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> Seen {
        Seen {
            kind: EntryKind::File,
            size,
            modified: None,
            mode: None,
        }
    }

    fn dir() -> Seen {
        Seen {
            kind: EntryKind::Dir,
            size: 4096,
            modified: None,
            mode: None,
        }
    }

    /// A rewrite of the same size shows by its time, a chmod by its bits.
    #[test]
    fn an_equal_size_rewrite_and_a_chmod_are_seen() {
        let at = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        let before = Seen {
            modified: Some(at(1)),
            mode: Some(0o644),
            ..file(4)
        };
        let rewritten = Seen {
            modified: Some(at(2)),
            ..before
        };
        let chmodded = Seen {
            mode: Some(0o600),
            ..before
        };
        let a = snap(&[("f", before)]);
        assert_eq!(
            events(&diff(&a, &snap(&[("f", rewritten)]))),
            [("f", EventType::Write)]
        );
        assert_eq!(
            events(&diff(&a, &snap(&[("f", chmodded)]))),
            [("f", EventType::Chmod)]
        );
        assert_eq!(events(&diff(&a, &a)), []);
    }

    fn snap(entries: &[(&str, Seen)]) -> Snapshot {
        entries.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    fn events(changes: &[Change]) -> Vec<(&str, EventType)> {
        changes.iter().map(|c| (c.name.as_str(), c.kind)).collect()
    }

    #[test]
    fn a_new_file_is_created_then_written_and_a_gone_one_removed() {
        let before = snap(&[("old", file(1)), ("empty", file(0))]);
        let after = snap(&[("new", file(3)), ("touched", file(0)), ("empty", file(0))]);
        assert_eq!(
            events(&diff(&before, &after)),
            vec![
                ("old", EventType::Remove),
                ("new", EventType::Create),
                ("new", EventType::Write),
                ("touched", EventType::Create),
            ]
        );
        assert_eq!(diff(&after, &after), vec![]);
    }

    #[test]
    fn a_size_change_is_a_write_but_an_equal_size_rewrite_is_missed() {
        let before = snap(&[("a", file(3)), ("b", file(3)), ("d", dir())]);
        let after = snap(&[("a", file(5)), ("b", file(3)), ("d", file(4096))]);
        assert_eq!(
            events(&diff(&before, &after)),
            vec![
                ("d", EventType::Remove),
                ("a", EventType::Write),
                ("d", EventType::Create),
                ("d", EventType::Write),
            ]
        );
        // A directory's own size is no write.
        let grown = snap(&[
            ("a", file(3)),
            ("b", file(3)),
            (
                "d",
                Seen {
                    size: 8192,
                    ..dir()
                },
            ),
        ]);
        assert_eq!(diff(&before, &grown), vec![]);
    }

    #[test]
    fn nested_names_are_relative_to_the_watched_directory() {
        let before = snap(&[("sub", dir())]);
        let after = snap(&[("sub", dir()), ("sub/f", file(2))]);
        let changes = diff(&before, &after);
        assert_eq!(changes[0].name, "sub/f");
        assert_eq!(changes[0].now, Some(file(2)));
    }

    #[test]
    fn a_queue_keeps_the_newest_and_reports_its_end_after_its_events() {
        let q = Queue::default();
        let many = (0..QUEUED_EVENTS + 5)
            .map(|i| Change {
                name: i.to_string(),
                kind: EventType::Create,
                now: None,
            })
            .collect();
        q.push(many);
        q.end(ConnectError::new(Code::NotFound, "gone"));
        let taken = q.take().unwrap();
        assert_eq!(taken.len(), QUEUED_EVENTS);
        assert_eq!(taken[0].name, "5");
        assert_eq!(q.take().err().map(|e| e.code), Some(Code::NotFound));
    }

    #[test]
    fn watches_are_bounded_found_by_id_and_stopped_with_their_sandbox() {
        let w = Watchers::default();
        let q = Arc::new(Queue::default());
        let first = w.add("a".into(), Some(q.clone())).unwrap();
        let stream = w.add("s".into(), None).unwrap();
        for i in 2..MAX_WATCHERS {
            w.add(format!("x{i}"), None).unwrap();
        }
        let full = w.add("y".into(), None).err().map(|e| e.code);
        assert_eq!(full, Some(Code::ResourceExhausted));
        assert!(w.take("a").unwrap().is_empty());
        // A stream's id has no queue; an unknown id is not found.
        assert_eq!(w.take("s").err().map(|e| e.code), Some(Code::NotFound));
        assert_eq!(w.take("b").err().map(|e| e.code), Some(Code::NotFound));
        assert!(w.remove("x2"));
        assert!(!w.remove("x2"));
        w.stop_all();
        assert!(*first.stop.borrow());
        assert!(*stream.stop.borrow());
        assert!(w.is_empty());
        let refused = w.add("z".into(), None).err().map(|e| e.code);
        assert_eq!(refused, Some(Code::Unavailable));
        w.reopen();
        assert!(w.add("z".into(), None).is_ok());
    }
}
