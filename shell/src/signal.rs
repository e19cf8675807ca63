//! A one-shot signal: the way a waiter (an acquire, a release, a `mirror_settled`, a close)
//! learns what the core decided, woken by whoever applied the input that decided it. The
//! waiting side, [`Wait`], is a future for async runtimes and has a blocking
//! [`wait`](Wait::wait) for plain threads.
//!
//! Written against the [`sync`](crate::sync) shim, so loom checks that no wake-up is lost: the
//! value and the waker live under one lock, so a value set between the waiter's check and its
//! registration is seen by that check or wakes that registration.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{block_on, lock, Arc, Mutex};

struct Cell<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The signal was set or dropped: nothing more will come.
    done: bool,
}

/// The setting side of a one-shot signal. Dropping it unset wakes the waiter with `None`, so
/// no waiter can hang on a signal nobody will set.
pub(crate) struct Signal<T> {
    cell: Arc<Mutex<Cell<T>>>,
}

/// The answer to one thing a [`Shared`](crate::Shared) was asked: a release's completion, a
/// session's settled mirror, a close report.
///
/// Await it on any async runtime, or block a plain thread on it with [`wait`](Self::wait). It
/// resolves to `Some(value)` once the core decided, or to `None` if the shell was dropped
/// before it could decide (never otherwise: after `Closed` every waiter gets an answer).
/// Dropping it abandons nothing: what it waits for happens anyway.
pub struct Wait<T> {
    cell: Arc<Mutex<Cell<T>>>,
}

/// A new signal and its waiter.
pub(crate) fn signal<T>() -> (Signal<T>, Wait<T>) {
    let cell = Arc::new(Mutex::new(Cell {
        value: None,
        waker: None,
        done: false,
    }));
    (Signal { cell: cell.clone() }, Wait { cell })
}

impl<T> Signal<T> {
    /// Sets the value and wakes the waiter.
    pub(crate) fn set(self, value: T) {
        self.finish(Some(value));
    }

    fn finish(&self, value: Option<T>) {
        let waker = {
            let mut cell = lock(&self.cell);
            if cell.done {
                return;
            }
            cell.done = true;
            cell.value = value;
            cell.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Signal<T> {
    fn drop(&mut self) {
        self.finish(None);
    }
}

impl<T> Wait<T> {
    /// A waiter that is ready at once with `value`.
    pub(crate) fn ready(value: T) -> Self {
        let (signal, wait) = signal();
        signal.set(value);
        wait
    }

    /// Blocks the calling thread until the answer comes (parking it in between): for
    /// embedders without an async runtime. Never call it from inside an
    /// [`Executor`](crate::Executor) method or an async task: it would block what has to answer.
    pub fn wait(self) -> Option<T> {
        block_on(self)
    }

    /// Whether the answer has come (so [`wait`](Self::wait) would return at once).
    pub fn is_ready(&self) -> bool {
        lock(&self.cell).done
    }
}

impl<T> Future for Wait<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut cell = lock(&self.cell);
        if cell.done {
            cell.waker = None;
            return Poll::Ready(cell.value.take());
        }
        match &mut cell.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Unpin for Wait<T> {}

impl<T> std::fmt::Debug for Wait<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("ready", &self.is_ready())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_blocking_wait_is_woken_by_a_set_on_another_thread() {
        let (signal, wait) = signal();
        let setter = std::thread::spawn(move || signal.set(7));
        assert_eq!(wait.wait(), Some(7));
        setter.join().unwrap();
    }

    #[test]
    fn a_signal_dropped_unset_wakes_its_waiter_with_none() {
        let (signal, wait) = signal::<u8>();
        assert!(!wait.is_ready());
        drop(signal);
        assert!(wait.is_ready());
        assert_eq!(wait.wait(), None);
    }
}
