//! The library side of `sandkeeperd`'s figures (`server/perf/run.sh`, docs/performance.md,
//! "sandkeeperd"): what the server's work costs without HTTP and the SDK in front of it.
//!
//! A keeper on a local backend configured as `Server::bind` configures it (the default
//! `KeeperConfig`, `LocalConfig::new(root)` with snapshots off and the server's default run
//! timeout; bubblewrap with `sandkeeper-init` beside this program when they are there, as for
//! the server), then, interleaved round after round:
//!
//! - `lib.exec_bash_ms`: `/bin/bash -l -c true` (what the SDK's `commands.run("true")` asks
//!   the server to run) through a call's work handle, by `exec_streaming` with the options the
//!   server's envd gives it (64 KiB kept, the SDK's 60 s timeout), its chunks drained;
//! - `lib.exec_true_ms`: `true` by `exec` with the default options;
//! - `host.spawn_true_ms`: `true` on the host by `std::process::Command` (output piped,
//!   waited for): a bare fork/exec; `host.spawn_bash_ms` the same of `/bin/bash -c true`
//!   (not a login shell: the host's login profile is not the sandbox's, and took 300 ms
//!   here).
//!
//! Then `lib.acquire_ms`: a fresh session's acquire (what the server's create waits for),
//! released before the next; and `lib.acquire_shared_ms`: an acquire of a session whose
//! sandbox is up (another call holds it and ran a command in it), released before the next.
//!
//! `cargo run --release -p sandkeeperd --example exec_direct -- [ROUNDS] [ROOT]` prints one
//! `name value` line per figure (ms), p50 and p99 (nearest rank). With `--serve` first (and
//! ROUNDS ignored) it runs one round of the four execs per line of standard input and
//! answers their times on one line, for `sdk_perf.py` to interleave with the SDK's.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, SessionId};
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{CallGuard, ExecOptions, Keeper, KeeperConfig, LocalBackend};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The argv the Python SDK sends for `commands.run("true")`.
const SDK_ARGV: [&str; 4] = ["/bin/bash", "-l", "-c", "true"];

/// A monotonic clock reading: this program measures wall time, so it reads the clock.
#[allow(clippy::disallowed_methods)] // a measuring program reads the clock: that is its job
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

fn ms_since(at: std::time::Instant) -> f64 {
    at.elapsed().as_secs_f64() * 1e3
}

/// The `p`-th percentile of `xs` (nearest rank).
fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

fn report(name: &str, xs: &[f64]) {
    println!("{name}_p50 {:.3}", percentile(xs, 50.0));
    println!("{name}_p99 {:.3}", percentile(xs, 99.0));
}

fn spec(call: &str, session: &str) -> Res<CallSpec> {
    Ok(CallSpec::new(CallId::new(call)?, SessionId::new(session)?))
}

/// The options the server's envd gives a command the SDK starts (`envd/process.rs`:
/// `prepare`): the workspace's root, no variables, 64 KiB kept, the SDK's 60 s timeout.
fn server_options() -> ExecOptions {
    ExecOptions {
        timeout: Some(Duration::from_secs(60)),
        output_cap: 64 * 1024,
        ..ExecOptions::default()
    }
}

fn host_spawn(argv: &[&str]) -> Res<()> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    if !out.status.success() {
        return Err(format!("{argv:?} failed on the host: {:?}", out.status).into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let mut args = std::env::args().skip(1).peekable();
    let serving = args.next_if(|a| a == "--serve").is_some();
    let rounds: usize = match args.next() {
        Some(n) => n.parse()?,
        None => 200,
    };
    let root = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("sk-exec-direct-{}", std::process::id())),
    };
    // As `Server::bind` makes it (the default run timeout: `--run-timeout-secs` 3600).
    let local = LocalConfig {
        run_timeout: Duration::from_secs(3600),
        snapshots: false,
        ..LocalConfig::new(&root)
    };
    let keeper = Keeper::new(KeeperConfig::default(), LocalBackend::new(local)?)?;
    eprintln!("exec_direct: {}", keeper.backend().isolation());
    let measured = if serving {
        serve(&keeper).await
    } else {
        measure(&keeper, rounds).await
    };
    keeper.close(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&root);
    measured
}

/// One round of the four, interleaved: ms of the library's exec of the SDK's argv, of `true`,
/// and of the host's spawns of `true` and `bash -c true`.
async fn round(guard: &CallGuard<LocalBackend>) -> Res<[f64; 4]> {
    let at = now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let work = guard.work();
    let (out, ()) = tokio::join!(work.exec_streaming(SDK_ARGV, server_options(), tx), async {
        while rx.recv().await.is_some() {}
    });
    let bash = ms_since(at);
    if !out?.success() {
        return Err("bash -l -c true failed in the sandbox".into());
    }

    let at = now();
    let out = guard.work().exec(["true"], ExecOptions::default()).await?;
    let lib_true = ms_since(at);
    if !out.success() {
        return Err("true failed in the sandbox".into());
    }

    let at = now();
    host_spawn(&["true"])?;
    let spawn_true = ms_since(at);

    let at = now();
    host_spawn(&["/bin/bash", "-c", "true"])?;
    Ok([bash, lib_true, spawn_true, ms_since(at)])
}

/// `--serve`: one round per line read from standard input, its four times written as one
/// line (`sdk_perf.py` interleaves them with the SDK's commands); ends at end of input.
async fn serve(keeper: &Keeper<LocalBackend>) -> Res<()> {
    let guard = keeper.acquire(spec("exec", "exec")?).await?;
    guard.work().exec(["true"], ExecOptions::default()).await?;
    println!("ready");
    let mut line = String::new();
    // Blocking reads between rounds, when nothing of this program is in flight.
    while std::io::stdin().read_line(&mut line)? > 0 {
        line.clear();
        let [a, b, c, d] = round(&guard).await?;
        println!("{a:.4} {b:.4} {c:.4} {d:.4}");
    }
    guard.release().await;
    Ok(())
}

async fn measure(keeper: &Keeper<LocalBackend>, rounds: usize) -> Res<()> {
    let guard = keeper.acquire(spec("exec", "exec")?).await?;
    // The sandbox's first command starts its init: not counted, as in the SDK's figure.
    guard.work().exec(["true"], ExecOptions::default()).await?;
    let (mut bash, mut lib_true, mut spawn_true, mut spawn_bash) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let [a, b, c, d] = round(&guard).await?;
        bash.push(a);
        lib_true.push(b);
        spawn_true.push(c);
        spawn_bash.push(d);
    }
    report("lib.exec_bash_ms", &bash);
    report("lib.exec_true_ms", &lib_true);
    report("host.spawn_true_ms", &spawn_true);
    report("host.spawn_bash_ms", &spawn_bash);
    println!(
        "lib.exec_bash_vs_host_spawn_bash {:.3}",
        percentile(&bash, 50.0) / percentile(&spawn_bash, 50.0)
    );
    println!(
        "lib.exec_bash_vs_host_spawn_true {:.3}",
        percentile(&bash, 50.0) / percentile(&spawn_true, 50.0)
    );

    // Creates: a fresh session each time, and the shared session `exec` (up, with its init).
    let (mut fresh, mut shared) = (Vec::new(), Vec::new());
    for n in 0..rounds.min(100) {
        let at = now();
        let call = keeper
            .acquire(spec(&format!("fresh-{n}"), &format!("fresh-{n}"))?)
            .await?;
        fresh.push(ms_since(at));
        call.release().await;

        let at = now();
        let call = keeper
            .acquire(spec(&format!("shared-{n}"), "exec")?)
            .await?;
        shared.push(ms_since(at));
        call.release().await;
    }
    report("lib.acquire_ms", &fresh);
    report("lib.acquire_shared_ms", &shared);
    guard.release().await;
    Ok(())
}
