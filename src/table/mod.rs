//! The write path of a table: constraint checks against the table's latest rows, the durable
//! change log, and the feed into the table's actor.
//!
//! A statement's changes are checked as a whole (nothing is applied if one row violates a
//! constraint), appended and fsync'd to the change log, applied to the latest rows, and sent
//! to the table's actor, all under the table's lock; only then is the statement acknowledged.
//!
//! The latest rows are kept in memory so that UPDATE, DELETE and primary-key checks see every
//! acknowledged change, not only the last sealed epoch. See `docs/architecture.md` ("Tables")
//! for why, and what replaces it.

use std::collections::HashMap;

// A fast seeded hasher for the rows (SipHash was a fifth of a restart's time).
use datafusion::common::HashMap as RowMap;
use std::path::Path;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::TimestampMicrosecondType;

use crate::catalog::{TableDef, WatermarkDef};
use crate::changelog::ChangeLog;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::coordinator::FailedActors;
use crate::stream::message::{Feed, Watermark};
use crate::stream::rows::RowCodec;
use crate::types::SqlType;

/// A table's rows at a restored checkpoint, how many records of its log it had read, and its
/// watermark then.
pub struct Restored {
    pub offset: u64,
    pub watermark: Option<i64>,
    pub rows: Vec<RecordBatch>,
}

pub struct TableWriter {
    pub def: TableDef,
    schema: SchemaRef,
    log: ChangeLog,
    feed: Feed,
    /// Why actors failed: a write refused because the table's actor stopped says why.
    failures: FailedActors,
    latest: LatestRows,
    /// The table's watermark so far (with `WATERMARK FOR`): the greatest time inserted, less
    /// the delay.
    watermark: Option<i64>,
}

/// The rows of a table after every acknowledged statement.
struct LatestRows {
    row_codec: RowCodec,
    key: Option<(Vec<usize>, RowCodec)>,
    /// With a primary key: key bytes -> row bytes. Without: row bytes -> multiplicity, kept
    /// in `counts`.
    by_key: RowMap<Vec<u8>, Vec<u8>>,
    counts: RowMap<Vec<u8>, i64>,
}

impl TableWriter {
    /// Opens the table's change log and returns the writer with the records to send through
    /// the table's actor. Without `restored`, those are the whole log, which must start at
    /// record 0, and the latest rows are built from it. With it (a table restored from a
    /// checkpoint), they are the records from the checkpoint's offset on, and the latest rows
    /// are the restored rows with those records applied.
    pub fn open(
        def: TableDef,
        dir: &Path,
        feed: Feed,
        failures: FailedActors,
        restored: Option<Restored>,
    ) -> Result<(TableWriter, Vec<StreamChunk>)> {
        let schema = def.schema();
        let (log, mut history) = ChangeLog::open(dir, def.id)?;
        let key = if def.primary_key.is_empty() {
            None
        } else {
            let types = def
                .primary_key
                .iter()
                .map(|i| schema.field(*i).data_type().clone())
                .collect();
            Some((def.primary_key.clone(), RowCodec::new(types)?))
        };
        let mut writer = TableWriter {
            latest: LatestRows {
                row_codec: RowCodec::for_schema(&schema)?,
                key,
                by_key: RowMap::default(),
                counts: RowMap::default(),
            },
            def,
            schema,
            log,
            feed,
            failures,
            watermark: None,
        };
        let (base, next) = (writer.log.base(), writer.log.next_record());
        let name = writer.def.name.clone();
        let corrupt = |what: String| {
            Error::new(
                ErrorKind::DataCorruption,
                format!("table \"{name}\": {what}"),
            )
        };
        match restored {
            None if base > 0 => {
                return Err(corrupt(format!(
                    "its change log starts at record {base}: the records before it are only \
                     in a checkpoint, and none was restored"
                )))
            }
            None => {}
            Some(r) if r.offset < base || r.offset > next => {
                return Err(corrupt(format!(
                    "the checkpoint restored has read {} records of its change log, which \
                     holds records {base} to {next}",
                    r.offset
                )))
            }
            Some(r) => {
                writer.watermark = r.watermark;
                for batch in r.rows {
                    let chunk = StreamChunk::new(vec![Op::Insert; batch.num_rows()], batch);
                    writer.latest.apply(&chunk)?;
                    writer.advance_watermark(&chunk);
                }
                history.drain(..(r.offset - base) as usize);
            }
        }
        for chunk in &history {
            writer.latest.apply(chunk)?;
        }
        Ok((writer, history))
    }

    /// The log's records from record `from` on, as the file holds them, with the numbers of
    /// the first and of the next record (log shipping).
    pub fn log_from(&mut self, from: u64) -> Result<(u64, u64, Vec<u8>)> {
        crate::blocking(|| self.log.raw_from(from))
    }

    /// Drops the log's records below `offset`: the oldest retained checkpoint holds them.
    pub fn truncate_log_below(&mut self, offset: u64) -> Result<()> {
        crate::blocking(|| self.log.truncate_below(offset))
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The table's rows after every acknowledged statement.
    pub fn latest_batch(&self) -> Result<RecordBatch> {
        self.latest.to_batch(&self.schema)
    }

    /// Checks, logs and applies one statement's changes: `deleted` rows (taken from the latest
    /// rows) and `inserted` rows. Returns how many rows the statement affected.
    pub async fn write(
        &mut self,
        deleted: Option<RecordBatch>,
        inserted: Option<RecordBatch>,
    ) -> Result<usize> {
        let mut parts = Vec::new();
        let mut ops = Vec::new();
        if let Some(d) = deleted.filter(|b| b.num_rows() > 0) {
            ops.extend(std::iter::repeat_n(Op::Delete, d.num_rows()));
            parts.push(d);
        }
        if let Some(i) = inserted.filter(|b| b.num_rows() > 0) {
            self.check_columns(&i)?;
            ops.extend(std::iter::repeat_n(Op::Insert, i.num_rows()));
            parts.push(i);
        }
        if ops.is_empty() {
            return Ok(0);
        }
        let data = concat_batches(&self.schema, &parts)?;
        let chunk = StreamChunk::new(ops, data);
        self.latest.check_keys(&chunk, &self.def)?;
        // Refused before anything is logged: a failure reported means nothing happened.
        if self.feed.is_closed() {
            return Err(self.stopped());
        }
        self.log.append(&chunk)?;
        // Durable but not yet sent nor acknowledged: a crash here leaves a statement in doubt.
        crate::failpoint::hit("table.after_append");
        self.latest.apply(&chunk)?;
        let affected = chunk
            .ops
            .iter()
            .filter(|o| **o == Op::Insert)
            .count()
            .max(chunk.ops.iter().filter(|o| **o == Op::Delete).count());
        let watermark = self.advance_watermark(&chunk);
        // Logged, the statement is durable and acknowledged even if its actor has just
        // stopped: a restart replays it. Reporting a failure would make a retry write it twice.
        if self.feed.send_statement(chunk, watermark).await.is_err() {
            tracing::error!(
                table = %self.def.name,
                "a logged statement could not reach the table's actor, which has stopped; \
                 views see it after a restart"
            );
        }
        Ok(affected)
    }

    /// Why a write is refused once the table's actor has stopped: a full disk or descriptor
    /// table (or a device error) keeps its kind, anything else makes the table unavailable.
    fn stopped(&self) -> Error {
        let why = self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.def.id)
            .cloned();
        let kind = match why.as_ref().map(|e| e.kind) {
            Some(
                k @ (ErrorKind::DiskFull | ErrorKind::InsufficientResources | ErrorKind::IoError),
            ) => k,
            _ => ErrorKind::Unavailable,
        };
        let message = match &why {
            Some(e) => format!(
                "table \"{}\" cannot take writes: its actor has stopped: {e}",
                self.def.name
            ),
            None => format!(
                "table \"{}\" cannot take writes: its actor has stopped",
                self.def.name
            ),
        };
        Error::new(kind, message).with_hint(
            "Restart the server once the cause is fixed: the table starts again from its \
             change log, with every acknowledged write.",
        )
    }

    /// The table's watermark so far, if it has one.
    pub fn watermark(&self) -> Option<Watermark> {
        Some(Watermark {
            column: self.def.watermark?.column,
            value: self.watermark?,
        })
    }

    /// Moves the watermark past the rows `chunk` inserts; returns it if it advanced.
    pub fn advance_watermark(&mut self, chunk: &StreamChunk) -> Option<Watermark> {
        advance_watermark(self.def.watermark?, &mut self.watermark, chunk)
    }

    /// NOT NULL and varchar(n) limits.
    fn check_columns(&self, rows: &RecordBatch) -> Result<()> {
        for (i, col) in self.def.columns.iter().enumerate() {
            let array = rows.column(i);
            if col.not_null && array.null_count() > 0 {
                return Err(Error::new(
                    ErrorKind::NotNullViolation,
                    format!(
                        "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                        col.name, self.def.name
                    ),
                ));
            }
            if let SqlType::Varchar {
                max_chars: Some(max),
            } = col.ty
            {
                if let Some(s) = array.as_any().downcast_ref::<StringArray>() {
                    if s.iter().flatten().any(|v| v.chars().count() > max as usize) {
                        return Err(Error::new(
                            ErrorKind::StringTooLong,
                            format!("value too long for type character varying({max})"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Moves `current` (a relation's watermark under `def`) past the rows `chunk` inserts; returns
/// the watermark if it advanced.
pub fn advance_watermark(
    def: WatermarkDef,
    current: &mut Option<i64>,
    chunk: &StreamChunk,
) -> Option<Watermark> {
    let times = chunk
        .data
        .column(def.column)
        .as_primitive_opt::<TimestampMicrosecondType>()?;
    let newest = if times.null_count() == 0 && chunk.ops.iter().all(|o| *o == Op::Insert) {
        times.values().iter().copied().max()?
    } else {
        chunk
            .ops
            .iter()
            .enumerate()
            .filter(|(i, op)| **op == Op::Insert && times.is_valid(*i))
            .map(|(i, _)| times.value(i))
            .max()?
    };
    let candidate = newest.saturating_sub(def.delay_us);
    if current.is_some_and(|w| w >= candidate) {
        return None;
    }
    *current = Some(candidate);
    Some(Watermark {
        column: def.column,
        value: candidate,
    })
}

impl LatestRows {
    fn keys_of(&self, columns: &[ArrayRef]) -> Result<Option<Vec<Vec<u8>>>> {
        match &self.key {
            Some((cols, codec)) => {
                let key_columns: Vec<ArrayRef> = cols.iter().map(|i| columns[*i].clone()).collect();
                Ok(Some(codec.encode(&key_columns)?))
            }
            None => Ok(None),
        }
    }

    /// Refuses a change that would give two rows the same primary key.
    fn check_keys(&self, chunk: &StreamChunk, def: &TableDef) -> Result<()> {
        let Some(keys) = self.keys_of(chunk.data.columns())? else {
            return Ok(());
        };
        let mut removed: HashMap<&[u8], ()> = HashMap::new();
        let mut added: HashMap<&[u8], usize> = HashMap::new();
        for (row, (key, op)) in keys.iter().zip(&chunk.ops).enumerate() {
            match op {
                Op::Delete => {
                    removed.insert(key, ());
                }
                Op::Insert => {
                    let taken = (self.by_key.contains_key(key)
                        && !removed.contains_key(key.as_slice()))
                        || added.contains_key(key.as_slice());
                    if taken {
                        return Err(duplicate_key(def, chunk, row));
                    }
                    added.insert(key, row);
                }
            }
        }
        Ok(())
    }

    fn apply(&mut self, chunk: &StreamChunk) -> Result<()> {
        let rows = self.row_codec.encode(chunk.data.columns())?;
        match self.keys_of(chunk.data.columns())? {
            Some(keys) => {
                for ((key, row), op) in keys.into_iter().zip(rows).zip(&chunk.ops) {
                    match op {
                        Op::Delete => {
                            self.by_key.remove(&key);
                        }
                        Op::Insert => {
                            self.by_key.insert(key, row);
                        }
                    }
                }
            }
            None => {
                for (row, op) in rows.into_iter().zip(&chunk.ops) {
                    match op {
                        Op::Insert => *self.counts.entry(row).or_insert(0) += 1,
                        Op::Delete => {
                            // Deletions are taken from the latest rows, so a row deleted is held.
                            let count = self
                                .counts
                                .get_mut(&row)
                                .expect("deleted a row the table does not hold");
                            *count -= 1;
                            if *count == 0 {
                                self.counts.remove(&row);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn to_batch(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let rows: Vec<&[u8]> = if self.key.is_some() {
            self.by_key.values().map(Vec::as_slice).collect()
        } else {
            self.counts
                .iter()
                .flat_map(|(r, c)| std::iter::repeat_n(r.as_slice(), *c as usize))
                .collect()
        };
        if rows.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let columns = self.row_codec.decode(rows)?;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

fn duplicate_key(def: &TableDef, chunk: &StreamChunk, row: usize) -> Error {
    let names: Vec<&str> = def
        .primary_key
        .iter()
        .map(|i| def.columns[*i].name.as_str())
        .collect();
    let values: Vec<String> = def
        .primary_key
        .iter()
        .map(|i| {
            datafusion::arrow::util::display::array_value_to_string(chunk.data.column(*i), row)
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    Error::new(
        ErrorKind::UniqueViolation,
        format!(
            "duplicate key value violates unique constraint \"{}_pkey\"",
            def.name
        ),
    )
    .with_detail(format!(
        "Key ({})=({}) already exists.",
        names.join(", "),
        values.join(", ")
    ))
}
