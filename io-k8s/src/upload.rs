//! Uploads into a pod through `pods/exec`: the argv `timeout -s KILL <secs> tar -x -C <workdir>`
//! (no shell; every path in the archive is built from validated names), a tar stream on stdin,
//! stdin closed, stdout and stderr drained, and the status frame read. No status frame means the
//! outcome is unknown — an error, never success. The client deadline matches the in-container
//! `timeout`, so a cancelled upload does not run on forever.

use kube::api::AttachParams;
use sandkeeper::{PathName, SessionId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{calls, err, Cluster};
use crate::error::K8sError;

/// Most stderr kept for an error message.
const STDERR_KEPT: usize = 4096;

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

/// A tar archive of `files` laid out as `<session>/<path>`, regular files, mode 0644, mtime 0.
pub fn archive(files: &[UploadFile<'_>]) -> Result<Vec<u8>, K8sError> {
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(f.bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        let path = format!("{}/{}", f.session.as_str(), f.path.as_str());
        b.append_data(&mut h, &path, f.bytes)
            .map_err(|e| K8sError::Archive(e.to_string()))?;
    }
    b.into_inner().map_err(|e| K8sError::Archive(e.to_string()))
}

/// The argv of an upload.
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
    pub async fn upload(&self, pod: &str, files: &[UploadFile<'_>]) -> Result<(), K8sError> {
        let size: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
        if size > self.config.max_payload_bytes {
            return Err(K8sError::TooLarge {
                size,
                limit: self.config.max_payload_bytes,
            });
        }
        let tar = archive(files)?;
        let timeout = self.config.upload_timeout();
        let run = self.exec_with_stdin(
            pod,
            upload_argv(&self.config.workdir, self.config.upload_timeout_secs),
            tar,
        );
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(K8sError::Timeout {
                what: format!("upload into pod {pod}"),
                after: timeout,
            }),
        };
        match result {
            Ok(()) => Ok(()),
            Err(
                e @ (K8sError::CommandFailed { .. }
                | K8sError::Forbidden { .. }
                | K8sError::TooLarge { .. }),
            ) => Err(e),
            Err(e) => match self.check_pod_alive(pod).await {
                Err(gone) if gone.is_gone() => Err(gone),
                _ => Err(e),
            },
        }
    }

    /// Runs `argv` in the pod with `stdin` as its input; `Ok` only on a `Success` status frame.
    pub async fn exec_with_stdin(
        &self,
        pod: &str,
        argv: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<(), K8sError> {
        let what = format!("pod {pod}");
        let mut ap = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true);
        if let Some(c) = &self.config.container {
            ap = ap.container(c.clone());
        }
        ap.max_stdin_buf_size = Some(64 * 1024);
        let mut proc = self
            .pods()
            .exec(pod, argv, &ap)
            .await
            .map_err(|e| err(e, calls::EXEC, &what))?;
        let status = proc.take_status();
        let mut input = proc.stdin();
        let mut out = proc.stdout();
        let mut errs = proc.stderr();
        let write = async {
            if let Some(w) = input.as_mut() {
                // A broken pipe here means the command ended early; the status says why.
                let _ = w.write_all(&stdin).await;
                let _ = w.shutdown().await;
            }
            drop(input);
        };
        let drain_out = async {
            if let Some(r) = out.as_mut() {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(r, &mut sink).await;
            }
        };
        let drain_err = async {
            let mut kept = Vec::new();
            if let Some(r) = errs.as_mut() {
                let mut buf = [0u8; 4096];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let room = STDERR_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        };
        let status_fut = async {
            match status {
                Some(s) => s.await,
                None => None,
            }
        };
        let ((), (), stderr, status) = tokio::join!(write, drain_out, drain_err, status_fut);
        drop(proc);
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        match status {
            None => Err(K8sError::OutcomeUnknown {
                pod: pod.to_string(),
            }),
            Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
            Some(s) => {
                let code = s
                    .details
                    .as_ref()
                    .and_then(|d| d.causes.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
                    .and_then(|c| c.message.as_deref())
                    .and_then(|m| m.parse::<i32>().ok());
                match code {
                    Some(code) => Err(K8sError::CommandFailed {
                        pod: pod.to_string(),
                        code,
                        stderr,
                    }),
                    None => Err(K8sError::Invalid {
                        code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(500),
                        reason: s.reason.unwrap_or_default(),
                        message: format!("{} {stderr}", s.message.unwrap_or_default()),
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_lays_files_out_by_session() {
        let (s, p) = (
            SessionId::new("s-1").unwrap(),
            PathName::new("log.jsonl").unwrap(),
        );
        let tar = archive(&[UploadFile {
            session: &s,
            path: &p,
            bytes: b"{}\n",
        }])
        .unwrap();
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
            vec![("s-1/log.jsonl".to_string(), "{}\n".to_string())]
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
