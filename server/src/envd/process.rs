//! envd's process service (`process.Process`): `Start` with streamed output, `List`,
//! `SendSignal`, `Connect`, and a command's standard input: `Start` with `stdin: true` keeps it
//! open, `SendInput` writes a piece to it, `StreamInput` (client-streaming) each piece of its
//! stream as it arrives, `CloseStdin` closes it (input to a PTY answers `unimplemented`). Commands run through the sandbox's keeper call
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

use super::processes::{Event, Kill};
use crate::connect;
use crate::error::{Code, ConnectError};
use crate::metrics::Metrics;
use crate::registry::{Lease, Sandbox};
use crate::server::AppState;

/// The most bytes of stdout (and of stderr) a command keeps beside what it streams: the stream
/// carries everything, so the kept copy is small.
const KEPT_OUTPUT: usize = 64 * 1024;

/// Pieces of a command's standard input (each at most a request body) queued for it: past
/// them, `SendInput` waits for the command to read, up to [`INPUT_WAIT`].
const INPUT_QUEUE: usize = 4;

/// The longest a `SendInput` or `CloseStdin` waits for room in a command's input (shortened by
/// the request's own timeout): a command that does not read answers `deadline_exceeded`.
const INPUT_WAIT: Duration = Duration::from_secs(60);

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

#[derive(Deserialize, Default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize)]
struct SignalRequest {
    #[serde(default)]
    process: Selector,
}

/// `SendInput`'s request: the command, and its input (bytes in base64, as protobuf's JSON).
#[derive(Deserialize)]
struct InputRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: ProcessInput,
}

#[derive(Deserialize, Default)]
struct ProcessInput {
    stdin: Option<String>,
    pty: Option<String>,
}

/// One event of `StreamInput`'s client stream: `start` (the command) first, then `data` and
/// `keepalive` events.
#[derive(Deserialize)]
struct StreamInputEvent {
    start: Option<SignalRequest>,
    data: Option<StreamData>,
}

#[derive(Deserialize)]
struct StreamData {
    #[serde(default)]
    input: ProcessInput,
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
        return stream_input(&sandbox, &headers, body, app.limits.json_body).await;
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
        "SendInput" => send_input(&sandbox, &headers, &bytes).await.into_response(),
        "CloseStdin" => close_stdin(&sandbox, &headers, &bytes)
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

/// `SendInput`: writes bytes to the standard input of a command started with `stdin: true`,
/// after what was sent before. Waits while its queue is full (the command reads slower than
/// it is sent), up to [`INPUT_WAIT`]. `not_found` for no such command (or one that ended),
/// `failed_precondition` for one whose input is not open, `unimplemented` for a PTY's input.
async fn send_input(
    sandbox: &Sandbox,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Json<Value>, ConnectError> {
    let request: InputRequest = connect::decode(bytes)?;
    let data = input_bytes(request.input)?;
    let selector = request.process;
    let tx = sandbox
        .processes
        .stdin(selector.pid, selector.tag.as_deref())?;
    if data.is_empty() {
        return Ok(Json(json!({})));
    }
    queue(&tx, Input::Stdin(data), headers).await?;
    Ok(Json(json!({})))
}

/// A request's input as bytes (none when it carries none); `unimplemented` for a PTY's.
fn input_bytes(input: ProcessInput) -> Result<Vec<u8>, ConnectError> {
    match input {
        ProcessInput { pty: Some(_), .. } => Err(ConnectError::new(
            Code::Unimplemented,
            "a PTY is not supported by sandkeeperd: send to stdin",
        )),
        ProcessInput {
            stdin: Some(data), ..
        } => base64_bytes(&data),
        ProcessInput { stdin: None, .. } => Ok(Vec::new()),
    }
}

/// `StreamInput`: a client stream whose `start` event names a command started with
/// `stdin: true` and whose `data` events each go to its standard input as they arrive, in
/// order (each waiting for room as `SendInput` does). The stream's end does not close the
/// input (`CloseStdin` does). Answers one empty message then the end of the stream, or the
/// error in the end of the stream: as `SendInput`'s, `invalid_argument` for events out of
/// order or an envelope cut short, `resource_exhausted` for an envelope over `max` bytes.
async fn stream_input(sandbox: &Sandbox, headers: &HeaderMap, body: Body, max: usize) -> Response {
    match stream_input_events(sandbox, headers, body, max).await {
        Ok(()) => {
            let mut answer = connect::message(&json!({})).to_vec();
            answer.extend_from_slice(&connect::end_stream(None));
            stream_response(Body::from(answer))
        }
        Err(e) => stream_error(&e),
    }
}

async fn stream_input_events(
    sandbox: &Sandbox,
    headers: &HeaderMap,
    body: Body,
    max: usize,
) -> Result<(), ConnectError> {
    use futures_util::StreamExt;
    let bad = |why: String| ConnectError::new(Code::InvalidArgument, why);
    let mut from = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut to: Option<mpsc::Sender<Input>> = None;
    loop {
        while let Some(json) = take_envelope(&mut buf, max)? {
            let event: StreamInputEvent = connect::decode(&json)?;
            match (event.start, event.data, &to) {
                (Some(start), _, None) => {
                    let selector = start.process;
                    to = Some(
                        sandbox
                            .processes
                            .stdin(selector.pid, selector.tag.as_deref())?,
                    );
                }
                (Some(_), _, Some(_)) => return Err(bad("a second start event".into())),
                (None, Some(_), None) => {
                    return Err(bad("a data event before the start event".into()))
                }
                (None, Some(data), Some(tx)) => {
                    let bytes = input_bytes(data.input)?;
                    if !bytes.is_empty() {
                        queue(tx, Input::Stdin(bytes), headers).await?;
                    }
                }
                // A keepalive (or an event of a later protocol): nothing to do.
                (None, None, _) => {}
            }
        }
        match from.next().await {
            Some(Ok(piece)) => buf.extend_from_slice(&piece),
            Some(Err(e)) => return Err(bad(format!("the request broke off: {e}"))),
            None if buf.is_empty() => return Ok(()),
            None => return Err(bad("the stream ends inside an envelope".into())),
        }
    }
}

/// The JSON of the first whole envelope at the head of `buf`, taken out of it; `None` until
/// one is whole. An envelope over `max` bytes is refused before it is read.
fn take_envelope(buf: &mut Vec<u8>, max: usize) -> Result<Option<Vec<u8>>, ConnectError> {
    let [flags, a, b, c, d, ..] = buf[..] else {
        return Ok(None);
    };
    if flags & connect::COMPRESSED != 0 {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "compressed envelopes are not supported",
        ));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len > max {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("an envelope of {len} bytes, over the limit of {max}"),
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let json = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some(json))
}

/// `CloseStdin`: closes the standard input of a command started with `stdin: true`, after what
/// was sent before (the command reads its end). Closing it again does nothing.
async fn close_stdin(
    sandbox: &Sandbox,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Json<Value>, ConnectError> {
    let request: SignalRequest = connect::decode(bytes)?;
    let selector = request.process;
    let closing = sandbox
        .processes
        .close_stdin(selector.pid, selector.tag.as_deref())?;
    if let Some(tx) = closing {
        queue(&tx, Input::Close, headers).await?;
    }
    Ok(Json(json!({})))
}

/// Queues `input` for a command, waiting for room up to [`INPUT_WAIT`] or the request's
/// timeout; a command that ended meanwhile is `not_found`.
async fn queue(
    tx: &mpsc::Sender<Input>,
    input: Input,
    headers: &HeaderMap,
) -> Result<(), ConnectError> {
    let wait = header_u64(headers, "connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map_or(INPUT_WAIT, |ms| Duration::from_millis(ms).min(INPUT_WAIT));
    match tokio::time::timeout(wait, tx.send(input)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(super::processes::no_such_process()),
        Err(_) => Err(ConnectError::new(
            Code::DeadlineExceeded,
            format!("the command did not read its stdin for {wait:?}"),
        )),
    }
}

/// Bytes as protobuf's JSON writes them: base64, standard or URL-safe, padded or not.
fn base64_bytes(data: &str) -> Result<Vec<u8>, ConnectError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(data).ok())
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "the input is not base64"))
}

/// A stream that is only its end, with an error (a stream's errors go in its end, with 200).
/// A stream that is only its end-of-stream envelope, with `e`.
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
        let (tx, rx) = mpsc::channel::<Input>(INPUT_QUEUE);
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

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_taken_whole_in_order_and_bounded() {
        let mut buf = connect::message(&json!({"a": 1})).to_vec();
        buf.extend_from_slice(&connect::message(&json!({"b": 2})));
        let whole = buf.len();
        // Cut short: nothing until the rest comes.
        let mut head = buf[..7].to_vec();
        assert_eq!(take_envelope(&mut head, 64), Ok(None));
        assert_eq!(
            take_envelope(&mut buf, 64),
            Ok(Some(br#"{"a":1}"#.to_vec()))
        );
        assert!(buf.len() < whole);
        assert_eq!(
            take_envelope(&mut buf, 64),
            Ok(Some(br#"{"b":2}"#.to_vec()))
        );
        assert_eq!(take_envelope(&mut buf, 64), Ok(None));
        // Over the limit, refused from its header alone; compressed, refused.
        let mut big = vec![0, 0, 1, 0, 0];
        let code = take_envelope(&mut big, 64).err().map(|e| e.code);
        assert_eq!(code, Some(Code::ResourceExhausted));
        let mut packed = vec![connect::COMPRESSED, 0, 0, 0, 0];
        let code = take_envelope(&mut packed, 64).err().map(|e| e.code);
        assert_eq!(code, Some(Code::InvalidArgument));
    }

    #[test]
    fn input_is_base64_of_either_alphabet_and_a_ptys_is_refused() {
        assert_eq!(base64_bytes("aGk/Pw==").unwrap(), b"hi??");
        assert_eq!(base64_bytes("aGk_Pw").unwrap(), b"hi??");
        assert!(base64_bytes("not base64!").is_err());
        let pty = ProcessInput {
            stdin: None,
            pty: Some("aGk=".into()),
        };
        let code = input_bytes(pty).err().map(|e| e.code);
        assert_eq!(code, Some(Code::Unimplemented));
    }
}
