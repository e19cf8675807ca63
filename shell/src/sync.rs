//! The `sync` shim: the shell takes its `Arc` and `Mutex` from here, and its way of blocking a
//! thread on a future, so the same code runs on `std` in a program and on `loom`'s
//! model-checked primitives under `--cfg loom` (the tokio way: models beside the code they
//! check).

use std::future::Future;

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, taking the value even when another thread panicked while holding it: every
/// critical section of this crate leaves its state consistent before it can panic (a panic
/// there is a bug of the core, and the shell keeps answering rather than cascading it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Runs `future` to completion on the calling thread: polls it, and parks the thread until its
/// waker unparks it. For threads that have no runtime (see [`Wait::wait`](crate::Wait::wait)).
#[cfg(not(loom))]
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    use std::thread::{self, Thread};

    /// Wakes the parked thread. An unpark that comes before the park is kept by the thread, so
    /// a wake-up between a poll and the park is not lost; a spurious wake-up only polls again.
    struct Unpark(Thread);

    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }

        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }

    let mut future = std::pin::pin!(future);
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

/// Under loom, blocking is loom's own: a model's threads are not OS threads.
#[cfg(loom)]
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    loom::future::block_on(future)
}
