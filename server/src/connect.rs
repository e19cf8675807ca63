//! Connect's framing for envd's streams, JSON codec: an envelope is `flags: u8`, `length: u32`
//! big-endian, then that many bytes of JSON. Flag `0x02` marks the end-of-stream envelope,
//! whose JSON is `{}` or `{"error": {...}}`; flag `0x01` (compressed) is never used here.

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;

use crate::error::{Code, ConnectError};

/// The flag of a plain message.
pub const MESSAGE: u8 = 0x00;
/// The flag of a compressed message (refused).
pub const COMPRESSED: u8 = 0x01;
/// The flag of the end-of-stream envelope.
pub const END_STREAM: u8 = 0x02;

/// The content type of Connect's streams with the JSON codec.
pub const STREAM_JSON: &str = "application/connect+json";

/// One envelope around `json`.
pub fn frame(flags: u8, json: &serde_json::Value) -> Bytes {
    let body = json.to_string();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(flags);
    // A message is far below 4 GiB: every one here is a small event or a 64 KiB chunk.
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.put_slice(body.as_bytes());
    out.freeze()
}

/// A message envelope.
pub fn message(json: &serde_json::Value) -> Bytes {
    frame(MESSAGE, json)
}

/// The end-of-stream envelope: `{}`, or the error.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let json = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.to_json() }),
    };
    frame(END_STREAM, &json)
}

/// The one message of a server-streaming request's body: exactly one uncompressed envelope.
pub fn single_message<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why.to_string());
    let [flags, a, b, c, d, rest @ ..] = body else {
        return Err(bad("the request is not one Connect envelope"));
    };
    if *flags & COMPRESSED != 0 {
        return Err(bad("compressed envelopes are not supported"));
    }
    let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    if rest.len() != len {
        return Err(bad("the envelope's length does not match the body"));
    }
    decode(rest)
}

/// A JSON message (a unary request's body, or an envelope's content).
pub fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    let json = if json.is_empty() {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("invalid message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_round_trips_and_bad_ones_are_refused() {
        let f = message(&serde_json::json!({"a": 1}));
        assert_eq!(&f[..5], &[0, 0, 0, 0, 7]);
        let v: serde_json::Value = single_message(&f).unwrap();
        assert_eq!(v["a"], 1);
        assert!(single_message::<serde_json::Value>(&f[..6]).is_err());
        assert!(single_message::<serde_json::Value>(&[1, 0, 0, 0, 0]).is_err());
        assert!(single_message::<serde_json::Value>(&[0, 0]).is_err());
        assert_eq!(end_stream(None)[0], END_STREAM);
    }
}
