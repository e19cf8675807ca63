//! Validated names: calls, sessions, users, paths and external sandboxes.
//!
//! A name ends up in directory names, Kubernetes labels and argv elements, so it is checked once,
//! when it is made, against a whitelist: 1 to [`MAX_NAME_LEN`] bytes of `[A-Za-z0-9_.-]`, not
//! `.` or `..`, and not starting with `-` (an argv element that starts with `-` is an option).
//! Nothing else can build a name, deserialising included, so every name the core holds is safe
//! to use as one path component.
//!
//! A name is a [`SmolStr`]: up to 23 bytes are kept inline, so cloning one is a copy of three
//! words; a longer name (a UUID, say) is shared behind an `Arc`, as every name was before.
//! Names are cloned into every command and event that carries them, and an `Arc`'s atomic
//! reference count was, by sampling, a fifth of the time of a call cycle.
//!
//! A name also carries the hash of its text, computed when it is made: a name is hashed once in
//! its life, not at every map it passes through (about five per call). A name therefore hashes
//! as one word, not as its text, and does not `Borrow<str>`: look a record up by its name.

use std::fmt;

use smol_str::SmolStr;

use serde::{Deserialize, Serialize};

/// The longest name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// A name was rejected: it could escape a directory, reach a shell or an argv option, or is
/// empty or too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("invalid {what} name {name:?}: {why}")]
pub struct InvalidName {
    /// What the name was for (`call`, `session`, ...).
    pub what: String,
    /// The rejected text (lossy, cut to 200 bytes).
    pub name: String,
    /// Why it was rejected.
    pub why: String,
}

fn check(what: &str, name: &str) -> Result<(), InvalidName> {
    let why = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 128 bytes")
    } else if name == "." || name == ".." {
        Some("`.` and `..` name directories")
    } else if name.starts_with('-') {
        Some("it starts with `-`, which a command would read as an option")
    } else if name.contains('\0') {
        Some("it contains a NUL byte")
    } else if name.contains('/') || name.contains('\\') {
        Some("it contains a path separator")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        Some("only ASCII letters, digits, `_`, `.` and `-` are allowed")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => {
            // At most 200 bytes of it, cut at a character boundary.
            let mut cut = name.len().min(200);
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            let shown = name[..cut].to_string();
            Err(InvalidName {
                what: what.to_string(),
                name: shown,
                why: why.to_string(),
            })
        }
    }
}

/// The hash a name carries: FxHash of its text, the same in every process and run (the core
/// reads no randomness). Computed once when a name is made, so the core's maps, which hash a
/// name where it comes in and again where a record is forgotten, hash one word instead of the
/// text.
fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    text.hash(&mut h);
    h.finish()
}

/// Whether two names' texts are equal: the text comparison behind a name's `eq`, out of line
/// (a name's `eq` inlines into every scan and map probe; the text comparison, with its two
/// representations and `memcmp`, would make each copy long).
#[inline(never)]
fn same_text(a: &SmolStr, b: &SmolStr) -> bool {
    a == b
}

macro_rules! name_type {
    ($(#[$meta:meta])* $ty:ident, $what:literal) => {
        $(#[$meta])*
        ///
        /// Validated when made (see the module docs); cheap to clone.
        #[derive(Clone, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $ty {
            text: SmolStr,
            /// [`text_hash`] of `text`, computed once when the name is made.
            #[serde(skip)]
            hash: u64,
        }

        impl PartialEq for $ty {
            /// Inline, so that names that differ (which mostly differ in hash) cost one word
            /// compared and no call; the text is compared out of line, in [`same_text`].
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                self.hash == other.hash && same_text(&self.text, &other.text)
            }
        }

        impl Eq for $ty {}

        impl PartialOrd for $ty {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $ty {
            /// By text: outputs listed in name order are in the order of the names' text.
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.text.cmp(&other.text)
            }
        }

        impl std::hash::Hash for $ty {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                state.write_u64(self.hash);
            }
        }

        impl $ty {
            /// Checks `name` and makes the name, or says why it is not one.
            pub fn new(name: impl AsRef<str>) -> Result<Self, InvalidName> {
                let name = name.as_ref();
                check($what, name)?;
                Ok($ty::checked(SmolStr::new(name)))
            }

            /// A name from text already checked.
            fn checked(text: SmolStr) -> Self {
                let hash = text_hash(&text);
                $ty { text, hash }
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                self.text.as_str()
            }
        }

        impl TryFrom<String> for $ty {
            type Error = InvalidName;

            fn try_from(name: String) -> Result<Self, InvalidName> {
                $ty::new(name)
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = InvalidName;

            fn try_from(name: &str) -> Result<Self, InvalidName> {
                $ty::new(name)
            }
        }

        impl From<$ty> for String {
            fn from(name: $ty) -> String {
                name.text.to_string()
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.text.as_str())
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.text.as_str())
            }
        }
    };
}

name_type!(
    /// The name of one call (one turn of the agent for one user), chosen by the application.
    /// Live calls have distinct names; a name can be used again once its call has ended.
    CallId,
    "call"
);
name_type!(
    /// The name of a session: the conversation a call belongs to, and the owner of mirror paths.
    SessionId,
    "session"
);
name_type!(
    /// The name of a user, for the `User` isolation scope.
    UserId,
    "user"
);
name_type!(
    /// The name of a mirrored file of a session (the session log, a transcript segment, a memory
    /// file). One path component: a driver places it under a per-session directory.
    PathName,
    "path"
);
name_type!(
    /// The name of an application-supplied (external) sandbox. The core binds and unbinds it and
    /// never orders it started, stopped or shut down.
    ExternalId,
    "external sandbox"
);

impl PathName {
    /// The default path: the session log.
    pub fn session_log() -> Self {
        PathName::checked(SmolStr::new_static("session.log"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_or_reach_a_shell_are_rejected() {
        let long = "a".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a\0b",
            "-rf",
            "a b",
            "a;b",
            "$(x)",
            "a\\b",
            "é",
            long.as_str(),
        ] {
            let err = SessionId::new(bad).unwrap_err();
            assert_eq!(err.what, "session", "{bad:?}");
        }
        for good in ["s1", "a.b", "a-b_c", "...", "A9", &"a".repeat(MAX_NAME_LEN)] {
            assert_eq!(SessionId::new(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn deserialising_validates() {
        let ok: CallId = serde_json::from_str("\"c1\"").unwrap();
        assert_eq!(ok.as_str(), "c1");
        assert!(serde_json::from_str::<CallId>("\"../etc\"").is_err());
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"c1\"");
    }

    /// The rejected text shown is cut to 200 bytes, never inside a character.
    #[test]
    fn a_long_rejected_name_is_shown_cut_at_a_character_boundary() {
        let long = format!("{}é{}", "a".repeat(199), "b".repeat(100));
        let err = SessionId::new(&long).unwrap_err();
        assert_eq!(err.name, "a".repeat(199));
        let ascii = "a b".repeat(100);
        assert_eq!(SessionId::new(&ascii).unwrap_err().name, ascii[..200]);
    }

    #[test]
    fn the_error_says_what_and_why() {
        let err = PathName::new("a/b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid path name \"a/b\": it contains a path separator"
        );
    }
}
