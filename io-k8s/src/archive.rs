//! A pod's workspace as a tar stream, out of the pod and into a new one, through `pods/exec`:
//! how pod mode suspends through a shelf (`shelf.rs`). Argv only, no shell:
//!
//! - out: `timeout -s KILL <secs> tar -c -f - -C <workdir> .`, its standard output handed on
//!   chunk by chunk as the websocket delivers it (the shelf repacks it: the tar is made by
//!   whatever the sandbox left in its pod, so it is hostile input there, never unpacked on
//!   this host);
//! - in: `timeout -s KILL <secs> tar -x --no-same-owner -f - -C <workdir>`, its standard input
//!   fed chunk by chunk (the files belong to the container's user, as the ones it made).
//!
//! Either is `Ok` only on the command's `Success` status frame: the end of the output alone
//! never says the tar is whole (a connection cut between two entries ends it too). The
//! in-container `timeout` is [`K8sConfig::archive_timeout_secs`](crate::K8sConfig); the
//! client waits [`EXEC_GRACE`] longer.

use bytes::Bytes;
use kube::api::AttachParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::cluster::Cluster;
use crate::error::K8sError;
use crate::upload::{keep, outcome, read_some, timed, Captured, EXEC_GRACE, KILLED_EXIT};

/// Most stderr kept for an error message.
const STDERR_KEPT: usize = 4096;

/// The size of the reads of a pod's standard output.
const READ: usize = 64 << 10;

/// The two ends a streamed exec may have.
struct Streams {
    stdin: Option<mpsc::Receiver<Bytes>>,
    stdout: Option<mpsc::Sender<Bytes>>,
}

impl Cluster {
    /// Streams the workspace of `pod` as a tar into `to`. `Ok` once the pod's `tar` ended with
    /// success and every chunk was taken.
    pub(crate) async fn workspace_out(
        &self,
        pod: &str,
        to: mpsc::Sender<Bytes>,
    ) -> Result<(), K8sError> {
        let secs = self.config.archive_timeout_secs;
        let workdir = self.config.workdir.as_str();
        let argv = timed(secs, &["tar", "-c", "-f", "-", "-C", workdir, "."]);
        let streams = Streams {
            stdin: None,
            stdout: Some(to),
        };
        self.exec_streamed(pod, argv, streams, "archiving the workspace")
            .await
    }

    /// Extracts the tar `from` gives into the workspace of `pod`. `Ok` once every chunk went
    /// in and the pod's `tar` ended with success; the caller says whether the chunks were the
    /// whole archive.
    pub(crate) async fn workspace_in(
        &self,
        pod: &str,
        from: mpsc::Receiver<Bytes>,
    ) -> Result<(), K8sError> {
        let secs = self.config.archive_timeout_secs;
        let workdir = self.config.workdir.as_str();
        let argv = timed(
            secs,
            &["tar", "-x", "--no-same-owner", "-f", "-", "-C", workdir],
        );
        let streams = Streams {
            stdin: Some(from),
            stdout: None,
        };
        self.exec_streamed(pod, argv, streams, "restoring the workspace")
            .await
    }

    /// [`exec_streams`](Self::exec_streams) under the client deadline, its exit code as an
    /// error when not 0.
    async fn exec_streamed(
        &self,
        pod: &str,
        argv: Vec<String>,
        streams: Streams,
        step: &str,
    ) -> Result<(), K8sError> {
        let in_container = std::time::Duration::from_secs(self.config.archive_timeout_secs);
        let deadline = in_container + EXEC_GRACE;
        let ran = tokio::time::timeout(deadline, self.exec_streams(pod, argv, streams)).await;
        match ran {
            Ok(Ok(c)) if c.code == 0 => Ok(()),
            Ok(Ok(c)) if c.code == KILLED_EXIT => Err(K8sError::Timeout {
                what: format!("{step} in pod {pod} (killed in the container, exit {KILLED_EXIT})"),
                after: in_container,
            }),
            Ok(Ok(c)) => Err(K8sError::CommandFailed {
                pod: pod.to_string(),
                code: c.code,
                stderr: String::from_utf8_lossy(&c.stderr).into_owned(),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(K8sError::Timeout {
                what: format!("{step} in pod {pod}"),
                after: deadline,
            }),
        }
    }

    /// Runs `argv` in the pod, feeding its input from `streams.stdin` (closed at the
    /// channel's end) and handing its output to `streams.stdout`, keeping some of its standard
    /// error. A receiver of the output that stops taking it ends the exec: the command's
    /// outcome no longer matters, and the error says so.
    async fn exec_streams(
        &self,
        pod: &str,
        argv: Vec<String>,
        streams: Streams,
    ) -> Result<Captured, K8sError> {
        let Streams { stdin, stdout } = streams;
        let mut ap = AttachParams::default()
            .stdin(stdin.is_some())
            .stdout(true)
            .stderr(true);
        if let Some(c) = &self.config.container {
            ap = ap.container(c.clone());
        }
        ap.max_stdin_buf_size = Some(READ);
        let mut proc = match self.pods().exec(pod, argv, &ap).await {
            Ok(proc) => proc,
            Err(e) => return Err(self.exec_refused(pod, e).await),
        };
        let status = proc.take_status();
        let mut input = proc.stdin();
        let mut out = proc.stdout();
        let mut errs = proc.stderr();
        let write = async {
            if let (Some(w), Some(mut from)) = (input.as_mut(), stdin) {
                while let Some(chunk) = from.recv().await {
                    // A broken pipe means the command ended early; its status says why.
                    if w.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                let _ = w.shutdown().await;
            }
            drop(input);
        };
        let status = async {
            match status {
                Some(s) => s.await,
                None => None,
            }
        };
        tokio::pin!(write, status);
        let (mut written, mut out_open, mut err_open) = (false, out.is_some(), errs.is_some());
        let (mut out_buf, mut err_buf) = (vec![0u8; READ], [0u8; 4096]);
        let mut captured = Captured::default();
        let status = loop {
            tokio::select! {
                () = &mut write, if !written => written = true,
                n = read_some(&mut out, &mut out_buf), if out_open => {
                    out_open = n > 0;
                    if n > 0 && !hand_on(stdout.as_ref(), &out_buf[..n]).await {
                        return Err(stopped_taking());
                    }
                }
                n = read_some(&mut errs, &mut err_buf), if err_open => {
                    err_open = n > 0;
                    captured.truncated |= keep(&mut captured.stderr, &err_buf[..n], STDERR_KEPT);
                }
                s = &mut status => break s,
            }
        };
        // What the command wrote before its status is buffered: read it all (the status frame
        // comes after the output on the same connection).
        while out_open {
            let n = out.as_mut().map_or(0, |r| {
                futures_util::FutureExt::now_or_never(r.read(&mut out_buf))
                    .and_then(Result::ok)
                    .unwrap_or(0)
            });
            out_open = n > 0;
            if n > 0 && !hand_on(stdout.as_ref(), &out_buf[..n]).await {
                return Err(stopped_taking());
            }
        }
        drop(proc);
        outcome(pod, status, captured)
    }
}

/// The error of an archive out of a pod whose receiver stopped taking it (the shelf's own
/// error says why).
fn stopped_taking() -> K8sError {
    K8sError::Shelf {
        retryable: true,
        message: "it stopped taking the workspace's archive".into(),
    }
}

/// Hands `bytes` to `to`; false when its receiver is gone.
async fn hand_on(to: Option<&mpsc::Sender<Bytes>>, bytes: &[u8]) -> bool {
    match to {
        Some(to) => to.send(Bytes::copy_from_slice(bytes)).await.is_ok(),
        None => true,
    }
}
