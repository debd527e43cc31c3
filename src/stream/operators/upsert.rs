//! Upsert: the root of a table fed by a connector (`docs/design/0012-connector-tables.md`),
//! which turns changes by key into changes of rows. An insert row means "the row with this
//! primary key is now this one", a delete row "the row with this key is gone" (only its key
//! columns are read). Each key is looked up in the epoch's own changes, then in the table's
//! rows as its `Materialize` keeps them (the key's columns lead the stored rows, so one prefix
//! seek finds a key's row); the operator emits the old row's retraction and the new row, and
//! nothing when an upsert repeats the row a key has.
//!
//! A delete row whose key columns are all NULL deletes every row (an upstream `TRUNCATE`).
//!
//! It reads the table's state and writes none: the actor's `Materialize` applies what it
//! emits, and the epoch's changes are forgotten at the barrier, once they are the state's.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};

use crate::error::{Error, Result};
use crate::state::{EpochWrites, StateStore, StateTable};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::operator::{Emit, Operator};
use crate::stream::rows::RowCodec;
use crate::stream::spec::UpsertSpec;

pub struct Upsert {
    spec: UpsertSpec,
    /// The table's rows as its state stores them (key columns first).
    rows: RowCodec,
    /// The key's columns, whose encoding prefixes a stored row.
    keys: RowCodec,
    /// The table's `Materialize` state, read only.
    table: StateTable,
    /// The row each key changed to this epoch (`None`: deleted), by key.
    epoch: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Every row was deleted this epoch: the state's rows are gone but for `epoch`'s.
    truncated: bool,
}

/// Rows per chunk of a truncation's deletions.
const TRUNCATE_ROWS: usize = 4096;

impl Upsert {
    pub fn new(store: Arc<StateStore>, spec: UpsertSpec) -> Result<Upsert> {
        let key_types = spec
            .key
            .iter()
            .map(|c| spec.schema.field(*c).data_type().clone())
            .collect();
        Ok(Upsert {
            rows: RowCodec::ordered(&spec.schema, &spec.order)?,
            keys: RowCodec::new(key_types)?,
            table: StateTable::new(store, spec.table),
            spec,
            epoch: HashMap::new(),
            truncated: false,
        })
    }

    /// The row key `key` has now.
    fn current(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(row) = self.epoch.get(key) {
            return Ok(row.clone());
        }
        if self.truncated {
            return Ok(None);
        }
        let mut found = None;
        self.table.scan(key, false, &mut |k, _| {
            found = Some(k.to_vec());
            false
        })?;
        Ok(found)
    }

    /// Deletes every row: the state's (but for those of keys the epoch changed, whose stored
    /// rows are already retracted), in parts, then the epoch's.
    fn truncate(&mut self, out: &mut dyn Emit) -> Result<()> {
        if !self.truncated {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let mut part = Vec::new();
                let start = after.as_ref().map(|k| [k.as_slice(), &[0]].concat());
                self.table.try_scan(&[], start.as_deref(), &mut |k, _| {
                    part.push(k.to_vec());
                    Ok(part.len() < TRUNCATE_ROWS)
                })?;
                let Some(last) = part.last().cloned() else {
                    break;
                };
                let columns = self.rows.decode(part.iter().map(Vec::as_slice))?;
                let keys: Vec<ArrayRef> =
                    self.spec.key.iter().map(|c| columns[*c].clone()).collect();
                let keys = self.keys.encode(&keys)?;
                part = part
                    .into_iter()
                    .zip(keys)
                    .filter(|(_, k)| !self.epoch.contains_key(k))
                    .map(|(row, _)| row)
                    .collect();
                self.emit_deletes(part, out)?;
                after = Some(last);
            }
        }
        self.truncated = true;
        let rows: Vec<Vec<u8>> = self.epoch.drain().filter_map(|(_, r)| r).collect();
        for part in rows.chunks(TRUNCATE_ROWS) {
            self.emit_deletes(part.to_vec(), out)?;
        }
        Ok(())
    }

    fn emit_deletes(&self, rows: Vec<Vec<u8>>, out: &mut dyn Emit) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let columns = self.rows.decode(rows.iter().map(Vec::as_slice))?;
        let data = RecordBatch::try_new(self.spec.schema.clone(), columns)?;
        out.emit(StreamChunk::deletes(data))
    }
}

impl Operator for Upsert {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let columns = chunk.data.columns();
        let key_columns: Vec<ArrayRef> =
            self.spec.key.iter().map(|c| columns[*c].clone()).collect();
        // A deletion without a key: every row goes, and the rows after it change the emptied
        // table.
        let rows = chunk.len();
        let keyless = |i: usize| key_columns.iter().all(|c| c.is_null(i));
        if let Some(at) = (0..rows).find(|i| chunk.ops[*i] == Op::Delete && keyless(*i)) {
            if at > 0 {
                self.on_chunk(0, chunk.take(&(0..at as u32).collect::<Vec<_>>())?, out)?;
            }
            self.truncate(out)?;
            if at + 1 < rows {
                let rest: Vec<u32> = (at as u32 + 1..rows as u32).collect();
                self.on_chunk(0, chunk.take(&rest)?, out)?;
            }
            return Ok(());
        }
        if key_columns.iter().any(|c| c.null_count() > 0) {
            return Err(Error::internal(
                "an upsert without its key reached a connector table: connectors drop those",
            ));
        }
        let keys = self.keys.encode(&key_columns)?;
        let rows = self.rows.encode(columns)?;
        let mut ops = Vec::new();
        let mut changed: Vec<Vec<u8>> = Vec::new();
        for ((key, row), op) in keys.into_iter().zip(rows).zip(&chunk.ops) {
            let old = self.current(&key)?;
            let new = match op {
                Op::Insert => Some(row),
                Op::Delete => None,
            };
            if old == new {
                continue;
            }
            if let Some(old) = old {
                ops.push(Op::Delete);
                changed.push(old);
            }
            if let Some(new) = &new {
                ops.push(Op::Insert);
                changed.push(new.clone());
            }
            self.epoch.insert(key, new);
        }
        if ops.is_empty() {
            return Ok(());
        }
        let columns = self.rows.decode(changed.iter().map(Vec::as_slice))?;
        let data = RecordBatch::try_new(self.spec.schema.clone(), columns)?;
        out.emit(StreamChunk::new(ops, data))
    }

    fn on_barrier(
        &mut self,
        _epoch: u64,
        _out: &mut dyn Emit,
        _writes: &mut EpochWrites,
    ) -> Result<()> {
        // The actor's Materialize writes the epoch's rows after this, before the next epoch's
        // first chunk: from then on the state has them.
        self.epoch.clear();
        self.truncated = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, render_sorted, schema};
    use crate::stream::operator::test_util::Epochs;
    use crate::stream::operators::materialize::Materialize;
    use datafusion::arrow::datatypes::DataType;

    #[tokio::test(flavor = "multi_thread")]
    async fn upserts_retract_the_rows_their_keys_had_in_the_epoch_and_in_the_state() {
        let epochs = Epochs::new();
        // (name, id) with the key `id`, stored first.
        let s = schema(&[("name", DataType::Utf8), ("id", DataType::Int64)]);
        let spec = UpsertSpec {
            schema: s.clone(),
            key: vec![1],
            order: vec![1, 0],
            table: 1000,
        };
        let mut upsert = Upsert::new(epochs.store.clone(), spec).unwrap();
        let mut rows = Materialize::new(epochs.store.clone(), 1000, s.clone(), &[1, 0]).unwrap();
        let step = |upsert: &mut Upsert, rows: &mut Materialize, text: &str| {
            let mut out = Vec::new();
            upsert.on_chunk(0, chunk(&s, text), &mut out).unwrap();
            for c in &out {
                rows.apply(c).unwrap();
            }
            render_sorted(&out)
        };
        let (u, r) = (&mut upsert, &mut rows);
        // Within one epoch: a new key, its new row, the same row again, a deletion of a key
        // that is not there.
        assert_eq!(step(u, r, "+ a 1\n+ b 2"), "+ a 1\n+ b 2");
        assert_eq!(step(u, r, "+ c 1\n+ b 2"), "+ c 1\n- a 1");
        assert_eq!(step(u, r, "- _ 9"), "");
        let mut writes = EpochWrites::default();
        u.on_barrier(1, &mut Vec::new(), &mut writes).unwrap();
        r.flush(&mut writes).unwrap();
        epochs.store.commit(1, writes).await.unwrap();
        epochs.store.seal(1);
        // The next epoch reads the stored rows.
        assert_eq!(step(u, r, "+ d 1"), "+ d 1\n- c 1");
        assert_eq!(step(u, r, "- _ 2\n+ b 2"), "+ b 2\n- b 2");
        assert_eq!(step(u, r, "- _ 1"), "- d 1");
        let mut writes = EpochWrites::default();
        u.on_barrier(2, &mut Vec::new(), &mut writes).unwrap();
        r.flush(&mut writes).unwrap();
        epochs.store.commit(2, writes).await.unwrap();
        epochs.store.seal(2);
        // A deletion without a key empties the table: the stored rows and the epoch's.
        assert_eq!(step(u, r, "+ c 2\n+ e 5"), "+ c 2\n+ e 5\n- b 2");
        assert_eq!(
            step(u, r, "+ g 7\n- _ NULL\n+ f 6"),
            "+ f 6\n+ g 7\n- c 2\n- e 5\n- g 7"
        );
        assert_eq!(step(u, r, "+ b 2"), "+ b 2");
    }
}
