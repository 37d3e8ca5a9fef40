//! Order statistics for the benchmarks: medians of rounds and latency percentiles.

use std::time::Duration;

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The `p` quantile (0 to 1) of `sorted`, in milliseconds; NaN when empty.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    percentile(sorted, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// The `p` quantile (0 to 1) of `sorted`; `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() as f64 - 1.0) * p).round() as usize])
}
