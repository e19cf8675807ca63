//! Fleet mode's fencing on Kubernetes: the newest token a sandbox has seen is recorded on the
//! object whose deletion ends it (the claim in agent-sandbox mode, the pod in pod mode), in the
//! annotation `sandkeeper.sandbox.users.io/token`, compared and raised by a read and a merge
//! patch carrying the read's `resourceVersion` (a precondition: a conflict reads again), right
//! before the change it admits. A start is checked against its key's newest token, which the fleet store keeps on
//! the key's Lease (`fleet_store.rs`): a stale owner cannot start a second sandbox for a key
//! whose next owner has claimed it.
//!
//! Not atomic with the change itself (no Kubernetes write is conditional on another object):
//! a change admitted just before a newer owner raises the token can still land. The newer owner
//! raises it before its own first change, so at most the one change in flight when ownership
//! moved lands, never a later one. A command without a token (no fleet) is not checked and
//! costs nothing.

use std::fmt::Debug;

use crate::error::Call;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use sandkeeper::Token;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cluster::{calls, err, Cluster};
use crate::config::Mode;
use crate::error::K8sError;

/// The annotation of the newest token an object has seen.
pub(crate) const TOKEN: &str = "sandkeeper.sandbox.users.io/token";

/// Whether a token check records a newer token as the object's newest.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Raise {
    Yes,
    No,
}

impl Cluster {
    /// Admits a change of the sandbox whose object is `object` under `token`: refused
    /// ([`K8sError::Fenced`]) when the object has seen a newer one, else recorded as the
    /// newest when it is newer. `None`: nothing to check. An object that is gone admits the
    /// change (the change then finds it gone).
    pub(crate) async fn admit(&self, object: &str, token: Option<Token>) -> Result<(), K8sError> {
        let Some(Token(token)) = token else {
            return Ok(());
        };
        self.token_of(object, token, Raise::Yes).await
    }

    /// Checks the application's own change of the sandbox whose object is `object` (a write,
    /// a removal, a command's start: `work.rs`) under `token`, the token this process holds
    /// the sandbox under: refused ([`K8sError::Fenced`]) when the object has seen a newer one
    /// (another process adopted the sandbox). One GET; nothing is recorded. An object that is
    /// gone passes (the change then finds it gone).
    pub(crate) async fn check_token(&self, object: &str, token: Token) -> Result<(), K8sError> {
        self.token_of(object, token.0, Raise::No).await
    }

    async fn token_of(&self, object: &str, token: u64, raise: Raise) -> Result<(), K8sError> {
        match &self.config.mode {
            Mode::AgentSandbox { .. } => {
                let calls = (calls::GET_CLAIM, calls::PATCH_CLAIM);
                self.admit_on(self.claims(), calls, object, token, raise)
                    .await
            }
            Mode::Pod { .. } => {
                let calls = (calls::GET_POD, calls::PATCH_POD);
                self.admit_on(self.pods(), calls, object, token, raise)
                    .await
            }
        }
    }

    /// Checks a start of `key`'s new sandbox under `token` against the newest token the fleet
    /// store handed out for the key.
    pub(crate) async fn admit_start(
        &self,
        key: &str,
        token: Option<Token>,
    ) -> Result<(), K8sError> {
        let Some(Token(token)) = token else {
            return Ok(());
        };
        let name = crate::fleet_store::key_lease_name(key);
        let what = format!("lease {name}");
        let lease = self
            .retry
            .run(|| async {
                self.leases()
                    .get_opt(&name)
                    .await
                    .map_err(|e| err(e, calls::GET_LEASE, &what))
            })
            .await?;
        let newest = lease
            .as_ref()
            .and_then(|l| l.annotations().get(crate::fleet_store::A_TOKEN))
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0);
        if token < newest {
            return Err(K8sError::Fenced {
                object: name,
                token,
                newest,
            });
        }
        Ok(())
    }

    async fn admit_on<K>(
        &self,
        api: Api<K>,
        (get, patch): (Call, Call),
        object: &str,
        token: u64,
        raise: Raise,
    ) -> Result<(), K8sError>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    {
        let what = format!("{object} (its token)");
        self.retry
            .run(|| async {
                let Some(current) = api.get_opt(object).await.map_err(|e| err(e, get, &what))?
                else {
                    return Ok(());
                };
                let newest = current
                    .annotations()
                    .get(TOKEN)
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or(0);
                if token < newest {
                    return Err(K8sError::Fenced {
                        object: object.to_string(),
                        token,
                        newest,
                    });
                }
                if token == newest || raise == Raise::No {
                    return Ok(());
                }
                // The read's resourceVersion makes the patch conditional on it.
                let body = serde_json::json!({"metadata": {
                    "resourceVersion": current.resource_version(),
                    "annotations": {TOKEN: token.to_string()},
                }});
                api.patch(object, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .map(|_| ())
                    .map_err(|e| err(e, patch, &what))
            })
            .await
    }
}
