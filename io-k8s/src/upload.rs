//! Uploads into a pod through `pods/exec`, all or nothing for each file: first
//! `timeout -s KILL <secs> tar -x -C <workdir>` with a tar stream on stdin whose entries are
//! temporary names beside the final ones (`<session>/.<name>.sandkeeper-<tag>`), then
//! `timeout -s KILL <secs> mv -f -T -- <tmp> <final>` per file, a rename in one directory, so a
//! reader sees the previous version or the new one, never half of one. No shell: every path is
//! built from validated one-component names. On failure the temporaries are removed (best
//! effort, `rm -f --`, unless the pod is gone).
//!
//! Each exec: stdin written and closed, stdout and stderr drained, and the status frame read;
//! a connection that ends first ends the exec at once. No status frame means the outcome is
//! unknown — an error, never success. Each command runs under an
//! in-container `timeout -s KILL <secs>`, and the client waits [`EXEC_GRACE`] longer than that:
//! a command that runs too long is killed in the container first and reported by its status
//! frame, so the cleanup that follows never races a `tar` still writing its temporary. The
//! client deadline ends only an exec whose connection itself hangs.

use futures_util::FutureExt;
use kube::api::AttachParams;
use sandkeeper::{PathName, SessionId};
use sandkeeper_tokio::Input;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::cluster::{calls, err, Cluster};
use crate::container::exec_container;
use crate::error::K8sError;

/// Most stderr kept for an error message.
const STDERR_KEPT: usize = 4096;

/// How much longer than the in-container `timeout` the client waits for an exec's status.
pub const EXEC_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The exit code of a command killed by SIGKILL (128 + 9): how `timeout -s KILL` ends one that
/// ran too long (and how the kernel ends one over the container's memory limit). Reported as
/// [`K8sError::Timeout`], which is worth a retry, not as a failed command.
pub const KILLED_EXIT: i32 = 137;

/// Reads what `r` has (0 at its end, on an error, or when there is no such stream).
pub(crate) async fn read_some<R: AsyncRead + Unpin>(r: &mut Option<R>, buf: &mut [u8]) -> usize {
    match r.as_mut() {
        Some(r) => r.read(buf).await.unwrap_or(0),
        None => 0,
    }
}

/// One file of an upload.
#[derive(Debug, Clone, Copy)]
pub struct UploadFile<'a> {
    /// The session whose directory it goes in.
    pub session: &'a SessionId,
    /// Its name in that directory.
    pub path: &'a PathName,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// The temporary name a file is extracted under before it is renamed over `path`:
/// `.<path>.sandkeeper-<tag>`, in the same directory (so the rename is atomic).
pub fn temp_name(path: &PathName, tag: &str) -> String {
    format!(".{}.sandkeeper-{tag}", path.as_str())
}

/// A tar archive of `files` laid out as `<session>/<temporary name>` ([`temp_name`]), regular
/// files, mode 0644, mtime 0.
pub fn archive(files: &[UploadFile<'_>], tag: &str) -> Result<Vec<u8>, K8sError> {
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(f.bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        let path = format!("{}/{}", f.session.as_str(), temp_name(f.path, tag));
        b.append_data(&mut h, &path, f.bytes)
            .map_err(|e| K8sError::Archive(e.to_string()))?;
    }
    b.into_inner().map_err(|e| K8sError::Archive(e.to_string()))
}

pub(crate) fn timed(timeout_secs: u64, command: &[&str]) -> Vec<String> {
    let secs = timeout_secs.to_string();
    ["timeout", "-s", "KILL", secs.as_str()]
        .into_iter()
        .chain(command.iter().copied())
        .map(str::to_string)
        .collect()
}

/// The argv that renames a file's temporary over its final name (`-T`: never into a
/// directory of that name).
pub fn rename_argv(workdir: &str, timeout_secs: u64, f: &UploadFile<'_>, tag: &str) -> Vec<String> {
    let dir = format!("{workdir}/{}", f.session.as_str());
    let tmp = format!("{dir}/{}", temp_name(f.path, tag));
    let dest = format!("{dir}/{}", f.path.as_str());
    timed(timeout_secs, &["mv", "-f", "-T", "--", &tmp, &dest])
}

/// The argv that removes the temporaries of a failed upload.
pub fn cleanup_argv(
    workdir: &str,
    timeout_secs: u64,
    files: &[UploadFile<'_>],
    tag: &str,
) -> Vec<String> {
    let tmps: Vec<String> = files
        .iter()
        .map(|f| {
            format!(
                "{workdir}/{}/{}",
                f.session.as_str(),
                temp_name(f.path, tag)
            )
        })
        .collect();
    let mut argv: Vec<&str> = vec!["rm", "-f", "--"];
    argv.extend(tmps.iter().map(String::as_str));
    timed(timeout_secs, &argv)
}

/// The failure of an upload into an instance whose pod name now belongs to another instance.
fn replaced(pod: &str, was: &str, now: &str) -> K8sError {
    K8sError::Gone {
        what: format!("pod {pod}"),
        message: format!("the instance (uid {was}) was replaced by another (uid {now})"),
    }
}

/// The argv of an upload's extraction.
pub fn upload_argv(workdir: &str, timeout_secs: u64) -> Vec<String> {
    [
        "timeout",
        "-s",
        "KILL",
        &timeout_secs.to_string(),
        "tar",
        "-x",
        "-C",
        workdir,
    ]
    .into_iter()
    .map(str::to_string)
    .collect()
}

impl Cluster {
    /// Writes files into `pod` under the workdir. A failure whose cause is unclear (no status
    /// frame, a refused upgrade, a transport error) is followed by a fresh read of the pod: a
    /// pod that is absent or finished makes it [`K8sError::Gone`].
    ///
    /// Exec reaches a pod by name, and a controller recreates a deleted pod under the same
    /// name: an upload that must land in one instance goes through [`Cluster::upload_into`].
    pub async fn upload(&self, pod: &str, files: &[UploadFile<'_>]) -> Result<(), K8sError> {
        self.upload_checked(pod, None, files).await
    }

    /// [`Cluster::upload`] into the instance of `pod` whose UID is `uid`, and no other. After
    /// the upload (or its failure) the pod is read again: when its UID is still `uid` that
    /// object existed from before the first exec until after the last one (a deleted object
    /// never comes back, and a name belongs to one object at a time), so every exec ran in it;
    /// otherwise the instance is gone, whatever the execs answered, and so is the upload
    /// ([`K8sError::Gone`], naming both UIDs). One extra read per upload is the price.
    pub async fn upload_into(
        &self,
        pod: &str,
        uid: &str,
        files: &[UploadFile<'_>],
    ) -> Result<(), K8sError> {
        self.upload_checked(pod, Some(uid), files).await
    }

    async fn upload_checked(
        &self,
        pod: &str,
        uid: Option<&str>,
        files: &[UploadFile<'_>],
    ) -> Result<(), K8sError> {
        let size: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
        if size > self.config.max_payload_bytes {
            return Err(K8sError::TooLarge {
                size,
                limit: self.config.max_payload_bytes,
            });
        }
        // Unique per upload: concurrent uploads of one file never share a temporary.
        let tag = format!("{:016x}", fastrand::u64(..));
        let tar = archive(files, &tag)?;
        let (workdir, secs) = (&self.config.workdir, self.config.upload_timeout_secs);
        let mut result = self
            .exec_within(pod, upload_argv(workdir, secs), tar, "upload")
            .await;
        if result.is_ok() {
            for f in files {
                result = self
                    .exec_within(
                        pod,
                        rename_argv(workdir, secs, f, &tag),
                        Vec::new(),
                        "rename",
                    )
                    .await;
                if result.is_err() {
                    break;
                }
            }
        }
        let e = match (result, uid) {
            (Ok(()), None) => return Ok(()),
            (Ok(()), Some(uid)) => {
                return match self.check_pod_alive(pod).await {
                    Ok(now) if now == uid => Ok(()),
                    Ok(now) => Err(replaced(pod, uid, &now)),
                    Err(e) => Err(e),
                }
            }
            (Err(e), _) => e,
        };
        if !e.is_gone() {
            let rm = cleanup_argv(workdir, secs, files, &tag);
            if let Err(c) = self.exec_within(pod, rm, Vec::new(), "cleanup").await {
                tracing::warn!(error = %c, %pod, "removing the temporaries of a failed upload");
            }
        }
        match e {
            K8sError::CommandFailed { .. }
            | K8sError::Forbidden { .. }
            | K8sError::TooLarge { .. } => Err(e),
            e => match (self.check_pod_alive(pod).await, uid) {
                (Err(gone), _) if gone.is_gone() => Err(gone),
                (Ok(now), Some(uid)) if uid != now => Err(replaced(pod, uid, &now)),
                _ => Err(e),
            },
        }
    }

    /// [`Cluster::exec_with_stdin`] under the client deadline: the in-container `timeout` plus
    /// [`EXEC_GRACE`].
    async fn exec_within(
        &self,
        pod: &str,
        argv: Vec<String>,
        stdin: Vec<u8>,
        step: &str,
    ) -> Result<(), K8sError> {
        let in_container = self.config.upload_timeout();
        let timeout = in_container + EXEC_GRACE;
        match tokio::time::timeout(timeout, self.exec_with_stdin(pod, argv, stdin)).await {
            Ok(Err(K8sError::CommandFailed {
                code: KILLED_EXIT, ..
            })) => Err(K8sError::Timeout {
                what: format!("{step} in pod {pod} (killed in the container, exit {KILLED_EXIT})"),
                after: in_container,
            }),
            Ok(r) => r,
            Err(_) => Err(K8sError::Timeout {
                what: format!("{step} in pod {pod}"),
                after: timeout,
            }),
        }
    }

    /// The error of an exec the server refused. A 400 that the API server's container rule
    /// ([`exec_container`]) explains (the pod, read once, has several containers and none is
    /// named, or the named one is not in it) keeps the server's message and says what to set.
    /// kube-rs passes the server's `Status` on; where a 400 comes without one (a proxy in
    /// between), the message is worded from the pod by the same rule.
    pub(crate) async fn exec_refused(&self, pod: &str, e: kube::Error) -> K8sError {
        use kube::client::UpgradeConnectionError::ProtocolSwitch;
        let what = format!("pod {pod}");
        let code = match &e {
            kube::Error::Api(status) => status.code,
            kube::Error::UpgradeConnection(ProtocolSwitch(code)) => code.as_u16(),
            _ => 0,
        };
        if code == 400 {
            if let Ok(p) = self.pods().get(pod).await {
                let asked = self.config.container.as_deref();
                if let Some(Err(rule)) = p.spec.as_ref().map(|s| exec_container(s, pod, asked)) {
                    let message = match &e {
                        kube::Error::Api(status) => status.message.clone(),
                        _ => format!("{rule} (worded from the pod by the API server's rule)"),
                    };
                    return K8sError::Invalid {
                        code,
                        reason: "BadRequest".into(),
                        message: format!(
                            "{message}; set `container` in the io-k8s config to the container uploads go to"
                        ),
                    };
                }
            }
        }
        err(e, calls::EXEC, &what)
    }

    /// Runs `argv` in the pod with `stdin` as its input; `Ok` only on a `Success` status frame.
    pub async fn exec_with_stdin(
        &self,
        pod: &str,
        argv: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<(), K8sError> {
        let out = self
            .exec_capture(pod, argv, stdin, 0, STDERR_KEPT, None)
            .await?;
        if out.code == 0 {
            return Ok(());
        }
        Err(K8sError::CommandFailed {
            pod: pod.to_string(),
            code: out.code,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs `argv` in the pod with `stdin` as its input and keeps up to `out_cap` bytes of its
    /// standard output and `err_cap` of its standard error (the rest is read and dropped). A
    /// command that ran to its end is `Ok` whatever its exit code; no status frame is
    /// [`K8sError::OutcomeUnknown`], a failure without an exit code [`K8sError::Invalid`].
    /// With `chunks`, every piece of output is also sent there as it arrives (uncapped).
    pub async fn exec_capture(
        &self,
        pod: &str,
        argv: Vec<String>,
        stdin: Vec<u8>,
        out_cap: usize,
        err_cap: usize,
        chunks: Option<&tokio::sync::mpsc::Sender<sandkeeper_tokio::Chunk>>,
    ) -> Result<Captured, K8sError> {
        let stdin = Stdin {
            first: stdin,
            more: None,
        };
        self.exec_fed(pod, argv, stdin, out_cap, err_cap, chunks)
            .await
    }

    /// [`Cluster::exec_capture`] with a standard input that may stay open while the command
    /// runs ([`Stdin`]).
    pub(crate) async fn exec_fed(
        &self,
        pod: &str,
        argv: Vec<String>,
        stdin: Stdin,
        out_cap: usize,
        err_cap: usize,
        chunks: Option<&tokio::sync::mpsc::Sender<sandkeeper_tokio::Chunk>>,
    ) -> Result<Captured, K8sError> {
        use sandkeeper_tokio::Chunk;
        let forward = |chunk: Chunk| async move {
            if let Some(tx) = chunks {
                let _ = tx.send(chunk).await;
            }
        };
        let mut ap = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true);
        if let Some(c) = &self.config.container {
            ap = ap.container(c.clone());
        }
        ap.max_stdin_buf_size = Some(64 * 1024);
        let mut proc = match self.pods().exec(pod, argv, &ap).await {
            Ok(proc) => proc,
            Err(e) => return Err(self.exec_refused(pod, e).await),
        };
        let status = proc.take_status();
        let input = proc.stdin();
        let mut out = proc.stdout();
        let mut errs = proc.stderr();
        let write = feed(input, stdin);
        let status = async {
            match status {
                Some(s) => s.await,
                None => None,
            }
        };
        // The input is written while the output is read, until the status is in or known never
        // to come (kube's message loop has ended). Neither the write nor the end of the output
        // is waited for after that: a loop that ended on a broken connection neither reads the
        // rest of the input nor marks the end of the output, so either wait could last for ever.
        // What the command wrote before its status is already buffered and is still read. An
        // input fed while the command runs is dropped with the write when this returns: the
        // sender's sends fail from then on.
        tokio::pin!(write, status);
        let (mut written, mut out_open, mut err_open) = (false, out.is_some(), errs.is_some());
        let (mut out_buf, mut err_buf) = ([0u8; 4096], [0u8; 4096]);
        let mut captured = Captured::default();
        let status = loop {
            tokio::select! {
                () = &mut write, if !written => written = true,
                n = read_some(&mut out, &mut out_buf), if out_open => {
                    out_open = n > 0;
                    captured.truncated |= keep(&mut captured.stdout, &out_buf[..n], out_cap);
                    if n > 0 {
                        forward(Chunk::Stdout(out_buf[..n].to_vec())).await;
                    }
                }
                n = read_some(&mut errs, &mut err_buf), if err_open => {
                    err_open = n > 0;
                    captured.truncated |= keep(&mut captured.stderr, &err_buf[..n], err_cap);
                    if n > 0 {
                        forward(Chunk::Stderr(err_buf[..n].to_vec())).await;
                    }
                }
                s = &mut status => break s,
            }
        };
        while out_open {
            match read_some(&mut out, &mut out_buf).now_or_never() {
                Some(n) if n > 0 => {
                    captured.truncated |= keep(&mut captured.stdout, &out_buf[..n], out_cap);
                    forward(Chunk::Stdout(out_buf[..n].to_vec())).await;
                }
                _ => out_open = false,
            }
        }
        while err_open {
            match read_some(&mut errs, &mut err_buf).now_or_never() {
                Some(n) if n > 0 => {
                    captured.truncated |= keep(&mut captured.stderr, &err_buf[..n], err_cap);
                    forward(Chunk::Stderr(err_buf[..n].to_vec())).await;
                }
                _ => err_open = false,
            }
        }
        drop(proc);
        outcome(pod, status, captured)
    }
}

/// What an exec's status frame says: the command ran to its end (`Ok`, its exit code in
/// `captured`, whatever it is); no frame is [`K8sError::OutcomeUnknown`]; a failure without
/// an exit code is [`K8sError::Invalid`].
pub(crate) fn outcome(
    pod: &str,
    status: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
    captured: Captured,
) -> Result<Captured, K8sError> {
    match status {
        None => Err(K8sError::OutcomeUnknown {
            pod: pod.to_string(),
        }),
        Some(s) if s.status.as_deref() == Some("Success") => Ok(captured),
        Some(s) => {
            let code = s
                .details
                .as_ref()
                .and_then(|d| d.causes.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
                .and_then(|c| c.message.as_deref())
                .and_then(|m| m.parse::<i32>().ok());
            match code {
                Some(code) => Ok(Captured { code, ..captured }),
                None => Err(K8sError::Invalid {
                    code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(500),
                    reason: s.reason.unwrap_or_default(),
                    message: format!(
                        "{} {}",
                        s.message.unwrap_or_default(),
                        String::from_utf8_lossy(&captured.stderr)
                    ),
                }),
            }
        }
    }
}

/// An exec's standard input: `first`, then, when `more` is given, each piece from it in order
/// until [`Input::Close`] or its sender is gone (a command fed while it runs:
/// `exec_with_input` in `work.rs`); then it is closed.
pub(crate) struct Stdin {
    /// Written first (all of it, when there is no `more`).
    pub first: Vec<u8>,
    /// The pieces that follow, as they come.
    pub more: Option<tokio::sync::mpsc::Receiver<Input>>,
}

/// Writes an exec's standard input to kube's stdin writer, then shuts the writer, which makes
/// kube send the end of the stdin channel (the v5 protocol's close of channel 0; the kubelet
/// closes the process's input at it). Bounded: the writer's buffer is `max_stdin_buf_size`
/// bytes, and a write waits there until kube's message loop has sent what came before on the
/// websocket, so the next piece is taken from `more` only then (a full channel holds its
/// sender back). A failed write (kube's loop is gone) ends the writing, not the taking:
/// pieces sent later are taken and dropped, and so are pieces sent after the close, until the
/// sender is gone or the exec ended (which drops this future, and the receiver with it).
async fn feed<W: AsyncWrite + Unpin>(writer: Option<W>, stdin: Stdin) {
    let Stdin { first, mut more } = stdin;
    let mut writer = write_on(writer, &first).await;
    if let Some(more) = more.as_mut() {
        while let Some(Input::Stdin(bytes)) = more.recv().await {
            writer = write_on(writer, &bytes).await;
        }
    }
    if let Some(mut w) = writer {
        let _ = w.shutdown().await;
    }
    if let Some(mut more) = more {
        while more.recv().await.is_some() {}
    }
}

/// Writes `bytes` on `writer`; answers it back, or nothing once a write failed (the command's
/// input is gone; its status says why it ended).
async fn write_on<W: AsyncWrite + Unpin>(writer: Option<W>, bytes: &[u8]) -> Option<W> {
    let mut w = writer?;
    w.write_all(bytes).await.ok().map(|()| w)
}

/// What a command that ran to its end left ([`Cluster::exec_capture`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// Its exit code (0: the `Success` status).
    pub code: i32,
    /// Standard output, up to its cap.
    pub stdout: Vec<u8>,
    /// Standard error, up to its cap.
    pub stderr: Vec<u8>,
    /// Whether either was cut.
    pub truncated: bool,
}

/// Keeps `bytes` in `kept` up to `cap`; whether any were dropped.
pub(crate) fn keep(kept: &mut Vec<u8>, bytes: &[u8], cap: usize) -> bool {
    let room = cap.saturating_sub(kept.len());
    kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_lays_files_out_as_temporaries_renamed_over_the_final_names() {
        let (s, p) = (
            SessionId::new("s-1").unwrap(),
            PathName::new("log.jsonl").unwrap(),
        );
        let f = UploadFile {
            session: &s,
            path: &p,
            bytes: b"{}\n",
        };
        let tar = archive(&[f], "00ff").unwrap();
        let mut a = tar::Archive::new(&tar[..]);
        let entries: Vec<_> = a
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().display().to_string();
                let mut body = String::new();
                std::io::Read::read_to_string(&mut e, &mut body).unwrap();
                (path, body)
            })
            .collect();
        assert_eq!(
            entries,
            vec![(
                "s-1/.log.jsonl.sandkeeper-00ff".to_string(),
                "{}\n".to_string()
            )]
        );
        assert_eq!(
            rename_argv("/workspace", 30, &f, "00ff"),
            [
                "timeout",
                "-s",
                "KILL",
                "30",
                "mv",
                "-f",
                "-T",
                "--",
                "/workspace/s-1/.log.jsonl.sandkeeper-00ff",
                "/workspace/s-1/log.jsonl"
            ]
        );
        assert_eq!(
            cleanup_argv("/workspace", 30, &[f], "00ff"),
            [
                "timeout",
                "-s",
                "KILL",
                "30",
                "rm",
                "-f",
                "--",
                "/workspace/s-1/.log.jsonl.sandkeeper-00ff"
            ]
        );
        assert_eq!(
            upload_argv("/workspace", 30),
            [
                "timeout",
                "-s",
                "KILL",
                "30",
                "tar",
                "-x",
                "-C",
                "/workspace"
            ]
        );
    }
}
