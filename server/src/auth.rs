//! API keys: each belongs to a team, and only its SHA-256 is kept (the server never holds a
//! key itself after start-up). The REST API's `X-API-KEY` names the caller's team.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The most bytes of a team name.
pub const MAX_TEAM_LEN: usize = 64;

/// A team: the owner of sandboxes. `[A-Za-z0-9_-]{1,64}` (no `.`: a team's keeper sessions are
/// `<team>.<session>`, unambiguous so), checked by [`Team::new`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Team(String);

impl Team {
    /// Checks a team name.
    pub fn new(name: &str) -> Result<Self, KeyError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_TEAM_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if ok {
            Ok(Team(name.to_string()))
        } else {
            Err(KeyError::BadTeam(name.chars().take(80).collect()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a key configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A team name that is not `[A-Za-z0-9_.-]{1,64}`.
    #[error("invalid team name {0:?}: use 1 to 64 of [A-Za-z0-9_-]")]
    BadTeam(String),
    /// A line of the key file that is not `<team> <sha256 hex>`.
    #[error("{file}:{line}: expected `<team> <sha256 of the key, 64 hex digits>`")]
    BadLine {
        /// The file.
        file: String,
        /// The line number (from 1).
        line: usize,
    },
    /// A `--api-key` that is not `TEAM:KEY`.
    #[error("--api-key expects TEAM:KEY")]
    BadFlag,
    /// An empty key.
    #[error("an API key may not be empty")]
    EmptyKey,
    /// The key file could not be read.
    #[error("reading {file}: {error}")]
    Read {
        /// The file.
        file: String,
        /// The error.
        error: std::io::Error,
    },
}

/// The known keys, by their SHA-256.
#[derive(Clone, Debug, Default)]
pub struct Keys {
    by_hash: HashMap<[u8; 32], Team>,
}

/// The SHA-256 of a key.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Keys {
    /// No keys: every request is refused.
    pub fn new() -> Self {
        Keys::default()
    }

    /// Adds a key by its hash.
    pub fn add_hash(&mut self, team: Team, hash: [u8; 32]) {
        self.by_hash.insert(hash, team);
    }

    /// Adds a key given as `TEAM:KEY` (the key is hashed at once).
    pub fn add_flag(&mut self, flag: &str) -> Result<(), KeyError> {
        let (team, key) = flag.split_once(':').ok_or(KeyError::BadFlag)?;
        if key.is_empty() {
            return Err(KeyError::EmptyKey);
        }
        self.add_hash(Team::new(team)?, hash_key(key));
        Ok(())
    }

    /// Adds the keys of a file: one `<team> <sha256 hex>` a line; blank lines and lines
    /// starting with `#` are skipped.
    pub fn add_file(&mut self, path: &Path) -> Result<(), KeyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| KeyError::Read {
            file: file.clone(),
            error,
        })?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || KeyError::BadLine {
                file: file.clone(),
                line: i + 1,
            };
            let mut parts = line.split_whitespace();
            let (Some(team), Some(hex_hash), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let mut hash = [0u8; 32];
            hex::decode_to_slice(hex_hash, &mut hash).map_err(|_| bad())?;
            self.add_hash(Team::new(team)?, hash);
        }
        Ok(())
    }

    /// How many keys are known.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The team of the request's `X-API-KEY`, or 401.
    pub fn team(&self, headers: &HeaderMap) -> Result<Team, ApiError> {
        let key = headers
            .get("x-api-key")
            .ok_or_else(|| ApiError::unauthorized("missing API key (the X-API-KEY header)"))?;
        let key = key
            .to_str()
            .map_err(|_| ApiError::unauthorized("invalid API key"))?;
        self.by_hash
            .get(&hash_key(key))
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("invalid API key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_by_hash_and_teams_are_checked() {
        let mut keys = Keys::new();
        keys.add_flag("team-a:secret").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", "secret".parse().unwrap());
        assert_eq!(keys.team(&headers).unwrap().as_str(), "team-a");
        headers.insert("x-api-key", "other".parse().unwrap());
        assert_eq!(keys.team(&headers).unwrap_err().status.as_u16(), 401);
        assert!(Team::new("a b").is_err());
        assert!(Team::new("").is_err());
        assert!(Team::new("a.b").is_err());
        assert!(keys.add_flag("nocolon").is_err());
        assert!(keys.add_flag("t:").is_err());
    }
}
