//! TopN: `ORDER BY ... LIMIT n OFFSET m`, and per-partition Top-N written as
//! `ROW_NUMBER() / RANK() / DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) <= n`.
//!
//! Every input row is kept in the `rows` state table, ordered within its partition by the sort
//! key (Arrow's row format with each column's direction and NULL placement) and then by the
//! row itself, so ties break the same way every time. At the barrier each partition the epoch
//! touched reads its first rows in order, only as many as the limit needs, and compares them
//! with what it emitted before (the `emitted` table): a row leaving the top N is retracted and
//! the next one enters from state, without reading the rest of the input.
//!
//! Over an input that only inserts, a row past the limit can never enter again (rows only
//! push it further down), so the barrier deletes it: each partition keeps at most its first
//! rows (`offset + limit`, and the rows tied with the last under RANK and DENSE_RANK). What it
//! emitted is then what its rows as the last barrier left them give, so the `emitted` table
//! is not written: a partition not held finds it from its committed rows. (Plans stored
//! before this kept an `emitted` table here too; its entries stay unread until the view is
//! dropped.)
//!
//! Partitions are held in memory (`held.rs`): their rows, counts and emitted rows are found
//! without reading RocksDB; state is written as before, and the cache only saves reads.

mod held;

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::row::{RowConverter, SortField};

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, ErrorSink};
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{RankKind, TopNSpec};

use self::held::{count_of, tally, Counts, Held, Partitions};

pub struct TopN {
    spec: TopNSpec,
    partitions: Option<RowCodec>,
    order: Option<RowConverter>,
    input_rows: RowCodec,
    output_rows: RowCodec,
    rows: StateTable,
    emitted: StateTable,
    /// Partitions changed in this epoch, by their key prefix.
    dirty: BTreeSet<Vec<u8>>,
    held: Partitions,
    errors: ErrorSink,
}

/// A row output (its input row) with its rank.
type Ranked = (Vec<u8>, u64);

/// The rows a partition outputs, found from its rows in order: the first ones with their
/// rank, and where the rows past the limit start.
struct Ranker<'a> {
    spec: &'a TopNSpec,
    /// Rows before this one, duplicates counted.
    position: u64,
    rank: u64,
    dense: u64,
    previous: Option<Vec<u8>>,
    out: Vec<Ranked>,
    /// The first row with a copy past the limit (its key after the partition), and how many
    /// of its copies come before the limit.
    cut: Option<(Vec<u8>, i64)>,
}

impl<'a> Ranker<'a> {
    fn new(spec: &'a TopNSpec) -> Ranker<'a> {
        Ranker {
            spec,
            position: 0,
            rank: 0,
            dense: 0,
            previous: None,
            out: Vec::new(),
            cut: None,
        }
    }

    /// Takes the next row in order (its key after the partition, and its count); false once
    /// the rest can no longer be output.
    fn push(&mut self, key: &[u8], count: i64) -> Result<bool> {
        let first = self.spec.offset;
        let last = self.spec.limit.map(|l| first.saturating_add(l));
        let (order, row) = split_order_key(key)?;
        if self.previous.as_deref() != Some(order) {
            self.rank = self.position + 1;
            self.dense += 1;
            self.previous = Some(order.to_vec());
        }
        for copy in 0..count {
            // 0-based place of this row under the ordering the limit counts in.
            let place = match self.spec.rank {
                None | Some(RankKind::RowNumber) => self.position,
                Some(RankKind::Rank) => self.rank - 1,
                Some(RankKind::DenseRank) => self.dense - 1,
            };
            self.position += 1;
            if last.is_some_and(|l| place >= l) {
                self.cut = Some((key.to_vec(), copy));
                return Ok(false);
            }
            if place >= first {
                self.out.push((row.to_vec(), place + 1));
            }
        }
        Ok(true)
    }
}

/// A partition's key prefix: its virtual node (so that a parallel actor's state is its vnodes'
/// ranges), then the partition key, length-prefixed so that one partition is one range.
fn partition_prefix(vnode: u16, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + key.len());
    out.extend_from_slice(&vnode.to_be_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn corrupt() -> Error {
    Error::new(ErrorKind::DataCorruption, "bad top-n state")
}

fn decode_count(v: &[u8]) -> Result<i64> {
    Ok(i64::from_le_bytes(v.try_into().map_err(|_| corrupt())?))
}

/// A row's key after its partition: the sort key, then the row, then the sort key's length.
/// The sort key comes first and unprefixed, so that keys sort as the rows should (Arrow's row
/// format is prefix-free, so no sort key is a prefix of another); its length comes last, only
/// to split the key again.
fn order_key(order: &[u8], row: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(order.len() + row.len() + 4);
    key.extend_from_slice(order);
    key.extend_from_slice(row);
    key.extend_from_slice(&(order.len() as u32).to_be_bytes());
    key
}

/// Splits what `order_key` built into the sort key and the row.
fn split_order_key(key: &[u8]) -> Result<(&[u8], &[u8])> {
    let (rest, len) = key
        .split_at_checked(key.len().saturating_sub(4))
        .ok_or_else(corrupt)?;
    let len = u32::from_be_bytes(len.try_into().map_err(|_| corrupt())?) as usize;
    rest.split_at_checked(len).ok_or_else(corrupt)
}

impl TopN {
    pub fn new(
        store: Arc<StateStore>,
        tables: [TableId; 2],
        spec: TopNSpec,
        errors: ErrorSink,
    ) -> Result<TopN> {
        let rows = StateTable::new(store.clone(), tables[0]);
        let emitted = StateTable::new(store.clone(), tables[1]);
        Ok(TopN {
            partitions: if spec.partition_types.is_empty() {
                None
            } else {
                Some(RowCodec::new(spec.partition_types.clone())?)
            },
            order: if spec.order_fields.is_empty() {
                None
            } else {
                Some(RowConverter::new(
                    spec.order_fields
                        .iter()
                        .map(|f| SortField::new_with_options(f.data_type.clone(), f.options))
                        .collect(),
                )?)
            },
            input_rows: RowCodec::for_schema(&spec.input_schema)?,
            output_rows: RowCodec::for_schema(&spec.schema)?,
            held: Partitions::new(store.cache_share(), rows.is_empty()? && emitted.is_empty()?),
            rows,
            emitted,
            dirty: BTreeSet::new(),
            spec,
            errors,
        })
    }

    /// The partition, held (read from state when it is not), unless it has more rows than
    /// a partition held may.
    fn load(&mut self, partition: &[u8]) -> Result<Option<&mut Held>> {
        if self.held.get(partition).is_none() && !self.held.is_large(partition) {
            let mut held = Held::default();
            let mut large = false;
            let rows_max = self.held.rows_max();
            self.rows.try_scan(partition, None, &mut |key, value| {
                if held.rows().len() == rows_max {
                    large = true;
                    return Ok(false);
                }
                held.set_row(&key[partition.len()..], decode_count(value)?);
                Ok(true)
            })?;
            if large {
                self.held.mark_large(partition);
            } else {
                let emitted = match self.spec.append_only && !self.rows.wrote_under(partition) {
                    // The rows just read are the committed ones.
                    true => self.emitted_by(held.rows().iter().map(|(k, c)| (k.as_slice(), *c)))?,
                    false => self.emitted_before(partition)?,
                };
                held.set_emitted(emitted);
                self.held.hold(partition, held);
            }
        }
        Ok(self.held.get(partition))
    }

    /// What the partition emitted at the last barrier, from the `emitted` table; over an
    /// input that only inserts, which keeps no `emitted` table, the output of its rows as the
    /// last barrier left them (it emitted their first rows, and cut the rest).
    fn emitted_before(&self, partition: &[u8]) -> Result<Counts> {
        if self.spec.append_only {
            let mut ranker = Ranker::new(&self.spec);
            self.rows.try_scan_committed(partition, &mut |key, value| {
                ranker.push(&key[partition.len()..], decode_count(value)?)
            })?;
            return Ok(tally(self.output_rows(ranker.out.iter())?));
        }
        // In key order, which is the rows' order.
        let mut before = Counts::new();
        self.emitted.try_scan(partition, None, &mut |key, value| {
            before.push((key[partition.len()..].to_vec(), decode_count(value)?));
            Ok(true)
        })?;
        Ok(before)
    }

    /// What a partition over inserts only emitted, given its rows as the last barrier left
    /// them (their keys after the partition, in order, with their counts).
    fn emitted_by<'r>(&self, rows: impl Iterator<Item = (&'r [u8], i64)>) -> Result<Counts> {
        let mut ranker = Ranker::new(&self.spec);
        for (key, count) in rows {
            if !ranker.push(key, count)? {
                break;
            }
        }
        Ok(tally(self.output_rows(ranker.out.iter())?))
    }

    /// Ranked input rows as output rows (with their rank when the output has it), encoded.
    fn output_rows<'r>(
        &self,
        ranked: impl Iterator<Item = &'r Ranked> + Clone,
    ) -> Result<Vec<Vec<u8>>> {
        if ranked.clone().next().is_none() {
            return Ok(Vec::new());
        }
        let mut columns: Vec<ArrayRef> = self
            .input_rows
            .decode(ranked.clone().map(|(r, _)| r.as_slice()))?;
        if self.spec.rank.is_some() {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                ranked.map(|(_, rank)| *rank),
            )));
        }
        self.output_rows.encode(&columns)
    }

    /// The partition's first rows in order with their rank, and where its rows past the
    /// limit start.
    fn rank(&mut self, partition: &[u8]) -> Result<Ranker<'_>> {
        let mut ranker = Ranker::new(&self.spec);
        match self.held.get(partition) {
            Some(held) => {
                for (key, count) in held.rows() {
                    if !ranker.push(key, *count)? {
                        break;
                    }
                }
            }
            None => self.rows.try_scan(partition, None, &mut |key, value| {
                ranker.push(&key[partition.len()..], decode_count(value)?)
            })?,
        }
        Ok(ranker)
    }
}

impl Operator for TopN {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, _out: &mut dyn Emit) -> Result<()> {
        let n = chunk.len();
        self.held.tick();
        // A partition's rows start with its virtual node, then the partition key.
        let partitions: Vec<Vec<u8>> = match &self.partitions {
            Some(codec) => {
                let mut columns =
                    eval_columns(&self.spec.partition, &chunk.data, &chunk.ops, &self.errors)?;
                for (c, t) in columns.iter_mut().zip(&self.spec.partition_types) {
                    if c.data_type() != t {
                        *c = cast(c, t)?;
                    }
                }
                codec
                    .encode(&columns)?
                    .into_iter()
                    .zip(vnodes(&columns)?)
                    .map(|(key, vnode)| partition_prefix(vnode, &key))
                    .collect()
            }
            None => vec![partition_prefix(0, &[]); n],
        };
        let orders: Vec<Vec<u8>> = match &self.order {
            Some(converter) => {
                let columns =
                    eval_columns(&self.spec.order, &chunk.data, &chunk.ops, &self.errors)?;
                let rows = converter.convert_columns(&columns)?;
                rows.iter().map(|r| r.as_ref().to_vec()).collect()
            }
            None => vec![Vec::new(); n],
        };
        let rows = self.input_rows.encode(chunk.data.columns())?;
        for i in 0..n {
            let partition = &partitions[i];
            let row_key = order_key(&orders[i], &rows[i]);
            let mut key = partition.clone();
            key.extend_from_slice(&row_key);
            let w = chunk.ops[i].weight();
            let count = match self.load(partition)? {
                Some(held) => {
                    let count = held.count(&row_key) + w;
                    if count >= 0 {
                        held.set_row(&row_key, count);
                    }
                    count
                }
                None => {
                    let stored = match self.rows.get(&key)? {
                        Some(v) => decode_count(&v)?,
                        None => 0,
                    };
                    stored + w
                }
            };
            assert!(
                count >= 0,
                "top-n input row deleted more often than inserted"
            );
            self.held.recount(partition);
            if count == 0 {
                self.rows.delete(key);
            } else {
                self.rows.put(key, count.to_le_bytes().to_vec());
            }
            if !self.dirty.contains(partition) {
                self.dirty.insert(partition.clone());
            }
        }
        Ok(())
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        // Each partition's first rows, with their rank.
        let mut tops: Vec<(Vec<u8>, Vec<Ranked>)> = Vec::new();
        for partition in std::mem::take(&mut self.dirty) {
            let Ranker { out, cut, .. } = self.rank(&partition)?;
            if let (true, Some((from, kept))) = (self.spec.append_only, cut) {
                self.cut(&partition, &from, kept)?;
            }
            tops.push((partition, out));
        }
        // Their output rows, encoded all at once.
        let mut encoded = self
            .output_rows(tops.iter().flat_map(|(_, top)| top.iter()))?
            .into_iter();
        let mut deleted: Vec<Vec<u8>> = Vec::new();
        let mut inserted: Vec<Vec<u8>> = Vec::new();
        for (partition, top) in tops {
            // What the partition outputs now, as output rows with their counts.
            let now = tally(encoded.by_ref().take(top.len()).collect());
            let read;
            let before = match self.held.get(&partition) {
                Some(held) => held.emitted(),
                None => {
                    read = self.emitted_before(&partition)?;
                    &read
                }
            };
            for (row, old) in before {
                let (old, new) = (*old, count_of(&now, row));
                for _ in new..old {
                    deleted.push(row.clone());
                }
                if new == 0 && !self.spec.append_only {
                    let mut key = partition.clone();
                    key.extend_from_slice(row);
                    self.emitted.delete(key);
                }
            }
            for (row, new) in &now {
                let (old, new) = (count_of(before, row), *new);
                for _ in old..new {
                    inserted.push(row.clone());
                }
                if old != new && !self.spec.append_only {
                    let mut key = partition.clone();
                    key.extend_from_slice(row);
                    self.emitted.put(key, new.to_le_bytes().to_vec());
                }
            }
            if let Some(held) = self.held.get(&partition) {
                held.set_emitted(now);
                self.held.recount(&partition);
            }
        }
        for (op, rows) in [(Op::Delete, deleted), (Op::Insert, inserted)] {
            if rows.is_empty() {
                continue;
            }
            let columns = self.output_rows.decode(rows.iter().map(Vec::as_slice))?;
            let data = RecordBatch::try_new(self.spec.schema.clone(), columns)?;
            out.emit(StreamChunk::new(vec![op; rows.len()], data))?;
        }
        self.held.trim();
        self.rows.take_writes(writes);
        self.emitted.take_writes(writes);
        Ok(())
    }
}

impl TopN {
    /// Deletes a partition's rows from `from` on (its key after the partition) but the first
    /// `kept` copies of that row: over an input that only inserts, they can never be output.
    fn cut(&mut self, partition: &[u8], from: &[u8], kept: i64) -> Result<()> {
        let gone = match self.held.get(partition) {
            Some(held) => {
                let gone = held.cut(from);
                if kept > 0 {
                    held.set_row(from, kept);
                }
                gone
            }
            None => {
                let mut gone = Vec::new();
                let mut start = partition.to_vec();
                start.extend_from_slice(from);
                self.rows.try_scan(partition, Some(&start), &mut |key, _| {
                    gone.push(key[partition.len()..].to_vec());
                    Ok(true)
                })?;
                gone
            }
        };
        self.held.recount(partition);
        for row in gone {
            let mut key = partition.to_vec();
            key.extend_from_slice(&row);
            if kept > 0 && row == from {
                self.rows.put(key, kept.to_le_bytes().to_vec());
            } else {
                self.rows.delete(key);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use crate::stream::spec::OrderField;
    use datafusion::arrow::compute::SortOptions;
    use datafusion::arrow::datatypes::{DataType, SchemaRef};
    use datafusion::physical_expr::expressions::col;

    struct Harness {
        epochs: Epochs,
        op: TopN,
        input: SchemaRef,
    }

    /// Over t(g int, v bigint): `ORDER BY v DESC LIMIT limit OFFSET offset`, or with `rank`,
    /// `<rank>() OVER (PARTITION BY g ORDER BY v DESC) <= limit`.
    fn harness(rank: Option<RankKind>, offset: u64, limit: u64) -> Harness {
        let epochs = Epochs::new();
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let spec = spec(rank, offset, limit, false);
        let op = TopN::new(epochs.store.clone(), [1, 2], spec, ErrorSink::new("v")).unwrap();
        Harness { epochs, op, input }
    }

    fn spec(rank: Option<RankKind>, offset: u64, limit: u64, append_only: bool) -> TopNSpec {
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let descending = SortOptions {
            descending: true,
            nulls_first: true,
        };
        let (partition, partition_types, output) = match rank {
            Some(_) => (
                vec![col("g", &input).unwrap()],
                vec![DataType::Int32],
                schema(&[
                    ("g", DataType::Int32),
                    ("v", DataType::Int64),
                    ("r", DataType::UInt64),
                ]),
            ),
            None => (vec![], vec![], input.clone()),
        };
        TopNSpec {
            partition,
            partition_types,
            order: vec![col("v", &input).unwrap()],
            order_fields: vec![OrderField {
                data_type: DataType::Int64,
                options: descending,
            }],
            offset,
            limit: Some(limit),
            rank,
            append_only,
            input_schema: input.clone(),
            schema: output,
        }
    }

    impl Harness {
        async fn epoch(&mut self, changes: &str) -> String {
            let mut out = vec![];
            self.op
                .on_chunk(0, chunk(&self.input, changes), &mut out)
                .unwrap();
            self.epochs.end(&mut self.op, &mut out).await;
            render_sorted(&out)
        }
    }

    #[tokio::test]
    async fn the_next_row_enters_when_one_in_the_top_leaves() {
        let mut h = harness(None, 0, 2);
        assert_eq!(
            h.epoch("+ 1 5\n+ 1 9\n+ 1 7\n+ 1 NULL").await,
            "+ 1 9\n+ 1 NULL"
        );
        assert_eq!(h.epoch("- 1 NULL").await, "+ 1 7\n- 1 NULL");
        assert_eq!(h.epoch("- 1 9").await, "+ 1 5\n- 1 9");
        // A change below the top changes nothing.
        assert_eq!(h.epoch("+ 1 1").await, "");
        // Duplicates take a place each.
        assert_eq!(h.epoch("+ 1 8\n+ 1 8").await, "+ 1 8\n+ 1 8\n- 1 5\n- 1 7");
    }

    #[test]
    fn keys_sort_by_the_sort_key_whatever_its_length() {
        let converter = RowConverter::new(vec![SortField::new(DataType::Utf8)]).unwrap();
        let texts: ArrayRef = Arc::new(datafusion::arrow::array::StringArray::from(vec![
            Some("b"),
            Some("abc"),
            None,
        ]));
        let rows = converter.convert_columns(&[texts]).unwrap();
        let mut keys: Vec<Vec<u8>> = (0..3)
            .map(|i| order_key(rows.row(i).as_ref(), &[i as u8]))
            .collect();
        keys.sort();
        let order: Vec<u8> = keys
            .iter()
            .map(|k| split_order_key(k).unwrap().1[0])
            .collect();
        // "abc" < "b", and NULLs first (Arrow's default for ascending order).
        assert_eq!(order, [2, 1, 0]);
    }

    #[tokio::test]
    async fn offset_skips_the_first_rows() {
        let mut h = harness(None, 1, 2);
        assert_eq!(h.epoch("+ 1 5\n+ 1 9\n+ 1 7\n+ 1 3").await, "+ 1 5\n+ 1 7");
        assert_eq!(h.epoch("+ 1 10").await, "+ 1 9\n- 1 5");
    }

    #[tokio::test]
    async fn ranks_per_partition_follow_rows_moving_up() {
        let mut h = harness(Some(RankKind::RowNumber), 0, 2);
        assert_eq!(
            h.epoch("+ 1 5\n+ 1 9\n+ 2 4\n+ 1 3").await,
            "+ 1 5 2\n+ 1 9 1\n+ 2 4 1"
        );
        assert_eq!(h.epoch("- 1 9").await, "+ 1 3 2\n+ 1 5 1\n- 1 5 2\n- 1 9 1");
        let mut h = harness(Some(RankKind::Rank), 0, 2);
        // Ties share a rank; rank <= 2 keeps all rows tied at the top.
        assert_eq!(
            h.epoch("+ 1 9\n+ 1 9\n+ 1 9\n+ 1 1").await,
            "+ 1 9 1\n+ 1 9 1\n+ 1 9 1"
        );
        let mut h = harness(Some(RankKind::DenseRank), 0, 2);
        assert_eq!(
            h.epoch("+ 1 9\n+ 1 9\n+ 1 5\n+ 1 1").await,
            "+ 1 5 2\n+ 1 9 1\n+ 1 9 1"
        );
    }

    /// Random changes to three partitions, for each kind of Top-N: the output is the same
    /// whether partitions are held in memory, read back from state at every chunk (two an
    /// epoch), too large to hold, or let go by use (the operator still complete); and over inserts only, the same again, in each of those three ways, when
    /// rows past the limit are deleted, which leaves at most the first rows of each partition
    /// in state and nothing in the `emitted` table.
    #[tokio::test]
    async fn held_cold_and_append_only_give_the_same_output() {
        use crate::rng::Rng;
        // One store for all: closing a store takes about a second.
        let mut epochs = Epochs::new();
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let kinds = [
            (None, 1, 2),
            (Some(RankKind::RowNumber), 0, 2),
            (Some(RankKind::Rank), 0, 2),
            (Some(RankKind::DenseRank), 0, 3),
        ];
        let mut tables = 0;
        for (seed, (rank, offset, limit)) in kinds.into_iter().enumerate() {
            for inserts_only in [false, true] {
                let mut rng = Rng::new(seed as u64 * 2 + inserts_only as u64);
                let mut next = |append_only| {
                    tables += 2;
                    let spec = spec(rank, offset, limit, append_only);
                    let errors = ErrorSink::new("v");
                    TopN::new(epochs.store.clone(), [tables - 1, tables], spec, errors).unwrap()
                };
                let mut ops = [false, false, false, false, true, true, true, true]
                    .map(|cut| next(cut && inserts_only));
                let mut held: Vec<String> = Vec::new();
                for _ in 0..40 {
                    let mut changes = String::new();
                    for _ in 0..rng.below(8) + 1 {
                        if !inserts_only && !held.is_empty() && rng.chance(30) {
                            let i = rng.below(held.len() as u64) as usize;
                            changes.push_str(&format!("- {}\n", held.swap_remove(i)));
                        } else {
                            let row = format!("{} {}", rng.below(3), rng.below(6));
                            changes.push_str(&format!("+ {row}\n"));
                            held.push(row);
                        }
                    }
                    // Each epoch in two chunks. Held in memory; read from state at every
                    // chunk (also after the epoch wrote it); never held; the least recently
                    // used half let go before every chunk.
                    let lines: Vec<&str> = changes.lines().collect();
                    let (one, two) = lines.split_at(lines.len() / 2);
                    let mut outputs = Vec::new();
                    for (i, op) in ops.iter_mut().enumerate() {
                        let mut out = vec![];
                        for part in [one, two].into_iter().filter(|p| !p.is_empty()) {
                            match i % 4 {
                                1 => op.held.forget(held::ROWS_MAX),
                                2 => op.held.forget(1),
                                3 => op.held.halve(),
                                _ => {}
                            }
                            let part = chunk(&input, &part.join("\n"));
                            op.on_chunk(0, part, &mut out).unwrap();
                        }
                        epochs.end(op, &mut out).await;
                        outputs.push(render_sorted(&out));
                    }
                    for other in &outputs[1..] {
                        assert_eq!(&outputs[0], other, "{rank:?} {changes}");
                    }
                }
                assert!(ops[3].held.complete() && ops[7].held.complete());
                for op in &ops[4..] {
                    if !inserts_only {
                        break;
                    }
                    // Three partitions (one without PARTITION BY), each with at most
                    // offset + limit distinct rows (copies of a row are one entry).
                    let kept = op.rows.entries();
                    let most = if rank.is_some() { 3 } else { 1 } * (offset + limit) as usize;
                    assert!(kept <= most, "{rank:?}: {kept} rows kept");
                    assert!(kept < ops[0].rows.entries());
                    assert_eq!(op.emitted.entries(), 0);
                }
            }
        }
    }
}
