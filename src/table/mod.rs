//! The write path of a table: constraint checks against the table's latest rows, the durable
//! change log, and the feed into the table's actor.
//!
//! A statement's changes are checked as a whole (nothing is applied if one row violates a
//! constraint), appended and fsync'd to the change log, applied to the latest rows, and sent
//! to the table's actor, all under the table's lock; only then is the statement acknowledged.
//!
//! The latest rows (after every acknowledged statement, which UPDATE, DELETE and primary-key
//! checks must see) are the table's rows at the last sealed epoch, read from RocksDB, with
//! the changes of the statements that epoch does not hold yet, which the writer keeps in
//! memory until it does (`Unsealed`). See `docs/architecture.md` ("Tables").

mod block;
mod large;
mod pending;
mod recent;

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

// A fast seeded hasher for the rows (SipHash was a fifth of a restart's time).
use datafusion::common::HashMap as RowMap;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;

use crate::catalog::TableDef;
use crate::changelog::ChangeLog;
use crate::error::{Error, ErrorKind, Result};
use crate::state::Snapshot;
use crate::stream::relation::{read_snapshot_part, Changes, RowChanges};
use crate::stream::{BarrierClient, Feed, Op, RowCodec, StreamChunk, Watermark};
use crate::types::SqlType;

use self::block::affected;
pub use self::block::{commit, Block, Transactions};
use self::pending::Pending;
pub use crate::changelog::{CatalogPart, Gather, PartSize, Records, Rows, TempDisk};

/// Where a table restored from a checkpoint stands: how many records of its log its restored
/// state holds, and its watermark then.
pub struct Restored {
    pub offset: u64,
    pub watermark: Option<i64>,
}

pub struct TableWriter {
    pub def: TableDef,
    schema: SchemaRef,
    log: ChangeLog,
    feed: Feed,
    /// For snapshots, barriers when the unsealed changes grow past `unsealed_max`, and why
    /// actors failed (a write refused because the table's actor stopped says why).
    barriers: BarrierClient,
    unsealed: Unsealed,
    /// How many bytes of unsealed changes a write may find before it waits for a barrier to
    /// seal them: what bounds the memory a table takes, with the epoch its actor holds.
    unsealed_max: usize,
    /// The table's watermark so far (with `WATERMARK FOR`): the greatest time inserted, less
    /// the delay.
    watermark: Option<i64>,
    transactions: Arc<Transactions>,
    /// What recent commits changed, for the COMMIT of a block to check.
    recent: recent::Recent,
    /// A transaction block's commit reached only some of its tables' logs, or a large
    /// statement was logged but not applied whole: the table takes no more writes until a
    /// restart applies the rest.
    in_doubt: bool,
}

/// A table's latest rows, to read: its rows at a sealed snapshot with the changes of the
/// statements the snapshot does not hold.
pub struct Latest {
    pub snapshot: Arc<Snapshot>,
    /// The order in which the table's rows store their columns.
    pub order: Vec<usize>,
    pub changes: Arc<Changes>,
}

/// The changes of the table's logged statements that the last sealed epoch does not hold:
/// bounded by what the table takes between two sealed barriers, not by its size.
struct Unsealed {
    /// Rows as the table's state stores them.
    rows: RowCodec,
    /// With a primary key: its columns, and their codec (whose keys prefix the stored rows
    /// when the key leads).
    key: Option<(Vec<usize>, RowCodec)>,
    /// Each statement not yet sealed: its record number and its changes.
    records: VecDeque<(u64, Vec<Change>)>,
    /// The size of the records' rows and keys.
    bytes: usize,
    /// The records' changes summed by row (never 0), shared with reads in progress.
    changes: Arc<RowChanges>,
    /// With a primary key, the records' changes summed by key (never 0): +1 where the key
    /// was added, -1 where it was removed.
    keys: RowMap<Arc<[u8]>, i64>,
}

/// A row a statement inserted (weight 1) or deleted (-1), its bytes shared with the sums.
struct Change {
    row: Arc<[u8]>,
    key: Option<Arc<[u8]>>,
    weight: i64,
}

impl Change {
    fn bytes(&self) -> usize {
        self.row.len() + self.key.as_ref().map_or(0, |k| k.len())
    }
}

impl TableWriter {
    /// Deletes every file of table `id` in `dir`: its change log.
    pub fn remove(dir: &Path, id: u32) -> Result<()> {
        ChangeLog::remove(dir, id)
    }

    /// Appends to the tables' logs in `dir` the records of committed transaction blocks a
    /// crash cut short (`changelog::redo`), for the tables `live` names; before any opens.
    pub fn redo_commits(dir: &Path, live: impl Fn(u32) -> bool) -> Result<()> {
        crate::blocking(|| crate::changelog::redo(dir, live))
    }

    /// The catalog changes of committed blocks whose commit files remain (each block's number
    /// with the objects it dropped), for the catalog to apply before `redo_commits`.
    pub fn committed_blocks(dir: &Path) -> Result<std::collections::BTreeMap<u64, Vec<u32>>> {
        crate::blocking(|| crate::changelog::committed_blocks(dir))
    }

    /// The tables in `dir` whose logs were truncated, with the record each now starts at.
    pub fn truncated(dir: &Path) -> Result<Vec<(u32, u64)>> {
        ChangeLog::truncated(dir)
    }

    /// Opens the table's change log and returns the writer with the records to send through
    /// the table's actor (`replayed` takes each in). Without `restored`, those are the whole
    /// log, which must start at record 0, and the table's state must be empty. With it (a
    /// table restored from a checkpoint), they are the records from the checkpoint's offset
    /// on, the restored state holding those before. The writer keeps the records replayed as
    /// unsealed changes until an epoch that holds them is sealed; a write that finds more
    /// than `unsealed_max` bytes of them waits for a barrier first.
    pub fn open(
        def: TableDef,
        dir: &Path,
        (feed, barriers, transactions): (Feed, BarrierClient, Arc<Transactions>),
        restored: Option<Restored>,
        unsealed_max: usize,
    ) -> Result<(TableWriter, Records)> {
        let schema = def.schema();
        let log = ChangeLog::open(dir, def.id)?;
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
            unsealed: Unsealed {
                rows: RowCodec::ordered(&schema, &def.storage_order())?,
                key,
                records: VecDeque::new(),
                bytes: 0,
                changes: Arc::default(),
                keys: RowMap::default(),
            },
            def,
            schema,
            log,
            feed,
            barriers,
            unsealed_max,
            watermark: None,
            transactions,
            recent: recent::Recent::default(),
            in_doubt: false,
        };
        let (base, next) = (writer.log.base(), writer.log.next_record());
        let name = writer.def.name.clone();
        let corrupt = |what: String| {
            Error::new(
                ErrorKind::DataCorruption,
                format!("table \"{name}\": {what}"),
            )
        };
        let first = match restored {
            None if base > 0 => {
                return Err(corrupt(format!(
                    "its change log starts at record {base}: the records before it are only \
                     in a checkpoint, and none was restored"
                )))
            }
            None => 0,
            Some(r) if r.offset < base || r.offset > next => {
                return Err(corrupt(format!(
                    "the checkpoint restored has read {} records of its change log, which \
                     holds records {base} to {next}",
                    r.offset
                )))
            }
            Some(r) => {
                writer.watermark = r.watermark;
                r.offset
            }
        };
        let records = writer.log.records_from(first)?;
        Ok((writer, records))
    }

    /// Takes in record `record` of the log, replayed at start; returns the watermark it
    /// advanced, to send with it.
    pub fn replayed(&mut self, record: u64, chunk: &StreamChunk) -> Result<Option<Watermark>> {
        self.unsealed.add(record, chunk)?;
        Ok(self.advance_watermark(chunk))
    }

    /// Forgets the changes the last sealed epoch holds, first waiting for a barrier when they
    /// have grown past their bound; returns the last sealed snapshot.
    pub async fn bound_unsealed(&mut self) -> Result<Arc<Snapshot>> {
        let mut snapshot = self.seal()?;
        if self.unsealed.bytes > self.unsealed_max {
            // The table's actor holds its epoch's changes in memory too: a barrier bounds both.
            self.barriers.flush().await?;
            snapshot = self.seal()?;
        }
        Ok(snapshot)
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

    /// The table's rows after every acknowledged statement, to read; in a transaction
    /// block, with the block's changes to it.
    pub fn latest(&mut self, block: Option<&Block>) -> Result<Latest> {
        // A stopped actor seals nothing more of the table: its state would not hold what the
        // writer takes as sealed.
        if self.feed.is_closed() {
            return Err(self.stopped());
        }
        let snapshot = self.seal()?;
        let changes = match block.and_then(|b| b.pending(self.def.id)) {
            Some(pending) => pending.over(&self.unsealed.changes),
            None => Changes::new(self.unsealed.changes.clone(), None),
        };
        Ok(Latest {
            snapshot,
            order: self.def.storage_order(),
            changes: Arc::new(changes),
        })
    }

    /// Forgets the changes that the last sealed epoch holds; returns its snapshot.
    fn seal(&mut self) -> Result<Arc<Snapshot>> {
        let snapshot = self.barriers.sealed_snapshot();
        let offset = self
            .feed
            .offset_at(snapshot.epoch)
            .ok_or_else(|| Error::internal("a table's feed does not keep its offsets"))?;
        self.unsealed.forget_below(offset);
        Ok(snapshot)
    }

    /// Checks, logs and applies one statement's changes: `deleted` rows (taken from the latest
    /// rows) and `inserted` rows. Returns how many rows the statement affected. Rows that were
    /// spooled go part by part (`write_large`, whose key checks use a scratch store in
    /// `temp`).
    pub async fn write(
        &mut self,
        deleted: Option<Rows>,
        inserted: Option<Rows>,
        temp: &Arc<TempDisk>,
    ) -> Result<usize> {
        if large::spooled(&deleted) || large::spooled(&inserted) {
            return self.write_large(deleted, inserted, temp).await;
        }
        let deleted = deleted.and_then(Rows::into_memory);
        let inserted = inserted.and_then(Rows::into_memory);
        let Some(chunk) = self.chunk_of(deleted, inserted)? else {
            return Ok(0);
        };
        let snapshot = self.ready().await?;
        self.check_keys(&chunk, &snapshot, None)?;
        let record = self.log.next_record();
        self.log.append(&chunk)?;
        // Durable but not yet sent nor acknowledged: a crash here leaves a statement in doubt.
        crate::failpoint::hit("table.after_append");
        let affected = affected(&chunk);
        let in_flight = self.transactions.commit();
        let watermark = self.apply(record, in_flight.sequence, &chunk)?;
        // Logged, the statement is durable and acknowledged even if its actor has just
        // stopped: a restart replays it. Reporting a failure would make a retry write it twice.
        if self.feed.send_statement(chunk, watermark).await.is_err() {
            tracing::error!(
                table = %self.def.name,
                "a logged statement could not reach the table's actor, which has stopped; \
                 views see it after a restart"
            );
        }
        self.barriers.wrote();
        Ok(affected)
    }

    /// One statement's changes as a chunk (deletes first), its inserted rows checked against
    /// the columns' constraints; `None` when it changes nothing.
    fn chunk_of(
        &self,
        deleted: Option<RecordBatch>,
        inserted: Option<RecordBatch>,
    ) -> Result<Option<StreamChunk>> {
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
            return Ok(None);
        }
        // A statement that only inserts (or deletes) is taken as it is, not copied.
        let data = match <[RecordBatch; 1]>::try_from(parts) {
            Ok([one]) if one.schema() == self.schema => one,
            Ok([one]) => RecordBatch::try_new(self.schema.clone(), one.columns().to_vec())?,
            Err(parts) => concat_batches(&self.schema, &parts)?,
        };
        Ok(Some(StreamChunk::new(ops, data)))
    }

    /// Makes the writer ready to take changes: refused (before anything is logged, as a
    /// failure reported means nothing happened) when the table's actor has stopped, and
    /// first through a barrier when the unsealed changes have grown too large. Returns the
    /// last sealed snapshot.
    async fn ready(&mut self) -> Result<Arc<Snapshot>> {
        if self.feed.is_closed() {
            return Err(self.stopped());
        }
        if self.in_doubt {
            return Err(Error::new(
                ErrorKind::TransactionResolutionUnknown,
                format!(
                    "table \"{}\" cannot take writes: changes committed to it are not all \
                     applied yet",
                    self.def.name
                ),
            )
            .with_hint("Restart the server: it applies them at start."));
        }
        self.bound_unsealed().await
    }

    /// Takes in a logged statement (record `record`, commit `sequence`) as unsealed changes
    /// and in the conflicts open blocks check; returns the watermark it advanced, to send with
    /// it.
    fn apply(
        &mut self,
        record: u64,
        sequence: u64,
        chunk: &StreamChunk,
    ) -> Result<Option<Watermark>> {
        self.unsealed.add(record, chunk)?;
        let blocks = self.transactions.blocks();
        let unsealed = &self.unsealed;
        self.recent
            .take(sequence, chunk, &blocks, &|c| unsealed.changed_keys(c))?;
        Ok(self.advance_watermark(chunk))
    }

    /// Why a write is refused once the table's actor has stopped: a full disk or descriptor
    /// table (or a device error) keeps its kind, anything else makes the table unavailable.
    fn stopped(&self) -> Error {
        let why = self
            .barriers
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.def.id)
            .cloned();
        let kind = match why.as_ref().map(|e| e.kind) {
            Some(k) if k.is_io() => k,
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
        let def = self.def.watermark?;
        Watermark::advance(def.column, def.delay_us, &mut self.watermark, chunk)
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

impl TableWriter {
    /// Refuses a change that would give two rows the same primary key: against the latest
    /// rows, and in a block with its earlier changes (`pending`).
    fn check_keys(
        &self,
        chunk: &StreamChunk,
        snapshot: &Snapshot,
        pending: Option<&Pending>,
    ) -> Result<()> {
        let Some(keys) = self.unsealed.keys_of(chunk.data.columns())? else {
            return Ok(());
        };
        // How the block moved each key (read once: it may be on disk).
        let mut in_block: HashMap<&[u8], i64> = HashMap::new();
        if let Some(pending) = pending {
            for key in &keys {
                if !in_block.contains_key(key.as_slice()) {
                    in_block.insert(key, pending.moved(key)?);
                }
            }
        }
        // How the unsealed changes and the block's moved a key: +1 added, -1 removed, 0
        // untouched (or both), when only the snapshot tells whether the table holds it.
        let moved = |key: &[u8]| {
            self.unsealed.keys.get(key).copied().unwrap_or(0)
                + in_block.get(key).copied().unwrap_or(0)
        };
        let unsettled: Vec<&[u8]> = keys
            .iter()
            .zip(&chunk.ops)
            .filter(|(k, op)| **op == Op::Insert && moved(k) == 0)
            .map(|(k, _)| k.as_slice())
            .collect();
        let held = crate::blocking(|| self.held_keys(snapshot, &unsettled))?;
        let holds = |key: &[u8]| match moved(key) {
            0 => held.contains(key),
            change => change > 0,
        };
        let mut removed: HashMap<&[u8], ()> = HashMap::new();
        let mut added: HashMap<&[u8], usize> = HashMap::new();
        for (row, (key, op)) in keys.iter().zip(&chunk.ops).enumerate() {
            match op {
                Op::Delete => {
                    removed.insert(key, ());
                }
                Op::Insert => {
                    let taken = (holds(key) && !removed.contains_key(key.as_slice()))
                        || added.contains_key(key.as_slice());
                    if taken {
                        return Err(duplicate_key(&self.def, chunk, row));
                    }
                    added.insert(key, row);
                }
            }
        }
        Ok(())
    }

    /// Which of the primary keys `keys` the table holds at `snapshot`: a seek for each where
    /// the key leads the stored rows, else (a table created before keys led) a scan of every
    /// row.
    fn held_keys<'k>(
        &self,
        snapshot: &Snapshot,
        keys: &[&'k [u8]],
    ) -> Result<std::collections::HashSet<&'k [u8]>> {
        let mut held = std::collections::HashSet::new();
        if keys.is_empty() {
            return Ok(held);
        }
        if self.def.key_leads() {
            for key in keys {
                if snapshot.holds_prefix(self.def.id, key)? {
                    held.insert(*key);
                }
            }
            return Ok(held);
        }
        let wanted: std::collections::HashSet<&'k [u8]> = keys.iter().copied().collect();
        let mut after = None;
        while let Some((batch, last)) = read_snapshot_part(
            snapshot,
            self.def.id,
            &self.schema,
            &self.unsealed.rows,
            (&[], after.as_deref()),
            SCAN_ROWS,
            None,
        )? {
            for key in self.unsealed.keys_of(batch.columns())?.unwrap_or_default() {
                if let Some(k) = wanted.get(key.as_slice()) {
                    held.insert(*k);
                }
            }
            after = Some(last);
        }
        Ok(held)
    }
}

/// Distinct rows per read when a primary-key check scans a table.
const SCAN_ROWS: usize = 8192;

impl Unsealed {
    fn keys_of(&self, columns: &[ArrayRef]) -> Result<Option<Vec<Vec<u8>>>> {
        match &self.key {
            Some((cols, codec)) => {
                let key_columns: Vec<ArrayRef> = cols.iter().map(|i| columns[*i].clone()).collect();
                Ok(Some(codec.encode(&key_columns)?))
            }
            None => Ok(None),
        }
    }

    /// The rows `chunk` changes, for conflicts: its keys, or for a table without a primary key
    /// the rows it deletes.
    fn changed_keys(&self, chunk: &StreamChunk) -> Result<Vec<Vec<u8>>> {
        Ok(match self.keys_of(chunk.data.columns())? {
            Some(keys) => keys,
            None => (self.rows.encode(chunk.data.columns())?.into_iter())
                .zip(&chunk.ops)
                .filter(|(_, op)| **op == Op::Delete)
                .map(|(row, _)| row)
                .collect(),
        })
    }

    /// A statement's changes, row by row, encoded as the table stores them.
    fn encode(&self, chunk: &StreamChunk) -> Result<Vec<Change>> {
        let rows = self.rows.encode(chunk.data.columns())?;
        let mut keys = self.keys_of(chunk.data.columns())?.map(Vec::into_iter);
        Ok(rows
            .into_iter()
            .zip(&chunk.ops)
            .map(|(row, op)| Change {
                row: Arc::from(row),
                key: keys.as_mut().and_then(Iterator::next).map(Arc::from),
                weight: op.weight(),
            })
            .collect())
    }

    /// Keeps the changes of the statement logged as `record`.
    fn add(&mut self, record: u64, chunk: &StreamChunk) -> Result<()> {
        let changes = self.encode(chunk)?;
        let summed = Arc::make_mut(&mut self.changes);
        for c in &changes {
            add_to(summed, &c.row, c.weight);
            if let Some(k) = &c.key {
                add_to(&mut self.keys, k, c.weight);
            }
            self.bytes += c.bytes();
        }
        self.records.push_back((record, changes));
        Ok(())
    }

    /// Forgets the changes of the records before `offset`, which the sealed state holds.
    fn forget_below(&mut self, offset: u64) {
        if self.records.front().is_none_or(|(r, _)| *r >= offset) {
            return;
        }
        let summed = Arc::make_mut(&mut self.changes);
        while self.records.front().is_some_and(|(r, _)| *r < offset) {
            let Some((_, changes)) = self.records.pop_front() else {
                break;
            };
            for c in changes {
                self.bytes -= c.bytes();
                add_to(summed, &c.row, -c.weight);
                if let Some(k) = &c.key {
                    add_to(&mut self.keys, k, -c.weight);
                }
            }
        }
    }
}

/// Adds `by` to `key`'s entry, which goes when it comes to 0.
fn add_to(map: &mut RowMap<Arc<[u8]>, i64>, key: &Arc<[u8]>, by: i64) {
    match map.get_mut(&**key) {
        Some(c) => {
            *c += by;
            if *c == 0 {
                map.remove(&**key);
            }
        }
        None => {
            map.insert(key.clone(), by);
        }
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
