//! The object store a URL names, with this crate's retry policy and, on S3, conditional puts
//! (`If-None-Match: *`) on.

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, RetryConfig};
use url::Url;

use crate::SnapshotError;

/// The store at `url` and the prefix under it that snapshots live in.
pub(crate) fn store_at(
    url: &str,
    options: &[(String, String)],
    retry: &RetryConfig,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath), SnapshotError> {
    let parsed = Url::parse(url).map_err(|e| configuration(format!("{url}: {e}")))?;
    let prefix = ObjectPath::parse(parsed.path().trim_matches('/'))
        .map_err(|e| SnapshotError::store(e.into()))?;
    let store: Arc<dyn ObjectStore> = match parsed.scheme() {
        "s3" | "s3a" => Arc::new(s3(url, options, retry)?),
        "gs" => {
            let mut builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry.clone());
            for (key, value) in options {
                builder = builder.with_config(key_of::<GoogleConfigKey>(key)?, value);
            }
            Arc::new(builder.build().map_err(SnapshotError::store)?)
        }
        "az" | "azure" | "abfs" | "abfss" => {
            let mut builder = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry.clone());
            for (key, value) in options {
                builder = builder.with_config(key_of::<AzureConfigKey>(key)?, value);
            }
            Arc::new(builder.build().map_err(SnapshotError::store)?)
        }
        "file" => {
            let root = parsed
                .to_file_path()
                .map_err(|()| configuration(format!("{url}: not a local path")))?;
            let store = LocalFileSystem::new_with_prefix(root).map_err(SnapshotError::store)?;
            // The prefix is the store's root already.
            return Ok((Arc::new(store), ObjectPath::default()));
        }
        "memory" => Arc::new(InMemory::new()),
        other => {
            return Err(configuration(format!(
                "{url}: no store for scheme {other:?}"
            )))
        }
    };
    Ok((store, prefix))
}

/// An S3 (or S3-compatible) store: the environment's `AWS_*` settings, then `options`.
fn s3(
    url: &str,
    options: &[(String, String)],
    retry: &RetryConfig,
) -> Result<object_store::aws::AmazonS3, SnapshotError> {
    let mut builder = AmazonS3Builder::from_env()
        .with_url(url)
        .with_retry(retry.clone())
        // S3 has honoured `If-None-Match: *` on PUT since 2024; `options` may turn it off
        // (`conditional_put=disabled`) for a store that does not.
        .with_config(AmazonS3ConfigKey::ConditionalPut, "etag");
    for (key, value) in options {
        builder = builder.with_config(key_of::<AmazonS3ConfigKey>(key)?, value);
    }
    builder.build().map_err(SnapshotError::store)
}

fn key_of<K: std::str::FromStr<Err = object_store::Error>>(key: &str) -> Result<K, SnapshotError> {
    key.parse::<K>().map_err(SnapshotError::store)
}

fn configuration(why: String) -> SnapshotError {
    SnapshotError::store(object_store::Error::Generic {
        store: "configuration",
        source: why.into(),
    })
}
