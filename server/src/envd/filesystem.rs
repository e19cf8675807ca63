//! envd's filesystem service (`filesystem.Filesystem`): `Stat`, `ListDir`, `MakeDir`, `Move`,
//! `Remove`, all through the sandbox's keeper call (the watches are [`super::watch`]'s). The
//! operations API lists, reads, writes and removes; a directory is made (`mkdir -p`) and a path
//! moved (`mv -T`) by a command in the sandbox, as its user would. An entry shows its name, type, path and size (mode, owner and
//! times are not reported yet).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandkeeper_tokio::{Entry, EntryKind, EntryMeta, ExecOptions, OpError, SandboxWork, WorkPath};
use serde::Deserialize;
use serde_json::{json, Value};

use super::op_error;
use crate::error::{Code, ConnectError};
use crate::paths;

/// The most entries one `ListDir` answers.
pub const MAX_ENTRIES: usize = 10_000;

type Work<'a> = SandboxWork<'a, crate::backend::SandboxBackend>;

#[derive(Deserialize)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(app): State<crate::server::AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let sandbox = match super::sandbox(&app, &headers) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let bytes = match crate::body::read(&headers, body, app.limits.json_body).await {
        Ok(b) => b,
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    // Watches take the sandbox's lease for each listing only (see `watch`).
    match method.as_str() {
        "WatchDir" => return super::watch::stream(&sandbox, &headers, &bytes).await,
        "CreateWatcher" => return super::watch::create(&sandbox, &bytes).await,
        "GetWatcherEvents" => return super::watch::events(&sandbox, &bytes).await,
        "RemoveWatcher" => return super::watch::remove(&sandbox, &bytes),
        _ => {}
    }
    let lease = match super::lease(&sandbox).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let work = lease.work();
    let answer = match method.as_str() {
        "Stat" => stat_rpc(&work, &bytes).await,
        "ListDir" => list_dir(&work, &bytes).await,
        "MakeDir" => make_dir(&work, &bytes).await,
        "Move" => move_rpc(&work, &bytes).await,
        "Remove" => remove(&work, &bytes).await,
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!(
                "filesystem.Filesystem/{} is not supported yet by sandkeeperd",
                crate::error::shown(other)
            ),
        )),
    };
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn stat_rpc(work: &Work<'_>, bytes: &[u8]) -> Result<Value, ConnectError> {
    let request: PathRequest = crate::connect::decode(bytes)?;
    let path = paths::to_work(&request.path)?;
    let entry = stat(work, &path).await?.ok_or_else(|| not_found(&path))?;
    Ok(json!({ "entry": entry }))
}

async fn list_dir(work: &Work<'_>, bytes: &[u8]) -> Result<Value, ConnectError> {
    let request: PathRequest = crate::connect::decode(bytes)?;
    let dir = paths::to_work(&request.path)?;
    let depth = request.depth.max(1);
    let mut entries = Vec::new();
    // Depth first, each directory by name, an entry before what is in it (envd's walk order).
    let first = work.list(dir.as_str()).await.map_err(op_error)?;
    let mut stack = vec![(dir, 1u32, first.into_iter())];
    while let Some((dir, level, listed)) = stack.last_mut() {
        let Some(e) = listed.next() else {
            stack.pop();
            continue;
        };
        let path = paths::join(dir, &e.name)?;
        entries.push(entry_json(&path, &e));
        if entries.len() > MAX_ENTRIES {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_ENTRIES} entries"),
            ));
        }
        if e.kind == EntryKind::Dir && *level < depth {
            let level = *level + 1;
            let inner = work.list(path.as_str()).await.map_err(op_error)?;
            stack.push((path, level, inner.into_iter()));
        }
    }
    Ok(json!({ "entries": entries }))
}

async fn make_dir(work: &Work<'_>, bytes: &[u8]) -> Result<Value, ConnectError> {
    let request: PathRequest = crate::connect::decode(bytes)?;
    let path = paths::to_work(&request.path)?;
    match stat(work, &path).await? {
        Some(e) if e["type"] == "FILE_TYPE_DIRECTORY" => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("{} already exists", paths::to_e2b(&path)),
            ));
        }
        Some(_) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("{} exists and is not a directory", paths::to_e2b(&path)),
            ));
        }
        None => {}
    }
    path.writable().map_err(op_error)?;
    command(work, &["mkdir", "-p", "--", path.as_str()]).await?;
    let entry = stat(work, &path).await?.ok_or_else(|| not_found(&path))?;
    Ok(json!({ "entry": entry }))
}

async fn move_rpc(work: &Work<'_>, bytes: &[u8]) -> Result<Value, ConnectError> {
    let request: MoveRequest = crate::connect::decode(bytes)?;
    let source = paths::to_work(&request.source)?;
    let destination = paths::to_work(&request.destination)?;
    source.writable().map_err(op_error)?;
    destination.writable().map_err(op_error)?;
    stat(work, &source)
        .await?
        .ok_or_else(|| not_found(&source))?;
    command(
        work,
        &["mv", "-T", "--", source.as_str(), destination.as_str()],
    )
    .await?;
    let entry = stat(work, &destination)
        .await?
        .ok_or_else(|| not_found(&destination))?;
    Ok(json!({ "entry": entry }))
}

async fn remove(work: &Work<'_>, bytes: &[u8]) -> Result<Value, ConnectError> {
    let request: PathRequest = crate::connect::decode(bytes)?;
    let path = paths::to_work(&request.path)?;
    // As envd's: removing what is not there succeeds.
    match work.remove(path.as_str()).await {
        Ok(()) | Err(OpError::NotFound { .. }) => Ok(json!({})),
        Err(e) => Err(op_error(e)),
    }
}

/// The entry at `path`, or `None` when there is none (nor its directory).
pub async fn stat(work: &Work<'_>, path: &WorkPath) -> Result<Option<Value>, ConnectError> {
    let Some((dir, name)) = paths::split(path) else {
        let root = Entry {
            name: "user".into(),
            kind: EntryKind::Dir,
            size: 0,
            meta: EntryMeta::default(),
        };
        return Ok(Some(entry_json(path, &root)));
    };
    let listed = match work.list(dir.as_str()).await {
        Ok(listed) => listed,
        Err(OpError::NotFound { .. } | OpError::NotADirectory { .. }) => return Ok(None),
        Err(e) => return Err(op_error(e)),
    };
    Ok(listed
        .iter()
        .find(|e| e.name == name)
        .map(|e| entry_json(path, e)))
}

/// Runs a helper command in the workspace; a failure is `internal` with what it said.
async fn command(work: &Work<'_>, argv: &[&str]) -> Result<(), ConnectError> {
    let out = work
        .exec(argv.iter().copied(), ExecOptions::default())
        .await
        .map_err(op_error)?;
    if out.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&out.stderr);
        Err(ConnectError::new(
            Code::Internal,
            format!("{} failed: {}", argv[0], said.trim()),
        ))
    }
}

fn not_found(path: &WorkPath) -> ConnectError {
    ConnectError::new(
        Code::NotFound,
        format!("{} does not exist", paths::to_e2b(path)),
    )
}

/// An `EntryInfo` (proto3 JSON: the size as a string, the time RFC 3339), with what the
/// backend read of the entry: its permission bits as `mode` and as envd writes them
/// (`permissions`, Go's `FileMode` string: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`), its owner
/// and group (`user` for the sandbox's own user, [`sandbox_uid`], else the number), its
/// modification time and a symlink's target. What the backend did not read is left out (the
/// SDKs read it as 0 or empty).
pub fn entry_json(path: &WorkPath, e: &Entry) -> Value {
    let kind = match e.kind {
        EntryKind::File => "FILE_TYPE_FILE",
        EntryKind::Dir => "FILE_TYPE_DIRECTORY",
        EntryKind::Symlink => "FILE_TYPE_SYMLINK",
        EntryKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": paths::to_e2b(path),
        "size": e.size.to_string(),
    });
    let m = &e.meta;
    if let Some(mode) = m.mode {
        v["mode"] = json!(mode & 0o777);
        v["permissions"] = json!(permissions(e.kind, mode));
    }
    let name = |id: Option<u32>| {
        id.map(|id| {
            if Some(id) == sandbox_uid() {
                "user".to_string()
            } else {
                id.to_string()
            }
        })
    };
    if let Some(owner) = name(m.uid) {
        v["owner"] = json!(owner);
    }
    if let Some(group) = name(m.gid) {
        v["group"] = json!(group);
    }
    if let Some(t) = m.modified {
        v["modifiedTime"] = json!(crate::clock::rfc3339(t));
    }
    if let Some(target) = &m.link_target {
        v["symlinkTarget"] = json!(target);
    }
    v
}

/// The user (and group) the sandboxes' files belong to on the local backend: this process's
/// own, which owns `/proc/self` (read once; `None` where there is no `/proc`). The keeper
/// writes uploads as it, and commands run as it (bubblewrap maps it to itself).
pub fn sandbox_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    static UID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UID.get_or_init(|| std::fs::metadata("/proc/self").ok().map(|m| m.uid()))
}

/// Permission bits as Go's `FileMode.String` writes them (envd's `permissions`): the type and
/// special-bit letters that apply (`d` directory, `L` symlink, `?` anything else that is not a
/// file; `u` setuid, `g` setgid, `t` sticky), or `-` when none does, then `rwx` three times.
fn permissions(kind: EntryKind, mode: u32) -> String {
    let mut s = String::with_capacity(14);
    match kind {
        EntryKind::Dir => s.push('d'),
        EntryKind::Symlink => s.push('L'),
        EntryKind::Other => s.push('?'),
        EntryKind::File => {}
    }
    for (bit, letter) in [(0o4000, 'u'), (0o2000, 'g'), (0o1000, 't')] {
        if mode & bit != 0 {
            s.push(letter);
        }
    }
    if s.is_empty() {
        s.push('-');
    }
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_are_written_as_envd_writes_them() {
        assert_eq!(permissions(EntryKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(EntryKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(EntryKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(EntryKind::File, 0o4755), "urwxr-xr-x");
        assert_eq!(permissions(EntryKind::Dir, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(EntryKind::Other, 0o600), "?rw-------");
    }
}
