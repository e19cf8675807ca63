//! The timer task: fires the core's deadlines.
//!
//! It reads the core's earliest deadline and compares it with the clock *before* it sleeps
//! (tokio's cooperative budget can wake an elapsed sleep late, and a deadline already passed
//! must not wait for a wake-up). It is woken early when an input changes the deadline, holds
//! only a weak handle while it sleeps (a dropped keeper is not kept alive), and ends when close
//! has finished.

use std::sync::{Arc, Weak};

use sandkeeper_shell::{Executor, Shared};
use tokio::sync::Notify;

use crate::backend::Backend;
use crate::executor::TokioExecutor;

/// Runs until close finished or the keeper is gone.
pub(crate) async fn run<B: Backend>(shared: Weak<Shared<TokioExecutor<B>>>, wake: Arc<Notify>) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if strong.is_closed() {
            return;
        }
        let next = strong.next_deadline();
        let now = strong.executor().now();
        let clock = strong.executor().clock();
        match next {
            Some(at) if at <= now => {
                tracing::trace!(deadline = %at, "timeout");
                Shared::timeout(&strong);
                continue;
            }
            Some(at) => {
                drop(strong);
                let when = clock.tokio(at);
                tokio::select! {
                    () = tokio::time::sleep_until(when) => {}
                    () = wake.notified() => {}
                }
            }
            None => {
                drop(strong);
                wake.notified().await;
            }
        }
    }
}
