//! Top-N partitions held in memory (`TopN`), so that a row's count, a partition's first rows
//! and what it emitted are found without reading RocksDB. A partition held holds every row its
//! `rows` state has, with each row's count, and every row its `emitted` state has. While the
//! operator is complete (its state held nothing when the actor started) a partition neither
//! held nor let go has no rows, so a new partition costs no read (`NotHeld`).
//!
//! Partitions are counted in the operators' share of memory (`CacheShare`). Past the share,
//! the partitions least recently used go at the barrier, down to half of what the operator
//! held; a partition not held is read from state (and held) when it is next used. A partition
//! with more than `ROWS_MAX` rows is never held: its rows are read from state as before.

use foldhash::{HashMap, HashSet};

use crate::state::{least_used_half, CacheShare, NotHeld};

/// Most rows of one partition held.
pub(super) const ROWS_MAX: usize = 4096;

/// What a partition held takes besides its bytes: the map's slot, its vectors.
const PARTITION_BYTES: u64 = 128;

/// What a row held (or an emitted row) takes besides its bytes: its place in a vector, its
/// own vector.
const ROW_BYTES: u64 = 48;

/// Most partitions remembered as too large to hold, so that they are not read whole again.
const LARGE_MAX: usize = 1024;

/// Rows with their counts, in order.
pub(super) type Counts = Vec<(Vec<u8>, i64)>;

/// The count of `key` in `counts` (0 when it is not there).
pub(super) fn count_of(counts: &[(Vec<u8>, i64)], key: &[u8]) -> i64 {
    match counts.binary_search_by(|(k, _)| k.as_slice().cmp(key)) {
        Ok(i) => counts[i].1,
        Err(_) => 0,
    }
}

/// Rows counted, in order.
pub(super) fn tally(mut rows: Vec<Vec<u8>>) -> Counts {
    rows.sort_unstable();
    let mut counts: Counts = Vec::new();
    for row in rows {
        match counts.last_mut() {
            Some((last, count)) if *last == row => *count += 1,
            _ => counts.push((row, 1)),
        }
    }
    counts
}

/// A partition's rows and emitted rows.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// By their key after the partition (`order_key`), with their counts.
    rows: Counts,
    /// Output rows emitted, with their counts.
    emitted: Counts,
    /// What its rows and emitted rows take.
    bytes: u64,
}

fn row_bytes(row: &[u8]) -> u64 {
    ROW_BYTES + row.len() as u64
}

impl Held {
    pub fn rows(&self) -> &[(Vec<u8>, i64)] {
        &self.rows
    }

    pub fn count(&self, key: &[u8]) -> i64 {
        count_of(&self.rows, key)
    }

    /// Sets a row's count (0: it is gone).
    pub fn set_row(&mut self, key: &[u8], count: i64) {
        match self.rows.binary_search_by(|(k, _)| k.as_slice().cmp(key)) {
            Ok(i) if count == 0 => {
                self.rows.remove(i);
                self.bytes -= row_bytes(key);
            }
            Ok(i) => self.rows[i].1 = count,
            Err(_) if count == 0 => {}
            Err(i) => {
                self.rows.insert(i, (key.to_vec(), count));
                self.bytes += row_bytes(key);
            }
        }
    }

    /// Removes the rows from `key` on, and returns their keys.
    pub fn cut(&mut self, key: &[u8]) -> Vec<Vec<u8>> {
        let from = self.rows.partition_point(|(k, _)| k.as_slice() < key);
        let gone: Vec<Vec<u8>> = self.rows.drain(from..).map(|(k, _)| k).collect();
        self.bytes -= gone.iter().map(|k| row_bytes(k)).sum::<u64>();
        gone
    }

    pub fn emitted(&self) -> &[(Vec<u8>, i64)] {
        &self.emitted
    }

    pub fn set_emitted(&mut self, emitted: Counts) {
        let bytes = |e: &Counts| e.iter().map(|(k, _)| row_bytes(k)).sum::<u64>();
        self.bytes = self.bytes - bytes(&self.emitted) + bytes(&emitted);
        self.emitted = emitted;
    }

    fn counted(&self, partition: &[u8]) -> u64 {
        PARTITION_BYTES + partition.len() as u64 + self.bytes
    }
}

struct Entry {
    held: Held,
    /// The chunk it was last used in.
    used: u64,
    /// What it is counted for.
    bytes: u64,
}

pub(super) struct Partitions {
    held: HashMap<Vec<u8>, Entry>,
    large: HashSet<Vec<u8>>,
    not_held: NotHeld,
    share: CacheShare,
    /// Chunks seen, the clock of `Entry::used`.
    clock: u64,
    rows_max: usize,
}

impl Partitions {
    /// Partitions of an operator whose state is empty (`complete`) or not.
    pub fn new(share: CacheShare, complete: bool) -> Partitions {
        Partitions {
            held: HashMap::default(),
            large: HashSet::default(),
            not_held: NotHeld::new(complete),
            share,
            clock: 0,
            rows_max: ROWS_MAX,
        }
    }

    pub fn rows_max(&self) -> usize {
        self.rows_max
    }

    /// Lets go of every partition and forgets which (the operator is no longer complete),
    /// and holds none of more than `rows_max` rows from now on.
    #[cfg(test)]
    pub fn forget(&mut self, rows_max: usize) {
        self.held.clear();
        self.large.clear();
        self.not_held.forget(&mut self.share);
        self.share.clear();
        self.rows_max = rows_max;
    }

    /// Lets go of the partitions least recently used, as past the share.
    #[cfg(test)]
    pub fn halve(&mut self) {
        self.let_go_least_used();
    }

    #[cfg(test)]
    pub fn complete(&self) -> bool {
        self.not_held.complete()
    }

    /// Marks the start of a chunk: what is used from now on is more recent than before.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// The partition, when known without a read: held, or new (and held from now on) while
    /// the operator knows it has no state.
    pub fn get(&mut self, partition: &[u8]) -> Option<&mut Held> {
        if !self.held.contains_key(partition) && self.not_held.absent(partition) {
            self.hold(partition, Held::default());
        }
        let clock = self.clock;
        self.held.get_mut(partition).map(|e| {
            e.used = clock;
            &mut e.held
        })
    }

    pub fn is_large(&self, partition: &[u8]) -> bool {
        self.large.contains(partition)
    }

    /// Remembers that `partition` has more than `rows_max` rows.
    pub fn mark_large(&mut self, partition: &[u8]) {
        if self.large.len() < LARGE_MAX {
            self.large.insert(partition.to_vec());
        }
    }

    /// Holds `partition` as read from state.
    pub fn hold(&mut self, partition: &[u8], held: Held) {
        let bytes = held.counted(partition);
        self.share.grow(bytes);
        let entry = Entry {
            held,
            used: self.clock,
            bytes,
        };
        if let Some(old) = self.held.insert(partition.to_vec(), entry) {
            self.share.shrink(old.bytes);
        }
    }

    /// Counts a held partition again after it changed, and lets it go when it has more than
    /// `rows_max` rows.
    pub fn recount(&mut self, partition: &[u8]) {
        let Some(entry) = self.held.get_mut(partition) else {
            return;
        };
        if entry.held.rows.len() > self.rows_max {
            self.let_go(partition);
            self.mark_large(partition);
            return;
        }
        let bytes = entry.held.counted(partition);
        self.share.grow(bytes);
        self.share
            .shrink(std::mem::replace(&mut entry.bytes, bytes));
    }

    /// Lets go of `partition`, remembering that it did.
    fn let_go(&mut self, partition: &[u8]) {
        let bytes = self.held.remove(partition).map_or(0, |e| e.bytes);
        self.not_held
            .let_go_entry(partition, bytes, &mut self.share);
    }

    /// At a barrier: when operators' caches are over their share, lets go of the partitions
    /// least recently used until the partitions held take at most half of what they took.
    pub fn trim(&mut self) {
        if self.share.over() {
            self.let_go_least_used();
        }
    }

    /// Lets go of the partitions least recently used, half of what they take.
    fn let_go_least_used(&mut self) {
        let Some(last) = least_used_half(self.held.values().map(|e| (e.used, e.bytes))) else {
            return;
        };
        let Partitions {
            held,
            not_held,
            share,
            ..
        } = self;
        held.retain(|partition, entry| {
            let keep = entry.used > last;
            if !keep {
                not_held.let_go_entry(partition, entry.bytes, share);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateStore;

    fn held(rows: &[&str]) -> Held {
        let mut held = Held::default();
        for row in rows {
            held.set_row(row.as_bytes(), 1);
        }
        held
    }

    /// Past the share, the partitions used least recently go, and the operator still knows
    /// that a partition it never had has no rows; a partition let go is read again.
    #[test]
    fn the_least_recently_used_partitions_go_and_the_rest_stay_known() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut parts = Partitions::new(store.cache_share(), true);
        for (i, p) in ["a", "b", "c", "d"].iter().enumerate() {
            parts.tick();
            parts.get(p.as_bytes()).unwrap().set_row(b"r", i as i64 + 1);
            parts.recount(p.as_bytes());
        }
        // "a" used last.
        parts.tick();
        assert_eq!(parts.get(b"a").unwrap().count(b"r"), 1);
        parts.halve();
        assert_eq!(parts.held.len(), 2);
        assert!(parts.complete());
        assert!(
            parts.get(b"b").is_none() && parts.get(b"c").is_none(),
            "let go"
        );
        assert_eq!(parts.get(b"d").unwrap().count(b"r"), 4);
        assert_eq!(parts.get(b"a").unwrap().count(b"r"), 1);
        assert_eq!(parts.get(b"new").map(|h| h.rows().len()), Some(0));
        // Held again as read from state.
        parts.hold(b"b", held(&["r", "s"]));
        assert_eq!(parts.get(b"b").unwrap().rows().len(), 2);
        let counted: u64 = parts.held.values().map(|e| e.bytes).sum();
        assert_eq!(parts.share.held(), counted + 2 * crate::state::LET_GO_BYTES);
    }

    #[test]
    fn rows_stay_in_order_and_cut_takes_the_rest() {
        let mut h = held(&["c", "a", "d", "b"]);
        h.set_row(b"b", 0);
        h.set_row(b"a", 3);
        let keys: Vec<&[u8]> = h.rows().iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, [&b"a"[..], b"c", b"d"]);
        assert_eq!((h.count(b"a"), h.count(b"b")), (3, 0));
        assert_eq!(h.cut(b"bb"), vec![b"c".to_vec(), b"d".to_vec()]);
        assert_eq!(h.bytes, row_bytes(b"a"));
        assert_eq!(
            tally(vec![b"y".to_vec(), b"x".to_vec(), b"y".to_vec()]),
            vec![(b"x".to_vec(), 1), (b"y".to_vec(), 2)]
        );
    }
}
