//! Panics caught per seed (and per scenario step): a core panic is a failing seed with the
//! check name `panic`, not the end of a batch, and it is reported once, on the seed's `FAIL`
//! line, not also by the default panic hook on standard error (a batch of 10,000 seeds prints
//! one line per failing seed; a shrink replays a panicking scenario hundreds of times).
//!
//! The hook is installed once per process and stays quiet only on a thread inside
//! [`catch`]; a panic anywhere else (the driver, a test's own assertion) is reported by the hook
//! that was there before, as always.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Inside [`catch`] on this thread: the hook keeps quiet.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// Where the last quiet panic of this thread happened (`file:line:column`).
    static WHERE: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install() {
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.get() {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
                WHERE.set(at);
            } else {
                before(info);
            }
        }));
    });
}

/// Runs `f`; a panic in it is caught and answered as its message, on one line, with where it
/// happened (`<message> (panicked at <file:line:column>)`), and the panic hook says nothing.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    install();
    let outer = QUIET.replace(true);
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.set(outer);
    r.map_err(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        let msg = msg.replace('\n', " ");
        match WHERE.take() {
            Some(at) => format!("{msg} (panicked at {at})"),
            None => msg,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::catch;

    #[test]
    fn a_panic_is_caught_with_where_it_happened() {
        assert_eq!(catch(|| 7), Ok(7));
        let err = catch(|| -> u8 { panic!("two\nlines") }).unwrap_err();
        assert!(
            err.starts_with("two lines (panicked at sim/src/panics.rs:"),
            "{err}"
        );
        // Nested: the outer catch stays quiet after the inner one.
        let outer = catch(|| {
            let inner = catch(|| -> u8 { panic!("inner") });
            assert!(inner.is_err());
            panic!("outer")
        });
        assert!(outer.unwrap_err().starts_with("outer"));
    }
}
