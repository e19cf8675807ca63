//! The cost of running a command in a local sandbox with every protection on (issue 31):
//!
//! - `local.exec_ms_p50` / `_p99`: an exec of `true` through a call's work handle, under
//!   bubblewrap (user, PID, IPC, UTS, cgroup and network namespaces, no capabilities, the
//!   seccomp filter, the minimal root, `prlimit` for the rlimits and, as root, a cgroup), one
//!   bubblewrap per sandbox with `sandkeeper-init` as its PID 1 (build it first:
//!   `cargo build --release -p sandkeeper-tokio --bin sandkeeper-init`; the figures are not
//!   measured without it);
//! - `local.exec_per_command_ms_p50`: the same exec with one bubblewrap per command (the path
//!   before the init, `Namespaces::PerCommand`);
//! - `local.bare_spawn_ms_p50` / `_p99`: a bare spawn of `true` on the host (tokio's
//!   `Command`, output piped, waited for), and `local.exec_vs_bare_spawn` the ratio of the
//!   medians (goal ≤ 3);
//! - `local.exec_off_ms_p50`: the same exec under `Isolation::Off` (the keeper's own path:
//!   checks, `prlimit`, the cgroup), to tell the keeper's share from bubblewrap's;
//! - `local.sandbox_start_ms`: a fresh call's acquire (the sandbox's Start) and its first
//!   command to its end (with the init's start), median; `local.sandbox_start_per_command_ms`
//!   the same with one bubblewrap per command.
//!
//! The four kinds of exec are interleaved, round after round, in the same run.

use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Isolation, LocalConfig, Namespaces};
use sandkeeper_tokio::{ExecOptions, Keeper, KeeperConfig, LocalBackend};

use crate::measure::{median, wall, Sink};

const ROUNDS: usize = 200;
const STARTS: usize = 20;

fn keeper(
    name: &str,
    isolation: Isolation,
    namespaces: Namespaces,
) -> Result<Keeper<LocalBackend>, String> {
    let root = std::env::temp_dir().join(format!("sk-perf-local-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let backend = LocalBackend::new(LocalConfig {
        isolation,
        namespaces,
        ..LocalConfig::new(root)
    })
    .map_err(|e| e.to_string())?;
    Keeper::new(KeeperConfig::with_core(Config::default()), backend).map_err(|e| e.to_string())
}

fn spec(call: &str) -> Result<CallSpec, String> {
    Ok(CallSpec::new(
        CallId::new(call).map_err(|e| e.to_string())?,
        SessionId::new(format!("s-{call}")).map_err(|e| e.to_string())?,
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p`-th percentile of `xs` (nearest rank).
fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

async fn measure() -> Result<Vec<(&'static str, f64, &'static str)>, String> {
    let sandboxed = keeper("bwrap", Isolation::Require, Namespaces::PerSandbox)?;
    if sandboxed.backend().isolation().init().is_none() {
        return Err(format!(
            "no per-sandbox init ({}); build it: cargo build --release -p sandkeeper-tokio \
             --bin sandkeeper-init",
            sandboxed.backend().isolation()
        ));
    }
    let per_command = keeper("percmd", Isolation::Require, Namespaces::PerCommand)?;
    let off = keeper("off", Isolation::Off, Namespaces::PerCommand)?;
    let g = sandboxed
        .acquire(spec("exec")?)
        .await
        .map_err(|e| e.to_string())?;
    let c = per_command
        .acquire(spec("percmd")?)
        .await
        .map_err(|e| e.to_string())?;
    let o = off.acquire(spec("off")?).await.map_err(|e| e.to_string())?;
    let (mut inside, mut bare, mut plain, mut each) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let at = wall();
        let out = g
            .work()
            .exec(["true"], ExecOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        inside.push(ms(at.elapsed()));
        if !out.success() {
            return Err(format!("true failed in the sandbox: {out:?}"));
        }
        let at = wall();
        let status = tokio::process::Command::new("/usr/bin/true")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .map_err(|e| e.to_string())?;
        bare.push(ms(at.elapsed()));
        if !status.status.success() {
            return Err("true failed on the host".into());
        }
        let at = wall();
        o.work()
            .exec(["true"], ExecOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        plain.push(ms(at.elapsed()));
        let at = wall();
        c.work()
            .exec(["true"], ExecOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        each.push(ms(at.elapsed()));
    }
    g.release().await;
    c.release().await;
    o.release().await;
    let (mut starts, mut starts_each) = (Vec::new(), Vec::new());
    for n in 0..STARTS {
        for (keeper, times) in [(&sandboxed, &mut starts), (&per_command, &mut starts_each)] {
            let at = wall();
            let call = keeper
                .acquire(spec(&format!("start-{n}"))?)
                .await
                .map_err(|e| e.to_string())?;
            call.work()
                .exec(["true"], ExecOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            times.push(ms(at.elapsed()));
            call.release().await;
        }
    }
    let (p50, bare_p50) = (median(inside.clone()), median(bare.clone()));
    eprintln!("local: {}", sandboxed.backend().isolation());
    eprintln!("local: limits {}", sandboxed.backend().limits());
    Ok(vec![
        ("local.exec_ms_p50", p50, "ms"),
        ("local.exec_ms_p99", percentile(inside, 99.0), "ms"),
        ("local.bare_spawn_ms_p50", bare_p50, "ms"),
        ("local.bare_spawn_ms_p99", percentile(bare, 99.0), "ms"),
        ("local.exec_vs_bare_spawn", p50 / bare_p50, "x"),
        ("local.exec_off_ms_p50", median(plain), "ms"),
        ("local.exec_per_command_ms_p50", median(each), "ms"),
        ("local.sandbox_start_ms", median(starts), "ms"),
        (
            "local.sandbox_start_per_command_ms",
            median(starts_each),
            "ms",
        ),
    ])
}

/// The local figures (above), or why they were not measured (bubblewrap missing or not
/// working here).
pub fn local_figures(report: Sink) {
    let Some(runtime) = crate::measure::runtime("local") else {
        return;
    };
    match runtime.block_on(measure()) {
        Ok(figures) => {
            for (name, value, unit) in figures {
                report(name, value, unit);
            }
        }
        Err(e) => eprintln!("local figures not measured: {e}"),
    }
}
