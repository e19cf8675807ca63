//! The simulated backend the replicas share: sandboxes and snapshots, each sandbox with the
//! tokens it accepted, and each key with the newest token any of its sandboxes saw. A command
//! carrying a token older than the newest its sandbox or its key has seen is refused (`Fenced`)
//! at the one step that would change anything, as the real backends do. The key's token is what
//! refuses a stale owner's Start of a *new* sandbox once the key's next owner has touched the
//! backend; the sandbox's own list is what the simulator checks: no sandbox ever accepted a
//! change from a token older than one it had seen.
//!
//! An Adopt of a sandbox whose owner stopped it (and crashed before its record said so) takes
//! the workspace back, as the local backend does.
//!
//! Losses ([`Backend::lose`]): a sandbox that is up may lose its running instance with its
//! workspace intact ([`Life::Lost`]: a pod evicted while its claim and volumes stay), or die with
//! its workspace ([`Life::Gone`]). A lost instance takes no upload or write (answered as a
//! failure that may pass, `Unavailable`: the driver cannot tell a missing pod from a slow one,
//! and only the backend's own report says the workspace went), but a Stop still takes its
//! workspace, and an Adopt brings it back up (the controller makes a new pod for the claim).
//! A dead one ([`Life::Dead`]) answers everything `Gone`.
//!
//! With hosts ([`Backend::shelf`], `hosts.rs`), each sandbox and each local snapshot lives on
//! one host's disk, and persisted snapshots in a shared object store: see `hosts.rs`.
//!
//! Not modelled: start and stop latency inside the backend (the world's schedule gives each
//! command its latency), hooks (the application's work, which the world runs itself:
//! `World::hook_runs`).

use std::collections::BTreeMap;

use sandkeeper::{Command, Key, SandboxId, Snapshot, Token};

use super::hosts::{Draw, Shelf};

/// Where a simulated sandbox is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Life {
    /// Up: takes uploads.
    Up,
    /// Its running instance lost, its workspace intact: takes no upload, but can be stopped,
    /// persisted, shut down, or adopted (which brings it up again).
    Lost,
    /// Stopped, or suspended (persisted, kept for its key's next start).
    Stopped,
    /// Shut down.
    Gone,
    /// Died with its workspace (a claim deleted, a directory removed): nothing is left to act
    /// on.
    Dead,
}

/// A snapshot the backend keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The sandbox it was taken from.
    pub by: SandboxId,
    /// That sandbox's key.
    pub key: Key,
    /// The end of its retention as its Persist recorded it (true time), if any.
    pub expires: Option<u64>,
}

/// One simulated sandbox.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// Its key.
    pub key: Key,
    /// Where it is.
    pub life: Life,
    /// Every token it accepted a change under, in order.
    pub accepted: Vec<u64>,
    /// The snapshot its Start took (moved into it), as the local backend records it.
    pub resumed_from: Option<Snapshot>,
    /// The host (replica slot) whose process started it: its directory is on that host's
    /// disk (looked at only with hosts, `hosts.rs`).
    pub host: usize,
}

impl Sandbox {
    /// A sandbox of `key` just started on `host` under `token`, from `resume_from`.
    pub(super) fn up(
        key: &Key,
        token: Option<Token>,
        resume_from: &Option<Snapshot>,
        host: usize,
    ) -> Self {
        Sandbox {
            key: key.clone(),
            life: Life::Up,
            accepted: token.map(|t| t.0).into_iter().collect(),
            resumed_from: resume_from.clone(),
            host,
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; a Stop's snapshot.
    Ok(Option<Snapshot>),
    /// Refused: nothing there to do it to.
    Gone,
    /// Refused: the sandbox has seen a newer token.
    Fenced,
    /// Failed, and may succeed later: an upload or write into a sandbox whose instance is lost.
    Unavailable,
    /// Nothing to answer (a command that wants no answer, or one the backend never sees).
    Silent,
    /// With hosts: the sandbox lives on another host, where this host's backend can do
    /// nothing (`hosts.rs`: an Adopt is answered `InstanceGone`, a Shutdown ok).
    Elsewhere,
    /// With hosts: a Persist whose upload landed in the object store, its answer lost or a
    /// failure (`hosts.rs`).
    Late,
}

/// The backend.
#[derive(Clone, Debug)]
pub struct Backend {
    /// Every sandbox ever started, by id.
    pub sandboxes: BTreeMap<SandboxId, Sandbox>,
    /// Snapshots kept (persisted), by name.
    pub snapshots: BTreeMap<String, Kept>,
    /// The newest token seen for each key.
    pub keys: BTreeMap<Key, u64>,
    /// Snapshots a Start took (their workspace moved into its sandbox).
    pub taken: std::collections::BTreeSet<String>,
    /// The fencing check (off only in the canary that shows the simulator needs it).
    pub fencing: bool,
    /// Commands refused for an old token.
    pub refusals: u64,
    /// A change accepted under a token older than one the sandbox had seen, if any.
    pub violation: Option<String>,
    /// With hosts: the hosts' local snapshots (`snapshots` is then the object store); `None`
    /// for one backend root shared by every replica.
    pub shelf: Option<Shelf>,
}

impl Backend {
    /// A backend with nothing in it; `hosts`: each replica slot a host with its own disk, over
    /// a shared object store (`hosts.rs`).
    pub fn new(fencing: bool, hosts: bool) -> Self {
        Backend {
            sandboxes: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            keys: BTreeMap::new(),
            taken: Default::default(),
            fencing,
            refusals: 0,
            violation: None,
            shelf: hosts.then(Shelf::default),
        }
    }

    /// The application's own write into `x` (an operation of a call ready on it), under the
    /// token the process holds the sandbox's key by: taken as an upload is, refused under an
    /// older token than the sandbox or its key has seen, gone when `x` is not up.
    /// With hosts, a sandbox on another host than `host` takes nothing (`Unavailable`).
    pub fn write(&mut self, x: SandboxId, token: Option<Token>, host: usize) -> Outcome {
        if self.elsewhere(x, host) {
            return Outcome::Unavailable;
        }
        match self.sandboxes.get(&x).map(|s| &s.life) {
            Some(Life::Up) => self.change(x, token, None),
            Some(Life::Lost) => Outcome::Unavailable,
            _ => Outcome::Gone,
        }
    }

    /// `x`, up, loses its running instance (`kept`: its workspace stays, [`Life::Lost`]) or
    /// dies with its workspace ([`Life::Dead`]). Whether it was up to lose anything.
    pub fn lose(&mut self, x: SandboxId, kept: bool) -> bool {
        match self.sandboxes.get_mut(&x) {
            Some(s) if s.life == Life::Up => {
                s.life = if kept { Life::Lost } else { Life::Dead };
                true
            }
            _ => false,
        }
    }

    /// Applies one command a replica on `host` ordered; `draw`: the object store's faults for
    /// it (looked at only with hosts).
    pub fn apply(&mut self, cmd: &Command, host: usize, draw: Draw) -> Outcome {
        if self.shelf.is_some() {
            if let Some(outcome) = self.apply_on_host(cmd, host, draw) {
                return outcome;
            }
        }
        let token = cmd.token();
        match cmd {
            Command::Start {
                sandbox,
                key,
                resume_from,
                ..
            } => {
                if let Err(refused) = self.admit_start(*sandbox, key, token) {
                    return refused;
                }
                if let Some(snapshot) = resume_from {
                    // The start takes the snapshot (gone already: a fresh workspace).
                    self.snapshots.remove(snapshot.as_str());
                    self.taken.insert(snapshot.as_str().to_string());
                }
                let started = Sandbox::up(key, token, resume_from, host);
                self.sandboxes.insert(*sandbox, started);
                Outcome::Ok(None)
            }
            Command::Upload { sandbox, .. } => match self.sandboxes.get(sandbox).map(|x| &x.life) {
                Some(Life::Up) => self.change(*sandbox, token, None),
                Some(Life::Lost) => Outcome::Unavailable,
                _ => Outcome::Gone,
            },
            // An adoption of a sandbox its crashed owner had stopped takes its workspace back
            // (the local backend renames the stopped workspace back; on Kubernetes a Stop
            // leaves the claim): it is up again, its snapshot no longer kept.
            Command::Adopt { sandbox, .. } => {
                match self.sandboxes.get(sandbox).map(|x| &x.life) {
                    Some(Life::Up) => self.change(*sandbox, token, None),
                    // Its instance lost: the adoption brings it up again (a new pod for the
                    // claim), its workspace as it was.
                    Some(Life::Lost) => self.change(*sandbox, token, Some(Life::Up)),
                    // Unless a Start took that snapshot since (renamed into another sandbox):
                    // nothing is left here to take back.
                    Some(Life::Stopped) if self.taken.contains(&format!("snap-{sandbox}")) => {
                        Outcome::Gone
                    }
                    Some(Life::Stopped) => {
                        let done = self.change(*sandbox, token, Some(Life::Up));
                        if done == Outcome::Ok(None) {
                            self.snapshots.retain(|_, kept| kept.by != *sandbox);
                        }
                        done
                    }
                    _ => Outcome::Gone,
                }
            }
            Command::Stop { sandbox, .. } => {
                let snapshot = Snapshot::new(format!("snap-{sandbox}"));
                match self.change(*sandbox, token, Some(Life::Stopped)) {
                    Outcome::Ok(_) => Outcome::Ok(Some(snapshot)),
                    other => other,
                }
            }
            Command::Persist {
                sandbox, snapshot, ..
            } => {
                let done = self.change(*sandbox, token, None);
                if done == Outcome::Ok(None) {
                    if let Some(snapshot) = snapshot {
                        let key = self.sandboxes[sandbox].key.clone();
                        let kept = Kept {
                            by: *sandbox,
                            key,
                            expires: None, // the world sets it, on its own clock
                        };
                        self.snapshots.insert(snapshot.as_str().to_string(), kept);
                    }
                }
                done
            }
            Command::Shutdown { sandbox, .. } => {
                if self.sandboxes.contains_key(sandbox) {
                    self.change(*sandbox, token, Some(Life::Gone))
                } else {
                    Outcome::Ok(None) // never started (an abandoned start): nothing to free
                }
            }
            Command::Discard { snapshot, .. } => {
                self.snapshots.remove(snapshot.as_str());
                Outcome::Silent
            }
            Command::Hook { .. } => Outcome::Gone,
            Command::Drain { .. }
            | Command::CancelUpload { .. }
            | Command::Abandon { .. }
            | Command::Relinquish { .. } => Outcome::Silent,
        }
    }

    /// The token check of a Start of `sandbox`, new, for `key`: refused (`Fenced`) under a token
    /// older than the key has seen (with fencing on; without, the first such start is the
    /// run's violation); the key's newest token advanced.
    pub(super) fn admit_start(
        &mut self,
        sandbox: SandboxId,
        key: &Key,
        token: Option<Token>,
    ) -> Result<(), Outcome> {
        let Some(Token(t)) = token else {
            return Ok(());
        };
        let newest = self.keys.get(key).copied().unwrap_or(0);
        if t < newest {
            if self.fencing {
                self.refusals += 1;
                return Err(Outcome::Fenced);
            }
            self.violation.get_or_insert(format!(
                "{sandbox} started under token {t} after its key saw token {newest}"
            ));
        }
        self.keys.insert(key.clone(), t.max(newest));
        Ok(())
    }

    /// A change to `x` under `token`: refused when the sandbox saw a newer one (with fencing
    /// on); recorded, and checked against every token it accepted before.
    pub(super) fn change(
        &mut self,
        x: SandboxId,
        token: Option<Token>,
        life: Option<Life>,
    ) -> Outcome {
        let Some(sandbox) = self.sandboxes.get_mut(&x) else {
            return Outcome::Gone;
        };
        if matches!(sandbox.life, Life::Gone | Life::Dead) {
            return Outcome::Gone;
        }
        if let Some(Token(t)) = token {
            let key_newest = self.keys.get(&sandbox.key).copied().unwrap_or(0);
            let newest = sandbox
                .accepted
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .max(key_newest);
            if t < newest {
                if self.fencing {
                    self.refusals += 1;
                    return Outcome::Fenced;
                }
                self.violation.get_or_insert(format!(
                    "{x} accepted a change under token {t} after its key saw token {newest}"
                ));
            }
            self.keys.insert(sandbox.key.clone(), t.max(key_newest));
            sandbox.accepted.push(t);
        }
        if let Some(life) = life {
            sandbox.life = life;
        }
        Outcome::Ok(None)
    }
}
