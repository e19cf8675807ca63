//! A sandkeeper backend on Kubernetes.
//!
//! Not built yet: this crate is a placeholder in the workspace until its issue lands.
