//! Transaction blocks on the write path: a block's changes kept aside until COMMIT, the
//! order of commits that first-committer-wins checks against, and the commit of a block into
//! every table it wrote, atomically and in one epoch. See `docs/design/0010-transactions.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};

use crate::catalog::ObjectId;
use crate::changelog::{Committed, Gather, PartSize, Rows, TempDisk};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Feed, Op, StreamChunk};

use super::pending::{Pending, MEMORY_BYTES};
use super::{large, TableWriter};

/// Shared by every table's writer and every session: the order of commits, and where each
/// open block began in it.
pub struct Transactions {
    /// Commits so far: each statement outside a block, and each block's COMMIT, takes the
    /// next number.
    sequence: AtomicU64,
    /// The open blocks and the commits in flight.
    registry: Mutex<Registry>,
    /// The tables' directory, where multi-table commits write their commit files.
    dir: PathBuf,
    /// The blocks begun so far: each block's number, which marks the objects it creates.
    blocks: AtomicU64,
    /// Where a block that ran DDL and ends without COMMIT or ROLLBACK (its session went away)
    /// sends its number, so that the database drops what it created.
    abandoned: Mutex<Option<tokio::sync::mpsc::UnboundedSender<u64>>>,
}

impl Transactions {
    pub fn new(dir: PathBuf) -> Arc<Transactions> {
        Arc::new(Transactions {
            sequence: AtomicU64::new(0),
            registry: Mutex::new(Registry::default()),
            dir,
            blocks: AtomicU64::new(0),
            abandoned: Mutex::new(None),
        })
    }

    /// Where abandoned blocks that ran DDL are reported from now on.
    pub fn report_abandoned(&self, to: tokio::sync::mpsc::UnboundedSender<u64>) {
        *self.abandoned.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Begins a block: it conflicts with what commits from now on, and with the commits in
    /// flight, which its reads may not see yet.
    pub fn begin(self: &Arc<Transactions>) -> Block {
        let mut registry = self.registry();
        // Read under the lock, so that a commit numbered after it sees the block open.
        let start = self.sequence.load(Ordering::SeqCst);
        let in_flight: Vec<u64> = registry.in_flight.iter().copied().collect();
        // What the tables must remember for it: every commit after the first it counts.
        let oldest = in_flight.first().map_or(start, |first| first - 1);
        *registry.open.entry(oldest).or_default() += 1;
        Block {
            start,
            in_flight,
            oldest,
            number: self.blocks.fetch_add(1, Ordering::Relaxed) + 1,
            ddl: false,
            tables: BTreeMap::new(),
            transactions: self.clone(),
        }
    }

    /// Numbers a commit, in flight until the returned guard is dropped: once the commit is
    /// applied and acknowledged, so that every read that begins after sees it.
    pub(super) fn commit(self: &Arc<Transactions>) -> InFlight {
        let mut registry = self.registry();
        let sequence = self.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        registry.in_flight.insert(sequence);
        InFlight {
            sequence,
            transactions: self.clone(),
        }
    }

    /// The oldest commit an open block may count as after its start, and the commits in
    /// flight: what a table must remember of a commit. Asked as a commit is applied, not when
    /// it is numbered, so that a block that began in between is counted.
    pub(super) fn blocks(&self) -> super::recent::Blocks {
        let registry = self.registry();
        super::recent::Blocks {
            oldest: registry.open.keys().next().copied(),
            in_flight: registry.in_flight.iter().copied().collect(),
        }
    }
}

/// The open blocks, and the commits numbered but not yet applied and acknowledged.
#[derive(Default)]
struct Registry {
    /// For each open block, the commit after which every commit may count as after its start
    /// (`Block::oldest`), with how many blocks have it.
    open: BTreeMap<u64, usize>,
    /// A block that begins while one of these is in flight counts it as after its start:
    /// its reads may not see it. A commit's number alone would not do, since it is taken
    /// before the commit is durable and applied.
    in_flight: BTreeSet<u64>,
}

/// A commit's number, while the commit is in flight.
pub(super) struct InFlight {
    pub(super) sequence: u64,
    transactions: Arc<Transactions>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.transactions
            .registry()
            .in_flight
            .remove(&self.sequence);
    }
}

/// An open transaction block's writes, per table, until COMMIT. Dropped (ROLLBACK, an error
/// at COMMIT, a disconnect), they are gone and the block no longer counts as open.
pub struct Block {
    /// The commits before the block began...
    start: u64,
    /// ... but for these, in flight when it began: its reads may not see them, so they count
    /// as after its start.
    in_flight: Vec<u64>,
    /// Its key in the open blocks: the commits after this one may count as after its start.
    oldest: u64,
    /// The block's number, which the catalog gives the objects it creates (`catalog::Scope`).
    pub number: u64,
    /// Whether the block ran DDL whose objects the catalog marks with its number: if it is
    /// dropped without its end being handled, the database is told to undo that DDL.
    pub ddl: bool,
    tables: BTreeMap<ObjectId, Pending>,
    transactions: Arc<Transactions>,
}

impl Block {
    /// Whether commit `sequence` counts as after the block began: its reads did not see it.
    fn counts_after(&self, sequence: u64) -> bool {
        sequence > self.start || self.in_flight.contains(&sequence)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.ddl {
            let abandoned = self
                .transactions
                .abandoned
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(to) = abandoned.as_ref() {
                let _ = to.send(self.number);
            }
        }
        let open = &mut self.transactions.registry().open;
        if let Some(n) = open.get_mut(&self.oldest) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.oldest);
            }
        }
    }
}

impl Block {
    /// The tables the block has written, in id order.
    pub fn tables(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.tables.keys().copied()
    }

    pub(super) fn pending(&self, table: ObjectId) -> Option<&Pending> {
        self.tables.get(&table)
    }

    /// Forgets the block's writes to `table` (which the block dropped).
    pub fn forget_table(&mut self, table: ObjectId) {
        self.tables.remove(&table);
    }

    /// Forgets every write of the block (which failed: they will never commit).
    pub fn forget_writes(&mut self) {
        self.tables.clear();
    }
}

impl TableWriter {
    /// Checks one statement's changes in a block (against the latest rows with the block's
    /// earlier changes) and keeps them in the block, on disk past memory (in `temp`). Returns
    /// how many rows it affected.
    pub async fn stage(
        &mut self,
        block: &mut Block,
        deleted: Option<Rows>,
        inserted: Option<Rows>,
        temp: &Arc<TempDisk>,
    ) -> Result<usize> {
        let id = self.def.id;
        if block.tables.iter().any(|(t, p)| *t != id && p.on_disk()) {
            return Err(past_memory());
        }
        let snapshot = self.ready().await?;
        if block.tables.contains_key(&id) {
            // The keys other blocks committed since, to tell whether this statement changes
            // again a row another changed after the block did (`stage_chunk`).
            let blocks = self.transactions.blocks();
            let unsealed = &self.unsealed;
            self.recent.settle(&blocks, &|c| unsealed.changed_keys(c))?;
        }
        let affected = if large::spooled(&deleted) || large::spooled(&inserted) {
            // A part at a time: the block's earlier parts are among its changes when the next
            // is checked, as a statement's earlier rows are.
            let (deleted, inserted) = (deleted.as_ref(), inserted.as_ref());
            crate::blocking(|| -> Result<()> {
                for chunk in large::changes(deleted, inserted)? {
                    let chunk = chunk?;
                    if chunk.ops.first() == Some(&Op::Insert) {
                        self.check_columns(&chunk.data)?;
                    }
                    self.stage_chunk(block, &chunk, &snapshot, temp)?;
                }
                Ok(())
            })?;
            large::affected_rows(deleted, inserted)
        } else {
            let deleted = deleted.and_then(Rows::into_memory);
            let inserted = inserted.and_then(Rows::into_memory);
            let Some(chunk) = self.chunk_of(deleted, inserted)? else {
                return Ok(0);
            };
            self.stage_chunk(block, &chunk, &snapshot, temp)?;
            affected(&chunk)
        };
        let on_disk = block.tables.get(&id).is_some_and(Pending::on_disk);
        if on_disk && (block.tables.len() > 1 || block.ddl) {
            return Err(past_memory());
        }
        Ok(affected)
    }

    /// Checks a chunk of a statement in a block and adds it to the block's changes.
    fn stage_chunk(
        &self,
        block: &mut Block,
        chunk: &StreamChunk,
        snapshot: &crate::state::Snapshot,
        temp: &Arc<TempDisk>,
    ) -> Result<()> {
        if let Some(pending) = block.tables.get(&self.def.id) {
            self.check_changed_again(block, pending, chunk)?;
        }
        let pending = block.tables.entry(self.def.id).or_default();
        self.check_keys(chunk, snapshot, Some(pending))?;
        pending.add(self.unsealed.encode(chunk)?, temp)
    }

    /// The block's changes to this table as one statement: deleted rows, then inserted ones.
    fn net_chunk(&self, pending: &Pending) -> Result<Option<StreamChunk>> {
        let mut rows: Vec<(&Arc<[u8]>, i64)> =
            pending.in_memory()?.iter().map(|(r, w)| (r, *w)).collect();
        if rows.is_empty() {
            return Ok(None);
        }
        // Deletes first, each side in row order.
        rows.sort_unstable_by(|a, b| (a.1 > 0, a.0).cmp(&(b.1 > 0, b.0)));
        let mut keys: Vec<&[u8]> = Vec::new();
        let mut ops = Vec::new();
        for (row, weight) in rows {
            let op = if weight > 0 { Op::Insert } else { Op::Delete };
            for _ in 0..weight.unsigned_abs() {
                keys.push(row);
                ops.push(op);
            }
        }
        let columns = self.unsealed.rows.decode(keys)?;
        let data = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(ops.len())),
        )?;
        Ok(Some(StreamChunk::new(ops, data)))
    }

    /// Refuses the block (40001) when a row it changes was committed by another after it
    /// began: by primary key, or for a table without one by the rows it deletes.
    fn check_conflicts(&mut self, block: &Block, pending: &Pending) -> Result<()> {
        let blocks = self.transactions.blocks();
        let unsealed = &self.unsealed;
        self.recent.settle(&blocks, &|c| unsealed.changed_keys(c))?;
        if self.recent.horizon > block.oldest {
            return Err(self.conflict());
        }
        if pending.touched_since(&self.recent.keys, &|s| block.counts_after(s))? {
            return Err(self.conflict());
        }
        Ok(())
    }

    /// Refuses a statement (40001) that changes a row the block changed before, when another
    /// committed that row since the block began: the block's reads then see both versions
    /// (its own and the other's), and its COMMIT would be refused anyway. PostgreSQL refuses
    /// such a statement too under REPEATABLE READ; under READ COMMITTED it waits for the
    /// other's lock, which Weir does not hold. Only this statement's rows are looked up, so a
    /// long block pays per statement for what the statement changes.
    fn check_changed_again(
        &self,
        block: &Block,
        pending: &Pending,
        chunk: &StreamChunk,
    ) -> Result<()> {
        if self.recent.horizon > block.oldest {
            return Err(self.conflict());
        }
        for key in self.unsealed.changed_keys(chunk)? {
            let since = self
                .recent
                .keys
                .get(key.as_slice())
                .is_some_and(|s| block.counts_after(*s));
            if since && pending.touches(&key)? {
                return Err(self.conflict());
            }
        }
        Ok(())
    }

    fn conflict(&self) -> Error {
        Error::new(
            ErrorKind::SerializationFailure,
            "could not serialize access due to concurrent update",
        )
        .with_detail(format!(
            "A row of table \"{}\" this transaction changed was changed and committed by \
             another since it began.",
            self.def.name
        ))
        .with_hint("Retry the transaction.")
    }
}

/// How many rows a statement affected: its inserts, or its deletes when it has more (an
/// UPDATE deletes and inserts each row it changes).
pub(super) fn affected(chunk: &StreamChunk) -> usize {
    let inserts = chunk.ops.iter().filter(|o| **o == Op::Insert).count();
    inserts.max(chunk.len() - inserts)
}

/// Commits `block` through the writers of every table it wrote (locked by the caller, in id
/// order): checks its conflicts and keys against the latest rows, makes it durable (one
/// change-log record for a block that wrote one table; a commit file first for several), and
/// sends it to the tables' actors in one epoch. An error before the commit point applies
/// nothing.
///
/// A block that ran DDL gives its catalog changes (`catalog`) and the function that saves
/// them (`settle`): with writes, they go into the commit file, whose rename commits both, and
/// `settle` runs once the records are in their logs; without, `settle`'s save of the catalog
/// is the commit point.
pub async fn commit(
    mut block: Block,
    writers: &mut [&mut TableWriter],
    catalog: Option<crate::changelog::CatalogPart<'_>>,
    settle: impl FnOnce() -> Result<()>,
    temp: &Arc<TempDisk>,
) -> Result<()> {
    if block.tables.values().any(Pending::on_disk) {
        return match (writers, catalog) {
            ([writer], None) => commit_large(block, writer, temp).await,
            _ => Err(past_memory()),
        };
    }
    let mut parts: Vec<(usize, StreamChunk)> = Vec::new();
    for (i, writer) in writers.iter_mut().enumerate() {
        let Some(pending) = block.tables.remove(&writer.def.id) else {
            return Err(Error::internal("a block's commit without a table it wrote"));
        };
        let snapshot = writer.ready().await?;
        writer.check_conflicts(&block, &pending)?;
        let Some(chunk) = writer.net_chunk(&pending)? else {
            continue; // changes that cancelled out
        };
        writer.check_keys(&chunk, &snapshot, None)?;
        parts.push((i, chunk));
    }
    if !block.tables.is_empty() {
        return Err(Error::internal(
            "a block's commit without the writer of a table it wrote",
        ));
    }
    let in_flight = block.transactions.commit();
    let sequence = in_flight.sequence;
    match parts.as_slice() {
        [] => return settle(),
        [(i, chunk)] if catalog.is_none() => {
            writers[*i].log.append(chunk)?;
        }
        _ => {
            let records: Vec<(u32, u64, &StreamChunk)> = parts
                .iter()
                .map(|(i, c)| (writers[*i].def.id, writers[*i].log.next_record(), c))
                .collect();
            let dir = block.transactions.dir.clone();
            let written = crate::blocking(|| Committed::write(&dir, sequence, catalog, &records));
            let committed = match written {
                Ok(c) => c,
                Err(e) => {
                    if e.kind == ErrorKind::TransactionResolutionUnknown {
                        for (j, _) in &parts {
                            writers[*j].in_doubt = true;
                        }
                    }
                    return Err(e);
                }
            };
            crate::failpoint::hit("table.after_commit_point");
            for (i, chunk) in &parts {
                if let Err(e) = writers[*i].log.append(chunk) {
                    // Committed, but not in every log: a restart redoes it from the commit
                    // file. Until then these tables take no writes, so their logs and feeds
                    // cannot drift apart.
                    for (j, _) in &parts {
                        writers[*j].in_doubt = true;
                    }
                    return Err(Error::new(
                        ErrorKind::TransactionResolutionUnknown,
                        format!("a transaction block is committed but not yet in every table: {e}"),
                    )
                    .with_hint("Restart the server: it applies the block at start."));
                }
                // Some of the block's tables have it in their logs, the rest only in the
                // commit file.
                crate::failpoint::hit("table.commit_appended");
            }
            if catalog.is_some() {
                if let Err(e) = settle() {
                    // As above: the commit file stays, and a restart saves the catalog.
                    for (j, _) in &parts {
                        writers[*j].in_doubt = true;
                    }
                    return Err(Error::new(
                        ErrorKind::TransactionResolutionUnknown,
                        format!("a transaction block is committed but its DDL is not saved: {e}"),
                    )
                    .with_hint("Restart the server: it applies the block at start."));
                }
                // The catalog is saved, the commit file not yet removed.
                crate::failpoint::hit("table.block_settled");
            }
            committed.done();
        }
    }
    crate::failpoint::hit("table.after_append");
    let mut sends = Vec::with_capacity(parts.len());
    for (i, chunk) in parts {
        let writer = &mut *writers[i];
        let record = writer.log.next_record() - 1;
        let watermark = writer.apply(record, sequence, &chunk)?;
        sends.push((i, chunk, watermark));
    }
    let feeds: Vec<(&Feed, StreamChunk, _)> = sends
        .into_iter()
        .map(|(i, chunk, w)| (&writers[i].feed, chunk, w))
        .collect();
    if Feed::send_together(feeds).await.is_err() {
        tracing::error!(
            "a committed transaction block could not reach a table's actor, which has \
             stopped; views see it after a restart"
        );
    }
    if let Some(w) = writers.first() {
        w.barriers.wrote();
    }
    Ok(())
}

/// Commits a block that wrote one table, some of its changes on disk: its net changes are
/// spooled (deleted rows, then inserted ones) and written as a statement of that size is
/// (`TableWriter::write`), after the block's conflicts are checked.
async fn commit_large(
    mut block: Block,
    writer: &mut TableWriter,
    temp: &Arc<TempDisk>,
) -> Result<()> {
    let Some(pending) = block.tables.remove(&writer.def.id) else {
        return Err(Error::internal(
            "a block's commit without the table it wrote",
        ));
    };
    writer.check_conflicts(&block, &pending)?;
    let (deleted, inserted) = crate::blocking(|| writer.net_rows(&pending, temp))?;
    drop(pending);
    writer.write(deleted, inserted, temp).await?;
    Ok(())
}

impl TableWriter {
    /// A block's changes to this table as the rows a statement deletes and inserts, through
    /// spools.
    fn net_rows(
        &self,
        pending: &Pending,
        temp: &Arc<TempDisk>,
    ) -> Result<(Option<Rows>, Option<Rows>)> {
        let changes = pending.rows();
        let mut sides = Vec::with_capacity(2);
        for inserts in [false, true] {
            let mut gather = Gather::new(self.schema.clone(), temp, PartSize::WHOLE);
            let mut rows: Vec<Vec<u8>> = Vec::new();
            let flush = |rows: &mut Vec<Vec<u8>>, gather: &mut Gather| -> Result<()> {
                if rows.is_empty() {
                    return Ok(());
                }
                let columns = self.unsealed.rows.decode(rows.iter().map(Vec::as_slice))?;
                let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
                gather.push(RecordBatch::try_new_with_options(
                    self.schema.clone(),
                    columns,
                    &options,
                )?)?;
                rows.clear();
                Ok(())
            };
            changes.scan_from(&[], None, &mut |row, weight| {
                if (weight > 0) == inserts {
                    for _ in 0..weight.unsigned_abs() {
                        rows.push(row.to_vec());
                        if rows.len() == NET_ROWS {
                            flush(&mut rows, &mut gather)?;
                        }
                    }
                }
                Ok(true)
            })?;
            flush(&mut rows, &mut gather)?;
            sides.push(Some(gather.finish()?));
        }
        let inserted = sides.pop().flatten();
        let deleted = sides.pop().flatten();
        Ok((deleted, inserted))
    }
}

/// Rows decoded at once when a block's changes on disk are spooled at its commit.
const NET_ROWS: usize = 8192;

/// What a block that writes several tables or runs DDL gets when its changes to one of them
/// pass what it keeps in memory: its commit is one record per table, or a commit file.
fn past_memory() -> Error {
    Error::new(
        ErrorKind::ProgramLimitExceeded,
        format!(
            "a transaction block that writes more than one table, or runs DDL, keeps at most \
             {} of changes to each",
            crate::sql::memory_text(MEMORY_BYTES as u64)
        ),
    )
    .with_hint(
        "A block that writes one table is bounded by temp_disk_limit alone: commit the other \
         changes in a block of their own.",
    )
}
