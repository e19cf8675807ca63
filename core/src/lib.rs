//! # sandkeeper: the sans-IO lifecycle of an agent harness's sandboxes
//!
//! One shared agent serves many users' calls at once. Every call needs a sandbox (a local
//! directory, a container, a Kubernetes pod), and background jobs (the session-log mirror, memory
//! writes) keep writing into a session's sandbox after the call's own work is done. This crate is
//! the pure, synchronous state machine that decides the whole lifecycle — acquire, start, bind,
//! flush, release, drain, stop, persist, shutdown, close — and emits commands for a driver to
//! execute. It reads no clock, draws no randomness, spawns nothing and does no IO: a driver
//! (`sandkeeper-tokio`, `sandkeeper-k8s`) or the simulator (`sim`) feeds it inputs and executes
//! its outputs.
//!
//! ```
//! use std::time::Duration;
//! use sandkeeper::*;
//!
//! let mut core = Lifecycle::new(Config::default()).unwrap();
//! let t = Instant::ZERO;
//! let (call, session) = (CallId::new("c1").unwrap(), SessionId::new("s1").unwrap());
//! core.acquire(t, CallSpec::new(call.clone(), session.clone())).unwrap();
//! let Some(Command::Start { sandbox, .. }) = core.poll_command() else { panic!() };
//! core.handle_start_ok(t, sandbox).unwrap();
//! assert_eq!(core.poll_event(), Some(Event::CallReady { call: call.clone(), sandbox }));
//! assert_eq!(core.resolve(&session), Ok(sandbox));
//!
//! // The session log is mirrored into the session's own sandbox.
//! let v = core.flush(t, &session, &PathName::session_log(), Payload::new(b"{}\n".to_vec())).unwrap();
//! let Some(Command::Upload { upload, sandbox: into, .. }) = core.poll_command() else { panic!() };
//! assert_eq!(into, sandbox);
//! core.release(t, &call).unwrap();           // drains: Stop waits for the upload
//! assert!(matches!(core.poll_command(), Some(Command::Drain { .. })));
//! assert_eq!(core.poll_command(), None);
//! core.handle_upload_ok(t, upload).unwrap(); // settled; the drain is done; Stop follows
//! let Some(Command::Stop { sandbox: stopped, suspend: false, deadline, token: None }) = core.poll_command()
//!     else { panic!() };
//! assert_eq!((stopped, deadline), (sandbox, t + Config::default().command_timeout));
//! # let _ = (v, Duration::ZERO);
//! ```
//!
//! ## The drain contract (the caller's obligations)
//!
//! In the manner of str0m's `Rtc`:
//!
//! 1. **One input at a time.** Every input is a method taking `now` ([`Instant`], the driver's
//!    clock as nanoseconds since an origin it chose). The core never reads a clock; an earlier
//!    `now` than one already seen counts as the latest.
//! 2. **Drain after every input.** Call [`Lifecycle::poll_command`] until `None` and
//!    [`Lifecycle::poll_event`] until `None` before the next input. Commands are work for the
//!    driver, in the order they must be started; events are news for the application. The core
//!    queues them, so draining late is not a loss, but output of one input may be needed to
//!    answer the next correctly (an Upload's id, a Start's sandbox).
//! 3. **Keep the timer.** After draining, [`Lifecycle::poll_timeout`] gives the earliest deadline;
//!    call [`Lifecycle::handle_timeout`] once the clock has reached it (calling it early or twice
//!    is harmless). Check the clock against the deadline before sleeping: a runtime may wake a
//!    sleep late.
//! 4. **Answer every command that wants an answer**, exactly once: Start, Upload, Stop, Persist
//!    and Shutdown with the matching `handle_*` (unless the driver dropped it, below); Drain,
//!    CancelUpload and Abandon want none. An answer the core no longer awaits (after a
//!    timeout, a death, a cancel) is stale: it returns `Ok` and changes nothing, so a driver
//!    never has to know.
//! 5. **Run one sandbox's lifecycle in order.** Start, Hook, Stop, Persist and Shutdown of one
//!    sandbox run one after the other, in the order they were drained: each begins only once the one
//!    before it ended (answered, dropped at its deadline, or abandoned). Lifecycle commands of
//!    different sandboxes run concurrently; a driver may bound how many run at once, but only
//!    with a first-in-first-out queue, so that every command is eventually started.
//! 6. **Run uploads beside everything.** Each Upload runs on its own, concurrently with other
//!    uploads and with its sandbox's lifecycle commands: never queued behind another session's
//!    upload (R13) or behind a lifecycle command. The core bounds how many there are (one per
//!    session and path, [`Limits`]) and never orders one into a sandbox after its Stop,
//!    Shutdown or death, so a driver needs no pool of its own.
//! 7. **Deadlines are the core's.** Start, Upload, Stop, Persist and Shutdown carry the
//!    [`Instant`] at which the core stops waiting ([`Command::deadline`]). The driver maps it to
//!    its clock, stops the operation then (drops its future, kills its process) and answers
//!    nothing: the core's own timer fires at the same instant and decides what follows. A
//!    driver keeps no timeouts of its own and needs no rule for a timer and an answer that fall
//!    on the same instant (an answer that comes first counts; one that comes after is stale).
//! 8. **Cancels drop work, never wait for it.** `CancelUpload` drops that upload. `Abandon` drops
//!    the sandbox's outstanding Start, Hook, Stop or Persist; the Shutdown ordered right after it
//!    runs at once, without waiting for the abandoned operation (so a backend's operations must leave
//!    nothing behind when dropped: Shutdown deletes by name what a dropped start created).
//!    `Drain` is news for the sessions' background writers; nothing waits for it.
//! 9. **Suspension.** `Stop { suspend: true }` asks for a snapshot the key's next Start can
//!    resume; a successful `Persist { suspend: true }` is the sandbox's last command, and the
//!    backend keeps the sandbox until a Start carries its snapshot as `resume_from` (that
//!    Start's `resumes` names the suspended sandbox it continues). Name a resumed
//!    incarnation's objects after the *new* sandbox, so that a late report seen on an object of
//!    the old one names the old sandbox: the core no longer tracks it and ignores the report.
//!    A driver needs no table of incarnations and never looks at the release policy. A Start
//!    with `resume_from` *takes* the snapshot (the new sandbox's workspace from then on: a
//!    rename, the same claim); a retained snapshot carries its expiry (`Persist::retain_until`),
//!    which the backend records with it and enforces by itself. `Discard` deletes a snapshot no
//!    key references any longer (its retention ended, a newer one superseded it, or a start
//!    took it and its sandbox is up: then only what the start left of it, e.g. the shelf's
//!    copy; a backend whose start moved or reused it deletes nothing): it runs beside everything, in no
//!    sandbox's order, needs no answer, and is the one command that may name a sandbox after
//!    its last command (the sandbox that persisted it).
//! 10. **Report deaths.** When the backend learns a sandbox is gone (pod deleted, claim expired,
//!     directory removed, an exec answered 404), call [`Lifecycle::handle_died`]; when only its
//!     running instance went and its workspace may remain (a pod of a claim), call
//!     [`Lifecycle::handle_instance_gone`], and the core decides whether that is a death (it is
//!     not while the sandbox is being suspended). Never assume a sandbox alive because a
//!     backend object said so earlier: liveness is the core's state.
//! 11. **Fleet mode: run the store's work beside the sandboxes'.** With [`Config::fleet`] set,
//!     drain [`Lifecycle::poll_store`] too after every input. Each [`StoreCommand`] runs on its
//!     own, concurrently with everything (a renewal is never queued behind a sandbox's work nor
//!     behind another store command), is answered with its `handle_*` input, and is dropped
//!     unanswered at its deadline. Renewals come on the core's own timer whatever else happens:
//!     a driver that stops running them loses the lease. Two sandbox commands are fleet mode's
//!     own: `Adopt` (take over a sandbox another process handed over; answered like a Start,
//!     run in the sandbox's order) and `Relinquish` (the sandbox is no longer this process's:
//!     drop what is outstanding on it, forget it, no answer; its last command). Every command
//!     that changes a fleet key's sandbox carries the key's [`Token`]; pass it to the backend,
//!     which refuses a token older than the newest it has seen for that sandbox, and report a
//!     refusal with [`Lifecycle::handle_fenced`] (the core fences the key). Every input lets
//!     time pass first: a lease that ran out by its `now` lapses before the input is looked
//!     at, even an input that is then refused (the lapse is the clock's doing, not the input's).
//! 12. **Treat errors as refusals.** An input that returns `Err` changed nothing. A panic means a
//!     broken internal invariant: a bug, never bad input.
//!
//! Output order is a pure function of the input sequence: maps are looked up, never iterated
//! into output, and timers fire in (deadline, timer) order.
//!
//! ## Inputs
//!
//! | input | does | cost |
//! |---|---|---|
//! | [`acquire`](Lifecycle::acquire) | binds a call to its key's sandbox, starts one, or queues it | O(log n) |
//! | [`release`](Lifecycle::release) | ends a call (done, failed, cancelled); applies the release policy to its sandbox's last call | O(log n) |
//! | [`flush`](Lifecycle::flush) | records the next version of a session's file; uploads it when the path is free | O(log n + paths) |
//! | [`hold`](Lifecycle::hold) / [`unhold`](Lifecycle::unhold) | a background writer promises a write; draining waits for it | O(log n) |
//! | [`resolve`](Lifecycle::resolve) | (a getter) the sandbox of a session's live call, for context-free code | O(calls of the session) |
//! | [`close`](Lifecycle::close) | refuses new calls, drains to a deadline, revokes, shuts everything down | O(n log n), once |
//! | `handle_start_ok` / `_failed` | a Start's answer | O(log n + calls bound) |
//! | `handle_upload_ok` / `_failed` | an Upload's answer; transient failures retry with backoff | O(log n + paths) |
//! | `handle_hook_ok` / `_failed` | a Hook's answer: after start or resume, the calls are ready or fail; before suspend or stop, the Stop follows | O(log n + calls bound) |
//! | `handle_stop_ok` / `_failed`, `handle_persist_ok` / `_failed`, `handle_shutdown_ok` / `_failed` | the way down | O(log n) |
//! | [`handle_died`](Lifecycle::handle_died) | the backend reports a sandbox gone | O(log n + what it held) |
//! | [`handle_instance_gone`](Lifecycle::handle_instance_gone) | the backend reports a sandbox's running instance gone (a death unless it is being suspended) | O(log n + what it held) |
//! | [`handle_timeout`](Lifecycle::handle_timeout) | fires due timers | O(log n) per timer |
//! | fleet: [`handle_renewed`](Lifecycle::handle_renewed) / `handle_renew_failed` | the lease's renewal answered; wanted keys handed over | O(log n + wanted) |
//! | fleet: [`handle_claimed`](Lifecycle::handle_claimed), `handle_claim_busy` / `_failed` | a key's claim answered: adopt, resume or start; or retry | O(log n + waiters) |
//! | fleet: [`handle_recorded`](Lifecycle::handle_recorded), `handle_record_failed` / `_fenced` | an owned key's record write answered | O(log n) |
//! | fleet: [`handle_key_released`](Lifecycle::handle_key_released), `handle_release_failed` / `_fenced` | a key's release answered | O(log n) |
//! | fleet: [`handle_fenced`](Lifecycle::handle_fenced) | the backend refused a token: the key is fenced | O(n) (a scan of sandboxes, rare) |
//!
//! n is the number of live calls, sessions and sandboxes; "paths" is the number of mirrored
//! paths of one session (bounded by [`Limits::max_paths_per_session`]). No input scans all
//! sessions or sandboxes, except close, once, and in fleet mode a fence (a lapse or a refusal)
//! and the first valid lease after a lapse (the keys calls wait for), each rare.
//! [`Lifecycle::handle`] takes any input as an
//! [`Input`] value, for traces and replay.
//!
//! ## Commands ([`Command`])
//!
//! `Hook` (run the application's hook at a [`HookPoint`], answered like a lifecycle command),
//! `Discard` (a snapshot whose retention ended, superseded, unused, or taken: [`DiscardReason`]), `Start` (with the key, the call's opaque [`Spec`], `resume_from`, the key's last
//! persisted [`Snapshot`], and `resumes`, the sandbox that persisted it), `Upload`,
//! `CancelUpload`, `Drain` (the sandbox and the sessions whose background writers should submit
//! now), `Stop` and `Persist` (each saying whether the sandbox is being suspended), `Shutdown`,
//! and `Abandon` (the outstanding Start, Stop or Persist is no longer awaited); in fleet mode
//! `Adopt` and `Relinquish`, and every command that changes a sandbox carries its key's
//! [`Token`]. Store work is [`StoreCommand`], drained apart. Each names one
//! sandbox; each that wants an answer carries its deadline. The order on the way down is always Drain → Stop → Persist → Shutdown: never an
//! Upload after Stop, Shutdown or death, never Persist before Stop, never a command naming a
//! sandbox after its Shutdown, and exactly one Shutdown per managed sandbox (never one for an
//! external sandbox).
//!
//! ## Events ([`Event`])
//!
//! `CallReady`, `CallFailed` (with an [`ErrorKind`]), `CallReleased` (the release completed:
//! its session's mirror work for that sandbox settled), `CallRevoked` (by close), `SandboxLost`
//! (a bound call's sandbox died), `Settled` (every flushed version exactly once: `Uploaded`,
//! `Superseded` or `Dropped` with a [`DropReason`]), `MirrorSettled` (one session's mirror has
//! nothing unsettled: sessions are awaited one by one, never "everything"),
//! `ShutdownUnconfirmed`, `HookFailed`, `KeyFenced` (fleet mode: this process lost a key, with
//! a [`FenceReason`]), `Closed` (with a [`CloseReport`]).
//!
//! ## Errors ([`Error`])
//!
//! Typed, and an input that fails changes nothing: `Closed`, `UnknownCall`, `DuplicateCall`,
//! `AlreadyReleased`, `InvalidName`, `NoActiveSandbox`, `SandboxGone`, `QueueFull`,
//! `UnknownSandbox`, `UnknownUpload`, `NotHeld`, `MissingUser`, `LimitExceeded`,
//! `InvalidConfig`, `UnknownStoreWork` (fleet mode: an answer for a renewal, claim or release
//! never ordered). Names are validated when made ([`SessionId::new`] and friends): a name that
//! could escape a directory or reach a shell is an [`InvalidName`].
//!
//! ## Semantics in brief
//!
//! - **Keys.** A call's isolation key comes from the [`Scope`] (or the external sandbox it
//!   names). Under [`SameKey::Share`] calls of one key are bound to one sandbox, reference
//!   counted; under [`SameKey::Serialize`] the later call queues (first in, first out,
//!   `max_waiters`, `wait_timeout`). A new call of a key whose previous sandbox is still
//!   stopping waits for its persist, so its Start resumes from the newest snapshot. A warm or
//!   draining sandbox is revived by the next call of its key rather than replaced.
//! - **Release policy** ([`ReleasePolicy`]), applied when a managed sandbox's last call goes:
//!   `Shutdown`, `KeepWarm { idle }` or `Suspend` (drain, Stop, Persist; the backend keeps the
//!   persisted sandbox; the core forgets it and resumes the key from its snapshot), each a set
//!   of [`Tiers`], which `Tiered` spells out: warm for `idle`, then the Shutdown or the Suspend
//!   way, then the key's snapshot kept for `retain` and discarded (see the diagram on
//!   [`Tiers`]). External sandboxes drain and are unbound, never stopped.
//! - **Mirror.** See the `flush` docs: per (session, path) one upload in flight, newer
//!   versions supersede pending ones, retries with backoff, drain on release up to
//!   `drain_deadline`, holds for writers that will write after their call ends.
//! - **Death.** [`SandboxState::Dead`]: calls on it get `SandboxLost`, `resolve` answers
//!   `SandboxGone`, its uploads are dropped, outstanding answers become stale, Shutdown is
//!   ordered once to clean up.
//!
//! ## Conservation: nothing acknowledged is lost
//!
//! What the application was told is safe must stay where the key's next call continues from.
//! **Acknowledged** means, for each kind of work:
//!
//! | work | acknowledged when |
//! |---|---|
//! | a mirror version | it settled [`Settlement::Uploaded`] into a sandbox |
//! | the application's own operation (a driver's write, removal, command) | it returned `Ok` |
//! | a hook | it answered ok |
//! | fleet mode: a key's durable record | its write was confirmed ([`Lifecycle::handle_recorded`]) |
//!
//! **The property.** Everything acknowledged for a key is in what the key's next call
//! continues from: its live sandbox, else its snapshot (the next Start's `resume_from`), else,
//! in fleet mode, what the key's stored record names (a warm sandbox to adopt, a snapshot). The
//! exceptions are exactly: the key's retention ended ([`Tiers`]' `retain`), the policy lets the
//! workspace go (a sandbox that started fresh, shut down on the `Shutdown` way with no snapshot
//! taken), the application discarded it (a release that asked `Shutdown`,
//! [`Lifecycle::release_as`], lets its sandbox's workspace go, as a kill does;
//! [`Lifecycle::drop_snapshot`] lets go of what the key keeps) or closed, or the backend
//! reported the storage itself destroyed (a death; its calls get [`Event::SandboxLost`]); and
//! a sandbox whose way down failed, which the core never deletes but leaves to the backend as
//! it is ([`Event::WayDownFailed`], naming the snapshot the key keeps of it, or none).
//!
//! **How the core keeps it.** A Stop or Persist that fails is ordered again; when every attempt
//! failed, or one went unanswered, a sandbox that holds its key's history (it resumed, was
//! adopted, or is being suspended) or whose Stop took a snapshot is never shut down: the
//! snapshot is salvaged as the key's, or the sandbox left as it is (`way_down.rs`). A resumed
//! Start that fails or times out (or whose after-resume hook fails) gives the snapshot back to
//! its key and leaves the sandbox as it is; a resumed sandbox whose calls ended while it started
//! goes down through Stop and Persist (`start.rs`). A lost running instance is never a death of a
//! managed sandbox: up, it is suspended in place (`death.rs`).
//!
//! In fleet mode the key's stored record is what a next owner continues from, so the core keeps
//! it ahead of every acknowledgement and behind every deletion (`ownership.rs`):
//! - a claim hands out the key's record and the store keeps it until the new owner writes a
//!   newer one;
//! - a sandbox that comes up makes its calls ready only once a record naming it is confirmed
//!   ([`SandboxState::Starting`] meanwhile): nothing is acknowledged in a sandbox no record
//!   names;
//! - a persisted sandbox the record names is shut down, or left suspended for the next start
//!   to take, only once a record naming its snapshot is confirmed ([`SandboxState::Persisted`]
//!   meanwhile);
//! - a sandbox whose way down failed is left as it is, never shut down (a Stop unanswered may
//!   have moved its workspace into a snapshot the core never learned of); with nothing
//!   salvaged it stays named in the record, and the key's next call (here, or at the next
//!   owner) adopts it; a salvaged snapshot is the key's to resume once the record names it; an
//!   Adopt unanswered in time is asked again, and after every attempt its calls fail and it is
//!   relinquished, never shut down; a key claimed back while this process still tracks the
//!   sandbox its record names waits to adopt it;
//! - a session one of whose calls lost its key to a fence, or came while its key was another
//!   process's, drops its flushes ([`DropReason::Fenced`]) until a call of it is ready: what
//!   the application wrote then is not written over the owner's newer work.
//!
//! Every change a process makes carries its token, and the drivers check the application's own
//! operations against it too, so a process whose key was taken over changes nothing the next
//! owner sees.
//!
//! **What checks it.** The simulator's `conservation` checker
//! (`sandkeeper_check::Conservation`) follows each key's acknowledged work through every
//! transition after every input of every seed, one process and fleets alike, with canaries x13
//! to x16, f08 to f14, f17 and f18 in `sim/canaries`; the
//! drivers' real-process tests (`io-tokio/tests/fleet_processes.rs`: a process killed right
//! after its claim or after an acknowledged write, a process paused past its lease that wakes
//! after two takeovers; `fencing.rs` in both drivers) and the scenarios
//! (`sim/scenarios/salvage-*.scn`).
//!
//! ## Files
//!
//! | file | owns |
//! |---|---|
//! | `lifecycle.rs` | [`Lifecycle`]: its state, getters and outputs, the timer dispatch, the checks every input makes, the per-input bookkeeping (`Reconcile`: the sessions and sandboxes an input changed, brought up to date once when it is done) |
//! | `call.rs` | call records and their table, with the memory of ended calls and the count of queued ones; acquire, release, binding, becoming ready, ending |
//! | `key.rs` | isolation-key slots and their table; queueing, admitting waiters, letting go of a sandbox |
//! | `sandbox.rs` | sandbox records, their table and [`SandboxState`] |
//! | `start.rs` | Start and its answers; a sandbox coming up; a start that failed, timed out or died |
//! | `hook.rs` | the application's hooks: ordering one at its place, its answers, what follows it |
//! | `way_down.rs` | the release tiers; drain → Stop → Persist → Shutdown or suspended; their answers; a key's snapshot, its retention and Discard; abandoning; the sandbox's timer; `WayDown`, the view a sandbox's own transitions run on |
//! | `death.rs` | deaths and lost instances |
//! | `operation.rs` | the application's own work in a session's sandbox: enter, leave, and the per-sandbox count that keeps a drain from ending under it |
//! | `mirror.rs` | the mirror: flush, hold, upload answers and retries, pump, retarget, settle, leaving a sandbox; the per-path mirror slots; `Mirror`, the mirror's view of the lifecycle |
//! | `session.rs` | session records, their table and idle queue; a session's derived bookkeeping, reconciled once per input (mirror work) |
//! | `upload.rs` | uploads in flight and their table |
//! | `close.rs` | close: its phases, revocation, the close report |
//! | `fleet.rs` | fleet mode's configuration ([`Fleet`]) and the store's work ([`StoreCommand`]) |
//! | `ownership.rs` | fleet keys: claims, adoption, handover, release with the key's durable record, the key's store timer |
//! | `liveness.rs` | this process's lease: renewals on their own timer, validity with the margin, lapse and the next epoch |
//! | `sweep.rs` | fleet mode's sweep, as a pure decision: which objects left in a shared backend may go ([`sweep_verdict`]) |
//! | `timer.rs` | the one timer table (a heap with lazy deletion) |
//! | `output.rs` | [`Lifecycle`]'s outputs waiting to be drained (commands, store work, events) and its counters |
//! | `command.rs`, `event.rs`, `input.rs` | the values that go out and come in |
//! | `config.rs`, `error.rs`, `ids.rs`, `name.rs`, `time.rs`, `stats.rs` | configuration, typed errors, ids and opaque values, validated names, virtual time, counters |
//! | `invariants/` | [`Lifecycle::check_invariants`], one check per table |
//! | `map.rs`, `id_index.rs`, `small_set.rs` | the fixed-hasher maps; the index from the ids the core hands out to places; the inline ordered set and short inline lists |
//!
//! Every table (calls, keys, sessions, sandboxes, uploads) is a generational slab with an index
//! from names or ids to places: a name or id is looked up once, where it comes in, and records
//! refer to each other by place.
//!
//! Two parts run on views that borrow only what they may change, so that the compiler, not a
//! convention, keeps them in their lane: mirror work on `Mirror` (session records, uploads, the
//! sandboxes' upload bookkeeping, timers, outputs; calls read-only; keys out of reach), a
//! sandbox's own transitions on the way down on `WayDown` (sandbox records, timers,
//! outputs, the close report; no call, key, session or upload). The inputs themselves, and
//! what crosses parts (a release, a death, close), stay on [`Lifecycle`], which checks and
//! hands on.
//!
//! ## What is inlined, and why
//!
//! On a call cycle (acquire to shutdown, `core.call_cycle_vs_hashmap` in the perf report) the
//! entries and exits of function calls (registers saved and restored) are a visible share of
//! the work. Two rules keep them down:
//!
//! - A step with one caller on the cycle's path (`unbind`, `begin_drain`, `make_ready`, a
//!   table's `insert`, `remove` and `find`, a session's reconciliation, the timer pruning) is
//!   `#[inline(always)]`: one copy of its code either way.
//! - A step that usually finds nothing to do (`admit` with no call queued, `pump` with no
//!   version to order, `record_if_changed` outside fleet mode, `key_settles` for a key not
//!   owned here) keeps its test inline and its work out of line.
//!
//! What each rule saved is in `docs/performance.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod call;
mod close;
mod command;
mod config;
mod death;
mod error;
mod event;
mod fleet;
mod hook;
mod id_index;
mod ids;
mod input;
mod invariants;
mod key;
mod key_record;
mod lifecycle;
mod liveness;
mod map;
mod mirror;
mod name;
mod operation;
mod output;
mod ownership;
mod sandbox;
mod session;
mod small_set;
mod start;
mod stats;
mod sweep;
mod time;
mod timer;
mod upload;
mod way_down;

pub use call::{CallSpec, CallStatus};
pub use command::{Command, DiscardReason, HookPoint, SessionList};
pub use config::{
    Config, Hooks, Limits, ReleasePolicy, SameKey, Scope, SuspendHookFailure, Tiers, WayDown,
};
pub use error::{DropReason, Error, ErrorKind};
pub use event::{CloseReport, Event, FenceReason, Retained, Settlement};
pub use fleet::{
    ClaimId, Fleet, Handover, KeyRecord, RecordedSnapshot, RecordingId, ReleaseId, RenewalId,
    StoreCommand, Token,
};
pub use ids::{Key, Payload, SandboxId, Snapshot, Spec, UploadId, Version};
pub use input::{Answer, Input, UploadFailure};
pub use invariants::Violation;
pub use lifecycle::Lifecycle;
pub use name::{CallId, ExternalId, InvalidName, PathName, SessionId, UserId, MAX_NAME_LEN};
pub use sandbox::{Ownership, SandboxState};
pub use stats::Stats;
pub use sweep::{sweep_verdict, sweep_verdict_of, SweepKey, SweepObject, SweepVerdict, Sweeper};
pub use time::Instant;
pub use way_down::WAY_DOWN_ATTEMPTS;
