//! Server metrics in Prometheus' text format, served on the admin port (`/metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A histogram of durations in seconds over fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in seconds.
    bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative; summed when rendered).
    counts: Vec<AtomicU64>,
    /// Observations above the last bound.
    over: AtomicU64,
    sum_micros: AtomicU64,
}

/// Appends a gauge's value to `out` in Prometheus' text format.
pub fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// The process's resident memory (`VmRSS`) and its peak (`VmHWM`), in bytes, when `/proc`
/// has them.
pub fn resident_bytes() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            over: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        match self.bounds.iter().position(|b| secs <= *b) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// How many durations were observed.
    pub fn count(&self) -> u64 {
        self.counts
            .iter()
            .chain(std::iter::once(&self.over))
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            total += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {total}");
        }
        total += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

const CHECKPOINT_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const BARRIER_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Everything the server counts.
#[derive(Debug)]
pub struct Metrics {
    pub checkpoint_duration: Histogram,
    pub checkpoint_bytes_uploaded: AtomicU64,
    pub checkpoints_completed: AtomicU64,
    pub checkpoints_failed: AtomicU64,
    pub checkpoint_last_completed_id: AtomicU64,
    /// From a barrier's injection until its epoch is sealed.
    pub barrier_latency: Histogram,
    /// The dataflow's running actors (tables', sources' and views', parallel workers too).
    pub dataflow_actors: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            checkpoint_duration: Histogram::new(CHECKPOINT_BUCKETS),
            checkpoint_bytes_uploaded: AtomicU64::new(0),
            checkpoints_completed: AtomicU64::new(0),
            checkpoints_failed: AtomicU64::new(0),
            checkpoint_last_completed_id: AtomicU64::new(0),
            barrier_latency: Histogram::new(BARRIER_BUCKETS),
            dataflow_actors: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.checkpoint_duration.render(
            "weir_checkpoint_duration_seconds",
            "Time from a checkpoint's trigger until its manifest is written.",
            &mut out,
        );
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        counter(
            &mut out,
            "weir_checkpoint_uploaded_bytes_total",
            "Bytes uploaded to the checkpoint store.",
            &self.checkpoint_bytes_uploaded,
        );
        counter(
            &mut out,
            "weir_checkpoints_completed_total",
            "Checkpoints completed.",
            &self.checkpoints_completed,
        );
        counter(
            &mut out,
            "weir_checkpoints_failed_total",
            "Checkpoints that failed.",
            &self.checkpoints_failed,
        );
        let gauge = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        gauge(
            &mut out,
            "weir_checkpoint_last_completed_id",
            "The id of the newest completed checkpoint.",
            &self.checkpoint_last_completed_id,
        );
        gauge(
            &mut out,
            "weir_dataflow_actors",
            "The dataflow's running actors.",
            &self.dataflow_actors,
        );
        self.barrier_latency.render(
            "weir_barrier_latency_seconds",
            "Time from a barrier's injection until its epoch is sealed.",
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn histograms_render_cumulative_buckets() {
        let m = Metrics::default();
        m.barrier_latency.observe(Duration::from_micros(500));
        m.barrier_latency.observe(Duration::from_millis(20));
        m.barrier_latency.observe(Duration::from_secs(9));
        let text = m.render();
        assert!(text.contains("weir_barrier_latency_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(text.contains("weir_barrier_latency_seconds_bucket{le=\"0.025\"} 2\n"));
        assert!(text.contains("weir_barrier_latency_seconds_bucket{le=\"5\"} 2\n"));
        assert!(text.contains("weir_barrier_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("weir_barrier_latency_seconds_count 3\n"));
        assert!(text.contains("weir_checkpoints_failed_total 0\n"));
    }
}
