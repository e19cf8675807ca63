//! Commands: the work the core orders a driver to do, drained with
//! [`Lifecycle::poll_command`](crate::Lifecycle::poll_command).

use serde::{Deserialize, Serialize};

use crate::ids::{Key, Payload, SandboxId, Snapshot, Spec, UploadId, Version};
use crate::name::{PathName, SessionId};

/// One piece of work for the driver. Each names exactly one sandbox. A driver answers Start,
/// Upload, Stop, Persist and Shutdown with the matching `handle_*` input; Drain and CancelUpload
/// need no answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "command")]
pub enum Command {
    /// Start a managed sandbox for `key`. Answer with `handle_start_ok` or `handle_start_failed`.
    Start {
        /// The new sandbox.
        sandbox: SandboxId,
        /// The isolation key it serves (for labels, names, sharing beyond this core).
        key: Key,
        /// The spec of the call that caused the start.
        spec: Spec,
        /// The snapshot of the key's previous sandbox, to resume its workspace from.
        resume_from: Option<Snapshot>,
    },
    /// Write `payload` as `path` of `session` into the sandbox. Answer with `handle_upload_ok`
    /// or `handle_upload_failed`.
    Upload {
        /// This upload, for its answer.
        upload: UploadId,
        /// Where to write. Always a sandbox bound to `session` (or where its released call was).
        sandbox: SandboxId,
        /// Whose file.
        session: SessionId,
        /// Which file of the session.
        path: PathName,
        /// Which version of it.
        version: Version,
        /// The bytes.
        payload: Payload,
    },
    /// Stop waiting for this upload: its outcome no longer matters (timeout, drain deadline,
    /// death, close). A later answer is recognised as stale.
    CancelUpload {
        /// The upload.
        upload: UploadId,
        /// Its sandbox.
        sandbox: SandboxId,
    },
    /// The sandbox is draining: ask these sessions' background writers to submit their last
    /// writes now. No answer.
    Drain {
        /// The draining sandbox.
        sandbox: SandboxId,
        /// The sessions whose mirror targets it.
        sessions: Vec<SessionId>,
    },
    /// Stop the sandbox (its processes), optionally taking a snapshot. Answer with
    /// `handle_stop_ok` (with the snapshot, if any) or `handle_stop_failed`.
    Stop {
        /// The sandbox.
        sandbox: SandboxId,
    },
    /// Persist the stopped sandbox's state. Answer with `handle_persist_ok` or
    /// `handle_persist_failed`.
    Persist {
        /// The sandbox.
        sandbox: SandboxId,
        /// The snapshot its Stop returned, if any.
        snapshot: Option<Snapshot>,
    },
    /// Shut the sandbox down and free everything it holds. Ordered exactly once per managed
    /// sandbox. Answer with `handle_shutdown_ok` or `handle_shutdown_failed`.
    Shutdown {
        /// The sandbox.
        sandbox: SandboxId,
    },
}

impl Command {
    /// The sandbox the command names.
    pub fn sandbox(&self) -> SandboxId {
        match self {
            Command::Start { sandbox, .. }
            | Command::Upload { sandbox, .. }
            | Command::CancelUpload { sandbox, .. }
            | Command::Drain { sandbox, .. }
            | Command::Stop { sandbox }
            | Command::Persist { sandbox, .. }
            | Command::Shutdown { sandbox } => *sandbox,
        }
    }
}
