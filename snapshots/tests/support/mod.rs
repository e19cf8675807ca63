//! What the snapshot tests share: a real moto S3 server started and stopped by the test, a
//! fault proxy in front of it, workspaces to snapshot and a comparison of two trees.

#![allow(dead_code)]

pub mod fault_proxy;
pub mod workspace;

use std::time::Duration;

use object_store::{BackoffConfig, RetryConfig};
use sandkeeper_snapshots::SnapshotsConfig;

/// The smallest part S3 (and moto) accept for every part but the last.
pub const PART: usize = 5 << 20;

/// A configuration for tests: 5 MiB parts, and retries quick enough for a test (three, backing
/// off from 10 ms).
pub fn test_config(options: Vec<(String, String)>) -> SnapshotsConfig {
    SnapshotsConfig {
        part_size: PART,
        max_concurrency: 2,
        retry: RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(100),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
        },
        options,
    }
}
