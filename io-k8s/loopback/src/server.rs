//! The HTTP front: routing of Kubernetes API paths to discovery, the store, watches and exec,
//! with the request log, RBAC enforcement and fault switches applied on the way in.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::faults::{Fault, Faults, RequestInfo, Verb};
use crate::patch::PatchKind;
use crate::resources::{self, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Propagation, Store};

/// Response body type of every handler.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// One RBAC rule the loopback enforces when RBAC is on (a `Role` rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// API groups (`""` for core, `*` for all).
    pub api_groups: Vec<String>,
    /// Resources, `plural` or `plural/subresource` (`*` for all).
    pub resources: Vec<String>,
    /// Verbs (`*` for all).
    pub verbs: Vec<String>,
}

impl PolicyRule {
    fn allows(&self, r: &RequestInfo) -> bool {
        let res = match &r.subresource {
            Some(s) => format!("{}/{s}", r.resource),
            None => r.resource.clone(),
        };
        let any = |v: &Vec<String>, x: &str| v.iter().any(|e| e == "*" || e == x);
        any(&self.api_groups, &r.group)
            && any(&self.resources, &res)
            && any(&self.verbs, r.verb.as_str())
    }
}

/// State shared by every connection.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub faults: Faults,
    pub requests: Mutex<BTreeSet<RequestInfo>>,
    /// Requests served, by (verb, group, resource, subresource).
    pub request_counts: Mutex<std::collections::BTreeMap<RequestInfo, u64>>,
    pub rbac: Mutex<Option<Vec<PolicyRule>>>,
    /// Which agent-sandbox API is installed.
    pub agent_sandbox: Mutex<resources::AgentSandboxApi>,
    pub pods_root: PathBuf,
    pub container_root: String,
    /// Watch requests served so far.
    pub watches_opened: tokio::sync::watch::Sender<u64>,
    /// Watches answered with a 410 (expired resourceVersion) so far.
    pub watches_expired: tokio::sync::watch::Sender<u64>,
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(e.code, &e.to_status());
    if e.code == 429 {
        resp.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    resp
}

/// A parsed resource path.
pub(crate) struct Target {
    pub rt: ResourceType,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

enum Route {
    Document(Value),
    Resource(Target),
}

fn route(path: &str, api: resources::AgentSandboxApi) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Route::Document(resources::version())),
        ["openapi", "v3"] => return Ok(Route::Document(crate::openapi::index())),
        ["openapi", "v3", rest @ ..] => {
            return crate::openapi::group_version(&rest.join("/"))
                .map(Route::Document)
                .ok_or_else(|| ApiError::no_route(path))
        }
        ["api"] => return Ok(Route::Document(resources::core_versions())),
        ["apis"] => return Ok(Route::Document(resources::group_list(api))),
        ["apis", g] => {
            return resources::group(g, api)
                .map(Route::Document)
                .ok_or_else(|| ApiError::no_route(path))
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route(path)),
    };
    let (namespace, plural, name, sub) = match rest {
        [] => {
            return resources::resource_list(group, version, api)
                .map(Route::Document)
                .ok_or_else(|| ApiError::no_route(path))
        }
        [plural] => (None, *plural, None, None),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_route(path)),
    };
    let rt = resources::find(group, version, plural)
        .filter(|_| api.serves(group, version))
        .ok_or_else(|| ApiError::no_route(path))?;
    if let Some(s) = sub {
        if !rt.subresources.contains(&s) {
            return Err(ApiError::no_route(path));
        }
    }
    Ok(Route::Resource(Target {
        rt,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        subresource: sub.map(str::to_string),
    }))
}

/// Query parameters in order (repeated keys kept, as `command=` is).
pub(crate) type Query = Vec<(String, String)>;

pub(crate) fn param<'a>(q: &'a Query, k: &str) -> Option<&'a str> {
    q.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
}

fn is_true(v: Option<&str>) -> bool {
    matches!(v, Some("true") | Some("1"))
}

fn verb_of(method: &Method, t: &Target, q: &Query) -> Result<Verb, ApiError> {
    Ok(match (method, t.name.is_some(), t.subresource.as_deref()) {
        // Websocket exec is a GET; authorised as `create` on pods/exec (as clusters with
        // AuthorizePodWebsocketUpgradeCreatePermission do).
        (&Method::GET | &Method::POST, true, Some("exec")) => Verb::Create,
        (&Method::GET, true, _) => Verb::Get,
        (&Method::GET, false, _) if is_true(param(q, "watch")) => Verb::Watch,
        (&Method::GET, false, _) => Verb::List,
        (&Method::POST, false, _) => Verb::Create,
        (&Method::PUT, true, _) => Verb::Update,
        (&Method::PATCH, true, _) => Verb::Patch,
        (&Method::DELETE, true, _) => Verb::Delete,
        (&Method::DELETE, false, _) => Verb::DeleteCollection,
        (m, _, _) => return Err(ApiError::method_not_allowed(m.as_str())),
    })
}

/// Serves one request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(match serve(shared, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    })
}

async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let query: Query = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let api = *shared
        .agent_sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let target = match route(&path, api)? {
        Route::Document(v) => return Ok(json_response(200, &v)),
        Route::Resource(t) => t,
    };
    let verb = verb_of(req.method(), &target, &query)?;
    let info = RequestInfo {
        verb,
        group: target.rt.group.to_string(),
        resource: target.rt.plural.to_string(),
        subresource: target.subresource.clone(),
        name: target.name.clone(),
    };
    shared
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(RequestInfo {
            name: None,
            ..info.clone()
        });
    *shared
        .request_counts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(RequestInfo {
            name: None,
            ..info.clone()
        })
        .or_default() += 1;
    let ns = target.namespace.clone().unwrap_or_default();
    if let Some(rules) = shared
        .rbac
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        if !rules.iter().any(|r| r.allows(&info)) {
            let res = match &info.subresource {
                Some(s) => format!("{}/{s}", info.resource),
                None => info.resource.clone(),
            };
            return Err(ApiError::forbidden(verb.as_str(), &info.group, &res, &ns));
        }
    }
    let mut fault = None;
    match shared.faults.take(&info) {
        Some(Fault::Status(code)) => return Err(ApiError::injected(code)),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(f) => fault = Some(f),
        None => {}
    }
    if target.subresource.as_deref() == Some("exec") {
        return crate::exec::upgrade(shared, req, &target, &query, fault);
    }
    let rt = target.rt;
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    let parse_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
    };
    let labels = LabelSelector::parse(param(&query, "labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(param(&query, "fieldSelector").unwrap_or(""))?;
    let sub = target.subresource.as_deref();
    let store = &shared.store;
    let dry_run = param(&query, "dryRun").is_some();
    match (verb, target.name.as_deref()) {
        (Verb::Watch, _) => crate::watch::serve(
            shared.clone(),
            rt,
            target.namespace.clone(),
            labels,
            fields,
            &query,
            fault == Some(Fault::HoldEvents),
        ),
        (Verb::List, _) => list(
            store,
            rt,
            target.namespace.as_deref(),
            &labels,
            &fields,
            &query,
        ),
        (Verb::Get, Some(name)) => Ok(json_response(200, &store.get(&rt, &ns, name)?)),
        (Verb::Create, None) if dry_run => Ok(json_response(201, &parse_body()?)),
        (Verb::Create, None) => Ok(json_response(201, &store.create(&rt, &ns, parse_body()?)?)),
        (Verb::Update, Some(name)) => Ok(json_response(
            200,
            &store.replace(&rt, &ns, name, parse_body()?, sub)?,
        )),
        (Verb::Patch, Some(name)) => {
            let kind = PatchKind::from_content_type(&content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(&content_type))?;
            let created = kind == PatchKind::Apply && store.get(&rt, &ns, name).is_err();
            let obj = store.patch(&rt, &ns, name, kind, &parse_body()?, sub)?;
            Ok(json_response(if created { 201 } else { 200 }, &obj))
        }
        (Verb::Delete, Some(name)) => {
            let opts: Value = if body.is_empty() {
                json!({})
            } else {
                parse_body()?
            };
            let policy = opts
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .or(param(&query, "propagationPolicy"))
                .or(opts
                    .get("orphanDependents")
                    .and_then(Value::as_bool)
                    .filter(|o| *o)
                    .map(|_| "Orphan"));
            let propagation = match policy {
                Some("Foreground") => Propagation::Foreground,
                Some("Orphan") => Propagation::Orphan,
                _ => Propagation::Background,
            };
            let preconditions = crate::store::Preconditions {
                uid: opts.pointer("/preconditions/uid").and_then(Value::as_str),
                resource_version: opts
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str),
            };
            let grace = match opts.get("gracePeriodSeconds") {
                Some(g) => Some(g.as_i64().ok_or_else(|| {
                    ApiError::bad_request("gracePeriodSeconds must be an integer")
                })?),
                None => param(&query, "gracePeriodSeconds")
                    .map(|g| {
                        g.parse::<i64>().map_err(|_| {
                            ApiError::bad_request("gracePeriodSeconds must be an integer")
                        })
                    })
                    .transpose()?,
            };
            Ok(json_response(
                200,
                &store.delete_with_preconditions(
                    &rt,
                    &ns,
                    name,
                    propagation,
                    preconditions,
                    grace,
                )?,
            ))
        }
        (Verb::DeleteCollection, None) => {
            let (items, _) = store.list(&rt, Some(&ns), &labels, &fields);
            let mut deleted = Vec::new();
            for o in items {
                let name = o
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if store
                    .delete(&rt, &ns, &name, Propagation::Background, None)
                    .is_ok()
                {
                    deleted.push(o);
                }
            }
            Ok(json_response(
                200,
                &json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": {}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

fn list(
    store: &Store,
    rt: ResourceType,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    q: &Query,
) -> Result<Response<Body>, ApiError> {
    let (mut items, rv) = store.list(&rt, ns, labels, fields);
    if let Some(token) = param(q, "continue").filter(|t| !t.is_empty()) {
        let (trv, after) = token
            .split_once('/')
            .and_then(|(r, rest)| Some((r.parse::<u64>().ok()?, rest)))
            .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
        if store.expired(trv) {
            return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
        }
        items.retain(|o| object_key(o).as_str() > after);
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = param(q, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
    {
        if items.len() > limit {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let last = items.last().map(object_key).unwrap_or_default();
            meta["continue"] = json!(format!("{rv}/{last}"));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(json_response(
        200,
        &json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": meta, "items": items}),
    ))
}

fn object_key(o: &Value) -> String {
    let ns = o
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{ns}/{name}")
}
