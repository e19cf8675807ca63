//! Runs the `std_threads` example (the core behind plain std threads, sandboxes as
//! directories, a death and a close) as a test, so `cargo test` exercises the embedding path
//! the example documents. Its assertions are the example's own.
#![cfg(not(loom))] // the example runs real threads, not a loom model

#[path = "../examples/std_threads.rs"]
mod std_threads;

#[test]
fn the_std_threads_example_runs_and_checks_its_outcome() {
    std_threads::main();
}

#[test]
fn the_example_is_deterministic_in_outcome_run_after_run() {
    for _ in 0..3 {
        std_threads::main();
    }
}
