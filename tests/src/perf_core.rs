//! The core's workloads of the performance report (issue 6), measured both by `src/bin/perf.rs`
//! (the figures) and by `benches/core.rs` (Criterion's detail behind them):
//!
//! - [`CallCycle`]: one full call through the core: acquire, start ack, flush, upload ack,
//!   release (drain), stop ack, shutdown ack, with every command and event drained. Backs
//!   `core.call_cycle_ns`.
//! - [`HashMapBaseline`]: the minimum bookkeeping for the same ids with `HashMap`s, the
//!   denominator of `core.call_cycle_vs_hashmap`.
//! - [`idle_core`]: a core holding `n` idle session records (one flushed version each, no
//!   sandbox). The call cycle on `idle_core(1_000_000)` against `idle_core(1_000)` backs
//!   `core.scale_ratio_1m_vs_1k`; the resident memory it takes backs
//!   `core.bytes_per_idle_session`.
//!
//! Both sides of a comparison use pre-made names, so that neither pays for formatting.

use std::collections::HashMap;

use sandkeeper::{
    CallId, CallSpec, Command, Config, Instant, Lifecycle, PathName, Payload, SessionId,
};

use crate::measure::{median, ns_per, wall, Sink};

/// Distinct call names a cycle goes round.
const CALLS: usize = 1024;
/// Distinct session names a cycle goes round.
const SESSIONS: usize = 64;

fn call_name(i: usize) -> String {
    format!("call-{i}")
}

fn session_name(i: usize) -> String {
    format!("hot-{i}")
}

/// One full call through the core per [`CallCycle::run`], each on the next of a fixed set of
/// call and session names (1,024 calls over 64 sessions).
pub struct CallCycle {
    calls: Vec<CallId>,
    sessions: Vec<SessionId>,
    log: PathName,
    next: usize,
}

impl Default for CallCycle {
    fn default() -> Self {
        Self::new()
    }
}

impl CallCycle {
    /// A cycle starting at the first name.
    pub fn new() -> Self {
        CallCycle {
            calls: (0..CALLS)
                .map(|i| CallId::new(call_name(i)).expect("a valid call name"))
                .collect(),
            sessions: (0..SESSIONS)
                .map(|i| SessionId::new(session_name(i)).expect("a valid session name"))
                .collect(),
            log: PathName::session_log(),
            next: 0,
        }
    }

    /// One call on `core`: acquire, start ack, flush, upload ack, release (drain), stop ack,
    /// shutdown ack, with every output drained. Time stands still (`Instant::ZERO`).
    pub fn run(&mut self, core: &mut Lifecycle) {
        let t = Instant::ZERO;
        let call = &self.calls[self.next % self.calls.len()];
        let session = &self.sessions[self.next % self.sessions.len()];
        self.next += 1;
        core.acquire(t, CallSpec::new(call.clone(), session.clone()))
            .expect("acquired");
        let Some(Command::Start { sandbox, .. }) = core.poll_command() else {
            panic!("the core asked for no start")
        };
        core.handle_start_ok(t, sandbox).expect("started");
        core.flush(t, session, &self.log, Payload::default())
            .expect("flushed");
        let Some(Command::Upload { upload, .. }) = core.poll_command() else {
            panic!("the core asked for no upload")
        };
        core.handle_upload_ok(t, upload).expect("uploaded");
        core.release(t, call).expect("released");
        while let Some(cmd) = core.poll_command() {
            match cmd {
                Command::Stop { sandbox, .. } => {
                    core.handle_stop_ok(t, sandbox, None).expect("stopped")
                }
                Command::Shutdown { sandbox, .. } => {
                    core.handle_shutdown_ok(t, sandbox).expect("shut down")
                }
                _ => {}
            }
        }
        while core.poll_event().is_some() {}
    }
}

/// The baseline of `core.call_cycle_vs_hashmap`: the minimum bookkeeping for the same ids as
/// [`CallCycle`] (call to session and sandbox, sandbox to session and holders, versions per
/// session and path, uploads in flight), with `HashMap`s and owned strings.
pub struct HashMapBaseline {
    call_names: Vec<String>,
    session_names: Vec<String>,
    calls: HashMap<String, (String, u64)>,
    sandboxes: HashMap<u64, (String, u32)>,
    versions: HashMap<(String, String), u64>,
    uploads: HashMap<u64, (String, u64)>,
    next_sandbox: u64,
    next: usize,
}

impl Default for HashMapBaseline {
    fn default() -> Self {
        Self::new()
    }
}

impl HashMapBaseline {
    /// Empty maps, starting at the first name.
    pub fn new() -> Self {
        HashMapBaseline {
            call_names: (0..CALLS).map(call_name).collect(),
            session_names: (0..SESSIONS).map(session_name).collect(),
            calls: HashMap::new(),
            sandboxes: HashMap::new(),
            versions: HashMap::new(),
            uploads: HashMap::new(),
            next_sandbox: 0,
            next: 0,
        }
    }

    /// The bookkeeping of one call: bind, start, flush a version, upload it, unbind, forget.
    pub fn run(&mut self) {
        let call = &self.call_names[self.next % self.call_names.len()];
        let session = &self.session_names[self.next % self.session_names.len()];
        self.next += 1;
        let sandbox = self.next_sandbox;
        self.next_sandbox += 1;
        self.calls.insert(call.clone(), (session.clone(), sandbox));
        self.sandboxes.insert(sandbox, (session.clone(), 1));
        let v = self
            .versions
            .entry((session.clone(), "session.log".to_string()))
            .or_default();
        *v += 1;
        let version = *v;
        self.uploads.insert(sandbox, (session.clone(), version));
        self.uploads.remove(&sandbox);
        let (_, x) = self.calls.remove(call).expect("bound above");
        if let Some(entry) = self.sandboxes.get_mut(&x) {
            entry.1 -= 1;
        }
        self.sandboxes.remove(&x);
    }
}

/// A core with `idle_sessions` idle session records (`idle-0`, `idle-1`, ...: one flushed
/// version of the session log each, no sandbox), every event drained.
pub fn idle_core(idle_sessions: usize) -> Lifecycle {
    let mut core = Lifecycle::new(Config::default()).expect("the default config is valid");
    let log = PathName::session_log();
    for j in 0..idle_sessions {
        let s = SessionId::new(format!("idle-{j}")).expect("a valid session name");
        core.flush(Instant::ZERO, &s, &log, Payload::default())
            .expect("flushed");
        while core.poll_event().is_some() {}
    }
    core
}

/// Resident memory in bytes, from /proc (Linux; `None` elsewhere).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Calls per round of a figure.
const CYCLES: usize = 20_000;
/// Interleaved rounds per figure.
const ROUNDS: usize = 7;

/// Measures the core's figures: `core.call_cycle_ns`, `core.call_cycle_vs_hashmap` (median of
/// per-round ratios, the two sides interleaved), then, unless `PERF_CORE_CYCLE_ONLY` is set,
/// `core.bytes_per_idle_session` and `core.scale_ratio_1m_vs_1k`.
pub fn core_figures(report: Sink) {
    let mut core = idle_core(0);
    let mut cycle = CallCycle::new();
    let mut baseline = HashMapBaseline::new();
    let mut ours = Vec::new();
    let mut ratio = Vec::new();
    for _ in 0..ROUNDS {
        let t0 = wall();
        for _ in 0..CYCLES {
            cycle.run(&mut core);
        }
        let a = ns_per(t0.elapsed(), CYCLES);
        let t1 = wall();
        for _ in 0..CYCLES {
            baseline.run();
        }
        let b = ns_per(t1.elapsed(), CYCLES);
        ours.push(a);
        ratio.push(a / b);
    }
    report("core.call_cycle_ns", median(ours), "ns");
    report("core.call_cycle_vs_hashmap", median(ratio), "x");
    if std::env::var_os("PERF_CORE_CYCLE_ONLY").is_some() {
        return;
    }

    // Scale: the same cycle with 1,000,000 idle session records kept, against 1,000.
    let small = idle_core(1_000);
    let before = resident_bytes();
    let big = idle_core(1_000_000);
    let after = resident_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        report(
            "core.bytes_per_idle_session",
            a.saturating_sub(b) as f64 / 999_000.0,
            "bytes",
        );
    }
    let mut cores = [small, big];
    let mut cycles = [CallCycle::new(), CallCycle::new()];
    let mut ratios = Vec::new();
    for _ in 0..ROUNDS {
        let mut per_call = [0.0; 2];
        for (n, (core, cycle)) in cores.iter_mut().zip(&mut cycles).enumerate() {
            let t0 = wall();
            for _ in 0..CYCLES {
                cycle.run(core);
            }
            per_call[n] = ns_per(t0.elapsed(), CYCLES);
        }
        ratios.push(per_call[1] / per_call[0]);
    }
    report("core.scale_ratio_1m_vs_1k", median(ratios), "x");
}

/// Runs `n` call cycles (`side` = `core`) or `n` baseline cycles (`side` = `hashmap`) and
/// nothing else: what `perf --cycles SIDE N` does under callgrind.
pub fn run_cycles(side: &str, n: usize) -> Result<(), String> {
    match side {
        "core" => {
            let mut core = idle_core(0);
            let mut cycle = CallCycle::new();
            for _ in 0..n {
                cycle.run(&mut core);
            }
            std::hint::black_box(&core);
        }
        "hashmap" => {
            let mut baseline = HashMapBaseline::new();
            for _ in 0..n {
                baseline.run();
            }
            std::hint::black_box(&baseline.next_sandbox);
        }
        other => return Err(format!("unknown side {other:?}: core or hashmap")),
    }
    Ok(())
}

/// Instructions per cycle of each side, counted by callgrind on this very binary
/// (`exe --cycles SIDE N` at two `N`, the difference divided by the difference, so set-up is
/// not counted): `core.call_cycle_instructions`, `core.hashmap_cycle_instructions` and their
/// ratio `core.call_cycle_vs_hashmap_instructions`. Instruction counts do not depend on what
/// else the machine is doing. Nothing is reported where valgrind is absent.
pub fn callgrind_figures(report: Sink) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let count = |side: &str, n: usize| -> Option<u64> {
        let out_file = std::env::temp_dir().join(format!(
            "sk-callgrind-{}-{side}-{n}.out",
            std::process::id()
        ));
        let status = std::process::Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(&exe)
            .args(["--cycles", side, &n.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        let text = std::fs::read_to_string(&out_file).ok();
        let _ = std::fs::remove_file(&out_file);
        if !status.success() {
            return None;
        }
        // The `summary:` line holds the total of the first event, instructions read.
        text?
            .lines()
            .find_map(|l| l.strip_prefix("summary:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    let per_cycle = |side: &str| -> Option<f64> {
        let (lo, hi) = (2_000, 12_000);
        let a = count(side, lo)?;
        let b = count(side, hi)?;
        Some(b.saturating_sub(a) as f64 / (hi - lo) as f64)
    };
    let (Some(core), Some(hashmap)) = (per_cycle("core"), per_cycle("hashmap")) else {
        eprintln!("callgrind figures not measured (valgrind absent or failed)");
        return;
    };
    report("core.call_cycle_instructions", core, "instructions");
    report("core.hashmap_cycle_instructions", hashmap, "instructions");
    report(
        "core.call_cycle_vs_hashmap_instructions",
        core / hashmap,
        "x",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_cycle_leaves_the_core_quiescent_and_its_invariants_whole() {
        let mut core = idle_core(3);
        let mut cycle = CallCycle::new();
        for _ in 0..(CALLS + 5) {
            cycle.run(&mut core);
            assert!(core.is_quiescent(), "every output was drained and answered");
        }
        core.check_invariants().expect("the invariants hold");
        assert_eq!(core.stats().calls_released, (CALLS + 5) as u64);
        assert_eq!(core.stats().starts_ok, (CALLS + 5) as u64);
    }

    #[test]
    fn the_baseline_forgets_every_call_it_made() {
        let mut baseline = HashMapBaseline::new();
        for _ in 0..(CALLS + 5) {
            baseline.run();
        }
        assert!(baseline.calls.is_empty() && baseline.sandboxes.is_empty());
        assert!(baseline.uploads.is_empty());
        assert_eq!(baseline.versions.len(), SESSIONS);
        assert_eq!(baseline.next_sandbox, (CALLS + 5) as u64);
    }
}
