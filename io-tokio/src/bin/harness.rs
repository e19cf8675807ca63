//! The main job: a realistic harness workload on the embedded local backend.
//!
//! It comes with the io-tokio driver; until then it says so and exits with an error.

fn main() {
    eprintln!(
        "the main job comes with the io-tokio driver (sandkeeper-tokio), which is not built yet"
    );
    std::process::exit(2);
}
