//! HashAgg: GROUP BY with COUNT, SUM, AVG, MIN, MAX, BOOL_AND and BOOL_OR, each optionally
//! DISTINCT and with a FILTER, under insertions and deletions.
//!
//! Each group keeps its row count and one accumulator per aggregate in the `groups` state
//! table. MIN and MAX cannot be retracted from a single value, so each keeps the group's
//! multiset of non-NULL values in the `values` table, ordered by value: the minimum is the
//! first entry of the group's range, the maximum the last, also after the current extreme is
//! deleted. A DISTINCT aggregate keeps its multiset there too, and a value reaches the
//! accumulator only when its count moves between zero and one. Output changes are emitted once per epoch, at the barrier, for the groups the
//! epoch touched: the group's previous output row is retracted and its new one inserted.
//! Without GROUP BY there is exactly one group, which exists even when empty, so the view
//! holds one row (COUNT = 0, SUM = NULL) over an empty input, as in PostgreSQL.
//!
//! Group keys start with their virtual node (`stream::dispatch`), so that the groups of one of
//! a view's parallel actors are its vnodes' ranges.
//!
//! With EMIT ON WINDOW CLOSE, one grouping column is a window bound that carries a watermark.
//! Group keys are stored with that column first, so the closed windows are the front of each
//! vnode's key range. A group emits nothing while its window is open; when the watermark passes it,
//! its one final row is emitted and its state deleted, so state holds open windows only.
//! Changes that arrive for a closed window are late and ignored.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Decimal128Array, Float64Array, Int64Array, RecordBatch,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{i256, DataType, SchemaRef, TimestampMicrosecondType};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::PhysicalExpr;

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, eval_predicate, ErrorSink};
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{AggCall, AggKind};

/// Group keys start with a 2-byte virtual node.
const VNODE_BYTES: usize = 2;

/// Past this many cached groups, the cache is emptied at the next barrier (state stays in
/// RocksDB; the cache only saves reads).
const CACHED_GROUPS_MAX: usize = 200_000;

/// Output rows of groups: the batch, each row's encoding, and the error of each row that has
/// an aggregate out of range (NULL there).
struct OutputRows {
    batch: RecordBatch,
    encoded: Vec<Vec<u8>>,
    failures: Vec<Option<Error>>,
}

/// Counts a group's output as failed or not from now on, in the view's errors.
fn set_failed(errors: &ErrorSink, state: &mut GroupState, failure: Option<&Error>) {
    match (state.failed, failure) {
        (false, Some(e)) => errors.record(e, 1),
        (true, None) => errors.cleared(),
        _ => {}
    }
    state.failed = failure.is_some();
}

/// How an aggregate reads its argument's values.
enum Values {
    /// Only whether the value is NULL matters.
    Presence(ArrayRef),
    /// Exact integers (and decimals' unscaled integers).
    Exact(Vec<Option<i128>>),
    Float(Float64Array),
    Bool(BooleanArray),
    /// Order-preserving bytes, for MIN/MAX.
    Ordered(ArrayRef, Vec<Vec<u8>>),
}

impl Values {
    fn is_valid(&self, row: usize) -> bool {
        match self {
            Values::Presence(a) | Values::Ordered(a, _) => a.is_valid(row),
            Values::Exact(v) => v[row].is_some(),
            Values::Float(a) => a.is_valid(row),
            Values::Bool(a) => a.is_valid(row),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Acc {
    Count {
        n: i64,
    },
    /// Exact sums, of integers and of decimals' unscaled integers: 256 bits cannot overflow,
    /// since at most 2^63 values of at most 2^127 each are summed, so the sum is always right
    /// even where it does not fit the result's type (then the output is NULL and an error,
    /// which goes once the sum fits again).
    Exact {
        n: i64,
        sum: i256,
    },
    Float {
        n: i64,
        sum: f64,
    },
    /// MIN/MAX: how many values; over an append-only input also the extreme itself (its
    /// order-preserving bytes), the only value that can ever be the result.
    Extreme {
        n: i64,
        best: Option<Vec<u8>>,
    },
    Bools {
        n: i64,
        trues: i64,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct GroupState {
    rows: i64,
    accs: Vec<Acc>,
    /// The output row last emitted for this group, so it can be retracted exactly.
    emitted: Option<Vec<u8>>,
    /// Whether an aggregate of that row failed (out of range) and is NULL there: counted as
    /// one of the view's errors until the group's output no longer fails.
    failed: bool,
}

pub struct HashAgg {
    group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    calls: Vec<AggCall>,
    schema: SchemaRef,
    group_codec: RowCodec,
    output_codec: RowCodec,
    /// For MIN/MAX and DISTINCT calls, the codec of their argument's values.
    value_codecs: Vec<Option<RowCodec>>,
    groups: StateTable,
    /// Per group and call, the multiset of values of MIN/MAX (unless `append_only`) and
    /// DISTINCT calls.
    values: StateTable,
    /// The input only inserts: MIN and MAX keep their extreme in the group's state.
    append_only: bool,
    cache: HashMap<Vec<u8>, GroupState>,
    dirty: HashSet<Vec<u8>>,
    global: bool,
    /// Whether the single group of a global aggregate has been emitted yet.
    global_emitted: bool,
    /// The order group columns are stored in: the window column first with EMIT ON WINDOW
    /// CLOSE, else as given.
    key_order: Vec<usize>,
    /// With EMIT ON WINDOW CLOSE: the window column's position among the group columns, its
    /// codec alone, and the watermark up to which windows are closed.
    close_on: Option<(usize, RowCodec)>,
    closed_below: Option<i64>,
    /// Changes that arrived for windows already closed.
    late_rows: u64,
    errors: ErrorSink,
}

impl HashAgg {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<StateStore>,
        groups_table: TableId,
        values_table: TableId,
        group_exprs: Vec<Arc<dyn PhysicalExpr>>,
        group_types: Vec<DataType>,
        calls: Vec<AggCall>,
        schema: SchemaRef,
        close_on: Option<usize>,
        append_only: bool,
        errors: ErrorSink,
    ) -> Result<HashAgg> {
        let value_codecs = calls
            .iter()
            .map(|c| match c.kind {
                AggKind::Min | AggKind::Max => RowCodec::new(vec![c.arg_type.clone()]).map(Some),
                _ if c.distinct => RowCodec::new(vec![c.arg_type.clone()]).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        let global = group_exprs.is_empty();
        let mut key_order: Vec<usize> = (0..group_types.len()).collect();
        if let Some(w) = close_on {
            key_order.retain(|i| *i != w);
            key_order.insert(0, w);
        }
        let close_on = match close_on {
            Some(w) => Some((w, RowCodec::new(vec![group_types[w].clone()])?)),
            None => None,
        };
        let stored_types = key_order.iter().map(|i| group_types[*i].clone()).collect();
        Ok(HashAgg {
            group_codec: RowCodec::new(stored_types)?,
            key_order,
            close_on,
            closed_below: None,
            late_rows: 0,
            output_codec: RowCodec::for_schema(&schema)?,
            value_codecs,
            groups: StateTable::new(store.clone(), groups_table),
            values: StateTable::new(store, values_table),
            append_only,
            cache: HashMap::new(),
            dirty: HashSet::new(),
            global,
            global_emitted: false,
            group_exprs,
            calls,
            schema,
            errors,
        })
    }

    fn empty_state(&self) -> GroupState {
        GroupState {
            rows: 0,
            accs: self
                .calls
                .iter()
                .map(|c| match (c.kind, &c.arg_type) {
                    (AggKind::Count, _) => Acc::Count { n: 0 },
                    (AggKind::Min | AggKind::Max, _) => Acc::Extreme { n: 0, best: None },
                    (AggKind::BoolAnd | AggKind::BoolOr, _) => Acc::Bools { n: 0, trues: 0 },
                    (_, t) if is_float(t) => Acc::Float { n: 0, sum: 0.0 },
                    _ => Acc::Exact {
                        n: 0,
                        sum: i256::ZERO,
                    },
                })
                .collect(),
            emitted: None,
            failed: false,
        }
    }

    fn load(&mut self, key: &[u8]) -> Result<&mut GroupState> {
        if !self.cache.contains_key(key) {
            let state = match self.groups.get(key)? {
                Some(bytes) => decode_state(&bytes)?,
                None => self.empty_state(),
            };
            self.cache.insert(key.to_vec(), state);
        }
        Ok(self.cache.get_mut(key).expect("just inserted"))
    }

    /// Decodes stored group keys into the group columns, in the query's order.
    fn decode_keys<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let stored = self
            .group_codec
            .decode(keys.into_iter().map(|k| &k[VNODE_BYTES..]))?;
        let mut columns: Vec<Option<ArrayRef>> = vec![None; stored.len()];
        for (array, position) in stored.into_iter().zip(&self.key_order) {
            columns[*position] = Some(array);
        }
        Ok(columns.into_iter().flatten().collect())
    }

    /// The output rows of the given (cached) groups, each row's encoding, and the error of
    /// the rows where an aggregate is out of range (NULL there).
    fn output_rows(&self, keys: &[&[u8]]) -> Result<Option<OutputRows>> {
        if keys.is_empty() {
            return Ok(None);
        }
        let mut agg_values: Vec<Vec<ScalarValue>> = vec![Vec::new(); self.calls.len()];
        let mut failures: Vec<Option<Error>> = vec![None; keys.len()];
        for (row, key) in keys.iter().enumerate() {
            for (idx, acc) in self.cache[*key].accs.iter().enumerate() {
                let v = match self.output_value(key, idx, acc) {
                    Ok(v) => v,
                    Err(e) if e.kind == ErrorKind::NumericOutOfRange => {
                        failures[row] = Some(e);
                        ScalarValue::try_from(&self.calls[idx].output_type)?
                    }
                    Err(e) => return Err(e),
                };
                agg_values[idx].push(v);
            }
        }
        let mut columns = if self.global {
            Vec::new()
        } else {
            self.decode_keys(keys.iter().copied())?
        };
        for (idx, vals) in agg_values.into_iter().enumerate() {
            let array = ScalarValue::iter_to_array(vals)?;
            let array = if array.data_type() != &self.calls[idx].output_type {
                cast(&array, &self.calls[idx].output_type)?
            } else {
                array
            };
            columns.push(array);
        }
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        let encoded = self.output_codec.encode(batch.columns())?;
        Ok(Some(OutputRows {
            batch,
            encoded,
            failures,
        }))
    }

    /// Changes the count of one value of a MIN/MAX or DISTINCT call; returns it before and
    /// after.
    fn count_value(&mut self, key: Vec<u8>, w: i64) -> Result<(i64, i64)> {
        let before = match self.values.get(&key)? {
            Some(v) => decode_i64(&v)?,
            None => 0,
        };
        let after = before + w;
        assert!(
            after >= 0,
            "aggregate value retracted more often than added"
        );
        if after == 0 {
            self.values.delete(key);
        } else {
            self.values.put(key, after.to_le_bytes().to_vec());
        }
        Ok((before, after))
    }

    fn read_values(
        &self,
        call: &AggCall,
        array: ArrayRef,
        codec: Option<&RowCodec>,
    ) -> Result<Values> {
        Ok(match call.kind {
            AggKind::Count => Values::Presence(array),
            AggKind::BoolAnd | AggKind::BoolOr => Values::Bool(
                array
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| Error::internal("bool_and/bool_or of a non-boolean"))?
                    .clone(),
            ),
            AggKind::Min | AggKind::Max => {
                let codec = codec.expect("min/max has a value codec");
                let keys = codec.encode(std::slice::from_ref(&array))?;
                Values::Ordered(array, keys)
            }
            AggKind::Sum | AggKind::Avg | AggKind::SumCounts => match array.data_type() {
                t if is_float(t) => {
                    let f = cast(&array, &DataType::Float64)?;
                    Values::Float(
                        f.as_any()
                            .downcast_ref::<Float64Array>()
                            .expect("f64")
                            .clone(),
                    )
                }
                DataType::Decimal128(..) => {
                    let d = array
                        .as_any()
                        .downcast_ref::<Decimal128Array>()
                        .expect("dec");
                    Values::Exact(d.iter().collect())
                }
                _ => {
                    let i = cast(&array, &DataType::Int64)?;
                    let i = i.as_any().downcast_ref::<Int64Array>().expect("i64");
                    Values::Exact(i.iter().map(|v| v.map(i128::from)).collect())
                }
            },
        })
    }

    /// The output value of one aggregate for a group.
    fn output_value(&self, key: &[u8], idx: usize, acc: &Acc) -> Result<ScalarValue> {
        let call = &self.calls[idx];
        let null = || ScalarValue::try_from(&call.output_type);
        match (call.kind, acc) {
            (AggKind::Count, Acc::Count { n }) => Ok(ScalarValue::Int64(Some(*n))),
            (AggKind::SumCounts, Acc::Exact { sum, .. }) => exact_scalar(*sum, &call.output_type),
            (
                _,
                Acc::Exact { n: 0, .. }
                | Acc::Float { n: 0, .. }
                | Acc::Extreme { n: 0, .. }
                | Acc::Bools { n: 0, .. },
            ) => Ok(null()?),
            (AggKind::BoolAnd, Acc::Bools { n, trues }) => {
                Ok(ScalarValue::Boolean(Some(trues == n)))
            }
            (AggKind::BoolOr, Acc::Bools { trues, .. }) => {
                Ok(ScalarValue::Boolean(Some(*trues > 0)))
            }
            (AggKind::Sum, Acc::Exact { sum, .. }) => exact_scalar(*sum, &call.output_type),
            (AggKind::Sum, Acc::Float { sum, .. }) => float_scalar(*sum, &call.output_type),
            (AggKind::Avg, Acc::Float { n, sum }) => {
                float_scalar(sum / *n as f64, &call.output_type)
            }
            (AggKind::Avg, Acc::Exact { n, sum }) => match (&call.arg_type, &call.output_type) {
                (DataType::Decimal128(_, s_in), DataType::Decimal128(p, s_out)) => {
                    let scaled = i256::from(10)
                        .checked_pow((*s_out - *s_in).max(0) as u32)
                        .and_then(|f| sum.checked_mul(f))
                        .ok_or_else(|| out_of_range("avg"))?;
                    let v = scaled
                        .checked_div(i256::from(*n))
                        .and_then(i256::to_i128)
                        .ok_or_else(|| out_of_range("numeric"))?;
                    decimal_scalar(v, *p, *s_out)
                }
                (_, t) => float_scalar(to_f64(*sum) / *n as f64, t),
            },
            (
                AggKind::Min | AggKind::Max,
                Acc::Extreme {
                    best: Some(best), ..
                },
            ) => {
                let codec = self.value_codecs[idx].as_ref().expect("codec");
                let arrays = codec.decode([best.as_slice()])?;
                Ok(ScalarValue::try_from_array(&arrays[0], 0)?)
            }
            (AggKind::Min | AggKind::Max, Acc::Extreme { .. }) => {
                let mut prefix = key.to_vec();
                prefix.push(idx as u8);
                let mut found: Option<Vec<u8>> = None;
                self.values
                    .scan(&prefix, call.kind == AggKind::Max, &mut |k, _| {
                        found = Some(k[prefix.len()..].to_vec());
                        false
                    })?;
                let value = found.ok_or_else(|| {
                    Error::internal("min/max state has values counted but none stored")
                })?;
                let codec = self.value_codecs[idx].as_ref().expect("codec");
                let arrays = codec.decode([value.as_slice()])?;
                Ok(ScalarValue::try_from_array(&arrays[0], 0)?)
            }
            (kind, acc) => Err(Error::internal(format!(
                "aggregate {kind:?} has accumulator {acc:?}"
            ))),
        }
    }
}

impl Operator for HashAgg {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, _out: &mut dyn Emit) -> Result<()> {
        let batch = &chunk.data;
        let group_columns = eval_columns(&self.group_exprs, batch, &chunk.ops, &self.errors)?;
        let keys = if self.global {
            vec![Vec::new(); batch.num_rows()]
        } else {
            let stored: Vec<ArrayRef> = self
                .key_order
                .iter()
                .map(|i| group_columns[*i].clone())
                .collect();
            // Each group's key starts with its virtual node: a parallel actor's groups are its
            // vnodes' ranges.
            self.group_codec
                .encode(&stored)?
                .into_iter()
                .zip(vnodes(&group_columns)?)
                .map(|(key, vnode)| {
                    let mut k = Vec::with_capacity(VNODE_BYTES + key.len());
                    k.extend_from_slice(&vnode.to_be_bytes());
                    k.extend_from_slice(&key);
                    k
                })
                .collect()
        };
        // With EMIT ON WINDOW CLOSE, rows of closed windows are late: they change nothing.
        let late: Vec<bool> = match (&self.close_on, self.closed_below) {
            (Some((w, _)), Some(closed)) => {
                let window = &group_columns[*w];
                let window = window
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| Error::internal("window column is not a timestamp"))?;
                (0..batch.num_rows())
                    .map(|i| window.is_null(i) || window.value(i) < closed)
                    .collect()
            }
            _ => vec![false; batch.num_rows()],
        };
        let args: Vec<ArrayRef> = eval_columns(
            &self.calls.iter().map(|c| c.arg.clone()).collect::<Vec<_>>(),
            batch,
            &chunk.ops,
            &self.errors,
        )?;
        // Per call: which rows its FILTER keeps, and for DISTINCT calls the values as bytes.
        let mut filters: Vec<Option<BooleanArray>> = Vec::with_capacity(self.calls.len());
        let mut distinct: Vec<Option<Vec<Vec<u8>>>> = Vec::with_capacity(self.calls.len());
        for (call, array) in self.calls.iter().zip(&args) {
            filters.push(match &call.filter {
                Some(f) => Some(eval_predicate(f, batch, &chunk.ops, &self.errors)?),
                None => None,
            });
            let counted_once = call.distinct && !matches!(call.kind, AggKind::Min | AggKind::Max);
            distinct.push(match (&self.value_codecs[distinct.len()], counted_once) {
                (Some(codec), true) => Some(codec.encode(std::slice::from_ref(array))?),
                _ => None,
            });
        }
        let mut values = Vec::with_capacity(self.calls.len());
        for (i, (call, array)) in self.calls.iter().zip(args).enumerate() {
            values.push(self.read_values(call, array, self.value_codecs[i].as_ref())?);
        }
        let call_kinds: Vec<AggKind> = self.calls.iter().map(|c| c.kind).collect();
        for (row, (key, op)) in keys.iter().zip(&chunk.ops).enumerate() {
            if late[row] {
                self.late_rows += 1;
                continue;
            }
            let w = op.weight();
            // What each call adds for this row: `w`, or nothing when its FILTER drops the row
            // or, for DISTINCT, when the value was already there (or still is).
            let mut weights = vec![w; self.calls.len()];
            for idx in 0..self.calls.len() {
                if let Some(mask) = &filters[idx] {
                    if !(mask.is_valid(row) && mask.value(row)) {
                        weights[idx] = 0;
                        continue;
                    }
                }
                if let Some(bytes) = &distinct[idx] {
                    if !values[idx].is_valid(row) {
                        continue;
                    }
                    let mut k = key.clone();
                    k.push(idx as u8);
                    k.extend_from_slice(&bytes[row]);
                    let (before, after) = self.count_value(k, w)?;
                    if (before == 0) == (after == 0) {
                        weights[idx] = 0;
                    }
                }
            }
            let mut extreme_updates: Vec<(Vec<u8>, i64)> = Vec::new();
            let append_only = self.append_only;
            let kinds: &[AggKind] = &call_kinds;
            let state = self.load(key)?;
            state.rows += w;
            for (idx, (acc, vals)) in state.accs.iter_mut().zip(&values).enumerate() {
                let w = weights[idx];
                if w == 0 {
                    continue;
                }
                match (acc, vals) {
                    (Acc::Count { n }, Values::Presence(a)) => {
                        if a.is_valid(row) {
                            *n += w
                        }
                    }
                    (Acc::Bools { n, trues }, Values::Bool(a)) => {
                        if a.is_valid(row) {
                            *n += w;
                            if a.value(row) {
                                *trues += w;
                            }
                        }
                    }
                    (Acc::Exact { n, sum }, Values::Exact(v)) => {
                        if let Some(v) = v[row] {
                            *n += w;
                            // Cannot wrap: see `Acc::Exact`.
                            *sum = sum.wrapping_add(i256::from(v).wrapping_mul(i256::from(w)));
                        }
                    }
                    (Acc::Float { n, sum }, Values::Float(v)) => {
                        if v.is_valid(row) {
                            *n += w;
                            *sum += v.value(row) * w as f64;
                        }
                    }
                    (Acc::Extreme { n, best }, Values::Ordered(a, bytes)) if append_only => {
                        if a.is_valid(row) {
                            // Nothing is ever retracted: only the extreme can be the result.
                            assert!(w > 0, "an append-only input retracted a row");
                            *n += w;
                            let v = &bytes[row];
                            let better = match best {
                                None => true,
                                Some(b) if kinds[idx] == AggKind::Min => v < b,
                                Some(b) => v > b,
                            };
                            if better {
                                *best = Some(v.clone());
                            }
                        }
                    }
                    (Acc::Extreme { n, .. }, Values::Ordered(a, bytes)) => {
                        if a.is_valid(row) {
                            *n += w;
                            let mut k = key.clone();
                            k.push(idx as u8);
                            k.extend_from_slice(&bytes[row]);
                            extreme_updates.push((k, w));
                        }
                    }
                    _ => return Err(Error::internal("aggregate value kind mismatch")),
                }
            }
            for (k, w) in extreme_updates {
                self.count_value(k, w)?;
            }
            self.dirty.insert(key.clone());
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        let Some((window, codec)) = &self.close_on else {
            return Ok(Vec::new());
        };
        let window = *window;
        let is_window = self.group_exprs[window]
            .downcast_ref::<Column>()
            .is_some_and(|c| c.index() == watermark.column);
        if !is_window || self.closed_below.is_some_and(|c| c >= watermark.value) {
            return Ok(Vec::new());
        }
        self.closed_below = Some(watermark.value);
        // Within each virtual node, keys below this are the windows that closed. State holds
        // open windows only, so reading all of it stays cheap.
        let bound = codec
            .encode(&[ScalarValue::TimestampMicrosecond(Some(watermark.value), None).to_array()?])?
            .remove(0);
        let closed = |k: &[u8]| k.get(VNODE_BYTES..).is_some_and(|k| k < bound.as_slice());
        let mut closing: BTreeSet<Vec<u8>> = BTreeSet::new();
        self.groups.scan(&[], false, &mut |k, _| {
            if closed(k) {
                closing.insert(k.to_vec());
            }
            true
        })?;
        closing.extend(self.cache.keys().filter(|k| closed(k)).cloned());
        let closing: Vec<Vec<u8>> = closing.into_iter().collect();
        for key in &closing {
            self.load(key)?;
        }
        let live: Vec<&[u8]> = closing
            .iter()
            .filter(|k| self.cache[*k].rows > 0)
            .map(Vec::as_slice)
            .collect();
        if let Some(rows) = self.output_rows(&live)? {
            // A closed window's row is final: an error in it stays counted.
            for e in rows.failures.iter().flatten() {
                self.errors.record(e, 1);
            }
            out.emit(StreamChunk::inserts(rows.batch))?;
        }
        for key in closing {
            self.cache.remove(&key);
            self.dirty.remove(&key);
            self.groups.delete(key.clone());
            let mut values = Vec::new();
            self.values.scan(&key, false, &mut |k, _| {
                values.push(k.to_vec());
                true
            })?;
            for v in values {
                self.values.delete(v);
            }
        }
        // The window column keeps its position in the output.
        Ok(vec![Watermark {
            column: window,
            value: watermark.value,
        }])
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        if self.close_on.is_some() {
            // Open windows emit nothing; their state is saved.
            for key in self.dirty.drain() {
                let state = &self.cache[&key];
                if state.rows == 0 {
                    self.groups.delete(key.clone());
                    self.cache.remove(&key);
                } else {
                    self.groups.put(key.clone(), encode_state(state));
                }
            }
            if self.cache.len() > CACHED_GROUPS_MAX {
                self.cache.clear();
            }
            self.groups.take_writes(writes);
            self.values.take_writes(writes);
            return Ok(());
        }
        if self.global && !self.global_emitted {
            self.load(&[])?;
            self.dirty.insert(Vec::new());
            self.global_emitted = true;
        }
        let mut dirty: Vec<Vec<u8>> = self.dirty.drain().collect();
        dirty.sort();
        // New output rows for the groups that still exist.
        let mut live_keys: Vec<&[u8]> = Vec::new();
        for key in &dirty {
            let state = &self.cache[key];
            assert!(state.rows >= 0, "group retracted more rows than it had");
            if state.rows > 0 || self.global {
                live_keys.push(key);
            }
        }
        let mut new_rows: HashMap<&[u8], (Vec<u8>, Option<Error>)> = HashMap::new();
        let mut inserted: Option<RecordBatch> = None;
        if let Some(rows) = self.output_rows(&live_keys)? {
            for ((key, row), failure) in live_keys.iter().zip(rows.encoded).zip(rows.failures) {
                new_rows.insert(key, (row, failure));
            }
            inserted = Some(rows.batch);
        }
        // Compare with what was emitted before.
        let mut retract: Vec<Vec<u8>> = Vec::new();
        let mut keep_insert: Vec<u32> = Vec::new();
        for (pos, key) in live_keys.iter().enumerate() {
            let (new, failure) = &new_rows[key];
            let state = self.cache.get_mut(*key).expect("cached");
            set_failed(&self.errors, state, failure.as_ref());
            if state.emitted.as_ref() == Some(new) {
                continue;
            }
            if let Some(old) = state.emitted.take() {
                retract.push(old);
            }
            state.emitted = Some(new.clone());
            keep_insert.push(pos as u32);
        }
        for key in &dirty {
            let state = self.cache.get_mut(key).expect("cached");
            if state.rows == 0 && !self.global {
                if let Some(old) = state.emitted.take() {
                    retract.push(old);
                }
                set_failed(&self.errors, state, None);
                self.groups.delete(key.clone());
                self.cache.remove(key);
            } else {
                self.groups.put(key.clone(), encode_state(state));
            }
        }
        if !retract.is_empty() {
            let columns = self
                .output_codec
                .decode(retract.iter().map(Vec::as_slice))?;
            let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
            out.emit(StreamChunk::new(vec![Op::Delete; batch.num_rows()], batch))?;
        }
        if let Some(batch) = inserted {
            if !keep_insert.is_empty() {
                let chunk = StreamChunk::inserts(batch).take(&keep_insert)?;
                out.emit(chunk)?;
            }
        }
        if self.cache.len() > CACHED_GROUPS_MAX {
            self.cache.clear();
        }
        self.groups.take_writes(writes);
        self.values.take_writes(writes);
        Ok(())
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn out_of_range(what: &str) -> Error {
    Error::new(ErrorKind::NumericOutOfRange, format!("{what} out of range"))
}

fn exact_scalar(v: i256, t: &DataType) -> Result<ScalarValue> {
    if let DataType::Float64 = t {
        return Ok(ScalarValue::Float64(Some(to_f64(v))));
    }
    let v = v.to_i128().ok_or_else(|| out_of_range("numeric"))?;
    Ok(match t {
        DataType::Int64 => {
            ScalarValue::Int64(Some(i64::try_from(v).map_err(|_| out_of_range("bigint"))?))
        }
        DataType::UInt64 => {
            ScalarValue::UInt64(Some(u64::try_from(v).map_err(|_| out_of_range("sum"))?))
        }
        DataType::Decimal128(p, s) => decimal_scalar(v, *p, *s)?,
        DataType::Float64 => ScalarValue::Float64(Some(v as f64)),
        other => return Err(Error::internal(format!("exact sum into {other}"))),
    })
}

fn to_f64(v: i256) -> f64 {
    let (low, high) = v.to_parts();
    high as f64 * 2f64.powi(128) + low as f64
}

fn decimal_scalar(v: i128, precision: u8, scale: i8) -> Result<ScalarValue> {
    if v.unsigned_abs() >= 10u128.pow(precision as u32) {
        return Err(out_of_range("numeric"));
    }
    Ok(ScalarValue::Decimal128(Some(v), precision, scale))
}

fn float_scalar(v: f64, t: &DataType) -> Result<ScalarValue> {
    Ok(match t {
        DataType::Float64 => ScalarValue::Float64(Some(v)),
        DataType::Float32 => ScalarValue::Float32(Some(v as f32)),
        other => return Err(Error::internal(format!("float aggregate into {other}"))),
    })
}

fn decode_i64(v: &[u8]) -> Result<i64> {
    let b: [u8; 8] = v.try_into().map_err(|_| corrupt())?;
    Ok(i64::from_le_bytes(b))
}

fn corrupt() -> Error {
    Error::new(ErrorKind::DataCorruption, "bad aggregate state")
}

fn encode_state(s: &GroupState) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + s.accs.len() * 25);
    out.extend_from_slice(&s.rows.to_le_bytes());
    out.push(u8::try_from(s.accs.len()).expect("at most 255 aggregates per group"));
    for acc in &s.accs {
        match acc {
            Acc::Count { n } => {
                out.push(0);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Acc::Exact { n, sum } => match sum.to_i128() {
                Some(small) => {
                    out.push(1);
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(&small.to_le_bytes());
                }
                // Only sums past 128 bits take the room of 256.
                None => {
                    out.push(6);
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(&sum.to_le_bytes());
                }
            },
            Acc::Float { n, sum } => {
                out.push(2);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&sum.to_le_bytes());
            }
            Acc::Extreme { n, best: None } => {
                out.push(3);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Acc::Extreme { n, best: Some(v) } => {
                out.push(5);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            Acc::Bools { n, trues } => {
                out.push(4);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&trues.to_le_bytes());
            }
        }
    }
    match &s.emitted {
        Some(row) => {
            out.push(if s.failed { 2 } else { 1 });
            out.extend_from_slice(row);
        }
        None => out.push(0),
    }
    out
}

fn decode_state(bytes: &[u8]) -> Result<GroupState> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8]> {
            if self.0.len() < n {
                return Err(corrupt());
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        fn i64(&mut self) -> Result<i64> {
            Ok(i64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| corrupt())?,
            ))
        }
        fn u8(&mut self) -> Result<u8> {
            Ok(self.take(1)?[0])
        }
    }
    let mut r = Reader(bytes);
    let rows = r.i64()?;
    let count = r.u8()?;
    let mut accs = Vec::with_capacity(count as usize);
    for _ in 0..count {
        accs.push(match r.u8()? {
            0 => Acc::Count { n: r.i64()? },
            1 => Acc::Exact {
                n: r.i64()?,
                sum: i256::from(i128::from_le_bytes(
                    r.take(16)?.try_into().map_err(|_| corrupt())?,
                )),
            },
            6 => Acc::Exact {
                n: r.i64()?,
                sum: i256::from_le_bytes(r.take(32)?.try_into().map_err(|_| corrupt())?),
            },
            2 => Acc::Float {
                n: r.i64()?,
                sum: f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| corrupt())?),
            },
            3 => Acc::Extreme {
                n: r.i64()?,
                best: None,
            },
            5 => {
                let n = r.i64()?;
                let len = u32::from_le_bytes(r.take(4)?.try_into().map_err(|_| corrupt())?);
                Acc::Extreme {
                    n,
                    best: Some(r.take(len as usize)?.to_vec()),
                }
            }
            4 => Acc::Bools {
                n: r.i64()?,
                trues: r.i64()?,
            },
            _ => return Err(corrupt()),
        });
    }
    let (emitted, failed) = match r.u8()? {
        0 => (None, false),
        1 => (Some(r.0.to_vec()), false),
        2 => (Some(r.0.to_vec()), true),
        _ => return Err(corrupt()),
    };
    Ok(GroupState {
        rows,
        accs,
        emitted,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use datafusion::physical_expr::expressions::{col, lit};

    struct Harness {
        epochs: Epochs,
        agg: HashAgg,
        input: SchemaRef,
    }

    /// `SELECT g, count(*), count(v), sum(v), min(v), max(v), avg(v) FROM t [GROUP BY g]` over
    /// a table t(g int, v bigint).
    fn harness(grouped: bool) -> Harness {
        harness_with(grouped, false)
    }

    fn harness_with(grouped: bool, append_only: bool) -> Harness {
        let epochs = Epochs::new();
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let v = col("v", &input).unwrap();
        let call = |kind, arg: Arc<dyn PhysicalExpr>, arg_type: DataType, out: DataType| AggCall {
            kind,
            arg,
            arg_type,
            output_type: out,
            distinct: false,
            filter: None,
        };
        let calls = vec![
            call(AggKind::Count, lit(1i64), DataType::Int64, DataType::Int64),
            call(AggKind::Count, v.clone(), DataType::Int64, DataType::Int64),
            call(AggKind::Sum, v.clone(), DataType::Int64, DataType::Int64),
            call(AggKind::Min, v.clone(), DataType::Int64, DataType::Int64),
            call(AggKind::Max, v.clone(), DataType::Int64, DataType::Int64),
            call(AggKind::Avg, v, DataType::Int64, DataType::Float64),
        ];
        let mut cols = vec![];
        if grouped {
            cols.push(("g", DataType::Int32));
        }
        cols.extend([
            ("cnt", DataType::Int64),
            ("cnt_v", DataType::Int64),
            ("sum", DataType::Int64),
            ("min", DataType::Int64),
            ("max", DataType::Int64),
            ("avg", DataType::Float64),
        ]);
        let (group_exprs, group_types) = if grouped {
            (vec![col("g", &input).unwrap()], vec![DataType::Int32])
        } else {
            (vec![], vec![])
        };
        let agg = HashAgg::new(
            epochs.store.clone(),
            1,
            2,
            group_exprs,
            group_types,
            calls,
            schema(&cols),
            None,
            append_only,
            ErrorSink::new("v"),
        )
        .unwrap();
        Harness { epochs, agg, input }
    }

    impl Harness {
        /// Feeds one epoch of changes and returns the output of its barrier.
        async fn epoch(&mut self, changes: &str) -> String {
            let mut out = vec![];
            self.agg
                .on_chunk(0, chunk(&self.input, changes), &mut out)
                .unwrap();
            assert!(out.is_empty(), "output waits for the barrier");
            self.epochs.end(&mut self.agg, &mut out).await;
            render_sorted(&out)
        }
    }

    #[tokio::test]
    async fn min_and_max_survive_deleting_the_extreme() {
        let mut h = harness(true);
        assert_eq!(
            h.epoch("+ 1 5\n+ 1 3\n+ 1 9\n+ 2 7").await,
            "+ 1 3 3 17 3 9 5.666666666666667\n+ 2 1 1 7 7 7 7.0"
        );
        assert_eq!(
            h.epoch("- 1 3\n- 1 9").await,
            "+ 1 1 1 5 5 5 5.0\n- 1 3 3 17 3 9 5.666666666666667"
        );
        // Empty the cache so the next epoch reads its state back from RocksDB.
        h.agg.cache.clear();
        assert_eq!(
            h.epoch("+ 1 4").await,
            "+ 1 2 2 9 4 5 4.5\n- 1 1 1 5 5 5 5.0"
        );
    }

    #[tokio::test]
    async fn over_an_append_only_input_min_and_max_keep_only_the_extreme() {
        let mut kept = harness(true);
        let mut append_only = harness_with(true, true);
        let epochs = [
            "+ 1 5\n+ 1 3\n+ 1 9\n+ 2 7",
            "+ 1 2\n+ 2 8\n+ 1 4",
            "+ 1 10\n+ 3 -1",
        ];
        for (i, changes) in epochs.iter().enumerate() {
            if i == 2 {
                // The extremes come back from RocksDB with the groups' state.
                append_only.agg.cache.clear();
            }
            assert_eq!(
                append_only.epoch(changes).await,
                kept.epoch(changes).await,
                "{changes}"
            );
        }
        let mut values = 0;
        append_only
            .agg
            .values
            .scan(&[], false, &mut |_, _| {
                values += 1;
                true
            })
            .unwrap();
        assert_eq!(values, 0, "no value multiset is kept");
    }

    #[tokio::test]
    async fn deleting_the_last_row_removes_the_group() {
        let mut h = harness(true);
        h.epoch("+ 1 5\n+ 2 6").await;
        assert_eq!(h.epoch("- 2 6").await, "- 2 1 1 6 6 6 6.0");
        assert_eq!(h.epoch("+ 2 6\n- 2 6").await, "");
    }

    #[tokio::test]
    async fn nulls_count_as_rows_but_not_as_values() {
        let mut h = harness(true);
        assert_eq!(h.epoch("+ 1 NULL").await, "+ 1 1 0 NULL NULL NULL NULL");
        assert_eq!(
            h.epoch("+ 1 4").await,
            "+ 1 2 1 4 4 4 4.0\n- 1 1 0 NULL NULL NULL NULL"
        );
    }

    #[tokio::test]
    async fn global_aggregate_has_one_row_even_when_empty() {
        let mut h = harness(false);
        assert_eq!(h.epoch("").await, "+ 0 0 NULL NULL NULL NULL");
        assert_eq!(
            h.epoch("+ 1 2\n+ 1 4").await,
            "+ 2 2 6 2 4 3.0\n- 0 0 NULL NULL NULL NULL"
        );
        assert_eq!(
            h.epoch("- 1 2\n- 1 4").await,
            "+ 0 0 NULL NULL NULL NULL\n- 2 2 6 2 4 3.0"
        );
    }

    /// `SELECT w, count(*), min(v) FROM t GROUP BY w EMIT ON WINDOW CLOSE` over an endless
    /// stream of windows, each with a late row for a window already closed.
    #[tokio::test]
    async fn closed_windows_leave_no_state_behind() {
        use datafusion::arrow::array::TimestampMicrosecondArray;
        use datafusion::arrow::datatypes::TimeUnit;
        let mut epochs = Epochs::new();
        let store = epochs.store.clone();
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let input = schema(&[("w", ts.clone()), ("v", DataType::Int64)]);
        let call = |kind, arg| AggCall {
            kind,
            arg,
            arg_type: DataType::Int64,
            output_type: DataType::Int64,
            distinct: false,
            filter: None,
        };
        let mut agg = HashAgg::new(
            store.clone(),
            1,
            2,
            vec![col("w", &input).unwrap()],
            vec![ts.clone()],
            vec![
                call(AggKind::Count, lit(1i64)),
                call(AggKind::Min, col("v", &input).unwrap()),
            ],
            schema(&[("w", ts), ("c", DataType::Int64), ("lo", DataType::Int64)]),
            Some(0),
            false,
            ErrorSink::new("v"),
        )
        .unwrap();
        let entries = |table| {
            let mut n = 0;
            StateTable::new(store.clone(), table)
                .scan(&[], false, &mut |_, _| {
                    n += 1;
                    true
                })
                .unwrap();
            n
        };
        let mut emitted = Vec::new();
        for i in 0..1000i64 {
            // From the third window on, a row for the window before last, closed already.
            let late = if i >= 2 { 1 } else { 0 };
            let windows = TimestampMicrosecondArray::from(
                [i * 10, i * 10, (i - 2) * 10][..2 + late].to_vec(),
            );
            let values = Int64Array::from([i, i + 1, -1][..2 + late].to_vec());
            let batch =
                RecordBatch::try_new(input.clone(), vec![Arc::new(windows), Arc::new(values)])
                    .unwrap();
            let mut out = vec![];
            agg.on_chunk(0, StreamChunk::inserts(batch), &mut out)
                .unwrap();
            let passed = agg
                .on_watermark(
                    0,
                    Watermark {
                        column: 0,
                        value: i * 10,
                    },
                    &mut out,
                )
                .unwrap();
            assert_eq!(
                passed,
                [Watermark {
                    column: 0,
                    value: i * 10
                }]
            );
            epochs.end(&mut agg, &mut out).await;
            emitted.extend(out.iter().flat_map(|c| {
                c.to_string()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            }));
            // Only the open window is kept: one group, its two values.
            assert!(
                entries(1) <= 1 && entries(2) <= 2,
                "state grows at window {i}"
            );
        }
        assert_eq!(emitted.len(), 999);
        assert!(
            emitted[0].starts_with("+ 1970-01-01T00:00:00 2 0"),
            "{}",
            emitted[0]
        );
        assert!(
            emitted.iter().all(|r| r.contains(" 2 ")),
            "late rows counted"
        );
        assert!(agg.late_rows > 0);
    }

    #[test]
    fn state_round_trips() {
        let big = i256::from(i128::MAX).wrapping_mul(i256::from(-7));
        for (sum, failed) in [(i256::from(-5), false), (big, true)] {
            let s = GroupState {
                rows: 3,
                accs: vec![
                    Acc::Count { n: 3 },
                    Acc::Exact { n: 2, sum },
                    Acc::Float { n: 1, sum: 1.5 },
                    Acc::Extreme { n: 2, best: None },
                    Acc::Extreme {
                        n: 1,
                        best: Some(vec![7, 0, 1]),
                    },
                ],
                emitted: Some(vec![1, 2, 3]),
                failed,
            };
            assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);
        }
        // A sum that fits in 128 bits keeps the 16 bytes it always had.
        let small = GroupState {
            rows: 1,
            accs: vec![Acc::Exact {
                n: 1,
                sum: i256::from(i128::MIN),
            }],
            emitted: None,
            failed: false,
        };
        assert_eq!(encode_state(&small).len(), 8 + 1 + 1 + 8 + 16 + 1);
    }
}
