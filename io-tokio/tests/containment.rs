//! Containment of a hostile command (issue 31; `docs/threat-model.md`): one test per escape
//! that was found getting through, and per limit, plus attempts that already held so they keep
//! holding. A command here is hostile and may be root inside its sandbox.
//!
//! Tests that need bubblewrap skip (saying so) where it does not work, and fail instead when
//! `SANDKEEPER_REQUIRE_BWRAP` is set, as `.ci/run` sets it. `.ci/run` runs this file twice: as
//! root and as an unprivileged user.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Isolation, Limits, LocalConfig};
use sandkeeper_tokio::{
    CallGuard, ExecOptions, ExecOutput, Keeper, KeeperConfig, LocalBackend, OpError,
};

fn root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandkeeper-cont-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn required() -> bool {
    std::env::var_os("SANDKEEPER_REQUIRE_BWRAP").is_some()
}

fn keeper_with(config: LocalConfig) -> Keeper<LocalBackend> {
    let backend = LocalBackend::new(config).unwrap();
    Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap()
}

/// A keeper whose commands run under bubblewrap, or `None` (the test skips, saying why) where
/// it does not work here and `SANDKEEPER_REQUIRE_BWRAP` is unset.
fn sandboxed(name: &str) -> Option<Keeper<LocalBackend>> {
    sandboxed_with(LocalConfig::new(root(name)))
}

fn sandboxed_with(config: LocalConfig) -> Option<Keeper<LocalBackend>> {
    let config = LocalConfig {
        isolation: if required() {
            Isolation::Require
        } else {
            Isolation::Auto
        },
        ..config
    };
    let k = keeper_with(config);
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

async fn sh(g: &CallGuard<LocalBackend>, script: &str) -> ExecOutput {
    sh_with(g, script, ExecOptions::default()).await
}

async fn sh_with(g: &CallGuard<LocalBackend>, script: &str, options: ExecOptions) -> ExecOutput {
    g.work().exec(["sh", "-c", script], options).await.unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Compiles the C program `source` with the host's `cc` into `out`; `false` (the test skips,
/// saying so) where there is no C compiler.
fn cc(source: &str, out: &Path, extra: &[&str]) -> bool {
    let dir = out.parent().unwrap();
    let c = dir.join(format!("{}.c", out.file_name().unwrap().to_string_lossy()));
    std::fs::write(&c, source).unwrap();
    match std::process::Command::new("cc")
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(&c)
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => panic!("cc failed: {}", text(&o.stderr)),
        Err(e) => {
            eprintln!("skipped: no C compiler ({e})");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Capabilities

/// As root the command kept every capability (`CapEff` all ones); now it has none, in any set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_has_no_capabilities() {
    let Some(k) = sandboxed("caps") else { return };
    let g = call(&k, "a").await;
    let out = sh(&g, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status").await;
    let status = text(&out.stdout);
    assert_eq!(status.lines().count(), 5, "{out:?}");
    for line in status.lines() {
        assert!(line.ends_with("0000000000000000"), "{status}");
    }
    let nnp = sh(&g, "grep NoNewPrivs /proc/self/status").await;
    assert_eq!(text(&nnp.stdout).trim(), "NoNewPrivs:\t1");
    g.release().await;
}

/// `umount -l` of the tmpfs that hid the keeper's root revealed every other sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmounting_what_hides_the_keepers_root_reveals_no_other_sandbox() {
    let Some(k) = sandboxed("umount") else { return };
    let a = call(&k, "a").await;
    let b = call(&k, "b").await;
    b.work().write("secret.txt", "b's").await.unwrap();
    let root = k.backend().root().to_path_buf();
    let b_secret = k.backend().sandbox_dir(b.sandbox()).join("secret.txt");
    let out = sh(
        &a,
        &format!(
            "umount -l '{}'; umount -l /tmp; cat '{}'",
            root.display(),
            b_secret.display()
        ),
    )
    .await;
    assert!(!text(&out.stdout).contains("b's"), "{out:?}");
    a.release().await;
    b.release().await;
}

/// `mount -o remount,bind,rw /` made the host writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remounting_the_host_read_write_fails() {
    let Some(k) = sandboxed("remount") else {
        return;
    };
    let g = call(&k, "a").await;
    let escape = PathBuf::from(format!("/usr/sandkeeper-escape-{}", std::process::id()));
    let out = sh(
        &g,
        &format!(
            "mount -o remount,bind,rw /; mount -o remount,bind,rw /usr; touch '{}'",
            escape.display()
        ),
    )
    .await;
    let escaped = escape.exists();
    let _ = std::fs::remove_file(&escape);
    assert!(!escaped, "the command wrote the host's /usr: {out:?}");
    assert!(!out.success(), "{out:?}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// Code on the host side

/// A request's environment was set on the `bwrap` process itself, so `LD_PRELOAD` of a library
/// in the workspace ran workspace code on the host side before any namespace existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_of_the_request_does_not_run_on_the_host_side() {
    let Some(k) = sandboxed("preload") else {
        return;
    };
    let g = call(&k, "a").await;
    let dir = k.backend().sandbox_dir(g.sandbox());
    let so = dir.join("evil.so");
    // Writes a marker on the host's /tmp; inside the sandbox /tmp is its own.
    let marker = std::env::temp_dir().join(format!("sandkeeper-preload-{}", std::process::id()));
    let source = format!(
        "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {{\n\
         FILE *f = fopen(\"{}\", \"a\"); if (f) {{ fputs(\"ran\\n\", f); fclose(f); }} }}\n",
        marker.display()
    );
    if !cc(&source, &so, &["-shared", "-fPIC"]) {
        return;
    }
    let options = ExecOptions {
        env: vec![("LD_PRELOAD".into(), so.display().to_string())],
        ..ExecOptions::default()
    };
    let out = g.work().exec(["true"], options).await.unwrap();
    let ran = marker.exists();
    let _ = std::fs::remove_file(&marker);
    assert!(!ran, "workspace code ran on the host side: {out:?}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// Host sockets and descriptors

/// A pathname unix socket of the host under `/run` was reachable (the whole `/` was bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_unix_socket_is_not_reachable() {
    let Some(k) = sandboxed("socket") else { return };
    let g = call(&k, "a").await;
    // Under /run as root; an unprivileged keeper may not make a directory there, and uses the
    // host's temporary directory instead (just as much the host's, and not the sandbox's /tmp).
    let mut dir = PathBuf::from(format!("/run/sandkeeper-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        assert!(
            !rustix::process::geteuid().is_root(),
            "{}: {e}",
            dir.display()
        );
        dir = root("socket-host");
        std::fs::create_dir_all(&dir).unwrap();
    }
    let socket = dir.join("s");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    // A client from the workspace: python3 where the sandbox has it, else C.
    let client = k.backend().sandbox_dir(g.sandbox()).join("connect");
    let source = "#include <sys/socket.h>\n#include <sys/un.h>\n#include <string.h>\n\
        #include <stdio.h>\nint main(int c, char **v) { int s = socket(AF_UNIX, SOCK_STREAM, 0);\n\
        struct sockaddr_un a = {0}; a.sun_family = AF_UNIX; strncpy(a.sun_path, v[1], 100);\n\
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) { puts(\"connected\"); return 0; }\n\
        perror(\"connect\"); return 1; }\n";
    if !cc(source, &client, &[]) {
        return;
    }
    let out = g
        .work()
        .exec(
            ["./connect", socket.to_str().unwrap()],
            ExecOptions::default(),
        )
        .await
        .unwrap();
    let accepted = listener.accept().is_ok();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!accepted && !out.success(), "{out:?}");
    g.release().await;
}

/// A descriptor the keeper holds without close-on-exec reached the command
/// (`/proc/self/fd/N` showed the hidden root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_the_keeper_leaks_does_not_reach_the_command() {
    let Some(k) = sandboxed("fd") else { return };
    let g = call(&k, "a").await;
    let b = call(&k, "b").await;
    b.work().write("secret.txt", "b's").await.unwrap();
    // The keeper's root, open without close-on-exec: a leak the keeper did not mean.
    let leaked = std::fs::File::open(k.backend().root()).unwrap();
    rustix::io::fcntl_setfd(&leaked, rustix::io::FdFlags::empty()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    let b_name = k
        .backend()
        .sandbox_dir(b.sandbox())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let out = sh(
        &g,
        &format!("ls /proc/self/fd/; cat /proc/self/fd/{fd}/{b_name}/secret.txt"),
    )
    .await;
    drop(leaked);
    assert!(!text(&out.stdout).contains("b's"), "{out:?}");
    // Only what the shell itself holds (0, 1, 2 and the directory `ls` reads).
    let fds: Vec<u32> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(fds.iter().all(|&n| n <= 3), "{out:?}");
    g.release().await;
    b.release().await;
}

// ---------------------------------------------------------------------------------------------
// Host files

/// The whole host was mounted read-only: `/etc/shadow` (as root), `/root` and the users' homes
/// were readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_secrets_are_not_readable() {
    let Some(k) = sandboxed("secrets") else {
        return;
    };
    let g = call(&k, "a").await;
    for path in [
        "/etc/shadow",
        "/etc/gshadow",
        "/root",
        "/home",
        "/var",
        "/run",
    ] {
        let out = sh(&g, &format!("ls -la {path} && cat {path}")).await;
        assert!(
            !out.success() && out.stdout.is_empty(),
            "{path} readable: {out:?}"
        );
    }
    // What commands need is there.
    let out = sh(
        &g,
        "test -r /etc/passwd && ls /usr/bin/env >/dev/null && echo ok",
    )
    .await;
    assert_eq!(text(&out.stdout), "ok\n", "{out:?}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// System calls

/// The syscalls the filter refuses, tried directly (`syscall(2)` from C): each must fail with
/// EPERM. Numbers for x86-64 and aarch64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_refuses_namespaces_mounts_ptrace_keyrings_and_bpf() {
    let Some(k) = sandboxed("seccomp") else {
        return;
    };
    let g = call(&k, "a").await;
    let probe = k.backend().sandbox_dir(g.sandbox()).join("probe");
    let source = "#define _GNU_SOURCE\n#include <sched.h>\n#include <unistd.h>\n#include <errno.h>\n\
        #include <stdio.h>\n#include <sys/syscall.h>\n#include <sys/mount.h>\n\
        #include <sys/ptrace.h>\n#include <signal.h>\n#include <sys/wait.h>\n\
        static void t(const char *n, long r) { printf(\"%s %ld %d\\n\", n, r, r < 0 ? errno : 0); }\n\
        int main(void) {\n\
        t(\"unshare_user\", syscall(SYS_unshare, CLONE_NEWUSER));\n\
        t(\"unshare_mount\", syscall(SYS_unshare, CLONE_NEWNS));\n\
        t(\"setns\", syscall(SYS_setns, 0, 0));\n\
        t(\"mount\", syscall(SYS_mount, \"none\", \"/tmp\", \"tmpfs\", 0, 0));\n\
        t(\"umount2\", syscall(SYS_umount2, \"/tmp\", MNT_DETACH));\n\
        t(\"ptrace\", syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0));\n\
        t(\"add_key\", syscall(SYS_add_key, \"user\", \"k\", \"v\", 1, -2));\n\
        t(\"keyctl\", syscall(SYS_keyctl, 0, -3, 0));\n\
        t(\"request_key\", syscall(SYS_request_key, \"user\", \"k\", 0, -2));\n\
        t(\"bpf\", syscall(SYS_bpf, 0, 0, 0));\n\
        long c = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);\n\
        if (c == 0) _exit(0); if (c > 0) waitpid(c, 0, 0);\n\
        t(\"clone_newuser\", c);\n\
        return 0; }\n";
    if !cc(source, &probe, &[]) {
        return;
    }
    let out = g
        .work()
        .exec(["./probe"], ExecOptions::default())
        .await
        .unwrap();
    let report = text(&out.stdout);
    assert_eq!(report.lines().count(), 11, "{out:?}");
    for line in report.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            (fields[1], fields[2]),
            ("-1", "1"),
            "not refused with EPERM: {line}"
        );
    }
    // And through the ordinary tool.
    let out = sh(&g, "unshare --user --map-root-user true").await;
    assert!(!out.success(), "{out:?}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// The public LocalBackend::run

/// `LocalBackend::run` bypassed bubblewrap and passed the host's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend_run_is_isolated_with_a_clean_environment() {
    let Some(k) = sandboxed("run") else { return };
    let g = call(&k, "a").await;
    let out = k
        .backend()
        .run(
            g.sandbox(),
            &[
                "sh",
                "-c",
                "env; grep CapEff /proc/self/status; ls /proc | grep -c '^[0-9]'",
            ],
            None,
        )
        .await
        .unwrap();
    let report = text(&out.stdout);
    let allowed = [
        "PATH",
        "HOME",
        "PWD",
        "LANG",
        "SANDKEEPER_SANDBOX",
        "SHLVL",
        "_",
        "OLDPWD",
    ];
    for (name, value) in std::env::vars() {
        if allowed.contains(&name.as_str()) {
            continue;
        }
        assert!(
            !report.contains(&format!("{name}={value}")),
            "the host's {name} reached the command: {report}"
        );
    }
    assert!(report.contains("CapEff:\t0000000000000000"), "{report}");
    // A new PID namespace: only the sandbox's own processes.
    let pids: usize = report.lines().last().unwrap().trim().parse().unwrap();
    assert!(pids < 10, "{report}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// Without bubblewrap

/// Under `Isolation::Off`, a `setsid` child (a session and group of its own) outlived its exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_child_dies_with_its_exec_without_bubblewrap() {
    let k = keeper_with(LocalConfig {
        isolation: Isolation::Off,
        ..LocalConfig::new(root("setsid"))
    });
    let g = call(&k, "a").await;
    // `$!` is the setsid'd shell: the leader of a new session, whose id is its pid.
    let out = sh(
        &g,
        "setsid sh -c 'sleep 1000; echo survived' >/dev/null 2>&1 </dev/null & sleep 0.2; echo $!",
    )
    .await;
    let leader: i32 = text(&out.stdout).trim().parse().expect("a pid");
    let pids: Vec<i32> = std::iter::once(leader)
        .chain(session_members(leader))
        .collect();
    assert!(!pids.is_empty(), "no setsid child seen: {out:?}");
    // The kill is a signal already sent when the exec returned; the processes may take a moment
    // to be reaped (by init, not by us), so this polls, bounded.
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    };
    for _ in 0..200 {
        if pids.iter().all(|&p| gone(p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let alive: Vec<i32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
    for &p in &alive {
        let _ = std::process::Command::new("kill")
            .args(["-9", &p.to_string()])
            .status();
    }
    assert!(alive.is_empty(), "outlived their exec: {alive:?}");
    g.release().await;
}

/// The processes (other than `sid` itself) whose session id is `sid`, from `/proc`.
fn session_members(sid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name's closing parenthesis: state ppid pgrp session ...
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        if fields.get(3) == Some(&sid.to_string().as_str()) && pid != sid {
            out.push(pid);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Limits

/// A keeper whose commands run under bubblewrap with `limits`, or `None` (skipped).
fn limited(name: &str, limits: Limits) -> Option<Keeper<LocalBackend>> {
    let k = sandboxed_with(LocalConfig {
        limits,
        ..LocalConfig::new(root(name))
    })?;
    eprintln!("limits: {}", k.backend().limits());
    Some(k)
}

/// The keeper still answers: a command of another sandbox runs to its end, at once.
async fn keeper_answers(k: &Keeper<LocalBackend>, c: &str) {
    let other = call(k, c).await;
    let out = sh_with(
        &other,
        "echo ok",
        ExecOptions {
            timeout: Some(Duration::from_secs(10)),
            ..ExecOptions::default()
        },
    )
    .await;
    assert_eq!(text(&out.stdout), "ok\n", "{out:?}");
    other.release().await;
}

/// A command forks as much as it can: it gets no more processes than the limit, and a fork
/// bomb, left to run, leaves the keeper answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stays_inside_and_the_keeper_still_answers() {
    let limits = Limits {
        processes: Some(32),
        ..Limits::default()
    };
    let Some(k) = limited("nproc", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let forker = k.backend().sandbox_dir(g.sandbox()).join("forker");
    let source = "#include <unistd.h>\n#include <stdio.h>\nint main(void) { int n = 0;\n\
        for (int i = 0; i < 300; i++) { pid_t p = fork(); if (p == 0) { pause(); _exit(0); }\n\
        if (p < 0) break; n++; } printf(\"%d\\n\", n); return 0; }\n";
    if !cc(source, &forker, &[]) {
        return;
    }
    let out = g
        .work()
        .exec(["./forker"], ExecOptions::default())
        .await
        .unwrap();
    let forked: u32 = text(&out.stdout).trim().parse().expect("a count");
    assert!(forked > 0 && forked < 32, "forked {forked}");
    // The real thing, for two seconds: while it runs, another sandbox's command runs to its
    // end; then it ends by its timeout, with everything it made.
    let work = g.work();
    let bomb = work.exec(
        ["sh", "-c", "b() { b | b & }; b; sleep 100"],
        ExecOptions {
            timeout: Some(Duration::from_secs(2)),
            ..ExecOptions::default()
        },
    );
    let (bomb, ()) = tokio::join!(bomb, keeper_answers(&k, "c"));
    assert!(
        matches!(bomb, Err(OpError::Timeout { .. }) | Ok(_)),
        "{bomb:?}"
    );
    keeper_answers(&k, "b").await;
    g.release().await;
}

/// A command that allocates without end is stopped at the memory limit (killed by the OOM
/// killer in its own cgroup, or refused by `RLIMIT_AS`); the keeper lives on and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_stopped_and_the_keeper_lives() {
    let limits = Limits {
        memory_bytes: Some(128 << 20),
        ..Limits::default()
    };
    let Some(k) = limited("memory", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let hog = k.backend().sandbox_dir(g.sandbox()).join("hog");
    let source = "#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\n\
        int main(void) { for (int mib = 16; mib <= 2048; mib += 16) {\n\
        char *p = malloc(16 << 20); if (!p) { printf(\"refused at %d MiB\\n\", mib); return 3; }\n\
        memset(p, 1, 16 << 20); } puts(\"got 2 GiB\"); return 0; }\n";
    if !cc(source, &hog, &[]) {
        return;
    }
    let out = g
        .work()
        .exec(["./hog"], ExecOptions::default())
        .await
        .unwrap();
    assert!(!out.success(), "{out:?}");
    assert!(!text(&out.stdout).contains("2 GiB"), "{out:?}");
    eprintln!("hog: code {:?}, {}", out.code, text(&out.stdout).trim());
    keeper_answers(&k, "b").await;
    g.release().await;
}

/// A command that spins is killed at its CPU-time limit, well before its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_command_is_killed_at_its_cpu_limit() {
    let limits = Limits {
        cpu_seconds: Some(1),
        ..Limits::default()
    };
    let Some(k) = limited("cpu", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    // A real process spinning: it ends on its own after about one second of CPU; the timeout
    // (30 s) is only the bound that says it did not.
    let out = sh_with(
        &g,
        "while :; do :; done",
        ExecOptions {
            timeout: Some(Duration::from_secs(30)),
            ..ExecOptions::default()
        },
    )
    .await;
    assert!(!out.success(), "{out:?}");
    g.release().await;
}

/// A file past the size limit and a `/tmp` past its size fail, each with its own error
/// (`EFBIG`, `ENOSPC`), and nothing past the limit lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_past_the_file_size_and_tmp_limits_fail() {
    let limits = Limits {
        file_size_bytes: Some(1 << 20),
        tmp_bytes: Some(512 << 10),
        ..Limits::default()
    };
    let Some(k) = limited("fsize", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    // SIGXFSZ ignored, so the write itself fails and says why.
    let out = sh(&g, "trap '' XFSZ; head -c 2000000 /dev/zero > big").await;
    assert!(!out.success(), "{out:?}");
    assert!(text(&out.stderr).contains("File too large"), "{out:?}");
    let size = std::fs::metadata(k.backend().sandbox_dir(g.sandbox()).join("big"))
        .unwrap()
        .len();
    assert!(size <= 1 << 20, "{size}");
    let out = sh(&g, "head -c 800000 /dev/zero > /tmp/big").await;
    assert!(!out.success(), "{out:?}");
    assert!(text(&out.stderr).contains("No space left"), "{out:?}");
    g.release().await;
}

// ---------------------------------------------------------------------------------------------
// Attempts that already held, so they keep holding

/// A command sees no host process and cannot signal one (a PID namespace of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_processes_are_neither_seen_nor_signalled() {
    let Some(k) = sandboxed("pids") else { return };
    let g = call(&k, "a").await;
    let keeper = std::process::id();
    let out = sh(
        &g,
        &format!("kill -0 {keeper} && echo signalled; cat /proc/{keeper}/cmdline && echo seen"),
    )
    .await;
    assert!(!text(&out.stdout).contains("signalled"), "{out:?}");
    assert!(!text(&out.stdout).contains("seen"), "{out:?}");
    g.release().await;
}

/// A command reaches no network but loopback, and cannot write outside its workspace and its
/// own `/tmp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_and_nothing_writable_outside_the_workspace() {
    let Some(k) = sandboxed("net") else { return };
    let g = call(&k, "a").await;
    let out = sh(
        &g,
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '",
    )
    .await;
    assert_eq!(text(&out.stdout), "lo\n", "{out:?}");
    for path in ["/usr/x", "/etc/x", "/x", "/dev/shm/x/../../x"] {
        let out = sh(&g, &format!("echo x > {path} && echo wrote")).await;
        assert!(!text(&out.stdout).contains("wrote"), "{path}: {out:?}");
    }
    let out = sh(&g, "echo x > /tmp/x && echo x > ./x && echo wrote").await;
    assert_eq!(text(&out.stdout), "wrote\n", "{out:?}");
    g.release().await;
}

/// A command cannot change the directory another sandbox's workspace lives in, even knowing its
/// path; it sees neither the keeper's root nor its snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepers_root_and_other_sandboxes_stay_out_of_sight() {
    let Some(k) = sandboxed("others") else {
        return;
    };
    let a = call(&k, "a").await;
    let b = call(&k, "b").await;
    let b_dir = k.backend().sandbox_dir(b.sandbox());
    b.work().write("secret.txt", "b's").await.unwrap();
    let out = sh(
        &a,
        &format!(
            "ls '{}'; cat '{}/secret.txt'; ls '{}'; echo x > '{}/planted'",
            k.backend().root().display(),
            b_dir.display(),
            k.backend().snapshots_dir().display(),
            b_dir.display()
        ),
    )
    .await;
    assert!(!text(&out.stdout).contains("b's"), "{out:?}");
    assert!(!b_dir.join("planted").exists());
    a.release().await;
    b.release().await;
}

/// The keeper's records (`<root>/.meta/`: what each sandbox was started for, what each
/// snapshot is and until when it is kept) are out of every command's reach: a command that knows
/// their paths can neither read nor change its own sandbox's record, nor plant a record of its
/// own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepers_records_stay_out_of_a_commands_reach() {
    let Some(k) = sandboxed("records") else {
        return;
    };
    let a = call(&k, "a").await;
    let records = k.backend().root().join(".meta");
    let own = records.join(format!("sandboxes/sbx-{}.json", a.sandbox().0));
    let before = std::fs::read(&own).expect("the start recorded it");
    let out = sh(
        &a,
        &format!(
            "cat '{own}'; echo '{{}}' > '{own}'; mkdir -p '{dir}/snapshots'; \
             echo '{{}}' > '{dir}/snapshots/sbx-1-x.json'; ls -R '{dir}'",
            own = own.display(),
            dir = records.display(),
        ),
    )
    .await;
    let key = k
        .backend()
        .sandbox_record(a.sandbox())
        .unwrap()
        .unwrap()
        .key;
    assert!(!text(&out.stdout).contains(&key), "{out:?}");
    assert_eq!(std::fs::read(&own).unwrap(), before, "unchanged");
    assert!(!records.join("snapshots/sbx-1-x.json").exists());
    a.release().await;
}

// ---------------------------------------------------------------------------------------------
// One namespace per sandbox (issue 31: the exec cost, limits per sandbox)

/// Waits until `path` exists: a bounded poll of a real process (a command of the test that
/// makes it), which no event of the keeper announces. Panics after ten seconds.
async fn until_exists(path: &Path) {
    for _ in 0..1000 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

/// The C program that forks as many children as it can (up to 300), each waiting, and prints
/// how many it made; `None` (skipped) without a C compiler.
fn forker(at: &Path) -> Option<()> {
    let source = "#include <unistd.h>\n#include <stdio.h>\nint main(void) { int n = 0;\n\
        for (int i = 0; i < 300; i++) { pid_t p = fork(); if (p == 0) { pause(); _exit(0); }\n\
        if (p < 0) break; n++; } printf(\"%d\\n\", n); return 0; }\n";
    cc(source, at, &[]).then_some(())
}

/// How many children `./forker` of the sandbox could make.
async fn forked(g: &CallGuard<LocalBackend>) -> u32 {
    let out = g
        .work()
        .exec(["./forker"], ExecOptions::default())
        .await
        .unwrap();
    text(&out.stdout).trim().parse().expect("a count")
}

/// Before issue 31's init, each command had the whole process limit of its own: a sandbox
/// running k commands at once had k times the limit. Now two commands of one sandbox share it:
/// while one holds 20 processes, the other can make 20 fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commands_of_one_sandbox_share_its_process_limit() {
    let limits = Limits {
        processes: Some(48),
        ..Limits::default()
    };
    let Some(k) = limited("shared-nproc", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let dir = k.backend().sandbox_dir(g.sandbox());
    if forker(&dir.join("forker")).is_none() {
        return;
    }
    let alone = forked(&g).await;
    let work = g.work();
    let holder = sh_with(
        &g,
        "for i in $(seq 20); do sleep 1000 & done; touch held; \
         while [ ! -e done ]; do sleep 0.05; done",
        ExecOptions {
            timeout: Some(Duration::from_secs(30)),
            ..ExecOptions::default()
        },
    );
    let beside = async {
        until_exists(&dir.join("held")).await;
        let n = forked(&g).await;
        std::fs::write(dir.join("done"), "").unwrap();
        n
    };
    let (held, beside) = tokio::join!(holder, beside);
    assert!(held.success(), "{held:?}");
    assert!(
        beside + 15 <= alone,
        "alone a command made {alone} processes, beside one holding 20 it made {beside}: \
         the limit is not the sandbox's"
    );
    drop(work);
    g.release().await;
}

/// A fork bomb fills its own sandbox's process limit only: another sandbox's command runs to
/// its end while it rages, and its own sandbox runs commands again once it was killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_in_one_sandbox_leaves_another_sandboxs_exec_running() {
    let limits = Limits {
        processes: Some(64),
        ..Limits::default()
    };
    let Some(k) = limited("bomb-two", limits) else {
        return;
    };
    let a = call(&k, "a").await;
    let b = call(&k, "b").await;
    let a_dir = k.backend().sandbox_dir(a.sandbox());
    let work = a.work();
    let bomb = work.exec(
        ["sh", "-c", "touch started; b() { b | b & }; b; sleep 100"],
        ExecOptions {
            timeout: Some(Duration::from_secs(3)),
            ..ExecOptions::default()
        },
    );
    let other = async {
        until_exists(&a_dir.join("started")).await;
        sh(&b, "echo ok").await
    };
    let (bomb, other) = tokio::join!(bomb, other);
    // Contained either way: it runs into its timeout, or (the process limit reached) its own
    // shell cannot fork its `sleep` and gives up ("Cannot fork"), as a CI run saw.
    let gave_up = matches!(&bomb, Ok(out) if out.code != Some(0) && text(&out.stderr).contains("Cannot fork"));
    assert!(
        matches!(bomb, Err(OpError::Timeout { .. })) || gave_up,
        "{bomb:?}"
    );
    assert_eq!(text(&other.stdout), "ok\n", "{other:?}");
    let again = a
        .work()
        .exec(["sh", "-c", "echo again"], ExecOptions::default())
        .await;
    assert!(
        matches!(&again, Ok(out) if text(&out.stdout) == "again\n"),
        "{again:?}"
    );
    a.release().await;
    b.release().await;
}

/// The request's variables were on bubblewrap's command line (`--setenv K V`), which every
/// user of the host can read in `/proc/<pid>/cmdline` while the command runs. Now they travel
/// over the sandbox init's pipe: no host process's command line holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_environment_is_on_no_host_command_line() {
    let Some(k) = sandboxed("env-cmdline") else {
        return;
    };
    let g = call(&k, "a").await;
    let dir = k.backend().sandbox_dir(g.sandbox());
    let secret = format!("sk-secret-{}", std::process::id());
    let running = sh_with(
        &g,
        "touch running; while [ ! -e done ]; do sleep 0.05; done; printf %s \"$TOKEN\"",
        ExecOptions {
            env: vec![("TOKEN".into(), secret.clone())],
            timeout: Some(Duration::from_secs(30)),
            ..ExecOptions::default()
        },
    );
    let look = async {
        until_exists(&dir.join("running")).await;
        let seen: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| text(&c).replace('\0', " "))
            .filter(|c| c.contains(&secret))
            .collect();
        std::fs::write(dir.join("done"), "").unwrap();
        seen
    };
    let (out, seen) = tokio::join!(running, look);
    assert_eq!(text(&out.stdout), secret, "the command got its variable");
    assert!(seen.is_empty(), "on a host command line: {seen:?}");
    g.release().await;
}

/// Field 22 of `/proc/1/stat` inside the sandbox: when its PID 1 started.
async fn init_started(g: &CallGuard<LocalBackend>) -> String {
    let out = sh(g, "cut -d' ' -f22 /proc/1/stat").await;
    assert!(out.success(), "{out:?}");
    text(&out.stdout)
}

/// A command cannot end or stop its sandbox's init: `kill -9 1` (or `-STOP`) from inside does
/// nothing (the kernel drops a signal its namespace's init has no handler for), and the next
/// command runs under the same init.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_pid_1_from_inside_leaves_the_init_running() {
    let Some(k) = sandboxed("kill-init") else {
        return;
    };
    let g = call(&k, "a").await;
    let before = init_started(&g).await;
    let out = sh(
        &g,
        "kill -9 1; kill -STOP 1; kill -TERM 1; kill -INT 1; echo sent",
    )
    .await;
    assert_eq!(text(&out.stdout), "sent\n", "{out:?}");
    assert_eq!(init_started(&g).await, before, "the same init");
    g.release().await;
}

/// Host processes whose command line holds every one of `needles`.
fn host_processes_with(needles: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
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

/// The processes whose parent is `pid`, from `/proc`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let child = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?;
            (ppid.trim().parse::<i32>().ok()? == pid).then_some(child)
        })
        .collect()
}

/// An init killed from the host (`SIGKILL` to its bubblewrap) takes its sandbox's namespace
/// with it: the next exec answers a typed, retryable error or runs in a fresh init, and the
/// one after runs in a fresh init.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_after_the_init_was_killed_from_the_host_gets_a_fresh_init() {
    let Some(k) = sandboxed("host-kill") else {
        return;
    };
    if k.backend().isolation().init().is_none() {
        eprintln!("skipped: {}", k.backend().isolation());
        return;
    }
    let g = call(&k, "a").await;
    let before = init_started(&g).await;
    let dir = k.backend().sandbox_dir(g.sandbox());
    let dir = dir.to_string_lossy();
    let bwraps = host_processes_with(&["--as-pid-1", &dir]);
    assert_eq!(
        bwraps.len(),
        1,
        "one bubblewrap for the sandbox: {bwraps:?}"
    );
    let inits = children_of(bwraps[0]);
    assert_eq!(inits.len(), 1, "the init under its bubblewrap: {inits:?}");
    let pid = rustix::process::Pid::from_raw(bwraps[0]).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    // A bounded poll of a real process: the init dies with its bubblewrap (its parent-death
    // signal), asynchronously; the test is about the execs after that.
    for _ in 0..500 {
        if !Path::new(&format!("/proc/{}", inits[0])).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = g.work().exec(["true"], ExecOptions::default()).await;
    match &next {
        Ok(out) => assert!(out.success(), "{out:?}"),
        Err(e @ OpError::Backend { .. }) => {
            assert_eq!(e.class(), sandkeeper_tokio::OpErrorClass::Retryable)
        }
        Err(e) => panic!("neither a fresh init nor a typed error: {e:?}"),
    }
    assert_ne!(init_started(&g).await, before, "a fresh init");
    g.release().await;
}

/// Sixteen commands of one sandbox at once, each with its own input, output, error and exit
/// code: each gets exactly its own back (the init tells their frames apart by id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_in_one_sandbox_each_get_their_own_output() {
    let Some(k) = sandboxed("concurrent") else {
        return;
    };
    let g = call(&k, "a").await;
    let script = "i=0; while [ $i -lt 300 ]; do echo \"$ID-$i\"; i=$((i+1)); done; \
                  cat; echo \"err-$ID\" >&2; exit $ID";
    let runs = (1..=16).map(|id| {
        sh_with(
            &g,
            script,
            ExecOptions {
                env: vec![("ID".into(), id.to_string())],
                stdin: format!("in-{id}\n").into_bytes(),
                ..ExecOptions::default()
            },
        )
    });
    let outs = futures_join_all(runs).await;
    for (n, out) in outs.iter().enumerate() {
        let id = n + 1;
        let mut want: String = (0..300).map(|i| format!("{id}-{i}\n")).collect();
        want.push_str(&format!("in-{id}\n"));
        assert_eq!(out.code, Some(id as i32), "{id}");
        assert_eq!(text(&out.stdout), want, "{id}");
        assert_eq!(text(&out.stderr), format!("err-{id}\n"), "{id}");
        assert!(!out.truncated);
    }
    g.release().await;
}

/// Runs every future at once (tasks of the test's runtime would need `'static`).
async fn futures_join_all<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut fs: Vec<std::pin::Pin<Box<F>>> = fs.map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in fs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}

/// A command that allocates past its sandbox's memory limit ends (the OOM killer of the
/// sandbox's cgroup picks it, the largest process there; or `RLIMIT_AS` refuses it), and the
/// sandbox's next command runs under the same init: neither the keeper nor the init was chosen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_ends_its_command_not_its_sandboxs_init() {
    let limits = Limits {
        memory_bytes: Some(128 << 20),
        ..Limits::default()
    };
    let Some(k) = limited("memory-init", limits) else {
        return;
    };
    let g = call(&k, "a").await;
    let hog = k.backend().sandbox_dir(g.sandbox()).join("hog");
    let source = "#include <stdlib.h>\n#include <string.h>\n\
        int main(void) { for (int mib = 16; mib <= 2048; mib += 16) {\n\
        char *p = malloc(16 << 20); if (!p) return 3; memset(p, 1, 16 << 20); } return 0; }\n";
    if !cc(source, &hog, &[]) {
        return;
    }
    let before = init_started(&g).await;
    let out = g
        .work()
        .exec(["./hog"], ExecOptions::default())
        .await
        .unwrap();
    assert!(!out.success(), "{out:?}");
    assert_eq!(init_started(&g).await, before, "the same init");
    g.release().await;
}

/// A process that leaves its command's group (`setsid`) and its output is not killed with the
/// command: under one bubblewrap per sandbox it lives on inside the sandbox (its namespaces and
/// limits) — but only until the sandbox stops, when the whole PID namespace dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_left_its_group_dies_when_its_sandbox_stops() {
    let Some(k) = sandboxed("escapee") else {
        return;
    };
    let g = call(&k, "a").await;
    let mark = format!("1000.{}", std::process::id());
    let out = sh(
        &g,
        // Waits until the child leads its own session (field 6 of its stat), or the command's
        // end would kill it still in the group.
        &format!(
            "setsid sleep {mark} </dev/null >/dev/null 2>&1 & p=$!; \
             while [ \"$(cut -d' ' -f6 /proc/$p/stat)\" != \"$p\" ]; do :; done; echo started"
        ),
    )
    .await;
    assert_eq!(text(&out.stdout), "started\n", "{out:?}");
    if k.backend().isolation().init().is_some() {
        assert_eq!(
            host_processes_with(&["sleep", &mark]).len(),
            1,
            "it lives on in its sandbox"
        );
    }
    g.release().await;
    k.close(Duration::from_secs(10)).await;
    // A bounded poll of a real process: the kernel kills the PID namespace's processes once
    // its init died, and they are gone once reaped.
    for _ in 0..500 {
        if host_processes_with(&["sleep", &mark]).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the escaped process outlived its sandbox");
}

/// The init's pipes carry every command's request (variables, input) and answer: a command,
/// the same user as the init inside the sandbox, could open them through `/proc/1/fd` (a
/// dumpable process's descriptors are its user's) to read the other commands' requests or
/// forge frames to the keeper. The init is not dumpable: they stay out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_reach_the_inits_pipes() {
    let Some(k) = sandboxed("init-fds") else {
        return;
    };
    if k.backend().isolation().init().is_none() {
        eprintln!("skipped: {}", k.backend().isolation());
        return;
    }
    let g = call(&k, "a").await;
    let out = sh(
        &g,
        "for fd in 0 1 2; do (exec 3</proc/1/fd/$fd) 2>/dev/null && echo read-$fd; \
         (exec 3>/proc/1/fd/$fd) 2>/dev/null && echo write-$fd; done; \
         (exec 3</proc/1/mem) 2>/dev/null && echo mem; echo done",
    )
    .await;
    assert_eq!(text(&out.stdout), "done\n", "{out:?}");
    assert_eq!(text(&sh(&g, "echo ok").await.stdout), "ok\n");
    g.release().await;
}

/// A streamed command whose reader does not keep up blocks on its output, as on a pipe: the
/// keeper holds at most a window of it (1 MiB) instead of all it wrote. Without the window a
/// command could fill the keeper's memory through a slow reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_command_waits_for_a_slow_reader() {
    let Some(k) = sandboxed("window") else {
        return;
    };
    let g = call(&k, "a").await;
    let dir = k.backend().sandbox_dir(g.sandbox());
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let work = g.work();
    let running = work.exec_streaming(
        ["sh", "-c", "head -c 8000000 /dev/zero; touch wrote-all"],
        ExecOptions::default(),
        tx,
    );
    let read = async {
        let first = rx.recv().await.expect("a first piece");
        // A bounded wait on a real process: were its output not held back, it would write
        // its 8 MB and the marker well within this time.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = !dir.join("wrote-all").exists();
        let mut total = match first {
            sandkeeper_tokio::Chunk::Stdout(b) => b.len(),
            sandkeeper_tokio::Chunk::Stderr(_) => 0,
        };
        while let Some(chunk) = rx.recv().await {
            if let sandkeeper_tokio::Chunk::Stdout(b) = chunk {
                total += b.len();
            }
        }
        (held, total)
    };
    let (out, (held, total)) = tokio::join!(running, read);
    let out = out.unwrap();
    assert!(out.success() && out.truncated, "{:?}", out.code);
    assert_eq!(total, 8_000_000, "every byte streamed");
    if k.backend().isolation().init().is_some() {
        assert!(held, "the command wrote everything while its reader slept");
    }
    g.release().await;
}
