//! What operators hold in memory between barriers, counted against shares of the memory
//! limit: their caches of state (`StateStore::cache_share`), and the epoch's state writes that
//! the next barrier hands to the store (`StateTable`). Past either share, the store asks the
//! coordinator for a barrier (`StateStore::share_passed`): it flushes the writes, and the
//! caches let go of their least recently used entries (`least_used_half`), so that an
//! epoch's memory is bounded by its size, not by the time between periodic barriers. A
//! complete cache remembers what it let go (`NotHeld`), so that a key it never had still
//! costs no read.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use foldhash::fast::RandomState;
use foldhash::HashSet;
use tokio::sync::Notify;

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

    /// What operators' state writes of the current epoch hold together (estimated), and the
    /// most they should before a barrier is asked for.
    pub fn epoch_writes_memory(&self) -> (u64, u64) {
        let c = &self.caches;
        (
            c.unflushed.load(Ordering::Relaxed),
            c.unflushed_max.load(Ordering::Relaxed),
        )
    }

    /// Told when operators' caches or their epoch's writes have passed their share: the
    /// coordinator then injects a barrier, unless `over_shares` says the one it injected
    /// meanwhile has already brought them back.
    pub fn share_passed(&self) -> &Notify {
        &self.caches.passed
    }

    /// Whether operators' caches or their epoch's writes are over their share now. Clears the
    /// request made when they passed it: the next pass asks again.
    pub fn over_shares(&self) -> bool {
        self.caches.asked.store(false, Ordering::Relaxed);
        self.caches.over()
    }
}

/// The memory operators' caches of state take together: an estimate each operator keeps of
/// its own, summed.
#[derive(Debug)]
pub(super) struct Caches {
    pub(super) held: AtomicU64,
    pub(super) max: AtomicU64,
    /// The epoch's state writes operators hold (`StateTable`), and the most they should.
    pub(super) unflushed: AtomicU64,
    pub(super) unflushed_max: AtomicU64,
    /// A barrier was asked for since the coordinator last looked (`over_shares`).
    asked: AtomicBool,
    passed: Notify,
}

impl Caches {
    pub(super) fn new() -> Arc<Caches> {
        Arc::new(Caches {
            held: AtomicU64::new(0),
            max: AtomicU64::new(CACHES_BYTES_DEFAULT),
            unflushed: AtomicU64::new(0),
            unflushed_max: AtomicU64::new(CACHES_BYTES_DEFAULT),
            asked: AtomicBool::new(false),
            passed: Notify::new(),
        })
    }

    fn over(&self) -> bool {
        let over = |held: &AtomicU64, max: &AtomicU64| {
            held.load(Ordering::Relaxed) > max.load(Ordering::Relaxed)
        };
        over(&self.held, &self.max) || over(&self.unflushed, &self.unflushed_max)
    }

    /// Asks for a barrier when the caches or the epoch's writes are over their share (once
    /// until the coordinator looks).
    fn ask_if_over(&self) {
        if self.over() && !self.asked.swap(true, Ordering::Relaxed) {
            self.passed.notify_one();
        }
    }

    /// Counts `added` more bytes of epoch writes, and `removed` fewer.
    pub(super) fn count_unflushed(&self, added: u64, removed: u64) {
        if added > removed {
            self.unflushed.fetch_add(added - removed, Ordering::Relaxed);
            self.ask_if_over();
        } else if removed > added {
            self.unflushed.fetch_sub(removed - added, Ordering::Relaxed);
        }
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
        self.caches.ask_if_over();
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

    /// The most the caches of every operator should hold together.
    pub fn max(&self) -> u64 {
        self.caches.max.load(Ordering::Relaxed)
    }
}

/// What a key let go takes in `NotHeld`: its hash, and the set's slot and spare room for it.
pub const LET_GO_BYTES: u64 = 16;

/// What a cache knows of the keys of its state it does not hold. A cache is complete when its
/// state held nothing as its actor started: every key with state was then held at some time.
/// It stays complete while it remembers each key it let go of, by a 64-bit hash of the key
/// (seeded per cache, so that no data chosen in advance collides): a key neither held nor let
/// go has no state, and finding that costs no read. Two keys with one hash only cost a read.
/// The hashes are counted in the cache's share; past a quarter of what every cache may hold
/// they are forgotten, and the cache is no longer complete: a key not held is then read from
/// state.
#[derive(Debug)]
pub struct NotHeld {
    hasher: RandomState,
    let_go: HashSet<u64>,
    complete: bool,
}

impl NotHeld {
    pub fn new(complete: bool) -> NotHeld {
        NotHeld {
            hasher: RandomState::default(),
            let_go: HashSet::default(),
            complete,
        }
    }

    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Whether `key`, not held, is known to have no state.
    pub fn absent(&self, key: &[u8]) -> bool {
        self.complete
            && (self.let_go.is_empty() || !self.let_go.contains(&self.hasher.hash_one(key)))
    }

    /// Remembers that `key` was let go (it may have state), counting it in `share`.
    pub fn let_go(&mut self, key: &[u8], share: &mut CacheShare) {
        if !self.complete {
            return;
        }
        if self.let_go.insert(self.hasher.hash_one(key)) {
            share.grow(LET_GO_BYTES);
            if self.let_go.len() as u64 * LET_GO_BYTES > share.max() / 4 {
                self.forget(share);
            }
        }
    }

    /// Gives back an entry's `bytes` to `share` and remembers that `key` was let go.
    pub fn let_go_entry(&mut self, key: &[u8], bytes: u64, share: &mut CacheShare) {
        share.shrink(bytes);
        self.let_go(key, share);
    }

    /// Forgets what it knew: the cache is no longer complete.
    pub fn forget(&mut self, share: &mut CacheShare) {
        share.shrink(self.let_go.len() as u64 * LET_GO_BYTES);
        self.let_go = HashSet::default();
        self.complete = false;
    }
}

/// Where the least recently used half of a cache ends, given each entry's last use and bytes
/// (in any order): letting go of every entry last used at or before the use returned frees at
/// least half of what they take. `None` when there are none.
pub fn least_used_half(uses: impl IntoIterator<Item = (u64, u64)>) -> Option<u64> {
    let uses: Vec<(u64, u64)> = uses.into_iter().collect();
    let bytes = uses.iter().map(|&(_, b)| b).sum::<u64>();
    least_recently_used(uses, bytes / 2)
}

/// Where the least recently used entries of a cache end, given each entry's last use and
/// bytes (in any order): letting go of every entry last used at or before the use returned
/// frees at least `bytes` (all of them when they hold less). `None` when there are none.
fn least_recently_used(mut uses: Vec<(u64, u64)>, bytes: u64) -> Option<u64> {
    uses.sort_unstable_by_key(|&(used, _)| used);
    let mut freed = 0;
    for &(used, size) in &uses {
        freed += size;
        if freed >= bytes {
            return Some(used);
        }
    }
    uses.last().map(|&(used, _)| used)
}

impl Drop for CacheShare {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::state::{EpochWrites, StateTable};

    fn asked(store: &StateStore) -> bool {
        store.share_passed().notified().now_or_never().is_some()
    }

    /// An epoch's state writes past their share ask for a barrier once, until the coordinator
    /// looks; taken for the barrier they no longer count. Caches past theirs ask too.
    #[tokio::test]
    async fn writes_and_caches_past_their_share_ask_for_a_barrier() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        store.limit_memory(8 << 16).unwrap(); // shares of 64 KiB
        let mut table = StateTable::new(store.clone(), 7);
        for i in 0u32..200 {
            table.put(i.to_be_bytes().to_vec(), vec![0; 100]);
        }
        // 200 writes of about 200 bytes, and the same keys again: counted once.
        let (held, max) = store.epoch_writes_memory();
        assert_eq!((held, max), (200 * (96 + 4 + 100), 64 << 10));
        for i in 0u32..200 {
            table.delete(i.to_be_bytes().to_vec());
        }
        assert_eq!(store.epoch_writes_memory().0, 200 * (96 + 4));
        assert!(!asked(&store), "under the share");
        for i in 200u32..500 {
            table.put(i.to_be_bytes().to_vec(), vec![0; 100]);
        }
        assert!(asked(&store));
        table.put(b"more".to_vec(), vec![0; 100]);
        assert!(!asked(&store), "asked once until the coordinator looks");
        assert!(store.over_shares());
        let mut writes = EpochWrites::default();
        table.take_writes(&mut writes);
        assert_eq!(store.epoch_writes_memory().0, 0);
        assert!(!store.over_shares());

        let mut share = store.cache_share();
        share.grow(60 << 10);
        assert!(!asked(&store));
        share.grow(8 << 10);
        assert!(asked(&store) && store.over_shares());
        drop(share);
        assert!(!store.over_shares());
    }

    /// A complete cache knows that a key it never let go has no state, counts the keys it
    /// let go in its share, and past a quarter of the caches' share forgets them.
    #[test]
    fn a_complete_cache_remembers_what_it_let_go_within_a_quarter_of_the_share() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        store.limit_memory(8 << 16).unwrap(); // shares of 64 KiB: 1,024 keys let go
        let mut share = store.cache_share();
        let mut known = NotHeld::new(true);
        known.let_go(b"k", &mut share);
        known.let_go(b"k", &mut share);
        assert!(!known.absent(b"k") && known.absent(b"other"));
        assert_eq!(share.held(), LET_GO_BYTES);
        for i in 1u32..1024 {
            known.let_go(&i.to_be_bytes(), &mut share);
        }
        assert!(known.complete() && !known.absent(&7u32.to_be_bytes()));
        known.let_go(b"one more", &mut share);
        assert!(!known.complete() && !known.absent(b"other"));
        assert_eq!(share.held(), 0);
        assert!(!NotHeld::new(false).absent(b"k"));
    }

    #[test]
    fn the_least_recently_used_entries_free_what_is_asked() {
        let uses = vec![(5, 10), (1, 10), (3, 10), (3, 5), (9, 1)];
        assert_eq!(least_recently_used(uses.clone(), 0), Some(1));
        assert_eq!(least_recently_used(uses.clone(), 11), Some(3));
        assert_eq!(least_recently_used(uses.clone(), 26), Some(5));
        assert_eq!(least_recently_used(uses, 1000), Some(9));
        assert_eq!(least_recently_used(Vec::new(), 1), None);
        assert_eq!(least_used_half([(2, 10), (1, 10), (3, 20)]), Some(2));
    }
}
