//! The `sync` shim: the shared-state layer takes its `Arc` and `Mutex` from here, so the same
//! code runs on `std` in a program and on `loom`'s model-checked primitives under `--cfg loom`
//! (the tokio way: models beside the code they check).

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, taking the value even when another thread panicked while holding it: every
/// critical section of this crate leaves its state consistent before it can panic (a panic
/// there is a bug of the core, and the driver keeps answering rather than cascading it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
