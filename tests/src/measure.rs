//! The measuring tools the performance report shares: a wall clock (which pure code never
//! reads), medians, and the report's sink for figures.

/// Reads the wall clock, for measuring elapsed time.
#[allow(clippy::disallowed_methods)] // a benchmark measures elapsed wall time: that is its job
pub fn wall() -> std::time::Instant {
    std::time::Instant::now()
}

/// The median of `xs` (the upper one for an even count). Panics on an empty list.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Nanoseconds per item of `items` done in `elapsed`.
pub fn ns_per(elapsed: std::time::Duration, items: usize) -> f64 {
    elapsed.as_nanos() as f64 / items as f64
}

/// Where a figure goes: (name, value, unit).
pub type Sink<'a> = &'a mut dyn FnMut(&str, f64, &str);

/// A two-thread tokio runtime for a part of the report, or `None` (said on stderr, with `part`)
/// when one cannot be built.
pub fn runtime(part: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("{part} figures not measured: {e}");
            None
        }
    }
}
