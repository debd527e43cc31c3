//! The writes between two checkpoints, kept for a delta checkpoint, and their SST file
//! (`docs/design/0003-checkpoints.md`, "Delta checkpoints").

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use rocksdb::SstFileWriter;

use super::{db_options, storage_error};
use crate::error::Result;

type Write = (Vec<u8>, Option<Vec<u8>>);

/// The writes committed since the last checkpoint, in commit order: what a delta checkpoint
/// holds.
#[derive(Debug)]
pub(super) struct Changes {
    pub(super) writes: Vec<Write>,
    bytes: usize,
    /// False once something happened that a delta does not carry: a whole state table
    /// deleted, or more than the store's `delta_bytes_max` bytes written.
    pub(super) whole: bool,
}

impl Changes {
    /// No writes yet; with `keep` false, none will be kept.
    pub(super) fn new(keep: bool) -> Changes {
        Changes {
            writes: Vec::new(),
            bytes: 0,
            whole: keep,
        }
    }

    pub(super) fn spoil(&mut self) {
        *self = Changes::new(false);
    }

    /// Keeps one commit's writes (each state table's in key order, as
    /// `StateTable::take_writes` gives them).
    pub(super) fn record(&mut self, writes: Vec<Write>, bytes_max: usize) {
        if !self.whole {
            return;
        }
        // Each write's bytes and its two vectors' headers and allocations.
        self.bytes += writes
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 64)
            .sum::<usize>();
        if self.bytes > bytes_max {
            self.spoil();
        } else {
            self.writes.extend(writes);
        }
    }

    pub(super) fn into_delta(self) -> Delta {
        Delta {
            writes: self.writes,
        }
    }
}

/// The writes of the epochs since the previous checkpoint, last write of a key winning.
#[derive(Debug)]
pub struct Delta {
    writes: Vec<Write>,
}

impl Delta {
    /// Writes the delta as an SST file at `path` (puts and deletions in key order, each key's
    /// last write), for `StateStore::open_restored` to ingest on top of the state before it.
    /// Returns the file's size, or `None` (and writes nothing) when there were no writes.
    pub fn write(self, path: &Path) -> Result<Option<u64>> {
        if self.writes.is_empty() {
            return Ok(None);
        }
        let opts = db_options();
        let mut sst = SstFileWriter::create(&opts);
        sst.open(path).map_err(storage_error)?;
        for (key, value) in last_writes(self.writes) {
            match value {
                Some(v) => sst.put(&key, &v),
                None => sst.delete(&key),
            }
            .map_err(storage_error)?;
        }
        sst.finish().map_err(storage_error)?;
        Ok(Some(std::fs::metadata(path)?.len()))
    }
}

/// Each key's last write, in key order.
///
/// The writes come as runs already in key order (a commit's writes are each state table's in
/// order), and most runs share no key range with any other: those are laid end to end in the
/// order of their first keys, without comparing their keys again. Only runs whose ranges
/// overlap (a table written in several epochs since the checkpoint) are merged, a key's last
/// write winning.
fn last_writes(writes: Vec<Write>) -> Vec<Write> {
    let runs = ascending_runs(&writes);
    if runs.len() == 1 {
        return writes;
    }
    let key = |i: usize| writes[i].0.as_slice();
    let mut by_first: Vec<usize> = (0..runs.len()).collect();
    by_first.sort_by(|&a, &b| key(runs[a].0).cmp(key(runs[b].0)).then(a.cmp(&b)));
    let mut order: Vec<usize> = Vec::with_capacity(writes.len());
    let mut group: Vec<usize> = Vec::new();
    // The write with the greatest key of the runs in `group`.
    let mut group_last: Option<usize> = None;
    for r in by_first {
        let (start, end) = runs[r];
        if group_last.is_some_and(|last| key(start) > key(last)) {
            ordered(&mut group, &runs, &writes, &mut order);
            group_last = None;
        }
        if group_last.is_none_or(|last| key(end - 1) > key(last)) {
            group_last = Some(end - 1);
        }
        group.push(r);
    }
    ordered(&mut group, &runs, &writes, &mut order);
    let mut slots: Vec<Option<Write>> = writes.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// The maximal runs of `writes` whose keys strictly ascend, as index ranges.
fn ascending_runs(writes: &[Write]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..writes.len() {
        if writes[i].0 <= writes[i - 1].0 {
            runs.push((start, i));
            start = i;
        }
    }
    runs.push((start, writes.len()));
    runs
}

/// Appends to `order` the indexes of the writes of the runs in `group` (whose key ranges
/// overlap, or one run) in key order, each key once with its last write; empties `group`.
/// Each run's keys strictly ascend.
fn ordered(
    group: &mut Vec<usize>,
    runs: &[(usize, usize)],
    writes: &[Write],
    order: &mut Vec<usize>,
) {
    if let [one] = group[..] {
        order.extend(runs[one].0..runs[one].1);
        group.clear();
        return;
    }
    // A merge of the runs, each a cursor into `writes`: the heap pops the least key, and of
    // equal keys the earliest run first (runs are numbered in commit order), so a key's last
    // write is the one after which the heap's least key differs.
    let mut heap: BinaryHeap<Reverse<(&[u8], usize, usize)>> = group
        .drain(..)
        .map(|r| Reverse((writes[runs[r].0].0.as_slice(), r, runs[r].0)))
        .collect();
    while let Some(Reverse((key, r, i))) = heap.pop() {
        if i + 1 < runs[r].1 {
            heap.push(Reverse((writes[i + 1].0.as_slice(), r, i + 1)));
        }
        if heap.peek().is_none_or(|Reverse((next, ..))| *next != key) {
            order.push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// One commit: for each of a few tables, a few keys of a small key space, in key order.
    fn commit(seed: &mut u64, tables: u8) -> Vec<Write> {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as u32
        };
        let mut out = Vec::new();
        for table in 0..tables {
            if next() % 3 == 0 {
                continue;
            }
            let keys: std::collections::BTreeSet<u8> =
                (0..next() % 6).map(|_| (next() % 12) as u8).collect();
            for k in keys {
                let value = (next() % 4 != 0).then(|| next().to_be_bytes().to_vec());
                out.push((vec![table, k], value));
            }
        }
        out
    }

    #[test]
    fn last_writes_are_each_keys_last_in_key_order() {
        let mut seed = 7;
        for case in 0..2000 {
            let commits = 1 + case % 5;
            let writes: Vec<Write> = (0..commits)
                .flat_map(|_| commit(&mut seed, 1 + (case % 4) as u8))
                .collect();
            let expected: Vec<Write> = writes
                .iter()
                .cloned()
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect();
            assert_eq!(last_writes(writes.clone()), expected, "writes {writes:?}");
        }
    }

    #[test]
    fn disjoint_runs_are_laid_end_to_end() {
        let w = |t: u8, k: u8| (vec![t, k], Some(vec![k]));
        let writes = vec![w(3, 1), w(3, 2), w(1, 5), w(1, 6), w(2, 0)];
        let keys: Vec<Vec<u8>> = last_writes(writes).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [[1, 5], [1, 6], [2, 0], [3, 1], [3, 2]]);
    }
}
