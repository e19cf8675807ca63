//! The values the core hands out or passes through: sandbox and upload ids, versions, isolation
//! keys, snapshots, call specs and payloads.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::name::{CallId, ExternalId, InvalidName, SessionId, UserId};

/// A sandbox, as the core numbers them: managed ones in the order their Start was ordered,
/// external ones when first bound. Never reused within one [`Lifecycle`](crate::Lifecycle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxId(pub u64);

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sbx-{}", self.0)
    }
}

/// One ordered upload. A completion names it, so a late completion of an abandoned upload is
/// recognised as stale. Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UploadId(pub u64);

impl fmt::Display for UploadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upl-{}", self.0)
    }
}

/// A version of one mirrored (session, path): the first flush is version 1, each flush the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// The isolation key of a call: calls with equal keys use one sandbox at a time (see
/// [`SameKey`](crate::SameKey)). Derived from the configured [`Scope`](crate::Scope), or from
/// the external sandbox a call names.
///
/// Serialised as its display text (`session:s1`, `agent`, ...), so it can key a JSON map.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Key {
    /// Scope `Call`: a fresh sandbox for every call.
    Call(CallId),
    /// Scope `Session`: one sandbox per session.
    Session(SessionId),
    /// Scope `User`: one sandbox per user.
    User(UserId),
    /// Scope `Agent`: one sandbox for the agent this core serves.
    Agent,
    /// Scope `Global`: one sandbox for everything. Inside one core it behaves as `Agent`; a
    /// backend may use the key to share one sandbox between several agents' cores.
    Global,
    /// An application-supplied sandbox, shared by every call that names it.
    External(ExternalId),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Call(c) => write!(f, "call:{c}"),
            Key::Session(s) => write!(f, "session:{s}"),
            Key::User(u) => write!(f, "user:{u}"),
            Key::Agent => f.write_str("agent"),
            Key::Global => f.write_str("global"),
            Key::External(e) => write!(f, "external:{e}"),
        }
    }
}

impl From<Key> for String {
    fn from(key: Key) -> String {
        key.to_string()
    }
}

impl TryFrom<String> for Key {
    type Error = InvalidName;

    fn try_from(text: String) -> Result<Key, InvalidName> {
        let (kind, name) = text.split_once(':').unwrap_or((text.as_str(), ""));
        Ok(match (kind, name) {
            ("agent", "") => Key::Agent,
            ("global", "") => Key::Global,
            ("call", n) => Key::Call(CallId::new(n)?),
            ("session", n) => Key::Session(SessionId::new(n)?),
            ("user", n) => Key::User(UserId::new(n)?),
            ("external", n) => Key::External(ExternalId::new(n)?),
            _ => {
                return Err(InvalidName {
                    what: "key".to_string(),
                    name: text.chars().take(200).collect(),
                    why:
                        "a key is call:, session:, user:, external: and a name, or agent or global"
                            .to_string(),
                })
            }
        })
    }
}

/// A backend's reference to a saved workspace, carried by a Stop acknowledgement, handed to
/// Persist and to the next Start of the same key as `resume_from`. Opaque to the core.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Snapshot(pub Arc<str>);

impl Snapshot {
    /// A snapshot reference from the backend's text.
    pub fn new(reference: impl AsRef<str>) -> Self {
        Snapshot(Arc::from(reference.as_ref()))
    }

    /// The reference as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// What a call asks of its sandbox (image, workspace options), passed through to Start untouched.
/// Opaque to the core; a driver defines its format. The empty spec, the default, asks for the
/// driver's own choice; it holds no text, so passing it along costs no reference count.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub struct Spec(Option<Arc<str>>);

impl Spec {
    /// A spec from the driver's text (empty: the default).
    pub fn new(spec: impl AsRef<str>) -> Self {
        let spec = spec.as_ref();
        Spec((!spec.is_empty()).then(|| Arc::from(spec)))
    }

    /// The spec as text (empty for the default).
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl From<String> for Spec {
    fn from(spec: String) -> Self {
        Spec::new(spec)
    }
}

impl From<Spec> for String {
    fn from(spec: Spec) -> String {
        spec.as_str().to_string()
    }
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The bytes of one flushed version. Cheap to clone: the core hands the same bytes to every
/// upload attempt.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(pub Arc<[u8]>);

impl Payload {
    /// A payload holding `bytes`.
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        Payload(bytes.into())
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}
