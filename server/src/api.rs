//! The sandbox REST API (the control plane): create, list, get, kill, timeout, refresh, pause,
//! resume and connect (which resumes a paused sandbox). Every route takes the caller's team
//! from `X-API-KEY` first; a sandbox of another team answers exactly as an unknown one (404).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandkeeper::SessionId;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::Team;
use crate::backend::SandboxBackend;
use crate::clock;
use crate::error::ApiError;
use crate::registry::{NewSandbox, Resumed, Sandbox};
use crate::server::AppState;

/// The envd version this server claims: the SDKs gate features on it (0.5.7: uploads as
/// `application/octet-stream`, which `/files` takes).
pub const ENVD_VERSION: &str = "0.5.7";

/// The metadata key that names the keeper session of a sandbox (sandboxes of one team naming
/// the same session share its keeper sandbox).
pub const SESSION_KEY: &str = "sandkeeper.session";

/// The timeout of a sandbox whose create names none, as E2B's.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

const MAX_METADATA: usize = 64;
const MAX_META_KEY: usize = 128;
const MAX_META_VALUE: usize = 1024;
const MAX_ENV: usize = 256;
const MAX_ENV_VALUE: usize = 32 * 1024;

/// A create's body (`NewSandbox` and `NewSandboxV2`); unknown fields are ignored.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<Value>,
    network: Option<Value>,
    mcp: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Value>,
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: 201 and the sandbox.
pub async fn create(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let team = app.caller(&headers)?;
    let body: CreateBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    let new = check_create(&team, body, app.limits.max_timeout)?;
    if new.auto_pause {
        // A timeout that pauses needs a backend that can keep the paused workspace.
        app.registry
            .pausable()
            .map_err(|e| ApiError::bad_request(format!("autoPause: {}", e.message)))?;
    }
    let sandbox = app.registry.create(team, new).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&sandbox))).into_response())
}

fn check_create(
    team: &Team,
    body: CreateBody,
    max_timeout: Duration,
) -> Result<NewSandbox, ApiError> {
    if body.auto_pause_memory == Some(true) {
        return Err(ApiError::bad_request(
            "autoPauseMemory is not supported by sandkeeperd: a pause keeps the filesystem, \
             not memory (running processes end)",
        ));
    }
    if body
        .auto_resume
        .as_ref()
        .is_some_and(|v| v.get("enabled") == Some(&Value::Bool(true)))
    {
        return Err(ApiError::bad_request(
            "autoResume is not supported yet by sandkeeperd",
        ));
    }
    for (name, field) in [
        ("network", &body.network),
        ("mcp", &body.mcp),
        ("iam", &body.iam),
        ("volumeMounts", &body.volume_mounts),
    ] {
        if field.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request(format!(
                "{name} is not supported by sandkeeperd"
            )));
        }
    }
    let template = body.template_id.unwrap_or_else(|| "base".into());
    let template_ok = !template.is_empty()
        && template.len() <= 128
        && template
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if !template_ok {
        return Err(ApiError::bad_request(
            "invalid templateID: 1 to 128 of [A-Za-z0-9_.:/-]",
        ));
    }
    let timeout = match body.timeout {
        None => DEFAULT_TIMEOUT,
        Some(t) => check_timeout(t, max_timeout)?,
    };
    let metadata = body.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let env = check_env(body.env_vars.unwrap_or_default())?;
    let session = match metadata.get(SESSION_KEY) {
        None => None,
        Some(name) => Some(team_session(team, name)?),
    };
    Ok(NewSandbox {
        template,
        timeout,
        metadata,
        env,
        session,
        auto_pause: body.auto_pause == Some(true),
    })
}

/// The keeper session a team's sandbox names: `<team>.<name>` (team names have no `.`), so
/// two teams naming the same session never share a sandbox.
fn team_session(team: &Team, name: &str) -> Result<SessionId, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("metadata {SESSION_KEY}: {why}"));
    if name.is_empty() {
        return Err(bad("empty".into()));
    }
    SessionId::new(format!("{team}.{name}")).map_err(|e| bad(e.to_string()))
}

/// A timeout in seconds: 1 up to the server's most.
fn check_timeout(seconds: i64, max: Duration) -> Result<Duration, ApiError> {
    match u64::try_from(seconds) {
        Ok(s) if s >= 1 && Duration::from_secs(s) <= max => Ok(Duration::from_secs(s)),
        _ => Err(ApiError::bad_request(format!(
            "timeout must be 1 to {} seconds",
            max.as_secs()
        ))),
    }
}

/// A timeout in seconds as [`check_timeout`] takes it, or the default when none is given.
fn timeout_or_default(seconds: Option<i64>, max: Duration) -> Result<Duration, ApiError> {
    seconds.map_or(Ok(DEFAULT_TIMEOUT), |s| check_timeout(s, max))
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_METADATA} metadata entries"
        )));
    }
    for (k, v) in metadata {
        if k.is_empty() || k.len() > MAX_META_KEY || v.len() > MAX_META_VALUE {
            return Err(ApiError::bad_request(format!(
                "metadata keys are 1 to {MAX_META_KEY} bytes, values at most {MAX_META_VALUE}"
            )));
        }
    }
    Ok(())
}

fn check_env(vars: BTreeMap<String, String>) -> Result<Vec<(String, String)>, ApiError> {
    if vars.len() > MAX_ENV {
        return Err(ApiError::bad_request(format!("at most {MAX_ENV} envVars")));
    }
    for (name, value) in &vars {
        sandkeeper_tokio::ops::check_env(name, value)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if value.len() > MAX_ENV_VALUE {
            return Err(ApiError::bad_request(format!(
                "envVars values are at most {MAX_ENV_VALUE} bytes"
            )));
        }
    }
    Ok(vars.into_iter().collect())
}

/// `GET /sandboxes`, `GET /v2/sandboxes`: the team's sandboxes, newest first (`order=asc`:
/// oldest first), filtered by `state`, `metadata`, `template` and `startedAfter`, paged by
/// `limit` and `nextToken` (the next page's token in `x-next-token`).
pub async fn list(
    State(app): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let team = app.caller(&headers)?;
    let query = crate::list_query::ListQuery::parse(query.as_deref().unwrap_or(""))?;
    let mut matching: Vec<_> = app
        .registry
        .list(&team)
        .await
        .into_iter()
        .filter(|s| query.matches(s))
        .collect();
    if query.descending {
        matching.reverse();
    }
    let sizes = Sizes::of(&app);
    let page: Vec<Value> = matching
        .iter()
        .skip(query.offset)
        .take(query.limit)
        .map(|s| detail_json(s, sizes))
        .collect();
    let mut response = Json(page).into_response();
    let next = query.offset.saturating_add(query.limit);
    if next < matching.len() {
        if let Ok(token) = HeaderValue::from_str(&next.to_string()) {
            response.headers_mut().insert("x-next-token", token);
        }
    }
    Ok(response)
}

/// `GET /sandboxes/{id}`: the sandbox's details.
pub async fn get(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let team = app.caller(&headers)?;
    let sandbox = visible(&app, &team, &id)?;
    Ok(Json(detail_json(&sandbox, Sizes::of(&app))))
}

/// `DELETE /sandboxes/{id}`: 204 once the sandbox is killed (its in-flight work drained, its
/// keeper call released), 404 if there is none.
pub async fn kill(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let team = app.caller(&headers)?;
    if app.registry.kill(&team, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::sandbox_not_found(&id))
    }
}

#[derive(Deserialize)]
struct TimeoutBody {
    timeout: i64,
}

/// `POST /sandboxes/{id}/timeout` `{"timeout": seconds}`: it expires that long from now.
pub async fn set_timeout(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let team = app.caller(&headers)?;
    let body: TimeoutBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    let timeout = check_timeout(body.timeout, app.limits.max_timeout)?;
    app.registry
        .set_timeout(&team, &id, timeout, false)
        .ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct RefreshBody {
    duration: Option<i64>,
}

/// `POST /sandboxes/{id}/refreshes` `{"duration": seconds}`: keeps it alive at least that
/// long from now (never shortens).
pub async fn refresh(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let team = app.caller(&headers)?;
    let body: RefreshBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    let timeout = timeout_or_default(body.duration, app.limits.max_timeout)?;
    app.registry
        .set_timeout(&team, &id, timeout, true)
        .ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// A connect's or a resume's body.
#[derive(Deserialize)]
struct ConnectBody {
    timeout: Option<i64>,
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect`: 200 and the sandbox
/// when it was running (a timeout only lengthens its life), 201 when it was paused and is
/// resumed (expiring `timeout` from now, 300 s if none is given).
pub async fn connect(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let team = app.caller(&headers)?;
    let body: ConnectBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    let timeout = body
        .timeout
        .map(|t| check_timeout(t, app.limits.max_timeout))
        .transpose()?;
    let (sandbox, resumed) = app
        .registry
        .resume(&team, &id, timeout.unwrap_or(DEFAULT_TIMEOUT))
        .await?;
    let status = match resumed {
        Resumed::Resumed => StatusCode::CREATED,
        Resumed::WasRunning => {
            if let Some(timeout) = timeout {
                app.registry.set_timeout(&team, &id, timeout, true);
            }
            StatusCode::OK
        }
    };
    Ok((status, Json(sandbox_json(&sandbox))).into_response())
}

/// `POST /sandboxes/{id}/resume` (the 1.x SDKs' resume): 201 and the sandbox once resumed; 409
/// when it is running.
pub async fn resume(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let team = app.caller(&headers)?;
    let body: ConnectBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    let timeout = timeout_or_default(body.timeout, app.limits.max_timeout)?;
    let visible = visible(&app, &team, &id)?;
    if !visible.is_paused() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    let (sandbox, _) = app.registry.resume(&team, &id, timeout).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&sandbox))).into_response())
}

/// A pause's body: read so that malformed JSON is refused; its fields are not interpreted.
#[derive(Deserialize)]
struct PauseBody {}

/// `POST /sandboxes/{id}/pause`: 204 once the sandbox is paused (its commands ended, its
/// in-flight work drained, its workspace kept by the keeper), 409 when it is paused already.
/// The body (`memory`, `requireHealthyGuest`) is read and bounded, not interpreted: a pause
/// keeps the filesystem, never memory.
pub async fn pause(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let team = app.caller(&headers)?;
    let _: PauseBody = crate::body::json(&headers, body, app.limits.json_body).await?;
    app.registry.pause(&team, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/metrics`: no metrics are collected yet, so an empty list.
pub async fn metrics(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let team = app.caller(&headers)?;
    visible(&app, &team, &id)?;
    Ok(Json(json!([])))
}

/// Pause, resume, fork, snapshots, network of one sandbox: 404 for a sandbox the team cannot
/// see (as for every sandbox route), else 501 naming what is not supported.
pub async fn sandbox_unsupported(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((id, what)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let team = app.caller(&headers)?;
    visible(&app, &team, &id)?;
    let what = match what.as_str() {
        "fork" => "fork",
        "snapshots" => "snapshots",
        "network" => "network rules",
        _ => "this operation",
    };
    Err(ApiError::not_supported(what))
}

/// Template builds, snapshots, volumes, secrets: 501 after the key is checked.
pub async fn unsupported(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    app.caller(&headers)?;
    Err(ApiError::not_supported(
        "this E2B API (templates, snapshots, volumes, secrets)",
    ))
}

/// A known path with another method: 405 in E2B's error shape.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

/// Anything else: 404 in E2B's error shape.
pub async fn fallback() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not found")
}

/// The team's sandbox `id`, or 404.
fn visible(app: &AppState, team: &Team, id: &str) -> Result<Arc<Sandbox>, ApiError> {
    app.registry
        .get(team, id)
        .ok_or_else(|| ApiError::sandbox_not_found(id))
}

/// The `Sandbox` answer of create and connect.
fn sandbox_json(s: &Sandbox) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "sandkeeperd",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.token(),
        "domain": null,
    })
}

/// What a sandbox may use, as the API reports it: the local backend's limits as configured
/// (`LocalConfig::limits`; `LocalBackend::limits` says how they are enforced on this machine),
/// 0 where there is none. On Kubernetes, 0: the pod's resources are the template's, which the
/// API does not restate.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    cpus: u32,
    memory_mb: u64,
    disk_mb: u64,
}

impl Sizes {
    fn of(app: &AppState) -> Self {
        let SandboxBackend::Local(local) = app.registry.keeper().backend() else {
            return Sizes {
                cpus: 0,
                memory_mb: 0,
                disk_mb: 0,
            };
        };
        let limits = &local.limits().limits;
        Sizes {
            cpus: limits.cpu_cores.unwrap_or(0),
            memory_mb: limits.memory_bytes.unwrap_or(0) >> 20,
            disk_mb: limits.workspace_bytes.unwrap_or(0) >> 20,
        }
    }
}

/// The `SandboxDetail` of get (and `ListedSandbox` of list).
fn detail_json(s: &Sandbox, sizes: Sizes) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "sandkeeperd",
        "startedAt": clock::rfc3339(s.started),
        "endAt": clock::rfc3339(s.end_at()),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.token(),
        "cpuCount": sizes.cpus,
        "memoryMB": sizes.memory_mb,
        "diskSizeMB": sizes.disk_mb,
        "state": if s.is_paused() { "paused" } else { "running" },
        "metadata": s.metadata,
        "lifecycle": {
            "autoResume": false,
            "onTimeout": if s.auto_pause { "pause" } else { "kill" },
        },
        "domain": null,
    })
}
