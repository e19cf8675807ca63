//! The simulated backend's ledger: every command the core ordered that wants an answer and has
//! not had one yet, with the fate the random world planned for it.

use sandkeeper::{Command, SandboxId, UploadId};

use crate::step::OpKind;

/// How a planned answer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Success.
    Ok,
    /// Failure (`upload-fail` is transient).
    Fail,
    /// `upload-fail gone`.
    Gone,
}

/// One outstanding command.
#[derive(Clone, Debug)]
pub struct Op {
    /// What it is.
    pub kind: OpKind,
    /// Its sandbox.
    pub sandbox: SandboxId,
    /// Its upload id, for uploads.
    pub upload: Option<UploadId>,
    /// Order of arrival.
    pub seq: u64,
    /// Virtual time (ms) at which the backend answers; `u64::MAX` hangs.
    pub due: u64,
    /// The planned answer.
    pub fate: Fate,
    /// Whether the random world has planned it yet.
    pub planned: bool,
}

/// The outstanding commands.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Outstanding, oldest first.
    pub ops: Vec<Op>,
    /// Uploads the core cancelled that the backend will still answer (late), random runs only.
    pub zombies: Vec<Op>,
    /// Answers already given, that the random world may give again (duplicates).
    pub answered: Vec<Op>,
    next_seq: u64,
}

impl Ledger {
    /// Records a command the core ordered. `keep_zombies`: a cancelled upload may still be
    /// answered late (random runs); otherwise the driver abandons it.
    pub fn record(&mut self, cmd: &Command, keep_zombies: bool) {
        let (kind, upload) = match cmd {
            // An adoption is answered as a start is.
            Command::Start { .. } | Command::Adopt { .. } => (OpKind::Start, None),
            Command::Upload { upload, .. } => (OpKind::Upload, Some(*upload)),
            Command::Stop { .. } => (OpKind::Stop, None),
            Command::Persist { .. } => (OpKind::Persist, None),
            Command::Shutdown { .. } => (OpKind::Shutdown, None),
            Command::Hook { .. } => (OpKind::Hook, None),
            Command::CancelUpload { upload, .. } => {
                if let Some(i) = self.ops.iter().position(|o| o.upload == Some(*upload)) {
                    let op = self.ops.remove(i);
                    if keep_zombies {
                        self.zombies.push(op);
                    }
                }
                return;
            }
            // No answer: the simulated backend forgets the snapshot.
            Command::Drain { .. } | Command::Discard { .. } => return,
            // The outstanding Start, Stop or Persist is no longer awaited. The simulated driver
            // is the harder one: it may still answer (a stale answer the core must ignore), as
            // a scenario may, so the command stays outstanding until answered.
            Command::Abandon { .. } => return,
            // No answer: the sandbox is no longer this process's.
            Command::Relinquish { .. } => return,
        };
        self.next_seq += 1;
        self.ops.push(Op {
            kind,
            sandbox: cmd.sandbox(),
            upload,
            seq: self.next_seq,
            due: 0,
            fate: Fate::Ok,
            planned: false,
        });
    }

    /// Takes the outstanding command of `kind` for `sandbox` (for uploads, the oldest).
    pub fn take(&mut self, kind: OpKind, sandbox: SandboxId) -> Option<Op> {
        let i = self
            .ops
            .iter()
            .position(|o| o.kind == kind && o.sandbox == sandbox)?;
        Some(self.ops.remove(i))
    }

    /// Whether anything is outstanding (for `sandbox`, when given).
    pub fn any(&self, sandbox: Option<SandboxId>) -> bool {
        self.ops
            .iter()
            .any(|o| sandbox.is_none_or(|x| o.sandbox == x))
    }

    /// The oldest outstanding command (for `sandbox`, when given).
    pub fn oldest(&self, sandbox: Option<SandboxId>) -> Option<&Op> {
        self.ops
            .iter()
            .find(|o| sandbox.is_none_or(|x| o.sandbox == x))
    }

    /// Whether `upload` is the oldest outstanding upload of its sandbox.
    pub fn is_oldest_upload(&self, op: &Op) -> bool {
        self.ops
            .iter()
            .find(|o| o.kind == OpKind::Upload && o.sandbox == op.sandbox)
            .is_some_and(|o| o.seq == op.seq)
    }
}
