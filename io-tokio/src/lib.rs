//! The async tokio driver for sandkeeper: it runs the [`sandkeeper`] core behind one cloneable
//! handle and executes its commands on a backend.
//!
//! Not built yet: this crate is a placeholder in the workspace until its issue lands.
