//! Inputs as values: every input the core takes, for traces, replay and the simulator.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::call::CallSpec;
use crate::config::WayDown;
use crate::error::Error;
use crate::fleet::{ClaimId, KeyRecord, RecordingId, ReleaseId, RenewalId, Token};
use crate::ids::Key;
use crate::ids::{Payload, SandboxId, Snapshot, UploadId};
use crate::lifecycle::Lifecycle;
use crate::name::{CallId, PathName, SessionId};
use crate::time::Instant;

/// How an upload failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UploadFailure {
    /// It may work if tried again (a dropped connection, a 5xx): retried with backoff.
    Transient,
    /// The sandbox is gone (a 404, a deleted pod, a removed directory): treated as its death.
    Gone,
}

/// One input to the core, as a value. [`Lifecycle::handle`] applies it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "input")]
#[allow(missing_docs)] // each variant is the method of the same name
pub enum Input {
    Acquire(CallSpec),
    DropSnapshot {
        key: Key,
    },
    Release {
        call: CallId,
        /// The way down asked ([`Lifecycle::release_as`]); absent: a plain release.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        way: Option<WayDown>,
    },
    Flush {
        session: SessionId,
        path: PathName,
        payload: Payload,
    },
    Hold {
        session: SessionId,
    },
    Unhold {
        session: SessionId,
    },
    Enter {
        session: SessionId,
    },
    Leave {
        sandbox: SandboxId,
    },
    Close {
        deadline: Duration,
    },
    StartOk {
        sandbox: SandboxId,
    },
    StartFailed {
        sandbox: SandboxId,
    },
    HookOk {
        sandbox: SandboxId,
    },
    HookFailed {
        sandbox: SandboxId,
    },
    UploadOk {
        upload: UploadId,
    },
    UploadFailed {
        upload: UploadId,
        failure: UploadFailure,
    },
    StopOk {
        sandbox: SandboxId,
        snapshot: Option<Snapshot>,
    },
    StopFailed {
        sandbox: SandboxId,
    },
    PersistOk {
        sandbox: SandboxId,
    },
    PersistFailed {
        sandbox: SandboxId,
    },
    ShutdownOk {
        sandbox: SandboxId,
    },
    ShutdownFailed {
        sandbox: SandboxId,
    },
    Died {
        sandbox: SandboxId,
    },
    InstanceGone {
        sandbox: SandboxId,
    },
    Renewed {
        renewal: RenewalId,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        wanted: Vec<Key>,
    },
    Claimed {
        claim: ClaimId,
        key: Key,
        token: Token,
        #[serde(default)]
        record: KeyRecord,
    },
    ClaimBusy {
        claim: ClaimId,
        key: Key,
    },
    ClaimFailed {
        claim: ClaimId,
        key: Key,
    },
    Recorded {
        recording: RecordingId,
        key: Key,
    },
    RecordFailed {
        recording: RecordingId,
        key: Key,
    },
    RecordFenced {
        recording: RecordingId,
        key: Key,
    },
    KeyReleased {
        release: ReleaseId,
        key: Key,
    },
    ReleaseFailed {
        release: ReleaseId,
        key: Key,
    },
    ReleaseFenced {
        release: ReleaseId,
        key: Key,
    },
    RenewFailed {
        renewal: RenewalId,
    },
    Fenced {
        sandbox: SandboxId,
    },
    Timeout,
}

/// What an applied input answers besides success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Nothing more.
    Done,
    /// A flush's version.
    Version(crate::Version),
    /// The sandbox an `enter` entered.
    Entered(SandboxId),
}

impl Lifecycle {
    /// Applies one input: the method of the same name, with what it answers.
    pub fn handle(&mut self, now: Instant, input: Input) -> Result<Answer, Error> {
        match input {
            Input::Acquire(spec) => self.acquire(now, spec),
            Input::DropSnapshot { key } => self.drop_snapshot(now, &key).map(drop),
            Input::Release { call, way: None } => self.release(now, &call),
            Input::Release {
                call,
                way: Some(way),
            } => self.release_as(now, &call, way),
            Input::Flush {
                session,
                path,
                payload,
            } => {
                return self
                    .flush(now, &session, &path, payload)
                    .map(Answer::Version)
            }
            Input::Hold { session } => self.hold(now, &session),
            Input::Unhold { session } => self.unhold(now, &session),
            Input::Enter { session } => return self.enter(now, &session).map(Answer::Entered),
            Input::Leave { sandbox } => self.leave(now, sandbox),
            Input::Close { deadline } => self.close(now, deadline),
            Input::StartOk { sandbox } => self.handle_start_ok(now, sandbox),
            Input::StartFailed { sandbox } => self.handle_start_failed(now, sandbox),
            Input::HookOk { sandbox } => self.handle_hook_ok(now, sandbox),
            Input::HookFailed { sandbox } => self.handle_hook_failed(now, sandbox),
            Input::UploadOk { upload } => self.handle_upload_ok(now, upload),
            Input::UploadFailed { upload, failure } => {
                self.handle_upload_failed(now, upload, failure)
            }
            Input::StopOk { sandbox, snapshot } => self.handle_stop_ok(now, sandbox, snapshot),
            Input::StopFailed { sandbox } => self.handle_stop_failed(now, sandbox),
            Input::PersistOk { sandbox } => self.handle_persist_ok(now, sandbox),
            Input::PersistFailed { sandbox } => self.handle_persist_failed(now, sandbox),
            Input::ShutdownOk { sandbox } => self.handle_shutdown_ok(now, sandbox),
            Input::ShutdownFailed { sandbox } => self.handle_shutdown_failed(now, sandbox),
            Input::Died { sandbox } => self.handle_died(now, sandbox),
            Input::InstanceGone { sandbox } => self.handle_instance_gone(now, sandbox),
            Input::Renewed { renewal, wanted } => self.handle_renewed(now, renewal, &wanted),
            Input::Claimed {
                claim,
                key,
                token,
                record,
            } => self.handle_claimed(now, claim, &key, token, record),
            Input::ClaimBusy { claim, key } => self.handle_claim_busy(now, claim, &key),
            Input::ClaimFailed { claim, key } => self.handle_claim_failed(now, claim, &key),
            Input::KeyReleased { release, key } => self.handle_key_released(now, release, &key),
            Input::ReleaseFailed { release, key } => self.handle_release_failed(now, release, &key),
            Input::ReleaseFenced { release, key } => self.handle_release_fenced(now, release, &key),
            Input::RenewFailed { renewal } => self.handle_renew_failed(now, renewal),
            Input::Recorded { recording, key } => self.handle_recorded(now, recording, &key),
            Input::RecordFailed { recording, key } => {
                self.handle_record_failed(now, recording, &key)
            }
            Input::RecordFenced { recording, key } => {
                self.handle_record_fenced(now, recording, &key)
            }
            Input::Fenced { sandbox } => self.handle_fenced(now, sandbox),
            Input::Timeout => self.handle_timeout(now),
        }
        .map(|()| Answer::Done)
    }
}
