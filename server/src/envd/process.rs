//! envd's process service (`process.Process`): `Start` with streamed output, `List`,
//! `SendSignal` and `Connect`; a command's standard input (`SendInput`, `StreamInput`,
//! `CloseStdin`) is in `input.rs`. Commands run through the sandbox's keeper call
//! ([`SandboxWork::exec_streaming`](sandkeeper_tokio::SandboxWork::exec_streaming), or
//! [`SandboxWork::exec_with_input`](sandkeeper_tokio::SandboxWork::exec_with_input) with
//! `stdin: true`), in the workspace (the user's home), with the create's variables and the
//! request's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use bytes::Bytes;
use sandkeeper_tokio::{Chunk, ExecOptions, ExecOutput, Input, OpError};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::input;
use super::processes::{Event, Kill};
use crate::connect;
use crate::error::{Code, ConnectError};
use crate::metrics::Metrics;
use crate::registry::{Lease, Sandbox};
use crate::server::AppState;

/// The most bytes of stdout (and of stderr) a command keeps beside what it streams: the stream
/// carries everything, so the kept copy is small.
const KEPT_OUTPUT: usize = 64 * 1024;

/// How a command's stream ends.
enum Ended {
    /// With this `end` event, then the end-of-stream envelope.
    Event(Value),
    /// With this error in the end-of-stream envelope.
    Failed(ConnectError),
    /// Broken off: the sandbox was killed.
    SandboxKilled,
}

/// Where a command's stream goes: its `Start` response, and its followers (`Connect`).
struct Out {
    tx: mpsc::Sender<Frame>,
    events: broadcast::Sender<Event>,
}

impl Out {
    /// Sends a message envelope to both; a client gone away stops nothing (the command runs
    /// to its end, as envd's do).
    async fn send(&self, frame: Bytes) {
        let _ = self.events.send(Event::Frame(frame.clone()));
        let _ = self.tx.send(Ok(frame)).await;
    }
}

#[derive(Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Value>,
    tag: Option<String>,
    #[serde(default)]
    stdin: bool,
}

/// A command, by pid or by tag.
#[derive(Deserialize, Default)]
pub(super) struct Selector {
    pub(super) pid: Option<u32>,
    pub(super) tag: Option<String>,
}

/// A request naming a command (`SendSignal`, `CloseStdin`, `StreamInput`'s start).
#[derive(Deserialize)]
pub(super) struct SignalRequest {
    #[serde(default)]
    pub(super) process: Selector,
}

/// `POST /process.Process/{method}`.
pub async fn rpc(
    State(app): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let sandbox = match super::sandbox(&app, &headers) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    if method == "StreamInput" {
        // A client stream: read as it comes, each envelope within the body limit.
        return input::stream_input(&sandbox, &headers, body, app.limits.json_body).await;
    }
    let bytes = match crate::body::read(&headers, body, app.limits.json_body).await {
        Ok(b) => b,
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    match method.as_str() {
        "Start" => {
            let metrics = app.registry.metrics().clone();
            start(sandbox, &headers, &bytes, app.limits.run_timeout, metrics).await
        }
        "List" => Json(json!({"processes": sandbox.processes.list()})).into_response(),
        "SendSignal" => signal(&sandbox, &bytes).into_response(),
        "Connect" => follow(&sandbox, &bytes),
        "SendInput" => input::send_input(&sandbox, &headers, &bytes)
            .await
            .into_response(),
        "CloseStdin" => input::close_stdin(&sandbox, &headers, &bytes)
            .await
            .into_response(),
        other => ConnectError::new(
            Code::Unimplemented,
            format!(
                "process.Process/{} is not supported yet by sandkeeperd",
                crate::error::shown(other)
            ),
        )
        .into_response(),
    }
}

fn signal(sandbox: &Sandbox, bytes: &[u8]) -> Result<Json<Value>, ConnectError> {
    let request: SignalRequest = connect::decode(bytes)?;
    if sandbox
        .processes
        .kill(request.process.pid, request.process.tag.as_deref())
    {
        Ok(Json(json!({})))
    } else {
        Err(super::processes::no_such_process())
    }
}

/// A stream that is only its end-of-stream envelope, with the error `e` (a stream's errors go
/// in its end, with 200).
pub(super) fn stream_error(e: &ConnectError) -> Response {
    stream_response(Body::from(connect::end_stream(Some(e))))
}

/// A Connect stream's response (JSON codec) of `body`.
pub(super) fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, connect::STREAM_JSON)],
        body,
    )
        .into_response()
}

async fn start(
    sandbox: Arc<Sandbox>,
    headers: &HeaderMap,
    bytes: &[u8],
    run_timeout: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    let request: StartRequest = match connect::single_message(bytes) {
        Ok(r) => r,
        Err(e) => return stream_error(&e),
    };
    let prepared = prepare(&sandbox, request, headers, run_timeout);
    let (argv, options, config, tag, stdin) = match prepared {
        Ok(p) => p,
        Err(e) => return stream_error(&e),
    };
    let lease = match super::lease(&sandbox).await {
        Ok(l) => l,
        Err(e) => return stream_error(&e),
    };
    let pid = sandbox.next_pid();
    let (input, input_rx) = if stdin {
        let (tx, rx) = mpsc::channel::<Input>(input::INPUT_QUEUE);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let started = match sandbox.processes.add(pid, config, tag, input) {
        Ok(s) => s,
        Err(e) => return stream_error(&e),
    };
    let keepalive = keepalive_interval(headers);
    let (tx, rx) = mpsc::channel::<Frame>(16);
    let out = Out {
        tx,
        events: started.events,
    };
    let span = tracing::info_span!(
        "command",
        sandbox = %sandbox.id,
        team = %sandbox.team,
        session = %sandbox.session,
        pid,
    );
    let command = Command {
        sandbox,
        lease,
        pid,
        argv,
        options,
        input: input_rx,
        keepalive,
    };
    tokio::spawn(drive(command, out, started.killed, metrics).instrument(span));
    stream_response(Body::from_stream(ReceiverStream::new(rx)))
}

/// A piece of a stream's body; an error breaks the response off.
type Frame = Result<Bytes, std::io::Error>;

/// The error that breaks a stream off when its sandbox is killed.
pub(super) fn broken_off() -> std::io::Error {
    std::io::Error::other("the sandbox was killed")
}

/// `Connect`: follows a running command's stream from now on (its `start` event first), to
/// its end; broken off when its sandbox is killed; `not_found` for no such command.
fn follow(sandbox: &Sandbox, bytes: &[u8]) -> Response {
    let request: SignalRequest = match connect::single_message(bytes) {
        Ok(r) => r,
        Err(e) => return stream_error(&e),
    };
    let selector = request.process;
    let Some((pid, mut events)) = sandbox
        .processes
        .follow(selector.pid, selector.tag.as_deref())
    else {
        return stream_error(&ConnectError::new(Code::NotFound, "no such process"));
    };
    let (tx, rx) = mpsc::channel::<Frame>(16);
    tokio::spawn(async move {
        let start = connect::message(&json!({"event": {"start": {"pid": pid}}}));
        let _ = tx.send(Ok(start)).await;
        let last = loop {
            match events.recv().await {
                Ok(Event::Frame(frame)) => {
                    let _ = tx.send(Ok(frame)).await;
                }
                Ok(Event::End(end)) => {
                    let _ = tx.send(Ok(end)).await;
                    break Ok(connect::end_stream(None));
                }
                Ok(Event::Failed(e)) => break Ok(connect::end_stream(Some(&e))),
                // Fell behind: what it missed is gone, the rest follows.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break Err(broken_off()),
            }
        };
        let _ = tx.send(last).await;
    });
    stream_response(Body::from_stream(ReceiverStream::new(rx)))
}

/// A command ready to run in its sandbox.
struct Command {
    sandbox: Arc<Sandbox>,
    lease: Lease,
    pid: u32,
    argv: Vec<String>,
    options: ExecOptions,
    /// Its standard input, when it stays open (`stdin: true`).
    input: Option<mpsc::Receiver<Input>>,
    keepalive: Option<Duration>,
}

/// Runs a command to its end, streaming it to `out`: its `start` event, its output, then its
/// `end` event and the end-of-stream envelope, or the error, or a break (its sandbox killed).
async fn drive(
    command: Command,
    out: Out,
    killed: watch::Receiver<Option<Kill>>,
    metrics: Arc<Metrics>,
) {
    let Command {
        sandbox,
        lease,
        pid,
        argv,
        options,
        input,
        keepalive,
    } = command;
    let start = connect::message(&json!({"event": {"start": {"pid": pid}}}));
    let _ = out.tx.send(Ok(start)).await;
    let ended = run(&lease, (argv, options, input), &out, killed, keepalive).await;
    let outcome = match &ended {
        Ended::Event(event) if event["exited"] == true => "exited",
        Ended::Event(_) | Ended::SandboxKilled => "killed",
        Ended::Failed(e) if e.code == Code::DeadlineExceeded => "timeout",
        Ended::Failed(_) => "error",
    };
    metrics.count(&metrics.commands, outcome);
    tracing::info!(outcome, "command ended");
    sandbox.processes.remove(pid);
    drop(lease);
    let last = match ended {
        Ended::Event(event) => {
            let end = connect::message(&json!({"event": {"end": event}}));
            let _ = out.events.send(Event::End(end.clone()));
            let _ = out.tx.send(Ok(end)).await;
            Ok(connect::end_stream(None))
        }
        Ended::Failed(e) => {
            let _ = out.events.send(Event::Failed(e.clone()));
            Ok(connect::end_stream(Some(&e)))
        }
        Ended::SandboxKilled => Err(broken_off()),
    };
    let _ = out.tx.send(last).await;
}

type Prepared = (Vec<String>, ExecOptions, Value, Option<String>, bool);

/// The command's argv and options from the request (checked), its config for `List`, its tag,
/// and whether its standard input stays open.
fn prepare(
    sandbox: &Sandbox,
    request: StartRequest,
    headers: &HeaderMap,
    run_timeout: Duration,
) -> Result<Prepared, ConnectError> {
    if request.pty.is_some() {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "a PTY is not supported yet by sandkeeperd",
        ));
    }
    let p = request.process;
    let config = json!({"cmd": p.cmd, "args": p.args, "envs": p.envs, "cwd": p.cwd});
    let mut env = sandbox.env.clone();
    env.extend(p.envs);
    let cwd = match &p.cwd {
        Some(cwd) => crate::paths::to_work(cwd)?,
        None => sandkeeper_tokio::WorkPath::root(),
    };
    // A request's timeout shortens the server's longest, never lengthens it.
    let timeout = header_u64(headers, "connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .map_or(run_timeout, |t| t.min(run_timeout));
    let options = ExecOptions {
        cwd,
        env,
        stdin: Vec::new(),
        timeout: Some(timeout),
        output_cap: KEPT_OUTPUT,
    };
    let mut argv = vec![p.cmd];
    argv.extend(p.args);
    Ok((argv, options, config, request.tag, request.stdin))
}

/// How often a stream sends a keepalive, as the client's `Keepalive-Ping-Interval` asks:
/// between 1 s and 10 min (the SDKs ask for 50 s).
pub(super) fn keepalive_interval(headers: &HeaderMap) -> Option<Duration> {
    header_u64(headers, "keepalive-ping-interval")
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(s.min(600)))
}

pub(super) fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Runs the command, sending its output as it comes; answers how its stream ends.
async fn run(
    lease: &Lease,
    (argv, options, input): (Vec<String>, ExecOptions, Option<mpsc::Receiver<Input>>),
    out: &Out,
    mut killed: watch::Receiver<Option<Kill>>,
    keepalive: Option<Duration>,
) -> Ended {
    let work = lease.work();
    let (chunks_tx, mut chunks) = mpsc::channel::<Chunk>(16);
    let exec = async {
        match input {
            Some(input) => work.exec_with_input(argv, options, chunks_tx, input).await,
            None => work.exec_streaming(argv, options, chunks_tx).await,
        }
    };
    tokio::pin!(exec);
    let mut ticks = keepalive.map(tokio::time::interval);
    loop {
        tokio::select! {
            Some(chunk) = chunks.recv() => send_chunk(out, chunk).await,
            done = &mut exec => {
                while let Some(chunk) = chunks.recv().await {
                    send_chunk(out, chunk).await;
                }
                return end_event(done);
            }
            Some(kill) = async { killed.wait_for(Option::is_some).await.ok().and_then(|k| *k) } => {
                // Dropping the exec kills the command with everything it started.
                return match kill {
                    Kill::Signal => Ended::Event(killed_event()),
                    Kill::Sandbox => Ended::SandboxKilled,
                };
            }
            _ = async { match ticks.as_mut() { Some(t) => t.tick().await, None => std::future::pending().await } } => {
                out.send(connect::message(&json!({"event": {"keepalive": {}}}))).await;
            }
        }
    }
}

async fn send_chunk(out: &Out, chunk: Chunk) {
    let (stream, bytes) = match chunk {
        Chunk::Stdout(b) => ("stdout", b),
        Chunk::Stderr(b) => ("stderr", b),
    };
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    out.send(connect::message(
        &json!({"event": {"data": {stream: data}}}),
    ))
    .await;
}

fn killed_event() -> Value {
    json!({"exitCode": -1, "exited": false, "status": "signal: killed"})
}

fn end_event(done: Result<ExecOutput, OpError>) -> Ended {
    match done {
        Ok(out) => Ended::Event(match out.code {
            Some(code) => {
                json!({"exitCode": code, "exited": true, "status": format!("exit status {code}")})
            }
            None => killed_event(),
        }),
        Err(e) => Ended::Failed(super::op_error(e)),
    }
}
