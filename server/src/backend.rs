//! The backend a server's keeper runs on: the embedded local one (the default, under `--root`)
//! or Kubernetes (`--kubernetes FILE`), chosen at start. One enum rather than a server generic
//! over its backend: every handler, the registry and the hooks name one concrete keeper type,
//! and a call costs one `match` that the compiler sees through. The enum owns its backend;
//! each method hands the call to it unchanged, so both keep every promise of
//! [`Backend`] and [`SandboxOps`] as documented there. Every method is handed on, those with
//! a default included: a default left here would answer for both backends, whatever theirs do
//! (a new trait method must be added here too).

use sandkeeper::{Config, SandboxId, Snapshot, Token};
use sandkeeper_k8s::K8sBackend;
use sandkeeper_tokio::ops::ExecRequest;
use sandkeeper_tokio::{
    AdoptRequest, Backend, BackendError, Chunk, DeathSink, DiscardRequest, Entry, ExecOutput,
    Input, LocalBackend, OpError, PersistRequest, SandboxOps, StartRequest, StopRequest,
    UploadRequest, WorkPath,
};

/// Where sandboxes run.
pub enum SandboxBackend {
    /// Directories on this machine, commands under bubblewrap where it works.
    Local(LocalBackend),
    /// Pods (or agent-sandbox claims) in a Kubernetes namespace.
    Kubernetes(K8sBackend),
}

impl SandboxBackend {
    /// Its name in metrics and logs: `local` or `kubernetes`.
    pub fn name(&self) -> &'static str {
        match self {
            SandboxBackend::Local(_) => "local",
            SandboxBackend::Kubernetes(_) => "kubernetes",
        }
    }

    /// Whether it can keep a paused sandbox's workspace, and why not: asked as the core would
    /// ask of a keeper whose every release suspends ([`Backend::check_config`]). The local
    /// backend always can; Kubernetes in `agentSandbox` mode can (on a persistent working
    /// directory), in `pod` mode it cannot (the workspace goes with the pod). `fleet`: the
    /// keeper is one of a fleet's (`--fleet`), whose backend is connected for it.
    pub fn can_pause(&self, fleet: bool) -> Result<(), String> {
        if let SandboxBackend::Local(_) = self {
            return Ok(());
        }
        let suspending = Config {
            release: sandkeeper::ReleasePolicy::Suspend,
            fleet: fleet.then(sandkeeper::Fleet::default),
            ..Config::default()
        };
        self.check_config(&suspending)
    }

    /// Lets go of what the backend holds outside the keeper, after the keeper closed: on
    /// Kubernetes, deletes the objects this owner still has and releases its Lease (the local
    /// backend holds nothing more). Answers how many objects were deleted.
    pub async fn close(&self) -> Result<usize, String> {
        match self {
            SandboxBackend::Local(_) => Ok(0),
            SandboxBackend::Kubernetes(b) => b.close().await.map_err(|e| e.to_string()),
        }
    }
}

impl std::fmt::Debug for SandboxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Hands the call to whichever backend it is.
macro_rules! each {
    ($self:expr, $b:ident => $call:expr) => {
        match $self {
            SandboxBackend::Local($b) => $call,
            SandboxBackend::Kubernetes($b) => $call,
        }
    };
}

impl Backend for SandboxBackend {
    /// Both serve fleet mode.
    const FLEET: bool = <LocalBackend as Backend>::FLEET && <K8sBackend as Backend>::FLEET;

    async fn start(&self, request: StartRequest) -> Result<(), BackendError> {
        each!(self, b => b.start(request).await)
    }

    async fn upload(&self, request: UploadRequest) -> Result<(), BackendError> {
        each!(self, b => b.upload(request).await)
    }

    async fn stop(&self, request: StopRequest) -> Result<Option<Snapshot>, BackendError> {
        each!(self, b => b.stop(request).await)
    }

    async fn persist(&self, request: PersistRequest) -> Result<(), BackendError> {
        each!(self, b => b.persist(request).await)
    }

    async fn shutdown(&self, sandbox: SandboxId, token: Option<Token>) -> Result<(), BackendError> {
        each!(self, b => b.shutdown(sandbox, token).await)
    }

    async fn discard(&self, request: DiscardRequest) -> Result<(), BackendError> {
        each!(self, b => b.discard(request).await)
    }

    async fn adopt(&self, request: AdoptRequest) -> Result<(), BackendError> {
        each!(self, b => b.adopt(request).await)
    }

    async fn relinquish(&self, sandbox: SandboxId) {
        each!(self, b => b.relinquish(sandbox).await)
    }

    fn check_config(&self, config: &Config) -> Result<(), String> {
        each!(self, b => b.check_config(config))
    }

    async fn watch_deaths(&self, deaths: DeathSink) {
        each!(self, b => b.watch_deaths(deaths).await)
    }
}

impl SandboxOps for SandboxBackend {
    async fn exec(&self, sandbox: SandboxId, request: ExecRequest) -> Result<ExecOutput, OpError> {
        each!(self, b => b.exec(sandbox, request).await)
    }

    async fn exec_streaming(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
    ) -> Result<ExecOutput, OpError> {
        each!(self, b => b.exec_streaming(sandbox, request, chunks).await)
    }

    async fn exec_with_input(
        &self,
        sandbox: SandboxId,
        request: ExecRequest,
        chunks: tokio::sync::mpsc::Sender<Chunk>,
        input: tokio::sync::mpsc::Receiver<Input>,
    ) -> Result<ExecOutput, OpError> {
        each!(self, b => b.exec_with_input(sandbox, request, chunks, input).await)
    }

    async fn write(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        bytes: Vec<u8>,
    ) -> Result<(), OpError> {
        each!(self, b => b.write(sandbox, path, bytes).await)
    }

    async fn read(
        &self,
        sandbox: SandboxId,
        path: WorkPath,
        cap: usize,
    ) -> Result<Vec<u8>, OpError> {
        each!(self, b => b.read(sandbox, path, cap).await)
    }

    async fn list(&self, sandbox: SandboxId, dir: WorkPath) -> Result<Vec<Entry>, OpError> {
        each!(self, b => b.list(sandbox, dir).await)
    }

    async fn remove(&self, sandbox: SandboxId, path: WorkPath) -> Result<(), OpError> {
        each!(self, b => b.remove(sandbox, path).await)
    }

    async fn exists(&self, sandbox: SandboxId, path: WorkPath) -> Result<bool, OpError> {
        each!(self, b => b.exists(sandbox, path).await)
    }

    async fn went_away(&self, sandbox: SandboxId) -> Option<OpError> {
        each!(self, b => b.went_away(sandbox).await)
    }
}
