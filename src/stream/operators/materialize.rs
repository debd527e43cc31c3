//! Materialize: keeps a relation's rows (a table's or a view's) in a state table, as a
//! multiset: key = the row's bytes, value = how many times it occurs. A table's rows store
//! its primary key's columns first (`TableDef::storage_order`), so that a key is a prefix.
//!
//! Queries read these tables at the last sealed epoch; a view created on top of this relation
//! backfills from them.
//!
//! At the barrier each changed row's count is read, changed and written back; a relation that
//! was empty as its actor started knows which rows it holds (`Held`), so that a row it never
//! held (a view's new row for a changed group, a table's new row) costs no read.

use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};

use foldhash::{HashMap, HashMapExt};

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;

use crate::error::{Error, Result};
use crate::state::{CacheShare, EpochWrites, Snapshot, StateStore, StateTable, TableId, TallyView};
use crate::stream::chunk::StreamChunk;
use crate::stream::rows::RowCodec;

pub struct Materialize {
    table: StateTable,
    codec: RowCodec,
    schema: SchemaRef,
    /// Changes in multiplicity during the current epoch, applied to the table at the barrier.
    deltas: HashMap<Vec<u8>, i64>,
    /// Which rows the relation holds, while it knows.
    held: Option<Held>,
}

/// What one row's hash takes in `Held`: the hash, its count, and the map's slot and spare room.
const HELD_BYTES: u64 = 24;

/// The rows a relation holds, known when its state was empty as its actor started: by a 64-bit
/// hash of each row's key (seeded per relation, so that no data chosen in advance collides),
/// with how many held rows have that hash. A row whose hash is not there is not held, and
/// finding that costs no read; two rows with one hash only cost reads. Counted in the
/// operators' caches' share; forgotten (every row read again) past a quarter of what every
/// cache may hold, or when the caches are over their share at a barrier.
struct Held {
    hasher: foldhash::fast::RandomState,
    hashes: HashMap<u64, u32>,
    share: CacheShare,
}

impl Held {
    fn new(share: CacheShare) -> Held {
        Held {
            hasher: foldhash::fast::RandomState::default(),
            hashes: HashMap::new(),
            share,
        }
    }

    /// Whether the row of hash `hash` may be held (`false`: it is not).
    fn may_hold(&self, hash: u64) -> bool {
        self.hashes.contains_key(&hash)
    }

    /// Counts a row that is held from now on (it was not).
    fn add(&mut self, hash: u64) {
        *self.hashes.entry(hash).or_insert_with(|| {
            self.share.grow(HELD_BYTES);
            0
        }) += 1;
    }

    /// Counts a row that is held no more (it was).
    fn remove(&mut self, hash: u64) {
        if let Some(n) = self.hashes.get_mut(&hash) {
            *n -= 1;
            if *n == 0 {
                self.hashes.remove(&hash);
                self.share.shrink(HELD_BYTES);
            }
        }
    }

    /// Whether it takes more than it may: a quarter of every cache's share, or any of it when
    /// the caches are over.
    fn too_large(&self) -> bool {
        let bytes = self.hashes.len() as u64 * HELD_BYTES;
        self.share.over() || bytes > self.share.max() / 4
    }
}

impl Materialize {
    /// Keeps the rows of `schema` in state table `table`, their columns stored in `order`
    /// (`RowCodec::ordered`).
    pub fn new(
        store: Arc<StateStore>,
        table: TableId,
        schema: SchemaRef,
        order: &[usize],
    ) -> Result<Materialize> {
        let share = store.cache_share();
        let table = StateTable::new(store, table);
        let held = table.is_empty()?.then(|| Held::new(share));
        Ok(Materialize {
            table,
            codec: RowCodec::ordered(&schema, order)?,
            schema,
            deltas: HashMap::new(),
            held,
        })
    }

    /// The key each row of `chunk` has in the relation's state, which orders the parts of
    /// `contents_part`.
    pub fn row_keys(&self, chunk: &StreamChunk) -> Result<Vec<Vec<u8>>> {
        self.codec.encode(chunk.data.columns())
    }

    pub fn apply(&mut self, chunk: &StreamChunk) -> Result<()> {
        let keys = self.codec.encode(chunk.data.columns())?;
        for (key, op) in keys.into_iter().zip(&chunk.ops) {
            *self.deltas.entry(key).or_insert(0) += op.weight();
        }
        Ok(())
    }

    pub fn flush(&mut self, writes: &mut EpochWrites) -> Result<()> {
        for (key, delta) in self.deltas.drain() {
            if delta == 0 {
                continue;
            }
            let hash = self.held.as_ref().map(|h| h.hasher.hash_one(&key));
            let old = match (&self.held, hash) {
                (Some(held), Some(hash)) if !held.may_hold(hash) => 0,
                _ => match self.table.get(&key)? {
                    Some(v) => decode_count(&v)?,
                    None => 0,
                },
            };
            let new = old + delta;
            assert!(
                new >= 0,
                "materialized relation {} would hold a row {new} times",
                self.table.id()
            );
            if let (Some(held), Some(hash)) = (&mut self.held, hash) {
                match (old, new) {
                    (0, _) => held.add(hash),
                    (_, 0) => held.remove(hash),
                    _ => {}
                }
            }
            if new == 0 {
                self.table.delete(key);
            } else {
                self.table.put(key, new.to_le_bytes().to_vec());
            }
        }
        if self.held.as_ref().is_some_and(Held::too_large) {
            self.held = None;
        }
        self.table.take_writes(writes);
        Ok(())
    }

    /// How many rows the relation holds (each distinct row as often as it occurs): a scan of
    /// the keys and counts only, for a new view's backfill to tell its progress against.
    pub fn row_count(&self) -> Result<u64> {
        let mut rows: u64 = 0;
        self.table.try_scan(&[], None, &mut |_, v| {
            rows = rows.saturating_add(u64::try_from(decode_count(v)?).unwrap_or(0));
            Ok(true)
        })?;
        Ok(rows)
    }

    /// The current contents after the row key `after` (from the first without it): an insert
    /// chunk of at most `rows_max` distinct rows (and about `PART_BYTES_MAX` bytes; rows that
    /// occur several times are repeated), with the last key read to continue from; `None`
    /// past the last row. Call after `flush`.
    pub fn contents_part(
        &self,
        after: Option<&[u8]>,
        rows_max: usize,
    ) -> Result<Option<(StreamChunk, Vec<u8>)>> {
        let start = after.map(|k| [k, &[0]].concat());
        let mut entries: Vec<(Vec<u8>, i64)> = Vec::new();
        let mut bytes = 0;
        self.table.try_scan(&[], start.as_deref(), &mut |k, v| {
            entries.push((k.to_vec(), decode_count(v)?));
            bytes += k.len();
            Ok(entries.len() < rows_max.max(1) && bytes < PART_BYTES_MAX)
        })?;
        let Some((last, _)) = entries.last() else {
            return Ok(None);
        };
        let last = last.clone();
        let rows = decode_counted(&self.codec, &self.schema, &entries)?;
        Ok(Some((StreamChunk::inserts(rows), last)))
    }
}

/// Changes in multiplicity, by row key, that a snapshot does not hold yet (a table's
/// statements of unsealed epochs): read with them, the snapshot gives the table's latest rows.
/// Keys are shared with the statements' records that hold them (`table::Unsealed`).
pub type RowChanges = datafusion::common::HashMap<Arc<[u8]>, i64>;

/// What a read lays over a table's snapshot to see its latest rows: changes in memory (the
/// unsealed statements', with a transaction block's), and a block's changes kept on disk
/// (`table::Pending`), as they were when the read began.
pub struct Changes {
    memory: Arc<RowChanges>,
    disk: Option<TallyView>,
    /// The changes in memory in key order, once a read needs them so.
    sorted: OnceLock<Vec<(Arc<[u8]>, i64)>>,
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Changes({} in memory", self.memory.len())?;
        match self.disk {
            Some(_) => write!(f, ", more on disk)"),
            None => write!(f, ")"),
        }
    }
}

impl Changes {
    pub fn new(memory: Arc<RowChanges>, disk: Option<TallyView>) -> Changes {
        Changes {
            memory,
            disk,
            sorted: OnceLock::new(),
        }
    }

    /// The change in multiplicity of one row.
    pub fn get(&self, row: &[u8]) -> Result<i64> {
        let memory = self.memory.get(row).copied().unwrap_or(0);
        match &self.disk {
            Some(disk) => Ok(memory + disk.get(row)?),
            None => Ok(memory),
        }
    }

    /// Visits the rows whose keys start with `prefix` and whose multiplicity changes, from
    /// the first at or after `start`, in key order, until `visit` returns false.
    pub fn scan_from(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], i64) -> Result<bool>,
    ) -> Result<()> {
        let sorted = self.sorted.get_or_init(|| {
            let mut all: Vec<(Arc<[u8]>, i64)> =
                self.memory.iter().map(|(k, c)| (k.clone(), *c)).collect();
            all.sort_unstable();
            all
        });
        let from = start.filter(|s| *s > prefix).unwrap_or(prefix);
        let first = sorted.partition_point(|(k, _)| &**k < from);
        let mut memory = sorted[first..]
            .iter()
            .take_while(|(k, _)| k.starts_with(prefix))
            .peekable();
        let mut go_on = true;
        if let Some(disk) = &self.disk {
            disk.scan_from(prefix, Some(from), &mut |row, on_disk| {
                while let Some((k, c)) = memory.next_if(|(k, _)| &**k < row) {
                    if !visit(k, *c)? {
                        go_on = false;
                        return Ok(false);
                    }
                }
                let c = on_disk + memory.next_if(|(k, _)| &**k == row).map_or(0, |(_, c)| *c);
                if c != 0 && !visit(row, c)? {
                    go_on = false;
                    return Ok(false);
                }
                Ok(true)
            })?;
        }
        if go_on {
            for (k, c) in memory {
                if *c != 0 && !visit(k, *c)? {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Reads a materialized relation at a sealed epoch, as batches of at most `rows_max` distinct
/// rows (for tests: a relation is read a part at a time everywhere else).
#[cfg(test)]
pub fn read_snapshot(
    snapshot: &Snapshot,
    table: TableId,
    schema: &SchemaRef,
    rows_max: usize,
) -> Result<Vec<RecordBatch>> {
    let codec = RowCodec::for_schema(schema)?;
    let mut batches = Vec::new();
    let mut after = None;
    while let Some((batch, last)) = read_snapshot_part(
        snapshot,
        table,
        schema,
        &codec,
        (&[], after.as_deref()),
        rows_max,
        None,
    )? {
        batches.push(batch);
        after = Some(last);
    }
    if batches.is_empty() {
        batches.push(decode_counted(&codec, schema, &[])?);
    }
    Ok(batches)
}

/// Most bytes of stored rows one read of a relation takes (`read_snapshot_part`), so that wide
/// rows make smaller batches.
const PART_BYTES_MAX: usize = 4 << 20;

/// Reads the next at most `rows_max` distinct rows (and about `PART_BYTES_MAX` bytes) of a
/// materialized relation at a sealed epoch: those after the key `after` (from the first without it) whose keys start with
/// `prefix` (the encoding of the values of the first columns), each counted with its
/// `changes`. Returns them as a batch, with the last key read to continue from; `None` past
/// the last row. Rows that `changes` adds and the snapshot lacks are not among them
/// (`read_added_part`).
pub fn read_snapshot_part(
    snapshot: &Snapshot,
    table: TableId,
    schema: &SchemaRef,
    codec: &RowCodec,
    (prefix, after): (&[u8], Option<&[u8]>),
    rows_max: usize,
    changes: Option<&Changes>,
) -> Result<Option<(RecordBatch, Vec<u8>)>> {
    // The smallest key greater than `after`, or the first with the prefix.
    let start = match after {
        Some(k) => [k, &[0]].concat(),
        None => prefix.to_vec(),
    };
    let mut part: Vec<(Vec<u8>, i64)> = Vec::new();
    let (mut read, mut bytes, mut last) = (0, 0, Vec::new());
    let mut failure: Option<Error> = None;
    snapshot.scan_prefix_from(table, prefix, Some(&start), &mut |k, v| {
        match decode_count(v) {
            Ok(c) => match changes.map_or(Ok(0), |m| m.get(k)) {
                Ok(change) => {
                    if c + change > 0 {
                        part.push((k.to_vec(), c + change));
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            },
            Err(e) => {
                failure = Some(e);
                return false;
            }
        }
        read += 1;
        bytes += k.len();
        last.clear();
        last.extend_from_slice(k);
        read < rows_max && bytes < PART_BYTES_MAX
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if read == 0 {
        return Ok(None);
    }
    Ok(Some((decode_counted(codec, schema, &part)?, last)))
}

/// The rows a materialized relation holds more often at `from` than at `against` (two sealed
/// epochs, or a checkpoint's and a later one), each as many times as the difference: the next
/// at most `rows_max` distinct rows of `from` after the key `after` (from the first without
/// it), with the last key read to continue from (the batch can be empty when none of those
/// differ); `None` past the last row.
pub fn read_excess_part(
    (from, against): (&Snapshot, &Snapshot),
    table: TableId,
    schema: &SchemaRef,
    codec: &RowCodec,
    after: Option<&[u8]>,
    rows_max: usize,
) -> Result<Option<(RecordBatch, Vec<u8>)>> {
    let start = after.map(|k| [k, &[0]].concat());
    let mut read: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bytes = 0;
    from.scan_table_from(table, start.as_deref(), &mut |k, v| {
        read.push((k.to_vec(), v.to_vec()));
        bytes += k.len();
        read.len() < rows_max.max(1) && bytes < PART_BYTES_MAX
    })?;
    let Some((last, _)) = read.last() else {
        return Ok(None);
    };
    let last = last.clone();
    let mut excess = Vec::new();
    for (key, count) in read {
        let other = match against.get(table, &key)? {
            Some(v) => decode_count(&v)?,
            None => 0,
        };
        let more = decode_count(&count)? - other;
        if more > 0 {
            excess.push((key, more));
        }
    }
    Ok(Some((decode_counted(codec, schema, &excess)?, last)))
}

/// The next at most `rows_max` rows that `changes` touches among those whose keys start with
/// `prefix`, after the key `after` (from the first without it): those it adds to a relation
/// whose snapshot does not hold them, as a batch (which can be empty), with the last key read
/// to continue from; `None` past the last. The rest of a read with changes, after
/// `read_snapshot_part`.
pub fn read_added_part(
    snapshot: &Snapshot,
    table: TableId,
    schema: &SchemaRef,
    codec: &RowCodec,
    (prefix, after): (&[u8], Option<&[u8]>),
    rows_max: usize,
    changes: &Changes,
) -> Result<Option<(RecordBatch, Vec<u8>)>> {
    let start = after.map(|k| [k, &[0]].concat());
    let (mut added, mut read, mut last) = (Vec::new(), 0, Vec::new());
    changes.scan_from(prefix, start.as_deref(), &mut |row, change| {
        if change > 0 && snapshot.get(table, row)?.is_none() {
            added.push((row.to_vec(), change));
        }
        read += 1;
        last.clear();
        last.extend_from_slice(row);
        Ok(read < rows_max.max(1))
    })?;
    if read == 0 {
        return Ok(None);
    }
    Ok(Some((decode_counted(codec, schema, &added)?, last)))
}

fn decode_count(v: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = v.try_into().map_err(|_| {
        Error::new(
            crate::error::ErrorKind::DataCorruption,
            "bad row count in materialized state",
        )
    })?;
    Ok(i64::from_le_bytes(bytes))
}

/// Decodes distinct rows with their counts into one batch, each row repeated `count` times.
fn decode_counted(
    codec: &RowCodec,
    schema: &SchemaRef,
    entries: &[(Vec<u8>, i64)],
) -> Result<RecordBatch> {
    let columns = codec.decode(entries.iter().map(|(k, _)| k.as_slice()))?;
    let distinct = if columns.is_empty() {
        RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &datafusion::arrow::array::RecordBatchOptions::new()
                .with_row_count(Some(entries.len())),
        )?
    } else {
        RecordBatch::try_new(schema.clone(), columns)?
    };
    if entries.iter().all(|(_, c)| *c == 1) {
        return Ok(distinct);
    }
    let indices: UInt32Array = entries
        .iter()
        .enumerate()
        .flat_map(|(i, (_, c))| std::iter::repeat_n(i as u32, *c as usize))
        .collect();
    Ok(take_record_batch(&distinct, &indices)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use datafusion::arrow::datatypes::DataType;

    #[tokio::test]
    async fn keeps_a_multiset_of_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let s = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
        let mut m = Materialize::new(store.clone(), 9, s.clone(), &[]).unwrap();
        m.apply(&chunk(&s, "+ 1 x\n+ 1 x\n+ 2 y\n+ 3 NULL"))
            .unwrap();
        m.apply(&chunk(&s, "- 2 y\n- 1 x")).unwrap();
        let mut w = EpochWrites::default();
        m.flush(&mut w).unwrap();
        store.commit(1, w).await.unwrap();
        store.seal(1);
        let mut contents = Vec::new();
        let mut after = None;
        // A distinct row at a time, continuing after the last one.
        while let Some((chunk, last)) = m.contents_part(after.as_deref(), 1).unwrap() {
            contents.push(chunk);
            after = Some(last);
        }
        assert_eq!(contents.len(), 2);
        assert_eq!(render_sorted(&contents), "+ 1 x\n+ 3 NULL");
        let read = read_snapshot(&store.snapshot(), 9, &s, 1).unwrap();
        let rows: usize = read.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 2);
    }

    /// Every distinct row of `m`, rendered, and how many times the relation holds each.
    fn contents(m: &Materialize) -> Vec<(String, i64)> {
        let mut all = Vec::new();
        m.table
            .try_scan(&[], None, &mut |k, v| {
                all.push((format!("{k:?}"), decode_count(v)?));
                Ok(true)
            })
            .unwrap();
        all
    }

    /// A relation empty at its start knows which rows it holds, and its counts are those of
    /// one that reads every row; one that starts with rows reads them.
    #[tokio::test]
    async fn a_relation_that_knows_its_rows_counts_them_as_one_that_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let s = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
        let mut knows = Materialize::new(store.clone(), 9, s.clone(), &[]).unwrap();
        let mut reads = Materialize::new(store.clone(), 10, s.clone(), &[]).unwrap();
        assert!(knows.held.is_some());
        reads.held = None;
        let epochs = [
            "+ 1 x\n+ 1 x\n+ 2 y\n+ 3 NULL",
            "- 1 x\n- 2 y\n+ 2 y\n+ 4 z\n- 3 NULL",
            "- 1 x\n+ 3 NULL\n+ 3 NULL\n- 4 z",
            "- 3 NULL\n+ 1 x\n+ 5 w",
        ];
        for (epoch, changes) in (1..).zip(epochs) {
            let mut w = EpochWrites::default();
            for m in [&mut knows, &mut reads] {
                m.apply(&chunk(&s, changes)).unwrap();
                m.flush(&mut w).unwrap();
            }
            store.commit(epoch, w).await.unwrap();
            store.seal(epoch);
            assert_eq!(contents(&knows), contents(&reads), "after epoch {epoch}");
        }
        assert_eq!(contents(&knows).len(), 4);
        assert_eq!(knows.held.as_ref().map(|h| h.hashes.len()), Some(4));
        // Started again on its rows, it reads them.
        let again = Materialize::new(store.clone(), 9, s.clone(), &[]).unwrap();
        assert!(again.held.is_none());
    }

    /// Rows that share a hash are counted apart: one of them gone leaves the others held.
    #[test]
    fn rows_with_one_hash_stay_held_until_the_last_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut held = Held::new(store.cache_share());
        assert!(!held.may_hold(7));
        held.add(7);
        held.add(7);
        held.remove(7);
        assert!(held.may_hold(7));
        held.remove(7);
        assert!(!held.may_hold(7));
        assert!(held.hashes.is_empty());
    }
}
