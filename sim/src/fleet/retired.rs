//! `fenced-token-retired`: a token a replica held is dead to it once its key was fenced there
//! (`Event::KeyFenced`) or once its lease epoch moved on (the lease lapsed): nothing it orders
//! afterwards, neither a sandbox command nor a record write or release, carries that token for
//! that key. Fail closed means exactly this; the lapse alone must be enough, whether or not the
//! core says it fenced.
//!
//! Kept per incarnation, from what the world sees pass between the core and its driver: the
//! claims it ordered (and the epoch of each), the tokens their answers granted, the keys of the
//! sandboxes it started or adopted, the fences it reported and the epochs its renewals carry.

use std::collections::BTreeMap;

use sandkeeper::{ClaimId, Command, Key, SandboxId, StoreCommand, Token};

/// Why a token was retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// The core reported the key fenced.
    Fenced,
    /// The lease epoch the token was claimed under ended.
    Lapsed,
}

/// One incarnation's tokens: held and retired.
#[derive(Clone, Debug, Default)]
pub(super) struct Retired {
    /// The lease epoch of every claim ordered, by number.
    claims: BTreeMap<ClaimId, u64>,
    /// Tokens granted by claims, with the epoch of the claim that got each.
    held: BTreeMap<(Key, Token), u64>,
    /// Tokens the process may no longer order anything under, by key.
    retired: BTreeMap<Key, BTreeMap<Token, Why>>,
    /// The key of every sandbox the process started or adopted.
    keys: BTreeMap<SandboxId, Key>,
}

impl Retired {
    /// A claim answer granted `token` for `key`.
    pub(super) fn claimed(&mut self, claim: ClaimId, key: &Key, token: Token) {
        if let Some(epoch) = self.claims.get(&claim) {
            self.held.insert((key.clone(), token), *epoch);
        }
    }

    /// The core reported `key`, owned under `token`, fenced.
    pub(super) fn fenced(&mut self, key: Key, token: Token) {
        self.held.remove(&(key.clone(), token));
        self.retired
            .entry(key)
            .or_default()
            .insert(token, Why::Fenced);
    }

    /// The process renews under `epoch` now: every token claimed under an older one is dead.
    pub(super) fn epoch_moved(&mut self, epoch: u64) {
        let old: Vec<(Key, Token)> = self
            .held
            .iter()
            .filter(|(_, claimed)| **claimed < epoch)
            .map(|(k, _)| k.clone())
            .collect();
        for (key, token) in old {
            self.held.remove(&(key.clone(), token));
            let tokens = self.retired.entry(key).or_default();
            tokens.entry(token).or_insert(Why::Lapsed);
        }
    }

    /// The process ordered store work: a claim is noted, a record write or release checked.
    pub(super) fn store_ordered(&mut self, cmd: &StoreCommand) -> Result<(), String> {
        match cmd {
            StoreCommand::Claim { claim, epoch, .. } => {
                self.claims.insert(*claim, *epoch);
                Ok(())
            }
            StoreCommand::Record { key, token, .. } | StoreCommand::Release { key, token, .. } => {
                self.judge(key, *token, || format!("{cmd:?}"))
            }
            StoreCommand::Renew { .. } => Ok(()),
        }
    }

    /// The process ordered a sandbox command: checked when it carries a token.
    pub(super) fn ordered(&mut self, cmd: &Command) -> Result<(), String> {
        if let Command::Start { sandbox, key, .. } | Command::Adopt { sandbox, key, .. } = cmd {
            self.keys.insert(*sandbox, key.clone());
        }
        let (Some(token), Some(key)) = (cmd.token(), self.keys.get(&cmd.sandbox())) else {
            return Ok(());
        };
        self.judge(key, token, || format!("{cmd:?}"))
    }

    fn judge(&self, key: &Key, token: Token, what: impl Fn() -> String) -> Result<(), String> {
        match self.retired.get(key).and_then(|tokens| tokens.get(&token)) {
            None => Ok(()),
            Some(Why::Fenced) => Err(format!(
                "ordered {} under {token} of {key}, after it reported the key fenced",
                what()
            )),
            Some(Why::Lapsed) => Err(format!(
                "ordered {} under {token} of {key}, claimed under a lease epoch that lapsed",
                what()
            )),
        }
    }
}
