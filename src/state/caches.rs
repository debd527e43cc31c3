//! What operators' caches of their state hold in memory, counted against one share of the
//! memory limit (`StateStore::cache_share`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::StateStore;

/// What operators' caches of state may hold together until the memory limit is known
/// (`StateStore::limit_memory`).
const CACHES_BYTES_DEFAULT: u64 = 64 << 20;

impl StateStore {
    /// A new operator's share of what operators' caches of state may hold.
    pub fn cache_share(&self) -> CacheShare {
        CacheShare {
            caches: self.caches.clone(),
            held: 0,
        }
    }

    /// What operators' caches of state hold together, and the most they should.
    pub fn caches_memory(&self) -> (u64, u64) {
        let c = &self.caches;
        (
            c.held.load(Ordering::Relaxed),
            c.max.load(Ordering::Relaxed),
        )
    }
}

/// The memory operators' caches of state take together: an estimate each operator keeps of
/// its own, summed.
#[derive(Debug)]
pub(super) struct Caches {
    pub(super) held: AtomicU64,
    pub(super) max: AtomicU64,
}

impl Caches {
    pub(super) fn new() -> Arc<Caches> {
        Arc::new(Caches {
            held: AtomicU64::new(0),
            max: AtomicU64::new(CACHES_BYTES_DEFAULT),
        })
    }
}

/// An operator's caches of its state (an aggregation's groups), counted against what every
/// operator's caches may hold together (an eighth of `memory_limit`). The cache only saves
/// reads of RocksDB: an operator whose caches are over empties its own at its next barrier.
/// What it counts is given back when it is cleared or dropped.
#[derive(Debug)]
pub struct CacheShare {
    caches: Arc<Caches>,
    held: u64,
}

impl CacheShare {
    pub fn grow(&mut self, bytes: u64) {
        self.held += bytes;
        self.caches.held.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.held);
        self.held -= bytes;
        self.caches.held.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Gives back all it counted: the cache was emptied.
    pub fn clear(&mut self) {
        self.shrink(self.held);
    }

    /// Whether the caches of every operator hold more than they should.
    pub fn over(&self) -> bool {
        self.caches.held.load(Ordering::Relaxed) > self.caches.max.load(Ordering::Relaxed)
    }

    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for CacheShare {
    fn drop(&mut self) {
        self.clear();
    }
}
