//! The io-tokio figures of the performance report (issue 6), measured by `src/bin/perf.rs`; the
//! workloads behind the wall-clock ones ([`WarmSandbox`], [`ChannelRoundTrip`],
//! [`DrainRelease`]) are also measured by `benches/tokio.rs` (Criterion's detail behind them):
//!
//! - `tokio.acquire_release_vs_channel` (x, wall clock): acquire + release of an already-warm
//!   sandbox through [`Keeper`] ([`WarmSandbox`]: `KeepWarm`, so every acquire after the first
//!   revives the warm sandbox; a no-op backend), against one bare tokio mpsc + oneshot round
//!   trip to a server task ([`ChannelRoundTrip`]), on the same current-thread runtime,
//!   interleaved rounds, median of the per-round ratios. `tokio.acquire_release_ns` is our
//!   side's median per acquire + release.
//! - `tokio.hol_release_ratio` (x, virtual time): p99 release latency of probe sessions with no
//!   pending mirror while 1,000 other sessions (each with a live call) have uploads hung, against
//!   the same workload with none hung. A probe's release latency runs from the release until its
//!   sandbox's Shutdown has been answered (drain, Stop, Shutdown: 5 ms each of simulated time
//!   for Stop and Shutdown). `tokio.hol_release_ratio_naive` is the same workload on
//!   [`NaiveKeeper`] (one process-wide FIFO mirror queue drained before any release, uploads
//!   bounded by the core's default upload timeout, 10 s). The p99s themselves are reported too
//!   (`tokio.hol_release_p99_{ours,naive}_{hung,calm}`, ms).
//! - `tokio.drain_overhead` (ms, virtual time): the median release latency with one pending
//!   upload minus the median with none ([`DrainRelease`]), minus the upload's own simulated time
//!   (100 ms). Zero means a drain costs exactly the upload it waits for.
//!   `tokio.drain_release_ms` is the median release latency with the pending upload. The
//!   benches time the same releases on the wall clock: the CPU a drain costs.
//!
//! Virtual-time figures run on tokio's paused clock (`start_paused`): they are deterministic, so
//! one run of each side is the measurement. Only the first figure reads the wall clock.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkeeper::{
    CallId, CallSpec, Config, PathName, ReleasePolicy, SandboxId, SessionId, Snapshot,
};
use sandkeeper_tokio::{
    Backend, BackendError, DiscardRequest, Keeper, KeeperConfig, PersistRequest, Released,
    StartRequest, StopRequest, UploadRequest,
};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::measure::{median, ns_per, wall, Sink};
use crate::naive::NaiveKeeper;

/// Measures every io-tokio figure and hands each to `report` as (name, value, unit).
pub fn tokio_figures(report: Sink) {
    let warm = acquire_release_vs_channel(11, 20_000);
    report("tokio.acquire_release_ns", warm.ours_ns, "ns");
    report("tokio.acquire_release_vs_channel", warm.ratio, "x");

    let hol = hol_release(&HolWorkload::full());
    report("tokio.hol_release_p99_ours_calm", ms(hol.ours_calm), "ms");
    report("tokio.hol_release_p99_ours_hung", ms(hol.ours_hung), "ms");
    report("tokio.hol_release_p99_naive_calm", ms(hol.naive_calm), "ms");
    report("tokio.hol_release_p99_naive_hung", ms(hol.naive_hung), "ms");
    report("tokio.hol_release_ratio", hol.ours_ratio(), "x");
    report("tokio.hol_release_ratio_naive", hol.naive_ratio(), "x");

    let flushing = hol_release(&HolWorkload {
        probe_flushes: true,
        ..HolWorkload::full()
    });
    report(
        "tokio.hol_flush_release_p99_ours_calm",
        ms(flushing.ours_calm),
        "ms",
    );
    report(
        "tokio.hol_flush_release_p99_ours_hung",
        ms(flushing.ours_hung),
        "ms",
    );
    report("tokio.hol_flush_release_ratio", flushing.ours_ratio(), "x");
    report(
        "tokio.hol_flush_release_ratio_naive",
        flushing.naive_ratio(),
        "x",
    );

    let drain = drain_overhead(Duration::from_millis(100), 50);
    report("tokio.drain_release_ms", ms(drain.with_upload), "ms");
    report("tokio.drain_overhead", drain.overhead_ms(), "ms");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn p99(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    let rank = (xs.len() * 99).div_ceil(100).max(1);
    xs[rank - 1]
}

fn session(name: String) -> SessionId {
    SessionId::new(name).expect("a valid session name")
}

fn call(name: String) -> CallId {
    CallId::new(name).expect("a valid call name")
}

/// A current-thread runtime, its clock paused (virtual time) or not.
pub fn runtime(paused: bool) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(paused)
        .build()
        .expect("a tokio runtime")
}

// ---------------------------------------------------------------------------------------------
// The backend both drivers are measured on

/// An in-memory backend with fixed simulated latencies; uploads of the `hung` sessions never
/// answer (until their future is dropped). It records when each Shutdown was answered.
struct PerfBackend {
    upload_latency: Duration,
    op_latency: Duration,
    hung: HashSet<SessionId>,
    starts: AtomicU64,
    shut_down: Mutex<HashMap<SandboxId, Instant>>,
    shutdown_seen: Notify,
}

impl PerfBackend {
    fn new(upload_latency: Duration, op_latency: Duration, hung: HashSet<SessionId>) -> Self {
        PerfBackend {
            upload_latency,
            op_latency,
            hung,
            starts: AtomicU64::new(0),
            shut_down: Mutex::new(HashMap::new()),
            shutdown_seen: Notify::new(),
        }
    }

    /// Answers everything at once.
    fn noop() -> Self {
        Self::new(Duration::ZERO, Duration::ZERO, HashSet::new())
    }

    fn shut_down(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Instant>> {
        self.shut_down.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When `sandbox`'s Shutdown was answered (waits for it).
    async fn shut_down_at(&self, sandbox: SandboxId) -> Instant {
        loop {
            let seen = self.shutdown_seen.notified();
            tokio::pin!(seen);
            seen.as_mut().enable();
            if let Some(at) = self.shut_down().get(&sandbox) {
                return *at;
            }
            seen.await;
        }
    }
}

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl Backend for PerfBackend {
    async fn start(&self, _request: StartRequest) -> Result<(), BackendError> {
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        if self.hung.contains(&request.session) {
            std::future::pending::<()>().await;
        }
        pause(self.upload_latency).await;
        Ok(())
    }

    async fn stop(&self, _request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        pause(self.op_latency).await;
        Ok(None)
    }

    async fn persist(&self, _request: PersistRequest) -> Result<(), BackendError> {
        Ok(())
    }

    async fn discard(&self, _request: DiscardRequest) -> Result<(), BackendError> {
        Ok(())
    }

    async fn shutdown(
        &self,
        sandbox: SandboxId,
        _token: Option<sandkeeper::Token>,
    ) -> Result<(), BackendError> {
        pause(self.op_latency).await;
        self.shut_down().insert(sandbox, Instant::now());
        self.shutdown_seen.notify_waiters();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// tokio.acquire_release_vs_channel

/// A [`Keeper`] (`KeepWarm`, no-op backend) whose one sandbox is already warm: every
/// [`WarmSandbox::acquire_release`] revives it. Our side of `tokio.acquire_release_vs_channel`.
/// Build it, use it and close it on one runtime.
pub struct WarmSandbox {
    keeper: Keeper<PerfBackend>,
    spec: CallSpec,
}

impl WarmSandbox {
    /// Starts the sandbox with a first acquire and releases it, so that it is warm.
    pub async fn new() -> Self {
        let core = Config {
            release: ReleasePolicy::KeepWarm {
                idle: Duration::from_secs(3_600),
            },
            ..Config::default()
        };
        let keeper = Keeper::new(KeeperConfig::with_core(core), PerfBackend::noop())
            .expect("a valid configuration");
        let spec = CallSpec::new(call("warm-call".into()), session("warm".into()));
        let first = keeper.acquire(spec.clone()).await.expect("started");
        assert_eq!(first.release().await, Released::Completed);
        WarmSandbox { keeper, spec }
    }

    /// One acquire (reviving the warm sandbox) and its release.
    pub async fn acquire_release(&self) {
        let guard = self
            .keeper
            .acquire(self.spec.clone())
            .await
            .expect("revived");
        assert_eq!(guard.release().await, Released::Completed);
    }

    /// Checks that every acquire after the first revived the warm sandbox, then closes.
    pub async fn close(self) {
        assert_eq!(
            self.keeper.backend().starts.load(Ordering::Relaxed),
            1,
            "every acquire after the first revived the warm sandbox"
        );
        self.keeper.close(Duration::from_secs(1)).await;
    }
}

/// A bare tokio mpsc + oneshot round trip to a server task that answers `x` with `x + 1`: the
/// baseline of `tokio.acquire_release_vs_channel`. Build it inside a runtime.
pub struct ChannelRoundTrip {
    requests: mpsc::Sender<(u64, oneshot::Sender<u64>)>,
}

impl ChannelRoundTrip {
    /// Spawns the server task on the current runtime.
    pub fn spawn() -> Self {
        let (requests, mut served) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(64);
        tokio::spawn(async move {
            while let Some((x, reply)) = served.recv().await {
                let _ = reply.send(x + 1);
            }
        });
        ChannelRoundTrip { requests }
    }

    /// Sends `x` and waits for the answer.
    pub async fn round_trip(&self, x: u64) {
        let (reply, answer) = oneshot::channel();
        self.requests.send((x, reply)).await.expect("server up");
        let got = answer.await.expect("answered");
        assert_eq!(got, x + 1);
    }
}

/// The warm acquire + release figure.
#[derive(Clone, Copy, Debug)]
pub struct WarmFigures {
    /// Our acquire + release, median over rounds, in nanoseconds.
    pub ours_ns: f64,
    /// Median of the per-round ratios ours / channel round trip.
    pub ratio: f64,
}

/// `rounds` interleaved rounds of `iterations` warm acquire + release against as many channel
/// round trips (wall clock), on one current-thread runtime.
pub fn acquire_release_vs_channel(rounds: usize, iterations: usize) -> WarmFigures {
    runtime(false).block_on(async {
        let warm = WarmSandbox::new().await;
        let channel = ChannelRoundTrip::spawn();
        let mut ours = Vec::new();
        let mut ratios = Vec::new();
        for _ in 0..rounds {
            let t0 = wall();
            for _ in 0..iterations {
                warm.acquire_release().await;
            }
            let a = ns_per(t0.elapsed(), iterations);
            let t1 = wall();
            for i in 0..iterations as u64 {
                channel.round_trip(i).await;
            }
            let b = ns_per(t1.elapsed(), iterations);
            ours.push(a);
            ratios.push(a / b);
        }
        warm.close().await;
        WarmFigures {
            ours_ns: median(ours),
            ratio: median(ratios),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// tokio.hol_release_ratio

/// The head-of-line workload.
#[derive(Clone, Copy, Debug)]
pub struct HolWorkload {
    /// Sessions with a live call and one flushed version each (hung, or not).
    pub background: usize,
    /// Probe sessions: acquire, then release with nothing to mirror.
    pub probes: usize,
    /// A probe starts every this long.
    pub probe_every: Duration,
    /// An upload that does not hang takes this long.
    pub upload_latency: Duration,
    /// Stop and Shutdown take this long each.
    pub op_latency: Duration,
    /// The naive driver's bound on one upload.
    pub naive_upload_timeout: Duration,
    /// Whether each probe flushes one version of its own before it releases (so its release
    /// drains an upload of its own while the hung ones are in flight).
    pub probe_flushes: bool,
}

impl HolWorkload {
    /// The figure's workload: 1,000 background sessions, 200 probes over one second.
    pub fn full() -> Self {
        HolWorkload {
            background: 1_000,
            probes: 200,
            probe_every: Duration::from_millis(5),
            upload_latency: Duration::from_millis(10),
            op_latency: Duration::from_millis(5),
            naive_upload_timeout: Config::default().upload_timeout,
            probe_flushes: false,
        }
    }
}

/// p99 probe release latencies (virtual time) of both drivers, hung and calm.
#[derive(Clone, Copy, Debug)]
pub struct HolFigures {
    /// Ours, no upload hung.
    pub ours_calm: Duration,
    /// Ours, the background sessions' uploads hung.
    pub ours_hung: Duration,
    /// The naive driver, no upload hung.
    pub naive_calm: Duration,
    /// The naive driver, the background sessions' uploads hung.
    pub naive_hung: Duration,
}

impl HolFigures {
    /// Ours, hung over calm.
    pub fn ours_ratio(&self) -> f64 {
        self.ours_hung.as_secs_f64() / self.ours_calm.as_secs_f64()
    }

    /// The naive driver, hung over calm.
    pub fn naive_ratio(&self) -> f64 {
        self.naive_hung.as_secs_f64() / self.naive_calm.as_secs_f64()
    }
}

/// Runs the workload on both drivers, hung and calm, each on its own paused runtime.
pub fn hol_release(w: &HolWorkload) -> HolFigures {
    HolFigures {
        ours_calm: runtime(true).block_on(ours_hol(*w, false)),
        ours_hung: runtime(true).block_on(ours_hol(*w, true)),
        naive_calm: runtime(true).block_on(naive_hol(*w, false)),
        naive_hung: runtime(true).block_on(naive_hol(*w, true)),
    }
}

fn hol_backend(w: &HolWorkload, hung: bool) -> (Vec<SessionId>, PerfBackend) {
    let background: Vec<SessionId> = (0..w.background)
        .map(|i| session(format!("bg-{i}")))
        .collect();
    let hung = if hung {
        background.iter().cloned().collect()
    } else {
        HashSet::new()
    };
    let backend = PerfBackend::new(w.upload_latency, w.op_latency, hung);
    (background, backend)
}

async fn ours_hol(w: HolWorkload, hung: bool) -> Duration {
    let (background, backend) = hol_backend(&w, hung);
    let keeper = Keeper::new(KeeperConfig::default(), backend).expect("a valid configuration");
    let log = PathName::session_log();
    let mut held = Vec::new();
    for (i, s) in background.iter().enumerate() {
        let spec = CallSpec::new(call(format!("bg-call-{i}")), s.clone());
        held.push(keeper.acquire(spec).await.expect("started"));
        keeper.flush(s, &log, b"line\n".to_vec()).expect("flushed");
    }
    let mut probes = Vec::new();
    for j in 0..w.probes {
        let keeper = keeper.clone();
        probes.push(tokio::spawn(async move {
            tokio::time::sleep(w.probe_every * j as u32).await;
            let spec = CallSpec::new(
                call(format!("probe-call-{j}")),
                session(format!("probe-{j}")),
            );
            let guard = keeper.acquire(spec).await.expect("started");
            let sandbox = guard.sandbox();
            if w.probe_flushes {
                let s = guard.session().clone();
                keeper
                    .flush(&s, &PathName::session_log(), b"probe\n".to_vec())
                    .expect("flushed");
            }
            let t0 = Instant::now();
            assert_eq!(guard.release().await, Released::Completed);
            keeper.backend().shut_down_at(sandbox).await - t0
        }));
    }
    let mut latencies = Vec::new();
    for p in probes {
        latencies.push(p.await.expect("probe ran"));
    }
    drop(held);
    p99(latencies)
}

async fn naive_hol(w: HolWorkload, hung: bool) -> Duration {
    let (background, backend) = hol_backend(&w, hung);
    let naive = Arc::new(NaiveKeeper::new(backend, w.naive_upload_timeout));
    let log = PathName::session_log();
    for s in &background {
        naive.acquire(s).await.expect("started");
        naive.flush(s, &log, b"line\n".to_vec()).expect("queued");
    }
    let mut probes = Vec::new();
    for j in 0..w.probes {
        let naive = naive.clone();
        probes.push(tokio::spawn(async move {
            tokio::time::sleep(w.probe_every * j as u32).await;
            let s = session(format!("probe-{j}"));
            let sandbox = naive.acquire(&s).await.expect("started");
            if w.probe_flushes {
                naive
                    .flush(&s, &PathName::session_log(), b"probe\n".to_vec())
                    .expect("queued");
            }
            let t0 = Instant::now();
            naive.release(&s).await;
            naive.backend().shut_down_at(sandbox).await - t0
        }));
    }
    let mut latencies = Vec::new();
    for p in probes {
        latencies.push(p.await.expect("probe ran"));
    }
    p99(latencies)
}

// ---------------------------------------------------------------------------------------------
// tokio.drain_overhead

/// Release latencies (virtual time) with one pending upload and with none.
#[derive(Clone, Copy, Debug)]
pub struct DrainFigures {
    /// The upload's own simulated time.
    pub upload: Duration,
    /// Median release latency with one pending upload.
    pub with_upload: Duration,
    /// Median release latency with nothing pending.
    pub without: Duration,
}

impl DrainFigures {
    /// What a drain costs beyond the upload it waits for, in milliseconds.
    pub fn overhead_ms(&self) -> f64 {
        ms(self.with_upload) - ms(self.without) - ms(self.upload)
    }
}

/// Distinct sessions a [`DrainRelease`] goes round.
const DRAIN_SESSIONS: usize = 1024;

/// Release latencies with one pending upload or none: a [`Keeper`] on a backend whose uploads
/// take a fixed simulated time and whose Stop and Shutdown answer at once. Backs
/// `tokio.drain_overhead` (virtual time, on a paused runtime) and the drain benches (wall time).
/// Build it, use it and close it on one runtime.
pub struct DrainRelease {
    keeper: Keeper<PerfBackend>,
    log: PathName,
    sessions: Vec<SessionId>,
    calls: Vec<CallId>,
    next: usize,
}

impl DrainRelease {
    /// A keeper whose uploads take `upload` each. Call it inside a runtime.
    pub fn new(upload: Duration) -> Self {
        let backend = PerfBackend::new(upload, Duration::ZERO, HashSet::new());
        let keeper = Keeper::new(KeeperConfig::default(), backend).expect("a valid configuration");
        DrainRelease {
            keeper,
            log: PathName::session_log(),
            sessions: (0..DRAIN_SESSIONS)
                .map(|i| session(format!("drain-{i}")))
                .collect(),
            calls: (0..DRAIN_SESSIONS)
                .map(|i| call(format!("drain-call-{i}")))
                .collect(),
            next: 0,
        }
    }

    /// Acquires a sandbox for the next session, flushes one version if `pending`, and releases:
    /// returns how long the release took on the runtime's clock (the drain of the pending
    /// upload included).
    pub async fn release(&mut self, pending: bool) -> Duration {
        let k = self.next % DRAIN_SESSIONS;
        self.next += 1;
        let s = &self.sessions[k];
        let spec = CallSpec::new(self.calls[k].clone(), s.clone());
        let guard = self.keeper.acquire(spec).await.expect("started");
        if pending {
            self.keeper
                .flush(s, &self.log, b"line\n".to_vec())
                .expect("flushed");
        }
        let t0 = Instant::now();
        assert_eq!(guard.release().await, Released::Completed);
        t0.elapsed()
    }

    /// Uploads done so far.
    pub fn uploaded(&self) -> u64 {
        self.keeper.tally().uploaded
    }

    /// Closes the keeper.
    pub async fn close(self) {
        self.keeper.close(Duration::from_secs(1)).await;
    }
}

/// `reps` releases of each kind, alternating, on one paused runtime.
pub fn drain_overhead(upload: Duration, reps: usize) -> DrainFigures {
    runtime(true).block_on(async move {
        let mut rig = DrainRelease::new(upload);
        let mut with_upload = Vec::new();
        let mut without = Vec::new();
        for _ in 0..reps {
            with_upload.push(rig.release(true).await.as_secs_f64());
            without.push(rig.release(false).await.as_secs_f64());
        }
        assert_eq!(rig.uploaded(), reps as u64, "every drain uploaded");
        rig.close().await;
        DrainFigures {
            upload,
            with_upload: Duration::from_secs_f64(median(with_upload)),
            without: Duration::from_secs_f64(median(without)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_acquire_release_figure_runs() {
        let warm = acquire_release_vs_channel(3, 20);
        // Wall time is never asserted on; only that both sides were measured.
        assert!(warm.ours_ns > 0.0 && warm.ratio.is_finite() && warm.ratio > 0.0);
    }

    #[test]
    fn hung_uploads_delay_only_the_naive_drivers_releases() {
        let w = HolWorkload {
            background: 50,
            probes: 20,
            ..HolWorkload::full()
        };
        let hol = hol_release(&w);
        // A probe's way down is Stop + Shutdown, 5 ms each, whatever hangs elsewhere.
        assert_eq!(hol.ours_calm, Duration::from_millis(10), "{hol:?}");
        assert_eq!(hol.ours_hung, hol.ours_calm, "{hol:?}");
        assert!(hol.ours_ratio() <= 1.5, "{hol:?}");
        // The naive FIFO makes every probe wait for all 50 hung uploads' timeouts.
        assert!(
            hol.naive_hung >= w.naive_upload_timeout * w.background as u32,
            "{hol:?}"
        );
        assert!(hol.naive_ratio() > 10.0, "{hol:?}");
    }

    #[test]
    fn a_flushing_probe_never_waits_past_its_drain_deadline() {
        // Many hung sessions: a probe's own upload takes no capacity from them (io-tokio has no
        // shared upload pool), so its release costs the same as with none hung.
        let w = HolWorkload {
            background: 100,
            probes: 5,
            probe_flushes: true,
            ..HolWorkload::full()
        };
        let hol = hol_release(&w);
        let bound = Config::default().drain_deadline + w.op_latency * 2;
        assert!(
            hol.ours_calm >= w.upload_latency + w.op_latency * 2,
            "{hol:?}"
        );
        assert_eq!(hol.ours_hung, hol.ours_calm, "{hol:?}");
        assert!(hol.ours_hung <= bound, "{hol:?}");
        assert!(
            hol.naive_hung >= w.naive_upload_timeout * w.background as u32,
            "{hol:?}"
        );
    }

    #[test]
    fn a_drain_costs_the_upload_it_waits_for_and_nothing_more() {
        let drain = drain_overhead(Duration::from_millis(100), 5);
        assert_eq!(drain.without, Duration::ZERO, "{drain:?}");
        assert_eq!(drain.with_upload, Duration::from_millis(100), "{drain:?}");
        assert!(drain.overhead_ms().abs() < 1e-6, "{drain:?}");
    }
}
