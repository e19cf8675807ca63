//! `pods/exec` over a websocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`): the argv runs as a
//! local process (never through a shell) in the pod's directory; frames carry a channel byte
//! (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize, 255 close). The status frame is a `Status`
//! document: `Success`, or `Failure`/`NonZeroExitCode` with an `ExitCode` cause.
//!
//! The pod's filesystem: argv elements under the container root (default `/workspace`) are
//! rewritten to the pod's directory on the host, so `tar -x -C /workspace/s1` writes into
//! `<pods root>/<namespace>/<pod>/workspace/s1`. As in a real cluster, a client that goes away
//! does not stop the process (only closes its stdin); deleting the pod kills it. The directory
//! stays when the pod is deleted, as a volume would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::faults::Fault;
use crate::resources::PODS;
use crate::server::{param, Body, Query, Shared, Target};
use crate::status::ApiError;
use crate::store::{EventType, Propagation};

/// Subprotocols served, in preference order.
pub const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Directory of a pod on the host.
pub fn pod_dir(root: &Path, namespace: &str, pod: &str) -> PathBuf {
    root.join(namespace).join(pod)
}

fn map_arg(arg: &str, container_root: &str, dir: &Path) -> String {
    let rest = arg.strip_prefix(container_root);
    match rest {
        Some(r) if r.is_empty() || r.starts_with('/') => {
            let base = dir.join(container_root.trim_start_matches('/'));
            format!("{}{r}", base.display())
        }
        _ => arg.to_string(),
    }
}

/// Validates an exec request and answers `101 Switching Protocols`; the session runs on the
/// upgraded connection.
pub(crate) fn upgrade(
    shared: Arc<Shared>,
    mut req: Request<Incoming>,
    target: &Target,
    q: &Query,
    fault: Option<Fault>,
) -> Result<Response<Body>, ApiError> {
    let ns = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let pod = shared.store.get(&PODS, &ns, &name)?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase != "Running" {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: pod {name} is not running (phase {phase:?})"
        )));
    }
    container_of(&pod, &name, param(q, "container"))?;
    let argv: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if argv.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let is_ws = req
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !is_ws {
        return Err(ApiError::bad_request(
            "the loopback serves exec over websockets only (v5.channel.k8s.io, v4.channel.k8s.io)",
        ));
    }
    let offered = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| {
            v.split(',')
                .map(|p| p.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    let protocol = offered
        .iter()
        .find(|p| PROTOCOLS.contains(&p.as_str()))
        .cloned()
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unsupported exec subprotocols {offered:?}; the loopback serves {PROTOCOLS:?}"
            ))
        })?;
    let key = req
        .headers()
        .get("sec-websocket-key")
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))?
        .as_bytes()
        .to_vec();
    let session = Session {
        shared: shared.clone(),
        namespace: ns,
        pod: name,
        argv,
        stdin: matches!(param(q, "stdin"), Some("true") | Some("1")),
        v5: protocol == PROTOCOLS[0],
        fault,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let ws =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            session.run(ws).await;
        }
    });
    let mut resp = Response::new(Empty::new().boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        "sec-websocket-accept",
        HeaderValue::from_str(&derive_accept_key(&key))
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    );
    h.insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(&protocol).map_err(|e| ApiError::bad_request(e.to_string()))?,
    );
    Ok(resp)
}

struct Session {
    shared: Arc<Shared>,
    namespace: String,
    pod: String,
    argv: Vec<String>,
    stdin: bool,
    v5: bool,
    fault: Option<Fault>,
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::Binary(Bytes::from(v))
}

fn exit_status(code: i32) -> Value {
    if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        })
    }
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

impl Session {
    async fn run(self, ws: Ws) {
        let dir = pod_dir(&self.shared.pods_root, &self.namespace, &self.pod);
        let (mut sink, mut stream) = ws.split();
        let mut pod_events = self.shared.store.subscribe();
        let argv: Vec<String> = self
            .argv
            .iter()
            .map(|a| map_arg(a, &self.shared.container_root, &dir))
            .collect();
        let spawned = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(&dir)
            .stdin(if self.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
                    "message": format!("Internal error occurred: error executing command in container: failed to exec {:?}: {e}", self.argv[0])});
                let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
                let _ = sink.send(normal_close()).await;
                return;
            }
        };
        // stdin pump: client frames → the process's stdin.
        let stdin = child.stdin.take();
        let cut_upload = self.fault == Some(Fault::DeletePodMidUpload);
        let mut stdin_left = match self.fault {
            Some(Fault::CutStdinAfter(n)) => Some(n),
            _ => None,
        };
        let mut stall_left = match self.fault {
            Some(Fault::StallStdinAfter(n)) => Some(n),
            _ => None,
        };
        let (store, ns, pod, v5) = (
            self.shared.store.clone(),
            self.namespace.clone(),
            self.pod.clone(),
            self.v5,
        );
        tokio::spawn(async move {
            let mut stdin: Option<ChildStdin> = stdin;
            let mut cut = cut_upload;
            while let Some(Ok(msg)) = stream.next().await {
                let data = match msg {
                    Message::Binary(b) => b,
                    Message::Text(t) => Bytes::copy_from_slice(t.as_bytes()),
                    Message::Close(_) => break,
                    _ => continue,
                };
                match data.first() {
                    Some(0) if data.len() > 1 => {
                        if cut {
                            cut = false;
                            let _ = store.delete(&PODS, &ns, &pod, Propagation::Background, None);
                        }
                        let mut bytes = &data[1..];
                        for left in [stdin_left.as_mut(), stall_left.as_mut()]
                            .into_iter()
                            .flatten()
                        {
                            bytes = &bytes[..bytes.len().min(*left)];
                            *left -= bytes.len();
                        }
                        if let Some(s) = stdin.as_mut() {
                            if s.write_all(bytes).await.is_err() {
                                stdin = None;
                            }
                        }
                        if stdin_left == Some(0) {
                            // The connection is cut here: the process's input ends.
                            stdin = None;
                        }
                    }
                    // A stalled connection never delivers the end of input.
                    Some(255) if v5 && data.get(1) == Some(&0) && stall_left.is_none() => {
                        stdin = None
                    }
                    _ => {}
                }
            }
            // The client went away or closed: stdin ends; the process is not killed.
            drop(stdin);
        });
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let (mut out_buf, mut err_buf) = (vec![0u8; 32 * 1024], vec![0u8; 32 * 1024]);
        let mut client_open = true;
        let code = loop {
            if stdout.is_none() && stderr.is_none() {
                tokio::select! {
                    st = child.wait() => break st.ok().map(|s| exit_code(&s)),
                    _ = pod_deleted(&mut pod_events, &self.namespace, &self.pod) => {
                        let _ = child.kill().await;
                        break None;
                    }
                }
            }
            tokio::select! {
                n = read_some(&mut stdout, &mut out_buf) => match n {
                    Some(n) => if client_open { client_open = sink.send(frame(1, &out_buf[..n])).await.is_ok() },
                    None => stdout = None,
                },
                n = read_some(&mut stderr, &mut err_buf) => match n {
                    Some(n) => if client_open { client_open = sink.send(frame(2, &err_buf[..n])).await.is_ok() },
                    None => stderr = None,
                },
                _ = pod_deleted(&mut pod_events, &self.namespace, &self.pod) => {
                    let _ = child.kill().await;
                    break None;
                }
            }
        };
        match (code, &self.fault) {
            (Some(code), None)
            | (Some(code), Some(Fault::Delay(_)))
            | (Some(code), Some(Fault::StallStdinAfter(_))) => {
                let _ = sink
                    .send(frame(3, exit_status(code).to_string().as_bytes()))
                    .await;
            }
            // No status frame: an injected fault, or the pod went away under the command.
            _ => {}
        }
        let _ = sink.send(normal_close()).await;
        let _ = sink.close().await;
    }
}

/// A close frame with code 1000: clients read it as the end of every stream.
fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

fn exit_code(s: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match r {
        Some(r) => match r.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

async fn pod_deleted(
    rx: &mut tokio::sync::broadcast::Receiver<Arc<crate::store::Event>>,
    ns: &str,
    pod: &str,
) {
    loop {
        match rx.recv().await {
            Ok(ev) => {
                if ev.kind == EventType::Deleted
                    && ev.resource == PODS
                    && ev.namespace == ns
                    && ev.object.pointer("/metadata/name").and_then(Value::as_str) == Some(pod)
                {
                    return;
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => std::future::pending::<()>().await,
        }
    }
}

/// The container an exec runs in, by the API server's rule (kubernetes
/// `pkg/registry/core/pod/strategy.go`, `streamLocation`): a named container must be one of
/// the pod's; with none named, the pod's only container, and a 400 when it has none or several
/// (kubectl's "first container" default is the client's, not the server's).
fn container_of(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let names = |path: &str| -> Vec<String> {
        pod.pointer(path)
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("/spec/containers");
    match asked {
        Some(c) if containers.iter().any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None if containers.is_empty() => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}"
        ))),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            let init = names("/spec/initContainers");
            if !init.is_empty() {
                message += &format!(" or one of the init containers: [{}]", init.join(" "));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

#[cfg(test)]
mod container_rule {
    use super::*;
    use serde_json::json;

    fn pod(containers: &[&str]) -> Value {
        let cs: Vec<Value> = containers.iter().map(|c| json!({"name": c})).collect();
        json!({"spec": {"containers": cs}})
    }

    #[test]
    fn the_only_container_is_taken_and_several_need_a_name() {
        assert_eq!(container_of(&pod(&["main"]), "p", None).unwrap(), "main");
        let err = container_of(&pod(&["main", "proxy"]), "p", None).unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "a container name must be specified for pod p, choose one of: [main proxy]"
        );
        assert_eq!(
            container_of(&pod(&["main", "proxy"]), "p", Some("proxy")).unwrap(),
            "proxy"
        );
        let err = container_of(&pod(&["main"]), "p", Some("side")).unwrap_err();
        assert_eq!(err.message, "container side is not valid for pod p");
    }
}
