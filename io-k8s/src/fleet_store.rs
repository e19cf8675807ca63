//! The fleet store on Kubernetes: what [`StoreCommand`](sandkeeper::StoreCommand)'s docs
//! promise, in `coordination.k8s.io/v1` Leases of the namespace, each change a read and a
//! replace under the read's `resourceVersion` (a conflict reads again and decides again), so
//! every operation is atomic across processes, as the local root's compare-and-set cells (no
//! lock) make it there.
//!
//! | Lease | holds |
//! |---|---|
//! | `sandkeeper-fleet` | the last incarnation handed out (annotation `.../last-incarnation`) |
//! | `sandkeeper-fleet-proc-<incarnation>` | a process lease: `.../epoch`, `.../expires-ms` (unix ms); `spec.renewTime` and `spec.leaseDurationSeconds` mirror them for `kubectl` |
//! | `sandkeeper-fleet-key-<hash>` | a key's entry: `.../key`, `.../owner` (`<incarnation>/<epoch>`), `.../token`, `.../record` (JSON), `.../wants`, `.../recording`; labels `.../fleet-owner` and `.../fleet-wanted` let a renewal list the wanted keys of its process without reading every key |
//!
//! `<hash>` is the first 16 hex digits of SHA-256 of the key's display form (the same hash as
//! the session-hash label); the entry keeps the key itself, and a different key under the same
//! name is a typed error rather than a shared entry. Time is the caller's (the wall clock every
//! process shares), as for every [`FleetStore`]: the API server's clock is never consulted, so
//! the protocol's assumption is the processes' clocks agreeing within the fleet's margin.
//!
//! The sweep of what dead processes left in the namespace is `fleet_sweep.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ListParams, PostParams};
use kube::ResourceExt;
use sandkeeper::{Key, Token};
use sandkeeper_tokio::store::{unix_ms, KeyEntry, Swept};
use sandkeeper_tokio::store::{Claim, FleetStore, StoreFailure, StoreFuture, StoredRecord};

use crate::cluster::{calls, err, Cluster};
use crate::error::K8sError;
use crate::names::{self, MANAGED_BY, MANAGER};

/// A key's Lease as [`K8sStore::keys`] reads it: the Lease, its key, its owner (incarnation and
/// lease epoch) if any, and its record.
pub(crate) type KeyLease = (Lease, Key, Option<(u32, u64)>, StoredRecord);

const COUNTER: &str = "sandkeeper-fleet";
const A_LAST: &str = "sandkeeper.sandbox.users.io/last-incarnation";
const A_EPOCH: &str = "sandkeeper.sandbox.users.io/epoch";
const A_EXPIRES: &str = "sandkeeper.sandbox.users.io/expires-ms";
const A_KEY: &str = "sandkeeper.sandbox.users.io/key";
const A_OWNER: &str = "sandkeeper.sandbox.users.io/owner";
pub(crate) const A_TOKEN: &str = "sandkeeper.sandbox.users.io/token";
const A_RECORD: &str = "sandkeeper.sandbox.users.io/record";
const A_WANTS: &str = "sandkeeper.sandbox.users.io/wants";
const A_RECORDING: &str = "sandkeeper.sandbox.users.io/recording";
/// Which fleet object a Lease is: `counter`, `process` or `key`.
const L_FLEET: &str = "sandkeeper.sandbox.users.io/fleet";
const L_OWNER: &str = "sandkeeper.sandbox.users.io/fleet-owner";
const L_WANTED: &str = "sandkeeper.sandbox.users.io/fleet-wanted";

/// The fleet store in the cluster's namespace. Cheap to clone.
#[derive(Clone)]
pub struct K8sStore {
    cluster: Cluster,
    lease: Duration,
}

/// A key's entry, as its Lease's annotations hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Entry {
    key: String,
    owner: Option<(u32, u64)>,
    token: u64,
    record: StoredRecord,
    wants: BTreeSet<u32>,
    recording: Option<u64>,
}

impl K8sStore {
    /// The store in `cluster`'s namespace, whose process leases last `lease` after each
    /// renewal.
    pub fn new(cluster: Cluster, lease: Duration) -> Self {
        K8sStore { cluster, lease }
    }

    /// Hands this process a new incarnation.
    pub async fn register(&self) -> Result<u32, K8sError> {
        self.cluster
            .retry
            .run(|| {
                self.change(COUNTER, "counter", |lease| {
                    let last: u32 = annotation(lease, A_LAST).unwrap_or(0);
                    let next = last + 1;
                    set(lease, A_LAST, next.to_string());
                    Ok((Some(()), next))
                })
            })
            .await
    }

    /// Renews the lease of `incarnation` under `epoch` at `now`: `Some(keys)` it holds that
    /// others want, or `None` when the store has a newer epoch for it.
    pub async fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Option<Vec<Key>>, K8sError> {
        let expires = unix_ms(now) + self.lease.as_millis() as u64;
        let lease_secs = self.lease.as_secs().max(1).min(i32::MAX as u64) as i32;
        let name = proc_name(incarnation);
        let renewal = |lease: &mut Lease| {
            if annotation::<u64>(lease, A_EPOCH).is_some_and(|stored| stored > epoch) {
                return Ok((None, false));
            }
            set(lease, A_EPOCH, epoch.to_string());
            set(lease, A_EXPIRES, expires.to_string());
            label(lease, L_OWNER, Some(incarnation.to_string()));
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(format!("incarnation-{incarnation}"));
            spec.lease_duration_seconds = Some(lease_secs);
            spec.renew_time = k8s_openapi::jiff::Timestamp::try_from(now)
                .ok()
                .map(MicroTime);
            Ok((Some(()), true))
        };
        let written = self
            .cluster
            .retry
            .run(|| self.change(&name, "process", renewal))
            .await?;
        if !written {
            return Ok(None);
        }
        let selector = format!("{L_FLEET}=key,{L_OWNER}={incarnation},{L_WANTED}=yes");
        let mut wanted = vec![];
        for lease in self.list(&selector).await? {
            let entry = self.entry_of(&lease)?;
            if entry.owner == Some((incarnation, epoch)) && !entry.wants.is_empty() {
                wanted.push(parse_key(&entry.key, &lease)?);
            }
        }
        wanted.sort();
        Ok(Some(wanted))
    }

    /// Claims `key` for `(incarnation, epoch)` at `now`.
    pub async fn claim(
        &self,
        key: &Key,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Claim, K8sError> {
        if self
            .process(incarnation)
            .await?
            .is_some_and(|(current, _)| current > epoch)
        {
            // Made under a lease epoch the process has left (a claim that arrives late).
            return Ok(Claim::Busy);
        }
        // The owner's liveness is read, then the entry is written under the resourceVersion it
        // was read at: a change of the entry meanwhile conflicts and all of it is decided again.
        // (A process lease renewed between the two reads is not covered: its owner's clock
        // would then be past the margin already, and the backend's token check refuses it.)
        let name = key_name(key);
        self.cluster
            .retry
            .run(|| async {
                let Some((lease, current)) = self.read_entry(key).await? else {
                    let fresh = Entry {
                        key: key.to_string(),
                        ..Entry::default()
                    };
                    return self
                        .claim_entry(&name, None, fresh, incarnation, epoch, false)
                        .await;
                };
                let busy = match current.owner.filter(|o| o.0 != incarnation) {
                    Some(owner) => self.is_live(owner, now).await?,
                    None => false,
                };
                self.claim_entry(&name, Some(lease), current, incarnation, epoch, busy)
                    .await
            })
            .await
    }

    /// One attempt at a claim decided on `entry` as read (in `lease`, `None`: it does not
    /// exist yet): a conflict if it changed since.
    async fn claim_entry(
        &self,
        name: &str,
        lease: Option<Lease>,
        mut entry: Entry,
        incarnation: u32,
        epoch: u64,
        busy: bool,
    ) -> Result<Claim, K8sError> {
        let answer = if busy {
            if !entry.wants.insert(incarnation) {
                return Ok(Claim::Busy);
            }
            Claim::Busy
        } else {
            entry.owner = Some((incarnation, epoch));
            entry.token += 1;
            entry.wants.remove(&incarnation);
            entry.recording = None;
            // The record stays until the new owner writes a newer one (`FleetStore::claim`).
            let record = entry.record.clone();
            Claim::Claimed(Token(entry.token), record)
        };
        self.write(name, lease, &entry).await?;
        Ok(answer)
    }

    /// Writes the record of `key`, which `incarnation` keeps owning under `token`, if it still
    /// does with a live lease at `now`; a write numbered at or below one applied since the key
    /// was claimed changes nothing (and answers `true`).
    pub async fn record(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, K8sError> {
        self.owned_change(key, incarnation, token, now, |entry| {
            if entry.recording.is_some_and(|newest| newest >= recording) {
                return (false, true);
            }
            entry.recording = Some(recording);
            entry.record = record.clone();
            (true, true)
        })
        .await
    }

    /// Releases `key` from `incarnation` under `token`, leaving `record`, if it still owns it
    /// with a live lease at `now`.
    pub async fn release(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, K8sError> {
        self.owned_change(key, incarnation, token, now, |entry| {
            entry.owner = None;
            entry.record = record.clone();
            (true, true)
        })
        .await
    }

    /// Every key's entry (owner, newest token, record, wants), ordered by key: what the
    /// fleet's checks read once its processes ended, and what `kubectl get leases` shows in
    /// annotations.
    pub async fn entries(&self) -> Result<Vec<KeyEntry>, K8sError> {
        let mut out = vec![];
        for lease in self.list(&format!("{L_FLEET}=key")).await? {
            let entry = self.entry_of(&lease)?;
            out.push(KeyEntry {
                key: entry.key,
                owner: entry.owner,
                token: entry.token,
                record: entry.record,
                wants: entry.wants,
                recording: entry.recording,
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// The keys `incarnation` owns under its current lease epoch (keys it owned under an
    /// earlier epoch were fenced when that lease lapsed, and are not its own any more).
    pub async fn held_by(&self, incarnation: u32) -> Result<Vec<String>, K8sError> {
        let Some((epoch, _)) = self.process(incarnation).await? else {
            return Ok(vec![]);
        };
        Ok(self
            .entries()
            .await?
            .into_iter()
            .filter(|e| e.owner == Some((incarnation, epoch)))
            .map(|e| e.key)
            .collect())
    }

    // ------------------------------------------------------------------------------------------
    // For the sweep (`fleet_sweep.rs`)

    /// How long a process lease lasts.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// The cluster the store is in.
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Every process lease: incarnation → (epoch, expires ms).
    pub(crate) async fn processes(&self) -> Result<BTreeMap<u32, (u64, u64)>, K8sError> {
        let mut out = BTreeMap::new();
        for lease in self.list(&format!("{L_FLEET}=process")).await? {
            let inc = lease
                .labels()
                .get(L_OWNER)
                .and_then(|i| i.parse::<u32>().ok());
            match (
                inc,
                annotation(&lease, A_EPOCH),
                annotation(&lease, A_EXPIRES),
            ) {
                (Some(inc), Some(epoch), Some(expires)) => {
                    out.insert(inc, (epoch, expires));
                }
                _ => {
                    return Err(malformed(
                        &lease,
                        "a process lease without its incarnation, epoch and expiry",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Every key's Lease, key, owner and record.
    pub(crate) async fn keys(&self) -> Result<Vec<KeyLease>, K8sError> {
        let mut out = vec![];
        for lease in self.list(&format!("{L_FLEET}=key")).await? {
            let entry = self.entry_of(&lease)?;
            let key = parse_key(&entry.key, &lease)?;
            out.push((lease, key, entry.owner, entry.record));
        }
        Ok(out)
    }

    /// Drops the record's snapshot `snapshot` from the key Lease as it was read (`lease`):
    /// whether it was dropped (`false`: the key changed since, or names another snapshot now).
    pub(crate) async fn unrecord(&self, lease: Lease, snapshot: &str) -> Result<bool, K8sError> {
        let mut entry = self.entry_of(&lease)?;
        if entry.record.snapshot.as_ref().map(|s| s.snapshot.as_str()) != Some(snapshot) {
            return Ok(false);
        }
        entry.record.snapshot = None;
        let name = lease.name_any();
        match self.write(&name, Some(lease), &entry).await {
            Ok(()) => Ok(true),
            Err(K8sError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    // ------------------------------------------------------------------------------------------
    // Internals

    /// A change of the key's entry by its owner under `token` with a live lease; `f` says
    /// whether to write and what to answer.
    async fn owned_change(
        &self,
        key: &Key,
        incarnation: u32,
        token: Token,
        now: SystemTime,
        f: impl Fn(&mut Entry) -> (bool, bool),
    ) -> Result<bool, K8sError> {
        let name = key_name(key);
        self.cluster
            .retry
            .run(|| async {
                let Some((lease, mut entry)) = self.read_entry(key).await? else {
                    return Ok(false);
                };
                let live = match entry.owner {
                    Some(owner) if owner.0 == incarnation && entry.token == token.0 => {
                        self.is_live(owner, now).await?
                    }
                    _ => false,
                };
                if !live {
                    return Ok(false);
                }
                let (write, answer) = f(&mut entry);
                if write {
                    self.write(&name, Some(lease), &entry).await?;
                }
                Ok(answer)
            })
            .await
    }

    /// Whether `(incarnation, epoch)` holds a live lease at `now`.
    pub async fn is_live(&self, owner: (u32, u64), now: SystemTime) -> Result<bool, K8sError> {
        Ok(self
            .process(owner.0)
            .await?
            .is_some_and(|(epoch, expires)| epoch == owner.1 && unix_ms(now) < expires))
    }

    /// Whether `incarnation` holds a live lease at `now`, whatever its epoch: a server of a
    /// fleet asks it of the others' incarnations.
    pub async fn holds_lease(&self, incarnation: u32, now: SystemTime) -> Result<bool, K8sError> {
        Ok(self
            .process(incarnation)
            .await?
            .is_some_and(|(_, expires)| unix_ms(now) < expires))
    }

    /// A process lease: `(epoch, expires ms)`.
    async fn process(&self, incarnation: u32) -> Result<Option<(u64, u64)>, K8sError> {
        let Some(lease) = self.get(&proc_name(incarnation)).await? else {
            return Ok(None);
        };
        match (annotation(&lease, A_EPOCH), annotation(&lease, A_EXPIRES)) {
            (Some(epoch), Some(expires)) => Ok(Some((epoch, expires))),
            _ => Err(malformed(
                &lease,
                "a process lease without its epoch and expiry",
            )),
        }
    }

    /// The Lease of `key` and its entry, if it exists.
    async fn read_entry(&self, key: &Key) -> Result<Option<(Lease, Entry)>, K8sError> {
        let Some(lease) = self.get(&key_name(key)).await? else {
            return Ok(None);
        };
        let entry = self.entry_of(&lease)?;
        self.same_key(&entry, key, &lease)?;
        Ok(Some((lease, entry)))
    }

    /// Writes `entry` into its Lease: a replace under the resourceVersion `lease` was read at,
    /// or a create when it did not exist (a conflict either way when another writer came first).
    async fn write(&self, name: &str, lease: Option<Lease>, entry: &Entry) -> Result<(), K8sError> {
        let exists = lease.is_some();
        let mut lease = lease.unwrap_or_else(|| self.fresh(name, "key"));
        write_entry(&mut lease, entry);
        self.put(name, exists, &lease).await
    }

    fn same_key(&self, entry: &Entry, key: &Key, lease: &Lease) -> Result<(), K8sError> {
        if entry.key != key.to_string() {
            return Err(malformed(
                lease,
                &format!("holds key {:?}, not {key} (a hash collision)", entry.key),
            ));
        }
        Ok(())
    }

    fn entry_of(&self, lease: &Lease) -> Result<Entry, K8sError> {
        let key: String = annotation(lease, A_KEY).ok_or_else(|| malformed(lease, "no key"))?;
        let owner = match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(A_OWNER))
        {
            Some(text) => Some(parse_owner(text).ok_or_else(|| malformed(lease, "bad owner"))?),
            None => None,
        };
        let record = match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(A_RECORD))
        {
            Some(text) => {
                serde_json::from_str(text).map_err(|e| malformed(lease, &e.to_string()))?
            }
            None => StoredRecord::default(),
        };
        let wants = match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(A_WANTS))
        {
            Some(text) if !text.is_empty() => text
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| malformed(lease, "bad wants"))?,
            _ => BTreeSet::new(),
        };
        Ok(Entry {
            key,
            owner,
            token: annotation(lease, A_TOKEN).unwrap_or(0),
            record,
            wants,
            recording: annotation(lease, A_RECORDING),
        })
    }

    /// One attempt at a change of the Lease `name` (a fresh one of kind `kind` when missing):
    /// `f` changes it and says whether to write; the write is a create, or a replace under the
    /// read's resourceVersion, and a concurrent writer makes it a conflict (the caller's retry
    /// runs all of it again).
    async fn change<T>(
        &self,
        name: &str,
        kind: &str,
        f: impl Fn(&mut Lease) -> Result<(Option<()>, T), K8sError>,
    ) -> Result<T, K8sError> {
        let current = self.get(name).await?;
        let exists = current.is_some();
        let mut lease = current.unwrap_or_else(|| self.fresh(name, kind));
        let (write, answer) = f(&mut lease)?;
        if write.is_some() {
            self.put(name, exists, &lease).await?;
        }
        Ok(answer)
    }

    /// Creates or replaces (under its resourceVersion) the Lease, once.
    async fn put(&self, name: &str, exists: bool, lease: &Lease) -> Result<(), K8sError> {
        let what = format!("lease {name}");
        let api = self.cluster.leases();
        if exists {
            api.replace(name, &PostParams::default(), lease)
                .await
                .map(|_| ())
                .map_err(|e| err(e, calls::UPDATE_LEASE, &what))
        } else {
            api.create(&PostParams::default(), lease)
                .await
                .map(|_| ())
                .map_err(|e| err(e, calls::CREATE_LEASE, &what))
        }
    }

    async fn get(&self, name: &str) -> Result<Option<Lease>, K8sError> {
        let what = format!("lease {name}");
        self.cluster
            .retry
            .run(|| async {
                self.cluster
                    .leases()
                    .get_opt(name)
                    .await
                    .map_err(|e| err(e, calls::GET_LEASE, &what))
            })
            .await
    }

    async fn list(&self, selector: &str) -> Result<Vec<Lease>, K8sError> {
        let lp = ListParams::default().labels(selector);
        self.cluster
            .retry
            .run(|| async {
                self.cluster
                    .leases()
                    .list(&lp)
                    .await
                    .map(|l| l.items)
                    .map_err(|e| err(e, calls::LIST_LEASES, "fleet leases"))
            })
            .await
    }

    fn fresh(&self, name: &str, kind: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.cluster.config.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_string(), MANAGER.to_string()),
                    (L_FLEET.to_string(), kind.to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(LeaseSpec::default()),
        }
    }
}

impl FleetStore for K8sStore {
    fn register(&self) -> StoreFuture<u32> {
        let store = self.clone();
        Box::pin(async move { K8sStore::register(&store).await.map_err(failure) })
    }

    fn renew(
        &self,
        incarnation: u32,
        epoch: u64,
        now: SystemTime,
    ) -> StoreFuture<Option<Vec<Key>>> {
        let store = self.clone();
        Box::pin(async move {
            K8sStore::renew(&store, incarnation, epoch, now)
                .await
                .map_err(failure)
        })
    }

    fn claim(&self, key: Key, incarnation: u32, epoch: u64, now: SystemTime) -> StoreFuture<Claim> {
        let store = self.clone();
        Box::pin(async move {
            K8sStore::claim(&store, &key, incarnation, epoch, now)
                .await
                .map_err(failure)
        })
    }

    fn record(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        recording: u64,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        Box::pin(async move {
            K8sStore::record(&store, &key, incarnation, token, recording, record, now)
                .await
                .map_err(failure)
        })
    }

    fn sweep(&self, now: SystemTime) -> StoreFuture<Swept> {
        let store = self.clone();
        Box::pin(async move { K8sStore::sweep(&store, now).await.map_err(failure) })
    }

    fn release(
        &self,
        key: Key,
        incarnation: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> StoreFuture<bool> {
        let store = self.clone();
        Box::pin(async move {
            K8sStore::release(&store, &key, incarnation, token, record, now)
                .await
                .map_err(failure)
        })
    }
}

fn failure(e: K8sError) -> StoreFailure {
    StoreFailure(e.to_string())
}

fn proc_name(incarnation: u32) -> String {
    format!("sandkeeper-fleet-proc-{incarnation}")
}

fn key_name(key: &Key) -> String {
    key_lease_name(&key.to_string())
}

/// The name of the Lease of a key (by its display form).
pub(crate) fn key_lease_name(key: &str) -> String {
    format!("sandkeeper-fleet-key-{}", names::session_hash(key))
}

fn annotation<T: std::str::FromStr>(lease: &Lease, name: &str) -> Option<T> {
    lease.metadata.annotations.as_ref()?.get(name)?.parse().ok()
}

fn set(lease: &mut Lease, name: &str, value: String) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(name.to_string(), value);
}

fn unset(lease: &mut Lease, name: &str) {
    if let Some(a) = lease.metadata.annotations.as_mut() {
        a.remove(name);
    }
}

fn label(lease: &mut Lease, name: &str, value: Option<String>) {
    let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
    match value {
        Some(value) => labels.insert(name.to_string(), value),
        None => labels.remove(name),
    };
}

/// The entry into its Lease's annotations and labels.
fn write_entry(lease: &mut Lease, entry: &Entry) {
    set(lease, A_KEY, entry.key.clone());
    match entry.owner {
        Some((inc, epoch)) => set(lease, A_OWNER, format!("{inc}/{epoch}")),
        None => unset(lease, A_OWNER),
    }
    set(lease, A_TOKEN, entry.token.to_string());
    let record = serde_json::to_string(&entry.record).expect("a record serialises");
    set(lease, A_RECORD, record);
    let wants: Vec<String> = entry.wants.iter().map(u32::to_string).collect();
    set(lease, A_WANTS, wants.join(","));
    match entry.recording {
        Some(n) => set(lease, A_RECORDING, n.to_string()),
        None => unset(lease, A_RECORDING),
    }
    label(lease, L_OWNER, entry.owner.map(|o| o.0.to_string()));
    label(
        lease,
        L_WANTED,
        (!entry.wants.is_empty()).then(|| "yes".to_string()),
    );
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = entry.owner.map(|(inc, _)| format!("incarnation-{inc}"));
    spec.lease_transitions = Some(entry.token.min(i32::MAX as u64) as i32);
}

fn parse_owner(text: &str) -> Option<(u32, u64)> {
    let (inc, epoch) = text.split_once('/')?;
    Some((inc.parse().ok()?, epoch.parse().ok()?))
}

fn parse_key(text: &str, lease: &Lease) -> Result<Key, K8sError> {
    Key::try_from(text.to_string()).map_err(|e| malformed(lease, &format!("key {text:?}: {e}")))
}

fn malformed(lease: &Lease, why: &str) -> K8sError {
    K8sError::FleetLease {
        lease: lease.metadata.name.clone().unwrap_or_default(),
        why: why.to_string(),
    }
}
