//! HashJoin: equi-joins of two change streams (inner, left, right, full outer, semi, anti),
//! with an optional extra condition, under insertions and deletions on both sides.
//!
//! Each side keeps its rows in its own state table, keyed by join key and then row, with the
//! row's multiplicity; a change on one side is joined with the other side's rows of the same
//! key by a prefix scan, so a key with many rows is never rewritten as a whole. A side whose
//! rows can appear without a partner (the preserved side of an outer join, either side of a
//! semi or anti join) also stores, per row, how many rows of the other side match it: when that
//! count moves between zero and non-zero, the row's NULL-padded (or semi/anti) output is
//! retracted or emitted. Rows with a NULL key never match, unless the join says NULLs are equal
//! (set operations).
//!
//! Each side also holds the rows of the keys it uses in memory (`cache`), so that a key's
//! partners are found without reading RocksDB; state is written as before, and the cache
//! only saves reads.

mod cache;

use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_plan::PhysicalExpr;
use foldhash::HashMap;

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, eval_predicate, ErrorSink};
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{JoinKind, JoinSpec};

use self::cache::{Row, SideCache};

/// What a side's row produces on its own, without a partner row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alone {
    Never,
    /// Padded with NULLs while it has no partner (the preserved side of an outer join).
    PaddedWhileUnmatched,
    /// Its own columns while it has no partner (anti join).
    WhileUnmatched,
    /// Its own columns while it has a partner (semi join).
    WhileMatched,
}

struct Side {
    table: StateTable,
    cache: SideCache,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    rows: RowCodec,
    schema: SchemaRef,
    alone: Alone,
}

pub struct HashJoin {
    sides: [Side; 2],
    /// Whether matched pairs are output (all but semi and anti joins).
    pairs: bool,
    key_types: Vec<DataType>,
    keys: Option<RowCodec>,
    nulls_equal: bool,
    condition: Option<Arc<dyn PhysicalExpr>>,
    /// Left columns then right ones: what the condition reads.
    pair_schema: SchemaRef,
    schema: SchemaRef,
    errors: ErrorSink,
    /// Most rows per output chunk.
    rows_max: usize,
}

/// Most candidate pairs (a chunk's row and a row of the other side with the same key) taken
/// at once, as a multiple of `rows_max`: a key with many rows on the other side is read and
/// joined a part at a time, its output emitted as it is made.
const CANDIDATES_PER_ROWS_MAX: usize = 4;

/// A row of the other side sharing a key with the chunk's rows, as read from state.
struct Partner {
    state_key: Vec<u8>,
    row: Vec<u8>,
    count: i64,
    matches: i64,
    changed: bool,
}

impl Side {
    /// Whether `key`'s rows are held, read from state (and held) when they are not, unless
    /// it has more rows than the cache holds of a key.
    fn load(&mut self, key: &[u8]) -> Result<bool> {
        if self.cache.rows(key).is_some() {
            return Ok(true);
        }
        if self.cache.is_large(key) {
            return Ok(false);
        }
        let mut rows = Vec::new();
        let mut large = false;
        let rows_max = self.cache.rows_max();
        self.table.try_scan(key, None, &mut |k, v| {
            if rows.len() == rows_max {
                large = true;
                return Ok(false);
            }
            let (count, matches) = decode_entry(v)?;
            rows.push(Row {
                row: k[key.len()..].to_vec(),
                count,
                matches,
            });
            Ok(true)
        })?;
        if large {
            self.cache.mark_large(key);
        } else {
            self.cache.hold(key, rows);
        }
        Ok(!large)
    }

    /// `key`'s rows, unless it has more than the cache holds of a key (then they are read a
    /// part at a time).
    fn held(&mut self, key: &[u8]) -> Result<Option<Vec<Row>>> {
        Ok(match self.load(key)? {
            true => self.cache.rows(key).map(<[Row]>::to_vec),
            false => None,
        })
    }

    /// Adds `weight` to how many times the side has `row` under `key`, and sets how many rows
    /// of the other side match it, in state and in the cache; returns the row's new count.
    fn add(&mut self, key: &[u8], row: &[u8], weight: i64, matches: i64) -> Result<i64> {
        let mut count = self.cache.add(key, row, weight, matches);
        if count.is_none() && self.load(key)? {
            count = self.cache.add(key, row, weight, matches);
        }
        let state_key = [key, row].concat();
        let count = match count {
            Some(count) => count,
            None => match self.table.get(&state_key)? {
                Some(v) => decode_entry(&v)?.0 + weight,
                None => weight,
            },
        };
        assert!(
            count >= 0,
            "join input row deleted more often than inserted"
        );
        if count == 0 {
            self.table.delete(state_key);
        } else {
            self.table.put(state_key, encode_entry(count, matches));
        }
        Ok(count)
    }

    /// Sets how many rows of the other side match `row` under `key`, which the side has
    /// `count` times, in state and in the cache.
    fn set_matches(&mut self, key: &[u8], row: &[u8], count: i64, matches: i64) {
        self.table
            .put([key, row].concat(), encode_entry(count, matches));
        self.cache.set_matches(key, row, matches);
    }
}

/// Partners read, and the candidate pairs they make with the chunk's rows: (chunk row,
/// partner), by key, then row, then partner, so that each output row's changes come in the
/// chunk's order.
#[derive(Default)]
struct Batch {
    partners: Vec<Partner>,
    candidates: Vec<(u32, u32)>,
}

/// Output rows waiting to be emitted: indices into the chunk (`own`) and the partners
/// (`other`), with their change.
#[derive(Default)]
struct Pending {
    own: Vec<u32>,
    other: Vec<u32>,
    ops: Vec<Op>,
}

impl Pending {
    fn push(&mut self, own: u32, other: u32, op: Op) {
        self.own.push(own);
        self.other.push(other);
        self.ops.push(op);
    }

    fn len(&self) -> usize {
        self.ops.len()
    }
}

impl HashJoin {
    pub fn new(
        store: Arc<StateStore>,
        tables: [TableId; 2],
        spec: JoinSpec,
        errors: ErrorSink,
        rows_max: usize,
    ) -> Result<HashJoin> {
        use Alone::*;
        let (left_alone, right_alone, pairs) = match spec.kind {
            JoinKind::Inner => (Never, Never, true),
            JoinKind::Left => (PaddedWhileUnmatched, Never, true),
            JoinKind::Right => (Never, PaddedWhileUnmatched, true),
            JoinKind::Full => (PaddedWhileUnmatched, PaddedWhileUnmatched, true),
            JoinKind::LeftSemi => (WhileMatched, Never, false),
            JoinKind::LeftAnti => (WhileUnmatched, Never, false),
            JoinKind::RightSemi => (Never, WhileMatched, false),
            JoinKind::RightAnti => (Never, WhileUnmatched, false),
        };
        let side = |table, keys, schema: &SchemaRef, alone| -> Result<Side> {
            let table = StateTable::new(store.clone(), table);
            Ok(Side {
                cache: SideCache::new(store.cache_share(), table.is_empty()?),
                table,
                keys,
                rows: RowCodec::for_schema(schema)?,
                schema: schema.clone(),
                alone,
            })
        };
        let fields: Vec<Arc<Field>> = spec
            .left_schema
            .fields()
            .iter()
            .chain(spec.right_schema.fields().iter())
            .cloned()
            .collect();
        Ok(HashJoin {
            sides: [
                side(tables[0], spec.left_keys, &spec.left_schema, left_alone)?,
                side(tables[1], spec.right_keys, &spec.right_schema, right_alone)?,
            ],
            pairs,
            keys: if spec.key_types.is_empty() {
                None
            } else {
                Some(RowCodec::new(spec.key_types.clone())?)
            },
            key_types: spec.key_types,
            nulls_equal: spec.nulls_equal,
            condition: spec.condition,
            pair_schema: Arc::new(Schema::new(fields)),
            schema: spec.schema,
            errors,
            rows_max: rows_max.max(1),
        })
    }

    /// Each row's join key as the prefix of its state key (see `key_prefix`), or `None` for a
    /// key that matches nothing (a NULL in it).
    fn keys_of(&self, side: usize, chunk: &StreamChunk) -> Result<Vec<Option<Vec<u8>>>> {
        let data = &chunk.data;
        let Some(codec) = &self.keys else {
            // A join without equal keys (a cross join with a condition): one key for all rows.
            return Ok(vec![Some(key_prefix(0, &[])); data.num_rows()]);
        };
        let mut columns = eval_columns(&self.sides[side].keys, data, &chunk.ops, &self.errors)?;
        for (c, t) in columns.iter_mut().zip(&self.key_types) {
            if c.data_type() != t {
                *c = cast(c, t)?;
            }
        }
        let encoded = codec.encode(&columns)?;
        let vnodes = vnodes(&columns)?;
        Ok(encoded
            .into_iter()
            .zip(vnodes)
            .enumerate()
            .map(|(row, (key, vnode))| {
                let null = columns.iter().any(|c| c.is_null(row));
                (self.nulls_equal || !null).then(|| key_prefix(vnode, &key))
            })
            .collect())
    }

    /// The output rows of `side` alone: its columns, padded with NULLs for an outer join.
    fn alone_columns(&self, side: usize, columns: Vec<ArrayRef>, rows: usize) -> Vec<ArrayRef> {
        if self.sides[side].alone != Alone::PaddedWhileUnmatched {
            return columns;
        }
        let nulls = |s: &Side| -> Vec<ArrayRef> {
            s.schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), rows))
                .collect()
        };
        if side == 0 {
            columns.into_iter().chain(nulls(&self.sides[1])).collect()
        } else {
            nulls(&self.sides[0]).into_iter().chain(columns).collect()
        }
    }

    fn batch(
        &self,
        schema: &SchemaRef,
        columns: Vec<ArrayRef>,
        rows: usize,
    ) -> Result<RecordBatch> {
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &options,
        )?)
    }
}

fn take_all(columns: &[ArrayRef], indices: &[u32]) -> Result<Vec<ArrayRef>> {
    let idx = UInt32Array::from(indices.to_vec());
    columns
        .iter()
        .map(|c| Ok(take(c.as_ref(), &idx, None)?))
        .collect()
}

/// The start of a row's state key: the key's virtual node (so that a parallel actor's state is
/// its vnodes' ranges), then the join key, length-prefixed so that one key's rows form one
/// range; the row follows.
fn key_prefix(vnode: u16, key: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(6 + key.len());
    p.extend_from_slice(&vnode.to_be_bytes());
    p.extend_from_slice(&(key.len() as u32).to_be_bytes());
    p.extend_from_slice(key);
    p
}

fn encode_entry(count: i64, matches: i64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&count.to_le_bytes());
    v.extend_from_slice(&matches.to_le_bytes());
    v
}

fn decode_entry(v: &[u8]) -> Result<(i64, i64)> {
    let corrupt = || Error::new(ErrorKind::DataCorruption, "bad join state entry");
    let count = i64::from_le_bytes(
        v.get(0..8)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?,
    );
    let matches = i64::from_le_bytes(
        v.get(8..16)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?,
    );
    Ok((count, matches))
}

impl HashJoin {
    /// Joins a batch of candidates: evaluates the rest of the ON condition over them, counts
    /// each chunk row's matches into `matched`, emits the pairs and the partners' rows that
    /// flip between matched and unmatched, and keeps the partners' new match counts.
    fn join_batch(
        &mut self,
        own: usize,
        chunk: &StreamChunk,
        batch: &mut Batch,
        matched: &mut [i64],
        out: &mut dyn Emit,
    ) -> Result<()> {
        let other = 1 - own;
        if batch.candidates.is_empty() {
            batch.partners.clear();
            return Ok(());
        }
        let partner_columns = self.sides[other]
            .rows
            .decode(batch.partners.iter().map(|p| p.row.as_slice()))?;
        let satisfied: Vec<bool> = match &self.condition {
            Some(condition) => {
                let own_idx: Vec<u32> = batch.candidates.iter().map(|c| c.0).collect();
                let other_idx: Vec<u32> = batch.candidates.iter().map(|c| c.1).collect();
                let pairs = self.pair_batch(
                    &self.pair_schema,
                    own,
                    chunk,
                    &partner_columns,
                    &own_idx,
                    &other_idx,
                )?;
                let ops: Vec<Op> = own_idx.iter().map(|r| chunk.ops[*r as usize]).collect();
                let mask = eval_predicate(condition, &pairs, &ops, &self.errors)?;
                (0..mask.len())
                    .map(|i| mask.is_valid(i) && mask.value(i))
                    .collect()
            }
            None => vec![true; batch.candidates.len()],
        };
        let other_alone = self.sides[other].alone;
        let mut pairs = Pending::default();
        let mut flips: Vec<(u32, Op)> = Vec::new();
        for (&(row, p), ok) in batch.candidates.iter().zip(satisfied) {
            if !ok {
                continue;
            }
            let op = chunk.ops[row as usize];
            let partner = &mut batch.partners[p as usize];
            matched[row as usize] += partner.count;
            if self.pairs {
                for _ in 0..partner.count {
                    pairs.push(row, p, op);
                    if pairs.len() >= self.rows_max {
                        let full = std::mem::take(&mut pairs);
                        self.emit_pairs(own, chunk, &partner_columns, full, out)?;
                    }
                }
            }
            if other_alone != Alone::Never {
                let before = partner.matches;
                partner.matches += op.weight();
                partner.changed = true;
                if (before == 0) != (partner.matches == 0) {
                    // Unmatched output appears when the last partner goes, matched output
                    // when the first one comes.
                    let now_matched = partner.matches != 0;
                    let emit = match other_alone {
                        Alone::WhileMatched => now_matched,
                        _ => !now_matched,
                    };
                    let op = if emit { Op::Insert } else { Op::Delete };
                    for _ in 0..partner.count {
                        flips.push((p, op));
                        if flips.len() >= self.rows_max {
                            let rows = std::mem::take(&mut flips);
                            self.emit_alone(other, &partner_columns, &rows, out)?;
                        }
                    }
                }
            }
        }
        if pairs.len() > 0 {
            self.emit_pairs(own, chunk, &partner_columns, pairs, out)?;
        }
        self.emit_alone(other, &partner_columns, &flips, out)?;
        for p in batch.partners.iter().filter(|p| p.changed) {
            let key = &p.state_key[..p.state_key.len() - p.row.len()];
            self.sides[other].set_matches(key, &p.row, p.count, p.matches);
        }
        batch.partners.clear();
        batch.candidates.clear();
        Ok(())
    }

    /// Pairs of the chunk's rows `own_idx` and the partners' `other_idx`, left columns first.
    fn pair_batch(
        &self,
        schema: &SchemaRef,
        own: usize,
        chunk: &StreamChunk,
        partner_columns: &[ArrayRef],
        own_idx: &[u32],
        other_idx: &[u32],
    ) -> Result<RecordBatch> {
        let own_cols = take_all(chunk.data.columns(), own_idx)?;
        let other_cols = take_all(partner_columns, other_idx)?;
        let columns = if own == 0 {
            own_cols.into_iter().chain(other_cols).collect()
        } else {
            other_cols.into_iter().chain(own_cols).collect()
        };
        self.batch(schema, columns, own_idx.len())
    }

    /// Emits pairs of the chunk's rows and partners.
    fn emit_pairs(
        &self,
        own: usize,
        chunk: &StreamChunk,
        partner_columns: &[ArrayRef],
        pairs: Pending,
        out: &mut dyn Emit,
    ) -> Result<()> {
        let data = self.pair_batch(
            &self.schema,
            own,
            chunk,
            partner_columns,
            &pairs.own,
            &pairs.other,
        )?;
        out.emit(StreamChunk::new(pairs.ops, data))
    }

    /// Joins a chunk's rows with their partners on the other side: each key's partners are
    /// read and joined a batch at a time, and each row's matches counted over all of them.
    fn join_partners(
        &mut self,
        own: usize,
        chunk: &StreamChunk,
        groups: &[(&[u8], Vec<u32>)],
        out: &mut dyn Emit,
    ) -> Result<Vec<i64>> {
        let other = 1 - own;
        let candidates_max = self.rows_max * CANDIDATES_PER_ROWS_MAX;
        let mut matched = vec![0i64; chunk.len()];
        let mut batch = Batch::default();
        for (key, group) in groups {
            let mut held = self.sides[other].held(key)?.map(Vec::into_iter);
            let mut after: Option<Vec<u8>> = None;
            loop {
                if !batch.candidates.is_empty()
                    && batch.candidates.len() + group.len() > candidates_max
                {
                    self.join_batch(own, chunk, &mut batch, &mut matched, out)?;
                }
                let room =
                    (candidates_max.saturating_sub(batch.candidates.len()) / group.len()).max(1);
                let first = batch.partners.len();
                let partners = &mut batch.partners;
                match &mut held {
                    Some(rows) => partners.extend(rows.take(room).map(|r| Partner {
                        state_key: [*key, &r.row].concat(),
                        row: r.row,
                        count: r.count,
                        matches: r.matches,
                        changed: false,
                    })),
                    None => {
                        let start = after.as_ref().map(|k| [k.as_slice(), &[0]].concat());
                        self.sides[other]
                            .table
                            .try_scan(key, start.as_deref(), &mut |k, v| {
                                let (count, matches) = decode_entry(v)?;
                                partners.push(Partner {
                                    state_key: k.to_vec(),
                                    row: k[key.len()..].to_vec(),
                                    count,
                                    matches,
                                    changed: false,
                                });
                                Ok(partners.len() - first < room)
                            })?;
                    }
                }
                let read = batch.partners.len() - first;
                for &row in group {
                    for p in first..batch.partners.len() {
                        batch.candidates.push((row, p as u32));
                    }
                }
                if read < room {
                    break;
                }
                after = batch.partners.last().map(|p| p.state_key.clone());
            }
        }
        self.join_batch(own, chunk, &mut batch, &mut matched, out)?;
        Ok(matched)
    }

    /// Each row in order: its entry in its side's state (its count and matches), and whether
    /// it shows alone in the output (an outer, semi or anti join's rows).
    fn store_rows(
        &mut self,
        own: usize,
        chunk: &StreamChunk,
        keys: &[Option<Vec<u8>>],
        rows: &[Vec<u8>],
        matched: &[i64],
    ) -> Result<Vec<(u32, Op)>> {
        let own_alone = self.sides[own].alone;
        let mut alone: Vec<(u32, Op)> = Vec::new();
        for (row, op) in chunk.ops.iter().enumerate() {
            let Some(key) = &keys[row] else {
                if matches!(
                    own_alone,
                    Alone::PaddedWhileUnmatched | Alone::WhileUnmatched
                ) {
                    alone.push((row as u32, *op));
                }
                continue;
            };
            let shown = match own_alone {
                Alone::Never => false,
                Alone::WhileMatched => matched[row] != 0,
                Alone::PaddedWhileUnmatched | Alone::WhileUnmatched => matched[row] == 0,
            };
            if shown {
                alone.push((row as u32, *op));
            }
            self.sides[own].add(key, &rows[row], op.weight(), matched[row])?;
        }
        Ok(alone)
    }

    /// Emits rows of `side` alone (`rows`: indices into `source`, its columns).
    fn emit_alone(
        &self,
        side: usize,
        source: &[ArrayRef],
        rows: &[(u32, Op)],
        out: &mut dyn Emit,
    ) -> Result<()> {
        for rows in rows.chunks(self.rows_max) {
            let idx: Vec<u32> = rows.iter().map(|r| r.0).collect();
            let columns = self.alone_columns(side, take_all(source, &idx)?, idx.len());
            let data = self.batch(&self.schema, columns, idx.len())?;
            out.emit(StreamChunk::new(rows.iter().map(|r| r.1).collect(), data))?;
        }
        Ok(())
    }
}

#[cfg(test)]
impl HashJoin {
    /// Empties both sides' caches, which are no longer complete, and holds no key with more
    /// than `rows_max` rows: what follows reads state, as after a restart.
    fn forget(&mut self, rows_max: usize) {
        for side in &mut self.sides {
            side.cache.forget(rows_max);
        }
    }

    /// Holds no key with more than `rows_max` rows from now on; complete sides stay complete.
    fn hold_at_most(&mut self, rows_max: usize) {
        for side in &mut self.sides {
            side.cache.hold_at_most(rows_max);
        }
    }

    /// Lets go of each side's least recently used keys, as past the share; complete sides
    /// stay complete.
    fn halve(&mut self) {
        for side in &mut self.sides {
            side.cache.halve();
        }
    }
}

/// A chunk's rows by key (rows without a key left out), keys in the order they first come.
fn key_groups(keys: &[Option<Vec<u8>>]) -> Vec<(&[u8], Vec<u32>)> {
    let mut groups: Vec<(&[u8], Vec<u32>)> = Vec::new();
    let mut group_of: HashMap<&[u8], usize> = HashMap::default();
    for (row, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            let g = *group_of.entry(key.as_slice()).or_insert_with(|| {
                groups.push((key.as_slice(), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(row as u32);
        }
    }
    groups
}

impl Operator for HashJoin {
    fn on_chunk(&mut self, input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let own = input;
        for side in &mut self.sides {
            side.cache.tick();
        }
        let keys = self.keys_of(own, &chunk)?;
        let rows = self.sides[own].rows.encode(chunk.data.columns())?;
        let groups = key_groups(&keys);
        let matched = self.join_partners(own, &chunk, &groups, out)?;
        let alone = self.store_rows(own, &chunk, &keys, &rows, &matched)?;
        self.emit_alone(own, chunk.data.columns(), &alone, out)
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        _out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        for side in &mut self.sides {
            side.table.take_writes(writes);
            side.cache.trim();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::{col, BinaryExpr, Column};

    struct Harness {
        epochs: Epochs,
        join: HashJoin,
        left: SchemaRef,
        right: SchemaRef,
    }

    /// `t1(k bigint, a text) <kind> JOIN t2(k bigint, b text) ON t1.k = t2.k`, with an extra
    /// condition `a <> b` when asked.
    fn harness(kind: JoinKind, condition: bool) -> Harness {
        harness_with(kind, condition, 4)
    }

    /// The same, with output chunks of at most `rows_max` rows.
    fn harness_with(kind: JoinKind, condition: bool, rows_max: usize) -> Harness {
        let epochs = Epochs::new();
        let join = join(&epochs.store, [1, 2], kind, condition, rows_max);
        Harness {
            epochs,
            join,
            left: sides().0,
            right: sides().1,
        }
    }

    /// The inputs: `t1(k bigint, a text)` and `t2(k bigint, b text)`.
    fn sides() -> (SchemaRef, SchemaRef) {
        (
            schema(&[("k", DataType::Int64), ("a", DataType::Utf8)]),
            schema(&[("k", DataType::Int64), ("b", DataType::Utf8)]),
        )
    }

    /// The join of the harness, on state tables `tables` of `store`.
    fn join(
        store: &Arc<StateStore>,
        tables: [TableId; 2],
        kind: JoinKind,
        condition: bool,
        rows_max: usize,
    ) -> HashJoin {
        let (left, right) = sides();
        let output = match kind {
            JoinKind::LeftSemi | JoinKind::LeftAnti => left.clone(),
            JoinKind::RightSemi | JoinKind::RightAnti => right.clone(),
            _ => schema(&[
                ("k", DataType::Int64),
                ("a", DataType::Utf8),
                ("k", DataType::Int64),
                ("b", DataType::Utf8),
            ]),
        };
        let condition: Option<Arc<dyn PhysicalExpr>> = condition.then(|| {
            Arc::new(BinaryExpr::new(
                Arc::new(Column::new("a", 1)),
                BinOp::NotEq,
                Arc::new(Column::new("b", 3)),
            )) as _
        });
        let spec = JoinSpec {
            kind,
            left_keys: vec![col("k", &left).unwrap()],
            right_keys: vec![col("k", &right).unwrap()],
            key_types: vec![DataType::Int64],
            nulls_equal: false,
            condition,
            left_schema: left.clone(),
            right_schema: right.clone(),
            schema: output,
        };
        HashJoin::new(store.clone(), tables, spec, ErrorSink::new("v"), rows_max).unwrap()
    }

    impl Harness {
        fn left(&mut self, changes: &str) -> String {
            render_sorted(&self.chunks(0, changes))
        }

        fn right(&mut self, changes: &str) -> String {
            render_sorted(&self.chunks(1, changes))
        }

        /// The output chunks of `changes` arriving on `input`.
        fn chunks(&mut self, input: usize, changes: &str) -> Vec<StreamChunk> {
            let mut out = vec![];
            let schema = if input == 0 { &self.left } else { &self.right };
            let c = chunk(schema, changes);
            self.join.on_chunk(input, c, &mut out).unwrap();
            out
        }

        /// Ends the epoch: state goes to RocksDB, and later reads come from there.
        async fn barrier(&mut self) {
            self.epochs.end(&mut self.join, &mut vec![]).await;
        }
    }

    #[tokio::test]
    async fn inner_join_pairs_every_copy_and_retracts_them() {
        let mut h = harness(JoinKind::Inner, false);
        assert_eq!(h.left("+ 1 x\n+ 1 x\n+ 2 y"), "");
        h.barrier().await;
        assert_eq!(h.right("+ 1 p\n+ 3 q"), "+ 1 x 1 p\n+ 1 x 1 p");
        assert_eq!(h.left("- 1 x"), "- 1 x 1 p");
        h.barrier().await;
        assert_eq!(h.right("- 1 p"), "- 1 x 1 p");
        assert_eq!(h.left("+ 3 z"), "+ 3 z 3 q");
    }

    #[tokio::test]
    async fn left_join_flips_between_padded_and_matched() {
        let mut h = harness(JoinKind::Left, false);
        assert_eq!(h.left("+ 1 x"), "+ 1 x NULL NULL");
        h.barrier().await;
        assert_eq!(h.right("+ 1 p"), "+ 1 x 1 p\n- 1 x NULL NULL");
        assert_eq!(h.right("+ 1 q"), "+ 1 x 1 q");
        h.barrier().await;
        assert_eq!(h.right("- 1 p"), "- 1 x 1 p");
        assert_eq!(h.right("- 1 q"), "+ 1 x NULL NULL\n- 1 x 1 q");
        assert_eq!(h.left("- 1 x"), "- 1 x NULL NULL");
        // NULL keys never match, on either side.
        assert_eq!(h.left("+ NULL n"), "+ NULL n NULL NULL");
        assert_eq!(h.right("+ NULL m"), "");
        assert_eq!(h.left("- NULL n"), "- NULL n NULL NULL");
    }

    #[tokio::test]
    async fn full_join_pads_both_sides() {
        let mut h = harness(JoinKind::Full, false);
        assert_eq!(h.right("+ 1 p\n+ 1 p"), "+ NULL NULL 1 p\n+ NULL NULL 1 p");
        h.barrier().await;
        assert_eq!(
            h.left("+ 1 x"),
            "+ 1 x 1 p\n+ 1 x 1 p\n- NULL NULL 1 p\n- NULL NULL 1 p"
        );
        assert_eq!(h.left("+ 2 y"), "+ 2 y NULL NULL");
        h.barrier().await;
        assert_eq!(
            h.left("- 1 x"),
            "+ NULL NULL 1 p\n+ NULL NULL 1 p\n- 1 x 1 p\n- 1 x 1 p"
        );
    }

    #[tokio::test]
    async fn the_on_condition_decides_what_matches() {
        let mut h = harness(JoinKind::Left, true);
        assert_eq!(h.left("+ 1 x"), "+ 1 x NULL NULL");
        // Same key but a = b: not a match.
        assert_eq!(h.right("+ 1 x"), "");
        assert_eq!(h.right("+ 1 y"), "+ 1 x 1 y\n- 1 x NULL NULL");
        h.barrier().await;
        assert_eq!(h.right("- 1 x"), "");
        assert_eq!(h.right("- 1 y"), "+ 1 x NULL NULL\n- 1 x 1 y");
    }

    #[tokio::test]
    async fn semi_and_anti_joins_follow_the_first_and_last_partner() {
        let mut semi = harness(JoinKind::LeftSemi, false);
        let mut anti = harness(JoinKind::LeftAnti, false);
        for (h, expect) in [
            (&mut semi, ["", "+ 1 x", "", "", "- 1 x", ""]),
            (&mut anti, ["+ 1 x\n+ NULL n", "- 1 x", "", "", "+ 1 x", ""]),
        ] {
            assert_eq!(h.left("+ 1 x\n+ NULL n"), expect[0]);
            assert_eq!(h.right("+ 1 p"), expect[1]);
            assert_eq!(h.right("+ 1 q"), expect[2]);
            h.barrier().await;
            assert_eq!(h.right("- 1 p"), expect[3]);
            assert_eq!(h.right("- 1 q"), expect[4]);
            assert_eq!(h.right("+ NULL r"), expect[5]);
        }
    }

    /// A key with many rows on the other side is joined a part at a time: no output chunk is
    /// larger than the limit, and the output is what one pass gives.
    #[tokio::test]
    async fn a_hot_key_is_joined_a_part_at_a_time() {
        let mut h = harness_with(JoinKind::Full, false, 4);
        let partners: String = (0..30).map(|i| format!("+ 1 r{i:02}\n")).collect();
        h.right(&partners);
        h.barrier().await;
        // Five more that are not committed yet.
        h.right("+ 1 s1\n+ 1 s2\n+ 1 s3\n+ 1 s4\n+ 1 s5");
        let out = h.chunks(0, "+ 1 x\n+ 1 y\n- 1 x");
        assert!(out.iter().all(|c| c.len() <= 4), "a chunk over the limit");
        let names: Vec<String> = (0..30)
            .map(|i| format!("r{i:02}"))
            .chain((1..=5).map(|i| format!("s{i}")))
            .collect();
        let mut expected: Vec<String> = Vec::new();
        for n in &names {
            expected.push(format!("+ 1 x 1 {n}"));
            expected.push(format!("+ 1 y 1 {n}"));
            expected.push(format!("- 1 x 1 {n}"));
            expected.push(format!("- NULL NULL 1 {n}"));
        }
        expected.sort();
        assert_eq!(render_sorted(&out), expected.join("\n"));
    }

    /// Random changes on both sides, for every kind of join, with and without a condition:
    /// joined a few rows at a time, the output is the same as joined all at once; and the same
    /// again when each chunk finds the caches empty and keys of more than one row are read
    /// from state a part at a time; and again when complete caches let go of keys of more
    /// than two rows and of their least recently used keys, and stay complete.
    #[tokio::test]
    async fn parts_of_any_size_give_the_same_output() {
        use crate::rng::Rng;
        let kinds = [
            JoinKind::Inner,
            JoinKind::Left,
            JoinKind::Right,
            JoinKind::Full,
            JoinKind::LeftSemi,
            JoinKind::LeftAnti,
            JoinKind::RightSemi,
            JoinKind::RightAnti,
        ];
        // One store for all: closing a store takes about a second.
        let mut epochs = Epochs::new();
        let (left, right) = sides();
        let mut tables = 0;
        for (seed, kind) in kinds.iter().enumerate() {
            for condition in [false, true] {
                let mut rng = Rng::new(seed as u64 * 2 + condition as u64);
                let mut next = || {
                    tables += 2;
                    [tables - 1, tables]
                };
                let mut small = join(&epochs.store, next(), *kind, condition, 2);
                let mut large = join(&epochs.store, next(), *kind, condition, 10_000);
                let mut cold = join(&epochs.store, next(), *kind, condition, 2);
                let mut complete = join(&epochs.store, next(), *kind, condition, 10_000);
                complete.hold_at_most(2);
                // The rows each side holds, to delete only what is there.
                let mut held: [Vec<String>; 2] = [Vec::new(), Vec::new()];
                for step in 0..40 {
                    let input = rng.below(2) as usize;
                    let mut changes = String::new();
                    for _ in 0..rng.below(12) + 1 {
                        if !held[input].is_empty() && rng.chance(30) {
                            let i = rng.below(held[input].len() as u64) as usize;
                            let row = held[input].swap_remove(i);
                            changes.push_str(&format!("- {row}\n"));
                        } else {
                            let key = if rng.chance(10) {
                                "NULL".to_string()
                            } else {
                                rng.below(3).to_string()
                            };
                            let row = format!("{key} {}", rng.pick(&["a", "b", "c"]));
                            changes.push_str(&format!("+ {row}\n"));
                            held[input].push(row);
                        }
                    }
                    let schema = if input == 0 { &left } else { &right };
                    let (mut a, mut b, mut c, mut d) = (vec![], vec![], vec![], vec![]);
                    small
                        .on_chunk(input, chunk(schema, &changes), &mut a)
                        .unwrap();
                    large
                        .on_chunk(input, chunk(schema, &changes), &mut b)
                        .unwrap();
                    cold.forget(1);
                    cold.on_chunk(input, chunk(schema, &changes), &mut c)
                        .unwrap();
                    if step % 2 == 1 {
                        complete.halve();
                    }
                    complete
                        .on_chunk(input, chunk(schema, &changes), &mut d)
                        .unwrap();
                    assert!(a.iter().all(|c| c.len() <= 2));
                    assert_eq!(
                        render_sorted(&a),
                        render_sorted(&b),
                        "{kind:?} condition {condition} step {step}: {changes}"
                    );
                    assert_eq!(
                        render_sorted(&c),
                        render_sorted(&b),
                        "{kind:?} condition {condition} step {step}, from state: {changes}"
                    );
                    assert_eq!(
                        render_sorted(&d),
                        render_sorted(&b),
                        "{kind:?} condition {condition} step {step}, large keys: {changes}"
                    );
                    if rng.chance(30) {
                        epochs
                            .end_all(&mut [&mut small, &mut large, &mut cold, &mut complete])
                            .await;
                    }
                }
                assert!(complete.sides.iter().all(|s| s.cache.complete()));
            }
        }
    }
}
