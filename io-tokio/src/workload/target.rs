//! [`WorkloadTarget`]: what the workload needs of a backend beyond its operations.

use std::future::Future;

use sandkeeper::SandboxId;

use crate::{LocalBackend, SandboxOps};

/// A backend the harness workload can run on: it runs the tools' own work
/// ([`SandboxOps`]), can kill a sandbox from outside (a death), and may add checks of its own
/// after the keeper closed.
pub trait WorkloadTarget: SandboxOps {
    /// A short name of the backend kind, shown in the summary ("local", "k8s").
    fn kind(&self) -> &'static str;

    /// How the tools' commands are isolated, for the summary.
    fn isolation(&self) -> String;

    /// What each command may use and how that is enforced, for the summary (`None` where the
    /// backend has no such limits of its own).
    fn limits(&self) -> Option<String> {
        None
    }

    /// Kills the sandbox from outside, as an operator or the platform would; the keeper must
    /// learn of it through its death watch.
    fn kill(&self, sandbox: SandboxId) -> impl Future<Output = ()> + Send;

    /// The local backend, for the checks only it allows (snapshot files on disk, sandbox
    /// directories removed). `None` for other backends.
    fn as_local(&self) -> Option<&LocalBackend> {
        None
    }

    /// Checks of the backend's own after the keeper closed, as `(passed, what)`; for example
    /// "no object of this owner remains". The default has none. Not run in fleet mode, where
    /// such checks of single ownership do not hold (see [`after_fleet_close`](Self::after_fleet_close)).
    fn after_close(&self) -> impl Future<Output = Vec<(bool, String)>> + Send {
        async { Vec::new() }
    }

    /// In fleet mode, instead of [`after_close`](Self::after_close): checks of the backend's
    /// own after the keeper of the fleet's process `incarnation` closed, as `(passed, what)`.
    /// Only what this process alone decides may be checked here (for example "this process
    /// owns no key any more": its close released every key it held); what is left in the
    /// shared backend is the fleet's, and other processes may still be changing it. The
    /// default has none.
    fn after_fleet_close(
        &self,
        incarnation: u32,
    ) -> impl Future<Output = Vec<(bool, String)>> + Send {
        let _ = incarnation;
        async { Vec::new() }
    }
}

impl WorkloadTarget for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn isolation(&self) -> String {
        LocalBackend::isolation(self).to_string()
    }

    fn limits(&self) -> Option<String> {
        Some(LocalBackend::limits(self).to_string())
    }

    async fn kill(&self, sandbox: SandboxId) {
        // Someone deletes the sandbox directory from outside. Writes may race the removal;
        // try until the directory is gone.
        let dir = self.sandbox_dir(sandbox);
        for _ in 0..10 {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                break;
            }
        }
    }

    fn as_local(&self) -> Option<&LocalBackend> {
        Some(self)
    }
}
