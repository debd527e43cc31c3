//! TopN: `ORDER BY ... LIMIT n OFFSET m`, and per-partition Top-N written as
//! `ROW_NUMBER() / RANK() / DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) <= n`.
//!
//! Every input row is kept in the `rows` state table, ordered within its partition by the sort
//! key (Arrow's row format with each column's direction and NULL placement) and then by the
//! row itself, so ties break the same way every time. At the barrier each partition the epoch
//! touched reads its first rows in order, only as many as the limit needs, and compares them
//! with what it emitted before (the `emitted` table): a row leaving the top N is retracted and
//! the next one enters from state, without reading the rest of the input.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::row::{RowConverter, SortField};
use foldhash::HashMap;

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, ErrorSink};
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{RankKind, TopNSpec};

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
    errors: ErrorSink,
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
            rows: StateTable::new(store.clone(), tables[0]),
            emitted: StateTable::new(store, tables[1]),
            dirty: BTreeSet::new(),
            spec,
            errors,
        })
    }

    /// The rows the partition holds now: the first ones in order, with their rank.
    fn top(&self, partition: &[u8]) -> Result<Vec<(Vec<u8>, u64)>> {
        let first = self.spec.offset;
        let last = self.spec.limit.map(|l| first.saturating_add(l));
        let mut out: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut position = 0u64; // rows before this one, duplicates counted
        let mut rank = 0u64;
        let mut dense = 0u64;
        let mut previous_key: Option<Vec<u8>> = None;
        self.rows.try_scan(partition, None, &mut |key, value| {
            let (order, row) = split_order_key(&key[partition.len()..])?;
            let count = decode_count(value)?;
            if previous_key.as_deref() != Some(order) {
                rank = position + 1;
                dense += 1;
                previous_key = Some(order.to_vec());
            }
            for _ in 0..count {
                // 0-based place of this row under the ordering the limit counts in.
                let place = match self.spec.rank {
                    None | Some(RankKind::RowNumber) => position,
                    Some(RankKind::Rank) => rank - 1,
                    Some(RankKind::DenseRank) => dense - 1,
                };
                position += 1;
                if last.is_some_and(|l| place >= l) {
                    return Ok(false);
                }
                if place >= first {
                    out.push((row.to_vec(), place + 1));
                }
            }
            Ok(true)
        })?;
        Ok(out)
    }
}

impl Operator for TopN {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, _out: &mut dyn Emit) -> Result<()> {
        let n = chunk.len();
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
            let partition = partitions[i].clone();
            let mut key = partition.clone();
            key.extend_from_slice(&order_key(&orders[i], &rows[i]));
            let count = match self.rows.get(&key)? {
                Some(v) => decode_count(&v)?,
                None => 0,
            } + chunk.ops[i].weight();
            assert!(
                count >= 0,
                "top-n input row deleted more often than inserted"
            );
            if count == 0 {
                self.rows.delete(key);
            } else {
                self.rows.put(key, count.to_le_bytes().to_vec());
            }
            self.dirty.insert(partition);
        }
        Ok(())
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        let mut deleted: Vec<Vec<u8>> = Vec::new();
        let mut inserted: Vec<Vec<u8>> = Vec::new();
        for partition in std::mem::take(&mut self.dirty) {
            // What the partition outputs now, as output rows with their counts.
            let top = self.top(&partition)?;
            let mut now: HashMap<Vec<u8>, i64> = HashMap::default();
            if !top.is_empty() {
                let mut columns: Vec<ArrayRef> = self
                    .input_rows
                    .decode(top.iter().map(|(r, _)| r.as_slice()))?;
                if self.spec.rank.is_some() {
                    columns.push(Arc::new(UInt64Array::from_iter_values(
                        top.iter().map(|(_, rank)| *rank),
                    )));
                }
                for row in self.output_rows.encode(&columns)? {
                    *now.entry(row).or_default() += 1;
                }
            }
            let mut before: HashMap<Vec<u8>, i64> = HashMap::default();
            self.emitted.try_scan(&partition, None, &mut |key, value| {
                before.insert(key[partition.len()..].to_vec(), decode_count(value)?);
                Ok(true)
            })?;
            for (row, &old) in &before {
                let new = now.get(row).copied().unwrap_or(0);
                for _ in new..old {
                    deleted.push(row.clone());
                }
            }
            for (row, &new) in &now {
                let old = before.get(row).copied().unwrap_or(0);
                for _ in old..new {
                    inserted.push(row.clone());
                }
            }
            for (row, &old) in &before {
                if !now.contains_key(row) && old > 0 {
                    let mut key = partition.clone();
                    key.extend_from_slice(row);
                    self.emitted.delete(key);
                }
            }
            for (row, &new) in &now {
                if before.get(row) != Some(&new) {
                    let mut key = partition.clone();
                    key.extend_from_slice(row);
                    self.emitted.put(key, new.to_le_bytes().to_vec());
                }
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
        self.rows.take_writes(writes);
        self.emitted.take_writes(writes);
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
        let spec = TopNSpec {
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
            input_schema: input.clone(),
            schema: output,
        };
        let op = TopN::new(epochs.store.clone(), [1, 2], spec, ErrorSink::new("v")).unwrap();
        Harness { epochs, op, input }
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
}
