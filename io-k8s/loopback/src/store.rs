//! The object store: namespaced objects with resourceVersions, a bounded event history for
//! watches (older versions expire with 410), ownerReference cascade, and the virtual clock that
//! timestamps objects and drives expiries.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::patch::{self, PatchKind};
use crate::resources::{self, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object deleted (the event carries its last state).
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and sent to watchers.
#[derive(Debug, Clone)]
pub struct Event {
    /// resourceVersion the change produced.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// Type of the object.
    pub resource: ResourceType,
    /// Namespace of the object.
    pub namespace: String,
    /// The object after the change (before it, for deletions).
    pub object: Value,
    /// The object before a modification.
    pub previous: Option<Value>,
}

/// The history after a resourceVersion, and a receiver of every later change.
pub type Subscription = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

/// How a delete treats dependents (`propagationPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Dependents are deleted (the loopback's garbage collector runs at once).
    Background,
    /// Dependents are deleted first, then the owner.
    Foreground,
    /// Dependents lose their ownerReference and stay.
    Orphan,
}

type Key = (String, String, String);

/// One accepted write that set an audited annotation ([`Store::audit_annotation`]) to a new
/// value: the loopback's analog of an entry of the real API server's audit log, read in
/// process by the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationWrite {
    /// The resourceVersion the write produced (the log is in this order).
    pub rv: u64,
    /// The object's resource (plural, e.g. `sandboxclaims`).
    pub resource: &'static str,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's UID (a name used again by a new object has another).
    pub uid: String,
    /// The annotation.
    pub annotation: String,
    /// Its value before the write (`None`: the object is new, or did not carry it).
    pub previous: Option<String>,
    /// Its value after the write.
    pub value: String,
}

struct Inner {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    uid_seq: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Watches from a resourceVersion below this answer 410 Gone.
    compacted_through: u64,
    clock_offset: Duration,
    /// Annotations whose changes are logged in `audit`.
    audited: Vec<String>,
    audit: Vec<AnnotationWrite>,
}

/// The shared object store.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    base: jiff::Timestamp,
}

fn key(rt: &ResourceType, ns: &str, name: &str) -> Key {
    (rt.qualified(), ns.to_string(), name.to_string())
}

fn is_dns_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// Checks a DNS-1123 subdomain (object names).
pub fn valid_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.chars().all(is_dns_label_char)
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(valid_subdomain) && !name.is_empty() && valid_label_value(name)
}

fn validate(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut causes = Vec::new();
    if !valid_subdomain(name) {
        causes.push(("metadata.name".to_string(), format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let ok = valid_label_key(k) && v.as_str().is_some_and(valid_label_value);
            if !ok {
                causes.push((
                    "metadata.labels".to_string(),
                    format!("Invalid value: \"{}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)", v.as_str().unwrap_or_default()),
                ));
            }
        }
    }
    if *rt == resources::PODS {
        let containers = obj
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if containers.is_empty() {
            causes.push(("spec.containers".into(), "Required value".into()));
        }
        for (i, c) in containers.iter().enumerate() {
            if c.get("name").and_then(Value::as_str).is_none() {
                causes.push((
                    format!("spec.containers[{i}].name"),
                    "Required value".into(),
                ));
            }
            if c.get("image").and_then(Value::as_str).is_none() {
                causes.push((
                    format!("spec.containers[{i}].image"),
                    "Required value".into(),
                ));
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt.kind, name, causes))
    }
}

fn rv_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The grace period a pod's deletion gets (`CheckGracefulDelete`), or `None` to remove it at
/// once: the request's, else the pod's `spec.terminationGracePeriodSeconds`, else 30; none for
/// a pod on no node, a finished pod, or a period of 0 or less.
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> Option<i64> {
    let period = requested.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_TERMINATION_GRACE_SECS)
    });
    let on_node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Failed" | "Succeeded")
    );
    (period > 0 && on_node && !finished).then_some(period)
}

/// The API's default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_SECS: i64 = 30;

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store whose clock starts at the wall clock's present.
    pub fn new() -> Self {
        // The loopback stands in for a real API server, whose timestamps are wall-clock time;
        // only the origin is read, later time moves by `advance` (tests control it).
        #[allow(clippy::disallowed_methods)]
        let base = jiff::Timestamp::try_from(std::time::SystemTime::now())
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        Store {
            inner: Mutex::new(Inner {
                objects: BTreeMap::new(),
                rv: 1000,
                uid_seq: 0,
                history: VecDeque::new(),
                history_limit: 4096,
                compacted_through: 0,
                clock_offset: Duration::ZERO,
                audited: Vec::new(),
                audit: Vec::new(),
            }),
            events: broadcast::channel(4096).0,
            base,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store's present (wall-clock origin plus every `advance`).
    pub fn now(&self) -> jiff::Timestamp {
        let off = self.lock().clock_offset;
        self.base
            .checked_add(jiff::SignedDuration::try_from(off).unwrap_or_default())
            .unwrap_or(self.base)
    }

    /// RFC 3339 form of [`Store::now`], seconds precision (as metadata timestamps are).
    pub fn now_rfc3339(&self) -> String {
        let now = self.now();
        jiff::Timestamp::from_second(now.as_second())
            .unwrap_or(now)
            .to_string()
    }

    /// Moves the clock forward (expiries are checked by the controller afterwards).
    pub fn advance(&self, by: Duration) {
        self.lock().clock_offset += by;
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the event history: any watch from an older resourceVersion now gets 410 Gone.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.compacted_through = g.rv;
    }

    /// Stores a new version of an object under the next resourceVersion and records its
    /// event: `Added` without a `previous` version, `Modified` with one. Returns what was
    /// stored.
    fn store_version(
        &self,
        g: &mut Inner,
        rt: &ResourceType,
        ns: &str,
        k: Key,
        mut obj: Value,
        previous: Option<Value>,
    ) -> Value {
        g.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        g.objects.insert(k, obj.clone());
        self.audit(g, rt, ns, &obj, previous.as_ref());
        let ev = Event {
            rv: g.rv,
            kind: if previous.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            resource: *rt,
            namespace: ns.into(),
            object: obj.clone(),
            previous,
        };
        self.record(g, ev);
        obj
    }

    /// Logs the audited annotations this version of `obj` changed (under the store's lock,
    /// so the log is in resourceVersion order).
    fn audit(
        &self,
        g: &mut Inner,
        rt: &ResourceType,
        ns: &str,
        obj: &Value,
        previous: Option<&Value>,
    ) {
        if g.audited.is_empty() {
            return;
        }
        let annotation = |o: &Value, name: &str| {
            o.pointer("/metadata/annotations")
                .and_then(|a| a.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let mut writes = Vec::new();
        for name in &g.audited {
            let before = previous.and_then(|p| annotation(p, name));
            match annotation(obj, name) {
                Some(value) if before.as_ref() != Some(&value) => writes.push(AnnotationWrite {
                    rv: g.rv,
                    resource: rt.plural,
                    namespace: ns.to_string(),
                    name: name_of(obj).to_string(),
                    uid: uid_of(obj).to_string(),
                    annotation: name.clone(),
                    previous: before,
                    value,
                }),
                _ => {}
            }
        }
        g.audit.extend(writes);
    }

    /// From now on, logs every accepted write (create, replace, patch; by clients or the
    /// controllers) that sets the annotation `name` of any object to a new value
    /// ([`Store::annotation_audit`]).
    pub fn audit_annotation(&self, name: &str) {
        let mut g = self.lock();
        if !g.audited.iter().any(|a| a == name) {
            g.audited.push(name.to_string());
        }
    }

    /// The audit log of the annotations [`Store::audit_annotation`] named, in resourceVersion
    /// order. It is never trimmed: meant for tests.
    pub fn annotation_audit(&self) -> Vec<AnnotationWrite> {
        self.lock().audit.clone()
    }

    fn record(&self, g: &mut Inner, ev: Event) {
        let ev = Arc::new(ev);
        g.history.push_back(ev.clone());
        while g.history.len() > g.history_limit {
            if let Some(old) = g.history.pop_front() {
                g.compacted_through = old.rv;
            }
        }
        let _ = self.events.send(ev);
    }

    /// Subscribes to every change after the current one.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Events after `rv` from the history plus a live receiver, atomically; 410 when `rv`
    /// predates the retained history.
    pub fn watch_from(&self, rv: u64) -> Result<Subscription, ApiError> {
        let g = self.lock();
        if rv < g.compacted_through {
            return Err(ApiError::gone(&format!(
                "too old resource version: {rv} ({})",
                g.compacted_through + 1
            )));
        }
        let backlog = g.history.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((backlog, self.events.subscribe()))
    }

    /// Whether a list `continue` token or resourceVersion has expired.
    pub fn expired(&self, rv: u64) -> bool {
        rv < self.lock().compacted_through
    }

    /// Creates an object (server-filled metadata; status reset where a status subresource
    /// exists).
    pub fn create(&self, rt: &ResourceType, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        if (!av.is_empty() && av != rt.api_version()) || (!kind.is_empty() && kind != rt.kind) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        let obj_ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(ns);
        if obj_ns != ns {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        let now = self.now_rfc3339();
        let mut g = self.lock();
        g.uid_seq += 1;
        let seq = g.uid_seq;
        let meta = obj["metadata"].as_object_mut().expect("checked above");
        if meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            if let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
                let name = format!("{prefix}{:05x}", (seq * 7919) % 0xfffff);
                meta.insert("name".into(), json!(name));
            }
        }
        meta.insert("namespace".into(), json!(ns));
        meta.insert(
            "uid".into(),
            json!(format!("00000000-0000-4000-8000-{seq:012x}")),
        );
        meta.insert("creationTimestamp".into(), json!(now));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        if rt.has_status() {
            obj["status"] = if *rt == resources::PODS {
                json!({"phase": "Pending", "qosClass": "BestEffort"})
            } else {
                json!({})
            };
        }
        validate(rt, &obj)?;
        let name = name_of(&obj).to_string();
        let k = key(rt, ns, &name);
        if g.objects.contains_key(&k) {
            return Err(ApiError::already_exists(rt.group, rt.plural, &name));
        }
        Ok(self.store_version(&mut g, rt, ns, k, obj, None))
    }

    /// Reads one object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))
    }

    /// Lists objects of a type (in one namespace, or all) matching the selectors, in name
    /// order, with the resourceVersion of the list.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> (Vec<Value>, u64) {
        let g = self.lock();
        let q = rt.qualified();
        let items = g
            .objects
            .iter()
            .filter(|((r, n, _), o)| {
                *r == q && ns.is_none_or(|ns| ns == n) && labels.matches(o) && fields.matches(o)
            })
            .map(|(_, o)| o.clone())
            .collect();
        (items, g.rv)
    }

    /// Every object of a type in every namespace (for assertions and controllers).
    pub fn all(&self, rt: &ResourceType) -> Vec<Value> {
        self.list(
            rt,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .0
    }

    /// Replaces an object (PUT): a body resourceVersion must match (409 otherwise). With
    /// `subresource = Some("status")` only the status is taken; without it, the status is kept
    /// where a status subresource exists.
    pub fn replace(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        new: Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        let k = key(rt, ns, name);
        let old = g
            .objects
            .get(&k)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        if let Some(want) = rv_of(&new) {
            if Some(want) != rv_of(&old) {
                return Err(ApiError::conflict(rt.group, rt.plural, name));
            }
        }
        let mut next = match subresource {
            Some("status") => {
                let mut o = old.clone();
                o["status"] = new.get("status").cloned().unwrap_or(json!({}));
                o
            }
            _ => {
                let mut o = new;
                if rt.has_status() {
                    o["status"] = old.get("status").cloned().unwrap_or(json!({}));
                }
                o
            }
        };
        if name_of(&next) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&next)
            )));
        }
        for f in [
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old["metadata"].get(f) {
                Some(v) => next["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        next["apiVersion"] = json!(rt.api_version());
        next["kind"] = json!(rt.kind);
        if old.get("spec") != next.get("spec") {
            let gen = old
                .pointer("/metadata/generation")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            next["metadata"]["generation"] = json!(gen + 1);
        }
        validate(rt, &next)?;
        if next == old {
            return Ok(old);
        }
        Ok(self.store_version(&mut g, rt, ns, k, next, Some(old)))
    }

    /// Patches an object. A server-side apply of an absent object creates it.
    pub fn patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: &Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let current = match self.get(rt, ns, name) {
            Ok(o) => o,
            Err(e) if e.code == 404 && kind == PatchKind::Apply && subresource.is_none() => {
                let mut obj = body.clone();
                obj["metadata"]["name"] = json!(name);
                return self.create(rt, ns, obj);
            }
            Err(e) => return Err(e),
        };
        let mut next = current.clone();
        patch::merge(&mut next, body);
        if rv_of(body).is_none() {
            // No precondition in the patch: it applies to the version just read.
            if let Some(rv) = rv_of(&current) {
                next["metadata"]["resourceVersion"] = json!(rv);
            }
        }
        self.replace(rt, ns, name, next, subresource)
    }

    /// Changes an object in place (controllers and tests): `f` is applied to the newest version,
    /// again after a conflicting write, so no other writer's change is lost.
    pub fn modify(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut f: impl FnMut(&mut Value),
    ) -> Result<Value, ApiError> {
        // Read, change, write with the read's resourceVersion; a controller that wrote in between
        // makes the write a 409, and the change is made again on the newer object (the way
        // `kubectl edit` and client-go's RetryOnConflict do it).
        let mut conflicts = 0;
        loop {
            let mut next = self.get(rt, ns, name)?;
            let mut status = next.get("status").cloned();
            f(&mut next);
            if let Some(s) = next.get("status") {
                status = Some(s.clone());
            }
            let out = match self.replace(rt, ns, name, next.clone(), None) {
                Err(e) if e.code == 409 && conflicts < 16 => {
                    conflicts += 1;
                    continue;
                }
                r => r?,
            };
            return match status {
                Some(s) if out.get("status") != Some(&s) => {
                    self.replace(rt, ns, name, json!({"status": s}), Some("status"))
                }
                _ => Ok(out),
            };
        }
    }

    /// Marks a pod `Terminating`: `deletionTimestamp` at now plus `period` (kept if an earlier
    /// deletion ends sooner) and `deletionGracePeriodSeconds`. Answers the pod.
    fn begin_termination(&self, ns: &str, name: &str, period: i64) -> Result<Value, ApiError> {
        let now = self.now();
        let ends =
            jiff::Timestamp::from_second(now.as_second().saturating_add(period)).unwrap_or(now);
        let mut g = self.lock();
        let k = key(&resources::PODS, ns, name);
        let old = g.objects.get(&k).cloned().ok_or_else(|| {
            ApiError::not_found(resources::PODS.group, resources::PODS.plural, name)
        })?;
        let earlier = old
            .pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .is_some_and(|t| t <= ends);
        if earlier {
            return Ok(old);
        }
        let mut next = old.clone();
        next["metadata"]["deletionTimestamp"] = json!(ends.to_string());
        next["metadata"]["deletionGracePeriodSeconds"] = json!(period);
        Ok(self.store_version(&mut g, &resources::PODS, ns, k, next, Some(old)))
    }

    /// A DELETE with default options: [`Store::delete_with_grace`] with no grace period given.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        propagation: Propagation,
        precondition_uid: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.delete_with_grace(rt, ns, name, propagation, precondition_uid, None)
    }

    /// Deletes an object and applies `propagation` to its dependents (by ownerReference uid).
    /// A `uid` precondition that does not match answers 409.
    ///
    /// A pod is deleted gracefully, as the API server does it (kubernetes
    /// `pkg/registry/core/pod/strategy.go` `CheckGracefulDelete`, and `BeforeDelete`): its
    /// grace period is `grace` if given, else its `spec.terminationGracePeriodSeconds`, else 30
    /// (the API's default); a pod on no node yet or already finished has none. With a grace
    /// period the pod is not removed: it gets `deletionTimestamp` (now plus the period) and
    /// `deletionGracePeriodSeconds`, is `Terminating`, and the answer is the pod itself; its
    /// kubelet removes it later with grace 0. Deleting a pod that is already terminating
    /// changes nothing unless the new period ends sooner.
    pub fn delete_with_grace(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        propagation: Propagation,
        precondition_uid: Option<&str>,
        grace: Option<i64>,
    ) -> Result<Value, ApiError> {
        let preconditions = Preconditions {
            uid: precondition_uid,
            resource_version: None,
        };
        self.delete_with_preconditions(rt, ns, name, propagation, preconditions, grace)
    }

    /// [`delete_with_grace`](Self::delete_with_grace) under both of `DeleteOptions`'
    /// preconditions: a `uid` or a `resourceVersion` that does not match answers 409
    /// (kubernetes `staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`: the
    /// preconditions are checked against the object as stored, in the delete's own
    /// transaction; here, under the store's lock as the object is removed).
    pub fn delete_with_preconditions(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        propagation: Propagation,
        preconditions: Preconditions<'_>,
        grace: Option<i64>,
    ) -> Result<Value, ApiError> {
        let obj = self.get(rt, ns, name)?;
        if !preconditions.hold(&obj) {
            return Err(ApiError::conflict(rt.group, rt.plural, name));
        }
        if *rt == resources::PODS {
            if let Some(period) = pod_grace_period(&obj, grace) {
                return self.begin_termination(ns, name, period);
            }
        }
        let uid = uid_of(&obj).to_string();
        let dependents: Vec<(ResourceType, String, String)> = {
            let g = self.lock();
            g.objects
                .iter()
                .filter(|((_, n, _), o)| {
                    n == ns
                        && o.pointer("/metadata/ownerReferences")
                            .and_then(Value::as_array)
                            .is_some_and(|refs| {
                                refs.iter()
                                    .any(|r| r.get("uid").and_then(Value::as_str) == Some(&uid))
                            })
                })
                .filter_map(|(_, o)| {
                    let av = o.get("apiVersion")?.as_str()?;
                    let kind = o.get("kind")?.as_str()?;
                    Some((
                        resources::find_kind(av, kind)?,
                        ns.to_string(),
                        name_of(o).to_string(),
                    ))
                })
                .collect()
        };
        for (drt, dns, dname) in dependents {
            match propagation {
                Propagation::Orphan => {
                    let _ = self.modify(&drt, &dns, &dname, |o| {
                        if let Some(refs) = o
                            .pointer_mut("/metadata/ownerReferences")
                            .and_then(Value::as_array_mut)
                        {
                            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(&uid));
                        }
                    });
                }
                _ => {
                    let _ = self.delete(&drt, &dns, &dname, Propagation::Background, None);
                }
            }
        }
        let mut g = self.lock();
        match g.objects.get(&key(rt, ns, name)) {
            None => return Err(ApiError::not_found(rt.group, rt.plural, name)),
            Some(now) if !preconditions.hold(now) => {
                return Err(ApiError::conflict(rt.group, rt.plural, name))
            }
            Some(_) => {}
        }
        let Some(mut last) = g.objects.remove(&key(rt, ns, name)) else {
            return Err(ApiError::not_found(rt.group, rt.plural, name));
        };
        g.rv += 1;
        last["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        let ev = Event {
            rv: g.rv,
            kind: EventType::Deleted,
            resource: *rt,
            namespace: ns.into(),
            object: last,
            previous: None,
        };
        self.record(&mut g, ev);
        Ok(crate::status::delete_success(
            rt.group, rt.plural, name, &uid,
        ))
    }
}

/// A delete's preconditions (`DeleteOptions.preconditions`): what the object must be.
#[derive(Clone, Copy, Debug, Default)]
pub struct Preconditions<'a> {
    /// Its `metadata.uid`.
    pub uid: Option<&'a str>,
    /// Its `metadata.resourceVersion`: it was not changed since it was read.
    pub resource_version: Option<&'a str>,
}

impl Preconditions<'_> {
    /// Whether `obj` is what they ask for.
    fn hold(&self, obj: &Value) -> bool {
        let rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        self.uid.is_none_or(|uid| uid == uid_of(obj))
            && self.resource_version.is_none_or(|want| Some(want) == rv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{LEASES, PODS, SANDBOXES};

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn a_delete_whose_resource_version_precondition_is_stale_is_a_conflict() {
        let s = Store::new();
        let made = s
            .create(&LEASES, "ns", json!({"metadata": {"name": "l"}}))
            .unwrap();
        let rv = made["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let changed = s
            .modify(&LEASES, "ns", "l", |o| {
                o["spec"] = json!({"holderIdentity": "x"})
            })
            .unwrap();
        let now = changed["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let stale = Preconditions {
            uid: None,
            resource_version: Some(&rv),
        };
        let e = s
            .delete_with_preconditions(&LEASES, "ns", "l", Propagation::Background, stale, None)
            .unwrap_err();
        assert_eq!(e.code, 409);
        assert!(s.get(&LEASES, "ns", "l").is_ok(), "kept");
        let current = Preconditions {
            uid: None,
            resource_version: Some(&now),
        };
        s.delete_with_preconditions(&LEASES, "ns", "l", Propagation::Background, current, None)
            .unwrap();
        assert!(s.get(&LEASES, "ns", "l").is_err(), "deleted");
    }

    #[test]
    fn the_audit_logs_each_change_of_an_audited_annotation_in_order() {
        let s = Store::new();
        let annotated = |name: &str, v: &str| {
            let mut p = pod(name);
            p["metadata"]["annotations"] = json!({"t": v, "other": v});
            p
        };
        s.create(&PODS, "ns", annotated("before", "1")).unwrap();
        s.audit_annotation("t");
        s.audit_annotation("t");
        s.create(&PODS, "ns", annotated("p", "5")).unwrap();
        let merge = |v: &str| json!({"metadata": {"annotations": {"t": v}}});
        s.patch(&PODS, "ns", "p", PatchKind::Merge, &merge("5"), None)
            .unwrap();
        s.patch(&PODS, "ns", "p", PatchKind::Merge, &merge("4"), None)
            .unwrap();
        s.modify(&PODS, "ns", "p", |p| {
            p["metadata"]["labels"] = json!({"l": "x"})
        })
        .unwrap();
        let log = s.annotation_audit();
        let seen: Vec<(&str, Option<&str>, &str)> = log
            .iter()
            .map(|w| (w.name.as_str(), w.previous.as_deref(), w.value.as_str()))
            .collect();
        // Not the write before the audit began, not the unchanged value, not other annotations.
        assert_eq!(seen, vec![("p", None, "5"), ("p", Some("5"), "4")]);
        assert!(log[0].rv < log[1].rv);
        assert_eq!(log[0].resource, "pods");
        assert_eq!(log[0].uid, log[1].uid);
    }

    #[test]
    fn create_fills_metadata_and_rejects_duplicates_and_bad_names() {
        let s = Store::new();
        let p = s.create(&PODS, "ns", pod("a")).unwrap();
        assert_eq!(p["metadata"]["namespace"], "ns");
        assert!(p["metadata"]["uid"].as_str().unwrap().len() > 10);
        assert_eq!(s.create(&PODS, "ns", pod("a")).unwrap_err().code, 409);
        assert_eq!(s.create(&PODS, "ns", pod("A_b")).unwrap_err().code, 422);
        let bad_label = json!({"metadata": {"name": "l", "labels": {"k": "x y"}}});
        assert_eq!(s.create(&LEASES, "ns", bad_label).unwrap_err().code, 422);
    }

    #[test]
    fn stale_resource_version_conflicts_and_cascade_follows_owner_uids() {
        let s = Store::new();
        let sb = s
            .create(&SANDBOXES, "ns", json!({"metadata": {"name": "sb"}}))
            .unwrap();
        let mut p = pod("p");
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "sb", "uid": sb["metadata"]["uid"]}]);
        let p = s.create(&PODS, "ns", p).unwrap();
        let mut stale = p.clone();
        stale["metadata"]["resourceVersion"] = json!("1");
        assert_eq!(
            s.replace(&PODS, "ns", "p", stale, None).unwrap_err().code,
            409
        );
        s.delete(&SANDBOXES, "ns", "sb", Propagation::Background, None)
            .unwrap();
        assert_eq!(s.get(&PODS, "ns", "p").unwrap_err().code, 404);
    }

    /// `CheckGracefulDelete`: a pod on a node is marked `Terminating` for its grace period
    /// (the request's, else its own, else 30 s) and stays; a pod on no node, a finished pod,
    /// or grace 0 goes at once; a second deletion only ever shortens the period.
    #[test]
    fn pod_deletion_is_graceful_as_the_api_servers() {
        let s = Store::new();
        let bg = Propagation::Background;
        s.create(&PODS, "ns", pod("unbound")).unwrap();
        s.delete(&PODS, "ns", "unbound", bg, None).unwrap();
        assert_eq!(s.get(&PODS, "ns", "unbound").unwrap_err().code, 404);

        let bound = |name: &str, grace: Option<i64>, phase: &str| {
            let mut p = pod(name);
            p["spec"]["nodeName"] = json!("n");
            if let Some(g) = grace {
                p["spec"]["terminationGracePeriodSeconds"] = json!(g);
            }
            s.create(&PODS, "ns", p).unwrap();
            s.modify(&PODS, "ns", name, |p| p["status"]["phase"] = json!(phase))
                .unwrap();
        };
        let ends = |name: &str| {
            let p = s.get(&PODS, "ns", name).unwrap();
            let at: jiff::Timestamp = p["metadata"]["deletionTimestamp"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            (
                at.as_second() - s.now().as_second(),
                p["metadata"]["deletionGracePeriodSeconds"].clone(),
            )
        };
        bound("default", None, "Running");
        let answer = s.delete(&PODS, "ns", "default", bg, None).unwrap();
        assert_eq!(answer["kind"], "Pod", "the answer is the terminating pod");
        assert_eq!(ends("default"), (30, json!(30)));
        bound("own", Some(5), "Running");
        s.delete(&PODS, "ns", "own", bg, None).unwrap();
        assert_eq!(ends("own"), (5, json!(5)));
        s.delete_with_grace(&PODS, "ns", "own", bg, None, Some(60))
            .unwrap();
        assert_eq!(ends("own"), (5, json!(5)), "never lengthened");
        s.delete_with_grace(&PODS, "ns", "own", bg, None, Some(2))
            .unwrap();
        assert_eq!(ends("own"), (2, json!(2)), "shortened");
        s.delete_with_grace(&PODS, "ns", "own", bg, None, Some(0))
            .unwrap();
        assert_eq!(s.get(&PODS, "ns", "own").unwrap_err().code, 404);
        bound("done", None, "Succeeded");
        s.delete(&PODS, "ns", "done", bg, None).unwrap();
        assert_eq!(s.get(&PODS, "ns", "done").unwrap_err().code, 404);
        // Other kinds go at once.
        s.create(&LEASES, "ns", json!({"metadata": {"name": "l"}}))
            .unwrap();
        s.delete(&LEASES, "ns", "l", bg, None).unwrap();
        assert_eq!(s.get(&LEASES, "ns", "l").unwrap_err().code, 404);
    }

    #[test]
    fn compaction_expires_old_versions() {
        let s = Store::new();
        let rv = s.resource_version();
        s.create(&LEASES, "ns", json!({"metadata": {"name": "l"}}))
            .unwrap();
        assert_eq!(s.watch_from(rv).unwrap().0.len(), 1);
        s.compact();
        assert_eq!(s.watch_from(rv).unwrap_err().code, 410);
        assert!(s.watch_from(s.resource_version()).is_ok());
    }
}
