//! The writes between two checkpoints, kept for a delta checkpoint, and their SST files
//! (`docs/design/0003-checkpoints.md`, "Delta checkpoints").

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use rocksdb::SstFileWriter;

use super::{db_options, storage_error};
use crate::error::{Error, Result};

/// A write as `Packed` holds it: a key and its new value, or `None` for a deletion.
type Write<'a> = (&'a [u8], Option<&'a [u8]>);

/// Writes packed end to end in one buffer, each key followed by its value, in the order
/// written. An epoch's writes are packed as the barrier takes them from the operators (while
/// they are in the CPU's caches), and the buffers are kept as they are until the next
/// checkpoint writes its delta: that then reads memory in order, instead of a key and a value
/// scattered over the heap for each write.
#[derive(Debug, Default)]
pub(super) struct Packed {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

/// Where a write is in `Packed::bytes`: its key at `at`, then its value.
#[derive(Debug, Clone, Copy)]
struct Entry {
    at: usize,
    key: usize,
    /// `DELETED` for a deletion.
    value: usize,
}

const DELETED: usize = usize::MAX;

/// What a packed write takes besides its bytes.
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

impl Packed {
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Makes room for `writes` more writes of `bytes` bytes in all.
    pub(super) fn reserve(&mut self, writes: usize, bytes: usize) {
        self.entries.reserve(writes);
        self.bytes.reserve(bytes);
    }

    /// Packs a write of the key `prefix` then `key`.
    pub(super) fn push(&mut self, prefix: &[u8], key: &[u8], value: Option<&[u8]>) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(prefix);
        self.bytes.extend_from_slice(key);
        let value_len = match value {
            Some(v) => {
                self.bytes.extend_from_slice(v);
                v.len()
            }
            None => DELETED,
        };
        self.entries.push(Entry {
            at,
            key: prefix.len() + key.len(),
            value: value_len,
        });
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = Write<'_>> + '_ {
        self.entries.iter().map(|e| {
            let key_end = e.at + e.key;
            let value = (e.value != DELETED).then(|| &self.bytes[key_end..key_end + e.value]);
            (&self.bytes[e.at..key_end], value)
        })
    }

    /// What it takes in memory (its buffers' lengths).
    fn size(&self) -> usize {
        self.bytes.len() + self.entries.len() * ENTRY_BYTES
    }
}

/// What the store keeps of the writes between two checkpoints.
#[derive(Debug, Clone)]
pub enum Keep {
    /// Nothing: every checkpoint is a base one.
    Nothing,
    /// The writes, in memory until the checkpoint writes them as one SST file.
    Writes,
    /// The writes, and whenever `part_bytes` of them are not yet written, a thread writes
    /// them ahead of the checkpoint as an SST file in `dir` (a `Part`), one at a time: the
    /// checkpoint then writes only what came after the last part.
    Ahead { dir: PathBuf, part_bytes: usize },
}

/// The writes committed since the last checkpoint, in commit order: what a delta checkpoint
/// holds.
#[derive(Debug)]
pub(super) struct Changes {
    keep: Keep,
    /// The writes not in a part, in commit order.
    pub(super) commits: Vec<Packed>,
    /// The parts written ahead (or being written), oldest first; each holds writes committed
    /// before those of the next and of `commits`.
    parts: Vec<Part>,
    /// What the writes since the checkpoint take, in parts or not.
    bytes: usize,
    /// What `commits` take.
    unwritten: usize,
    /// The next part's number, for its file's name.
    next_part: u64,
    /// False once something happened that a delta does not carry: a whole state table
    /// deleted, or more than the store's `delta_bytes_max` bytes written.
    pub(super) whole: bool,
}

impl Changes {
    pub(super) fn new(keep: Keep) -> Changes {
        Changes {
            whole: !matches!(keep, Keep::Nothing),
            keep,
            commits: Vec::new(),
            parts: Vec::new(),
            bytes: 0,
            unwritten: 0,
            next_part: 0,
        }
    }

    /// No writes yet, kept as these were.
    pub(super) fn fresh(&self) -> Changes {
        Changes {
            next_part: self.next_part,
            ..Changes::new(self.keep.clone())
        }
    }

    /// Keeps the writes from now on as `keep` says (the next checkpoint is a base one when
    /// that is nothing).
    pub(super) fn keep(&mut self, keep: Keep) {
        let nothing = matches!(keep, Keep::Nothing);
        self.keep = keep;
        if nothing {
            self.spoil();
        }
    }

    /// Drops the writes kept (and the parts' files): the next checkpoint is a base one.
    pub(super) fn spoil(&mut self) {
        self.commits.clear();
        self.parts.clear();
        self.bytes = 0;
        self.unwritten = 0;
        self.whole = false;
    }

    /// Keeps one commit's writes (each state table's in key order, as
    /// `StateTable::take_writes` gives them).
    pub(super) fn record(&mut self, writes: Packed, bytes_max: usize) {
        if !self.whole {
            return;
        }
        let size = writes.size();
        self.bytes += size;
        if self.bytes > bytes_max {
            self.spoil();
            return;
        }
        self.unwritten += size;
        self.commits.push(writes);
        let Keep::Ahead { dir, part_bytes } = &self.keep else {
            return;
        };
        if self.unwritten < *part_bytes || !self.parts.last().is_none_or(Part::is_written) {
            return;
        }
        let path = dir.join(format!("part-{:020}.sst", self.next_part));
        let commits = std::mem::take(&mut self.commits);
        match Part::start(path, commits) {
            Ok(part) => {
                self.next_part += 1;
                self.unwritten = 0;
                self.parts.push(part);
            }
            // The writes went with the thread that could not start: the next checkpoint is a
            // base one.
            Err(e) => {
                tracing::warn!("cannot start writing a delta's part: {e}");
                self.spoil();
            }
        }
    }

    /// How many parts there are, and whether each is written.
    #[cfg(test)]
    pub(super) fn parts(&self) -> (usize, bool) {
        (self.parts.len(), self.parts.iter().all(Part::is_written))
    }

    pub(super) fn into_delta(self) -> Delta {
        Delta {
            parts: self.parts,
            commits: self.commits,
        }
    }
}

/// Writes of a delta written ahead of its checkpoint as an SST file, by a thread of its own.
/// Dropped without being waited for, its file is removed once written.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    /// The thread writing it (`None` once waited for); it returns the file's size, or `None`
    /// when there was nothing to write.
    thread: Option<JoinHandle<Result<Option<u64>>>>,
}

impl Part {
    fn start(path: PathBuf, commits: Vec<Packed>) -> std::io::Result<Part> {
        let at = path.clone();
        let thread = std::thread::Builder::new()
            .name("weir-delta".into())
            .spawn(move || write_sst(&commits, &at))?;
        Ok(Part {
            path,
            thread: Some(thread),
        })
    }

    fn is_written(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits until the part is written (a blocking call): its file and size, or `None` when
    /// it held no writes.
    fn wait(mut self) -> Result<Option<(PathBuf, u64)>> {
        let Some(thread) = self.thread.take() else {
            return Ok(None);
        };
        let written = thread
            .join()
            .unwrap_or_else(|_| Err(Error::internal("writing a delta's part panicked")));
        match written {
            Ok(size) => Ok(size.map(|size| (std::mem::take(&mut self.path), size))),
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                Err(e)
            }
        }
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let path = std::mem::take(&mut self.path);
        // Not waited for here (a drop must not block): a thread of its own removes the file
        // once it is written. If none can be started, the next start's sweep removes it.
        let _ = std::thread::Builder::new()
            .name("weir-delta".into())
            .spawn(move || {
                let _ = thread.join();
                let _ = std::fs::remove_file(path);
            });
    }
}

/// The writes of the epochs since the previous checkpoint, last write of a key winning: the
/// parts written ahead, then the writes after them.
#[derive(Debug)]
pub struct Delta {
    parts: Vec<Part>,
    commits: Vec<Packed>,
}

impl Delta {
    /// The most files `write` can make.
    pub fn files_max(&self) -> usize {
        self.parts.len() + 1
    }

    /// Writes the delta as SST files at the first of `paths` (at least `files_max` of them),
    /// oldest first, for `StateStore::open_restored` to ingest in that order on top of the
    /// state before it: the parts written ahead are waited for (a blocking call) and moved
    /// there, then the writes after them written. Each file holds its writes' puts and
    /// deletions in key order, each key's last write. Returns the files' sizes: no file when
    /// there were no writes. On an error, none of the files is left.
    pub fn write(self, paths: &[PathBuf]) -> Result<Vec<u64>> {
        let mut sizes = Vec::new();
        let written = self.write_into(paths, &mut sizes);
        if written.is_err() {
            for path in &paths[..sizes.len()] {
                let _ = std::fs::remove_file(path);
            }
        }
        written.map(|()| sizes)
    }

    fn write_into(self, paths: &[PathBuf], sizes: &mut Vec<u64>) -> Result<()> {
        if paths.len() < self.files_max() {
            return Err(Error::internal("fewer paths than a delta's files"));
        }
        for part in self.parts {
            if let Some((path, size)) = part.wait()? {
                let to = &paths[sizes.len()];
                if let Err(e) = std::fs::rename(&path, to) {
                    let _ = std::fs::remove_file(&path);
                    return Err(e.into());
                }
                sizes.push(size);
            }
        }
        if let Some(size) = write_sst(&self.commits, &paths[sizes.len()])? {
            sizes.push(size);
        }
        Ok(())
    }
}

/// Writes `commits` as an SST file at `path` (puts and deletions in key order, each key's
/// last write). Returns the file's size, or `None` (and writes nothing) when there were no
/// writes.
fn write_sst(commits: &[Packed], path: &Path) -> Result<Option<u64>> {
    let writes: Vec<Write> = commits.iter().flat_map(Packed::iter).collect();
    if writes.is_empty() {
        return Ok(None);
    }
    let opts = db_options();
    let mut sst = SstFileWriter::create(&opts);
    sst.open(path).map_err(storage_error)?;
    for i in last_writes(&writes) {
        let (key, value) = writes[i];
        match value {
            Some(v) => sst.put(key, v),
            None => sst.delete(key),
        }
        .map_err(storage_error)?;
    }
    sst.finish().map_err(storage_error)?;
    Ok(Some(std::fs::metadata(path)?.len()))
}

/// Where each key's last write is in `writes`, in key order.
///
/// The writes come as runs already in key order (a commit's writes are each state table's in
/// order), and most runs share no key range with any other: those are laid end to end in the
/// order of their first keys, without comparing their keys again. Only runs whose ranges
/// overlap (a table written in several epochs since the checkpoint) are merged, a key's last
/// write winning.
fn last_writes(writes: &[Write]) -> Vec<usize> {
    let runs = ascending_runs(writes);
    if runs.len() == 1 {
        return (0..writes.len()).collect();
    }
    let key = |i: usize| writes[i].0;
    let mut by_first: Vec<usize> = (0..runs.len()).collect();
    by_first.sort_by(|&a, &b| key(runs[a].0).cmp(key(runs[b].0)).then(a.cmp(&b)));
    let mut order: Vec<usize> = Vec::with_capacity(writes.len());
    let mut group: Vec<usize> = Vec::new();
    // The write with the greatest key of the runs in `group`.
    let mut group_last: Option<usize> = None;
    for r in by_first {
        let (start, end) = runs[r];
        if group_last.is_some_and(|last| key(start) > key(last)) {
            ordered(&mut group, &runs, writes, &mut order);
            group_last = None;
        }
        if group_last.is_none_or(|last| key(end - 1) > key(last)) {
            group_last = Some(end - 1);
        }
        group.push(r);
    }
    ordered(&mut group, &runs, writes, &mut order);
    order
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
        .map(|r| Reverse((writes[runs[r].0].0, r, runs[r].0)))
        .collect();
    while let Some(Reverse((key, r, i))) = heap.pop() {
        if i + 1 < runs[r].1 {
            heap.push(Reverse((writes[i + 1].0, r, i + 1)));
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

    type Owned = (Vec<u8>, Option<Vec<u8>>);

    /// One commit: for each of a few tables, a few keys of a small key space, in key order.
    fn commit(seed: &mut u64, tables: u8) -> Vec<Owned> {
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
            let mut packed: Vec<Packed> = Vec::new();
            let mut expected: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            for _ in 0..commits {
                let mut one = Packed::default();
                for (k, v) in commit(&mut seed, 1 + (case % 4) as u8) {
                    one.push(&k[..1], &k[1..], v.as_deref());
                    expected.insert(k, v);
                }
                packed.push(one);
            }
            let writes: Vec<Write> = packed.iter().flat_map(Packed::iter).collect();
            let last: Vec<Owned> = last_writes(&writes)
                .into_iter()
                .map(|i| (writes[i].0.to_vec(), writes[i].1.map(<[u8]>::to_vec)))
                .collect();
            let expected: Vec<Owned> = expected.into_iter().collect();
            assert_eq!(last, expected, "writes {writes:?}");
        }
    }

    #[test]
    fn packed_writes_come_back_as_written() {
        let mut packed = Packed::default();
        packed.reserve(3, 12);
        packed.push(b"t1", b"a", Some(b"one"));
        packed.push(b"t1", b"b", None);
        packed.push(b"", b"", Some(b""));
        let back: Vec<Write> = packed.iter().collect();
        assert_eq!(
            back,
            [
                (&b"t1a"[..], Some(&b"one"[..])),
                (&b"t1b"[..], None),
                (&b""[..], Some(&b""[..]))
            ]
        );
        assert_eq!(packed.size(), 9 + 3 * ENTRY_BYTES);
    }

    #[test]
    fn disjoint_runs_are_laid_end_to_end() {
        let keys = [[3, 1], [3, 2], [1, 5], [1, 6], [2, 0]];
        let writes: Vec<Write> = keys.iter().map(|k| (&k[..], Some(&k[1..]))).collect();
        let order: Vec<[u8; 2]> = last_writes(&writes).into_iter().map(|i| keys[i]).collect();
        assert_eq!(order, [[1, 5], [1, 6], [2, 0], [3, 1], [3, 2]]);
    }
}
