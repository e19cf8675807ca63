//! `GET /metrics`: counts and latencies in the Prometheus (OpenMetrics) text format. Labels are
//! fixed words (the backend, an outcome, a reason): no sandbox id, team or path ever shows
//! here, so the endpoint needs no key.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::server::AppState;

/// The labels of a count or a latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    /// The backend.
    pub backend: &'static str,
    /// How it ended (`ok`, `limit`, `too-large`, ...), or why (`api`, `timeout`, `shutdown`).
    pub outcome: &'static str,
}

type Latency = Family<Labels, Histogram, fn() -> Histogram>;

/// The labels of a hook's count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// The backend.
    pub backend: &'static str,
    /// Its point: `after-start`, `after-resume`, `before-suspend`, `before-stop`.
    pub point: &'static str,
    /// `ok` or `failed`.
    pub outcome: &'static str,
}

/// Every metric of the server.
pub struct Metrics {
    registry: Registry,
    /// The backend's name (`local`, `kubernetes`): every sample's `backend` label.
    backend: &'static str,
    /// Sandboxes running now.
    pub sandboxes: Gauge,
    /// Creates, by outcome.
    pub creates: Family<Labels, Counter>,
    /// Kills, by reason (`api`, `timeout`, `shutdown`).
    pub kills: Family<Labels, Counter>,
    /// Uploads to `/files`, by outcome.
    pub uploads: Family<Labels, Counter>,
    /// Commands started, by how they ended.
    pub commands: Family<Labels, Counter>,
    /// From a create's request to its sandbox ready (or the refusal), by outcome.
    pub create_seconds: Latency,
    /// From a kill's start to the keeper call released, by reason.
    pub kill_seconds: Latency,
    /// Paused sandboxes now.
    pub paused: Gauge,
    /// Hooks run, by point and outcome.
    pub hooks: Family<HookLabels, Counter>,
    /// From a pause's start to its keeper call released asking `Suspend`, by reason.
    pub pause_seconds: Latency,
    /// From a resume's start (connect of a paused sandbox) to its new call ready, by outcome.
    pub resume_seconds: Latency,
}

fn latency() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// The metrics of a server on `backend` (its name, as [`SandboxBackend::name`]).
    ///
    /// [`SandboxBackend::name`]: crate::backend::SandboxBackend::name
    pub fn new(backend: &'static str) -> Self {
        let mut registry = Registry::with_prefix("sandkeeperd");
        let metrics = Metrics {
            sandboxes: Gauge::default(),
            creates: Family::default(),
            kills: Family::default(),
            uploads: Family::default(),
            commands: Family::default(),
            create_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            kill_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            paused: Gauge::default(),
            hooks: Family::default(),
            pause_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            resume_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            registry: Registry::default(),
            backend,
        };
        registry.register(
            "sandboxes",
            "Sandboxes running now",
            metrics.sandboxes.clone(),
        );
        registry.register(
            "creates",
            "Sandbox creates, by outcome",
            metrics.creates.clone(),
        );
        registry.register("kills", "Sandbox kills, by reason", metrics.kills.clone());
        registry.register(
            "uploads",
            "Uploads to /files, by outcome",
            metrics.uploads.clone(),
        );
        registry.register(
            "commands",
            "Commands, by how they ended",
            metrics.commands.clone(),
        );
        registry.register(
            "create_seconds",
            "From a create's request to its sandbox ready, by outcome",
            metrics.create_seconds.clone(),
        );
        registry.register(
            "kill_seconds",
            "From a kill's start to its keeper call released, by reason",
            metrics.kill_seconds.clone(),
        );
        registry.register("paused", "Sandboxes paused now", metrics.paused.clone());
        registry.register(
            "hooks",
            "Hooks run (--hooks), by point and outcome",
            metrics.hooks.clone(),
        );
        registry.register(
            "pause_seconds",
            "From a pause's start to its keeper call released (drained, suspending), by reason",
            metrics.pause_seconds.clone(),
        );
        registry.register(
            "resume_seconds",
            "From a resume's start to its sandbox ready again, by outcome",
            metrics.resume_seconds.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Counts one in `family` with this outcome.
    pub fn count(&self, family: &Family<Labels, Counter>, outcome: &'static str) {
        family.get_or_create(&self.labels(outcome)).inc();
    }

    /// Counts a hook's run at `point`.
    pub fn count_hook(
        &self,
        family: &Family<HookLabels, Counter>,
        point: sandkeeper::HookPoint,
        outcome: &'static str,
    ) {
        family
            .get_or_create(&HookLabels {
                backend: self.backend,
                point: point.as_str(),
                outcome,
            })
            .inc();
    }

    /// Records a latency with this outcome.
    pub fn time(&self, family: &Latency, outcome: &'static str, took: Duration) {
        family
            .get_or_create(&self.labels(outcome))
            .observe(took.as_secs_f64());
    }

    /// The text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Metrics {
    fn labels(&self, outcome: &'static str) -> Labels {
        Labels {
            backend: self.backend,
            outcome,
        }
    }
}

/// `GET /metrics`.
pub async fn scrape(State(app): State<AppState>) -> Response {
    match app.registry.metrics().encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
