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
//!
//! The application's own changes in a pod (`work.rs`) are checked against the annotation too
//! ([`Cluster::check_token`], nothing recorded), and again in the pod, in the exec that makes
//! the change ([`GUARD`]), against the token file `<workdir>/.sandkeeper/token` that an
//! adopter, or a start resuming a suspended claim, writes ([`Cluster::raise_pod_token`])
//! before its first read or change: that check is made when the change runs, however long
//! its process paused after the API check. The keeper's own commands (uploads, stops,
//! shutdowns) are checked at the API only.

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

/// The exit status of a change the pod itself refused (the guard's or the raise's), with
/// [`FENCED_MARK`] leading its standard error.
pub(crate) const FENCED_EXIT: i32 = 86;

/// What leads the standard error of a change the pod refused: `sandkeeper-fenced: <newest>`.
pub(crate) const FENCED_MARK: &str = "sandkeeper-fenced: ";

/// POSIX `sh` that runs a fleet change in the same exec as its check: `$1` the pod's token
/// file, `$2` the token this process holds the sandbox under, the change's argv after. The
/// change runs (`exec`, the same process) only if the file holds no newer token; a missing,
/// empty or garbled file holds none (the object's annotation was checked before).
pub(crate) const GUARD: &str = r#"f=$1 n=$2; shift 2; t=0; if [ -r "$f" ]; then read -r t < "$f" || :; fi; case $t in ''|*[!0-9]*) t=0;; esac; if [ "$t" -gt "$n" ]; then echo "sandkeeper-fenced: $t" >&2; exit 86; fi; exec "$@""#;

/// POSIX `sh` an adopter runs in the pod: raises the token file `$1` to `$2` (written whole:
/// a temporary renamed over it), refused as [`GUARD`] refuses when it holds a newer one.
const RAISE: &str = r#"f=$1 n=$2; mkdir -p "${f%/*}" || exit 1; t=0; if [ -r "$f" ]; then read -r t < "$f" || :; fi; case $t in ''|*[!0-9]*) t=0;; esac; if [ "$t" -gt "$n" ]; then echo "sandkeeper-fenced: $t" >&2; exit 86; fi; if [ "$t" -lt "$n" ]; then printf '%s
' "$n" > "$f.$$" && mv -f -- "$f.$$" "$f"; fi"#;

/// The pod's token file: `<workdir>/.sandkeeper/token`, in the keeper's own directory, which
/// the application's writes and removals may not touch (`WorkPath::writable`).
pub(crate) fn pod_token_file(workdir: &str) -> String {
    format!("{workdir}/.sandkeeper/token")
}

/// The newest token a refusal's standard error names (0 when it names none).
pub(crate) fn refused_newest(stderr: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(stderr);
    let rest = text.strip_prefix(FENCED_MARK)?;
    Some(rest.trim().parse().unwrap_or(0))
}

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

    /// Records `token` in the token file of the pod `pod` just adopted under it (`work.rs`:
    /// from then on the pod itself refuses a change under an older token, in the exec that
    /// makes it). Refused ([`K8sError::Fenced`]) when the file holds a newer token; a pod that
    /// is gone is an error; any other failure (an image without `sh`) is logged and leaves
    /// the object's annotation alone to fence.
    pub(crate) async fn raise_pod_token(&self, pod: &str, token: Token) -> Result<(), K8sError> {
        let file = pod_token_file(&self.config.workdir);
        let secs = self.config.upload_timeout().as_secs().max(1);
        let argv = [
            "timeout",
            "-s",
            "KILL",
            &secs.to_string(),
            "sh",
            "-c",
            RAISE,
            "sh",
            &file,
            &token.0.to_string(),
        ]
        .map(str::to_string)
        .to_vec();
        let run = self.exec_capture(pod, argv, Vec::new(), 0, 4 << 10, None);
        let failed = match tokio::time::timeout(
            std::time::Duration::from_secs(secs) + crate::upload::EXEC_GRACE,
            run,
        )
        .await
        {
            Ok(Ok(c)) if c.code == 0 => return Ok(()),
            Ok(Ok(c)) => match refused_newest(&c.stderr) {
                Some(newest) if c.code == FENCED_EXIT => {
                    return Err(K8sError::Fenced {
                        object: format!("pod {pod} (its token file)"),
                        token: token.0,
                        newest,
                    })
                }
                _ => format!(
                    "exit {}: {}",
                    c.code,
                    String::from_utf8_lossy(&c.stderr).trim()
                ),
            },
            Ok(Err(e)) if e.is_gone() => return Err(e),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer in {secs} s"),
        };
        tracing::warn!(%pod, token = token.0, error = %failed,
            "could not record the token in the pod: only the object's annotation fences it");
        Ok(())
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
