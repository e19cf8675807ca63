//! # sandkeeperd: the E2B protocol, with the keeper behind it
//!
//! A server that the official E2B SDKs (PyPI `e2b`, npm `e2b`) talk to unchanged: point
//! `E2B_API_URL` and `E2B_SANDBOX_URL` at it and give an `E2B_API_KEY` it knows. Each E2B
//! sandbox is one keeper call ([`registry`]) on the local backend or on Kubernetes
//! ([`backend`], [`kubernetes`]); its commands and files go through that call's sandbox
//! operations ([`envd`]). See `docs/server.md`.
//!
//! - [`server`]: the listener, the routes, start and end.
//! - [`auth`]: API keys (kept hashed) and teams; [`ratelimit`]: per-team request rates.
//! - [`api`]: the REST API ([`list_query`]: its list's filters and pages); [`registry`]: the
//!   sandbox table and lifecycle.
//! - [`envd`]: health, processes, filesystem, `/files`; [`connect`]: Connect's framing.
//! - [`metrics`]: `/metrics` in the Prometheus text format; [`request_span`]: a span around
//!   every request.
//! - [`error`]: the error shapes the SDKs read; [`body`]: bounded bodies; [`paths`]: E2B
//!   paths to workspace paths; [`clock`]: the wall clock.
//! - [`tls`]: optional TLS on the listener.
//! - `--fleet`: [`durable`], the root's sandbox table; [`replicas`], servers on one root
//!   answering for each other's sandboxes; [`route`] and [`forward`], a request sent to the
//!   replica that runs its sandbox.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod backend;
pub mod body;
pub mod clock;
pub mod connect;
pub mod durable;
pub mod envd;
pub mod error;
pub mod forward;
pub mod hooks;
pub mod hosts;
pub mod kubernetes;
pub mod list_query;
pub mod metrics;
pub mod paths;
pub mod ratelimit;
pub mod registry;
pub mod replicas;
pub mod request_span;
pub mod route;
pub mod server;
pub mod table;
pub mod table_k8s;
pub mod table_pg;
pub mod tls;
