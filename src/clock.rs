//! The server's clocks. The dataflow's clock ([`Clock`]) is the time each barrier carries,
//! which temporal filters compare rows with: injectable, so tests move time by hand instead of
//! sleeping. Durations and schedules (checkpoint intervals, timings, pacing) read
//! [`monotonic`], tokio's clock, which a test that pauses time controls; the times people read
//! in records (when a checkpoint or a recovery started) read [`wall_ms`]. Nothing else reads
//! a clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> i64;
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)
    }
}

/// Now on the monotonic clock.
pub fn monotonic() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// Now on the wall clock, in milliseconds since the Unix epoch.
pub fn wall_ms() -> i64 {
    wall().timestamp_millis()
}

/// Now on the wall clock.
pub fn wall() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

/// A clock that moves only when told to.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(now_us: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(now_us)))
    }

    pub fn set(&self, now_us: i64) {
        self.0.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
