//! A fleet scenario's expectations: the one-process ones, asked of one replica (its core, and
//! what its current incarnation ordered and reported), and the fleet's own about ownership and
//! the store. An expectation checks what has happened so far; it changes nothing.

use sandkeeper::{CallStatus, SandboxState};

use crate::failure::Failure;
use crate::fleet::backend::Life;
use crate::fleet::World;
use crate::harness::{
    dropped_as, failed_as, failure_of, is_ready, is_waiting, settlement_key, uploaded_into, Stop,
};
use crate::step::fleet::FleetExpect;
use crate::step::Expect;

impl World {
    /// A failed expectation, as the run reports it.
    pub(super) fn expectation(&self, detail: String) -> Stop {
        Stop::Failed(Failure {
            invariant: "expectation".into(),
            step: self.script_ref().step,
            detail,
        })
    }

    /// `[rN] expect ...`: a one-process expectation on replica `r`.
    pub(super) fn expect_on(&mut self, r: usize, e: &Expect) -> Result<(), Stop> {
        let core = &self.replicas[r].core;
        let seen = &self.script_ref().seen[r];
        // Unlike one process, an `@call` never bound is an error of the scenario, not a failure.
        let sandbox = |c| self.sandbox_of(c);
        let ok = match e {
            Expect::Ready(c) => is_ready(core.call_status(c)),
            Expect::Waiting(c) => is_waiting(core.call_status(c)),
            Expect::Failed(c, kind) => {
                let got = failure_of(&seen.refused_calls, |c| seen.failed.get(c).copied(), c);
                failed_as(got, kind.as_deref())
            }
            Expect::Uploaded {
                session,
                path,
                version,
                into,
            } => {
                let x = sandbox(into)?;
                uploaded_into(
                    seen.settled.get(&settlement_key(session, path, *version)),
                    x,
                )
            }
            Expect::Dropped {
                session,
                path,
                version,
                reason,
            } => dropped_as(
                seen.settled.get(&settlement_key(session, path, *version)),
                reason.as_deref(),
            ),
            // Unlike one process: also not relinquished here, and up in the shared backend.
            Expect::Running(c) => {
                let x = sandbox(c)?;
                core.sandbox_state(x)
                    .is_some_and(SandboxState::accepts_uploads)
                    && seen.is_up(x)
                    && self
                        .backend
                        .sandboxes
                        .get(&x)
                        .is_some_and(|s| s.life == Life::Up)
            }
            Expect::State(c, want) => core.sandbox_state(sandbox(c)?) == Some(*want),
            // Unlike one process: what this incarnation ordered since its last Adopt.
            Expect::Stop(c) | Expect::NoStop(c) => {
                let ordered = seen.sandboxes.get(&sandbox(c)?);
                ordered.is_some_and(|o| o.has("stop")) == matches!(e, Expect::Stop(_))
            }
            Expect::Shutdown(c) | Expect::NoShutdown(c) => {
                let ordered = seen.sandboxes.get(&sandbox(c)?);
                ordered.is_some_and(|o| o.has("shutdown")) == matches!(e, Expect::Shutdown(_))
            }
            Expect::Resumed(c, snapshot) => seen
                .sandboxes
                .get(&sandbox(c)?)
                .and_then(|o| o.resume_from.as_ref())
                .is_some_and(|s| s.as_str() == snapshot),
            Expect::Discarded(s) | Expect::NoDiscard(s) => {
                seen.discarded.contains(s.as_str()) == matches!(e, Expect::Discarded(_))
            }
            Expect::Closed => self.replicas[r].closed,
            Expect::Error(kind) => seen.last_error.is_some_and(|k| k.as_str() == kind),
        };
        if ok {
            return Ok(());
        }
        let detail = self.explain(r, e);
        Err(self.expectation(format!("[r{r}] `{e}` does not hold: {detail}")))
    }

    fn explain(&self, r: usize, e: &Expect) -> String {
        let core = &self.replicas[r].core;
        let seen = &self.script_ref().seen[r];
        match e {
            Expect::Ready(c) | Expect::Waiting(c) => {
                format!("{c} is {:?}", core.call_status(c))
            }
            Expect::Failed(c, _) => format!(
                "{c} failed with {:?}",
                sandkeeper::CallId::new(c)
                    .ok()
                    .and_then(|c| seen.failed.get(&c))
            ),
            Expect::Error(_) => format!("the last input's error was {:?}", seen.last_error),
            Expect::Uploaded {
                session,
                path,
                version,
                ..
            }
            | Expect::Dropped {
                session,
                path,
                version,
                ..
            } => format!(
                "it settled as {:?}",
                seen.settled.get(&settlement_key(session, path, *version))
            ),
            Expect::Running(c)
            | Expect::State(c, _)
            | Expect::Stop(c)
            | Expect::NoStop(c)
            | Expect::Shutdown(c)
            | Expect::NoShutdown(c)
            | Expect::Resumed(c, _) => match self.sandbox_of(c) {
                Err(_) => format!("{c} was never bound to a sandbox"),
                Ok(x) => format!(
                    "{x} is {:?} in r{r}'s core, {:?} in the backend; r{r} ordered {:?}",
                    core.sandbox_state(x),
                    self.backend.sandboxes.get(&x).map(|s| &s.life),
                    seen.sandboxes.get(&x).map(|o| &o.commands)
                ),
            },
            Expect::Closed => "no Closed event yet".into(),
            Expect::Discarded(_) | Expect::NoDiscard(_) => {
                format!("discarded so far: {:?}", seen.discarded)
            }
        }
    }

    /// `[rN] expect ...` about ownership on replica `r`, or `expect owner|record ...` about the
    /// store (`r` is `None`).
    pub(super) fn expect_fleet(&mut self, r: Option<usize>, e: &FleetExpect) -> Result<(), Stop> {
        let (ok, detail) = match (r, e) {
            (None, FleetExpect::Owner(key, want, token)) => {
                let owner = self.store.live_owner(key, self.now);
                let slot = owner.and_then(|(inc, _)| self.script_ref().incarnations.get(&inc));
                let newest = self.store.keys.get(key).map_or(0, |k| k.token);
                let ok = slot.copied() == want.map(|w| w.0) && token.is_none_or(|t| t == newest);
                (
                    ok,
                    format!(
                        "the store's live owner is {} (incarnation {:?}), its newest token {newest}",
                        slot.map_or("none".to_string(), |s| format!("r{s}")),
                        owner
                    ),
                )
            }
            (
                None,
                FleetExpect::Record {
                    key,
                    warm,
                    snapshot,
                },
            ) => {
                let record = self
                    .store
                    .keys
                    .get(key)
                    .map(|k| k.record.clone())
                    .unwrap_or_default();
                let warm_ok = match warm {
                    None => true,
                    Some(None) => record.warm.is_none(),
                    Some(Some(c)) => record.warm == Some(self.sandbox_of(c)?),
                };
                let snapshot_ok = match snapshot {
                    None => true,
                    Some(want) => {
                        record.snapshot.as_ref().map(|s| s.snapshot.as_str()) == want.as_deref()
                    }
                };
                (warm_ok && snapshot_ok, format!("the record is {record:?}"))
            }
            (Some(r), e) if !e.is_fleet_wide() => self.owned_on(r, e)?,
            (r, e) => {
                return Err(Stop::Misuse(format!(
                    "`{e}` {}",
                    if r.is_some() {
                        "is about the store, not one replica"
                    } else {
                        "is about one replica"
                    }
                )))
            }
        };
        if ok {
            return Ok(());
        }
        let who = r.map_or(String::new(), |r| format!("[r{r}] "));
        Err(self.expectation(format!("{who}`{e}` does not hold: {detail}")))
    }

    /// An ownership expectation on replica `r`: whether it holds, and what was seen.
    fn owned_on(&self, r: usize, e: &FleetExpect) -> Result<(bool, String), Stop> {
        let core = &self.replicas[r].core;
        let seen = &self.script_ref().seen[r];
        Ok(match e {
            FleetExpect::Lost(c) => (
                matches!(core.call_status(c), Some(CallStatus::Lost(_))),
                format!("{c} is {:?}", core.call_status(c)),
            ),
            FleetExpect::Claim(key) => (
                seen.claims.contains(key),
                format!("r{r} claimed {:?}", seen.claims),
            ),
            FleetExpect::Token(key, want) => {
                let got = core.key_token(key).map(|t| t.0);
                (got == *want, format!("r{r} owns {key} under {got:?}"))
            }
            FleetExpect::Adopt(c) | FleetExpect::Relinquish(c) => {
                let x = self.sandbox_of(c)?;
                let name = if matches!(e, FleetExpect::Adopt(_)) {
                    "adopt"
                } else {
                    "relinquish"
                };
                let ordered = seen.sandboxes.get(&x);
                (
                    ordered.is_some_and(|o| o.has(name)),
                    format!("r{r} ordered {:?} for {x}", ordered.map(|o| &o.commands)),
                )
            }
            FleetExpect::Fenced(key, reason) => (
                seen.fenced
                    .iter()
                    .any(|(k, why)| k == key && reason.is_none_or(|want| want == *why)),
                format!("r{r} reported fenced: {:?}", seen.fenced),
            ),
            FleetExpect::Owner(..) | FleetExpect::Record { .. } => {
                unreachable!("the store's, handled by the caller")
            }
        })
    }
}
