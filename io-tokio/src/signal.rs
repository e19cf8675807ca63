//! A one-shot signal: the way a waiter (an `acquire`, a `release`, a `mirror_settled`, a
//! `close`) learns what the core decided, woken by whoever applied the input that decided it.
//!
//! Written against the [`sync`](crate::sync) shim, so loom checks that no wake-up is lost: the
//! value and the waker live under one lock, so a value set between the waiter's check and its
//! registration is seen by that check or wakes that registration.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{lock, Arc, Mutex};

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

/// The waiting side: a future that resolves to the value once it is set (`None` if the signal
/// was dropped unset).
pub(crate) struct Wait<T> {
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
