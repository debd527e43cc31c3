//! TemporalFilter: a `WHERE` condition that compares a row's time with `now()`, such as
//! `ts > now() - INTERVAL '1 hour'`, maintained as time passes.
//!
//! `now()` is the time the barrier ending each epoch carries, so a view at a sealed epoch
//! equals its query at that epoch's time. Each condition reduces to a bound `b` per row (`ts +
//! 1 hour` above) and a comparison of `now` with it: rows are visible while `now < b` (or
//! `<=`), and then expire, or visible once `now > b` (or `>=`). Rows wait in the state table
//! ordered by `b`, so each barrier reads only the rows whose visibility the passing time
//! changed (and, to find where they end, the first row it did not change). Expired rows are deleted from state: they can never come back, as time only moves
//! forward.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};

use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::expr::{eval_column, ErrorSink};
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{TemporalSpec, Visible};

impl Visible {
    fn at(self, b: i64, now: i64) -> bool {
        match self {
            Visible::Before => now < b,
            Visible::UntilAfter => now <= b,
            Visible::After => now > b,
            Visible::From => now >= b,
        }
    }

    fn expires(self) -> bool {
        matches!(self, Visible::Before | Visible::UntilAfter)
    }
}

pub struct TemporalFilter {
    spec: TemporalSpec,
    rows: RowCodec,
    /// Rows by bound then row bytes, with their multiplicity: the visible rows of an expiring
    /// condition, every row of an appearing one.
    table: StateTable,
    /// This epoch's changes: row bytes, bound, +1 or -1.
    pending: Vec<(Vec<u8>, i64, i64)>,
    /// The time of the last barrier, and of the one being handled.
    now: Option<i64>,
    next_now: i64,
    errors: ErrorSink,
}

fn bound_key(b: i64, row: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + row.len());
    key.extend_from_slice(&((b as u64) ^ (1 << 63)).to_be_bytes());
    key.extend_from_slice(row);
    key
}

fn split_bound_key(key: &[u8]) -> Result<(i64, &[u8])> {
    let corrupt = || Error::new(ErrorKind::DataCorruption, "bad temporal filter state");
    let (b, row) = key.split_at_checked(8).ok_or_else(corrupt)?;
    let b = u64::from_be_bytes(b.try_into().map_err(|_| corrupt())?) ^ (1 << 63);
    Ok((b as i64, row))
}

fn decode_count(v: &[u8]) -> Result<i64> {
    let corrupt = || Error::new(ErrorKind::DataCorruption, "bad temporal filter count");
    Ok(i64::from_le_bytes(v.try_into().map_err(|_| corrupt())?))
}

impl TemporalFilter {
    pub fn new(
        store: Arc<StateStore>,
        table: TableId,
        spec: TemporalSpec,
        errors: ErrorSink,
    ) -> Result<TemporalFilter> {
        Ok(TemporalFilter {
            rows: RowCodec::for_schema(&spec.schema)?,
            table: StateTable::new(store, table),
            spec,
            pending: Vec::new(),
            now: None,
            next_now: i64::MIN,
            errors,
        })
    }

    fn add(&mut self, key: Vec<u8>, w: i64) -> Result<()> {
        let count = match self.table.get(&key)? {
            Some(v) => decode_count(&v)?,
            None => 0,
        } + w;
        if count <= 0 {
            self.table.delete(key);
        } else {
            self.table.put(key, count.to_le_bytes().to_vec());
        }
        Ok(())
    }
}

impl Operator for TemporalFilter {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, _out: &mut dyn Emit) -> Result<()> {
        let times = eval_column(&self.spec.row_time, &chunk.data, &chunk.ops, &self.errors)?;
        let times = cast(&times, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        let times = times.as_primitive::<TimestampMicrosecondType>();
        let rows = self.rows.encode(chunk.data.columns())?;
        for (i, row) in rows.into_iter().enumerate() {
            // A NULL time makes the condition NULL: the row is never visible.
            if times.is_null(i) {
                continue;
            }
            let b = times.value(i).saturating_sub(self.spec.offset_us);
            self.pending.push((row, b, chunk.ops[i].weight()));
        }
        Ok(())
    }

    fn on_tick(&mut self, now_us: i64) {
        self.next_now = now_us;
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        out: &mut dyn Emit,
        writes: &mut EpochWrites,
    ) -> Result<()> {
        let now = self.next_now.max(self.now.unwrap_or(i64::MIN));
        let visible = self.spec.visible;
        let mut emit: Vec<(Vec<u8>, Op)> = Vec::new();
        // Rows whose visibility the time that passed has changed, in bound order: for an
        // expiring condition the front of the state (expired rows are gone), for an appearing
        // one the rows from the first bound that was not visible yet.
        if let Some(before) = self.now {
            let mut changed: Vec<(Vec<u8>, i64)> = Vec::new();
            let first_hidden = match visible {
                Visible::After => before,
                _ => before.saturating_add(1),
            };
            let start = if visible.expires() {
                Vec::new()
            } else {
                bound_key(first_hidden, &[])
            };
            self.table.try_scan(&[], Some(&start), &mut |key, value| {
                let (b, _) = split_bound_key(key)?;
                let count = decode_count(value)?;
                let (was, is) = (visible.at(b, before), visible.at(b, now));
                if visible.expires() {
                    // Stored rows were visible; the first still visible ends the scan.
                    if is {
                        return Ok(false);
                    }
                } else if !is {
                    // Rows that are not visible yet come after every visible one.
                    return Ok(false);
                }
                if was != is {
                    changed.push((key.to_vec(), count));
                }
                Ok(true)
            })?;
            for (key, count) in changed {
                let (_, row) = split_bound_key(&key)?;
                let op = if visible.expires() {
                    Op::Delete
                } else {
                    Op::Insert
                };
                for _ in 0..count {
                    emit.push((row.to_vec(), op));
                }
                if visible.expires() {
                    self.table.delete(key);
                }
            }
        }
        // This epoch's changes, judged at this epoch's time.
        for (row, b, w) in std::mem::take(&mut self.pending) {
            let shown = visible.at(b, now);
            if shown {
                emit.push((row.clone(), if w > 0 { Op::Insert } else { Op::Delete }));
            }
            // An expiring condition forgets rows once expired; an appearing one keeps all.
            if shown || !visible.expires() {
                self.add(bound_key(b, &row), w)?;
            }
        }
        self.now = Some(now);
        if !emit.is_empty() {
            let columns = self.rows.decode(emit.iter().map(|(r, _)| r.as_slice()))?;
            let data = RecordBatch::try_new(self.spec.schema.clone(), columns)?;
            out.emit(StreamChunk::new(
                emit.iter().map(|(_, op)| *op).collect(),
                data,
            ))?;
        }
        self.table.take_writes(writes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use datafusion::arrow::datatypes::SchemaRef;
    use datafusion::physical_expr::expressions::col;

    struct Harness {
        epochs: Epochs,
        op: TemporalFilter,
        input: SchemaRef,
    }

    /// Over t(id int, t bigint used as microseconds): `t <op> now() - 10`.
    fn harness(visible: Visible) -> Harness {
        let epochs = Epochs::new();
        let input = schema(&[("id", DataType::Int32), ("t", DataType::Int64)]);
        let spec = TemporalSpec {
            row_time: col("t", &input).unwrap(),
            offset_us: -10,
            visible,
            schema: input.clone(),
        };
        let op = TemporalFilter::new(epochs.store.clone(), 1, spec, ErrorSink::new("v")).unwrap();
        Harness { epochs, op, input }
    }

    impl Harness {
        async fn at(&mut self, now: i64, changes: &str) -> String {
            let mut out = vec![];
            self.op
                .on_chunk(0, chunk(&self.input, changes), &mut out)
                .unwrap();
            self.op.on_tick(now);
            self.epochs.end(&mut self.op, &mut out).await;
            render_sorted(&out)
        }

        fn stored(&self) -> usize {
            self.op.table.entries()
        }
    }

    #[tokio::test]
    async fn rows_expire_as_time_passes_and_leave_state() {
        // `t > now() - 10`: visible while now < t + 10.
        let mut h = harness(Visible::Before);
        assert_eq!(h.at(100, "+ 1 95\n+ 2 80\n+ 3 NULL").await, "+ 1 95");
        assert_eq!(h.at(104, "+ 4 100").await, "+ 4 100");
        assert_eq!(h.at(105, "").await, "- 1 95");
        // Deleting an expired row changes nothing; deleting a visible one retracts it.
        assert_eq!(h.at(106, "- 1 95\n- 4 100").await, "- 4 100");
        assert_eq!(h.stored(), 0);
    }

    #[tokio::test]
    async fn rows_appear_once_time_passes() {
        // `t <= now() - 10`: visible once now >= t + 10.
        let mut h = harness(Visible::From);
        assert_eq!(h.at(100, "+ 1 95\n+ 2 80").await, "+ 2 80");
        assert_eq!(h.at(104, "").await, "");
        assert_eq!(h.at(105, "+ 3 200").await, "+ 1 95");
        assert_eq!(h.at(300, "- 2 80").await, "+ 3 200\n- 2 80");
    }
}
