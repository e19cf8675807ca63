//! Replicas: several servers on one root (`--fleet`), any of which answers for any sandbox.
//!
//! The root's sandbox table ([`crate::durable`]) says where each sandbox runs; the root's fleet
//! store says which replicas live (each holds a lease under its incarnation) and which one's
//! keeper drives a sandbox's key, so no two act on one sandbox. A request for a sandbox this
//! replica does not run is routed ([`Replicas::route`]):
//!
//! - it runs on another live replica: the request is forwarded there ([`crate::forward`]);
//! - it is paused: this replica answers, and a connect or resume takes it under the table's
//!   lock ([`Replicas::take`]); the keeper's claim of its key then has the replica that paused
//!   it hand the kept workspace over at its next lease renewal;
//! - its replica is dead (no live lease, or it had this replica's own address): the sandbox
//!   is paused in the table as interrupted (under the lock, if the record still names that
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
//! Not shared: each replica counts its own running sandboxes against a team's limit and its
//! own request rate, and a signed `/files` URL (which names no sandbox) is answered only by
//! the replica that runs the sandbox.

use std::io;

use sandkeeper_tokio::local::store::LocalStore;

use crate::durable::{Durable, Record, Replica};

/// This replica, the root's table and store.
#[derive(Clone, Debug)]
pub struct Replicas {
    /// The table.
    pub table: Durable,
    /// This replica.
    pub me: Replica,
    store: LocalStore,
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

/// What [`Replicas::take`] and [`Replicas::forget`] found under the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The sandbox was paused, and the change was made.
    Done,
    /// It runs on that replica (taken by it meanwhile).
    RunsOn(Replica),
    /// It has no record (killed meanwhile).
    Gone,
}

impl Replicas {
    /// The replicas of the table `table` and the fleet store `store`, as `me`.
    pub fn new(table: Durable, store: LocalStore, me: Replica) -> Self {
        Replicas { table, me, store }
    }

    /// Whether `replica` lives: it holds a lease in the store (this one does). A store that
    /// cannot be read counts as alive: nothing is taken over on a guess.
    pub fn lives(&self, replica: &Replica) -> bool {
        if replica == &self.me {
            return true;
        }
        self.store
            .holds_lease(replica.incarnation, crate::clock::now())
            .unwrap_or(true)
    }

    /// Where a request for `id` (not running on this replica) goes. Blocking: it reads the
    /// table and the store. A sandbox whose replica is dead is paused in the table here.
    pub fn route(&self, id: &str) -> io::Result<Route> {
        // A record that changed between the read and the lock is read again: each change is
        // one replica's step, so a few reads settle.
        for _ in 0..8 {
            let Some(record) = self.table.get(id)? else {
                return Ok(Route::Unknown);
            };
            let dead = match &record.runs_on {
                None => {
                    return Ok(Route::Paused {
                        record,
                        orphaned: false,
                    })
                }
                Some(r) if r == &self.me => return Ok(Route::Mine),
                Some(r) if self.lives(r) && r.url == self.me.url => {
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
                Some(r) if self.lives(r) => return Ok(Route::There(r.clone())),
                Some(dead) => dead.clone(),
            };
            let taken = self.table.locked(|table| match table.get(id)? {
                Some(mut now) if now.runs_on.as_ref() == Some(&dead) => {
                    if now.killing {
                        now.runs_on = Some(self.me.clone());
                    } else {
                        now.runs_on = None;
                        now.interrupted = true;
                        now.paused_ms = crate::clock::unix_ms(crate::clock::now());
                    }
                    table.put(&now)?;
                    Ok(Some(now))
                }
                _ => Ok(None),
            })?;
            match taken {
                Some(record) if record.killing => {
                    tracing::info!(sandbox = %id, replica = %dead.url, incarnation = dead.incarnation, "the sandbox's replica is gone in the middle of its kill: finishing it here");
                    return Ok(Route::Killing(record));
                }
                Some(record) => {
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
    /// here. Blocking.
    pub fn take(&self, id: &str) -> io::Result<Claimed> {
        self.table.locked(|table| match table.get(id)? {
            None => Ok(Claimed::Gone),
            Some(record) if record.killing && record.runs_on.as_ref() == Some(&self.me) => {
                Ok(Claimed::Gone)
            }
            Some(mut record) => match &record.runs_on {
                Some(r) if r != &self.me => Ok(Claimed::RunsOn(r.clone())),
                _ => {
                    record.runs_on = Some(self.me.clone());
                    table.put(&record)?;
                    Ok(Claimed::Done)
                }
            },
        })
    }

    /// Replaces the record of a sandbox running here with `record` (its new end), if the
    /// table still says it runs here: a late write never undoes a pause or a kill. Blocking.
    pub fn refresh(&self, record: &Record) -> io::Result<bool> {
        self.table.locked(|table| match table.get(&record.id)? {
            Some(now) if now.runs_on.as_ref() == Some(&self.me) && !now.killing => {
                table.put(record)?;
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    /// Writes `record` (paused) if the table says its sandbox is paused or runs here (a pause
    /// here): never over another replica's, which took it while this one lost its lease.
    /// Blocking.
    pub fn pause(&self, record: &Record) -> io::Result<Claimed> {
        self.table.locked(|table| match table.get(&record.id)? {
            None => Ok(Claimed::Gone),
            Some(now) if now.killing => Ok(Claimed::Gone),
            Some(now) => match &now.runs_on {
                Some(r) if r != &self.me => Ok(Claimed::RunsOn(r.clone())),
                _ => table.put(record).map(|()| Claimed::Done),
            },
        })
    }

    /// Marks the sandbox `id` as being killed here if it is paused or runs here (a kill,
    /// before the keeper acts): its record says so until [`forget`](Self::forget) removes it,
    /// once the keeper deleted the sandbox, and a replica dying in between leaves the kill to
    /// the others. Blocking.
    pub fn kill(&self, id: &str) -> io::Result<Claimed> {
        self.table.locked(|table| match table.get(id)? {
            None => Ok(Claimed::Gone),
            Some(mut record) => match &record.runs_on {
                Some(r) if r != &self.me => Ok(Claimed::RunsOn(r.clone())),
                _ => {
                    record.runs_on = Some(self.me.clone());
                    record.killing = true;
                    table.put(&record)?;
                    Ok(Claimed::Done)
                }
            },
        })
    }

    /// The retention of the sandbox `id`, paused at `paused_ms` (Unix milliseconds), ran
    /// out: if it is still paused since then (or its record, older than the field, says no
    /// time), it is marked as being killed here ([`kill`](Self::kill)). Blocking.
    pub fn retain(&self, id: &str, paused_ms: u64) -> io::Result<Retention> {
        self.table.locked(|table| match table.get(id)? {
            Some(mut record) if record.runs_on.is_none() => {
                if record.paused_ms != paused_ms && record.paused_ms != 0 {
                    return Ok(Retention::PausedSince(record.paused_ms));
                }
                record.runs_on = Some(self.me.clone());
                record.killing = true;
                table.put(&record)?;
                Ok(Retention::Kill)
            }
            _ => Ok(Retention::Moved),
        })
    }

    /// Every record whose replica died (the sweep's work, [`route`](Self::route) each), and
    /// every paused one: the table as this replica should see it. Blocking.
    pub fn sweep(&self) -> io::Result<Vec<Record>> {
        let mut lives = std::collections::HashMap::new();
        let mut out = Vec::new();
        for record in self.table.load()? {
            let keep = match &record.runs_on {
                None => true,
                Some(replica) => !*lives
                    .entry((replica.incarnation, replica.url.clone()))
                    .or_insert_with(|| self.lives(replica)),
            };
            if keep {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Removes the record of `id` if it is paused or runs here (a kill, once the keeper
    /// deleted the sandbox). Blocking.
    pub fn forget(&self, id: &str) -> io::Result<Claimed> {
        self.table.locked(|table| match table.get(id)? {
            None => Ok(Claimed::Gone),
            Some(record) => match &record.runs_on {
                Some(r) if r != &self.me => Ok(Claimed::RunsOn(r.clone())),
                _ => table.remove(id).map(|()| Claimed::Done),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        }
    }

    const X: &str = "sbx0123456789abcdef0123";

    #[test]
    fn a_sandbox_is_routed_to_its_live_replica_taken_once_and_paused_when_its_replica_died() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let (a_inc, b_inc) = (store.register().unwrap(), store.register().unwrap());
        store.renew(a_inc, 1, crate::clock::now()).unwrap();
        store.renew(b_inc, 1, crate::clock::now()).unwrap();
        let a = Replica {
            incarnation: a_inc,
            url: "http://127.0.0.1:1".into(),
        };
        let b = Replica {
            incarnation: b_inc,
            url: "http://127.0.0.1:2".into(),
        };
        let on_a = Replicas::new(table.clone(), store.clone(), a.clone());
        let on_b = Replicas::new(table.clone(), store.clone(), b.clone());

        assert_eq!(on_b.route(X).unwrap(), Route::Unknown);
        table.put(&record(X, Some(a.clone()))).unwrap();
        assert_eq!(on_b.route(X).unwrap(), Route::There(a.clone()));
        assert_eq!(on_a.route(X).unwrap(), Route::Mine);
        // Running on a: b can neither take nor forget it.
        assert_eq!(on_b.take(X).unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_b.forget(X).unwrap(), Claimed::RunsOn(a.clone()));
        // A's new end is written while it runs there, never over a pause.
        let mut longer = record(X, Some(a.clone()));
        longer.end_ms = 99;
        assert!(on_a.refresh(&longer).unwrap());
        assert_eq!(table.get(X).unwrap().unwrap().end_ms, 99);
        assert!(!on_b.refresh(&longer).unwrap());
        // Nor can b record it paused.
        assert_eq!(
            on_b.pause(&record(X, None)).unwrap(),
            Claimed::RunsOn(a.clone())
        );
        // Paused: both answer for it; the first to take it has it, the other is sent there.
        table.put(&record(X, None)).unwrap();
        assert!(!on_a.refresh(&longer).unwrap());
        assert_eq!(table.get(X).unwrap().unwrap().runs_on, None);
        assert!(matches!(
            on_b.route(X).unwrap(),
            Route::Paused {
                orphaned: false,
                ..
            }
        ));
        assert_eq!(on_b.take(X).unwrap(), Claimed::Done);
        assert_eq!(on_a.take(X).unwrap(), Claimed::RunsOn(b.clone()));
        assert_eq!(on_a.route(X).unwrap(), Route::There(b.clone()));
        // b's lease ends: its sandbox is paused in the table, for any replica to continue.
        let dead = Replica {
            incarnation: 999,
            ..b.clone()
        };
        table.put(&record(X, Some(dead))).unwrap();
        let c = Replicas::new(
            table.clone(),
            store,
            Replica {
                incarnation: 7,
                url: "http://127.0.0.1:3".into(),
            },
        );
        let Route::Paused {
            record: r,
            orphaned,
        } = c.route(X).unwrap()
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
                }),
            ))
            .unwrap();
        let busy = on_a.route(X).unwrap_err();
        assert!(busy.to_string().contains("--advertise"), "{busy}");
        assert_eq!(
            on_a.take(X).unwrap(),
            Claimed::RunsOn(Replica {
                incarnation: b_inc,
                url: a.url.clone()
            })
        );
        table
            .put(&record(
                X,
                Some(Replica {
                    incarnation: a_inc + 100,
                    url: a.url.clone(),
                }),
            ))
            .unwrap();
        assert!(matches!(
            on_a.route(X).unwrap(),
            Route::Paused { orphaned: true, .. }
        ));
        assert_eq!(on_a.forget(X).unwrap(), Claimed::Done);
        assert_eq!(on_a.route(X).unwrap(), Route::Unknown);
        assert_eq!(on_a.forget(X).unwrap(), Claimed::Gone);
        assert!(on_a.route("../etc").is_err());
    }

    #[test]
    fn a_kill_is_marked_until_forgotten_and_a_dead_replicas_kill_is_taken_over() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let a_inc = store.register().unwrap();
        store.renew(a_inc, 1, crate::clock::now()).unwrap();
        let a = Replica {
            incarnation: a_inc,
            url: "http://127.0.0.1:1".into(),
        };
        let on_a = Replicas::new(table.clone(), store.clone(), a.clone());
        let on_b = Replicas::new(
            table.clone(),
            store,
            Replica {
                incarnation: 77,
                url: "http://127.0.0.1:2".into(),
            },
        );
        // Paused, then being killed on a: neither taken, paused nor refreshed meanwhile.
        table.put(&record(X, None)).unwrap();
        assert_eq!(on_a.kill(X).unwrap(), Claimed::Done);
        let marked = table.get(X).unwrap().unwrap();
        assert!(marked.killing && marked.runs_on == Some(a.clone()));
        assert_eq!(on_a.take(X).unwrap(), Claimed::Gone);
        assert_eq!(on_b.take(X).unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_a.pause(&record(X, None)).unwrap(), Claimed::Gone);
        assert!(!on_a.refresh(&record(X, Some(a.clone()))).unwrap());
        assert_eq!(on_b.kill(X).unwrap(), Claimed::RunsOn(a.clone()));
        assert_eq!(on_b.route(X).unwrap(), Route::There(a.clone()));
        // A live replica's kill is not in b's sweep; a dead one's is, and b takes it over.
        assert!(on_b.sweep().unwrap().is_empty());
        let dead = Replica {
            incarnation: 999,
            url: "http://127.0.0.1:9".into(),
        };
        table
            .put(&Record {
                runs_on: Some(dead),
                ..marked.clone()
            })
            .unwrap();
        assert_eq!(on_b.sweep().unwrap().len(), 1);
        let Route::Killing(taken) = on_b.route(X).unwrap() else {
            panic!("a dead replica's kill not taken over")
        };
        assert_eq!(taken.runs_on, Some(on_b.me.clone()));
        assert_eq!(table.get(X).unwrap().unwrap(), taken);
        assert_eq!(on_b.forget(X).unwrap(), Claimed::Done);
        assert_eq!(table.get(X).unwrap(), None);
    }

    #[test]
    fn a_retention_ends_only_the_pause_it_counted_from() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path(), Duration::from_secs(15)).unwrap();
        let table = Durable::open(root.path()).unwrap();
        let me = Replica {
            incarnation: 5,
            url: "http://127.0.0.1:1".into(),
        };
        let on_a = Replicas::new(table.clone(), store, me.clone());
        let paused_at = |ms| Record {
            paused_ms: ms,
            ..record(X, None)
        };
        // Paused again since: counted from then, nothing changed.
        table.put(&paused_at(2000)).unwrap();
        assert_eq!(on_a.retain(X, 1000).unwrap(), Retention::PausedSince(2000));
        assert_eq!(table.get(X).unwrap().unwrap(), paused_at(2000));
        // Running somewhere, or gone: nothing to do.
        table.put(&record(X, Some(me.clone()))).unwrap();
        assert_eq!(on_a.retain(X, 2000).unwrap(), Retention::Moved);
        table.remove(X).unwrap();
        assert_eq!(on_a.retain(X, 2000).unwrap(), Retention::Moved);
        // The same pause (or a record older than the field): the kill is marked here.
        for recorded in [2000, 0] {
            table.put(&paused_at(recorded)).unwrap();
            assert_eq!(on_a.retain(X, 2000).unwrap(), Retention::Kill);
            let now = table.get(X).unwrap().unwrap();
            assert!(now.killing && now.runs_on == Some(me.clone()));
            assert_eq!(on_a.retain(X, 2000).unwrap(), Retention::Moved);
        }
        assert_eq!(
            on_a.route("../x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
