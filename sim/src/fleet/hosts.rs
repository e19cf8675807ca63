//! Hosts over an object store (issue 33): several hosts, each with its own disk (the local
//! backend's root: its sandbox directories and its local snapshot directories), sharing the
//! fleet store and an object store ("shelf") for snapshots. `FleetOptions::hosts`, `sim explore
//! --replicas N --hosts`. A host is a replica slot: a replica that crashes and restarts keeps
//! its host and its disk.
//!
//! What the backend does, as the local backend with a shelf configured does:
//!
//! - a sandbox lives on the host whose process started it ([`Sandbox::host`]); its Stop (there)
//!   makes a local snapshot on that host's disk ([`Local`]);
//! - a Persist uploads that local snapshot to the object store (`Backend::snapshots` is then
//!   the store's objects), then succeeds; the local copy stays, marked persisted once an upload
//!   of it landed. The store may fail the upload (nothing lands, the Persist fails), be slow
//!   (the answer comes 1 to 6 s later, past the command's deadline now and then), or land the
//!   object and lose the answer ([`Outcome::Late`]: answered as a failure, or past the
//!   deadline). A Persist answered ok has landed;
//! - a Start resuming `S` on host `h` takes `S`'s local copy on `h` (moved into the sandbox),
//!   or the workspace of a sandbox on `h` whose start took `S` already (the local backend's
//!   `took_snapshot`); else downloads the object (which stays in the store: a start never
//!   consumes one; the download may fail, and the Start fails, or be slow); else (`S` only on
//!   another host's disk, a salvaged snapshot whose Persist never landed, or nowhere) the Start
//!   fails: never a fresh workspace. The core then gives the snapshot back to its key;
//! - an Adopt on `h` of a sandbox that lives on another host (up, or its stopped workspace on
//!   that host's disk) is answered `InstanceGone` (the local backend's `FailureClass::Elsewhere`,
//!   as `io-tokio/src/classify.rs` maps it): only the sandbox's own host adopts it;
//! - any other command to a sandbox on another host does nothing there ([`Outcome::Elsewhere`]):
//!   a Shutdown is answered ok and leaves it, an upload or write is `Unavailable`, a Stop or
//!   Persist fails;
//! - a Shutdown on the sandbox's host removes it and the local snapshot its Stop took that no
//!   upload landed of (the local backend's shutdown removes an own snapshot no Persist kept);
//! - a Discard removes the object and the local copy on the issuing host only;
//! - the sweep (`sweep_on`) runs on the sweeper's host over that host's sandboxes and local
//!   snapshots, and over the object store's snapshots.
//!
//! `conservation` counts a snapshot while it is in the store or on any host's disk (as a local
//! copy, or as the directory of a sandbox whose start took it), and a sandbox wherever it is (a
//! warm sandbox on a host whose replica is down included: that host adopts it when its replica
//! is back). It is fed what the backend did: a Start continues from the snapshot it took (none:
//! a fresh workspace), and a snapshot whose last copy went is gone ([`Shelf::vanished`], or
//! the sweep). A start copies an object rather than taking it, so the sweep may remove one
//! copy of a snapshot whose retention ended while another is left: that excuses what the
//! snapshot holds wherever the checker follows it, as the retention's Discard would.
//!
//! The faults are drawn per seed from a stream of their own (so a seed without hosts draws
//! as before), each a per mille of the commands that touch the store, and only during the
//! fault phase.
//!
//! Not modelled: the local backend's `took_snapshot` passing over a sandbox its own process
//! runs (here any sandbox of the host that took the snapshot, up or with its instance lost,
//! is taken from, and gone after); a host's disk lost or full; a download left half-made; the store's listing
//! lagging its writes; a local copy and an object that differ (an object lands whole or not at
//! all); hosts that come and go (a replica slot is its host for the whole run).
//!
//! [`Sandbox::host`]: super::backend::Sandbox::host

use std::collections::BTreeMap;

use sandkeeper::{Command, Key, SandboxId, Snapshot};

use super::backend::{Backend, Kept, Life, Outcome, Sandbox};
use super::World;
use crate::rng::Rng;

/// A snapshot on one host's disk.
#[derive(Clone, Debug)]
pub struct Local {
    /// The host whose disk holds it.
    pub host: usize,
    /// The sandbox whose Stop took it.
    pub by: SandboxId,
    /// That sandbox's key.
    pub key: Key,
    /// An upload of it landed in the object store (its record says persisted): a Shutdown of
    /// its sandbox leaves it.
    pub persisted: bool,
    /// The end of its retention as a landed Persist recorded it (true time), if any.
    pub expires: Option<u64>,
}

/// The hosts' disks beside the object store.
#[derive(Clone, Debug, Default)]
pub struct Shelf {
    /// Local snapshots, by name (each on one host: the one its sandbox lived on).
    pub local: BTreeMap<String, Local>,
    /// Snapshots whose last copy (local or in the store) went in the last command, for
    /// `conservation`.
    pub vanished: Vec<Snapshot>,
    /// The marks ([`HOST_MARKS`]) the last command reached.
    pub marks: Vec<&'static str>,
}

/// The marks a run with hosts reaches besides the fleet's (`super::MARKS`). Two more are
/// set when reached, which a right core never makes happen: `shutdown-elsewhere` (a Shutdown
/// of a sandbox living on another host) and `unpersisted-removed` (a Shutdown that removed
/// its Stop's snapshot, no upload of it landed).
pub const HOST_MARKS: &[&str] = &[
    "download",
    "download-failed",
    "resume-unreachable",
    "upload-failed",
    "upload-late",
    "adopt-elsewhere",
    "handover-suspended",
    "swept-own-copy",
];

/// The object store's faults for one command.
#[derive(Clone, Copy, Debug, Default)]
pub struct Draw {
    /// The upload or download fails.
    pub fail: bool,
    /// The upload lands, its answer is lost.
    pub late: bool,
}

/// A seed's object store faults, per mille of the commands that touch the store.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShelfFaults {
    /// Uploads and downloads that fail.
    pub fail: u32,
    /// Answers that come 1 to 6 s late.
    pub slow: u32,
    /// Uploads that land and lose their answer.
    pub late: u32,
}

impl ShelfFaults {
    /// A seed's rates.
    pub fn draw(rng: &mut Rng) -> Self {
        ShelfFaults {
            fail: [0, 50, 200][rng.index(3)],
            slow: [0, 100, 300][rng.index(3)],
            late: [0, 50, 200][rng.index(3)],
        }
    }

    /// The faults of one command.
    pub fn for_command(&self, rng: &mut Rng) -> Draw {
        Draw {
            fail: rng.chance(self.fail),
            late: rng.chance(self.late),
        }
    }
}

/// Whether `cmd` touches the object store (an upload or a download, perhaps).
pub fn touches_store(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Start {
            resume_from: Some(_),
            ..
        } | Command::Persist {
            snapshot: Some(_),
            ..
        }
    )
}

impl Backend {
    /// With hosts: whether `x` lives on another host than `host` (one shut down or dead
    /// lives nowhere: gone to every host).
    pub(super) fn elsewhere(&self, x: SandboxId, host: usize) -> bool {
        let there = |s: &Sandbox| s.host != host && !matches!(s.life, Life::Gone | Life::Dead);
        self.shelf.is_some() && self.sandboxes.get(&x).is_some_and(there)
    }

    fn shelf_mut(&mut self) -> &mut Shelf {
        self.shelf.as_mut().expect("hosts")
    }

    /// With hosts: `cmd`, ordered by a replica on `host`, as the host's backend runs it;
    /// `None` for what it runs as one root does (an upload into a sandbox of its own, the
    /// commands that want no answer).
    pub(super) fn apply_on_host(
        &mut self,
        cmd: &Command,
        host: usize,
        draw: Draw,
    ) -> Option<Outcome> {
        let token = cmd.token();
        let x = cmd.sandbox();
        let elsewhere = self.elsewhere(x, host);
        let life = self.sandboxes.get(&x).map(|s| s.life.clone());
        let outcome = match cmd {
            Command::Start {
                sandbox,
                key,
                resume_from,
                ..
            } => {
                if let Err(refused) = self.admit_start(*sandbox, key, token) {
                    return Some(refused);
                }
                if let Some(snapshot) = resume_from {
                    if let Err(failed) = self.take_for_start(snapshot, key, host, draw) {
                        return Some(failed);
                    }
                }
                let started = Sandbox::up(key, token, resume_from, host);
                self.sandboxes.insert(*sandbox, started);
                Outcome::Ok(None)
            }
            Command::Upload { .. } if elsewhere => Outcome::Unavailable,
            Command::Adopt { .. } if elsewhere => {
                self.shelf_mut().marks.push("adopt-elsewhere");
                Outcome::Elsewhere
            }
            // Its owner stopped it and crashed before its record said so: the stopped
            // workspace is taken back from this host's disk, the object (if any) left in the
            // store.
            Command::Adopt { .. } if life == Some(Life::Stopped) => {
                let name = format!("snap-{x}");
                let here = (self.shelf_mut().local.get(&name)).is_some_and(|l| l.host == host);
                if !here {
                    return Some(Outcome::Gone);
                }
                let done = self.change(x, token, Some(Life::Up));
                if done == Outcome::Ok(None) {
                    self.shelf_mut().local.remove(&name);
                }
                done
            }
            Command::Stop { .. } | Command::Persist { .. } if elsewhere => Outcome::Gone,
            Command::Stop { sandbox, .. } => {
                let snapshot = Snapshot::new(format!("snap-{sandbox}"));
                match self.change(*sandbox, token, Some(Life::Stopped)) {
                    Outcome::Ok(_) => {
                        // A second Stop makes no second snapshot.
                        if life != Some(Life::Stopped) {
                            let s = &self.sandboxes[sandbox];
                            let local = Local {
                                host: s.host,
                                by: *sandbox,
                                key: s.key.clone(),
                                persisted: false,
                                expires: None,
                            };
                            let name = snapshot.as_str().to_string();
                            self.shelf_mut().local.insert(name, local);
                        }
                        Outcome::Ok(Some(snapshot))
                    }
                    other => other,
                }
            }
            Command::Persist {
                sandbox, snapshot, ..
            } => {
                let done = self.change(*sandbox, token, None);
                match snapshot {
                    Some(snapshot) if done == Outcome::Ok(None) => {
                        self.upload(snapshot, host, draw)
                    }
                    _ => done,
                }
            }
            Command::Shutdown { .. } if elsewhere => {
                self.shelf_mut().marks.push("shutdown-elsewhere");
                Outcome::Elsewhere
            }
            Command::Shutdown { sandbox, .. } if life.is_some() => {
                let done = self.change(*sandbox, token, Some(Life::Gone));
                if done == Outcome::Ok(None) {
                    self.shut_down_snapshot(*sandbox, host);
                }
                done
            }
            Command::Discard { snapshot, .. } => {
                let name = snapshot.as_str();
                self.snapshots.remove(name);
                let shelf = self.shelf_mut();
                if shelf.local.get(name).is_some_and(|l| l.host == host) {
                    shelf.local.remove(name);
                }
                Outcome::Silent
            }
            _ => return None,
        };
        Some(outcome)
    }

    /// What a Start resuming `snapshot` for `key` on `host` takes: its local copy there, or
    /// a sandbox there whose start took it, or a download of its object; else it fails
    /// (`Unavailable`: the download failed; `Gone`: not reachable from this host).
    fn take_for_start(
        &mut self,
        snapshot: &Snapshot,
        key: &Key,
        host: usize,
        draw: Draw,
    ) -> Result<(), Outcome> {
        let name = snapshot.as_str();
        let shelf = self.shelf_mut();
        if shelf.local.get(name).is_some_and(|l| l.host == host) {
            shelf.local.remove(name);
            self.taken.insert(name.to_string());
            return Ok(());
        }
        let took = self.sandboxes.values_mut().find(|y| {
            y.host == host
                && &y.key == key
                && y.resumed_from.as_ref() == Some(snapshot)
                && matches!(y.life, Life::Up | Life::Lost)
        });
        if let Some(y) = took {
            // Its directory renamed into the new sandbox.
            y.life = Life::Gone;
            return Ok(());
        }
        if self.snapshots.contains_key(name) {
            let (mark, taken) = if draw.fail {
                ("download-failed", Err(Outcome::Unavailable))
            } else {
                ("download", Ok(()))
            };
            self.shelf_mut().marks.push(mark);
            return taken;
        }
        self.shelf_mut().marks.push("resume-unreachable");
        Err(Outcome::Gone)
    }

    /// A Persist's upload of `snapshot` from `host`'s disk.
    fn upload(&mut self, snapshot: &Snapshot, host: usize, draw: Draw) -> Outcome {
        let name = snapshot.as_str();
        let local = (self.shelf_mut().local.get(name))
            .filter(|l| l.host == host)
            .cloned();
        let Some(local) = local else {
            // Nothing here to upload: done if an earlier upload landed.
            return if self.snapshots.contains_key(name) {
                Outcome::Ok(None)
            } else {
                Outcome::Gone
            };
        };
        if draw.fail {
            self.shelf_mut().marks.push("upload-failed");
            return Outcome::Unavailable;
        }
        let kept = Kept {
            by: local.by,
            key: local.key.clone(),
            expires: None, // the world sets it, on its own clock
        };
        self.snapshots.insert(name.to_string(), kept);
        if let Some(l) = self.shelf_mut().local.get_mut(name) {
            l.persisted = true;
        }
        if draw.late {
            self.shelf_mut().marks.push("upload-late");
            Outcome::Late
        } else {
            Outcome::Ok(None)
        }
    }

    /// A Shutdown of `x` on `host` removes the snapshot its Stop took there that no upload
    /// landed of; gone from everywhere, it is [`Shelf::vanished`].
    fn shut_down_snapshot(&mut self, x: SandboxId, host: usize) {
        let name = format!("snap-{x}");
        let shelf = self.shelf_mut();
        if shelf
            .local
            .get(&name)
            .is_some_and(|l| l.host == host && !l.persisted)
        {
            shelf.local.remove(&name);
            shelf.marks.push("unpersisted-removed");
            if !self.anywhere(&name) {
                self.shelf_mut().vanished.push(Snapshot::new(name));
            }
        }
    }

    /// Whether `snapshot` is anywhere: in the object store or on a host's disk, as its local
    /// copy or as the directory of a sandbox whose start took it (where a start on that host
    /// finds it, and where `conservation` follows it when the core gives it back to its key).
    pub(super) fn anywhere(&self, snapshot: &str) -> bool {
        let local = (self.shelf.as_ref()).is_some_and(|s| s.local.contains_key(snapshot));
        let took = |x: &Sandbox| {
            matches!(x.life, Life::Up | Life::Lost)
                && x.resumed_from
                    .as_ref()
                    .is_some_and(|s| s.as_str() == snapshot)
        };
        self.snapshots.contains_key(snapshot) || local || self.sandboxes.values().any(took)
    }
}

impl World {
    /// With hosts, during the faults: the object store's extra latency (ms) of the answer to a
    /// command that touched it: 1 to 6 s when slow; a lost answer (`late`), in half of them,
    /// past any deadline.
    pub(super) fn shelf_latency(&mut self, late: bool) -> u64 {
        let mut extra = 0;
        if self.shelf_rng.chance(self.shelf_faults.slow) {
            extra += self.shelf_rng.range(1_000, 6_000);
        }
        if late && self.shelf_rng.chance(500) {
            extra += self.shelf_rng.range(6_000, 9_000);
        }
        extra
    }
}

#[cfg(test)]
mod tests {
    use sandkeeper::{DiscardReason, Instant, SessionId, Spec, Token};

    use super::*;

    const H0: usize = 0;
    const H1: usize = 1;

    fn key() -> Key {
        Key::Session(SessionId::new("s").expect("a valid name"))
    }

    fn start(x: u64, resume_from: Option<&str>) -> Command {
        Command::Start {
            sandbox: SandboxId(x),
            key: key(),
            spec: Spec::default(),
            resume_from: resume_from.map(Snapshot::new),
            resumes: None,
            deadline: Instant::ZERO,
            token: None,
        }
    }

    fn stop(x: u64) -> Command {
        Command::Stop {
            sandbox: SandboxId(x),
            suspend: true,
            token: None,
            deadline: Instant::ZERO,
        }
    }

    fn persist(x: u64) -> Command {
        Command::Persist {
            sandbox: SandboxId(x),
            snapshot: Some(Snapshot::new(format!("snap-{}", SandboxId(x)))),
            suspend: true,
            token: None,
            retain_until: None,
            deadline: Instant::ZERO,
        }
    }

    fn shutdown(x: u64) -> Command {
        Command::Shutdown {
            sandbox: SandboxId(x),
            token: None,
            deadline: Instant::ZERO,
        }
    }

    fn adopt(x: u64) -> Command {
        Command::Adopt {
            sandbox: SandboxId(x),
            key: key(),
            token: Token(1),
            deadline: Instant::ZERO,
        }
    }

    const OK: Draw = Draw {
        fail: false,
        late: false,
    };
    const FAIL: Draw = Draw {
        fail: true,
        late: false,
    };
    const LATE: Draw = Draw {
        fail: false,
        late: true,
    };

    /// Sandbox 1 started and stopped on host 0: its snapshot on host 0's disk only.
    fn stopped_on_h0() -> (Backend, String) {
        let mut b = Backend::new(true, true);
        assert_eq!(b.apply(&start(1, None), H0, OK), Outcome::Ok(None));
        let name = format!("snap-{}", SandboxId(1));
        let taken = b.apply(&stop(1), H0, OK);
        assert_eq!(taken, Outcome::Ok(Some(Snapshot::new(name.clone()))));
        (b, name)
    }

    #[test]
    fn a_snapshot_only_on_another_hosts_disk_is_resumed_there_and_nowhere_else() {
        let (mut b, name) = stopped_on_h0();
        assert_eq!(b.apply(&start(2, Some(&name)), H1, OK), Outcome::Gone);
        assert!(!b.sandboxes.contains_key(&SandboxId(2)), "nothing started");
        assert_eq!(b.apply(&start(3, Some(&name)), H0, OK), Outcome::Ok(None));
        let took = b.sandboxes[&SandboxId(3)].resumed_from.clone();
        assert_eq!(took, Some(Snapshot::new(name.clone())));
        assert!(
            !b.shelf.as_ref().unwrap().local.contains_key(&name),
            "moved"
        );
    }

    #[test]
    fn a_persisted_snapshot_is_downloaded_elsewhere_and_stays_in_the_store() {
        let (mut b, name) = stopped_on_h0();
        assert_eq!(b.apply(&persist(1), H0, OK), Outcome::Ok(None));
        assert_eq!(
            b.apply(&start(2, Some(&name)), H1, FAIL),
            Outcome::Unavailable
        );
        assert_eq!(b.apply(&start(3, Some(&name)), H1, OK), Outcome::Ok(None));
        assert!(
            b.snapshots.contains_key(&name),
            "a start never consumes an object"
        );
        // The local copy goes to the host's own start.
        assert_eq!(b.apply(&start(4, Some(&name)), H0, FAIL), Outcome::Ok(None));
        assert!(!b.shelf.as_ref().unwrap().local.contains_key(&name));
    }

    #[test]
    fn an_upload_that_failed_lands_nothing_and_a_late_one_lands() {
        let (mut b, name) = stopped_on_h0();
        assert_eq!(b.apply(&persist(1), H0, FAIL), Outcome::Unavailable);
        assert!(!b.snapshots.contains_key(&name));
        assert_eq!(b.apply(&persist(1), H0, LATE), Outcome::Late);
        assert!(b.snapshots.contains_key(&name));
        assert!(b.shelf.as_ref().unwrap().local[&name].persisted);
    }

    #[test]
    fn a_shutdown_removes_its_own_unpersisted_snapshot_and_nothing_elsewhere() {
        let (mut b, name) = stopped_on_h0();
        assert_eq!(b.apply(&shutdown(1), H1, OK), Outcome::Elsewhere);
        assert_eq!(b.sandboxes[&SandboxId(1)].life, Life::Stopped);
        assert_eq!(b.apply(&shutdown(1), H0, OK), Outcome::Ok(None));
        let shelf = b.shelf.as_ref().unwrap();
        assert_eq!(shelf.vanished, vec![Snapshot::new(name.clone())]);
        assert!(!b.anywhere(&name));
        // A persisted one stays.
        let (mut b, name) = stopped_on_h0();
        b.apply(&persist(1), H0, OK);
        b.apply(&shutdown(1), H0, OK);
        assert!(b.shelf.as_ref().unwrap().local.contains_key(&name));
    }

    #[test]
    fn only_its_own_host_adopts_a_sandbox() {
        let mut b = Backend::new(true, true);
        b.apply(&start(1, None), H0, OK);
        assert_eq!(b.apply(&adopt(1), H1, OK), Outcome::Elsewhere);
        assert_eq!(b.apply(&adopt(1), H0, OK), Outcome::Ok(None));
        // Stopped: its workspace taken back from its own host's disk only.
        let (mut b, name) = stopped_on_h0();
        assert_eq!(b.apply(&adopt(1), H1, OK), Outcome::Elsewhere);
        assert_eq!(b.apply(&adopt(1), H0, OK), Outcome::Ok(None));
        assert!(!b.anywhere(&name), "its workspace again, no snapshot left");
        // Shut down: gone to every host.
        b.apply(&shutdown(1), H0, OK);
        assert_eq!(b.apply(&adopt(1), H1, OK), Outcome::Gone);
    }

    #[test]
    fn a_discard_removes_the_object_and_the_issuing_hosts_copy_only() {
        let (mut b, name) = stopped_on_h0();
        b.apply(&persist(1), H0, OK);
        let discard = Command::Discard {
            sandbox: SandboxId(1),
            key: key(),
            snapshot: Snapshot::new(name.clone()),
            token: None,
            reason: DiscardReason::Superseded,
        };
        assert_eq!(b.apply(&discard, H1, OK), Outcome::Silent);
        assert!(!b.snapshots.contains_key(&name));
        assert!(b.shelf.as_ref().unwrap().local.contains_key(&name));
        b.apply(&discard, H0, OK);
        assert!(!b.anywhere(&name));
    }
}
