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

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_plan::PhysicalExpr;

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, eval_predicate, ErrorSink};
use crate::stream::operator::Operator;
use crate::stream::rows::RowCodec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
    LeftSemi,
    LeftAnti,
    RightSemi,
    RightAnti,
}

#[derive(Clone)]
pub struct JoinSpec {
    pub kind: JoinKind,
    /// The equi-join keys: expressions over the left input and over the right input.
    pub left_keys: Vec<Arc<dyn PhysicalExpr>>,
    pub right_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The type both sides' keys are compared in.
    pub key_types: Vec<DataType>,
    /// Whether NULL keys match each other (`IS NOT DISTINCT FROM`, INTERSECT, EXCEPT).
    pub nulls_equal: bool,
    /// The rest of the ON condition, over the left columns followed by the right ones.
    pub condition: Option<Arc<dyn PhysicalExpr>>,
    pub left_schema: SchemaRef,
    pub right_schema: SchemaRef,
    /// The output: left then right columns, or one side's alone for semi and anti joins.
    pub schema: SchemaRef,
}

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
}

/// A row of the other side sharing a key with the chunk's rows, as read from state.
struct Partner {
    state_key: Vec<u8>,
    row: Vec<u8>,
    count: i64,
    matches: i64,
    changed: bool,
}

/// Rows to output, as indices into the chunk (`own`) or into the partners (`other`).
#[derive(Default)]
struct Output {
    pairs: Vec<(u32, u32, Op)>,
    own: Vec<(u32, Op)>,
    other: Vec<(u32, Op)>,
}

impl HashJoin {
    pub fn new(
        store: Arc<StateStore>,
        tables: [TableId; 2],
        spec: JoinSpec,
        errors: ErrorSink,
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
            Ok(Side {
                table: StateTable::new(store.clone(), table),
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
        })
    }

    /// Each row's join key as the prefix of its state key (see `key_prefix`), or `None` for a
    /// key that matches nothing (a NULL in it).
    fn keys_of(&self, side: usize, data: &RecordBatch) -> Result<Vec<Option<Vec<u8>>>> {
        let Some(codec) = &self.keys else {
            // A join without equal keys (a cross join with a condition): one key for all rows.
            return Ok(vec![Some(key_prefix(0, &[])); data.num_rows()]);
        };
        let mut columns = eval_columns(&self.sides[side].keys, data, &self.errors)?;
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

impl Operator for HashJoin {
    fn on_chunk(
        &mut self,
        input: usize,
        chunk: StreamChunk,
        out: &mut Vec<StreamChunk>,
    ) -> Result<()> {
        let (own, other) = (input, 1 - input);
        let keys = self.keys_of(own, &chunk.data)?;
        let rows = self.sides[own].rows.encode(chunk.data.columns())?;

        // The other side's rows for every key in the chunk, each read once.
        let mut partners: Vec<Partner> = Vec::new();
        let mut by_key: HashMap<&[u8], Vec<u32>> = HashMap::new();
        for key in keys.iter().flatten() {
            if by_key.contains_key(key.as_slice()) {
                continue;
            }
            let prefix = key.clone();
            let mut found = Vec::new();
            self.sides[other]
                .table
                .try_scan(&prefix, None, &mut |k, v| {
                    let (count, matches) = decode_entry(v)?;
                    found.push(partners.len() as u32);
                    partners.push(Partner {
                        state_key: k.to_vec(),
                        row: k[prefix.len()..].to_vec(),
                        count,
                        matches,
                        changed: false,
                    });
                    Ok(true)
                })?;
            by_key.insert(key, found);
        }
        let partner_columns = if partners.is_empty() {
            Vec::new()
        } else {
            self.sides[other]
                .rows
                .decode(partners.iter().map(|p| p.row.as_slice()))?
        };

        // Candidate pairs, and which of them satisfy the rest of the ON condition.
        let mut candidates: Vec<(u32, u32)> = Vec::new();
        for (row, key) in keys.iter().enumerate() {
            if let Some(key) = key {
                for &p in &by_key[key.as_slice()] {
                    candidates.push((row as u32, p));
                }
            }
        }
        let satisfied: Vec<bool> = match &self.condition {
            Some(condition) if !candidates.is_empty() => {
                let own_idx: Vec<u32> = candidates.iter().map(|c| c.0).collect();
                let other_idx: Vec<u32> = candidates.iter().map(|c| c.1).collect();
                let own_cols = take_all(chunk.data.columns(), &own_idx)?;
                let other_cols = take_all(&partner_columns, &other_idx)?;
                let columns = if own == 0 {
                    own_cols.into_iter().chain(other_cols).collect()
                } else {
                    other_cols.into_iter().chain(own_cols).collect()
                };
                let pairs = self.batch(&self.pair_schema, columns, candidates.len())?;
                let mask = eval_predicate(condition, &pairs, &self.errors)?;
                (0..mask.len())
                    .map(|i| mask.is_valid(i) && mask.value(i))
                    .collect()
            }
            _ => vec![true; candidates.len()],
        };

        // Each row in order: its pairs, the partners it flips between matched and unmatched,
        // its own output alone, and its entry in state.
        let mut output = Output::default();
        let mut next = 0;
        for (row, op) in chunk.ops.iter().enumerate() {
            let w = op.weight();
            let own_alone = self.sides[own].alone;
            let Some(key) = &keys[row] else {
                if matches!(
                    own_alone,
                    Alone::PaddedWhileUnmatched | Alone::WhileUnmatched
                ) {
                    output.own.push((row as u32, *op));
                }
                continue;
            };
            let mut matched = 0i64;
            while next < candidates.len() && candidates[next].0 == row as u32 {
                let (p, ok) = (candidates[next].1, satisfied[next]);
                next += 1;
                if !ok {
                    continue;
                }
                let partner = &mut partners[p as usize];
                matched += partner.count;
                if self.pairs {
                    for _ in 0..partner.count {
                        output.pairs.push((row as u32, p, *op));
                    }
                }
                let other_alone = self.sides[other].alone;
                if other_alone != Alone::Never {
                    let before = partner.matches;
                    partner.matches += w;
                    partner.changed = true;
                    let flipped = (before == 0) != (partner.matches == 0);
                    if flipped {
                        // Unmatched output appears when the last partner goes, matched output
                        // when the first one comes.
                        let now_matched = partner.matches != 0;
                        let emit = match other_alone {
                            Alone::WhileMatched => now_matched,
                            _ => !now_matched,
                        };
                        let op = if emit { Op::Insert } else { Op::Delete };
                        for _ in 0..partner.count {
                            output.other.push((p, op));
                        }
                    }
                }
            }
            let alone = match own_alone {
                Alone::Never => false,
                Alone::WhileMatched => matched != 0,
                Alone::PaddedWhileUnmatched | Alone::WhileUnmatched => matched == 0,
            };
            if alone {
                output.own.push((row as u32, *op));
            }
            let mut state_key = key.clone();
            state_key.extend_from_slice(&rows[row]);
            let table = &mut self.sides[own].table;
            let count = match table.get(&state_key)? {
                Some(v) => decode_entry(&v)?.0,
                None => 0,
            } + w;
            assert!(
                count >= 0,
                "join input row deleted more often than inserted"
            );
            if count == 0 {
                table.delete(state_key);
            } else {
                table.put(state_key, encode_entry(count, matched));
            }
        }
        for p in partners.iter().filter(|p| p.changed) {
            let entry = encode_entry(p.count, p.matches);
            self.sides[other].table.put(p.state_key.clone(), entry);
        }

        // Build the output chunks with Arrow's take.
        if !output.pairs.is_empty() {
            let own_idx: Vec<u32> = output.pairs.iter().map(|p| p.0).collect();
            let other_idx: Vec<u32> = output.pairs.iter().map(|p| p.1).collect();
            let own_cols = take_all(chunk.data.columns(), &own_idx)?;
            let other_cols = take_all(&partner_columns, &other_idx)?;
            let columns = if own == 0 {
                own_cols.into_iter().chain(other_cols).collect()
            } else {
                other_cols.into_iter().chain(own_cols).collect()
            };
            let data = self.batch(&self.schema, columns, own_idx.len())?;
            out.push(StreamChunk::new(
                output.pairs.iter().map(|p| p.2).collect(),
                data,
            ));
        }
        for (side, source, list) in [
            (own, chunk.data.columns(), &output.own),
            (other, partner_columns.as_slice(), &output.other),
        ] {
            if list.is_empty() {
                continue;
            }
            let idx: Vec<u32> = list.iter().map(|r| r.0).collect();
            let columns = self.alone_columns(side, take_all(source, &idx)?, idx.len());
            let data = self.batch(&self.schema, columns, idx.len())?;
            out.push(StreamChunk::new(list.iter().map(|r| r.1).collect(), data));
        }
        Ok(())
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        _out: &mut Vec<StreamChunk>,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        for side in &mut self.sides {
            side.table.take_writes(writes);
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
        let epochs = Epochs::new();
        let left = schema(&[("k", DataType::Int64), ("a", DataType::Utf8)]);
        let right = schema(&[("k", DataType::Int64), ("b", DataType::Utf8)]);
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
        let join = HashJoin::new(epochs.store.clone(), [1, 2], spec, ErrorSink::new("v")).unwrap();
        Harness {
            epochs,
            join,
            left,
            right,
        }
    }

    impl Harness {
        fn left(&mut self, changes: &str) -> String {
            let mut out = vec![];
            let c = chunk(&self.left, changes);
            self.join.on_chunk(0, c, &mut out).unwrap();
            render_sorted(&out)
        }

        fn right(&mut self, changes: &str) -> String {
            let mut out = vec![];
            let c = chunk(&self.right, changes);
            self.join.on_chunk(1, c, &mut out).unwrap();
            render_sorted(&out)
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
}
