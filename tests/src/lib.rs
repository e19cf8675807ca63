//! Cross-crate tests of sandkeeper: driver and simulator agreement (`tests/agreement.rs`),
//! end-to-end runs, the loopback Kubernetes API, and the performance report's io-tokio figures
//! ([`perf_tokio`], measured against the naive baseline driver of [`naive`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod naive;
pub mod perf_tokio;
