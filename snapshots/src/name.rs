//! A snapshot's name, `sbx-<n>-<instance>`: the sandbox whose workspace it is and the keeper
//! instance that stopped it. The local backend names its snapshot directories the same way, so
//! the [`Snapshot`] a Stop returns is the object's name.

use std::fmt;

use sandkeeper::{SandboxId, Snapshot};
use sandkeeper_tokio::local::shelf::snapshot_name_parts;

use crate::SnapshotError;

/// The longest instance this crate accepts.
const MAX_INSTANCE: usize = 64;

/// A validated snapshot name: a sandbox and an instance (1 to 64 ASCII letters, digits, `-`
/// or `_`). As text, `sbx-<n>-<instance>`, one safe object-name and path component.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotName {
    sandbox: SandboxId,
    instance: String,
}

impl SnapshotName {
    /// The snapshot of `sandbox` stopped by the keeper instance `instance`.
    pub fn new(sandbox: SandboxId, instance: &str) -> Result<Self, SnapshotError> {
        let invalid = |why| SnapshotError::InvalidName {
            name: instance.chars().take(200).collect(),
            why,
        };
        if instance.is_empty() || instance.len() > MAX_INSTANCE {
            return Err(invalid("an instance is 1 to 64 characters"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if !instance.chars().all(allowed) {
            return Err(invalid("an instance is ASCII letters, digits, '-' and '_'"));
        }
        Ok(SnapshotName {
            sandbox,
            instance: instance.to_string(),
        })
    }

    /// Parses `sbx-<n>-<instance>`.
    pub fn parse(text: &str) -> Result<Self, SnapshotError> {
        let (sandbox, instance) =
            snapshot_name_parts(text).map_err(|why| SnapshotError::InvalidName {
                name: text.chars().take(200).collect(),
                why,
            })?;
        SnapshotName::new(sandbox, instance)
    }

    /// The name of the backend's [`Snapshot`] reference.
    pub fn from_snapshot(snapshot: &Snapshot) -> Result<Self, SnapshotError> {
        SnapshotName::parse(snapshot.as_str())
    }

    /// The [`Snapshot`] reference a backend hands the core.
    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot::new(self.to_string())
    }

    /// The sandbox whose workspace it is.
    pub fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// The keeper instance that stopped it.
    pub fn instance(&self) -> &str {
        &self.instance
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sbx-{}-{}", self.sandbox.0, self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        let name = SnapshotName::new(SandboxId(7), "19a2f-x_1").unwrap();
        assert_eq!(name.to_string(), "sbx-7-19a2f-x_1");
        assert_eq!(SnapshotName::parse("sbx-7-19a2f-x_1").unwrap(), name);
        assert_eq!(
            SnapshotName::from_snapshot(&name.to_snapshot()).unwrap(),
            name
        );
        for bad in [
            "",
            "sbx-",
            "sbx-7",
            "sbx-7-",
            "sbx-x-a",
            "sbx-07-a",
            "sbx-7-a/b",
            "sbx-7-..",
            "sbx-7-a b",
            "box-7-a",
            "sbx--7-a",
        ] {
            assert!(SnapshotName::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(SnapshotName::new(SandboxId(1), &"a".repeat(65)).is_err());
    }
}
