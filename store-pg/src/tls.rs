//! How the store's connections to PostgreSQL are secured. [`StoreTls::Off`] (the default)
//! connects in the clear: for a server on a unix socket or a private network.
//! [`StoreTls::Rustls`] speaks TLS (rustls, the `ring` provider), verifying the server's
//! certificate against the roots given: with `sslmode=require` in the connection string every
//! connection is TLS or fails; with the default `sslmode=prefer`, TLS where the server offers it.
//! A client certificate is not offered (authenticate by password or by the server's rules).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::PgError;

/// How the store's connections are secured (see the module docs).
#[derive(Clone, Default)]
pub enum StoreTls {
    /// In the clear.
    #[default]
    Off,
    /// TLS through rustls.
    Rustls(MakeRustlsConnect),
}

impl std::fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreTls::Off => "StoreTls::Off",
            StoreTls::Rustls(_) => "StoreTls::Rustls",
        })
    }
}

impl StoreTls {
    /// TLS that trusts the certificates in `pem` (PEM, one or more: the server's CA, or its
    /// own self-signed certificate) and nothing else.
    ///
    /// Errors: `PgError::Tls` when `pem` holds no certificate, or one that does not parse.
    pub fn trusting_pem(pem: &[u8]) -> Result<StoreTls, PgError> {
        let mut roots = RootCertStore::empty();
        let mut found = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| PgError::Tls(format!("a root certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| PgError::Tls(format!("a root certificate: {e}")))?;
            found += 1;
        }
        if found == 0 {
            return Err(PgError::Tls("no certificate in the PEM given".into()));
        }
        StoreTls::with_roots(roots)
    }

    /// TLS that trusts `roots`.
    ///
    /// Errors: `PgError::Tls` when rustls refuses its default protocol versions.
    pub fn with_roots(roots: RootCertStore) -> Result<StoreTls, PgError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PgError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(StoreTls::Rustls(MakeRustlsConnect::new(config)))
    }

    /// Connects with `config`; the connection's I/O runs on a task of its own (the handle),
    /// which ends when the connection breaks or the client is dropped.
    pub async fn connect(
        &self,
        config: &Config,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        let ended = |e: tokio_postgres::Error| {
            tracing::warn!(error = %e, "fleet store connection ended");
        };
        match self {
            StoreTls::Off => {
                let (client, connection) = config.connect(NoTls).await?;
                let io = tokio::spawn(async move { connection.await.unwrap_or_else(ended) });
                Ok((client, io))
            }
            StoreTls::Rustls(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                let io = tokio::spawn(async move { connection.await.unwrap_or_else(ended) });
                Ok((client, io))
            }
        }
    }
}
