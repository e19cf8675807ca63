//! A command's standard input (envd's `process.Process`): `SendInput` writes a piece to the
//! input of a command `Start`ed with `stdin: true`, `StreamInput` (client-streaming) each piece
//! of its stream as it arrives, `CloseStdin` closes it. The pieces go through the command's
//! input channel ([`sandkeeper_tokio::Input`]), bounded ([`INPUT_QUEUE`]); a PTY's input
//! answers `unimplemented`.

use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use sandkeeper_tokio::Input;
use tokio::sync::mpsc;

use super::process::{header_u64, stream_error, stream_response, Selector, SignalRequest};
use crate::connect;
use crate::error::{Code, ConnectError};
use crate::registry::Sandbox;

/// Pieces of a command's standard input (each at most a request body) queued for it: past
/// them, `SendInput` waits for the command to read, up to [`INPUT_WAIT`].
pub(super) const INPUT_QUEUE: usize = 4;

/// The longest a `SendInput` or `CloseStdin` waits for room in a command's input (shortened by
/// the request's own timeout): a command that does not read answers `deadline_exceeded`.
const INPUT_WAIT: Duration = Duration::from_secs(60);

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

/// `SendInput`: writes bytes to the standard input of a command started with `stdin: true`,
/// after what was sent before. Waits while its queue is full (the command reads slower than
/// it is sent), up to [`INPUT_WAIT`]. `not_found` for no such command (or one that ended),
/// `failed_precondition` for one whose input is not open, `unimplemented` for a PTY's input.
pub(super) async fn send_input(
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
pub(super) async fn stream_input(
    sandbox: &Sandbox,
    headers: &HeaderMap,
    body: Body,
    max: usize,
) -> Response {
    let mut from = body.into_data_stream();
    match stream_input_events(sandbox, headers, &mut from, max).await {
        Ok(()) => {
            let mut answer = connect::message(&json!({})).to_vec();
            answer.extend_from_slice(&connect::end_stream(None));
            stream_response(Body::from(answer))
        }
        Err(e) => {
            // Refused before the client's stream ended: the rest it sends is read and dropped
            // first (bounded), so that the client is not cut off while writing (it saw a broken
            // pipe) and the connection can carry its next request (it saw the connection
            // closed under it). Past the bound, the connection is said to close.
            let mut answer = stream_error(&e);
            if !drained(&mut from).await {
                answer.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            answer
        }
    }
}

/// Reads what is left of a refused request's body and drops it: whether it ended within the
/// bounds (1 MiB, 2 s).
async fn drained(from: &mut axum::body::BodyDataStream) -> bool {
    use futures_util::StreamExt;
    const MAX: usize = 1 << 20;
    let rest = async {
        let mut read = 0;
        while let Some(piece) = from.next().await {
            match piece {
                Ok(piece) => read += piece.len(),
                Err(_) => return false,
            }
            if read > MAX {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), rest)
        .await
        .unwrap_or(false)
}

async fn stream_input_events(
    sandbox: &Sandbox,
    headers: &HeaderMap,
    from: &mut axum::body::BodyDataStream,
    max: usize,
) -> Result<(), ConnectError> {
    use futures_util::StreamExt;
    let bad = |why: String| ConnectError::new(Code::InvalidArgument, why);
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
pub(super) async fn close_stdin(
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
