//! Optional TLS on the one listener (`--tls-cert FILE --tls-key FILE`): with it every connection
//! is HTTPS, nothing is served in the clear.
//!
//! rustls with the `ring` provider (the provider the rest of the tree already builds), TLS 1.2
//! and 1.3. Only HTTP/1.1 is served (axum is built here without `http2`), so ALPN offers
//! `http/1.1` alone: a client offering `h2` and `http/1.1`, as the Python SDK's transport
//! (pyqwest) does on TLS, settles on HTTP/1.1; one offering only `h2` is refused in the
//! handshake rather than answered in a protocol it did not ask for.
//!
//! [`TlsListener`] is an axum [`Listener`], so `axum::serve` keeps its own accept loop,
//! connection tasks and graceful shutdown (`Server::serve` is unchanged around it). This was
//! chosen over serving connections with hyper-util by hand, which would repeat axum's loop and
//! its graceful shutdown. axum awaits one `accept` at a time, so the handshake cannot run inside
//! `accept` (a client that connects and sends nothing would hold every other client up): a task
//! accepts TCP connections and runs each handshake on a task of its own, bounded by
//! [`HANDSHAKE_TIMEOUT`]; `accept` hands over the connections whose handshake completed.
//! Handshakes that fail or time out are logged at debug and dropped.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The longest a connection's TLS handshake may take; past it the connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections handshaken and not yet taken by the server's accept loop.
const READY: usize = 64;

/// The server's TLS configuration: its certificate chain and key, loaded and checked.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ServerConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("alpn", &["http/1.1"])
            .finish_non_exhaustive()
    }
}

/// Why the TLS configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file (named by its flag) could not be read or holds nothing usable.
    #[error("{flag} {}: {problem}", path.display())]
    File {
        /// The flag that named it: `--tls-cert` or `--tls-key`.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        problem: String,
    },
    /// rustls refused the certificate chain with the key (an invalid certificate or key, or a
    /// key that is not the certificate's).
    #[error("--tls-cert {} with --tls-key {}: {error}", cert.display(), key.display())]
    Pair {
        /// The certificate chain's file.
        cert: PathBuf,
        /// The key's file.
        key: PathBuf,
        /// What rustls said.
        error: rustls::Error,
    },
}

impl Tls {
    /// Loads a certificate chain (PEM `CERTIFICATE` sections, the server's own first) and its
    /// private key (PEM: PKCS#8 `PRIVATE KEY`, `RSA PRIVATE KEY` or SEC1 `EC PRIVATE KEY`; the
    /// first one in the file; the two may be one file).
    ///
    /// Errors: [`TlsError::File`] naming the file for an unreadable file, invalid PEM, no
    /// certificate, no key; [`TlsError::Pair`] when rustls refuses them together.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let problem = |flag, path: &Path, problem: String| TlsError::File {
            flag,
            path: path.to_path_buf(),
            problem,
        };
        let cert_pem =
            std::fs::read(cert).map_err(|e| problem("--tls-cert", cert, e.to_string()))?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| problem("--tls-cert", cert, format!("not valid PEM: {e}")))?;
        if chain.is_empty() {
            return Err(problem(
                "--tls-cert",
                cert,
                "no certificate in it (PEM `BEGIN CERTIFICATE` sections expected)".into(),
            ));
        }
        let key_pem = std::fs::read(key).map_err(|e| problem("--tls-key", key, e.to_string()))?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
            pem::Error::NoItemsFound => problem(
                "--tls-key",
                key,
                "no private key in it (PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or \
                 `BEGIN EC PRIVATE KEY` expected)"
                    .into(),
            ),
            e => problem("--tls-key", key, format!("not valid PEM: {e}")),
        })?;
        let pair = |error| TlsError::Pair {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            error,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(pair)?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(pair)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            config: Arc::new(config),
        })
    }
}

/// A listener whose connections are TLS streams, handshaken on tasks of their own (see the
/// module's documentation). Dropping it stops accepting: the inner listener is closed and the
/// handshakes under way are abandoned.
pub struct TlsListener<L: Listener> {
    ready: mpsc::Receiver<(TlsStream<L::Io>, L::Addr)>,
    local_addr: L::Addr,
    accepting: JoinHandle<()>,
}

impl<L> TlsListener<L>
where
    L: Listener,
    L::Addr: Clone + fmt::Debug + 'static,
{
    /// Starts accepting on `inner` (on a task: call it within the Tokio runtime), each
    /// connection's handshake bounded by [`HANDSHAKE_TIMEOUT`].
    ///
    /// Errors: `inner`'s address could not be read.
    pub fn new(inner: L, tls: &Tls) -> io::Result<Self> {
        let local_addr = inner.local_addr()?;
        let (done, ready) = mpsc::channel(READY);
        let acceptor = TlsAcceptor::from(tls.config.clone());
        let accepting = tokio::spawn(accept_loop(inner, acceptor, done));
        Ok(TlsListener {
            ready,
            local_addr,
            accepting,
        })
    }
}

/// Accepts connections on `inner` and starts each one's handshake on a task of its own; the
/// connections whose handshake completed go to `done`.
async fn accept_loop<L>(
    mut inner: L,
    acceptor: TlsAcceptor,
    done: mpsc::Sender<(TlsStream<L::Io>, L::Addr)>,
) where
    L: Listener,
    L::Addr: fmt::Debug + 'static,
{
    loop {
        // axum's listeners retry errors of accept themselves (sleeping on the others, such as
        // too many open files).
        let (io, peer) = inner.accept().await;
        let handshake = acceptor.accept(io);
        let done = done.clone();
        // Not kept: each task ends within HANDSHAKE_TIMEOUT, and its connection is dropped when
        // the listener is gone by then.
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => {
                    let _ = done.send((stream, peer)).await;
                }
                Ok(Err(error)) => {
                    tracing::debug!(?peer, %error, "TLS handshake failed");
                }
                Err(_) => {
                    tracing::debug!(?peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
                }
            }
        });
    }
}

impl<L: Listener> Drop for TlsListener<L> {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl<L> Listener for TlsListener<L>
where
    L: Listener,
    L::Addr: Clone + fmt::Debug + 'static,
{
    type Io = TlsStream<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            None => {
                // Only when the accepting task is gone (it never returns; it panicked): take
                // no more connections, as a listener that no longer accepts.
                tracing::error!("the TLS listener stopped accepting");
                std::future::pending().await
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr.clone())
    }
}
