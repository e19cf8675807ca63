//! Validated names: calls, sessions, users, paths and external sandboxes.
//!
//! A name ends up in directory names, Kubernetes labels and argv elements, so it is checked once,
//! when it is made, against a whitelist: 1 to [`MAX_NAME_LEN`] bytes of `[A-Za-z0-9_.-]`, not
//! `.` or `..`, and not starting with `-` (an argv element that starts with `-` is an option).
//! Nothing else can build a name, deserialising included, so every name the core holds is safe
//! to use as one path component.
//!
//! A name's text is a [`Text`]: up to 22 bytes are kept inline, so cloning one is a copy of
//! three words; a longer name (a UUID, say) is shared behind an `Arc`. Names are cloned into
//! every command and event that carries them, where an atomic reference count costs more than
//! the copy. `Text` is written here rather than taken from `smol_str` because two inline texts
//! compare as two fixed-size byte arrays, inline, where `SmolStr` decodes both representations
//! and calls `memcmp` out of line; names are compared wherever a record is found by name.
//!
//! Its layout is chosen for the processor: the inline form is 24 bytes aligned to 8, the bytes
//! then the length, and a shared text is told by a length no inline text has, with no tag byte
//! in front. A tag byte in front makes a copy move the bytes in odd pieces, and reading the copy
//! back then stalls on store forwarding at every clone of a name. The measurements behind both
//! choices are in `docs/performance.md`.
//!
//! A name also carries the hash of its text, computed when it is made: a name is hashed once in
//! its life, not at every map it passes through (about five per call). A name therefore hashes
//! as one word, not as its text, and does not `Borrow<str>`: look a record up by its name.

use std::fmt;

use std::sync::Arc;

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

/// The longest text kept inline in a [`Text`].
const INLINE_LEN: usize = 22;

/// A name's text (checked: ASCII, no NUL, see the module docs): up to [`INLINE_LEN`] bytes
/// inline, the bytes past the text zero, so two inline texts are equal exactly when their byte
/// arrays are; longer, shared behind an `Arc`. 24 bytes either way, with no tag byte: a shared
/// text is told by a length no inline text has (see [`Len`]).
#[derive(Clone)]
enum Text {
    /// A short text.
    Inline(Inline),
    /// A long text.
    Shared(Arc<str>),
}

/// A short text: its bytes, zero-padded, then its length. Aligned to 8 and moved whole, so that
/// a copy is three word moves: a layout with a tag byte before the bytes (as `Text` had) is
/// copied in odd pieces (bytes 1 to 8 as two overlapping 4-byte moves), and reading such a
/// copy back stalls the processor on every clone of a name (store forwarding fails).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Inline {
    bytes: [u8; INLINE_LEN],
    len: Len,
}

/// The length of an inline text, 0 to [`INLINE_LEN`]. An enum so that the other byte values
/// are free for the compiler to mark a shared text with (a niche): no tag byte of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[rustfmt::skip]
enum Len {
    L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11,
    L12, L13, L14, L15, L16, L17, L18, L19, L20, L21, L22,
}

/// Each [`Len`], by its value.
#[rustfmt::skip]
const LENS: [Len; INLINE_LEN + 1] = [
    Len::L0, Len::L1, Len::L2, Len::L3, Len::L4, Len::L5, Len::L6, Len::L7,
    Len::L8, Len::L9, Len::L10, Len::L11, Len::L12, Len::L13, Len::L14, Len::L15,
    Len::L16, Len::L17, Len::L18, Len::L19, Len::L20, Len::L21, Len::L22,
];

// The layout the docs above promise.
const _: () = assert!(std::mem::size_of::<Text>() == 24 && std::mem::size_of::<Inline>() == 24);

impl Text {
    /// The text of `s`.
    fn new(s: &str) -> Text {
        if s.len() <= INLINE_LEN {
            let mut bytes = [0; INLINE_LEN];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Text::Inline(Inline {
                bytes,
                len: LENS[s.len()],
            })
        } else {
            Text::Shared(Arc::from(s))
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Text::Inline(t) => &t.bytes[..t.len as usize],
            Text::Shared(text) => text.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Made from a `&str` cut at its end: valid UTF-8 (ASCII, for a checked name).
            Text::Inline { .. } => {
                std::str::from_utf8(self.as_bytes()).expect("a name's text is UTF-8")
            }
            Text::Shared(text) => text,
        }
    }
}

impl PartialEq for Text {
    /// Two inline texts: their byte arrays compared in place (no call, no loop).
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // The lengths need no comparing: a checked name has no NUL byte, so zero-padded
            // arrays are equal only when the texts, lengths included, are.
            (Text::Inline(x), Text::Inline(y)) => x.bytes == y.bytes,
            (Text::Shared(a), Text::Shared(b)) => Arc::ptr_eq(a, b) || a == b,
            // One inline and one shared text differ in length.
            _ => false,
        }
    }
}

impl Eq for Text {}

impl Ord for Text {
    /// By bytes, which for UTF-8 is by characters.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

macro_rules! name_type {
    ($(#[$meta:meta])* $ty:ident, $what:literal) => {
        $(#[$meta])*
        ///
        /// Validated when made (see the module docs); cheap to clone.
        #[derive(Clone, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $ty {
            text: Text,
            /// [`text_hash`] of `text`, computed once when the name is made.
            #[serde(skip)]
            hash: u64,
        }

        impl PartialEq for $ty {
            /// Inline, so that names that differ (which mostly differ in hash) cost one word
            /// compared, and equal short names a few more, with no call.
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                self.hash == other.hash && self.text == other.text
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
                Ok($ty::checked(Text::new(name)))
            }

            /// A name from text already checked.
            fn checked(text: Text) -> Self {
                let hash = text_hash(text.as_str());
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
                name.text.as_str().to_string()
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
        PathName::checked(Text::new("session.log"))
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

    /// Names of 22 bytes (the longest inline) and 23 (the shortest shared) keep their text;
    /// equal names made apart are equal either way, and a prefix is not equal to its name.
    #[test]
    fn names_at_the_inline_boundary_keep_their_text_and_compare_by_it() {
        for len in [1, 21, 22, 23, 24, MAX_NAME_LEN - 1] {
            let text = "a".repeat(len);
            let a = CallId::new(&text).unwrap();
            let b = CallId::new(&text).unwrap();
            assert_eq!(a.as_str(), text);
            assert_eq!(a, b, "{len} bytes");
            assert_eq!(a, a.clone());
            let longer = CallId::new(format!("{text}b")).unwrap();
            assert_ne!(a, longer, "{len} bytes against {} bytes", len + 1);
            assert!(a < longer);
        }
    }

    /// A text compares by its bytes alone (a name compares its hash first, so two names that
    /// differ are almost never told apart by their texts: this checks the texts directly).
    #[test]
    fn texts_are_equal_exactly_when_their_bytes_are() {
        let short = |s: &str| Text::new(s);
        let long = |s: &str| Text::new(&format!("{s}{}", "x".repeat(INLINE_LEN)));
        assert!(short("ab") == short("ab"));
        assert!(short("ab") != short("ac"));
        assert!(short("ab") != short("abc"));
        assert!(long("ab") == long("ab"));
        assert!(long("ab") != long("ac"));
        assert!(short("ab") != long("ab"));
        assert!(long("ab") != short("ab"));
        let shared = long("ab");
        assert!(shared == shared.clone());
    }

    proptest::proptest! {
        /// A name's equality and order are its text's, across inline and shared texts.
        #[test]
        fn names_compare_as_their_texts(
            a in "[a-c]{1,3}[a-c0-9._-]{0,27}",
            b in "[a-c]{1,3}[a-c0-9._-]{0,27}",
        ) {
            let (x, y) = (SessionId::new(&a).unwrap(), SessionId::new(&b).unwrap());
            proptest::prop_assert_eq!(x == y, a == b);
            proptest::prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            proptest::prop_assert_eq!(x.as_str(), a.as_str());
            proptest::prop_assert_eq!(String::from(y), b);
        }
    }
}
