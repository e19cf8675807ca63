//! Replicas: several servers (`--fleet`), on one root, on hosts of their own
//! ([`crate::hosts`]) or on one Kubernetes namespace, any of which answers for any sandbox.
//!
//! The sandbox table ([`crate::table`]: files under the root, rows in PostgreSQL, or Leases)
//! says where each sandbox runs; the fleet store (the root's, PostgreSQL's or the
//! namespace's) says which replicas live (each holds a lease under its incarnation) and which
//! one's keeper drives a sandbox's key, so no two act on one sandbox. A request for a sandbox
//! this replica does not run is routed ([`Replicas::route`]):
//!
//! - it runs on another live replica: the request is forwarded there ([`crate::forward`]);
//! - it is paused: this replica answers, and a connect or resume takes it in one change of its
//!   record ([`Replicas::take`]); the keeper's claim of its key then has the replica that paused
//!   it hand the kept workspace over at its next lease renewal;
//! - its replica is dead (no live lease, or it had this replica's own address): the sandbox
//!   is paused in the table as interrupted (in one change, if the record still names that
//!   replica), and then handled as one its server paused at its end. Its workspace is still on
//!   the root, named warm in its key's record in the store (the keeper's sweep keeps what a
//!   key's record names), so a resume continues it where this replica's keeper adopts it,
//!   files intact: what a dead replica acknowledged is not lost. A kill deletes it the same
//!   way;
//! - its replica died in the middle of a kill of it ([`Record::killing`]): this replica takes
//!   the kill over ([`Route::Killing`]), so that what the dead one was deleting is deleted;
//! - there is no record: 404.
//!
//! A sweep on every replica ([`Replicas::sweep`], every few seconds) does the same for every
//! record whose replica died, so that a sandbox nobody asks for again is not left behind.
//!
//! A paused sandbox's retention counts from its last pause as the table records it
//! ([`Record::paused_ms`]): any replica that knows the sandbox paused may end it, under the
//! lock and only if its record still says that pause ([`Replicas::retain`]).
//!
//! A team's limit on running sandboxes counts its records that name a replica
//! ([`crate::table::Table::running`]); each replica counts its own request rate. A signed
//! `/files` URL (which names no sandbox) goes to the sandbox whose access token made its
//! signature, found in the table ([`crate::route`]).

use std::collections::HashMap;
use std::io;

use sandkeeper_k8s::K8sStore;
use sandkeeper_pg::PgStore;
use sandkeeper_tokio::local::store::LocalStore;

use crate::durable::{Record, Replica};
use crate::table::{Change, Table};

/// This replica, the table and the leases of the fleet store.
#[derive(Clone, Debug)]
pub struct Replicas {
    /// The table.
    pub table: Table,
    /// This replica.
    pub me: Replica,
    leases: Leases,
}

/// Where the replicas' leases are read: the fleet store their keepers share.
#[derive(Clone)]
pub enum Leases {
    /// The root's own store (replicas on one root).
    Local(LocalStore),
    /// The fleet store in PostgreSQL (replicas on hosts of their own).
    Postgres(PgStore),
    /// The fleet store in the namespace's Leases (replicas on Kubernetes; boxed: a client is
    /// large beside the others).
    Kubernetes(Box<K8sStore>),
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Leases::Local(store) => f.debug_tuple("Local").field(store).finish(),
            Leases::Postgres(_) => f.write_str("Postgres"),
            Leases::Kubernetes(_) => f.write_str("Kubernetes"),
        }
    }
}

impl Leases {
    /// Whether `incarnation` holds a live lease now. A store that cannot be read counts as
    /// alive: nothing is taken over on a guess.
    async fn hold(&self, incarnation: u32) -> bool {
        match self {
            Leases::Local(store) => store
                .holds_lease(incarnation, crate::clock::now())
                .unwrap_or(true),
            Leases::Postgres(store) => match store.processes().await {
                Ok(leases) => leases.get(&incarnation).is_some_and(|(_, expires_ms)| {
                    *expires_ms > crate::clock::unix_ms(crate::clock::now())
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "the fleet store's leases could not be read: taken as alive");
                    true
                }
            },
            Leases::Kubernetes(store) => {
                match store.holds_lease(incarnation, crate::clock::now()).await {
                    Ok(live) => live,
                    Err(e) => {
                        tracing::warn!(error = %e, "the fleet store's leases could not be read: taken as alive");
                        true
                    }
                }
            }
        }
    }
}

/// Whether `a` and `b` are on one host: the same replica, or two servers of one host's root
/// (a restart), which [`Replica::host`] names.
pub(crate) fn same_host(a: &Replica, b: &Replica) -> bool {
    a == b || (a.host.is_some() && a.host == b.host)
}

/// Where a request for a sandbox goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Its record says it runs here.
    Mine,
    /// It is paused: any replica answers for it. `orphaned`: it was running on a replica that
    /// died, and was paused in the table just now.
    Paused {
        /// Its record.
        record: Record,
        /// Paused just now, its replica dead.
        orphaned: bool,
    },
    /// It has no record (never made, or killed): 404 here.
    Unknown,
    /// It runs on that live replica.
    There(Replica),
    /// Its replica died in the middle of a kill of it: the kill is this replica's now (its
    /// record says so), to be finished.
    Killing(Record),
}

/// What [`Replicas::retain`] found, a paused sandbox's retention having run out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Still paused since that pause: its kill is this replica's now (its record says so).
    Kill,
    /// Paused again since, at that time (Unix milliseconds): its retention counts from then.
    PausedSince(u64),
    /// Resumed since, or being killed, or gone: nothing for the retention to do.
    Moved,
}

/// What [`Replicas::take`] and [`Replicas::forget`] found in one change of the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The sandbox was paused, and the change was made.
    Done,
    /// It runs on that replica (taken by it meanwhile).
    RunsOn(Replica),
    /// It has no record (killed meanwhile).
    Gone,
    /// It was interrupted with its workspace on that replica's disk alone
    /// ([`Record::held_on`]), which is not this one: only that replica can continue it.
    Held(Replica),
}

impl Replicas {
    /// The replicas of the table `table` and the fleet store's `leases`, as `me`.
    pub fn new(table: Table, leases: Leases, me: Replica) -> Self {
        Replicas { table, me, leases }
    }

    /// Whether `replica` lives: it holds a lease in the store (this one does).
    pub async fn lives(&self, replica: &Replica) -> bool {
        replica == &self.me || self.leases.hold(replica.incarnation).await
    }

    /// Where a request for `id` (not running on this replica) goes. A sandbox whose replica
    /// is dead is paused in the table here, or its kill taken over.
    pub async fn route(&self, id: &str) -> io::Result<Route> {
        // A record that changed between the read and the lock is read again: each change is
        // one replica's step, so a few reads settle.
        for _ in 0..8 {
            let Some(record) = self.table.get(id).await? else {
                return Ok(Route::Unknown);
            };
            // The replica whose kill or run is taken over (`None`: a kill no replica holds).
            let dead = match &record.runs_on {
                None if record.killing => None,
                None => {
                    if let Some(holder) =
                        record.held_on.as_ref().filter(|h| !same_host(h, &self.me))
                    {
                        if self.lives(holder).await {
                            // Only its holder can continue it: the request goes there.
                            return Ok(Route::There(holder.clone()));
                        }
                    }
                    return Ok(Route::Paused {
                        record,
                        orphaned: false,
                    });
                }
                Some(r) if r == &self.me => return Ok(Route::Mine),
                Some(r) if self.lives(r).await && r.url == self.me.url => {
                    // Not sent to itself: an earlier server at this address whose lease has
                    // not run out yet (killed, and restarted on the same port), or a live
                    // replica given the same address.
                    return Err(io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!(
                            "sandbox {id} runs on another server at this replica's own address {} (incarnation {}): an earlier server there, until its lease runs out (15 s), or a replica advertising the same address (give each its own --advertise)",
                            r.url, r.incarnation
                        ),
                    ));
                }
                Some(r) if self.lives(r).await => return Ok(Route::There(r.clone())),
                Some(dead) => Some(dead.clone()),
            };
            let me = self.me.clone();
            let taken = self
                .table
                .change(id, move |now| match now {
                    Some(mut now) if now.runs_on == dead && (dead.is_some() || now.killing) => {
                        if now.killing {
                            now.runs_on = Some(me.clone());
                        } else {
                            now.runs_on = None;
                            now.interrupted = true;
                            // On a host of its own, its workspace stayed on that host's disk.
                            now.held_on = dead.clone().filter(|d| d.host.is_some());
                            now.paused_ms = crate::clock::unix_ms(crate::clock::now());
                        }
                        (
                            Change::Put(Box::new(now.clone())),
                            Some((now, dead.clone())),
                        )
                    }
                    _ => (Change::Keep, None),
                })
                .await?;
            match taken {
                Some((record, None)) => {
                    tracing::info!(sandbox = %id, "a kill that could not reach its workspace: tried again here");
                    return Ok(Route::Killing(record));
                }
                Some((record, Some(dead))) if record.killing => {
                    tracing::info!(sandbox = %id, replica = %dead.url, incarnation = dead.incarnation, "the sandbox's replica is gone in the middle of its kill: finishing it here");
                    return Ok(Route::Killing(record));
                }
                Some((record, Some(dead))) => {
                    tracing::info!(sandbox = %id, replica = %dead.url, incarnation = dead.incarnation, "the sandbox's replica is gone: paused, for any replica to continue");
                    return Ok(Route::Paused {
                        record,
                        orphaned: true,
                    });
                }
                None => {}
            }
        }
        Err(io::Error::other(format!(
            "sandbox {id}'s record kept changing while it was read"
        )))
    }

    /// Takes the paused sandbox `id` for this replica (a resume): its record now says it runs
    /// here.
    pub async fn take(&self, id: &str) -> io::Result<Claimed> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                None => (Change::Keep, Claimed::Gone),
                Some(record)
                    if record.killing && record.runs_on.as_ref().is_none_or(|r| r == &me) =>
                {
                    (Change::Keep, Claimed::Gone)
                }
                Some(mut record) => match (&record.runs_on, &record.held_on) {
                    (Some(r), _) if r != &me => (Change::Keep, Claimed::RunsOn(r.clone())),
                    (_, Some(h)) if !same_host(h, &me) => (Change::Keep, Claimed::Held(h.clone())),
                    _ => {
                        record.runs_on = Some(me.clone());
                        record.held_on = None;
                        (Change::Put(Box::new(record)), Claimed::Done)
                    }
                },
            })
            .await
    }

    /// Makes the paused sandbox `id`, held by an earlier server on this replica's host
    /// ([`Record::held_on`]: restarted on its root), held here: requests for it then come
    /// here. Whether it changed the record.
    pub async fn hold_again(&self, id: &str) -> io::Result<bool> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                Some(mut record)
                    if record.runs_on.is_none()
                        && !record.killing
                        && record
                            .held_on
                            .as_ref()
                            .is_some_and(|h| h != &me && same_host(h, &me)) =>
                {
                    record.held_on = Some(me.clone());
                    (Change::Put(Box::new(record)), true)
                }
                _ => (Change::Keep, false),
            })
            .await
    }

    /// Replaces the record of a sandbox running here with `record` (its new end), if the
    /// table still says it runs here: a late write never undoes a pause or a kill.
    pub async fn refresh(&self, record: Record) -> io::Result<bool> {
        let me = self.me.clone();
        let id = record.id.clone();
        self.table
            .change(&id, move |now| match now {
                Some(now) if now.runs_on.as_ref() == Some(&me) && !now.killing => {
                    (Change::Put(Box::new(record.clone())), true)
                }
                _ => (Change::Keep, false),
            })
            .await
    }

    /// Writes `record` (paused) if the table says its sandbox is paused or runs here (a pause
    /// here): never over another replica's, which took it while this one lost its lease.
    pub async fn pause(&self, record: Record) -> io::Result<Claimed> {
        let me = self.me.clone();
        let id = record.id.clone();
        self.table
            .change(&id, move |now| match now {
                None => (Change::Keep, Claimed::Gone),
                Some(now) if now.killing => (Change::Keep, Claimed::Gone),
                Some(now) => match &now.runs_on {
                    Some(r) if r != &me => (Change::Keep, Claimed::RunsOn(r.clone())),
                    _ => (Change::Put(Box::new(record.clone())), Claimed::Done),
                },
            })
            .await
    }

    /// Marks the sandbox `id` as being killed here if it is paused or runs here (a kill,
    /// before the keeper acts): its record says so until [`forget`](Self::forget) removes it,
    /// once the keeper deleted the sandbox, and a replica dying in between leaves the kill to
    /// the others.
    pub async fn kill(&self, id: &str) -> io::Result<Claimed> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                None => (Change::Keep, Claimed::Gone),
                Some(mut record) => match &record.runs_on {
                    Some(r) if r != &me => (Change::Keep, Claimed::RunsOn(r.clone())),
                    _ => {
                        record.runs_on = Some(me.clone());
                        record.killing = true;
                        (Change::Put(Box::new(record)), Claimed::Done)
                    }
                },
            })
            .await
    }

    /// The retention of the sandbox `id`, paused at `paused_ms` (Unix milliseconds), ran
    /// out: if it is still paused since then (or its record, older than the field, says no
    /// time), it is marked as being killed here ([`kill`](Self::kill)).
    pub async fn retain(&self, id: &str, paused_ms: u64) -> io::Result<Retention> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                Some(mut record) if record.runs_on.is_none() && !record.killing => {
                    if record.paused_ms != paused_ms && record.paused_ms != 0 {
                        let since = record.paused_ms;
                        return (Change::Keep, Retention::PausedSince(since));
                    }
                    record.runs_on = Some(me.clone());
                    record.killing = true;
                    (Change::Put(Box::new(record)), Retention::Kill)
                }
                _ => (Change::Keep, Retention::Moved),
            })
            .await
    }

    /// Every paused record (and kill no replica holds), and every record whose replica died
    /// (the sweep's work, [`route`](Self::route) each): the table as this replica should see
    /// it.
    pub async fn sweep(&self) -> io::Result<Vec<Record>> {
        let mut lives: HashMap<(u32, String), bool> = HashMap::new();
        let mut out = Vec::new();
        for record in self.table.load().await? {
            let keep = match &record.runs_on {
                None => true,
                Some(replica) if replica == &self.me => false,
                Some(replica) => {
                    let at = (replica.incarnation, replica.url.clone());
                    let alive = match lives.get(&at) {
                        Some(alive) => *alive,
                        None => {
                            let alive = self.lives(replica).await;
                            lives.insert(at, alive);
                            alive
                        }
                    };
                    !alive
                }
            };
            if keep {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Lets go of this replica's kill of `id`, which could not reach the workspace (its key's
    /// sandbox is on a host that is down): the record stays marked, held by no replica, and
    /// any replica's sweep tries the kill again ([`route`](Self::route) takes it), so that the
    /// host the workspace is on finishes it once it is back.
    pub async fn let_kill_go(&self, id: &str) -> io::Result<Claimed> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                Some(mut record) if record.killing && record.runs_on.as_ref() == Some(&me) => {
                    record.runs_on = None;
                    (Change::Put(Box::new(record)), Claimed::Done)
                }
                Some(record) => match record.runs_on {
                    Some(r) if r != me => (Change::Keep, Claimed::RunsOn(r)),
                    _ => (Change::Keep, Claimed::Gone),
                },
                None => (Change::Keep, Claimed::Gone),
            })
            .await
    }

    /// Removes the record of `id` if it is paused or runs here (a kill, once the keeper
    /// deleted the sandbox).
    pub async fn forget(&self, id: &str) -> io::Result<Claimed> {
        let me = self.me.clone();
        self.table
            .change(id, move |now| match now {
                None => (Change::Keep, Claimed::Gone),
                Some(record) => match &record.runs_on {
                    Some(r) if r != &me => (Change::Keep, Claimed::RunsOn(r.clone())),
                    _ => (Change::Remove, Claimed::Done),
                },
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::Durable;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn record(id: &str, runs_on: Option<Replica>) -> Record {
        Record {
            id: id.into(),
            team: "team-a".into(),
            template: "base".into(),
            metadata: BTreeMap::new(),
            env: vec![],
            session: id.into(),
            token: "ab".repeat(32),
            started_ms: 1,
            auto_pause: false,
            runs_on,
            end_ms: 0,
            interrupted: false,
            paused_ms: 0,
            killing: false,
            held_on: None,
        }
    }

    const X: &str = "sbx0123456789abcdef0123";

    #[tokio::test]
    async fn a_sandbox_is_routed_to_its_live_replica_taken_once_and_paused_when_its_replica_died() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let shared = Table::Files(table.clone());
        let (a_inc, b_inc) = (store.register().unwrap(), store.register().unwrap());
        store.renew(a_inc, 1, crate::clock::now()).unwrap();
        store.renew(b_inc, 1, crate::clock::now()).unwrap();
        let a = Replica {
            incarnation: a_inc,
            url: "http://127.0.0.1:1".into(),
            host: None,
        };
        let b = Replica {
            incarnation: b_inc,
            url: "http://127.0.0.1:2".into(),
            host: None,
        };
        let on_a = Replicas::new(shared.clone(), Leases::Local(store.clone()), a.clone());
        let on_b = Replicas::new(shared.clone(), Leases::Local(store.clone()), b.clone());

        assert_eq!(on_b.route(X).await.unwrap(), Route::Unknown);
        table.put(&record(X, Some(a.clone()))).unwrap();
        assert_eq!(on_b.route(X).await.unwrap(), Route::There(a.clone()));
        assert_eq!(on_a.route(X).await.unwrap(), Route::Mine);
        // Running on a: b can neither take nor forget it.
        assert_eq!(on_b.take(X).await.unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_b.forget(X).await.unwrap(), Claimed::RunsOn(a.clone()));
        // A's new end is written while it runs there, never over a pause.
        let mut longer = record(X, Some(a.clone()));
        longer.end_ms = 99;
        assert!(on_a.refresh(longer.clone()).await.unwrap());
        assert_eq!(table.get(X).unwrap().unwrap().end_ms, 99);
        assert!(!on_b.refresh(longer.clone()).await.unwrap());
        // Nor can b record it paused.
        assert_eq!(
            on_b.pause(record(X, None)).await.unwrap(),
            Claimed::RunsOn(a.clone())
        );
        // Paused: both answer for it; the first to take it has it, the other is sent there.
        table.put(&record(X, None)).unwrap();
        assert!(!on_a.refresh(longer.clone()).await.unwrap());
        assert_eq!(table.get(X).unwrap().unwrap().runs_on, None);
        assert!(matches!(
            on_b.route(X).await.unwrap(),
            Route::Paused {
                orphaned: false,
                ..
            }
        ));
        assert_eq!(on_b.take(X).await.unwrap(), Claimed::Done);
        assert_eq!(on_a.take(X).await.unwrap(), Claimed::RunsOn(b.clone()));
        assert_eq!(on_a.route(X).await.unwrap(), Route::There(b.clone()));
        // b's lease ends: its sandbox is paused in the table, for any replica to continue.
        let dead = Replica {
            incarnation: 999,
            ..b.clone()
        };
        table.put(&record(X, Some(dead))).unwrap();
        let c = Replicas::new(
            shared.clone(),
            Leases::Local(store),
            Replica {
                incarnation: 7,
                url: "http://127.0.0.1:3".into(),
                host: None,
            },
        );
        let Route::Paused {
            record: r,
            orphaned,
        } = c.route(X).await.unwrap()
        else {
            panic!("not paused")
        };
        assert!(orphaned && r.interrupted);
        assert_eq!(r.runs_on, None);
        assert_eq!(table.get(X).unwrap().unwrap().runs_on, None);
        // A record naming this replica's own address under another, live incarnation is not
        // sent to itself, nor taken; under one with no lease, it is a dead predecessor's.
        table
            .put(&record(
                X,
                Some(Replica {
                    incarnation: b_inc,
                    url: a.url.clone(),
                    host: None,
                }),
            ))
            .unwrap();
        let busy = on_a.route(X).await.unwrap_err();
        assert!(busy.to_string().contains("--advertise"), "{busy}");
        assert_eq!(
            on_a.take(X).await.unwrap(),
            Claimed::RunsOn(Replica {
                incarnation: b_inc,
                url: a.url.clone(),
                host: None,
            })
        );
        table
            .put(&record(
                X,
                Some(Replica {
                    incarnation: a_inc + 100,
                    url: a.url.clone(),
                    host: None,
                }),
            ))
            .unwrap();
        assert!(matches!(
            on_a.route(X).await.unwrap(),
            Route::Paused { orphaned: true, .. }
        ));
        assert_eq!(on_a.forget(X).await.unwrap(), Claimed::Done);
        assert_eq!(on_a.route(X).await.unwrap(), Route::Unknown);
        assert_eq!(on_a.forget(X).await.unwrap(), Claimed::Gone);
        assert!(on_a.route("../etc").await.is_err());
    }

    #[tokio::test]
    async fn a_kill_is_marked_until_forgotten_and_a_dead_replicas_kill_is_taken_over() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let shared = Table::Files(table.clone());
        let a_inc = store.register().unwrap();
        store.renew(a_inc, 1, crate::clock::now()).unwrap();
        let a = Replica {
            incarnation: a_inc,
            url: "http://127.0.0.1:1".into(),
            host: None,
        };
        let on_a = Replicas::new(shared.clone(), Leases::Local(store.clone()), a.clone());
        let on_b = Replicas::new(
            shared.clone(),
            Leases::Local(store),
            Replica {
                incarnation: 77,
                url: "http://127.0.0.1:2".into(),
                host: None,
            },
        );
        // Paused, then being killed on a: neither taken, paused nor refreshed meanwhile.
        table.put(&record(X, None)).unwrap();
        assert_eq!(on_a.kill(X).await.unwrap(), Claimed::Done);
        let marked = table.get(X).unwrap().unwrap();
        assert!(marked.killing && marked.runs_on == Some(a.clone()));
        assert_eq!(on_a.take(X).await.unwrap(), Claimed::Gone);
        assert_eq!(on_b.take(X).await.unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_a.pause(record(X, None)).await.unwrap(), Claimed::Gone);
        assert!(!on_a.refresh(record(X, Some(a.clone()))).await.unwrap());
        assert_eq!(on_b.kill(X).await.unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_b.route(X).await.unwrap(), Route::There(a.clone()));
        // A live replica's kill is not in b's sweep; a dead one's is, and b takes it over.
        assert!(on_b.sweep().await.unwrap().is_empty());
        let dead = Replica {
            incarnation: 999,
            url: "http://127.0.0.1:9".into(),
            host: None,
        };
        table
            .put(&Record {
                runs_on: Some(dead),
                ..marked.clone()
            })
            .unwrap();
        assert_eq!(on_b.sweep().await.unwrap().len(), 1);
        let Route::Killing(taken) = on_b.route(X).await.unwrap() else {
            panic!("a dead replica's kill not taken over")
        };
        assert_eq!(taken.runs_on, Some(on_b.me.clone()));
        assert_eq!(table.get(X).unwrap().unwrap(), taken);
        assert_eq!(on_b.forget(X).await.unwrap(), Claimed::Done);
        assert_eq!(table.get(X).unwrap(), None);
    }

    #[tokio::test]
    async fn a_kill_let_go_is_taken_by_the_next_replica_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let shared = Table::Files(table.clone());
        for _ in 0..2 {
            let incarnation = store.register().unwrap();
            store.renew(incarnation, 1, crate::clock::now()).unwrap();
        }
        let replica = |incarnation| Replica {
            incarnation,
            url: format!("http://127.0.0.1:{incarnation}"),
            host: None,
        };
        let on_a = Replicas::new(shared.clone(), Leases::Local(store.clone()), replica(1));
        let on_b = Replicas::new(shared, Leases::Local(store), replica(2));
        table.put(&record(X, None)).unwrap();
        assert_eq!(on_a.kill(X).await.unwrap(), Claimed::Done);
        // Only the replica that holds the kill lets it go.
        assert_eq!(
            on_b.let_kill_go(X).await.unwrap(),
            Claimed::RunsOn(replica(1))
        );
        assert_eq!(on_a.let_kill_go(X).await.unwrap(), Claimed::Done);
        let held_by_none = table.get(X).unwrap().unwrap();
        assert!(held_by_none.killing && held_by_none.runs_on.is_none());
        // Neither resumed, paused, retained nor listed as paused; in every sweep.
        assert_eq!(on_b.take(X).await.unwrap(), Claimed::Gone);
        assert_eq!(on_b.pause(record(X, None)).await.unwrap(), Claimed::Gone);
        assert_eq!(on_b.retain(X, 0).await.unwrap(), Retention::Moved);
        assert_eq!(on_b.sweep().await.unwrap(), vec![held_by_none.clone()]);
        // The next replica to look takes the kill.
        let Route::Killing(taken) = on_b.route(X).await.unwrap() else {
            panic!("a kill held by none not taken")
        };
        assert_eq!(taken.runs_on, Some(replica(2)));
        assert_eq!(on_a.route(X).await.unwrap(), Route::There(replica(2)));
        assert!(on_a.sweep().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_retention_ends_only_the_pause_it_counted_from() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let shared = Table::Files(table.clone());
        let me = Replica {
            incarnation: 5,
            url: "http://127.0.0.1:1".into(),
            host: None,
        };
        let on_a = Replicas::new(shared.clone(), Leases::Local(store), me.clone());
        let paused_at = |ms| Record {
            paused_ms: ms,
            ..record(X, None)
        };
        // Paused again since: counted from then, nothing changed.
        table.put(&paused_at(2000)).unwrap();
        assert_eq!(
            on_a.retain(X, 1000).await.unwrap(),
            Retention::PausedSince(2000)
        );
        assert_eq!(table.get(X).unwrap().unwrap(), paused_at(2000));
        // Running somewhere, or gone: nothing to do.
        table.put(&record(X, Some(me.clone()))).unwrap();
        assert_eq!(on_a.retain(X, 2000).await.unwrap(), Retention::Moved);
        table.remove(X).unwrap();
        assert_eq!(on_a.retain(X, 2000).await.unwrap(), Retention::Moved);
        // The same pause (or a record older than the field): the kill is marked here.
        for recorded in [2000, 0] {
            table.put(&paused_at(recorded)).unwrap();
            assert_eq!(on_a.retain(X, 2000).await.unwrap(), Retention::Kill);
            let now = table.get(X).unwrap().unwrap();
            assert!(now.killing && now.runs_on == Some(me.clone()));
            assert_eq!(on_a.retain(X, 2000).await.unwrap(), Retention::Moved);
        }
        assert_eq!(
            on_a.route("../x").await.unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    /// Hosts of their own: a dead host's sandbox is paused as held on it; while it is down,
    /// another host answers for it but cannot take it; once it lives again, requests go there;
    /// a restart of that host (another incarnation, the same host id) takes it back and may
    /// resume it, and the take clears the hold.
    #[tokio::test]
    async fn a_sandbox_left_on_a_hosts_disk_is_held_for_that_host() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let shared = Table::Files(table.clone());
        let on = |incarnation: u32, url: &str, host: &str| Replica {
            incarnation,
            url: url.into(),
            host: Some(host.into()),
        };
        let (a_inc, b_inc) = (store.register().unwrap(), store.register().unwrap());
        store.renew(a_inc, 1, crate::clock::now()).unwrap();
        let a = on(a_inc, "http://127.0.0.1:1", "host-a");
        let b = on(b_inc, "http://127.0.0.1:2", "host-b");
        let on_a = Replicas::new(shared.clone(), Leases::Local(store.clone()), a.clone());

        // b has no live lease: a pauses its sandbox, held on b.
        table.put(&record(X, Some(b.clone()))).unwrap();
        let Route::Paused { record: r, .. } = on_a.route(X).await.unwrap() else {
            panic!("not paused")
        };
        assert!(r.interrupted);
        assert_eq!(r.held_on, Some(b.clone()));
        // b down: a answers for it, and cannot take it.
        assert!(matches!(on_a.route(X).await.unwrap(), Route::Paused { .. }));
        assert_eq!(on_a.take(X).await.unwrap(), Claimed::Held(b.clone()));
        assert_eq!(table.get(X).unwrap().unwrap().runs_on, None);
        // Nor does a take back what is not its host's.
        assert!(!on_a.hold_again(X).await.unwrap());
        // b lives again (thawed): requests go there.
        store.renew(b_inc, 1, crate::clock::now()).unwrap();
        assert_eq!(on_a.route(X).await.unwrap(), Route::There(b.clone()));
        // b restarted on its root: another incarnation, the same host.
        let b2_inc = store.register().unwrap();
        store.renew(b2_inc, 1, crate::clock::now()).unwrap();
        let b2 = on(b2_inc, "http://127.0.0.1:3", "host-b");
        let on_b2 = Replicas::new(shared.clone(), Leases::Local(store.clone()), b2.clone());
        assert!(on_b2.hold_again(X).await.unwrap());
        assert_eq!(table.get(X).unwrap().unwrap().held_on, Some(b2.clone()));
        assert_eq!(on_a.route(X).await.unwrap(), Route::There(b2.clone()));
        assert!(matches!(
            on_b2.route(X).await.unwrap(),
            Route::Paused { .. }
        ));
        assert_eq!(on_b2.take(X).await.unwrap(), Claimed::Done);
        let taken = table.get(X).unwrap().unwrap();
        assert_eq!((taken.runs_on, taken.held_on), (Some(b2), None));
    }
}
