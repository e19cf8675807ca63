//! The contract every [`FleetStore`] keeps, as checks a store's own tests run against it (the
//! local root's, the Kubernetes API's, the loopback API's): one set of checks, so that every
//! store means the same by busy, expired, stale and newest. Each check takes fresh incarnations
//! and keys of its own, so they may share one store, empty or not.
//!
//! Time is the caller's: each check passes its own `now` values, far apart from the others',
//! so that a store judging liveness by the caller's clock (as [`FleetStore`] requires) sees
//! each check's leases as that check set them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandkeeper::{Key, SandboxId, SessionId, Snapshot, Token};

use super::{Claim, FleetStore, StoredRecord, StoredSnapshot};

/// Runs every check of the contract on `store`, whose process leases last `lease` (at least
/// two seconds: the checks step time by a second). The first failure, named.
pub async fn check_all(store: &dyn FleetStore, lease: Duration) -> Result<(), String> {
    if lease < Duration::from_secs(2) {
        return Err("the contract's checks need a lease of two seconds or more".into());
    }
    let c = Contract { store, lease };
    c.incarnations_are_unique().await?;
    c.busy_wants_and_release_with_record().await?;
    c.an_expired_or_older_epoch_owner_loses_the_key().await?;
    c.a_claim_under_a_left_epoch_takes_nothing().await?;
    c.record_writes_keep_the_newest_and_need_a_live_lease()
        .await?;
    c.a_claimant_that_ends_before_writing_leaves_the_record()
        .await?;
    Ok(())
}

struct Contract<'a> {
    store: &'a dyn FleetStore,
    lease: Duration,
}

fn key(name: &str) -> Key {
    Key::Session(SessionId::new(name).expect("a valid session name"))
}

/// The base instant of check `n`: a day apart, far past any lease.
fn base(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000 + n * 86_400)
}

fn secs(t: SystemTime, s: u64) -> SystemTime {
    t + Duration::from_secs(s)
}

fn warm(n: u64) -> StoredRecord {
    StoredRecord {
        snapshot: None,
        warm: Some(SandboxId(n)),
    }
}

macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err(format!($($why)+));
        }
    };
}

impl Contract<'_> {
    async fn register(&self) -> Result<u32, String> {
        self.store.register().await.map_err(|e| e.to_string())
    }

    async fn renew(
        &self,
        inc: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<Option<Vec<Key>>, String> {
        self.store
            .renew(inc, epoch, now)
            .await
            .map_err(|e| e.to_string())
    }

    async fn claim(&self, k: &Key, inc: u32, epoch: u64, now: SystemTime) -> Result<Claim, String> {
        self.store
            .claim(k.clone(), inc, epoch, now)
            .await
            .map_err(|e| e.to_string())
    }

    async fn claimed(
        &self,
        k: &Key,
        inc: u32,
        epoch: u64,
        now: SystemTime,
    ) -> Result<(Token, StoredRecord), String> {
        match self.claim(k, inc, epoch, now).await? {
            Claim::Claimed(token, record) => Ok((token, record)),
            Claim::Busy => Err(format!("{k} busy for {inc}/{epoch}, expected claimed")),
        }
    }

    async fn release(
        &self,
        k: &Key,
        inc: u32,
        token: Token,
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, String> {
        self.store
            .release(k.clone(), inc, token, record, now)
            .await
            .map_err(|e| e.to_string())
    }

    async fn record(
        &self,
        k: &Key,
        (inc, token, recording): (u32, Token, u64),
        record: StoredRecord,
        now: SystemTime,
    ) -> Result<bool, String> {
        self.store
            .record(k.clone(), inc, token, recording, record, now)
            .await
            .map_err(|e| e.to_string())
    }

    async fn incarnations_are_unique(&self) -> Result<(), String> {
        let a = self.register().await?;
        let b = self.register().await?;
        ensure!(
            a >= 1 && b > a,
            "incarnations {a} then {b}: each new, at least 1"
        );
        Ok(())
    }

    async fn busy_wants_and_release_with_record(&self) -> Result<(), String> {
        let t = base(1);
        let (one, two) = (self.register().await?, self.register().await?);
        let k = key("contract-busy");
        ensure!(
            self.renew(one, 1, t).await? == Some(vec![]),
            "first renewal of {one}"
        );
        self.renew(two, 1, t).await?;
        let (t1, record) = self.claimed(&k, one, 1, secs(t, 1)).await?;
        ensure!(
            record == StoredRecord::default(),
            "a new key has an empty record: {record:?}"
        );
        ensure!(
            self.claim(&k, two, 1, secs(t, 1)).await? == Claim::Busy,
            "a key held under a live lease is busy"
        );
        let wanted = self.renew(one, 1, secs(t, 1)).await?;
        ensure!(
            wanted == Some(vec![k.clone()]),
            "the owner learns the want at its renewal: {wanted:?}"
        );
        ensure!(
            self.release(&k, one, t1, warm(7), secs(t, 1)).await?,
            "the owner's release lands"
        );
        let (t2, record) = self.claimed(&k, two, 1, secs(t, 1)).await?;
        ensure!(t2 > t1, "the next owner's token {t2} is newer than {t1}");
        ensure!(
            record == warm(7),
            "the claim hands out the record: {record:?}"
        );
        ensure!(
            !self
                .release(&k, one, t1, StoredRecord::default(), secs(t, 1))
                .await?,
            "a release under an older token is refused"
        );
        // A release by the new owner leaves what it says, nothing more.
        ensure!(
            self.release(&k, two, t2, StoredRecord::default(), secs(t, 1))
                .await?,
            "released"
        );
        let (_, record) = self.claimed(&k, one, 1, secs(t, 1)).await?;
        ensure!(
            record == StoredRecord::default(),
            "a release replaces the record"
        );
        Ok(())
    }

    /// A claimant that ends (crashes, exits on an error) before its first record write loses
    /// nothing: the store kept the record it handed out, and the next owner gets it too.
    async fn a_claimant_that_ends_before_writing_leaves_the_record(&self) -> Result<(), String> {
        let t = base(5);
        let lease = self.lease.as_secs();
        let (one, two, three) = (
            self.register().await?,
            self.register().await?,
            self.register().await?,
        );
        let k = key("contract-kept-record");
        self.renew(one, 1, t).await?;
        let (token, _) = self.claimed(&k, one, 1, t).await?;
        ensure!(
            self.release(&k, one, token, warm(11), t).await?,
            "the first owner's release lands"
        );
        self.renew(two, 1, t).await?;
        let (_, record) = self.claimed(&k, two, 1, secs(t, 1)).await?;
        ensure!(record == warm(11), "handed out: {record:?}");
        // `two` ends without a write; once its lease expired, `three` claims the key.
        let later = secs(t, 1 + lease);
        self.renew(three, 1, later).await?;
        let (_, record) = self.claimed(&k, three, 1, later).await?;
        ensure!(
            record == warm(11),
            "a claimant that wrote nothing leaves the record it found: {record:?}"
        );
        Ok(())
    }

    async fn an_expired_or_older_epoch_owner_loses_the_key(&self) -> Result<(), String> {
        let t = base(2);
        let lease = self.lease.as_secs();
        let (one, two) = (self.register().await?, self.register().await?);
        let k = key("contract-expiry");
        self.renew(one, 1, t).await?;
        self.renew(two, 1, t).await?;
        self.claimed(&k, one, 1, t).await?;
        ensure!(
            self.claim(&k, two, 1, secs(t, lease - 1)).await? == Claim::Busy,
            "live until its lease ends"
        );
        self.renew(two, 1, secs(t, lease)).await?;
        self.claimed(&k, two, 1, secs(t, lease)).await?;
        // A process that comes back under a newer epoch lost what it held under the older one.
        let k2 = key("contract-epoch");
        let t = secs(t, 2 * lease);
        self.renew(one, 2, t).await?;
        self.renew(two, 1, t).await?;
        self.claimed(&k2, one, 2, t).await?;
        self.renew(one, 3, secs(t, 1)).await?;
        self.claimed(&k2, two, 1, secs(t, 1)).await?;
        ensure!(
            self.renew(one, 2, secs(t, 2)).await?.is_none(),
            "a renewal under an older epoch is refused"
        );
        Ok(())
    }

    async fn a_claim_under_a_left_epoch_takes_nothing(&self) -> Result<(), String> {
        let t = base(3);
        let one = self.register().await?;
        let k = key("contract-late-claim");
        self.renew(one, 2, t).await?;
        let (token, _) = self.claimed(&k, one, 2, t).await?;
        ensure!(
            self.record(&k, (one, token, 0), warm(3), t).await?,
            "recorded"
        );
        ensure!(
            self.claim(&k, one, 1, secs(t, 1)).await? == Claim::Busy,
            "a claim under an epoch the process has left is refused"
        );
        ensure!(
            self.release(&k, one, token, warm(3), secs(t, 1)).await?,
            "the key is still the process's under its token"
        );
        let (_, record) = self.claimed(&k, one, 2, secs(t, 1)).await?;
        ensure!(
            record == warm(3),
            "the record survived the late claim: {record:?}"
        );
        Ok(())
    }

    async fn record_writes_keep_the_newest_and_need_a_live_lease(&self) -> Result<(), String> {
        let t = base(4);
        let lease = self.lease.as_secs();
        let (one, two) = (self.register().await?, self.register().await?);
        let k = key("contract-record");
        self.renew(one, 1, t).await?;
        let (token, _) = self.claimed(&k, one, 1, t).await?;
        let snapshot = StoredRecord {
            snapshot: Some(StoredSnapshot {
                snapshot: Snapshot::new("snap-1"),
                by: SandboxId(9),
                retain_until_ms: Some(1_234),
            }),
            warm: None,
        };
        ensure!(
            self.record(&k, (one, token, 1), snapshot.clone(), t)
                .await?,
            "written"
        );
        ensure!(
            self.record(&k, (one, token, 0), warm(1), t).await?,
            "a late older write answers written"
        );
        // The owner's lease runs out: no write of it lands, though nobody claimed the key.
        ensure!(
            !self
                .record(&k, (one, token, 2), warm(2), secs(t, lease))
                .await?,
            "a write under an expired lease is refused"
        );
        ensure!(
            !self
                .release(&k, one, token, warm(2), secs(t, lease))
                .await?,
            "a release under an expired lease is refused"
        );
        self.renew(two, 1, secs(t, lease)).await?;
        let (_, record) = self.claimed(&k, two, 1, secs(t, lease)).await?;
        ensure!(
            record == snapshot,
            "the next owner gets the newest record written while the key was owned: {record:?}"
        );
        Ok(())
    }
}
