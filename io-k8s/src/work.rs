//! The application's own work in a pod ([`SandboxOps`] for [`K8sBackend`]): every operation is
//! one or a few execs over the same `pods/exec` websocket as uploads, argv only (no shell), in
//! the container uploads go to (named per the API server's rule), each bounded by `timeout -s
//! KILL` in the container (its whole process group) and a client deadline a little later.
//!
//! - Paths are confined to the working directory: besides [`WorkPath`]'s rules (relative, no
//!   `..`), the container resolves each one (`realpath -m`) and a path whose resolution leaves
//!   the working directory (through a symlink) is refused with [`OpError::Escapes`] before
//!   anything touches it. (Between that check and the operation, a process in the pod could
//!   swap a directory for a symlink; the pod is the application's own.)
//! - A command runs as `env -i -C <dir> PATH=… HOME=<workdir> LANG=C.UTF-8 <its variables>
//!   <argv>`: none of the container's own environment; `env -C` needs GNU coreutils 8.28 or
//!   later in the image (Debian and Ubuntu based images have it; busybox does not).
//! - `write` streams the bytes to a temporary file beside the target (`cp /dev/stdin`), then renames it
//!   over the target (`mv -f -T`): all or nothing. `read` is `cat` with its output capped,
//!   `list` is `find -printf`, `remove` is `rm -rf`, `exists` is `test -e`.
//! - `exec_streaming` forwards each frame of output as the websocket delivers it.
//! - `exec_with_input` runs the command as `exec_streaming` does (the same wrapping, timeout,
//!   caps, streaming and guard) with the exec's stdin channel kept open: the request's `stdin`,
//!   then each piece from the receiver in order, written through kube's stdin writer (its
//!   buffer bounded: the next piece is taken only once the last is on its way). A close, or
//!   the sender dropped, shuts the writer, and kube sends the v5 protocol's close of the stdin
//!   channel, at which the kubelet closes the process's input (on a connection that
//!   negotiated only v4, which has no such close, kube closes the whole websocket instead, and
//!   output still to come may be lost). Once the command ended the receiver is dropped, so
//!   later sends fail.
//!
//! A pod found gone (404, deleted, finished) is [`OpError::SandboxGone`].
//!
//! ## Fleet mode: a stale process changes nothing
//!
//! The backend remembers the token it started or adopted each sandbox under (raised by every
//! command it admits later). A change (a write's rename, a removal, a command's start) of a
//! sandbox it holds under a token is checked twice, and refused with [`OpError::Fenced`]
//! (`SandboxWork` then fences the key in the keeper) when another process adopted it:
//!
//! 1. **At the API**, before its first step: one GET of the sandbox's object (the claim; the
//!    pod in pod mode) and its token annotation, which adoption raises before it reads or
//!    changes anything in the pod (`fence.rs`).
//! 2. **In the pod**, in the exec that makes the change: the step runs as `sh -c GUARD sh
//!    <workdir>/.sandkeeper/token <token> <argv>`, which compares the pod's token file and
//!    `exec`s the step only if the file holds no newer token (exit 86 and
//!    `sandkeeper-fenced: <newest>` otherwise). An adopter writes that file (raised only,
//!    replaced whole, refused when newer: `Cluster::raise_pod_token`) at the end of its
//!    adoption, before its first read or change, and so does a start that resumes a suspended
//!    claim (its workspace keeps the file). A process that passed the API check and paused
//!    before its exec is refused when the exec runs at last, however long the pause.
//!
//! Reads (`read`, `list`, `exists`) are not checked: they change nothing. Cost: one GET per
//! change and one exec per adoption (or resume), in fleet mode only; the guard rides in the
//! change's own exec. A single keeper's sandboxes carry no token: no check, no request, no
//! guard. The image needs a POSIX `sh` (any image with GNU coreutils has one).
//!
//! What remains:
//!
//! - The guard's read of the file and the step it `exec`s are two instants in the container
//!   (no lock: `flock` would be one more tool asked of the image, and locks on a network
//!   volume are unreliable). A step whose check read the old token just before the adopter's
//!   rename of the file still runs: microseconds of the container's own scheduling, against
//!   an adopter whose first read of the workspace comes a whole exec later.
//! - A command already running at the takeover is not stopped by it, and a command may write
//!   anywhere in the workspace, the token file too (`.sandkeeper/` is refused only to
//!   `write` and `remove`). A file removed or garbled holds no token, nor does one an
//!   adopter could not write (logged): the guard then passes and the API check alone fences,
//!   with its window (a pause between the GET and the exec).
//!   The application's commands can change the workspace anyway; they gain no power over it
//!   from the file, only over the fencing of their own key.
//! - A write's `mkdir -p` of the parent and its temporary copy come before the guarded rename
//!   (a refused write removes its temporary; a parent directory it made stays).
//! - The key's Lease is not read: a takeover raises it first (the fleet store's claim), but a
//!   change that passes before the adopter raises the object's annotation and the pod's file
//!   lands before the adopter's first look at the workspace, so the adopter continues from it
//!   as from anything its last owner did before the takeover.

use std::time::Duration;

use sandkeeper::{SandboxId, Token};
use sandkeeper_tokio::{
    ops::{ExecRequest, WorkPath},
    Chunk, Entry, EntryKind, EntryMeta, ExecOutput, Input, OpError, SandboxOps,
};

use crate::backend::K8sBackend;
use crate::error::K8sError;
use crate::fence::{pod_token_file, refused_newest, FENCED_EXIT, GUARD};
use crate::upload::{Captured, Stdin, EXEC_GRACE, KILLED_EXIT};

/// The `PATH` commands get.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The longest an exec may run when the request names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes of a listing.
const LIST_CAP: usize = 4 << 20;

/// One command to run in a pod.
struct Run<'a> {
    argv: Vec<String>,
    stdin: Vec<u8>,
    /// Pieces of standard input that follow `stdin` while the command runs, when it stays open
    /// (`exec_with_input`); otherwise its input is closed after `stdin`.
    input: Option<tokio::sync::mpsc::Receiver<Input>>,
    /// The most bytes kept of each output stream.
    cap: usize,
    timeout: Duration,
    /// Where output goes as it arrives, if anywhere.
    chunks: Option<&'a tokio::sync::mpsc::Sender<Chunk>>,
    /// Fleet mode: the token this process holds the sandbox under; the command runs under the
    /// pod's guard (`fence.rs` `GUARD`), which refuses it when the pod's token file is newer.
    guard: Option<Token>,
}

fn gone(sandbox: SandboxId, why: impl Into<String>) -> OpError {
    OpError::SandboxGone {
        sandbox,
        why: why.into(),
    }
}

impl K8sBackend {
    /// The pod of a sandbox this backend runs.
    fn pod_of(&self, sandbox: SandboxId) -> Result<String, OpError> {
        self.handle(sandbox)
            .map(|h| h.pod)
            .ok_or_else(|| gone(sandbox, "not running here"))
    }

    /// Fleet mode: refuses ([`OpError::Fenced`]) a change of `sandbox` once its object has
    /// seen a newer token than the one this process holds it under (another process adopted
    /// it), one GET of the object; right before the change's first step. Returns the token
    /// for the pod's guard. Without a token (a single keeper): nothing, no request.
    async fn fence(&self, sandbox: SandboxId) -> Result<Option<Token>, OpError> {
        let (handle, token) = self
            .running(sandbox)
            .ok_or_else(|| gone(sandbox, "not running here"))?;
        let Some(token) = token else {
            return Ok(None);
        };
        self.cluster()
            .check_token(&handle.object, token)
            .await
            .map(|()| Some(token))
            .map_err(|e| match e {
                K8sError::Fenced { .. } => OpError::Fenced {
                    sandbox,
                    why: e.to_string(),
                },
                e if e.is_gone() => gone(sandbox, e.to_string()),
                e => OpError::Backend {
                    what: "token check",
                    error: e.to_string(),
                },
            })
    }

    /// `workdir/path` (the working directory itself for the root).
    fn in_workdir(&self, path: &WorkPath) -> String {
        let workdir = &self.cluster().config().workdir;
        if path.is_root() {
            workdir.clone()
        } else {
            format!("{workdir}/{path}")
        }
    }

    /// Runs `run.argv` under `timeout -s KILL` in the pod, with a client deadline a little
    /// later.
    async fn run(&self, sandbox: SandboxId, pod: &str, run: Run<'_>) -> Result<Captured, OpError> {
        let Run {
            argv,
            stdin,
            input,
            cap,
            timeout,
            chunks,
            guard,
        } = run;
        let secs = timeout.as_secs().max(1);
        let mut timed = vec![
            "timeout".to_string(),
            "-s".into(),
            "KILL".into(),
            secs.to_string(),
        ];
        if let Some(Token(token)) = guard {
            let file = pod_token_file(&self.cluster().config().workdir);
            timed.extend(["sh", "-c", GUARD, "sh"].map(str::to_string));
            timed.extend([file, token.to_string()]);
        }
        timed.extend(argv);
        let stdin = Stdin {
            first: stdin,
            more: input,
        };
        let run = self.cluster().exec_fed(pod, timed, stdin, cap, cap, chunks);
        match tokio::time::timeout(Duration::from_secs(secs) + EXEC_GRACE, run).await {
            Err(_) => Err(OpError::Timeout { after: timeout }),
            Ok(Ok(c)) if c.code == KILLED_EXIT => Err(OpError::Timeout { after: timeout }),
            Ok(Ok(c)) => match (guard, refused_newest(&c.stderr)) {
                (Some(Token(token)), Some(newest)) if c.code == FENCED_EXIT => {
                    Err(OpError::Fenced {
                        sandbox,
                        why: format!(
                            "the pod's token file holds {newest}, newer than this process's {token}"
                        ),
                    })
                }
                _ => Ok(c),
            },
            Ok(Err(e)) => Err(self.op_error(sandbox, pod, e).await),
        }
    }

    /// An exec's failure as an operation's: a pod that is gone, or found gone on a fresh read
    /// when the failure says nothing clear, is the sandbox gone.
    async fn op_error(&self, sandbox: SandboxId, pod: &str, e: K8sError) -> OpError {
        if e.is_gone() {
            return gone(sandbox, e.to_string());
        }
        if matches!(
            e,
            K8sError::OutcomeUnknown { .. } | K8sError::Retryable { .. }
        ) {
            if let Err(g) = self.cluster().check_pod_alive(pod).await {
                if g.is_gone() {
                    return gone(sandbox, g.to_string());
                }
            }
        }
        OpError::Backend {
            what: "exec",
            error: e.to_string(),
        }
    }

    /// Runs a short step of a file operation (the upload timeout bounds it).
    async fn step(
        &self,
        sandbox: SandboxId,
        pod: &str,
        argv: &[&str],
        stdin: Vec<u8>,
        cap: usize,
    ) -> Result<Captured, OpError> {
        let argv = argv.iter().map(|s| s.to_string()).collect();
        let timeout = self.cluster().config().upload_timeout();
        let run = Run {
            argv,
            stdin,
            input: None,
            cap,
            timeout,
            chunks: None,
            guard: None,
        };
        self.run(sandbox, pod, run).await
    }

    /// A short step that changes the workspace: run under the pod's guard when this process
    /// holds the sandbox under a token (`guard`), so the pod itself refuses it once an
    /// adopter recorded a newer token there.
    async fn change(
        &self,
        sandbox: SandboxId,
        pod: &str,
        argv: &[&str],
        guard: Option<Token>,
    ) -> Result<Captured, OpError> {
        let run = Run {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: Vec::new(),
            input: None,
            // Room for the guard's refusal on standard error.
            cap: 4 << 10,
            timeout: self.cluster().config().upload_timeout(),
            chunks: None,
            guard,
        };
        self.run(sandbox, pod, run).await
    }

    /// Resolves `path` in the container and refuses it when it leads out of the working
    /// directory. Returns its absolute name.
    async fn confined(
        &self,
        sandbox: SandboxId,
        pod: &str,
        path: &WorkPath,
    ) -> Result<String, OpError> {
        let workdir = self.cluster().config().workdir.clone();
        let full = self.in_workdir(path);
        let out = self
            .step(
                sandbox,
                pod,
                &["realpath", "-m", "--", &workdir, &full],
                Vec::new(),
                16 << 10,
            )
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let (Some(base), Some(resolved)) = (lines.next(), lines.next()) else {
            return Err(OpError::Backend {
                what: "realpath",
                error: format!(
                    "exit {}: {}",
                    out.code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        };
        if out.code != 0 || !(resolved == base || resolved.starts_with(&format!("{base}/"))) {
            return Err(OpError::Escapes {
                path: path.to_string(),
            });
        }
        Ok(full)
    }

    /// Whether something exists at an absolute path in the pod.
    async fn test_exists(
        &self,
        sandbox: SandboxId,
        pod: &str,
        full: &str,
    ) -> Result<bool, OpError> {
        let out = self
            .step(sandbox, pod, &["test", "-e", full], Vec::new(), 0)
            .await?;
        Ok(out.code == 0)
    }
}

impl K8sBackend {
    /// An exec, streaming its output to `chunks` when given, its standard input kept open and
    /// fed from `input` when given.
    async fn exec_with(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: Option<&tokio::sync::mpsc::Sender<Chunk>>,
        input: Option<tokio::sync::mpsc::Receiver<Input>>,
    ) -> Result<ExecOutput, OpError> {
        let program = request.check()?.to_string();
        let ExecRequest { argv, options } = request;
        if program.contains('=') {
            // `env` would take it for a variable.
            return Err(OpError::Spawn {
                program,
                error: "a program name may not hold '='".into(),
            });
        }
        let pod = self.pod_of(sandbox)?;
        let dir = self.confined(sandbox, &pod, &options.cwd).await?;
        let home = format!("HOME={}", self.cluster().config().workdir);
        let mut full: Vec<String> = ["env", "-i", "-C", &dir, PATH, &home, "LANG=C.UTF-8"]
            .into_iter()
            .map(str::to_string)
            .collect();
        full.push(format!("SANDKEEPER_SANDBOX={sandbox}"));
        full.extend(options.env.iter().map(|(k, v)| format!("{k}={v}")));
        full.extend(argv);
        let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let guard = self.fence(sandbox).await?;
        let out = self
            .run(
                sandbox,
                &pod,
                Run {
                    argv: full,
                    stdin: options.stdin,
                    input,
                    cap: options.output_cap,
                    timeout,
                    chunks,
                    guard,
                },
            )
            .await?;
        // `env` answers 127 (not found) or 126 (not executable) for the program itself.
        if matches!(out.code, 126 | 127) && String::from_utf8_lossy(&out.stderr).starts_with("env:")
        {
            return Err(OpError::Spawn {
                program,
                error: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(ExecOutput {
            code: Some(out.code),
            stdout: out.stdout,
            stderr: out.stderr,
            truncated: out.truncated,
        })
    }
}

impl SandboxOps for K8sBackend {
    async fn exec(&self, sandbox: SandboxId, request: ExecRequest) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, None, None).await
    }

    async fn exec_streaming(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
    ) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, Some(&chunks), None).await
    }

    async fn exec_with_input(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
        input: tokio::sync::mpsc::Receiver<Input>,
    ) -> Result<ExecOutput, OpError> {
        self.exec_with(sandbox, request, Some(&chunks), Some(input))
            .await
    }

    async fn write(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        bytes: Vec<u8>,
    ) -> Result<(), OpError> {
        path.writable()?;
        let pod = self.pod_of(sandbox)?;
        let full = self.confined(sandbox, &pod, &path).await?;
        let (parent, _) = full.rsplit_once('/').expect("under the workdir");
        let tmp = format!("{parent}/{}", temporary_name());
        // The rename is the change others see: it runs under the pod's guard.
        let steps: [(&[&str], Vec<u8>, bool); 3] = [
            (&["mkdir", "-p", "--", parent], Vec::new(), false),
            (&["cp", "--", "/dev/stdin", &tmp], bytes, false),
            (&["mv", "-f", "-T", "--", &tmp, &full], Vec::new(), true),
        ];
        let guard = self.fence(sandbox).await?;
        let drop_argv = ["rm", "-f", "--", tmp.as_str()];
        let drop_tmp = || self.step(sandbox, &pod, &drop_argv, Vec::new(), 0);
        for (argv, stdin, changes) in steps {
            let out = if changes {
                self.change(sandbox, &pod, argv, guard).await
            } else {
                self.step(sandbox, &pod, argv, stdin, 0).await
            };
            let out = match out {
                Err(e @ OpError::Fenced { .. }) => {
                    let _ = drop_tmp().await;
                    return Err(e);
                }
                out => out?,
            };
            if out.code != 0 {
                let _ = drop_tmp().await;
                return Err(OpError::Backend {
                    what: "write",
                    error: format!(
                        "{} exit {}: {}",
                        argv[0],
                        out.code,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
        }
        Ok(())
    }

    async fn read(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        cap: usize,
    ) -> Result<Vec<u8>, OpError> {
        let pod = self.pod_of(sandbox)?;
        let full = self.confined(sandbox, &pod, &path).await?;
        let out = self
            .step(sandbox, &pod, &["cat", "--", &full], Vec::new(), cap)
            .await?;
        if out.code != 0 {
            if !self.test_exists(sandbox, &pod, &full).await? {
                return Err(OpError::NotFound {
                    path: path.to_string(),
                });
            }
            return Err(OpError::Backend {
                what: "read",
                error: format!(
                    "cat exit {}: {}",
                    out.code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        if out.truncated {
            return Err(OpError::TooLarge {
                path: path.to_string(),
                cap,
            });
        }
        Ok(out.stdout)
    }

    async fn list(&self, sandbox: SandboxId, dir: WorkPath) -> Result<Vec<Entry>, OpError> {
        let pod = self.pod_of(sandbox)?;
        let full = self.confined(sandbox, &pod, &dir).await?;
        let out = self
            .step(
                sandbox,
                &pod,
                &[
                    "find",
                    &full,
                    "-mindepth",
                    "1",
                    "-maxdepth",
                    "1",
                    "-printf",
                    // Kind, size, mode bits (octal), mtime (Unix seconds), uid, gid, then the
                    // name, and the link's target (empty for anything else) as a record of
                    // its own: names and targets may hold spaces, never a NUL.
                    "%y %s %m %T@ %U %G %f\\0%l\\0",
                ],
                Vec::new(),
                LIST_CAP,
            )
            .await?;
        if out.code != 0 {
            if !self.test_exists(sandbox, &pod, &full).await? {
                return Err(OpError::NotFound {
                    path: dir.to_string(),
                });
            }
            return Err(OpError::Backend {
                what: "list",
                error: format!(
                    "find exit {}: {}",
                    out.code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let mut entries = Vec::new();
        let mut records = out.stdout.split(|b| *b == 0);
        while let (Some(record), Some(link)) = (records.next(), records.next()) {
            if let Some(entry) = listed_entry(&String::from_utf8_lossy(record), link) {
                entries.push(entry);
            }
        }
        entries.sort();
        Ok(entries)
    }

    async fn remove(&self, sandbox: SandboxId, path: WorkPath) -> Result<(), OpError> {
        path.writable()?;
        let pod = self.pod_of(sandbox)?;
        let full = self.confined(sandbox, &pod, &path).await?;
        if !self.test_exists(sandbox, &pod, &full).await? {
            return Err(OpError::NotFound {
                path: path.to_string(),
            });
        }
        let guard = self.fence(sandbox).await?;
        let out = self
            .change(sandbox, &pod, &["rm", "-rf", "--", &full], guard)
            .await?;
        if out.code != 0 {
            return Err(OpError::Backend {
                what: "remove",
                error: format!(
                    "rm exit {}: {}",
                    out.code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    async fn exists(&self, sandbox: SandboxId, path: WorkPath) -> Result<bool, OpError> {
        let pod = self.pod_of(sandbox)?;
        let full = self.confined(sandbox, &pod, &path).await?;
        self.test_exists(sandbox, &pod, &full).await
    }
}

/// A temporary's name for a write: `.sk-` and 16 hex digits, short enough that a target name of
/// the longest a file system takes (255 bytes) still has its temporary beside it, and distinct
/// between writes of this process (a counter) and across processes (a key the standard library
/// draws from the operating system's randomness once per process).
fn temporary_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = KEY.get_or_init(Default::default).build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    format!(".sk-{:016x}", h.finish())
}

/// One entry of `list`'s `find -printf` output: `<kind> <size> <mode> <mtime> <uid> <gid>
/// <name>` and the link's target (empty when none); `None` for a record that is not one.
fn listed_entry(record: &str, link: &[u8]) -> Option<Entry> {
    let mut parts = record.splitn(7, ' ');
    let kind = match parts.next()? {
        "f" => EntryKind::File,
        "d" => EntryKind::Dir,
        "l" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let size = parts.next()?.parse().unwrap_or(0);
    let mode = u32::from_str_radix(parts.next()?, 8).ok();
    let modified = parts.next()?.parse::<f64>().ok().and_then(|secs| {
        (secs.is_finite() && secs >= 0.0)
            .then(|| std::time::UNIX_EPOCH.checked_add(Duration::from_secs_f64(secs)))
            .flatten()
    });
    let uid = parts.next()?.parse().ok();
    let gid = parts.next()?.parse().ok();
    let name = parts.next()?.to_string();
    let link_target =
        (kind == EntryKind::Symlink).then(|| String::from_utf8_lossy(link).into_owned());
    Some(Entry {
        name,
        kind,
        size,
        meta: EntryMeta {
            mode,
            modified,
            uid,
            gid,
            link_target,
        },
    })
}

#[cfg(test)]
mod listed_entry_tests {
    use super::*;

    /// `find -printf` records read back, and records that are not ones skipped, never a panic.
    #[test]
    fn find_records_are_read_and_bad_ones_skipped() {
        let e = listed_entry("f 4 640 1700000000.5 1000 1001 a file.txt", b"").unwrap();
        assert_eq!(
            (e.name.as_str(), e.kind, e.size),
            ("a file.txt", EntryKind::File, 4)
        );
        assert_eq!(e.meta.mode, Some(0o640));
        assert_eq!((e.meta.uid, e.meta.gid), (Some(1000), Some(1001)));
        assert_eq!(
            e.meta.modified,
            Some(std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_500))
        );
        let l = listed_entry("l 5 777 1.0 0 0 link", b"/etc/passwd").unwrap();
        assert_eq!(l.meta.link_target.as_deref(), Some("/etc/passwd"));
        let d = listed_entry("d 4096 755 nan x y dir", b"ignored").unwrap();
        assert_eq!(
            (d.meta.modified, d.meta.uid, d.meta.link_target),
            (None, None, None)
        );
        for bad in ["", "f", "f 4 644 1 0 0", "f 4 644 -5 0"] {
            assert!(
                listed_entry(bad, b"").is_none() || bad == "f 4 644 -5 0",
                "{bad:?}"
            );
        }
    }
}
