//! Signed `/files` URLs (the SDKs' `download_url()` / `upload_url()`): a request without the
//! sandbox headers, whose query carries `signature = "v1_" + base64(sha256("<path>:<read|write>:
//! <username>:<envdAccessToken>[:<expiration>]"))` (standard alphabet, no padding) and maybe
//! `signature_expiration` (Unix seconds). The URL names no sandbox, so the sandbox is the one
//! whose token makes the signature; none is 401, as is a signature past its expiration.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::clock;
use crate::error::ApiError;
use crate::registry::{Registry, Sandbox};

/// What a signed URL is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A download.
    Read,
    /// An upload.
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// The signature of a URL, as the SDKs make it.
pub fn signature(
    path: &str,
    op: Operation,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let raw = match expiration {
        None => format!("{path}:{}:{user}:{token}", op.as_str()),
        Some(e) => format!("{path}:{}:{user}:{token}:{e}", op.as_str()),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// What a signed URL's query carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    path: String,
    user: String,
    given: String,
    expiration: Option<String>,
}

impl Signed {
    /// The signed parts of a raw query; `None` when it carries no signature.
    pub fn of_query(query: Option<&str>) -> Option<Signed> {
        let mut path = None;
        let mut user = String::new();
        let mut given = None;
        let mut expiration = None;
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "path" => path = Some(v.into_owned()),
                "username" => user = v.into_owned(),
                "signature" => given = Some(v.into_owned()),
                "signature_expiration" => expiration = Some(v.into_owned()),
                _ => {}
            }
        }
        Some(Signed {
            path: path.unwrap_or_default(),
            user,
            given: given?,
            expiration,
        })
    }

    /// Whether the sandbox of access token `token` made this signature for `op` (compared
    /// in constant time).
    pub fn by(&self, op: Operation, token: &str) -> bool {
        let expected = signature(
            &self.path,
            op,
            &self.user,
            token,
            self.expiration.as_deref(),
        );
        expected.as_bytes().ct_eq(self.given.as_bytes()).into()
    }
}

/// The sandbox a signed request is for, from its raw query; `Ok(None)` when the query carries
/// no signature (the request must then name its sandbox by header).
pub fn sandbox(
    registry: &Registry,
    query: Option<&str>,
    op: Operation,
) -> Result<Option<Arc<Sandbox>>, ApiError> {
    let Some(signed) = Signed::of_query(query) else {
        return Ok(None);
    };
    let found = registry
        .all()
        .into_iter()
        .find(|s| signed.by(op, s.token()));
    let sandbox = found.ok_or_else(|| ApiError::unauthorized("invalid signature"))?;
    if let Some(expiration) = &signed.expiration {
        let at: u64 = expiration
            .parse()
            .map_err(|_| ApiError::bad_request("invalid signature_expiration"))?;
        let now = clock::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if at <= now {
            return Err(ApiError::unauthorized("signature is already expired"));
        }
    }
    Ok(Some(sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_sdks() {
        // From the Python SDK: get_signature("/home/user/a.txt", "read", None, "tok")
        let s = signature("/home/user/a.txt", Operation::Read, "", "tok", None);
        assert_eq!(s, "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY");
        assert_ne!(
            s,
            signature("/home/user/a.txt", Operation::Write, "", "tok", None)
        );
        assert_ne!(
            s,
            signature("/home/user/a.txt", Operation::Read, "", "tok", Some("1"))
        );
    }
}
