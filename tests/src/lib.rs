//! Cross-crate tests of sandkeeper: driver and simulator agreement, end-to-end runs, and the
//! loopback Kubernetes API. Filled in by the driver issues.
