//! A what-if for `server/perf/run.sh`: `sandkeeperd`'s router and keeper, made as
//! `Server::bind` makes them, served with `TCP_NODELAY` on every accepted connection.
//!
//! `sandkeeperd` serves with `axum::serve` on a plain `TcpListener` (`server/src/server.rs`,
//! `Server::serve`), so Nagle's algorithm is on for its connections: a command's stream writes
//! its `start` event, and its `end` event waits for the client's ACK of it, which a client
//! delays (Linux: about 40 ms). This program measures what the figures would be without that
//! wait, beside the real server in the same run. It is not a second server to deploy.
//!
//! `serve_nodelay ROOT TEAM:KEY SANDBOXES_PER_TEAM`: listens on a free port of 127.0.0.1 and
//! prints `sandkeeperd listening on http://ADDR`, as `sandkeeperd` does; SIGTERM or Ctrl-C
//! kills every sandbox and closes the keeper.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use sandkeeper_tokio::local::LocalConfig;
use sandkeeper_tokio::{Keeper, KeeperConfig, LocalBackend};
use sandkeeperd::auth::Keys;
use sandkeeperd::ratelimit::RateLimit;
use sandkeeperd::registry::{self, Registry};
use sandkeeperd::server::{router, AppState, Limits};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, key, per_team] = args.as_slice() else {
        return Err("usage: serve_nodelay ROOT TEAM:KEY SANDBOXES_PER_TEAM".into());
    };
    let mut keys = Keys::new();
    keys.add_flag(key)?;
    let limits = Limits {
        sandboxes_per_team: per_team.parse()?,
        ..Limits::default()
    };
    // As `Server::bind`.
    let local = LocalConfig {
        run_timeout: limits.run_timeout,
        snapshots: false,
        ..LocalConfig::new(PathBuf::from(root))
    };
    let keeper = Keeper::new(KeeperConfig::default(), LocalBackend::new(local)?)?;
    let registry = Registry::new(
        keeper.clone(),
        registry::Limits {
            sandboxes_per_team: limits.sandboxes_per_team,
        },
    );
    let state = AppState {
        registry: registry.clone(),
        keys: Arc::new(keys),
        rate: Arc::new(RateLimit::new(limits.requests_per_second)),
        limits: Arc::new(limits),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("sandkeeperd listening on http://{}", listener.local_addr()?);
    // The one difference from `sandkeeperd`.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            eprintln!("serve_nodelay: TCP_NODELAY: {e}");
        }
    });
    let ending = registry.clone();
    let shutdown = async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            Some(()) = async { term.as_mut()?.recv().await } => {}
        }
        ending.kill_all().await;
    };
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await;
    registry.kill_all().await;
    keeper.close(Duration::from_secs(10)).await;
    Ok(served?)
}
