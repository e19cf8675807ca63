//! Cross-crate tests of sandkeeper: driver and simulator agreement (`tests/agreement.rs`),
//! end-to-end runs, the loopback Kubernetes API, and the performance report (issue 6): its
//! workloads live here so that the report (`src/bin/perf.rs`) and the Criterion benches
//! (`benches/`) measure the same code: [`perf_core`], [`perf_sim`], [`perf_tokio`] (measured
//! against the naive baseline driver of [`naive`]), with the shared tools of [`measure`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod measure;
pub mod naive;
pub mod perf_core;
pub mod perf_fleet;
pub mod perf_k8s;
pub mod perf_local;
pub mod perf_sim;
pub mod perf_tiers;
pub mod perf_tokio;
