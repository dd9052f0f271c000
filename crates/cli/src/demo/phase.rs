//! The demo's summary by phase: throughput and latency before the kill, while the replica is
//! down, and after its restart.

use std::time::Instant;

/// Throughput and latency of the operations completed within one part of the run.
pub(super) struct Phase {
    pub name: String,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Phase {
    /// The operations of `done` completed in `[from, to)`.
    pub(super) fn of(name: String, done: &[(Instant, u64)], from: Instant, to: Instant) -> Phase {
        let mut lat: Vec<u64> = done
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, l)| *l)
            .collect();
        lat.sort_unstable();
        let secs = to.saturating_duration_since(from).as_secs_f64().max(0.001);
        Phase {
            name,
            ops_per_s: lat.len() as f64 / secs,
            p50_ms: percentile_ms(&lat, 0.5),
            p99_ms: percentile_ms(&lat, 0.99),
        }
    }
}

/// The `q` quantile of sorted latencies in µs, in ms (0 when there are none).
pub(super) fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() as f64 - 1.0) * q).round() as usize;
    sorted_us[i] as f64 / 1000.0
}
