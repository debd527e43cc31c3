//! Top-N partitions held in memory (`TopN`), so that a row's count, a partition's first rows
//! and what it emitted are found without reading RocksDB. A partition held holds every row its
//! `rows` state has, with each row's count, and every row its `emitted` state has. While the
//! operator is complete (its state held nothing when the actor started, and no partition has
//! been let go since) a partition not held has no rows, so a new partition costs no read.
//!
//! Partitions are counted in the operators' share of memory (`CacheShare`). Past the share,
//! every partition is let go at the barrier, and the operator is no longer complete: a
//! partition not held is read from state (and held) when it is next used. A partition with
//! more than `ROWS_MAX` rows is never held: its rows are read from state as before.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashSet};

use crate::state::CacheShare;

/// Most rows of one partition held.
pub(super) const ROWS_MAX: usize = 4096;

/// What a partition held takes besides its bytes: the map's slot, its maps.
const PARTITION_BYTES: u64 = 160;

/// What a row held (or an emitted row) takes besides its bytes: its place in a map, its vector.
const ROW_BYTES: u64 = 64;

/// Most partitions remembered as too large to hold, so that they are not read whole again.
const LARGE_MAX: usize = 1024;

/// A partition's rows and emitted rows.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// By their key after the partition (`order_key`), with their counts.
    rows: BTreeMap<Vec<u8>, i64>,
    /// Output rows emitted, with their counts.
    emitted: HashMap<Vec<u8>, i64>,
    /// What its rows and emitted rows take.
    bytes: u64,
}

fn row_bytes(row: &[u8]) -> u64 {
    ROW_BYTES + row.len() as u64
}

impl Held {
    pub fn rows(&self) -> &BTreeMap<Vec<u8>, i64> {
        &self.rows
    }

    pub fn count(&self, key: &[u8]) -> i64 {
        self.rows.get(key).copied().unwrap_or(0)
    }

    /// Sets a row's count (0: it is gone).
    pub fn set_row(&mut self, key: &[u8], count: i64) {
        if count == 0 {
            if self.rows.remove(key).is_some() {
                self.bytes -= row_bytes(key);
            }
        } else if let Some(c) = self.rows.get_mut(key) {
            *c = count;
        } else {
            self.rows.insert(key.to_vec(), count);
            self.bytes += row_bytes(key);
        }
    }

    /// Removes the rows from `key` on, and returns their keys.
    pub fn cut(&mut self, key: &[u8]) -> Vec<Vec<u8>> {
        let gone: Vec<Vec<u8>> = self.rows.split_off(key).into_keys().collect();
        self.bytes -= gone.iter().map(|k| row_bytes(k)).sum::<u64>();
        gone
    }

    pub fn emitted(&self) -> &HashMap<Vec<u8>, i64> {
        &self.emitted
    }

    pub fn set_emitted(&mut self, emitted: HashMap<Vec<u8>, i64>) {
        let bytes = |e: &HashMap<Vec<u8>, i64>| e.keys().map(|k| row_bytes(k)).sum::<u64>();
        self.bytes = self.bytes - bytes(&self.emitted) + bytes(&emitted);
        self.emitted = emitted;
    }

    fn counted(&self, partition: &[u8]) -> u64 {
        PARTITION_BYTES + partition.len() as u64 + self.bytes
    }
}

struct Entry {
    held: Held,
    /// What it is counted for.
    bytes: u64,
}

pub(super) struct Partitions {
    held: HashMap<Vec<u8>, Entry>,
    large: HashSet<Vec<u8>>,
    complete: bool,
    share: CacheShare,
    rows_max: usize,
}

impl Partitions {
    /// Partitions of an operator whose state is empty (`complete`) or not.
    pub fn new(share: CacheShare, complete: bool) -> Partitions {
        Partitions {
            held: HashMap::default(),
            large: HashSet::default(),
            complete,
            share,
            rows_max: ROWS_MAX,
        }
    }

    pub fn rows_max(&self) -> usize {
        self.rows_max
    }

    /// Lets go of every partition, and holds none of more than `rows_max` rows from now on.
    #[cfg(test)]
    pub fn forget(&mut self, rows_max: usize) {
        self.let_go_all();
        self.rows_max = rows_max;
    }

    /// The partition, when known without a read: held, or new (and held from now on) while
    /// the operator is complete.
    pub fn get(&mut self, partition: &[u8]) -> Option<&mut Held> {
        if self.complete && !self.held.contains_key(partition) {
            self.hold(partition, Held::default());
        }
        self.held.get_mut(partition).map(|e| &mut e.held)
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
        if let Some(old) = self.held.insert(partition.to_vec(), Entry { held, bytes }) {
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

    /// Lets go of `partition`: the operator is no longer complete.
    fn let_go(&mut self, partition: &[u8]) {
        if let Some(entry) = self.held.remove(partition) {
            self.share.shrink(entry.bytes);
        }
        self.complete = false;
    }

    fn let_go_all(&mut self) {
        self.held.clear();
        self.large.clear();
        self.share.clear();
        self.complete = false;
    }

    /// At a barrier: lets go of every partition when operators' caches are over their share.
    pub fn trim(&mut self) {
        if self.share.over() {
            self.let_go_all();
        }
    }
}
