//! The database: catalog, state store, tables' write paths and the dataflow, and the
//! execution of every kind of statement on behalf of sessions. This file opens the data
//! directory in order; `recovery` restores what it holds, `ddl` creates and drops objects,
//! `query` runs queries and DML, `system_tables` builds the `weir_catalog` tables.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::catalog::{Catalog, Object, ObjectId, TableDef};
use crate::checkpoint::{
    restore, CheckpointClient, Checkpointer, Holder, Kind as CheckpointKind, Storage,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::state::StateStore;
use crate::stream::{ActorContext, BarrierClient, Coordinator, Dataflow, ErrorSink, SinkStatus};
use crate::table::TableWriter;

mod ddl;
mod lock;
mod privileges;
mod query;
mod recovery;
mod roles;
mod secrets;
mod subscribe;
mod system_tables;
mod views;

pub use crate::sql::{pg_column_name, result_schema};
pub use system_tables::text_rows;
pub use views::parse_parallelism;

/// A query's rows, batch by batch as its execution produces them.
pub type RowStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<RecordBatch>> + Send + 'static>>;

/// What a statement returns to the client.
pub enum Output {
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// A cursor's rows that a FETCH takes (tagged `FETCH n`).
    Fetched {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// A query's rows as they are produced: the client receives each batch before the next is
    /// computed, and a client that stops reading stops the query.
    Stream {
        schema: SchemaRef,
        rows: RowStream,
    },
    /// A command tag such as `CREATE TABLE`, with the affected row count where PostgreSQL
    /// reports one (`INSERT 0 3`).
    Command {
        tag: String,
        rows: Option<usize>,
    },
    TransactionStart,
    TransactionEnd {
        tag: String,
    },
    /// `COPY ... TO STDOUT`: a query's rows as COPY data, in `format`; `columns` names them
    /// (for a header line).
    CopyOut {
        columns: Vec<String>,
        rows: RowStream,
        format: CopyFormat,
    },
    /// `COPY ... FROM STDIN`: the client is to send its data, which becomes rows as `CopyFrom`
    /// says and is written, as one statement, once it has all come.
    CopyIn(Box<CopyFrom>),
}

/// How COPY writes or reads rows: PostgreSQL's text format (`\N` for NULL, special
/// characters escaped with a backslash), CSV (quoted where needed) or its binary format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFormat {
    pub csv: bool,
    /// PostgreSQL's binary COPY format (`csv` is false then).
    pub binary: bool,
    /// Between values: a tab in text, a comma in CSV by default.
    pub delimiter: u8,
    /// A NULL: `\N` in text, nothing in CSV by default.
    pub null: String,
    /// A first line of the columns' names.
    pub header: bool,
    /// CSV's quote, and the character that makes a quote inside a quoted value literal
    /// (both `"` by default: a quote is doubled).
    pub quote: u8,
    pub escape: u8,
}

impl CopyFormat {
    /// CSV as PostgreSQL writes it by default: commas, `"` quotes, NULL as nothing.
    pub fn csv() -> CopyFormat {
        CopyFormat {
            csv: true,
            binary: false,
            delimiter: b',',
            null: String::new(),
            header: false,
            quote: b'"',
            escape: b'"',
        }
    }

    /// PostgreSQL's text format by default: tabs, `\N` for NULL.
    pub fn text() -> CopyFormat {
        CopyFormat {
            csv: false,
            delimiter: b'\t',
            null: "\\N".into(),
            ..CopyFormat::csv()
        }
    }
}

/// `COPY t [(columns)] FROM STDIN`: the table the client's data goes into, which of its
/// columns the data gives (in the data's order; the others are NULL), the data's format, and
/// the parts its rows are gathered and written in (the session's `statement_mem`).
#[derive(Debug, Clone)]
pub struct CopyFrom {
    pub table: TableDef,
    pub columns: Vec<usize>,
    pub format: CopyFormat,
    pub parts: crate::table::PartSize,
}

impl Output {
    /// A command tag without a row count.
    pub fn command(tag: &str) -> Output {
        Output::Command {
            tag: tag.to_string(),
            rows: None,
        }
    }
}

pub struct Database {
    pub config: Config,
    store: Arc<StateStore>,
    catalog: Arc<RwLock<Catalog>>,
    /// The keys that seal new secrets and open those in the catalog (`config.secret_keys`).
    secret_keys: crate::catalog::SecretKeys,
    tables: RwLock<HashMap<ObjectId, Arc<tokio::sync::Mutex<TableWriter>>>>,
    barriers: BarrierClient,
    actors: ActorContext,
    /// Row-level expression errors, per view.
    view_errors: Mutex<HashMap<ObjectId, ErrorSink>>,
    /// The task of each source, producing while something reads the source.
    sources: Mutex<HashMap<ObjectId, crate::connector::source::Handle>>,
    /// What each sink has received.
    sinks: Mutex<HashMap<ObjectId, Arc<SinkStatus>>>,
    /// The views and sinks being created, while their inputs' rows come in
    /// (`weir_catalog.backfills`).
    filling: Mutex<BTreeMap<ObjectId, views::Filling>>,
    /// DDL statements run one at a time.
    ddl: Arc<tokio::sync::Mutex<()>>,
    tables_dir: PathBuf,
    /// The order of commits and the open transaction blocks.
    transactions: Arc<crate::table::Transactions>,
    /// Started once every table and view is running.
    checkpoints: std::sync::OnceLock<CheckpointClient>,
    /// The recoveries recorded in the data directory, this start's last.
    recoveries: Mutex<Vec<restore::Recovery>>,
    /// The memory pool and spill files of batch queries.
    query_runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    /// Statements' temporary files (spills, spooled rows) and their disk budget.
    temp: Arc<crate::table::TempDisk>,
    /// The threads batch plans run on, off the server's async workers.
    executor: crate::sql::Executor,
    /// The threads the dataflow's actors run on (`actors` hands them out), owned here so that
    /// they run as long as the database is open.
    _dataflow: Dataflow,
    /// Held while the database is open: one server per data directory.
    lock: lock::DataDirLock,
}

/// The most batch plans that run at once: every session's statement, and cursors open in
/// transaction blocks beside them.
fn statement_threads_max(config: &Config) -> usize {
    config.connections_max.saturating_mul(2).max(16)
}

/// Where memory stands (`Database::memory`), for `/metrics`.
pub struct Memory {
    pub limit_bytes: u64,
    /// The views' and tables' state in RocksDB's memtables: written, not yet flushed.
    pub state_memtable_bytes: u64,
    /// Blocks of state files in RocksDB's block cache.
    pub state_block_cache_bytes: u64,
    /// Operators' caches of their state (aggregations' groups), and the most they should
    /// hold together (an eighth of `memory_limit`).
    pub operator_cache_bytes: u64,
    pub operator_cache_limit_bytes: u64,
    /// Operators' state writes of the current epoch (estimated), and the most they should
    /// hold before a barrier is asked for (an eighth of `memory_limit`).
    pub epoch_writes_bytes: u64,
    pub epoch_writes_limit_bytes: u64,
    /// What batch statements may reserve together: half of `memory_limit`.
    pub statements_limit_bytes: u64,
    /// What they have reserved now.
    pub statements_bytes: u64,
    /// Batch plans running, open cursors included.
    pub statements_running: u64,
    /// What statements' temporary files take of the disk, and may take (`temp_disk_limit`).
    pub temp_disk_bytes: u64,
    pub temp_disk_limit_bytes: u64,
}

/// The directory of the sources' ledgers, in the data directory.
const SOURCES_DIR: &str = "sources";

/// The data directory's subdirectory of statements' temporary files (`TempDisk`) and large
/// writes' scratch stores.
const SPOOL_DIR: &str = "spool";

/// Statements' temporary files, under `<data_dir>/spool` within `temp_disk_limit`. Those of an
/// earlier run are of no use.
fn temp_disk(config: &Config) -> Result<Arc<crate::table::TempDisk>> {
    let dir = config.data_dir.join(SPOOL_DIR);
    // (Versions before temp_disk_limit spilled to a directory of their own.)
    for old in [dir.clone(), config.data_dir.join("spill")] {
        if old.exists() {
            std::fs::remove_dir_all(&old)?;
        }
    }
    let limit = config.temp_disk_limit_bytes()?;
    tracing::info!(
        "statements' temporary files may take {} of disk (temp_disk_limit)",
        crate::sql::memory_text(limit)
    );
    crate::table::TempDisk::new(&dir, limit)
}

/// See [`Database::closed`].
#[derive(Debug, Clone)]
pub struct Closed {
    store: crate::Dropped,
    lock: crate::Dropped,
}

impl Closed {
    pub fn is_closed(&self) -> bool {
        self.store.is_dropped() && self.lock.is_dropped()
    }
}

impl Database {
    /// Opens the data directory: restores the newest whole checkpoint when the store holds
    /// one (`docs/design/0004-recovery.md`), replays every table's change log after the
    /// checkpoint's offset (all of it without a checkpoint) and starts every view, restored
    /// or rebuilt from its inputs.
    pub async fn open(config: Config) -> Result<Arc<Database>> {
        let lock = lock::DataDirLock::acquire(
            &config.data_dir,
            &format!("listening on {}", config.listen),
        )?;
        let tables_dir = config.data_dir.join("tables");
        std::fs::create_dir_all(&tables_dir)?;
        std::fs::create_dir_all(config.data_dir.join(SOURCES_DIR))?;
        let mut storage = Storage::open(&config.checkpoint_storage()?, &config.checkpoint.s3)?;
        // Before anything is read from the store: from here on, a server that held it before
        // neither writes nor deletes there.
        storage
            .take_over(Holder::this_process(
                &config.data_dir,
                &config.listen.to_string(),
            ))
            .await?;
        let mut recovery = restore::Recovery::begin();
        let contents = restore::read_store(&storage).await?;
        let (store, restored) =
            recovery::restore_state(&config, &storage, &contents, &mut recovery).await?;
        store.limit_memory(config.memory_limit_bytes())?;
        recovery.restore_ms = recovery.elapsed_ms();
        if let (Some(m), false) = (&restored, config.data_dir.join("catalog.json").exists()) {
            recovery::install_from_store(&config, &storage, &contents, m, &tables_dir).await?;
            recovery.from_store_alone = true;
        }
        let (catalog, secret_keys) = recovery::open_catalog(&config, &tables_dir)?;
        let objects: Vec<Object> = catalog.objects().to_vec();
        let in_checkpoint = recovery::usable_objects(&store, restored.as_ref(), &objects)?;
        let (barriers, events) = Coordinator::start(
            store.clone(),
            Duration::from_millis(config.barrier_interval_ms.max(1)),
            config.clock.clone(),
        );
        let temp = temp_disk(&config)?;
        let query_runtime = crate::sql::query_runtime(config.memory_limit_bytes() / 2, &temp)?;
        let dataflow = Dataflow::start()?;
        let executor = crate::sql::Executor::start(
            statement_threads_max(&config),
            config.superuser_reserved_connections,
        )?;
        let db = Arc::new(Database {
            query_runtime,
            temp,
            executor,
            actors: ActorContext {
                runtime: dataflow.handle(),
                store: store.clone(),
                events,
                chunk_rows_max: config.chunk_rows_max,
                // What a new view holds of its inputs' rows in one epoch while it backfills.
                backfill_bytes_per_barrier: (config.memory_limit_bytes() / 64)
                    .clamp(4 << 20, 64 << 20) as usize,
            },
            config,
            store,
            catalog: Arc::new(RwLock::new(catalog)),
            secret_keys,
            tables: RwLock::new(HashMap::new()),
            barriers,
            view_errors: Mutex::new(HashMap::new()),
            sources: Mutex::new(HashMap::new()),
            sinks: Mutex::new(HashMap::new()),
            filling: Mutex::new(BTreeMap::new()),
            ddl: Arc::default(),
            transactions: crate::table::Transactions::new(tables_dir.clone()),
            tables_dir,
            checkpoints: std::sync::OnceLock::new(),
            recoveries: Mutex::new(Vec::new()),
            _dataflow: dataflow,
            lock,
        });
        db.undo_abandoned_blocks();
        recovery.records_replayed = db
            .start_objects(objects, &in_checkpoint, restored.as_ref())
            .await?;
        db.barriers.flush().await?;
        db.run_sources_read();
        recovery.total_ms = recovery.elapsed_ms();
        recovery.replay_ms = recovery.total_ms - recovery.restore_ms;
        tracing::info!(
            checkpoint = recovery.checkpoint_id,
            records_replayed = recovery.records_replayed,
            restore_ms = recovery.restore_ms,
            replay_ms = recovery.replay_ms,
            "recovered"
        );
        let truncate = db.spawn_log_tasks(&storage);
        let history = restore::record_recovery(&db.config.data_dir, &recovery)?;
        *db.recoveries.lock().unwrap_or_else(|p| p.into_inner()) = history;
        let checkpoints = Checkpointer::start(
            db.config.checkpoint.clone(),
            storage,
            crate::checkpoint::Found {
                store: &contents,
                restored: restored.as_ref().map(|m| m.id),
                damaged: &recovery.damaged,
            },
            Some(truncate),
            db.barriers.clone(),
            db.config.data_dir.clone(),
            db.catalog.clone(),
            db.ddl.clone(),
            db.barriers.metrics.clone(),
        )
        .await?;
        let _ = db.checkpoints.set(checkpoints);
        Ok(db)
    }

    /// Tells, once this database is dropped, whether everything it held in its data directory
    /// is released: RocksDB closed (once every task of its dataflow and every snapshot are
    /// gone too) and the directory's lock released. A restart in the same process waits for
    /// it.
    pub fn closed(&self) -> Closed {
        Closed {
            store: self.store.closed(),
            lock: self.lock.released(),
        }
    }

    /// Compacts the state store into its bottom level, rewriting its files.
    pub async fn compact_state(&self) -> Result<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.compact())
            .await
            .map_err(|e| Error::internal(format!("compaction task: {e}")))
    }

    fn checkpoints(&self) -> Result<&CheckpointClient> {
        self.checkpoints
            .get()
            .ok_or_else(|| Error::unavailable("checkpoints are not running yet"))
    }

    /// Takes a checkpoint now (after the one in flight); answers with its id and epoch once
    /// it is complete.
    pub async fn take_checkpoint(
        &self,
        kind: CheckpointKind,
        label: Option<String>,
        base: bool,
    ) -> Result<(u64, u64)> {
        self.checkpoints()?.trigger(kind, label, base).await
    }

    /// The server's metrics in Prometheus' text format (`/metrics`).
    pub fn render_metrics(&self) -> String {
        self.barriers.metrics.render()
    }

    /// Where memory stands: `memory_limit`, what batch statements may reserve together and
    /// have reserved, and how many plans run.
    pub fn memory(&self) -> Memory {
        let pool = &self.query_runtime.memory_pool;
        let share = match pool.memory_limit() {
            datafusion::execution::memory_pool::MemoryLimit::Finite(n) => n as u64,
            _ => 0,
        };
        let (memtables, block_cache) = self.store.memory();
        let (caches, caches_max) = self.store.caches_memory();
        let (epoch_writes, epoch_writes_max) = self.store.epoch_writes_memory();
        Memory {
            epoch_writes_bytes: epoch_writes,
            epoch_writes_limit_bytes: epoch_writes_max,
            operator_cache_bytes: caches,
            operator_cache_limit_bytes: caches_max,
            state_memtable_bytes: memtables,
            state_block_cache_bytes: block_cache,
            limit_bytes: self.config.memory_limit_bytes(),
            statements_limit_bytes: share,
            statements_bytes: pool.reserved() as u64,
            statements_running: self.executor.running() as u64,
            temp_disk_bytes: self.temp.used(),
            temp_disk_limit_bytes: self.temp.limit(),
        }
    }

    /// The checkpoints of this run and those found in the store, newest first.
    pub fn checkpoint_records(&self) -> Result<Vec<crate::checkpoint::Record>> {
        Ok(self.checkpoints()?.records())
    }

    /// CHECKPOINT [BASE]: takes one now (after the one in flight) and answers with its id and
    /// epoch.
    pub async fn checkpoint(&self, base: bool) -> Result<Output> {
        let (id, epoch) = self
            .take_checkpoint(CheckpointKind::Manual, None, base)
            .await?;
        let schema = checkpoint_schema();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![id as i64])),
                Arc::new(Int64Array::from(vec![epoch as i64])),
            ],
        )?;
        Ok(Output::Rows {
            schema,
            batches: vec![batch],
        })
    }
}

impl Database {
    /// The role `name`, as the catalog holds it now.
    pub fn role(&self, name: &str) -> Option<crate::catalog::RoleDef> {
        self.catalog().role(name).cloned()
    }

    fn catalog(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(|p| p.into_inner())
    }

    fn catalog_mut(&self) -> std::sync::RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Undoes the DDL of each transaction block dropped without its end being handled (its
    /// session went away), as its number is reported.
    fn undo_abandoned_blocks(self: &Arc<Self>) {
        let (report, mut reports) = tokio::sync::mpsc::unbounded_channel();
        self.transactions.report_abandoned(report);
        let db = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(number) = reports.recv().await {
                let Some(db) = db.upgrade() else {
                    return;
                };
                let _ddl = db.ddl.lock().await;
                db.undo_block(number).await;
            }
        });
    }

    /// Where statements' rows go when they are too many for memory (`changelog::Gather`), and
    /// what batch queries spill.
    pub fn temp_disk(&self) -> &Arc<crate::table::TempDisk> {
        &self.temp
    }

    pub async fn flush(&self) -> Result<Output> {
        self.barriers.flush_visible().await?;
        Ok(Output::command("FLUSH"))
    }
}

/// What CHECKPOINT answers: the checkpoint's id and epoch.
pub fn checkpoint_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("epoch", DataType::Int64, false),
    ]))
}
