//! HashAgg: GROUP BY with COUNT, SUM, AVG, MIN, MAX, BOOL_AND and BOOL_OR, each optionally
//! DISTINCT and with a FILTER, under insertions and deletions.
//!
//! Each group keeps its row count and one accumulator per aggregate in the `groups` state
//! table. MIN and MAX cannot be retracted from a single value, so each keeps the group's
//! multiset of non-NULL values in the `values` table, ordered by value: the minimum is the
//! first entry of the group's range, the maximum the last, also after the current extreme is
//! deleted. A DISTINCT aggregate keeps its multiset there too, and a value reaches the
//! accumulator only when its count moves between zero and one. Output changes are emitted once
//! per epoch, at the barrier, for the groups the epoch touched: the group's previous output row
//! is retracted and its new one inserted. Without GROUP BY there is exactly one group, which
//! exists even when empty, so the view holds one row (COUNT = 0, SUM = NULL) over an empty
//! input, as in PostgreSQL.
//!
//! Groups read or changed stay in memory (`cache`) with their multisets of values
//! (`values.rs`), within the operators' share of memory for caches; past it the cache empties
//! at the barrier. While the operator's state was empty when it was built and its cache has
//! not emptied since, a group not cached has no state, and a new group reads nothing.
//!
//! Group keys start with their virtual node (`stream::dispatch`), so that the groups of one of
//! a view's parallel actors are its vnodes' ranges.
//!
//! With EMIT ON WINDOW CLOSE, one grouping column is a window bound that carries a watermark.
//! Group keys are stored with that column first, so the closed windows are the front of each
//! vnode's key range. A group emits nothing while its window is open; when the watermark passes it,
//! its one final row is emitted and its state deleted, so state holds open windows only.
//! Changes that arrive for a closed window are late and ignored.

mod accumulator;
mod codec;
mod groups;
mod values;
mod window;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ScalarValue;
use datafusion::physical_plan::PhysicalExpr;

use self::accumulator::{Acc, Added, Values};
use self::codec::{decode_state, encode_state, GroupState};
use self::groups::{Groups, Place};
use self::values::{count_value, HeldValues, VALUES_MAX};
use crate::error::{Error, ErrorKind, Result};
use crate::state::{
    least_used_half, CacheShare, EpochWrites, NotHeld, StateStore, StateTable, TableId,
};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::dispatch::vnodes;
use crate::stream::expr::{eval_columns, eval_predicate, ErrorSink};
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{AggCall, AggKind, AggSpec};

/// Group keys start with a 2-byte virtual node.
const VNODE_BYTES: usize = 2;

/// What a cached group takes besides its key: the map's entry, the state's fields and its
/// emitted row's vector.
const CACHED_GROUP_BYTES: u64 = 128;

/// With `AggSpec::early`, the changed groups whose changes are emitted before the barrier.
const EARLY_GROUPS: usize = 4096;

/// The memory a cached group is counted for (`CacheShare`): its key, its emitted row (about
/// its key and its aggregates again) and its accumulators. Extremes of text are counted as
/// their size in the accumulator only; the estimate is the same at load and at eviction, so
/// what is counted is given back exactly.
fn cached_bytes(key: &[u8], calls: usize) -> u64 {
    let acc = std::mem::size_of::<Acc>() as u64 + 16;
    CACHED_GROUP_BYTES + 2 * key.len() as u64 + calls as u64 * acc
}

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

/// A group in the cache.
struct Cached {
    state: GroupState,
    /// The group's values of MIN/MAX and DISTINCT calls, when held (`values.rs`).
    values: Option<HeldValues>,
    /// Changed in this epoch (its key is in `HashAgg::dirty`).
    dirty: bool,
    /// Its changes were emitted early in this epoch, its state is saved at the barrier (its
    /// key is in `HashAgg::unsaved`).
    unsaved: bool,
    /// What it is counted for in the cache's share, besides its values held.
    bytes: u64,
}

impl Cached {
    fn counted(&self) -> u64 {
        self.bytes + self.values.as_ref().map_or(0, HeldValues::bytes)
    }
}

/// What each call reads from one chunk.
struct CallInputs {
    /// Which rows its FILTER keeps.
    filters: Vec<Option<BooleanArray>>,
    /// For a DISTINCT call (other than MIN/MAX), each row's value as bytes.
    distinct: Vec<Option<Vec<Vec<u8>>>>,
    values: Vec<Values>,
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
    /// The groups' state read or changed, until its share of memory is over
    /// (`cache_share`); state stays in RocksDB, the cache only saves reads.
    cache: Groups,
    cache_share: CacheShare,
    /// Which groups not cached have no state: while the operator is complete (state was
    /// empty when it was built), those it never let go of.
    not_held: NotHeld,
    /// The cache holds every group there is: complete, and no group let go.
    holds_all: bool,
    /// Whether some call keeps a multiset of values (`values.rs`).
    keeps_values: bool,
    /// Most values of a group held in memory (`VALUES_MAX`, less in tests).
    values_max: usize,
    /// The groups changed in this epoch (a place may be listed twice, or hold a group no
    /// longer changed after its window closed: `Cached::dirty` tells).
    dirty: Vec<Place>,
    /// With `AggSpec::early`: how many changed groups are emitted before the barrier
    /// (`EARLY_GROUPS`, less in tests).
    early: Option<usize>,
    /// The groups whose changes were emitted early in this epoch, to be saved at the barrier.
    unsaved: Vec<Place>,
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
    /// An aggregate keeping its groups in `tables[0]` and its calls' values in `tables[1]`.
    pub fn new(
        store: Arc<StateStore>,
        tables: [TableId; 2],
        spec: AggSpec,
        errors: ErrorSink,
    ) -> Result<HashAgg> {
        let AggSpec {
            group_exprs,
            group_types,
            calls,
            schema,
            close_on,
            append_only,
            early,
        } = spec;
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
        // With EMIT ON WINDOW CLOSE, changes are emitted when windows close.
        let early = (early && close_on.is_none()).then_some(EARLY_GROUPS);
        let close_on = match close_on {
            Some(w) => Some((w, RowCodec::new(vec![group_types[w].clone()])?)),
            None => None,
        };
        let stored_types = key_order.iter().map(|i| group_types[*i].clone()).collect();
        let [groups_table, values_table] = tables;
        let groups = StateTable::new(store.clone(), groups_table);
        let values = StateTable::new(store.clone(), values_table);
        let empty = groups.is_empty()? && values.is_empty()?;
        let keeps_values = calls
            .iter()
            .any(|c| c.distinct || (matches!(c.kind, AggKind::Min | AggKind::Max) && !append_only));
        Ok(HashAgg {
            not_held: NotHeld::new(empty),
            holds_all: empty,
            keeps_values,
            values_max: VALUES_MAX,
            group_codec: RowCodec::new(stored_types)?,
            key_order,
            close_on,
            closed_below: None,
            late_rows: 0,
            output_codec: RowCodec::for_schema(&schema)?,
            value_codecs,
            groups,
            cache_share: store.cache_share(),
            values,
            append_only,
            cache: Groups::default(),
            dirty: Vec::new(),
            early,
            unsaved: Vec::new(),
            global,
            global_emitted: false,
            group_exprs,
            calls,
            schema,
            errors,
        })
    }

    /// Reads the group's state into the cache if it is not there (a group known to have no
    /// state reads nothing); returns its place there.
    fn load(&mut self, key: &[u8]) -> Result<Place> {
        let HashAgg {
            cache,
            not_held,
            groups,
            values,
            keeps_values,
            values_max,
            calls,
            cache_share,
            ..
        } = self;
        cache.find_or_load(key, || {
            let stored = match not_held.absent(key) {
                true => None,
                false => groups.get(key)?,
            };
            let (state, values) = match stored {
                Some(bytes) => {
                    let values = match keeps_values {
                        true => HeldValues::read(values, key, calls.len(), *values_max)?,
                        false => None,
                    };
                    (decode_state(&bytes)?, values)
                }
                None => (
                    GroupState {
                        rows: 0,
                        accs: calls.iter().map(Acc::empty).collect(),
                        emitted: None,
                        failed: false,
                    },
                    keeps_values.then(|| HeldValues::empty(calls.len())),
                ),
            };
            let cached = Cached {
                state,
                values,
                dirty: false,
                unsaved: false,
                bytes: cached_bytes(key, calls.len()),
            };
            cache_share.grow(cached.counted());
            Ok(cached)
        })
    }

    /// Drops a group from the cache.
    fn uncache(&mut self, place: Place) {
        if let Some(cached) = self.cache.remove(place) {
            self.cache_share.shrink(cached.counted());
        }
    }

    /// Marks a cached group as changed in this epoch.
    fn touch(&mut self, place: Place) {
        if let Some(cached) = self.cache.get_mut(place) {
            if !cached.dirty {
                cached.dirty = true;
                self.dirty.push(place);
            }
        }
    }

    /// The groups changed in this epoch, each once, and no longer marked.
    fn take_dirty(&mut self) -> Vec<Place> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.retain(|&place| match self.cache.get_mut(place) {
            Some(cached) => std::mem::replace(&mut cached.dirty, false),
            None => false,
        });
        dirty
    }

    /// At a barrier, when operators' caches hold more than their share of memory: lets go of
    /// the groups least recently used, half of what the cache holds.
    fn trim_cache(&mut self) {
        if self.cache_share.over() {
            self.let_go_least_used();
        }
    }

    fn let_go_least_used(&mut self) {
        let Some(last) = least_used_half(self.cache.uses().map(|(c, u)| (u, c.counted()))) else {
            return;
        };
        let HashAgg {
            cache,
            not_held,
            cache_share,
            ..
        } = self;
        cache.retain(|key, cached, used| {
            let keep = used > last;
            if !keep {
                not_held.let_go_entry(key, cached.counted(), cache_share);
            }
            keep
        });
        self.holds_all = false;
    }

    /// Empties the group cache and forgets which groups have state, as after a restart.
    #[cfg(test)]
    fn forget_cache(&mut self) {
        self.cache.clear();
        self.not_held.forget(&mut self.cache_share);
        self.cache_share.clear();
        self.holds_all = false;
    }

    /// Each row's group key: its virtual node, then the group columns in stored order.
    fn group_keys(&self, group_columns: &[ArrayRef], rows: usize) -> Result<Vec<Vec<u8>>> {
        if self.global {
            return Ok(vec![Vec::new(); rows]);
        }
        let stored: Vec<ArrayRef> = self
            .key_order
            .iter()
            .map(|i| group_columns[*i].clone())
            .collect();
        // Each group's key starts with its virtual node: a parallel actor's groups are its
        // vnodes' ranges.
        Ok(self
            .group_codec
            .encode(&stored)?
            .into_iter()
            .zip(vnodes(group_columns)?)
            .map(|(key, vnode)| {
                let mut k = Vec::with_capacity(VNODE_BYTES + key.len());
                k.extend_from_slice(&vnode.to_be_bytes());
                k.extend_from_slice(&key);
                k
            })
            .collect())
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

    /// Evaluates each call's argument, FILTER and DISTINCT values over a chunk.
    fn call_inputs(&self, chunk: &StreamChunk) -> Result<CallInputs> {
        let batch = &chunk.data;
        let args: Vec<ArrayRef> = eval_columns(
            &self.calls.iter().map(|c| c.arg.clone()).collect::<Vec<_>>(),
            batch,
            &chunk.ops,
            &self.errors,
        )?;
        let mut inputs = CallInputs {
            filters: Vec::with_capacity(self.calls.len()),
            distinct: Vec::with_capacity(self.calls.len()),
            values: Vec::with_capacity(self.calls.len()),
        };
        for ((call, array), codec) in self.calls.iter().zip(args).zip(&self.value_codecs) {
            inputs.filters.push(match &call.filter {
                Some(f) => Some(eval_predicate(f, batch, &chunk.ops, &self.errors)?),
                None => None,
            });
            let counted_once = call.distinct && !matches!(call.kind, AggKind::Min | AggKind::Max);
            inputs.distinct.push(match (codec, counted_once) {
                (Some(codec), true) => Some(codec.encode(std::slice::from_ref(&array))?),
                _ => None,
            });
            inputs
                .values
                .push(Values::read(call, array, codec.as_ref())?);
        }
        Ok(inputs)
    }

    /// Adds one row of weight `w` to its group. Each call adds it unless its FILTER drops the
    /// row or, for DISTINCT, the value was already there (or still is).
    fn accumulate(&mut self, key: &[u8], row: usize, w: i64, inputs: &CallInputs) -> Result<()> {
        let place = self.load(key)?;
        let HashAgg {
            cache,
            values: table,
            calls,
            append_only,
            cache_share,
            values_max,
            ..
        } = self;
        let cached = cache.get_mut(place).expect("loaded");
        let counted_before = cached.counted();
        cached.state.rows += w;
        for (idx, call) in calls.iter().enumerate() {
            if let Some(mask) = &inputs.filters[idx] {
                if !(mask.is_valid(row) && mask.value(row)) {
                    continue;
                }
            }
            let values = &inputs.values[idx];
            if let Some(bytes) = &inputs.distinct[idx] {
                if values.is_valid(row) {
                    let held = cached.values.as_mut();
                    let (before, after) = count_value(table, held, key, idx, &bytes[row], w)?;
                    if (before == 0) == (after == 0) {
                        continue;
                    }
                }
            }
            let acc = &mut cached.state.accs[idx];
            if let Added::CountValue = acc.add(call.kind, values, row, w, *append_only)? {
                let value = values
                    .ordered(row)
                    .ok_or_else(|| Error::internal("min/max value without bytes"))?;
                count_value(table, cached.values.as_mut(), key, idx, value, w)?;
            }
        }
        if cached
            .values
            .as_ref()
            .is_some_and(|v| v.len() > *values_max)
        {
            cached.values = None;
        }
        let counted = cached.counted();
        if counted > counted_before {
            cache_share.grow(counted - counted_before);
        } else {
            cache_share.shrink(counted_before - counted);
        }
        self.touch(place);
        Ok(())
    }

    /// The output rows of the given (cached) groups, each row's encoding, and the error of
    /// the rows where an aggregate is out of range (NULL there).
    fn output_rows(&self, places: &[Place]) -> Result<Option<OutputRows>> {
        if places.is_empty() {
            return Ok(None);
        }
        let mut agg_values: Vec<Vec<ScalarValue>> = vec![Vec::new(); self.calls.len()];
        let mut failures: Vec<Option<Error>> = vec![None; places.len()];
        for (row, &place) in places.iter().enumerate() {
            let cached = self.cache.get(place).expect("cached");
            let key = self.cache.key(place);
            for (idx, acc) in cached.state.accs.iter().enumerate() {
                let held = cached.values.as_ref();
                let v = match self.output_value(key, idx, acc, held) {
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
            self.decode_keys(places.iter().map(|&p| self.cache.key(p)))?
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

    /// The output value of one aggregate for a group.
    fn output_value(
        &self,
        key: &[u8],
        idx: usize,
        acc: &Acc,
        held: Option<&HeldValues>,
    ) -> Result<ScalarValue> {
        let call = &self.calls[idx];
        // The group's least (or greatest) value of the call, held or from the `values` table.
        let greatest = call.kind == AggKind::Max;
        let extreme = || {
            if let Some(held) = held {
                return held
                    .extreme(idx, greatest)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| {
                        Error::internal("min/max state has values counted but none held")
                    });
            }
            let mut prefix = key.to_vec();
            prefix.push(idx as u8);
            let mut found: Option<Vec<u8>> = None;
            self.values.scan(&prefix, greatest, &mut |k, _| {
                found = Some(k[prefix.len()..].to_vec());
                false
            })?;
            found.ok_or_else(|| Error::internal("min/max state has values counted but none stored"))
        };
        acc.output(call, self.value_codecs[idx].as_ref(), extreme)
    }

    /// Emits the changes of the groups touched since they were last emitted: each one's
    /// previous output row retracted and its new one inserted, where they differ.
    fn emit_changes(&mut self, dirty: &[Place], out: &mut dyn Emit) -> Result<()> {
        // New output rows for the groups that still exist.
        let mut live: Vec<Place> = Vec::new();
        for &place in dirty {
            let state = &self.cache.get(place).expect("cached").state;
            assert!(state.rows >= 0, "group retracted more rows than it had");
            if state.rows > 0 || self.global {
                live.push(place);
            }
        }
        let mut retract: Vec<Vec<u8>> = Vec::new();
        let mut keep_insert: Vec<u32> = Vec::new();
        let mut inserted: Option<RecordBatch> = None;
        if let Some(rows) = self.output_rows(&live)? {
            // Compare with what was emitted before.
            let new_rows = rows.encoded.into_iter().zip(rows.failures);
            for (pos, (&place, (new, failure))) in live.iter().zip(new_rows).enumerate() {
                let state = &mut self.cache.get_mut(place).expect("cached").state;
                set_failed(&self.errors, state, failure.as_ref());
                if state.emitted.as_ref() == Some(&new) {
                    continue;
                }
                if let Some(old) = state.emitted.replace(new) {
                    retract.push(old);
                }
                keep_insert.push(pos as u32);
            }
            inserted = Some(rows.batch);
        }
        for &place in dirty {
            let state = &mut self.cache.get_mut(place).expect("cached").state;
            if state.rows == 0 && !self.global {
                if let Some(old) = state.emitted.take() {
                    retract.push(old);
                }
                set_failed(&self.errors, state, None);
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
        Ok(())
    }

    /// Before the barrier, with `early`: emits the changes of the groups changed so far, once
    /// there are `EARLY_GROUPS` of them; their state is saved at the barrier.
    fn emit_early(&mut self, out: &mut dyn Emit) -> Result<()> {
        if self.early.is_none_or(|n| self.dirty.len() < n) {
            return Ok(());
        }
        let dirty = self.take_dirty();
        self.emit_changes(&dirty, out)?;
        for place in dirty {
            if let Some(cached) = self.cache.get_mut(place) {
                if !std::mem::replace(&mut cached.unsaved, true) {
                    self.unsaved.push(place);
                }
            }
        }
        Ok(())
    }

    /// At the barrier: saves the state of the groups changed in the epoch (`dirty`, and those
    /// emitted early), or deletes it where a group has no rows left.
    fn save_changes(&mut self, dirty: Vec<Place>) {
        let mut changed = std::mem::take(&mut self.unsaved);
        changed.extend(
            dirty
                .into_iter()
                .filter(|&p| self.cache.get(p).is_some_and(|c| !c.unsaved)),
        );
        for place in changed {
            let Some(cached) = self.cache.get_mut(place) else {
                continue;
            };
            cached.unsaved = false;
            if cached.state.rows == 0 && !self.global {
                self.groups.delete(self.cache.key(place).to_vec());
                self.uncache(place);
            } else {
                let bytes = encode_state(&cached.state);
                self.groups.put(self.cache.key(place).to_vec(), bytes);
            }
        }
    }
}

impl Operator for HashAgg {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let rows = chunk.data.num_rows();
        self.cache.tick();
        let group_columns = eval_columns(&self.group_exprs, &chunk.data, &chunk.ops, &self.errors)?;
        let keys = self.group_keys(&group_columns, rows)?;
        let late = self.late(&group_columns, rows)?;
        let inputs = self.call_inputs(&chunk)?;
        for (row, (key, op)) in keys.iter().zip(&chunk.ops).enumerate() {
            if late[row] {
                self.late_rows += 1;
                continue;
            }
            self.accumulate(key, row, op.weight(), &inputs)?;
        }
        self.emit_early(out)
    }

    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        self.close_windows(watermark, out)
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        if self.close_on.is_some() {
            self.save_open_windows();
        } else {
            if self.global && !self.global_emitted {
                let place = self.load(&[])?;
                self.touch(place);
                self.global_emitted = true;
            }
            let dirty = self.take_dirty();
            self.emit_changes(&dirty, out)?;
            self.save_changes(dirty);
        }
        self.trim_cache();
        self.groups.take_writes(writes);
        self.values.take_writes(writes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::DataType;
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
        let spec = AggSpec {
            group_exprs,
            group_types,
            calls,
            schema: schema(&cols),
            close_on: None,
            append_only,
            early: false,
        };
        let agg = HashAgg::new(epochs.store.clone(), [1, 2], spec, ErrorSink::new("v")).unwrap();
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

    /// Past operators' share of memory for caches (an eighth of the limit), the groups least
    /// recently used (here all, used in one chunk) go at the barrier and what they counted is
    /// given back, but for the hashes that say they have state; their state comes back from
    /// RocksDB when they change again.
    #[tokio::test]
    async fn the_cache_empties_past_its_share_and_groups_come_back_from_state() {
        let mut h = harness(true);
        let store = h.epochs.store.clone();
        store.limit_memory(2 << 20).unwrap();
        let many: Vec<String> = (0..1000).map(|g| format!("+ {g} {g}")).collect();
        let out = h.epoch(&many.join("\n")).await;
        assert_eq!(out.lines().count(), 1000);
        assert_eq!(h.agg.cache.len(), 0, "1000 groups are over 256 KiB");
        let let_go = 1000 * crate::state::LET_GO_BYTES;
        assert_eq!(store.caches_memory(), (let_go, 256 << 10));
        assert_eq!(
            h.epoch("+ 7 4").await,
            "+ 7 2 2 11 4 7 5.5\n- 7 1 1 7 7 7 7.0"
        );
        assert_eq!(h.agg.cache.len(), 1);
        let (held, _) = store.caches_memory();
        assert_eq!(held, h.agg.cache_share.held());
        assert!(held > let_go && held < let_go + 1024, "{held}");
        assert!(h.agg.not_held.complete());
        drop(h);
        assert_eq!(
            store.caches_memory().0,
            0,
            "a dropped operator gives its share back"
        );
    }

    #[tokio::test]
    async fn changes_emitted_early_are_the_same_changes_and_state_is_saved_at_the_barrier() {
        let mut h = harness(true);
        h.agg.early = Some(2);
        let mut out = vec![];
        let mut feed = |h: &mut Harness, changes: &str| {
            h.agg
                .on_chunk(0, chunk(&h.input, changes), &mut out)
                .unwrap();
            let emitted = render_sorted(&out);
            out.clear();
            emitted
        };
        // One group changed: it waits; a second one: both are emitted.
        assert_eq!(feed(&mut h, "+ 1 5"), "");
        assert_eq!(
            feed(&mut h, "+ 2 7\n+ 1 3"),
            "+ 1 2 2 8 3 5 4.0\n+ 2 1 1 7 7 7 7.0"
        );
        // Changed again in the same epoch, and one emptied.
        assert_eq!(
            feed(&mut h, "+ 1 9\n- 2 7"),
            "+ 1 3 3 17 3 9 5.666666666666667\n- 1 2 2 8 3 5 4.0\n- 2 1 1 7 7 7 7.0"
        );
        assert_eq!(feed(&mut h, "+ 3 1"), "");
        let mut rest = vec![];
        h.epochs.end(&mut h.agg, &mut rest).await;
        assert_eq!(render_sorted(&rest), "+ 3 1 1 1 1 1 1.0");
        // What was emitted early was saved at the barrier; the emptied group was deleted.
        h.agg.early = None;
        h.agg.forget_cache();
        assert_eq!(
            h.epoch("+ 1 4\n+ 2 2").await,
            "+ 1 4 4 21 3 9 5.25\n+ 2 1 1 2 2 2 2.0\n- 1 3 3 17 3 9 5.666666666666667"
        );
        h.agg.forget_cache();
        assert_eq!(h.epoch("- 3 1").await, "- 3 1 1 1 1 1 1.0");
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
        h.agg.forget_cache();
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
                append_only.agg.forget_cache();
            }
            assert_eq!(
                append_only.epoch(changes).await,
                kept.epoch(changes).await,
                "{changes}"
            );
        }
        assert_eq!(
            append_only.agg.values.entries(),
            0,
            "no value multiset is kept"
        );
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
        let spec = AggSpec {
            group_exprs: vec![col("w", &input).unwrap()],
            group_types: vec![ts.clone()],
            calls: vec![
                call(AggKind::Count, lit(1i64)),
                call(AggKind::Min, col("v", &input).unwrap()),
            ],
            schema: schema(&[("w", ts), ("c", DataType::Int64), ("lo", DataType::Int64)]),
            close_on: Some(0),
            append_only: false,
            early: false,
        };
        let mut agg = HashAgg::new(store.clone(), [1, 2], spec, ErrorSink::new("v")).unwrap();
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

    /// `SELECT g, count(*), min(v), max(v), count(DISTINCT v), sum(DISTINCT v) FROM t GROUP BY
    /// g` on tables `tables`, holding at most `values_max` values of a group in memory.
    fn distinct_agg(epochs: &Epochs, tables: [TableId; 2], values_max: usize) -> HashAgg {
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let v = col("v", &input).unwrap();
        let call = |kind, distinct| AggCall {
            kind,
            arg: v.clone(),
            arg_type: DataType::Int64,
            output_type: DataType::Int64,
            distinct,
            filter: None,
        };
        let mut count_rows = call(AggKind::Count, false);
        count_rows.arg = lit(1i64);
        let spec = AggSpec {
            group_exprs: vec![col("g", &input).unwrap()],
            group_types: vec![DataType::Int32],
            calls: vec![
                count_rows,
                call(AggKind::Min, false),
                call(AggKind::Max, false),
                call(AggKind::Count, true),
                call(AggKind::Sum, true),
            ],
            schema: schema(&[
                ("g", DataType::Int32),
                ("n", DataType::Int64),
                ("lo", DataType::Int64),
                ("hi", DataType::Int64),
                ("distinct", DataType::Int64),
                ("sum_distinct", DataType::Int64),
            ]),
            close_on: None,
            append_only: false,
            early: false,
        };
        let mut agg =
            HashAgg::new(epochs.store.clone(), tables, spec, ErrorSink::new("v")).unwrap();
        agg.values_max = values_max;
        agg
    }

    /// Random inserts and deletes: MIN, MAX and DISTINCT give the same output whether their
    /// groups' values are held in memory, read back from state at every chunk, held only
    /// for groups of a few values, or let go by use (the operator still complete).
    #[tokio::test]
    async fn values_held_or_read_from_state_give_the_same_output() {
        use crate::rng::Rng;
        let mut epochs = Epochs::new();
        let input = schema(&[("g", DataType::Int32), ("v", DataType::Int64)]);
        let mut warm = distinct_agg(&epochs, [1, 2], VALUES_MAX);
        let mut cold = distinct_agg(&epochs, [3, 4], VALUES_MAX);
        let mut small = distinct_agg(&epochs, [5, 6], 3);
        let mut halved = distinct_agg(&epochs, [7, 8], VALUES_MAX);
        assert!(warm.holds_all && warm.keeps_values);
        let mut rng = Rng::new(7);
        let mut rows: Vec<String> = Vec::new();
        for _ in 0..60 {
            let mut changes = String::new();
            for _ in 0..rng.below(10) + 1 {
                if !rows.is_empty() && rng.chance(40) {
                    let row = rows.swap_remove(rng.below(rows.len() as u64) as usize);
                    changes.push_str(&format!("- {row}\n"));
                } else {
                    let value = match rng.chance(10) {
                        true => "NULL".to_string(),
                        false => rng.below(8).to_string(),
                    };
                    let row = format!("{} {value}", rng.below(3));
                    changes.push_str(&format!("+ {row}\n"));
                    rows.push(row);
                }
            }
            cold.forget_cache();
            halved.let_go_least_used();
            let mut outputs = Vec::new();
            for agg in [&mut warm, &mut cold, &mut small, &mut halved] {
                let mut out = vec![];
                agg.on_chunk(0, chunk(&input, &changes), &mut out).unwrap();
                epochs.end(agg, &mut out).await;
                outputs.push(render_sorted(&out));
            }
            assert_eq!(outputs[0], outputs[1], "{changes}");
            assert_eq!(outputs[0], outputs[2], "{changes}");
            assert_eq!(outputs[0], outputs[3], "{changes}");
        }
        assert!(halved.not_held.complete() && !halved.holds_all);
        assert!(warm.holds_all, "the cache never emptied");
        assert!(warm.cache.iter().all(|(_, c)| c.values.is_some()));
        assert!(small.cache.iter().any(|(_, c)| c.values.is_none()));
    }
}
