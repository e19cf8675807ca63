//! The deterministic simulator of sandkeeper. Filled in by its own issue.
