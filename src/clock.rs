//! The dataflow's clock: the time each barrier carries, which temporal filters compare rows
//! with. Injectable, so tests move time by hand instead of sleeping.

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
