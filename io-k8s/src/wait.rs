//! Waiting for one object to reach a state, from a `kube::runtime` watch (list, then watch from
//! the list's resourceVersion; a 410 Gone relists; a dropped stream re-watches). An object that
//! is absent, or deleted while waited for, is gone.

use std::fmt::Debug;
use std::time::Duration;

use futures_util::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use crate::error::{Call, ErrorClass, K8sError};
use crate::retry::RetryPolicy;

/// What the waiter makes of the object's latest state.
pub enum Step<T> {
    /// Done waiting, with a result.
    Done(T),
    /// It will never get there.
    Fail(K8sError),
    /// Not yet.
    Wait,
    /// Not yet, for this reason (named in the timeout's error if it is the last word).
    Waiting(String),
}

/// Watches object `name` until `check` is done or fails, `timeout` passes, or it is gone.
pub async fn wait_for<K, T>(
    api: Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    watch_call: Call,
    retry: RetryPolicy,
    mut check: impl FnMut(&K) -> Step<T>,
) -> Result<T, K8sError>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(api, cfg).boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen_in_list = false;
    let mut failures = 0u32;
    let mut why: Option<String> = None;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| K8sError::Timeout {
                what: match &why {
                    Some(why) => format!("waiting for {what} ({why})"),
                    None => format!("waiting for {what}"),
                },
                after: timeout,
            })?;
        let obj = match next {
            Some(Ok(Event::Init)) => {
                seen_in_list = false;
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                if !seen_in_list {
                    return Err(K8sError::Gone {
                        what: what.to_string(),
                        message: "not found when listed".into(),
                    });
                }
                continue;
            }
            Some(Ok(Event::InitApply(o))) => {
                seen_in_list = true;
                o
            }
            Some(Ok(Event::Apply(o))) => o,
            Some(Ok(Event::Delete(_))) => {
                return Err(K8sError::Gone {
                    what: what.to_string(),
                    message: "deleted while waited for".into(),
                })
            }
            Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                // The watcher relists on its own.
                tracing::debug!(what, "watch expired (410 Gone): relisting");
                continue;
            }
            Some(Err(e)) => {
                let e = classify_watch(e, watch_call, what);
                if e.class() != ErrorClass::Retryable {
                    return Err(e);
                }
                tokio::time::sleep(retry.pause(failures)).await;
                failures += 1;
                continue;
            }
            None => {
                return Err(K8sError::Retryable {
                    code: 0,
                    message: "watch stream ended".into(),
                })
            }
        };
        failures = 0;
        match check(&obj) {
            Step::Done(t) => return Ok(t),
            Step::Fail(e) => return Err(e),
            Step::Wait => why = None,
            Step::Waiting(reason) => why = Some(reason),
        }
    }
}

/// Classifies a watcher error.
pub fn classify_watch(e: watcher::Error, call: Call, what: &str) -> K8sError {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => crate::error::classify(e, call, what),
        watcher::Error::WatchError(s) => {
            crate::error::from_status(s.code, &s.reason, &s.message, call, what)
        }
        other => K8sError::Retryable {
            code: 0,
            message: other.to_string(),
        },
    }
}
