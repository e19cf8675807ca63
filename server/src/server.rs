//! The server: one listener for the REST API and envd (told apart by path; envd requests name
//! their sandbox by header), the keeper on its backend behind it, and an orderly end.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, get, post};
use axum::serve::ListenerExt;
use axum::Router;
use sandkeeper_tokio::local::store::LocalStore;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend};

use crate::auth::Keys;
use crate::backend::SandboxBackend;
use crate::durable::{Durable, Replica};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::registry::{self, Registry};
use crate::replicas::{Leases, Replicas};
use crate::table::Table;
use crate::table_k8s::K8sTable;
use crate::tls::{Tls, TlsListener};
use crate::{api, envd};
use sandkeeper_k8s::K8sStore;

/// Bounds of what requests may ask.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The most bytes of a JSON body (REST and envd RPC requests).
    pub json_body: usize,
    /// The most bytes of one upload to `/files` (all its files together).
    pub upload: usize,
    /// The most bytes of one file downloaded from `/files`.
    pub download: usize,
    /// The longest timeout a sandbox may be given.
    pub max_timeout: Duration,
    /// Sandboxes one team may have at once.
    pub sandboxes_per_team: usize,
    /// The longest a command may run (a request's `Connect-Timeout-Ms` may shorten it).
    pub run_timeout: Duration,
    /// Requests a second one team may make, REST and envd together (0: no limit).
    pub requests_per_second: u32,
    /// How long a paused sandbox is kept before it is killed (`None`: until it is killed).
    pub paused_retention: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            json_body: 1 << 20,
            upload: 100 << 20,
            download: 100 << 20,
            max_timeout: Duration::from_secs(24 * 3600),
            sandboxes_per_team: 20,
            run_timeout: Duration::from_secs(3600),
            requests_per_second: 0,
            paused_retention: None,
        }
    }
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it listens (port 0: any free port; [`Server::addr`] says which).
    pub listen: SocketAddr,
    /// The local backend's root: every sandbox's directory is made under it (unused on
    /// Kubernetes).
    pub root: PathBuf,
    /// Sandboxes on Kubernetes instead of the local backend.
    pub kubernetes: Option<crate::kubernetes::Kubernetes>,
    /// Paused sandboxes outlive the process (local backend): the keeper is a fleet keeper on
    /// the root's own store, and the table of paused sandboxes is kept under the root
    /// ([`crate::durable`]); the next server on the root takes them back.
    pub fleet: bool,
    /// With `fleet`: the base URL the other servers on the root reach this one at
    /// (`--advertise`; default `http://` or `https://` and the listening address, with
    /// `127.0.0.1` for an unspecified one). Replicas forward requests for the sandboxes they
    /// do not run to the one that runs them ([`crate::replicas`]).
    pub advertise: Option<String>,
    /// With `fleet`: replicas on hosts of their own, sharing a PostgreSQL database and a shelf
    /// in object storage instead of a root ([`crate::hosts`]); `None`: the replicas share this
    /// server's root.
    pub hosts: Option<crate::hosts::Hosts>,
    /// The API keys.
    pub keys: Keys,
    /// The bounds.
    pub limits: Limits,
    /// The lifecycle hooks (`--hooks`), if any.
    pub hooks: Option<crate::hooks::HookFile>,
    /// TLS: with it the listener serves HTTPS only (`crate::tls`); without it, HTTP.
    pub tls: Option<Tls>,
    /// Where commands see their sandbox's workspace (`--workspace-path`): `/home/user`, as in
    /// E2B's sandboxes, is where the file API's paths already are, so `cat /home/user/a.txt`
    /// reads what `files.write("/home/user/a.txt")` wrote. The local backend's
    /// [`workspace_mount`](LocalConfig::workspace_mount): it needs bubblewrap, and the server
    /// does not start without it. `None`: commands see the workspace at its host path under
    /// the root.
    pub workspace_path: Option<PathBuf>,
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The sandboxes.
    pub registry: Arc<Registry>,
    /// The API keys.
    pub keys: Arc<Keys>,
    /// The bounds.
    pub limits: Arc<Limits>,
    /// Each team's request rate.
    pub rate: Arc<crate::ratelimit::RateLimit>,
    /// How requests reach the other replicas on the root (`--fleet`).
    pub forwarder: Option<crate::forward::Forwarder>,
}

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The local backend could not be made under the root.
    #[error("the local backend at {root}: {error}")]
    Backend {
        /// The root.
        root: String,
        /// The error.
        error: std::io::Error,
    },
    /// The Kubernetes backend could not be set up.
    #[error(transparent)]
    Kubernetes(#[from] crate::kubernetes::KubernetesError),
    /// The workspace path cannot be used here (not a usable path, or no bubblewrap).
    #[error("{0}; to run commands at the workspace's host path instead, start with --workspace-path host")]
    WorkspacePath(sandkeeper_tokio::local::WorkspaceMountError),
    /// `--advertise` is not an `http://host:port` URL.
    #[error("--advertise {0}: give the http://host:port the other servers on the root reach this one at")]
    Advertise(String),
    /// `--fleet` with `--tls`: the replicas would forward to each other's TLS listeners.
    #[error("--fleet with --tls: replicas forward requests to each other over plain HTTP, which a TLS listener refuses; terminate TLS in front of the replicas (a load balancer) instead")]
    FleetTls,
    /// The hosts' shared services (`--fleet-store`, `--snapshots`) could not be used.
    #[error(transparent)]
    Hosts(#[from] crate::hosts::HostsError),
    /// The keeper refused its configuration.
    #[error("the keeper: {0}")]
    Keeper(#[from] sandkeeper_tokio::KeeperError),
    /// Listening or serving failed.
    #[error("listening on {addr}: {error}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The error.
        error: std::io::Error,
    },
}

/// The routes: the REST API, envd, and 404 in E2B's shape for anything else.
pub fn router(state: AppState) -> Router {
    let upload_limit = state.limits.upload.saturating_add(1 << 20);
    let routes = Router::new()
        .route("/sandboxes", get(api::list).post(api::create))
        .route("/v2/sandboxes", get(api::list).post(api::create))
        .route("/sandboxes/{id}", get(api::get).delete(api::kill))
        .route("/sandboxes/{id}/timeout", post(api::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(api::refresh))
        .route("/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/pause", post(api::pause))
        .route("/sandboxes/{id}/resume", post(api::resume))
        .route("/v2/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/metrics", get(api::metrics))
        .route("/sandboxes/{id}/{what}", any(api::sandbox_unsupported))
        .route("/templates", any(api::unsupported))
        .route("/templates/{*rest}", any(api::unsupported))
        .route("/v2/templates/{*rest}", any(api::unsupported))
        .route("/v3/templates", any(api::unsupported))
        .route("/snapshots", any(api::unsupported))
        .route("/volumes", any(api::unsupported))
        .route("/volumes/{*rest}", any(api::unsupported))
        .route("/secrets", any(api::unsupported))
        .route("/secrets/{*rest}", any(api::unsupported))
        .route("/metrics", get(crate::metrics::scrape))
        .route("/health", get(envd::health))
        .route("/process.Process/{method}", post(envd::process::rpc))
        .route(
            "/filesystem.Filesystem/{method}",
            post(envd::filesystem::rpc),
        )
        .route(
            "/files",
            get(envd::files::download)
                .post(envd::files::upload)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .fallback(api::fallback)
        .method_not_allowed_fallback(api::method_not_allowed);
    // Replicas route requests to each other (`--fleet`); a lone server has nothing to route.
    let routes = match state.forwarder {
        Some(_) => routes.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::route::layer,
        )),
        None => routes,
    };
    routes
        .layer(axum::middleware::from_fn(crate::request_span::layer))
        .with_state(state)
}

/// The local backend under the root. A Stop takes a snapshot only when asked to suspend (a
/// pause): a killed sandbox's workspace goes with it.
fn local_backend(
    config: &Config,
    shelf: Option<Arc<sandkeeper_snapshots::ObjectSnapshots>>,
) -> Result<LocalBackend, ServerError> {
    let local = LocalConfig {
        run_timeout: config.limits.run_timeout,
        snapshots: false,
        workspace_mount: config.workspace_path.clone(),
        shelf: shelf.map(|s| s as Arc<dyn sandkeeper_tokio::local::shelf::Shelf>),
        ..LocalConfig::new(&config.root)
    };
    LocalBackend::new(local).map_err(|error| {
        match error
            .get_ref()
            .and_then(|e| e.downcast_ref::<sandkeeper_tokio::local::WorkspaceMountError>())
        {
            Some(refused) => ServerError::WorkspacePath(refused.clone()),
            None => ServerError::Backend {
                root: config.root.display().to_string(),
                error,
            },
        }
    })
}

/// The keeper on `backend`, with the hooks if any; with `--fleet`, a fleet keeper and the
/// sandbox table beside it, this server one of its replicas at `url`: on the root's own store
/// and table, (`hosts`) on PostgreSQL's, its paused workspaces on the `shelf`, or (on
/// Kubernetes) on the namespace's Leases.
async fn keeper(
    config: &Config,
    backend: SandboxBackend,
    shelf: Option<Arc<sandkeeper_snapshots::ObjectSnapshots>>,
    metrics: &Arc<Metrics>,
    url: String,
) -> Result<(Keeper<SandboxBackend>, Option<Replicas>), ServerError> {
    let mut core = sandkeeper::Config::default();
    if let Some(file) = &config.hooks {
        core.hooks = file.core_hooks();
    }
    let runner = config
        .hooks
        .clone()
        .map(|file| crate::hooks::runner(Arc::new(file), metrics.clone()));
    if !config.fleet {
        let keeper = match runner {
            None => Keeper::new(KeeperConfig::with_core(core), backend)?,
            Some(runner) => Keeper::with_hooks(KeeperConfig::with_core(core), backend, runner)?,
        };
        return Ok((keeper, None));
    }
    let backend_error = |error: std::io::Error| ServerError::Backend {
        root: config.root.display().to_string(),
        error,
    };
    let mut fleet = sandkeeper::Fleet::default();
    let on_kubernetes = match &backend {
        SandboxBackend::Kubernetes(k8s) => Some(k8s.cluster().clone()),
        _ => None,
    };
    let (keeper, table, leases) = match (on_kubernetes, &config.hosts, shelf) {
        (Some(cluster), _, _) => {
            // Every replica reaches every pod and claim: keys are handed over warm, as
            // between replicas on one root.
            let store = K8sStore::new(cluster.clone(), fleet.lease);
            core.fleet = Some(fleet);
            let keeper = fleet_keeper(core, backend, store.clone(), runner).await?;
            let table = K8sTable::new(cluster.client().clone(), &cluster.config().namespace);
            (
                keeper,
                Table::Kubernetes(Box::new(table)),
                Leases::Kubernetes(Box::new(store)),
            )
        }
        (None, Some(hosts), Some(shelf)) => {
            // Each host's sandboxes are out of the others' reach: a key goes to another host
            // suspended, through the shelf (docs/fleet-hosts.md).
            fleet.handover = sandkeeper::Handover::Suspended;
            let (store, table) = hosts.connect(&config.root, shelf, fleet.lease).await?;
            core.fleet = Some(fleet);
            let keeper = fleet_keeper(core, backend, store.clone(), runner).await?;
            (keeper, Table::Postgres(table), Leases::Postgres(store))
        }
        _ => {
            let store = LocalStore::open(&config.root, fleet.lease)
                .map_err(|e| backend_error(std::io::Error::other(e.to_string())))?;
            core.fleet = Some(fleet);
            let keeper = fleet_keeper(core, backend, store.clone(), runner).await?;
            let table = Durable::open(&config.root).map_err(backend_error)?;
            (keeper, Table::Files(table), Leases::Local(store))
        }
    };
    let me = Replica {
        incarnation: keeper
            .incarnation()
            .expect("a fleet keeper has an incarnation"),
        url,
        host: match config.hosts {
            Some(_) => Some(crate::hosts::host_id(&config.root)?),
            None => None,
        },
    };
    tracing::info!(incarnation = me.incarnation, url = %me.url, host = ?me.host, "a replica");
    let replicas = Replicas::new(table, leases, me);
    Ok((keeper, Some(replicas)))
}

/// A fleet keeper on `store`, with the hooks' `runner` if any.
async fn fleet_keeper<R, F>(
    core: sandkeeper::Config,
    backend: SandboxBackend,
    store: impl sandkeeper_tokio::store::FleetStore,
    runner: Option<R>,
) -> Result<Keeper<SandboxBackend>, ServerError>
where
    R: Fn(sandkeeper::HookPoint, sandkeeper_tokio::SandboxWork<'static, SandboxBackend>) -> F
        + Send
        + Sync
        + 'static,
    F: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    Ok(match runner {
        None => Keeper::fleet(KeeperConfig::with_core(core), backend, store).await?,
        Some(runner) => {
            Keeper::fleet_with_hooks(KeeperConfig::with_core(core), backend, store, runner).await?
        }
    })
}

/// Where the other replicas reach this server: `--advertise`, else the listening address
/// (`127.0.0.1` for an unspecified one) with the scheme the listener speaks.
fn advertised(config: &Config, addr: SocketAddr) -> Result<String, ServerError> {
    if let Some(url) = &config.advertise {
        let valid = url
            .parse::<axum::http::Uri>()
            .is_ok_and(|u| u.scheme_str() == Some("http") && u.host().is_some() && u.path() == "/");
        return if valid {
            Ok(url.trim_end_matches('/').to_string())
        } else {
            Err(ServerError::Advertise(url.clone()))
        };
    }
    let ip = match addr.ip() {
        ip if ip.is_unspecified() => std::net::IpAddr::from([127, 0, 0, 1]),
        ip => ip,
    };
    Ok(format!("http://{}", SocketAddr::new(ip, addr.port())))
}

/// A server bound to its address, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: AppState,
    keeper: Keeper<SandboxBackend>,
    tls: Option<Tls>,
}

impl AppState {
    /// The team of a REST request's key (401), within its request rate (429).
    pub fn caller(&self, headers: &axum::http::HeaderMap) -> Result<crate::auth::Team, ApiError> {
        let team = self.keys.team(headers)?;
        crate::request_span::record_team(&team);
        self.admit(&team)?;
        Ok(team)
    }

    /// One request of `team`, or 429 past its rate.
    pub fn admit(&self, team: &crate::auth::Team) -> Result<(), ApiError> {
        if self.rate.admit(team) {
            Ok(())
        } else {
            Err(ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "team {team} is over its {} requests a second",
                    self.limits.requests_per_second
                ),
            ))
        }
    }
}

impl Server {
    /// Makes the keeper on its backend (connecting to Kubernetes when configured) and binds
    /// the listener.
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        let shelf = match &config.hosts {
            Some(hosts) if config.fleet => Some(hosts.shelf()?),
            _ => None,
        };
        let backend = match &config.kubernetes {
            None => SandboxBackend::Local(local_backend(&config, shelf.clone())?),
            Some(kubernetes) if config.fleet => {
                SandboxBackend::Kubernetes(kubernetes.connect_fleet().await?)
            }
            Some(kubernetes) => SandboxBackend::Kubernetes(kubernetes.connect().await?),
        };
        let metrics = Arc::new(Metrics::new(backend.name()));
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|error| ServerError::Listen {
                addr: config.listen,
                error,
            })?;
        let addr = listener.local_addr().map_err(|error| ServerError::Listen {
            addr: config.listen,
            error,
        })?;
        let url = if config.fleet {
            if config.tls.is_some() {
                return Err(ServerError::FleetTls);
            }
            advertised(&config, addr)?
        } else {
            String::new()
        };
        let (keeper, replicas) = keeper(&config, backend, shelf, &metrics, url).await?;
        let forwarder = replicas
            .as_ref()
            .map(|r| crate::forward::Forwarder::new(r.me.incarnation));
        let limits = registry::Limits {
            sandboxes_per_team: config.limits.sandboxes_per_team,
            paused_retention: config.limits.paused_retention,
        };
        let state = AppState {
            registry: Registry::new(keeper.clone(), limits, metrics, replicas),
            keys: Arc::new(config.keys),
            rate: Arc::new(crate::ratelimit::RateLimit::new(
                config.limits.requests_per_second,
            )),
            limits: Arc::new(config.limits),
            forwarder,
        };
        let restored = state
            .registry
            .restore()
            .await
            .map_err(|error| ServerError::Backend {
                root: config.root.display().to_string(),
                error,
            })?;
        if restored > 0 {
            tracing::info!(restored, "paused sandboxes taken back from the root");
        }
        Ok(Server {
            listener,
            state,
            keeper,
            tls: config.tls,
        })
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &SandboxBackend {
        self.keeper.backend()
    }

    /// The address it listens on.
    pub fn addr(&self) -> Result<SocketAddr, std::io::Error> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves; then kills every sandbox (draining each, which also
    /// ends their commands' streams, so no open stream holds the end up), stops taking
    /// requests, kills what was created meanwhile and closes the keeper.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let addr = self.addr().map_err(|error| ServerError::Listen {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            error,
        })?;
        let registry = self.state.registry.clone();
        let ending = registry.clone();
        let sweeping = registry.replicas().is_some().then(|| {
            let registry = registry.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(crate::registry::SWEEP).await;
                    registry.sweep().await;
                }
            })
        });
        let watching = tokio::spawn(registry.clone().watch_lost());
        let shutdown = async move {
            shutdown.await;
            watching.abort();
            if let Some(sweeping) = sweeping {
                sweeping.abort();
            }
            ending.kill_all().await;
        };
        // No Nagle: a command's stream writes its events as they come, each small; held back
        // until the client acknowledged the last (which it delays, 40 ms on Linux), every
        // `commands.run` took 40 ms more (docs/performance.md, "sandkeeperd").
        let listener = self.listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!(error = %e, "TCP_NODELAY not set on a connection");
            }
        });
        let app = router(self.state);
        // With TLS, the same TCP connections (TCP_NODELAY set) are handshaken first.
        let served = match &self.tls {
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            Some(tls) => match TlsListener::new(listener, tls) {
                Ok(listener) => {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                }
                Err(error) => Err(error),
            },
        };
        registry.kill_all().await;
        let report = self.keeper.close(Duration::from_secs(10)).await;
        tracing::info!(?report, "closed");
        match self.keeper.backend().close().await {
            Ok(deleted) => tracing::info!(deleted, "backend closed"),
            Err(error) => tracing::warn!(%error, "the backend did not close cleanly"),
        }
        served.map_err(|error| ServerError::Listen { addr, error })
    }
}
