//! Fault switches: rules that make matching requests fail, stall or misbehave, each for a
//! bounded number of requests, plus the watch-drop switch.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// The verb of a request, as RBAC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET one object.
    Get,
    /// GET a collection.
    List,
    /// GET a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE one object.
    Delete,
    /// DELETE a collection.
    DeleteCollection,
}

impl Verb {
    /// RBAC spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// What a matching request suffers.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Answer with this HTTP code and a `Status` body (409, 429, 500, 503, 401, 403, ...).
    Status(u16),
    /// Answer normally after this delay (a slow server).
    Delay(Duration),
    /// Exec: run the command but close the socket without the status frame.
    ExecWithoutStatus,
    /// Exec: delete the pod once the first stdin bytes arrived (the upload is cut off; the
    /// socket closes without a status frame, as when a kubelet loses the container).
    DeletePodMidUpload,
    /// Exec: the connection is cut after this many stdin bytes reached the process: its stdin
    /// ends there (a tar sees a truncated archive), it runs to its end, and the socket closes
    /// without a status frame.
    CutStdinAfter(usize),
    /// Exec: the connection stalls after this many stdin bytes reached the process: later
    /// input, and the end of input, never arrive, while the connection stays open. The process
    /// waits for input until something kills it (its `timeout`); the status frame then reports
    /// how it ended.
    StallStdinAfter(usize),
    /// Watch: the stream opens and sends its initial list, but every later event is held
    /// back, in order, until [`Faults::release_held_events`] (a lagging watch cache: the
    /// client learns of changes late, after other clients acted on them).
    HoldEvents,
}

/// Which requests a rule applies to; unset fields match anything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Matcher {
    /// Verb (exec is a `Create` on subresource `exec`).
    pub verb: Option<Verb>,
    /// Plural resource name (`pods`, `sandboxclaims`).
    pub resource: Option<String>,
    /// Subresource (`exec`, `status`).
    pub subresource: Option<String>,
    /// Object name.
    pub name: Option<String>,
}

impl Matcher {
    /// Matches every request of `verb` on `resource`.
    pub fn on(verb: Verb, resource: &str) -> Self {
        Matcher {
            verb: Some(verb),
            resource: Some(resource.to_string()),
            ..Default::default()
        }
    }

    /// Matches every exec into a pod.
    pub fn exec() -> Self {
        Matcher {
            verb: Some(Verb::Create),
            resource: Some("pods".into()),
            subresource: Some("exec".into()),
            name: None,
        }
    }

    fn matches(&self, r: &RequestInfo) -> bool {
        self.verb.is_none_or(|v| v == r.verb)
            && self.resource.as_deref().is_none_or(|x| x == r.resource)
            && self.subresource.as_deref() == r.subresource.as_deref()
            && self
                .name
                .as_deref()
                .is_none_or(|x| Some(x) == r.name.as_deref())
    }
}

/// What the server knows about a request when it consults the switches and the request log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestInfo {
    /// RBAC verb.
    pub verb: Verb,
    /// API group (empty for core).
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, if any.
    pub subresource: Option<String>,
    /// Object name, if any.
    pub name: Option<String>,
}

struct Rule {
    matcher: Matcher,
    fault: Fault,
    remaining: u32,
}

/// The set of armed fault rules.
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    watch_epoch: watch::Sender<u64>,
    releases: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            rules: Mutex::new(Vec::new()),
            watch_epoch: watch::channel(0).0,
            releases: watch::channel(0).0,
        }
    }
}

impl Faults {
    /// Arms a rule: the next `times` requests matching `matcher` suffer `fault`.
    pub fn inject(&self, matcher: Matcher, fault: Fault, times: u32) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Rule {
                matcher,
                fault,
                remaining: times,
            });
    }

    /// Disarms every rule.
    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Number of armed rule firings left (0 once every injected fault happened).
    pub fn pending(&self) -> u32 {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| r.remaining)
            .sum()
    }

    /// Takes the fault for a request, if a rule matches (first armed rule wins).
    pub fn take(&self, req: &RequestInfo) -> Option<Fault> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let rule = rules
            .iter_mut()
            .find(|r| r.remaining > 0 && r.matcher.matches(req))?;
        rule.remaining -= 1;
        let f = rule.fault.clone();
        rules.retain(|r| r.remaining > 0);
        Some(f)
    }

    /// Closes every open watch stream now (clients see the stream end and must re-watch).
    pub fn drop_watches(&self) {
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    /// A receiver that changes whenever watches are dropped.
    pub fn watch_epoch(&self) -> watch::Receiver<u64> {
        self.watch_epoch.subscribe()
    }

    /// Lets every watch stream opened under [`Fault::HoldEvents`] before now send the events
    /// it held back, and every later one as it happens.
    pub fn release_held_events(&self) {
        self.releases.send_modify(|r| *r += 1);
    }

    /// A receiver that changes whenever held events are released.
    pub fn releases(&self) -> watch::Receiver<u64> {
        self.releases.subscribe()
    }
}
