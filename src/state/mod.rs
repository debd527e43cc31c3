//! Operator state: one RocksDB per server, an ordered key space per state table, written once
//! per epoch and read by queries at the last sealed epoch.
//!
//! Invariant: this is the only module that imports `rocksdb`.
//!
//! Epoch order: an actor hands its writes for epoch e to [`StateStore::commit`] at barrier e;
//! the call waits until epoch e-1 is sealed, so the batches of e+1 never land before every
//! batch of e. The coordinator seals e once every actor has committed it: it takes a RocksDB
//! snapshot first and only then lets e+1 batches in, so the snapshot holds exactly the effects
//! of the epochs up to e. The RocksDB WAL is off: durability comes from the table change logs
//! (and, later, from checkpoints), never from RocksDB's own log.

mod caches;
mod delta;
mod scratch;
mod table;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rocksdb::{
    Direction, IngestExternalFileOptions, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use tokio::sync::watch;

use caches::Caches;
pub use caches::{least_used_half, CacheShare, NotHeld, LET_GO_BYTES};
use delta::{Changes, Packed};
pub use delta::{Delta, Keep};
pub use scratch::{Scratch, Tally, TallyView};
pub use table::StateTable;

use crate::error::{Error, ErrorKind, Result};

/// Identifies one state table: the first four bytes of each of its keys.
pub type TableId = u32;

/// The changes of one actor for one epoch: full keys, `None` for a deletion.
#[derive(Debug, Default)]
pub struct EpochWrites {
    puts: Packed,
    /// Whole state tables to drop (a dropped view's state).
    dropped_tables: Vec<TableId>,
}

impl EpochWrites {
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.dropped_tables.is_empty()
    }

    pub fn drop_table(&mut self, table: TableId) {
        self.dropped_tables.push(table);
    }
}

/// The RocksDB handle, shared by the store and its snapshots. `closed` is set once RocksDB
/// has closed (its fields drop in order), so that a restart in the same process can wait
/// for the files to be released.
struct Db {
    inner: DB,
    closed: crate::DropFlag,
}

impl std::ops::Deref for Db {
    type Target = DB;
    fn deref(&self) -> &DB {
        &self.inner
    }
}

/// The server's RocksDB and the epoch bookkeeping around it.
pub struct StateStore {
    db: Arc<Db>,
    /// Set when a write failed: no further write is accepted, since the store may no longer
    /// reflect a whole epoch.
    poisoned: Mutex<Option<Error>>,
    /// The last sealed epoch, and its snapshot.
    sealed: watch::Sender<Arc<Snapshot>>,
    /// The snapshot readers use: the last sealed one, except while statements are applied
    /// across epochs (`hold`), when it stays the one sealed before the first of them began.
    visible: watch::Sender<Arc<Snapshot>>,
    /// The holds in place, and the mark the first of them was taken with.
    holds: Mutex<(usize, u64)>,
    /// Serialises sealing against the commit check, so that no batch of e+1 slips in between
    /// sealing e and taking its snapshot; and holds the writes since the last checkpoint.
    seal_lock: Mutex<Changes>,
    /// Most bytes of writes kept for a delta (`DELTA_BYTES_MAX`, less under a small memory
    /// limit).
    delta_bytes_max: AtomicUsize,
    /// RocksDB's cache of blocks read.
    block_cache: rocksdb::Cache,
    /// What operators' caches of their state hold together (`CacheShare`), and the most they
    /// should.
    caches: Arc<Caches>,
}

/// The encoding of what the state store holds below the operators' own layouts (which
/// `PLAN_FORMAT` versions of `stream/stored/`): table and virtual-node key prefixes, the row
/// encoding of relations' rows and keys, the errors table. The catalog records it
/// (`catalog::Catalog`), and a reader refuses a data directory or checkpoint of a newer one.
pub const FORMAT: u32 = 1;

/// The block cache's size, unless the memory limit is small (RocksDB's default).
const BLOCK_CACHE_BYTES: usize = 32 << 20;

/// The block cache of a checkpoint's state opened for reading (`Snapshot::open_restored`).
const RESTORED_BLOCK_CACHE_BYTES: usize = 8 << 20;

/// Most bytes of writes kept between two checkpoints for a delta: beyond, the next checkpoint
/// is a base one (a delta that large would cost what a base one costs).
const DELTA_BYTES_MAX: usize = 256 << 20;

/// What a checkpoint of the store holds.
#[derive(Debug)]
pub enum Image {
    /// A RocksDB checkpoint: every file of its directory, by name, with its size.
    Files(Vec<(String, u64)>),
    /// The writes since the previous checkpoint, to be written as SST files (some of them
    /// written ahead, `Keep::Ahead`).
    Delta(Delta),
}

impl StateStore {
    /// Opens the store in `dir`, starting from an empty key space: state is rebuilt from the
    /// table change logs on start (see `docs/architecture.md`, "Restart").
    pub fn open_fresh(dir: &Path) -> Result<Arc<StateStore>> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        StateStore::open(dir, 0, true, &[])
    }

    /// Opens a directory restored from a checkpoint of `epoch`
    /// (`docs/design/0004-recovery.md`), with the checkpoint's `deltas` (SST files written by
    /// [`Delta::write`], oldest first; moved into the directory) ingested on top, each over the
    /// ones before it: readers see that epoch, and the next one committed is `epoch + 1`. A
    /// directory that holds no RocksDB is refused.
    pub fn open_restored(dir: &Path, epoch: u64, deltas: &[PathBuf]) -> Result<Arc<StateStore>> {
        StateStore::open(dir, epoch, false, deltas)
    }

    fn open(dir: &Path, epoch: u64, create: bool, deltas: &[PathBuf]) -> Result<Arc<StateStore>> {
        let block_cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
        let db = open_db(dir, create, deltas, &block_cache)?;
        let snapshot = Arc::new(Snapshot::new(db.clone(), epoch));
        let (sealed, _) = watch::channel(snapshot.clone());
        let (visible, _) = watch::channel(snapshot);
        Ok(Arc::new(StateStore {
            db,
            poisoned: Mutex::new(None),
            sealed,
            visible,
            holds: Mutex::new((0, 0)),
            seal_lock: Mutex::new(Changes::new(Keep::Writes)),
            delta_bytes_max: AtomicUsize::new(DELTA_BYTES_MAX),
            block_cache,
            caches: Caches::new(),
        }))
    }

    /// Deletes state tables whole, at once (before any actor runs: the state of objects that
    /// were dropped after the checkpoint the store was restored from).
    pub fn delete_tables(&self, tables: &[TableId]) -> Result<()> {
        if tables.is_empty() {
            return Ok(());
        }
        self.changes().spoil();
        let mut batch = WriteBatch::default();
        for table in tables {
            let (start, end) = table_range(*table);
            batch.delete_range(start, end);
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db.write_opt(batch, &opts).map_err(storage_error)
    }

    /// Deletes keys of a state table at once (like `delete_tables`, for tables whose keys
    /// belong to different objects).
    pub fn delete_keys(&self, table: TableId, keys: &[Vec<u8>]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        self.changes().spoil();
        let mut batch = WriteBatch::default();
        for key in keys {
            batch.delete([table.to_be_bytes().as_slice(), key].concat());
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db.write_opt(batch, &opts).map_err(storage_error)
    }

    /// Applies one actor's writes for `epoch`, after waiting for `epoch - 1` to be sealed.
    pub async fn commit(&self, epoch: u64, writes: EpochWrites) -> Result<()> {
        let mut sealed = self.sealed.subscribe();
        sealed
            .wait_for(|s| s.epoch + 1 >= epoch)
            .await
            .map_err(|_| Error::unavailable("state store closed"))?;
        if writes.is_empty() {
            return Ok(());
        }
        let mut changes = self.changes();
        if let Some(first) = self.poison().as_ref() {
            // Its cause's kind: a full disk stops every actor as a full disk.
            return Err(Error::new(
                first.kind,
                format!("state store is poisoned after a failed write: {first}"),
            ));
        }
        let mut batch = WriteBatch::default();
        for table in &writes.dropped_tables {
            let (start, end) = table_range(*table);
            batch.delete_range(start, end);
        }
        for (key, value) in writes.puts.iter() {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        // A write can stall while RocksDB flushes or compacts.
        let written = match crate::failpoint::io("state.write") {
            Err(e) => Err(Error::io(&e, format!("storage error: {e}"))),
            Ok(()) => crate::blocking(|| self.db.write_opt(batch, &opts)).map_err(storage_error),
        };
        if let Err(e) = written {
            *self.poison() = Some(e.clone());
            return Err(e);
        }
        // A delta carries no range deletions: a dropped table's state makes the next
        // checkpoint a base one.
        if writes.dropped_tables.is_empty() {
            changes.record(writes.puts, self.delta_bytes_max.load(Ordering::Acquire));
        } else {
            changes.spoil();
        }
        Ok(())
    }

    /// What to keep of the writes between checkpoints for delta checkpoints (the writes, in
    /// memory, by default; nothing when every checkpoint is a base one, where they would
    /// only cost memory).
    pub fn keep_changes(&self, keep: Keep) {
        self.changes().keep(keep);
    }

    fn poison(&self) -> std::sync::MutexGuard<'_, Option<Error>> {
        self.poisoned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changes(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.seal_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `epoch` sealed: every actor has committed it. Readers see it from now on, unless
    /// a hold keeps them at an earlier one.
    pub fn seal(&self, epoch: u64) {
        let _guard = self.changes();
        let snapshot = Arc::new(Snapshot::new(self.db.clone(), epoch));
        let holds = self.holds();
        self.sealed.send_replace(snapshot.clone());
        if holds.0 == 0 {
            self.visible.send_replace(snapshot);
        }
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, (usize, u64)> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps readers at the epoch sealed now until the hold is dropped (and every other hold
    /// with it), while epochs go on being sealed: a statement applied over several epochs is
    /// seen whole or not at all. `mark` is remembered for `held_since`.
    pub fn hold(self: &Arc<Self>, mark: u64) -> Hold {
        let mut holds = self.holds();
        if holds.0 == 0 {
            holds.1 = mark;
        }
        holds.0 += 1;
        Hold {
            store: self.clone(),
        }
    }

    /// While a hold is in place, the mark the first one was taken with.
    pub fn held_since(&self) -> Option<u64> {
        let holds = self.holds();
        (holds.0 > 0).then_some(holds.1)
    }

    /// Takes a checkpoint of the committed state. Called between the last commit of an epoch
    /// and its seal, it holds exactly that epoch's state: the next epoch's batches wait for
    /// the seal. With `delta`, and when every write since the previous checkpoint was kept,
    /// that is those writes ([`Image::Delta`]); otherwise a RocksDB checkpoint into `dir`
    /// ([`Image::Files`]). Either way the next checkpoint's writes start here.
    pub fn checkpoint(&self, dir: &Path, delta: bool) -> Result<Image> {
        let changes = {
            let mut changes = self.changes();
            let fresh = changes.fresh();
            std::mem::replace(&mut *changes, fresh)
        };
        if delta && changes.whole {
            return Ok(Image::Delta(changes.into_delta()));
        }
        self.checkpoint_files(dir).map(Image::Files)
    }

    /// Writes a RocksDB checkpoint into `dir` (which must not exist): the memtable is flushed,
    /// and every live file hard-linked (copied across file systems). Returns each file's name
    /// and size.
    fn checkpoint_files(&self, dir: &Path) -> Result<Vec<(String, u64)>> {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(storage_error)?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_file() {
                files.push((entry.file_name().to_string_lossy().into_owned(), meta.len()));
            }
        }
        files.sort();
        Ok(files)
    }

    /// The state's size: RocksDB's SST files and its memtables (whose bytes, uncompressed
    /// and indexed, count more than the file they would flush into).
    pub fn size_bytes(&self) -> u64 {
        [
            "rocksdb.total-sst-files-size",
            "rocksdb.cur-size-all-mem-tables",
        ]
        .iter()
        .filter_map(|p| self.db.property_int_value(*p).ok().flatten())
        .sum()
    }

    /// What RocksDB holds in memory: its memtables (the writes not yet flushed to SST
    /// files), and its block cache's blocks.
    pub fn memory(&self) -> (u64, u64) {
        let memtables = self
            .db
            .property_int_value("rocksdb.cur-size-all-mem-tables");
        let memtables = memtables.ok().flatten().unwrap_or(0);
        (memtables, self.block_cache.get_usage() as u64)
    }

    /// Sizes RocksDB's memory to the server's memory limit: write buffers (memtables) of a
    /// sixteenth of it, between 4 and 64 MiB (RocksDB's default), at most two of them; a
    /// block cache of a sixteenth, at most `BLOCK_CACHE_BYTES`; and the writes kept for a
    /// delta checkpoint to an eighth of it, at most `DELTA_BYTES_MAX`; operators' caches of
    /// state to another eighth.
    pub fn limit_memory(&self, memory_limit: u64) -> Result<()> {
        self.caches.max.store(memory_limit / 8, Ordering::Relaxed);
        (self.caches.unflushed_max).store(memory_limit / 8, Ordering::Relaxed);
        let part = |divisor: u64, max: usize| {
            usize::try_from(memory_limit / divisor).map_or(max, |b| b.min(max))
        };
        self.delta_bytes_max
            .store(part(8, DELTA_BYTES_MAX), Ordering::Release);
        self.block_cache
            .clone()
            .set_capacity(part(16, BLOCK_CACHE_BYTES));
        let buffer = (memory_limit / 16).clamp(4 << 20, 64 << 20);
        self.db
            .set_options(&[
                ("write_buffer_size", buffer.to_string().as_str()),
                ("max_write_buffer_number", "2"),
            ])
            .map_err(storage_error)
    }

    /// Whether this store's RocksDB has closed (every snapshot of it gone too), to be asked
    /// after the store is dropped.
    pub fn closed(&self) -> crate::Dropped {
        self.db.closed.watch()
    }

    /// Compacts the whole key space into the bottom level (maintenance, and tests that need
    /// RocksDB to rewrite its files).
    pub fn compact(&self) {
        self.db.compact_range::<&[u8], &[u8]>(None, None);
    }

    /// The snapshot readers use: at the last sealed epoch, unless a hold keeps them at an
    /// earlier one.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.visible.borrow().clone()
    }

    /// The snapshot at the last sealed epoch, held or not: for what follows the epochs as they
    /// are sealed (a table's writer, a subscription, a sink).
    pub fn sealed_snapshot(&self) -> Arc<Snapshot> {
        self.sealed.borrow().clone()
    }

    /// Waits until readers see `epoch` (or a later one).
    pub async fn wait_visible(&self, epoch: u64) -> Result<()> {
        wait_for_epoch(&self.visible, epoch).await
    }

    /// Waits until `epoch` (or a later one) is sealed.
    pub async fn wait_sealed(&self, epoch: u64) -> Result<()> {
        wait_for_epoch(&self.sealed, epoch).await
    }

    pub fn sealed_epoch(&self) -> u64 {
        self.sealed.borrow().epoch
    }

    /// Reads the latest committed value of a key (an actor reading its own state).
    fn get_latest(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        // A read can wait on the disk (a block not cached).
        crate::failpoint::stall("state.read");
        self.db.get(key).map_err(storage_error)
    }

    /// Visits the latest committed entries under `prefix` in key order (or reverse), from
    /// `start` on when given (forward only), until the visitor returns false.
    fn scan_latest(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        crate::failpoint::stall("state.read");
        scan_db(&self.db, None, prefix, start, reverse, visit)
    }
}

/// Opens RocksDB in `dir` with `block_cache`, and ingests `deltas` (oldest first) on top.
fn open_db(
    dir: &Path,
    create: bool,
    deltas: &[PathBuf],
    block_cache: &rocksdb::Cache,
) -> Result<Arc<Db>> {
    let mut opts = db_options();
    let mut table = block_table_options();
    table.set_block_cache(block_cache);
    opts.set_block_based_table_factory(&table);
    opts.create_if_missing(create);
    let db = DB::open(&opts, dir).map_err(storage_error)?;
    // One file per call: each gets a newer sequence number than everything before it, so a
    // delta's writes win over the state they change. Moved (linked into the directory, then
    // unlinked from where it was): RocksDB records the sequence number in its MANIFEST and
    // leaves the file's bytes as they are.
    let mut ingest = IngestExternalFileOptions::default();
    ingest.set_move_files(true);
    for delta in deltas {
        db.ingest_external_file_opts(&ingest, vec![delta])
            .map_err(storage_error)?;
    }
    Ok(Arc::new(Db {
        inner: db,
        closed: crate::DropFlag::default(),
    }))
}

/// Waits until the snapshot `snapshots` holds is of `epoch` or a later one.
async fn wait_for_epoch(snapshots: &watch::Sender<Arc<Snapshot>>, epoch: u64) -> Result<()> {
    let mut rx = snapshots.subscribe();
    rx.wait_for(|s| s.epoch >= epoch)
        .await
        .map_err(|_| Error::unavailable("state store closed"))?;
    Ok(())
}

/// Readers kept at an earlier epoch (`StateStore::hold`) until this is dropped.
pub struct Hold {
    store: Arc<StateStore>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut holds = self.store.holds();
        holds.0 -= 1;
        if holds.0 == 0 {
            self.store
                .visible
                .send_replace(self.store.sealed.borrow().clone());
        }
    }
}

/// A consistent view of all state at one sealed epoch.
pub struct Snapshot {
    // Field order matters: the snapshot must be released before the database handle it
    // borrows from can go.
    inner: rocksdb::Snapshot<'static>,
    db: Arc<Db>,
    pub epoch: u64,
}

impl Snapshot {
    /// The state of a checkpoint of `epoch` restored in `dir` (which it then owns, as
    /// `StateStore::open_restored` does), with its `deltas` ingested, for reading only,
    /// apart from the running store and with a block cache of its own.
    pub fn open_restored(dir: &Path, epoch: u64, deltas: &[PathBuf]) -> Result<Arc<Snapshot>> {
        let block_cache = rocksdb::Cache::new_lru_cache(RESTORED_BLOCK_CACHE_BYTES);
        Ok(Arc::new(Snapshot::new(
            open_db(dir, false, deltas, &block_cache)?,
            epoch,
        )))
    }

    fn new(db: Arc<Db>, epoch: u64) -> Snapshot {
        let inner = db.snapshot();
        // SAFETY: the snapshot borrows the DB, which `db` keeps alive for as long as this struct
        // exists; fields drop in declaration order, so `inner` is released before `db`.
        let inner: rocksdb::Snapshot<'static> = unsafe { std::mem::transmute(inner) };
        Snapshot { inner, db, epoch }
    }

    /// Visits every entry of a state table at this epoch, in key order. Keys are given without
    /// the table prefix.
    pub fn scan_table(
        &self,
        table: TableId,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.scan_table_from(table, None, visit)
    }

    /// The value of a state table's key at this epoch.
    pub fn get(&self, table: TableId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(&self.inner);
        let key = [table.to_be_bytes().as_slice(), key].concat();
        self.db.get_opt(key, &opts).map_err(storage_error)
    }

    /// Whether a state table holds a key that starts with `prefix` at this epoch.
    pub fn holds_prefix(&self, table: TableId, prefix: &[u8]) -> Result<bool> {
        let mut holds = false;
        self.scan_prefix_from(table, prefix, None, &mut |_, _| {
            holds = true;
            false
        })?;
        Ok(holds)
    }

    /// Like `scan_table`, from the first key at or after `start` (without the table prefix).
    pub fn scan_table_from(
        &self,
        table: TableId,
        start: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.scan_prefix_from(table, &[], start, visit)
    }

    /// Visits the entries of a state table whose keys start with `prefix`, from the first at
    /// or after `start`, in key order. The iterator is bounded by the prefix, so that a seek
    /// never steps over the deleted entries past it (a seek per key after a large delete
    /// would step over every one).
    pub fn scan_prefix_from(
        &self,
        table: TableId,
        prefix: &[u8],
        start: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let table = table.to_be_bytes();
        let within = [table.as_slice(), prefix].concat();
        let start = start.map(|s| [table.as_slice(), s].concat());
        scan_db(
            &self.db,
            Some(&self.inner),
            &within,
            start.as_deref(),
            false,
            &mut |k, v| visit(&k[table.len()..], v),
        )
    }
}

fn scan_db(
    db: &DB,
    snapshot: Option<&rocksdb::Snapshot<'static>>,
    prefix: &[u8],
    start: Option<&[u8]>,
    reverse: bool,
    visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
) -> Result<()> {
    assert!(
        start.is_none() || !reverse,
        "a scan from a start key runs forward"
    );
    let mut opts = ReadOptions::default();
    if let Some(s) = snapshot {
        opts.set_snapshot(s);
    }
    let upper = prefix_successor(prefix);
    if let Some(upper) = &upper {
        opts.set_iterate_upper_bound(upper.clone());
    }
    let lower = match start {
        Some(s) if s > prefix => s,
        _ => prefix,
    };
    opts.set_iterate_lower_bound(lower.to_vec());
    let mode = if reverse {
        IteratorMode::End
    } else {
        IteratorMode::From(lower, Direction::Forward)
    };
    for item in db.iterator_opt(mode, opts) {
        let (k, v) = item.map_err(storage_error)?;
        if !visit(&k, &v) {
            break;
        }
    }
    Ok(())
}

/// The smallest key greater than every key that starts with `prefix`, if there is one.
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < 0xff {
            upper.push(last + 1);
            return Some(upper);
        }
    }
    None
}

fn table_range(table: TableId) -> (Vec<u8>, Vec<u8>) {
    let start = table.to_be_bytes().to_vec();
    let end = (table as u64 + 1).to_be_bytes()[4..].to_vec();
    if table == TableId::MAX {
        (start, vec![0xff; 5])
    } else {
        (start, end)
    }
}

/// RocksDB reports an I/O failure as text (`IO error: No space left on device: ...`): the
/// `errno`'s message tells a full disk and a full descriptor table from the rest.
fn storage_error(e: rocksdb::Error) -> Error {
    let message = format!("storage error: {e}");
    let errno = if message.contains("No space left on device") {
        Some(libc::ENOSPC)
    } else if message.contains("Too many open files") {
        Some(libc::EMFILE)
    } else {
        None
    };
    match errno {
        Some(errno) => Error::io(&std::io::Error::from_raw_os_error(errno), message),
        None => Error::new(ErrorKind::Unavailable, message),
    }
}

/// Compaction chosen for what checkpoints upload (measured with `bench/checkpoints/run`, see
/// `docs/design/0003-checkpoints.md`, "Compaction"): every checkpoint flushes the memtable into
/// a new file, and every file a compaction writes is uploaded by the next checkpoint. RocksDB's
/// default (leveled, 4 level-0 files) rewrites a small state whole every 4 checkpoints: 11x the
/// final state uploaded over a run at 1.5 s checkpoints. Universal compaction merging 16 files
/// at a time rewrites far less (2.9x), and bloom filters keep point reads over the extra files
/// cheap (a key not in a file costs a filter probe, not a block read).
/// The options of the store's RocksDB, and of the delta files ingested into it.
fn db_options() -> Options {
    let mut opts = Options::default();
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Files kept open for reads are bounded, within the descriptors the server keeps for
    // itself (a quarter of its limit: `server::descriptors_short`).
    let open_files = crate::open_files_limit().map_or(1024, |l| (l / 8).clamp(32, 4096));
    opts.set_max_open_files(open_files as i32);
    opts.increase_parallelism(2);
    set_compaction(&mut opts);
    opts
}

fn set_compaction(opts: &mut Options) {
    opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
    let mut universal = rocksdb::UniversalCompactOptions::default();
    universal.set_min_merge_width(16);
    opts.set_universal_compaction_options(&universal);
    opts.set_level_zero_file_num_compaction_trigger(16);
    // Writes are slowed or stopped only far beyond the trigger: a checkpoint every second
    // flushes a file every second, and compaction catches up between them.
    opts.set_level_zero_slowdown_writes_trigger(1000);
    opts.set_level_zero_stop_writes_trigger(1000);
    opts.set_block_based_table_factory(&block_table_options());
}

fn block_table_options() -> rocksdb::BlockBasedOptions {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_successor_skips_trailing_ff() {
        assert_eq!(prefix_successor(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_successor(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xff]), None);
        assert_eq!(table_range(1), (vec![0, 0, 0, 1], vec![0, 0, 0, 2]));
    }

    /// A key's check after a large delete steps over that key's deleted entries only, not
    /// over every deleted entry after it (a seek per key would be quadratic).
    #[tokio::test]
    async fn a_prefix_check_steps_over_no_deleted_entry_past_its_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut t = StateTable::new(store.clone(), 7);
        let key = |i: u64| [i.to_be_bytes().as_slice(), b"row"].concat();
        for (epoch, delete) in [(1, false), (2, true)] {
            for i in 0..5000 {
                match delete {
                    false => t.put(key(i), b"1".to_vec()),
                    true => t.delete(key(i)),
                }
            }
            let mut w = EpochWrites::default();
            t.take_writes(&mut w);
            store.commit(epoch, w).await.unwrap();
            store.seal(epoch);
        }
        let snapshot = store.snapshot();
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::EnableCount);
        let mut perf = rocksdb::perf::PerfContext::default();
        perf.reset();
        for i in 0..100u64 {
            assert!(!snapshot.holds_prefix(7, &i.to_be_bytes()).unwrap());
        }
        let skipped = perf.metric(rocksdb::perf::PerfMetric::InternalDeleteSkippedCount);
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
        assert!(skipped <= 200, "{skipped} deleted entries stepped over");
    }

    #[tokio::test]
    async fn readers_see_only_sealed_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut t = StateTable::new(store.clone(), 7);
        t.put(b"a".to_vec(), b"1".to_vec());
        let mut w = EpochWrites::default();
        t.take_writes(&mut w);
        store.commit(1, w).await.unwrap();
        let count = |s: &Snapshot| {
            let mut n = 0;
            s.scan_table(7, &mut |_, _| {
                n += 1;
                true
            })
            .unwrap();
            n
        };
        assert_eq!(count(&store.snapshot()), 0, "epoch 1 is not sealed yet");
        store.seal(1);
        assert_eq!(count(&store.snapshot()), 1);
        assert_eq!(t.get(b"a").unwrap(), Some(b"1".to_vec()));
    }

    #[tokio::test]
    async fn a_checkpoint_reopens_at_its_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(&dir.path().join("live")).unwrap();
        let mut t = StateTable::new(store.clone(), 7);
        t.put(b"a".to_vec(), b"1".to_vec());
        t.put(b"b".to_vec(), b"2".to_vec());
        let mut w = EpochWrites::default();
        t.take_writes(&mut w);
        store.commit(1, w).await.unwrap();
        let copy = dir.path().join("copy");
        assert!(matches!(
            store.checkpoint(&copy, false).unwrap(),
            Image::Files(_)
        ));
        store.seal(1);
        // Written after the checkpoint: not in it.
        t.put(b"c".to_vec(), b"3".to_vec());
        let mut w = EpochWrites::default();
        t.take_writes(&mut w);
        store.commit(2, w).await.unwrap();

        let restored = StateStore::open_restored(&copy, 1, &[]).unwrap();
        assert_eq!(restored.sealed_epoch(), 1);
        let mut rows = Vec::new();
        restored
            .snapshot()
            .scan_table(7, &mut |k, v| {
                rows.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        assert_eq!(
            rows,
            [
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec())
            ]
        );
        // The next epoch commits at once: the restored one counts as sealed.
        restored.commit(2, EpochWrites::default()).await.unwrap();
        // A directory without a RocksDB is refused, not created.
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(StateStore::open_restored(&empty, 1, &[]).is_err());
    }

    fn rows(store: &StateStore, table: TableId) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut rows = Vec::new();
        store
            .snapshot()
            .scan_table(table, &mut |k, v| {
                rows.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        rows
    }

    /// Commits `writes` (key, value or deletion) to table 7 as `epoch` and seals it.
    async fn epoch(store: &Arc<StateStore>, epoch: u64, writes: &[(&str, Option<&str>)]) {
        let mut t = StateTable::new(store.clone(), 7);
        for (k, v) in writes {
            match v {
                Some(v) => t.put(k.as_bytes().to_vec(), v.as_bytes().to_vec()),
                None => t.delete(k.as_bytes().to_vec()),
            }
        }
        let mut w = EpochWrites::default();
        t.take_writes(&mut w);
        store.commit(epoch, w).await.unwrap();
        store.seal(epoch);
    }

    fn delta(image: Image) -> Delta {
        match image {
            Image::Delta(d) => d,
            Image::Files(_) => panic!("a delta was asked for and possible"),
        }
    }

    #[tokio::test]
    async fn deltas_ingested_over_a_base_restore_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(&dir.path().join("live")).unwrap();
        epoch(
            &store,
            1,
            &[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))],
        )
        .await;
        let base = dir.path().join("base");
        assert!(matches!(
            store.checkpoint(&base, true).unwrap(),
            Image::Delta(_)
        ));
        // The first image asked for as a delta above was the writes of epoch 1; this base
        // one holds everything.
        let base = dir.path().join("base2");
        assert!(matches!(
            store.checkpoint(&base, false).unwrap(),
            Image::Files(_)
        ));
        // A key written in two epochs keeps its last value; a deleted one goes; one deleted
        // and written again comes back.
        epoch(
            &store,
            2,
            &[("b", Some("20")), ("a", None), ("d", Some("4"))],
        )
        .await;
        epoch(
            &store,
            3,
            &[("b", Some("21")), ("d", None), ("d", Some("5"))],
        )
        .await;
        let first = dir.path().join("d1.sst");
        let sizes = delta(store.checkpoint(&dir.path().join("x"), true).unwrap())
            .write(std::slice::from_ref(&first))
            .unwrap();
        assert!(matches!(sizes[..], [s] if s > 0));
        // Nothing written: no file.
        let none = dir.path().join("none.sst");
        let empty = delta(store.checkpoint(&dir.path().join("y"), true).unwrap());
        assert!(empty.write(std::slice::from_ref(&none)).unwrap().is_empty());
        assert!(!none.exists());
        epoch(
            &store,
            4,
            &[("c", None), ("e", Some("6")), ("b", Some("22"))],
        )
        .await;
        let second = dir.path().join("d2.sst");
        delta(store.checkpoint(&dir.path().join("z"), true).unwrap())
            .write(std::slice::from_ref(&second))
            .unwrap();
        let live = rows(&store, 7);
        let text = |r: &[(Vec<u8>, Vec<u8>)]| -> Vec<(String, String)> {
            r.iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into(),
                        String::from_utf8_lossy(v).into(),
                    )
                })
                .collect()
        };
        assert_eq!(
            text(&live),
            [
                ("b".into(), "22".into()),
                ("d".into(), "5".into()),
                ("e".into(), "6".into())
            ]
        );
        // Ingested through hard links, as a restore does with the deltas it keeps: the links
        // are moved into RocksDB's directory, and the kept files' bytes stay as they were.
        let kept = [
            std::fs::read(&first).unwrap(),
            std::fs::read(&second).unwrap(),
        ];
        let ingest = dir.path().join("ingest");
        std::fs::create_dir_all(&ingest).unwrap();
        let links = [ingest.join("1.sst"), ingest.join("2.sst")];
        std::fs::hard_link(&first, &links[0]).unwrap();
        std::fs::hard_link(&second, &links[1]).unwrap();
        let restored = StateStore::open_restored(&base, 4, &links).unwrap();
        assert_eq!(rows(&restored, 7), live);
        assert!(!links[0].exists() && !links[1].exists());
        assert_eq!(std::fs::read(&first).unwrap(), kept[0]);
        assert_eq!(std::fs::read(&second).unwrap(), kept[1]);
    }

    /// Waits until the store's parts are written; returns how many there are.
    async fn parts_written(store: &StateStore) -> usize {
        loop {
            let (n, written) = store.changes().parts();
            if written {
                return n;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    fn files_in(dir: &Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |d| d.count())
    }

    /// The files in `dir` once they are `n`, or after 5 s.
    async fn files_in_soon(dir: &Path, n: usize) -> usize {
        for _ in 0..500 {
            if files_in(dir) == n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        files_in(dir)
    }

    #[tokio::test]
    async fn a_delta_written_ahead_in_parts_restores_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(&dir.path().join("live")).unwrap();
        let ahead = dir.path().join("ahead");
        std::fs::create_dir_all(&ahead).unwrap();
        store.keep_changes(Keep::Ahead {
            dir: ahead.clone(),
            part_bytes: 1,
        });
        epoch(
            &store,
            1,
            &[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))],
        )
        .await;
        let base = dir.path().join("base");
        assert!(matches!(
            store.checkpoint(&base, false).unwrap(),
            Image::Files(_)
        ));
        // The parts of the base's epochs went with it.
        parts_written(&store).await;
        assert_eq!(files_in_soon(&ahead, 0).await, 0);
        // Each epoch a part of its own (the one before is written when it commits), keys
        // written, deleted and written again across them; then two epochs at once, the second
        // a part or the writes after the parts, whichever comes.
        let epochs: [&[(&str, Option<&str>)]; 7] = [
            &[("b", Some("20")), ("a", None), ("d", Some("4"))],
            &[("b", Some("21")), ("d", None)],
            &[("d", Some("5")), ("e", Some("6"))],
            &[("c", None), ("e", Some("7"))],
            &[("a", Some("8")), ("c", Some("9"))],
            &[("e", None), ("f", Some("10"))],
            &[("b", None), ("a", Some("11"))],
        ];
        for (n, writes) in epochs.iter().enumerate() {
            epoch(&store, n as u64 + 2, writes).await;
            if n < 5 {
                assert_eq!(parts_written(&store).await, n + 1);
            }
        }
        let delta = delta(store.checkpoint(&dir.path().join("x"), true).unwrap());
        let files = delta.files_max();
        assert!(files >= 7, "{files}");
        let paths: Vec<PathBuf> = (0..files)
            .map(|i| dir.path().join(format!("delta-{i}.sst")))
            .collect();
        // Seven files whichever way the last two epochs went.
        let sizes = delta.write(&paths).unwrap();
        assert_eq!(sizes.len(), 7);
        // The parts were moved to their names.
        assert_eq!(files_in(&ahead), 0);
        let live = rows(&store, 7);
        assert_eq!(live.len(), 4, "{live:?}");
        let restored = StateStore::open_restored(&base, 8, &paths[..7]).unwrap();
        assert_eq!(rows(&restored, 7), live);
        // Parts dropped unused (nothing is kept any more) leave no file.
        epoch(&store, 9, &[("g", Some("12"))]).await;
        assert_eq!(parts_written(&store).await, 1);
        assert_eq!(files_in(&ahead), 1);
        store.keep_changes(Keep::Nothing);
        assert_eq!(files_in_soon(&ahead, 0).await, 0);
    }

    #[tokio::test]
    async fn a_dropped_table_too_many_writes_or_no_kept_writes_make_base_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(&dir.path().join("live")).unwrap();
        epoch(&store, 1, &[("a", Some("1"))]).await;
        let mut w = EpochWrites::default();
        w.drop_table(9);
        store.commit(2, w).await.unwrap();
        store.seal(2);
        let dir1 = dir.path().join("c1");
        assert!(matches!(
            store.checkpoint(&dir1, true).unwrap(),
            Image::Files(_)
        ));
        // Whole again after that checkpoint.
        epoch(&store, 3, &[("b", Some("2"))]).await;
        assert!(matches!(
            store.checkpoint(&dir.path().join("c2"), true).unwrap(),
            Image::Delta(_)
        ));
        store.delete_tables(&[9]).unwrap();
        assert!(matches!(
            store.checkpoint(&dir.path().join("c3"), true).unwrap(),
            Image::Files(_)
        ));
        let mut changes = Changes::new(Keep::Writes);
        let mut big = Packed::default();
        big.push(&[1; 4], &[1; 12], Some(&vec![0; DELTA_BYTES_MAX]));
        changes.record(big, DELTA_BYTES_MAX);
        assert!(!changes.whole && changes.commits.is_empty());
        // Not kept at all: every checkpoint is a base one, also after one was taken.
        store.keep_changes(Keep::Nothing);
        for n in 4..6 {
            epoch(&store, n, &[("c", Some("3"))]).await;
            let dir = dir.path().join(format!("c{n}"));
            assert!(matches!(
                store.checkpoint(&dir, true).unwrap(),
                Image::Files(_)
            ));
        }
    }

    #[tokio::test]
    async fn commit_of_next_epoch_waits_for_seal() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let s2 = store.clone();
        let pending = tokio::spawn(async move { s2.commit(2, EpochWrites::default()).await });
        tokio::task::yield_now().await;
        assert!(!pending.is_finished());
        store.seal(1);
        pending.await.unwrap().unwrap();
    }
}
