//! A join side's rows held in memory by join key (`HashJoin`), so that a key's partners are
//! found without reading RocksDB. A key held holds every row the side has under it, with each
//! row's count and matches as its state entry has them; a key found to have no rows is held
//! too, empty. While the side is complete (its state held nothing when the actor started) a
//! key neither held nor let go has no rows (`NotHeld`), so a key seen for the first time costs
//! no read at all.
//!
//! The cache is counted in the operators' share of memory (`CacheShare`). Past the share, the
//! keys least recently used go at the barrier, down to half of what the side held; a key not
//! held is read from state (and held) when it is next used. A key with more than `ROWS_MAX`
//! rows is never held: its rows are read a part at a time. Such a key is remembered (up to
//! `LARGE_KEYS_MAX` of them), so that it is not read whole again.

use foldhash::{HashMap, HashSet};

use crate::state::{least_used_half, CacheShare, NotHeld};

/// Most rows of one key held: a key with more is read from state a part at a time.
const ROWS_MAX: usize = 4096;

/// What a key held takes besides its bytes: the map's slot, the key's and rows' vectors.
const KEY_BYTES: u64 = 96;

/// What a row held takes besides its bytes: its place in the key's rows and its vector.
const ROW_BYTES: u64 = 48;

/// Most keys remembered as too large to hold, so that they are not read whole again.
const LARGE_KEYS_MAX: usize = 1024;

/// A row of a key held: its encoding (its state key after the join key), how many times the
/// side has it, and how many rows of the other side match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Row {
    pub row: Vec<u8>,
    pub count: i64,
    pub matches: i64,
}

#[derive(Debug)]
struct Entry {
    /// By `row`, as state orders them.
    rows: Vec<Row>,
    /// The chunk it was last used in.
    used: u64,
    /// What it is counted for.
    bytes: u64,
}

#[derive(Debug)]
pub(super) struct SideCache {
    keys: HashMap<Vec<u8>, Entry>,
    /// Keys with more than `ROWS_MAX` rows.
    large: HashSet<Vec<u8>>,
    not_held: NotHeld,
    share: CacheShare,
    /// Chunks seen, the clock of `Entry::used`.
    clock: u64,
    /// Most rows of a key held (`ROWS_MAX`, less in tests).
    rows_max: usize,
}

impl SideCache {
    /// A cache that starts complete when the side's state is empty.
    pub fn new(share: CacheShare, complete: bool) -> SideCache {
        SideCache {
            keys: HashMap::default(),
            large: HashSet::default(),
            not_held: NotHeld::new(complete),
            share,
            clock: 0,
            rows_max: ROWS_MAX,
        }
    }

    /// Most rows of a key held.
    pub fn rows_max(&self) -> usize {
        self.rows_max
    }

    /// Lets go of every key and forgets which (the side is no longer complete), and holds
    /// none of more than `rows_max` rows from now on.
    #[cfg(test)]
    pub fn forget(&mut self, rows_max: usize) {
        self.keys.clear();
        self.large.clear();
        self.not_held.forget(&mut self.share);
        self.share.clear();
        self.rows_max = rows_max;
    }

    /// Holds no key of more than `rows_max` rows from now on, keeping what is held.
    #[cfg(test)]
    pub fn hold_at_most(&mut self, rows_max: usize) {
        self.rows_max = rows_max;
    }

    /// Marks the start of a chunk: what is used from now on is more recent than before.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// The rows of `key`, when known without a read: held, or none when the side knows it has
    /// none.
    pub fn rows(&mut self, key: &[u8]) -> Option<&[Row]> {
        let clock = self.clock;
        match self.keys.get_mut(key) {
            Some(entry) => {
                entry.used = clock;
                Some(&entry.rows)
            }
            None => self.not_held.absent(key).then_some(&[][..]),
        }
    }

    /// Whether `key` was found to have more than `ROWS_MAX` rows.
    pub fn is_large(&self, key: &[u8]) -> bool {
        self.large.contains(key)
    }

    /// Remembers that `key` has more than `ROWS_MAX` rows (unless too many are).
    pub fn mark_large(&mut self, key: &[u8]) {
        if self.large.len() < LARGE_KEYS_MAX {
            self.large.insert(key.to_vec());
        }
    }

    /// Holds `key` with `rows`, all it has in state, in state's order.
    pub fn hold(&mut self, key: &[u8], rows: Vec<Row>) {
        let bytes = KEY_BYTES + key.len() as u64 + rows.iter().map(row_bytes).sum::<u64>();
        self.share.grow(bytes);
        let entry = Entry {
            rows,
            used: self.clock,
            bytes,
        };
        if let Some(old) = self.keys.insert(key.to_vec(), entry) {
            self.share.shrink(old.bytes);
        }
    }

    /// Adds `weight` to the count of `row` under `key` and sets its matches, if the key is
    /// known: held, or known to have no rows (and held from now on). Returns the row's new
    /// count; `None` when the key is not known (its rows are in state only).
    pub fn add(&mut self, key: &[u8], row: &[u8], weight: i64, matches: i64) -> Option<i64> {
        let clock = self.clock;
        if let Some(entry) = self.keys.get_mut(key) {
            entry.used = clock;
            let count = add_to(entry, &mut self.share, row, weight, matches);
            if entry.rows.len() > self.rows_max {
                self.mark_large(key);
                self.let_go(key);
            }
            return Some(count);
        }
        if !self.not_held.absent(key) {
            return None;
        }
        let mut entry = Entry {
            rows: Vec::new(),
            used: clock,
            bytes: KEY_BYTES + key.len() as u64,
        };
        self.share.grow(entry.bytes);
        let count = add_to(&mut entry, &mut self.share, row, weight, matches);
        self.keys.insert(key.to_vec(), entry);
        Some(count)
    }

    /// Sets how many rows of the other side match `row` under `key`, if the key is held.
    pub fn set_matches(&mut self, key: &[u8], row: &[u8], matches: i64) {
        if let Some(entry) = self.keys.get_mut(key) {
            if let Ok(i) = entry.rows.binary_search_by(|r| r.row.as_slice().cmp(row)) {
                entry.rows[i].matches = matches;
            }
        }
    }

    /// Lets go of `key`, remembering that it did.
    fn let_go(&mut self, key: &[u8]) {
        let bytes = self.keys.remove(key).map_or(0, |e| e.bytes);
        self.not_held.let_go_entry(key, bytes, &mut self.share);
    }

    /// At a barrier: when operators' caches are over their share, lets go of the keys least
    /// recently used until those this side holds take at most half of what they took.
    pub fn trim(&mut self) {
        if self.share.over() {
            self.let_go_least_used();
        }
    }

    /// Lets go of the keys least recently used, half of what they take.
    fn let_go_least_used(&mut self) {
        let Some(last) = least_used_half(self.keys.values().map(|e| (e.used, e.bytes))) else {
            return;
        };
        let SideCache {
            keys,
            not_held,
            share,
            ..
        } = self;
        keys.retain(|key, entry| {
            let keep = entry.used > last;
            if !keep {
                not_held.let_go_entry(key, entry.bytes, share);
            }
            keep
        });
    }

    /// Lets go of the keys least recently used, as past the share.
    #[cfg(test)]
    pub fn halve(&mut self) {
        self.let_go_least_used();
    }

    #[cfg(test)]
    pub fn complete(&self) -> bool {
        self.not_held.complete()
    }
}

/// Adds `weight` to the count of `row` in `entry` (and sets its matches); returns its count.
fn add_to(entry: &mut Entry, share: &mut CacheShare, row: &[u8], weight: i64, matches: i64) -> i64 {
    match entry.rows.binary_search_by(|r| r.row.as_slice().cmp(row)) {
        Ok(i) => {
            let count = entry.rows[i].count + weight;
            if count == 0 {
                let bytes = row_bytes(&entry.rows.remove(i));
                entry.bytes -= bytes;
                share.shrink(bytes);
            } else if count > 0 {
                entry.rows[i].count = count;
                entry.rows[i].matches = matches;
            }
            count
        }
        Err(i) => {
            if weight > 0 {
                let new = Row {
                    row: row.to_vec(),
                    count: weight,
                    matches,
                };
                let bytes = row_bytes(&new);
                entry.rows.insert(i, new);
                entry.bytes += bytes;
                share.grow(bytes);
            }
            weight
        }
    }
}

fn row_bytes(row: &Row) -> u64 {
    ROW_BYTES + row.row.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateStore;

    fn row(r: &str, count: i64) -> Row {
        Row {
            row: r.as_bytes().to_vec(),
            count,
            matches: 0,
        }
    }

    fn rows(cache: &mut SideCache, key: &str) -> Option<Vec<String>> {
        cache.rows(key.as_bytes()).map(|rows| {
            rows.iter()
                .map(|r| format!("{}x{}", String::from_utf8_lossy(&r.row), r.count))
                .collect()
        })
    }

    #[test]
    fn a_complete_side_knows_every_key_and_an_incomplete_one_only_those_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut complete = SideCache::new(store.cache_share(), true);
        assert_eq!(rows(&mut complete, "k"), Some(vec![]));
        assert_eq!(complete.add(b"k", b"b", 1, 0), Some(1));
        complete.add(b"k", b"a", 2, 0);
        complete.add(b"k", b"c", 1, 0);
        assert_eq!(complete.add(b"k", b"b", -1, 0), Some(0));
        assert_eq!(complete.add(b"k", b"a", 1, 3), Some(3));
        assert_eq!(
            rows(&mut complete, "k"),
            Some(vec!["ax3".into(), "cx1".into()])
        );
        complete.set_matches(b"k", b"c", 5);
        assert_eq!(complete.rows(b"k").unwrap()[1].matches, 5);

        let mut partial = SideCache::new(store.cache_share(), false);
        assert_eq!(rows(&mut partial, "k"), None);
        assert_eq!(
            partial.add(b"k", b"a", 1, 0),
            None,
            "a key not held stays unknown"
        );
        assert_eq!(rows(&mut partial, "k"), None);
        partial.hold(b"k", vec![row("a", 1)]);
        assert_eq!(partial.add(b"k", b"a", -1, 0), Some(0));
        assert_eq!(rows(&mut partial, "k"), Some(vec![]));
    }

    #[test]
    fn past_the_share_the_least_recently_used_keys_go_and_the_side_stays_complete() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        store.limit_memory(8 << 16).unwrap(); // caches' share: 64 KiB
        let mut cache = SideCache::new(store.cache_share(), true);
        for k in 0u32..1000 {
            cache.tick();
            cache.add(&k.to_be_bytes(), &[0; 100], 1, 0);
        }
        cache.tick();
        assert!(cache.rows(&999u32.to_be_bytes()).is_some());
        let before = cache.share.held();
        cache.trim();
        assert!(cache.share.held() <= before / 2 + 1000 * crate::state::LET_GO_BYTES);
        assert!(
            cache.rows(&999u32.to_be_bytes()).is_some(),
            "used last, kept"
        );
        assert!(
            cache.rows(&0u32.to_be_bytes()).is_none(),
            "used first, gone, and known to have rows"
        );
        assert_eq!(rows(&mut cache, "never"), Some(vec![]));
        assert!(cache.complete());
        assert_eq!(store.caches_memory().0, cache.share.held());
    }

    #[test]
    fn a_key_past_rows_max_is_let_go_and_remembered_as_large() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut cache = SideCache::new(store.cache_share(), true);
        for r in 0..=ROWS_MAX as u32 {
            cache.add(b"k", &r.to_be_bytes(), 1, 0);
        }
        assert!(cache.is_large(b"k"));
        assert_eq!(rows(&mut cache, "k"), None);
        // The side stays complete, and a later row of the key is not held as if it were the
        // key's only one.
        assert_eq!(rows(&mut cache, "other"), Some(vec![]));
        assert_eq!(cache.add(b"k", b"later", 1, 0), None);
        assert_eq!(rows(&mut cache, "k"), None);
        assert_eq!(store.caches_memory().0, crate::state::LET_GO_BYTES);
        // Past the keys it can remember as large, a key let go for its size is still known
        // to have rows.
        cache.hold_at_most(1);
        for k in 0..=LARGE_KEYS_MAX as u32 {
            for r in [b"a", b"b"] {
                cache.add(&k.to_be_bytes(), r, 1, 0);
            }
        }
        let last = (LARGE_KEYS_MAX as u32).to_be_bytes();
        assert!(!cache.is_large(&last) && cache.rows(&last).is_none());
        assert!(cache.complete());
    }
}
