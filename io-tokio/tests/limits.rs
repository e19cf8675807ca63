//! A sandbox's limits over time (issue 31, item 3; the "freeze or exhaust the keeper or the
//! host" part of `docs/threat-model.md`): a sandbox's CPU time over its life, its cores at once,
//! the sandbox's init outside the per-process CPU limit, and a process left running that writes
//! past the workspace's quota.
//!
//! Each needs bubblewrap: it skips (saying so) where bubblewrap does not work, and fails instead
//! when `SANDKEEPER_REQUIRE_BWRAP` is set, as `.ci/run` sets it. `.ci/run` runs this file as root
//! and again as an unprivileged user; where a test needs cgroups (root, the `cpuacct`
//! controller), it asserts the documented fallback elsewhere: what `Enforcement`'s summary says.
#![cfg(not(loom))]

use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Isolation, Limits, LocalConfig};
use sandkeeper_tokio::{
    CallGuard, ExecOptions, ExecOutput, Keeper, KeeperConfig, LocalBackend, OpError, OpErrorClass,
};

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A keeper whose commands run under bubblewrap with `limits`, or `None` (the test skips,
/// saying why) where it does not work here and `SANDKEEPER_REQUIRE_BWRAP` is unset.
fn sandboxed(name: &str, limits: Limits) -> Option<Keeper<LocalBackend>> {
    let config = LocalConfig {
        isolation: if std::env::var_os("SANDKEEPER_REQUIRE_BWRAP").is_some() {
            Isolation::Require
        } else {
            Isolation::Auto
        },
        limits,
        ..LocalConfig::new(root(name))
    };
    let backend = LocalBackend::new(config).unwrap();
    let k = Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap();
    if !k.backend().isolation().is_bubblewrap() {
        eprintln!("skipped: {}", k.backend().isolation());
        return None;
    }
    Some(k)
}

async fn call(k: &Keeper<LocalBackend>, c: &str) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new(c).unwrap(),
        SessionId::new(format!("s-{c}")).unwrap(),
    ))
    .await
    .unwrap()
}

/// `script` run by `sh -c`, with a long timeout (a bound on a real process's run, far past what
/// each script needs).
async fn sh(g: &CallGuard<LocalBackend>, script: &str) -> Result<ExecOutput, OpError> {
    let options = ExecOptions {
        timeout: Some(Duration::from_secs(120)),
        ..ExecOptions::default()
    };
    g.work().exec(["sh", "-c", script], options).await
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether the keeper may watch a sandbox's CPU here: root, the `cpuacct` controller mounted
/// (cgroup v1).
fn cpu_watchable() -> bool {
    rustix::process::geteuid().is_root()
        && std::path::Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").is_file()
}

/// Four busy loops (each in a process of its own), their exit statuses once they ended.
const BUSY_FOUR: &str = "pids=; for i in 1 2 3 4; do sh -c 'while :; do :; done' & \
                         pids=\"$pids $!\"; done; for p in $pids; do wait $p; echo $?; done";

/// A sandbox's CPU budget (2 s) holds for all its processes together: four busy loops, each
/// under the per-process limit (600 s), are killed when the four used 2 s, the command answers
/// `CpuBudgetSpent` (class `Limit`) with the keeper's count, and the sandbox's later commands
/// are refused the same way while its files still work. The bound is the keeper's own count
/// (not the wall clock): at most 2 cores for one tick of the watch past the budget, plus slack
/// for a loaded machine. Without cgroups, the summary says the budget is not enforced and only
/// the per-process limit holds: with it at 1 s, each loop is killed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_loops_in_one_sandbox_stop_at_its_cpu_budget() {
    let watched = cpu_watchable();
    let limits = Limits {
        sandbox_cpu_seconds: Some(2),
        cpu_seconds: Some(if watched { 600 } else { 1 }),
        ..Limits::default()
    };
    let Some(k) = sandboxed("cpu-budget", limits) else {
        return;
    };
    let said = k.backend().limits().to_string();
    let g = call(&k, "a").await;
    let ran = sh(&g, BUSY_FOUR).await;
    if !watched {
        assert!(
            said.contains("sandbox cpu 2 s (NOT ENFORCED here: RLIMIT_CPU per process only)"),
            "{said}"
        );
        let out = ran.unwrap();
        let statuses: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
        assert_eq!(statuses.len(), 4, "{out:?}");
        for status in statuses {
            // SIGKILL or SIGXCPU: RLIMIT_CPU's two signals.
            assert!(status == "137" || status == "152", "{out:?}");
        }
        g.release().await;
        return;
    }
    assert!(
        said.contains("sandbox cpu 2 s (cpuacct cgroup, watched by the keeper)"),
        "{said}"
    );
    let budget = Duration::from_secs(2);
    match ran {
        Err(e @ OpError::CpuBudgetSpent { used, budget: b }) => {
            assert_eq!(b, budget);
            assert_eq!(e.class(), OpErrorClass::Limit);
            assert!(used > budget, "{e}");
            assert!(
                used < budget + Duration::from_millis(1500),
                "overshoot: {e}"
            );
            eprintln!("cpu budget overshoot: {:?}", used - budget);
        }
        other => panic!("expected CpuBudgetSpent, got {other:?}"),
    }
    match g.work().exec(["true"], ExecOptions::default()).await {
        Err(OpError::CpuBudgetSpent { budget: b, .. }) => assert_eq!(b, budget),
        other => panic!("a later command: expected CpuBudgetSpent, got {other:?}"),
    }
    g.work().write("still", b"writable".to_vec()).await.unwrap();
    assert_eq!(g.work().read("still").await.unwrap(), b"writable");
    g.release().await;
}

/// The per-process CPU limit (1 s here) is each command's, not the sandbox's init's, which lives
/// as long as the sandbox: a command's child is killed at it, the init is not under it (its
/// `/proc/1/limits`), and a later command runs. Where `prlimit` is missing the limit stays on
/// the sandbox's bubblewrap, init included, and the summary says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandboxs_init_outlives_the_per_process_cpu_limit() {
    let limits = Limits {
        cpu_seconds: Some(1),
        ..Limits::default()
    };
    let Some(k) = sandboxed("init-cpu", limits) else {
        return;
    };
    let said = k.backend().limits().to_string();
    let g = call(&k, "a").await;
    let out = sh(
        &g,
        "grep 'Max cpu time' /proc/1/limits; grep 'Max cpu time' /proc/self/limits; \
         sh -c 'while :; do :; done'; echo child $?",
    )
    .await
    .unwrap();
    let stdout = text(&out.stdout);
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    let killed = lines[2].join(" ");
    assert!(killed == "child 137" || killed == "child 152", "{out:?}");
    // `Max cpu time <soft> <hard> seconds`: the command's own is 1 s.
    assert_eq!(lines[1][3..5], ["1", "1"], "{out:?}");
    let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file());
    if prlimit && k.backend().limits().per_sandbox {
        assert!(
            said.contains("cpu 1 s (RLIMIT_CPU of each command's processes, by prlimit)"),
            "{said}"
        );
        assert_eq!(lines[0][3], "unlimited", "the init's: {out:?}");
    } else {
        assert!(!said.contains("by prlimit"), "{said}");
        assert_eq!(lines[0][3..5], ["1", "1"], "the init's: {out:?}");
    }
    let again = sh(&g, "echo again").await.unwrap();
    assert_eq!(again.stdout, b"again\n", "{again:?}");
    g.release().await;
}

/// The workspace's quota in the background-writer test.
const QUOTA: u64 = 4 << 20;

/// A process a command left running (`setsid ... &`, the command waiting until it left its
/// group: the init kills the group when the command ends) writes 64 KiB every 50 ms (about
/// 1.3 MiB/s) into a 4 MiB workspace after its command ended. The keeper's watch kills it: the
/// file stops growing within the watch's interval of the quota (bounded here by 4 MiB more,
/// three times what it writes in an interval and a tick), the workspace refuses commands until
/// room is made, and then runs them again. The file's size is polled, bounded by 30 s (the
/// writer passes the quota in about 3 s; the bound only keeps a broken watch from hanging the
/// test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_writer_stops_near_the_workspace_quota() {
    let limits = Limits {
        workspace_bytes: Some(QUOTA),
        ..Limits::default()
    };
    let Some(k) = sandboxed("writer", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let log = k.backend().sandbox_dir(g.sandbox()).join("log");
    let out = sh(
        &g,
        "setsid sh -c 'touch started; while :; do head -c 65536 /dev/zero >> log; sleep 0.05; \
         done' </dev/null >/dev/null 2>&1 & while [ ! -e started ]; do sleep 0.01; done",
    )
    .await
    .unwrap();
    assert_eq!(out.code, Some(0), "{out:?}");
    let size = || std::fs::metadata(&log).map_or(0, |m| m.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while size() <= QUOTA {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never passed the quota"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the quota: the watch kills the writer within an interval (1 s) and a tick.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stopped = size();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(size(), stopped, "the writer goes on past the quota");
    assert!(
        stopped <= QUOTA + (4 << 20),
        "overshoot: {} bytes",
        stopped - QUOTA
    );
    eprintln!(
        "quota overshoot of a background writer: {} bytes",
        stopped - QUOTA
    );
    match g.work().exec(["true"], ExecOptions::default()).await {
        Err(OpError::QuotaExceeded { limit, .. }) => assert_eq!(limit, QUOTA),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    g.work().remove("log").await.unwrap();
    let again = sh(&g, "echo again").await.unwrap();
    assert_eq!(again.stdout, b"again\n", "{again:?}");
    g.release().await;
}

/// The CFS quota of every command cgroup the keepers of this test process made under the `cpu`
/// controller, with its period: `(quota, period)` in microseconds.
fn cfs_quotas() -> Vec<(i64, i64)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "cpu")
            .then(|| path.trim_start_matches('/').to_string())
    }) else {
        return Vec::new();
    };
    let mount = std::fs::canonicalize("/sys/fs/cgroup/cpu").unwrap_or_default();
    let prefix = format!("sandkeeper-{}-", std::process::id());
    let read = |p: PathBuf| -> Option<i64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut out = Vec::new();
    let keepers = std::fs::read_dir(mount.join(path))
        .into_iter()
        .flatten()
        .flatten();
    for keeper in keepers.filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)) {
        for group in std::fs::read_dir(keeper.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = group.path();
            if let (Some(q), Some(p)) = (
                read(dir.join("cpu.cfs_quota_us")),
                read(dir.join("cpu.cfs_period_us")),
            ) {
                out.push((q, p));
            }
        }
    }
    out
}

/// A sandbox uses at most `cpu_cores` of the host's cores at once: as root, where the `cpu`
/// controller is mounted, its cgroup's CFS quota is one period per core (read from the host
/// while its init runs; sandboxes of the other tests here have the default 2). Elsewhere the
/// summary says the cap is not enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_is_capped_at_its_cores() {
    let limits = Limits {
        cpu_cores: Some(1),
        ..Limits::default()
    };
    let Some(k) = sandboxed("cores", limits) else {
        return;
    };
    let said = k.backend().limits().to_string();
    let g = call(&k, "a").await;
    let out = sh(&g, "true").await.unwrap();
    assert_eq!(out.code, Some(0), "{out:?}");
    let cappable = rustix::process::geteuid().is_root()
        && std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file();
    if !cappable {
        assert!(said.contains("cpu cores 1 (NOT ENFORCED here)"), "{said}");
        g.release().await;
        return;
    }
    assert!(
        said.contains("cpu cores 1 (cpu cgroup's CFS quota)"),
        "{said}"
    );
    let quotas = cfs_quotas();
    assert!(
        quotas.iter().any(|&(quota, period)| quota == period),
        "no sandbox cgroup with a quota of one core: {quotas:?}"
    );
    g.release().await;
}

/// The host's processes whose command line has every one of `needles` as an argument.
fn host_processes_with(needles: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = text(&std::fs::read(e.path().join("cmdline")).ok()?);
            needles
                .iter()
                .all(|n| cmdline.split('\0').any(|a| a == *n))
                .then_some(pid)
        })
        .collect()
}

/// Two busy loops one after another, each killed by the per-process CPU limit: their statuses.
const BUSY_TWO: &str = "sh -c 'while :; do :; done'; a=$?; sh -c 'while :; do :; done'; echo $a $?";

/// Whether `out` says both loops of [`BUSY_TWO`] were killed by `RLIMIT_CPU` (`SIGKILL` or
/// `SIGXCPU`).
fn both_killed(out: &ExecOutput) -> bool {
    text(&out.stdout)
        .split_whitespace()
        .filter(|s| *s == "137" || *s == "152")
        .count()
        == 2
}

/// A sandbox's CPU budget (3 s) counts its processes one after another, across its inits: a
/// command spends about 2 s (two loops, each killed by the per-process limit of 1 s; the
/// cgroup counts a little less, 0.97 s each here), the sandbox's init is killed from the host
/// (the next command starts a fresh one, with a fresh cgroup), and the next command's 2 s take
/// the sandbox past its budget, though they are under it alone: it answers `CpuBudgetSpent`.
/// Without cgroups each command spends its 2 s and nothing more is counted (the summary says
/// so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_budget_counts_commands_one_after_another_across_inits() {
    let limits = Limits {
        sandbox_cpu_seconds: Some(3),
        cpu_seconds: Some(1),
        ..Limits::default()
    };
    let Some(k) = sandboxed("cpu-after", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let first = sh(&g, BUSY_TWO).await.unwrap();
    assert!(both_killed(&first), "{first:?}");
    let dir = k.backend().sandbox_dir(g.sandbox());
    let bwraps = host_processes_with(&["--as-pid-1", &dir.to_string_lossy()]);
    assert_eq!(
        bwraps.len(),
        1,
        "one bubblewrap for the sandbox: {bwraps:?}"
    );
    let bwrap = rustix::process::Pid::from_raw(bwraps[0]).unwrap();
    rustix::process::kill_process(bwrap, rustix::process::Signal::KILL).unwrap();
    // A bounded poll of a real process: the bubblewrap is reaped by its keeper's task, which
    // ends the init's cgroup (keeping its CPU time) before the next command starts a new one.
    for _ in 0..500 {
        if !std::path::Path::new(&format!("/proc/{}", bwraps[0])).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The init's end may reach the next exec first: it then answers a retryable error.
    let mut second = sh(&g, BUSY_TWO).await;
    if matches!(&second, Err(e) if e.is_retryable()) {
        second = sh(&g, BUSY_TWO).await;
    }
    if !cpu_watchable() {
        let out = second.unwrap();
        assert!(both_killed(&out), "{out:?}");
        g.release().await;
        return;
    }
    match second {
        Err(OpError::CpuBudgetSpent { used, budget }) => {
            assert_eq!(budget, Duration::from_secs(3));
            assert!(used > budget, "{used:?}");
        }
        other => panic!("expected CpuBudgetSpent, got {other:?}"),
    }
    g.release().await;
}
