//! The database: catalog, state store, tables' write paths and the dataflow, and the
//! execution of every kind of statement on behalf of sessions.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::datasource::TableProvider;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, WriteOp};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;
use tokio::sync::mpsc;

use crate::catalog::{Catalog, Kind, Object, ObjectId, SourceDef, TableDef, ViewDef};
use crate::checkpoint::manifest::Kind as CheckpointKind;
use crate::checkpoint::restore;
use crate::checkpoint::storage::{Holder, Storage};
use crate::checkpoint::{CheckpointClient, Checkpointer};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;
use crate::sql::context::query_context;
use crate::sql::ddl::{self, relation_name};
use crate::sql::provider::{RelationTable, Rows};
use crate::sql::stream_plan::{check_deterministic, Planner};
use crate::state::StateStore;
use crate::state::TableId;
use crate::stream::actor::{Dataflow, SinkCounter, SourceRows};
use crate::stream::coordinator::{BarrierClient, Coordinator};
use crate::stream::dispatch::Partitioner;
use crate::stream::expr::ErrorSink;
use crate::stream::message::{ActorId, Backfills, Feed, Message, Mutation, NewOutput, Target};
use crate::stream::plan::{
    build_actor, ActorContext, Fragment, Keys, PlanNode, Source, StreamPlan,
};
use crate::table::TableWriter;

mod recovery;
mod system_tables;

pub use system_tables::text_rows;

/// A query's rows, batch by batch as its execution produces them.
pub type RowStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<RecordBatch>> + Send + 'static>>;

/// What a statement returns to the client.
pub enum Output {
    Rows {
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
    tables: RwLock<HashMap<ObjectId, Arc<tokio::sync::Mutex<TableWriter>>>>,
    barriers: BarrierClient,
    actors: ActorContext,
    /// Row-level expression errors, per view.
    view_errors: Mutex<HashMap<ObjectId, ErrorSink>>,
    /// The task of each source, producing while something reads the source.
    sources: Mutex<HashMap<ObjectId, crate::source::Handle>>,
    /// What each sink has received.
    sinks: Mutex<HashMap<ObjectId, Arc<SinkCounter>>>,
    /// DDL statements run one at a time.
    ddl: Arc<tokio::sync::Mutex<()>>,
    tables_dir: PathBuf,
    /// Started once every table and view is running.
    checkpoints: std::sync::OnceLock<CheckpointClient>,
    /// The recoveries recorded in the data directory, this start's last.
    recoveries: Mutex<Vec<restore::Recovery>>,
    pub metrics: Arc<Metrics>,
    /// The memory pool and spill directory of batch queries.
    query_runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    /// The threads the dataflow's actors run on (`actors` hands them out), owned here so that
    /// they run as long as the database is open.
    _dataflow: Dataflow,
    /// Held while the database is open: one server per data directory.
    lock: crate::datadir::DataDirLock,
}

/// The directory of the sources' ledgers, in the data directory.
const SOURCES_DIR: &str = "sources";

/// A DML statement's command tag, and the rows it deletes and inserts.
type DmlRows = (&'static str, Option<RecordBatch>, Option<RecordBatch>);

/// A table's latest rows, for DataFusion to read.
fn latest_rows(writer: &mut TableWriter) -> Result<Arc<dyn TableProvider>> {
    let latest = writer.latest()?;
    Ok(Arc::new(RelationTable {
        schema: writer.schema().clone(),
        rows: Rows::Latest {
            table: writer.def.id,
            snapshot: latest.snapshot,
            order: latest.order,
            changes: latest.changes,
        },
    }))
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
        let lock = crate::datadir::DataDirLock::acquire(
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
        let started = crate::clock::monotonic();
        let mut recovery = restore::Recovery {
            started_at_ms: crate::clock::wall_ms(),
            ..Default::default()
        };
        let (store, restored) = recovery::restore_state(&config, &storage, &mut recovery).await?;
        store.limit_memory(config.memory_limit_bytes())?;
        recovery.restore_ms = started.elapsed().as_millis() as u64;
        if let (Some(m), false) = (&restored, config.data_dir.join("catalog.json").exists()) {
            recovery::install_from_store(&config, &storage, m, &tables_dir).await?;
            recovery.from_store_alone = true;
        }
        let catalog = Catalog::load(&config.data_dir)?;
        let objects: Vec<Object> = catalog.objects().to_vec();
        let in_checkpoint = recovery::usable_objects(&store, restored.as_ref(), &objects)?;
        let metrics = Arc::new(Metrics::default());
        let (barriers, events) = Coordinator::start(
            store.clone(),
            Duration::from_millis(config.barrier_interval_ms.max(1)),
            config.clock.clone(),
            metrics.clone(),
        );
        // Spill files of an earlier run are of no use.
        let spill_dir = config.data_dir.join("spill");
        if spill_dir.exists() {
            std::fs::remove_dir_all(&spill_dir)?;
        }
        std::fs::create_dir_all(&spill_dir)?;
        let query_runtime =
            crate::sql::context::query_runtime(config.memory_limit_bytes() / 2, spill_dir)?;
        let dataflow = Dataflow::start()?;
        let db = Arc::new(Database {
            query_runtime,
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
            tables: RwLock::new(HashMap::new()),
            barriers,
            view_errors: Mutex::new(HashMap::new()),
            sources: Mutex::new(HashMap::new()),
            sinks: Mutex::new(HashMap::new()),
            ddl: Arc::default(),
            tables_dir,
            checkpoints: std::sync::OnceLock::new(),
            recoveries: Mutex::new(Vec::new()),
            metrics,
            _dataflow: dataflow,
            lock,
        });
        // Restored objects first: tables started, views connected to them without backfill,
        // then the tables' log records after the checkpoint fed to both. Then the objects
        // created after the checkpoint, in catalog order, as on a first start.
        let (restored_objects, new_objects): (Vec<Object>, Vec<Object>) = objects
            .into_iter()
            .partition(|o| in_checkpoint.contains_key(&o.id()));
        let offsets = restored
            .as_ref()
            .map(|m| m.offsets.clone())
            .unwrap_or_default();
        let mut replays = Vec::new();
        for object in &restored_objects {
            match object {
                Object::Table(t) => {
                    let offset = offsets.get(&t.id).copied().ok_or_else(|| {
                        Error::new(
                            ErrorKind::DataCorruption,
                            format!(
                                "the checkpoint restored holds table \"{}\" but no offset in \
                                 its change log",
                                t.name
                            ),
                        )
                    })?;
                    let watermark = restored
                        .as_ref()
                        .and_then(|m| m.watermarks.get(&t.id).copied());
                    replays.push(db.start_table(t.clone(), Some((offset, watermark))).await?);
                }
                Object::View(v) => db.start_view_from_catalog(v, false).await?,
                Object::Source(src) => {
                    let offset = offsets.get(&src.id).copied().unwrap_or(0);
                    let watermark = restored
                        .as_ref()
                        .and_then(|m| m.watermarks.get(&src.id).copied());
                    db.start_source(src.clone(), offset, watermark).await?;
                }
            }
        }
        for replay in replays {
            recovery.records_replayed += replay.history.len() as u64;
            db.replay(replay).await?;
        }
        for object in new_objects {
            match object {
                Object::Table(t) => {
                    let replay = db.start_table(t, None).await?;
                    recovery.records_replayed += replay.history.len() as u64;
                    db.replay(replay).await?;
                }
                Object::View(v) => db.start_view_from_catalog(&v, true).await?,
                Object::Source(src) => db.start_source(src, 0, None).await?,
            }
        }
        db.barriers.flush().await?;
        db.run_sources_read();
        recovery.total_ms = started.elapsed().as_millis() as u64;
        recovery.replay_ms = recovery.total_ms - recovery.restore_ms;
        tracing::info!(
            checkpoint = recovery.checkpoint_id,
            records_replayed = recovery.records_replayed,
            restore_ms = recovery.restore_ms,
            replay_ms = recovery.replay_ms,
            "recovered"
        );
        let (truncate, requests) = mpsc::channel(1);
        let shipping = db.config.checkpoint.ship_logs_ms;
        let shipped = (shipping > 0).then(|| storage.clone());
        tokio::spawn(recovery::truncate_logs(
            Arc::downgrade(&db),
            requests,
            shipped.clone(),
        ));
        if let Some(storage) = shipped {
            tokio::spawn(recovery::ship_logs(
                Arc::downgrade(&db),
                storage,
                Duration::from_millis(shipping),
            ));
        }
        let history = restore::record_recovery(&db.config.data_dir, &recovery)?;
        *db.recoveries.lock().unwrap_or_else(|p| p.into_inner()) = history;
        let checkpoints = Checkpointer::start(
            db.config.checkpoint.clone(),
            storage,
            restored.as_ref().map(|m| m.id),
            &recovery.damaged,
            Some(truncate),
            db.barriers.clone(),
            db.config.data_dir.clone(),
            db.catalog.clone(),
            db.ddl.clone(),
            db.metrics.clone(),
        )
        .await?;
        let _ = db.checkpoints.set(checkpoints);
        Ok(db)
    }

    /// Starts a view of the catalog (at start), planning its query again.
    async fn start_view_from_catalog(&self, v: &ViewDef, backfill: bool) -> Result<()> {
        let (plan, _) = self
            .plan_view(
                &v.query,
                &HashMap::new(),
                v.emit_on_window_close,
                v.int4_literals,
            )
            .await?;
        self.start_view(v, plan, backfill).await
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
    fn catalog(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(|p| p.into_inner())
    }

    fn catalog_mut(&self) -> std::sync::RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A context reading every relation at the last sealed epoch.
    pub fn context(
        &self,
        settings: &HashMap<String, String>,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
    ) -> Result<SessionContext> {
        let snapshot = self.store.snapshot();
        let ctx = query_context(
            &self.catalog(),
            &snapshot,
            &self.barriers.failed,
            settings,
            overrides,
            &self.query_runtime,
        )?;
        crate::sql::context::register_system_tables(&ctx, self.system_tables()?)?;
        Ok(ctx)
    }

    pub async fn flush(&self) -> Result<Output> {
        self.barriers.flush().await?;
        Ok(Output::command("FLUSH"))
    }

    // ---- tables ----

    /// Starts a table's actor and returns its writer with what to feed it: its whole change
    /// log, or with `restored` (a table restored from a checkpoint: its offset and watermark)
    /// the records from that offset on, the restored state holding those before.
    async fn start_table(
        &self,
        def: TableDef,
        restored: Option<(u64, Option<i64>)>,
    ) -> Result<Replay> {
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let (offset, watermark) = restored.unwrap_or((0, None));
        let feed = Feed::for_table(feed_tx, offset, watermark);
        let (writer, history) = TableWriter::open(
            def.clone(),
            &self.tables_dir,
            (feed.clone(), self.barriers.clone()),
            restored.map(|(offset, watermark)| crate::table::Restored { offset, watermark }),
            (self.config.memory_limit_bytes() / 16) as usize,
        )?;
        let schema = writer.schema().clone();
        self.catalog_mut().set_schema(def.id, schema.clone());
        let actor = build_actor(
            &self.actors,
            def.id,
            PlanNode::Input(0),
            Some((schema, def.storage_order())),
            &[def.id],
            vec![feed_rx],
            ErrorSink::new(&def.name),
        )?;
        actor.spawn();
        self.barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        Ok(Replay {
            id: def.id,
            feed,
            writer,
            history,
        })
    }

    /// Feeds a started table its log's records and opens it to writes.
    async fn replay(&self, replay: Replay) -> Result<()> {
        let Replay {
            id,
            feed,
            mut writer,
            history,
        } = replay;
        // A restored table's watermark first: its actor and the views restored with it lost
        // theirs with the process, and rows late for it must stay late.
        if let Some(w) = writer.watermark() {
            feed.send_watermark(w)
                .await
                .map_err(|_| Error::internal("table actor stopped during replay"))?;
        }
        for chunk in history {
            let watermark = writer.advance_watermark(&chunk);
            feed.send_statement(chunk, watermark)
                .await
                .map_err(|_| Error::internal("table actor stopped during replay"))?;
        }
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::new(tokio::sync::Mutex::new(writer)));
        Ok(())
    }

    pub async fn create_table(&self, ct: &ast::CreateTable) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let name = relation_name(&ct.name)?;
        if self.catalog().get(&name).is_some() && ct.if_not_exists {
            return Ok(Output::command("CREATE TABLE"));
        }
        self.catalog().check_free(&name)?;
        let id = self.catalog_mut().allocate_ids(1)[0];
        let def = ddl::create_table(ct, id)?;
        // A log left behind by a table of the same id cannot exist (ids are never reused),
        // but make sure the new table starts empty.
        crate::changelog::ChangeLog::remove(&self.tables_dir, id)?;
        let replay = self.start_table(def.clone(), None).await?;
        self.replay(replay).await?;
        self.add_started(Object::Table(def)).await?;
        Ok(Output::command("CREATE TABLE"))
    }

    // ---- sources ----

    /// Where sources keep what they read (`source::file::FileLedger`).
    fn sources_dir(&self) -> PathBuf {
        self.config.data_dir.join(SOURCES_DIR)
    }

    /// Starts a source's actor and its task from `offset` (paused until something reads it).
    async fn start_source(
        &self,
        def: SourceDef,
        offset: u64,
        watermark: Option<i64>,
    ) -> Result<()> {
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let feed = Feed::starting_at(feed_tx, offset, watermark);
        let handle = crate::source::spawn(
            def.clone(),
            feed.clone(),
            (offset, watermark),
            &self.sources_dir(),
        );
        self.catalog_mut().set_schema(def.id, def.schema());
        let mut actor = build_actor(
            &self.actors,
            def.id,
            PlanNode::Input(0),
            None,
            &[],
            vec![feed_rx],
            ErrorSink::new(&def.name),
        )?;
        actor.source = Some(SourceRows {
            def: def.clone(),
            seen: offset,
            ledgers: self.sources_dir(),
        });
        actor.spawn();
        let epoch = self
            .barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        // A restored source's watermark first, as a restored table's: the views restored with
        // it lost theirs with the process, and rows late for it must stay late.
        if let (Some(w), Some(value)) = (def.watermark, watermark) {
            feed.send_watermark(crate::stream::message::Watermark {
                column: w.column,
                value,
            })
            .await
            .map_err(|_| Error::internal("source actor stopped during start"))?;
        }
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, handle);
        Ok(())
    }

    /// Runs the sources some view or sink reads, and pauses the others: a source produces
    /// nothing before it is read (a view created later backfills what went by).
    fn run_sources_read(&self) {
        let catalog = self.catalog();
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        for (id, handle) in sources.iter() {
            handle.set_running(!catalog.dependents(*id).is_empty());
        }
    }

    pub async fn create_source(&self, ct: &ast::CreateTable) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let name = relation_name(&ct.name)?;
        if self.catalog().get(&name).is_some() && ct.if_not_exists {
            return Ok(Output::command("CREATE SOURCE"));
        }
        self.catalog().check_free(&name)?;
        let id = self.catalog_mut().allocate_ids(1)[0];
        let def = ddl::create_source(ct, id)?;
        if let crate::catalog::Connector::File { path, .. } = &def.connector {
            crate::source::file::files(std::path::Path::new(path))?;
        }
        self.start_source(def.clone(), 0, None).await?;
        self.add_started(Object::Source(def)).await?;
        Ok(Output::command("CREATE SOURCE"))
    }

    // ---- views ----

    /// Plans a view's query: its stream plan (whose schema carries the view's column names) and
    /// the relations it reads.
    async fn plan_view(
        &self,
        query: &str,
        settings: &HashMap<String, String>,
        emit_on_window_close: bool,
        int4_literals: bool,
    ) -> Result<(StreamPlan, Vec<ObjectId>)> {
        let ctx = self.context(settings, vec![])?;
        let state = ctx.state();
        let parsed = crate::sql::parser::parse(query)?;
        let [p] = parsed.as_slice() else {
            return Err(Error::syntax("a view is defined by exactly one query"));
        };
        let crate::sql::parser::Statement::Sql(stmt) = &p.statement else {
            return Err(Error::syntax("a view is defined by a SELECT query"));
        };
        let mut stmt = stmt.clone();
        crate::sql::stream_plan::mark_view_now(&mut stmt);
        let mut plan = state
            .statement_to_plan(DFStatement::Statement(stmt))
            .await?;
        if int4_literals {
            plan = crate::sql::rules::type_integer_constants(plan)?;
        }
        check_deterministic(&plan)?;
        let optimized = state.optimize(&plan)?;
        let catalog = self.catalog();
        let planner = Planner {
            state: &state,
            catalog: &catalog,
            emit_on_window_close,
        };
        let (mut stream_plan, deps) = planner.plan(&optimized)?;
        stream_plan.schema = view_schema(&plan, &stream_plan.schema)?;
        Ok((stream_plan, deps))
    }

    /// Starts a view's actors, fragment by fragment (`StreamPlan::fragments`): its own actor,
    /// which keeps its rows, and the parallel actors that compute them, connected by channels
    /// and hash exchanges. The relations the view reads start feeding it at the barrier that
    /// adds it, with their current contents first.
    /// Starts a view's actors and connects them to its inputs at the next barrier: with the
    /// inputs' contents first (`backfill`), or not, for a view whose state was restored.
    async fn start_view(&self, def: &ViewDef, plan: StreamPlan, backfill: bool) -> Result<()> {
        let schema = plan.schema.clone();
        let relations = plan.inputs.clone();
        let fragments = cut(plan, def.parallelism())?;
        let sink = ErrorSink::new(&def.name);
        self.view_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, sink.clone());
        let mismatch = || {
            Error::internal(format!(
                "view \"{}\": its catalog entry does not fit its plan",
                def.name
            ))
        };
        // Actor ids and state tables, fragment by fragment and actor by actor: fragment 0 is
        // the view's own actor, whose first table holds the view's rows.
        let mut ids = def.workers.iter().copied();
        let mut tables = def.state_tables.iter().copied();
        let mut actors: Vec<Vec<(ActorId, Vec<TableId>)>> = Vec::new();
        for (f, fragment) in fragments.iter().enumerate() {
            let needed = fragment.root.state_tables_needed();
            let mut these = Vec::new();
            for _ in 0..fragment.actors {
                let (id, mut own) = match f {
                    // A sink keeps no rows of its own.
                    0 if def.sink => (def.id, Vec::new()),
                    0 => (def.id, vec![def.id]),
                    _ => (ids.next().ok_or_else(mismatch)?, Vec::new()),
                };
                for _ in 0..needed {
                    own.push(tables.next().ok_or_else(mismatch)?);
                }
                these.push((id, own));
            }
            actors.push(these);
        }
        if ids.next().is_some() || tables.next().is_some() {
            return Err(mismatch());
        }
        // One channel per actor and source. A relation feeds each of its sources in a fragment
        // through one output, split among the fragment's actors; each actor of a producing
        // fragment has one output to the fragment that reads it.
        let mut mutation = Mutation::default();
        let backfills = Arc::new(Backfills::new(if backfill {
            fragments
                .iter()
                .map(|f| {
                    f.sources
                        .iter()
                        .filter(|s| matches!(s, Source::Relation { .. }))
                        .count()
                })
                .sum()
        } else {
            0
        }));
        let mut receivers: Vec<Vec<Vec<mpsc::Receiver<Message>>>> = Vec::new();
        let mut outputs: Vec<Vec<Vec<Target>>> = fragments
            .iter()
            .map(|f| vec![Vec::new(); f.actors])
            .collect();
        for (f, fragment) in fragments.iter().enumerate() {
            let mut per_actor: Vec<Vec<mpsc::Receiver<Message>>> =
                (0..fragment.actors).map(|_| Vec::new()).collect();
            for source in &fragment.sources {
                let mut targets = Vec::new();
                for (a, (id, _)) in actors[f].iter().enumerate() {
                    let (tx, rx) = mpsc::channel(self.config.channel_messages_max);
                    per_actor[a].push(rx);
                    match source {
                        Source::Relation { .. } => targets.push((*id, tx)),
                        Source::Fragment { fragment, actor } => outputs
                            .get_mut(*fragment)
                            .and_then(|o| o.get_mut(*actor))
                            .ok_or_else(mismatch)?
                            .push((*id, tx)),
                    }
                }
                if let Source::Relation { input, keys } = source {
                    let relation = *relations.get(*input).ok_or_else(mismatch)?;
                    mutation
                        .add_outputs
                        .entry(relation)
                        .or_default()
                        .push(NewOutput {
                            targets,
                            partitioner: partitioner(keys.as_ref(), fragment.actors),
                            backfill: backfill.then(|| backfills.clone()),
                        });
                }
            }
            receivers.push(per_actor);
        }
        let mut spawned = Vec::new();
        let counter = def.sink.then(|| Arc::new(SinkCounter::default()));
        for (f, fragment) in fragments.into_iter().enumerate() {
            let schema = (f == 0 && !def.sink).then(|| (schema.clone(), Vec::new()));
            for (a, ((id, tables), inputs)) in actors[f]
                .iter()
                .zip(std::mem::take(&mut receivers[f]))
                .enumerate()
            {
                let mut actor = build_actor(
                    &self.actors,
                    *id,
                    fragment.root.clone(),
                    schema.clone(),
                    tables,
                    inputs,
                    sink.clone(),
                )?;
                if f == 0 {
                    actor.sink = counter.clone();
                }
                let targets = std::mem::take(&mut outputs[f][a]);
                if !targets.is_empty() {
                    let partitioner = partitioner(fragment.output.as_ref(), targets.len());
                    actor.outputs.push(NewOutput {
                        targets,
                        partitioner,
                        backfill: None,
                    });
                }
                spawned.push(actor);
            }
        }
        match counter {
            Some(counter) => {
                self.sinks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(def.id, counter);
            }
            None => self.catalog_mut().set_schema(def.id, schema),
        }
        let ids: Vec<ActorId> = spawned.iter().map(|a| a.id).collect();
        for actor in spawned {
            actor.spawn();
        }
        let mut epoch = self
            .barriers
            .inject(Some(mutation), ids.clone(), vec![])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        // The inputs send their rows a part per barrier: barriers follow each other until the
        // last part is in, and the view is whole at that epoch. A view that fails meanwhile
        // shows why in its status, as one failing later does.
        while backfills.left() > 0 {
            let failed = {
                let failed = self
                    .barriers
                    .failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                ids.iter().any(|id| failed.contains_key(id))
                    || relations.iter().any(|id| failed.contains_key(id))
            };
            if failed {
                break;
            }
            epoch = self.barriers.inject(None, vec![], vec![]).await?;
            self.barriers.wait_sealed(epoch).await?;
        }
        Ok(())
    }

    /// The degree of parallelism for the session's next view: its own setting or the server's.
    fn parallelism_for(&self, settings: &HashMap<String, String>) -> Result<usize> {
        match settings.get("streaming_parallelism") {
            Some(v) => parse_parallelism(v),
            None => Ok(self.config.streaming_parallelism.max(1)),
        }
    }

    /// EXPLAIN CREATE MATERIALIZED VIEW: the actors and operators the view would run.
    pub async fn explain_view(
        &self,
        cv: &ast::CreateView,
        settings: &HashMap<String, String>,
    ) -> Result<Output> {
        let query = cv.query.to_string();
        let (plan, _) = self
            .plan_view(&query, settings, view_options(&cv.options)?, true)
            .await?;
        let fragments = cut(plan.clone(), self.parallelism_for(settings)?)?;
        let names: Vec<String> = {
            let catalog = self.catalog();
            plan.inputs
                .iter()
                .map(|id| {
                    catalog
                        .by_id(*id)
                        .map(|o| o.name().to_string())
                        .unwrap_or_default()
                })
                .collect()
        };
        let lines = Fragment::explain(&fragments, &names);
        text_rows(&["plan"], lines.into_iter().map(|l| vec![l]).collect())
    }

    pub async fn create_view(
        &self,
        cv: &ast::CreateView,
        settings: &HashMap<String, String>,
    ) -> Result<Output> {
        self.create_view_or_sink(cv, settings, false).await
    }

    /// `CREATE SINK`: a view whose changes go to a connector instead of being kept. The one
    /// connector is `blackhole`, which counts them (`weir_catalog.sinks`) and drops them.
    pub async fn create_sink(
        &self,
        cv: &ast::CreateView,
        settings: &HashMap<String, String>,
    ) -> Result<Output> {
        let mut cv = cv.clone();
        let mut connector = None;
        if let ast::CreateTableOptions::With(options) = &mut cv.options {
            options.retain(|o| match o {
                ast::SqlOption::KeyValue { key, value }
                    if key.value.eq_ignore_ascii_case("connector") =>
                {
                    connector = Some(ddl::option_text(value));
                    false
                }
                _ => true,
            });
            if options.is_empty() {
                cv.options = ast::CreateTableOptions::None;
            }
        }
        match connector.as_deref().map(str::to_lowercase).as_deref() {
            None | Some("blackhole") => {}
            Some(other) => {
                return Err(Error::not_supported(format!(
                    "sink connector \"{other}\" is not supported"
                ))
                .with_hint("Use connector = 'blackhole'."))
            }
        }
        self.create_view_or_sink(&cv, settings, true).await
    }

    async fn create_view_or_sink(
        &self,
        cv: &ast::CreateView,
        settings: &HashMap<String, String>,
        sink: bool,
    ) -> Result<Output> {
        let tag = if sink {
            "CREATE SINK"
        } else {
            "CREATE MATERIALIZED VIEW"
        };
        let _ddl = self.ddl.lock().await;
        if !cv.materialized {
            return Err(
                Error::not_supported("only materialized views are supported")
                    .with_hint("Use CREATE MATERIALIZED VIEW."),
            );
        }
        if cv.or_replace || cv.or_alter {
            return Err(Error::not_supported(
                "CREATE OR REPLACE MATERIALIZED VIEW is not supported",
            )
            .with_hint("Drop the view and create it again."));
        }
        let name = relation_name(&cv.name)?;
        if self.catalog().get(&name).is_some() && cv.if_not_exists {
            return Ok(Output::command(tag));
        }
        self.catalog().check_free(&name)?;
        let query = cv.query.to_string();
        let emit_on_window_close = view_options(&cv.options)?;
        let (mut plan, deps) = self
            .plan_view(&query, settings, emit_on_window_close, true)
            .await?;
        if !cv.columns.is_empty() {
            plan.schema = rename_columns(&plan.schema, &cv.columns)?;
        }
        check_unique_names(&plan.schema)?;
        // A view with nothing to partition by runs as one actor, whatever the setting.
        let requested = self.parallelism_for(settings)?;
        let fragments = cut(plan.clone(), requested)?;
        let parallelism = if fragments.len() > 1 { requested } else { 1 };
        let needed: usize = fragments
            .iter()
            .map(|f| f.root.state_tables_needed() * f.actors)
            .sum();
        let others = fragments.iter().map(|f| f.actors).sum::<usize>() - 1;
        let ids = self.catalog_mut().allocate_ids(1 + needed + others);
        let def = ViewDef {
            id: ids[0],
            name,
            query: if cv.columns.is_empty() {
                query
            } else {
                let cols: Vec<String> = cv.columns.iter().map(|c| c.name.to_string()).collect();
                format!("SELECT * FROM ({query}) AS v ({})", cols.join(", "))
            },
            depends_on: deps,
            state_tables: ids[1..1 + needed].to_vec(),
            emit_on_window_close,
            workers: ids[1 + needed..].to_vec(),
            parallelism,
            sink,
            int4_literals: true,
        };
        self.start_view(&def, plan, true).await?;
        self.add_started(Object::View(def)).await?;
        self.run_sources_read();
        Ok(Output::command(tag))
    }

    // ---- drop ----

    /// DROP TABLE / MATERIALIZED VIEW / SOURCE / SINK: `kind` is what each name must be.
    pub async fn drop_objects(
        &self,
        kind: Kind,
        names: &[String],
        if_exists: bool,
        cascade: bool,
    ) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let tag = match kind {
            Kind::Table => "DROP TABLE",
            Kind::MaterializedView => "DROP MATERIALIZED VIEW",
            Kind::Source => "DROP SOURCE",
            Kind::Sink => "DROP SINK",
        };
        let statement = |k: Kind| match k {
            Kind::Table => "TABLE",
            Kind::MaterializedView => "MATERIALIZED VIEW",
            Kind::Source => "SOURCE",
            Kind::Sink => "SINK",
        };
        let mut to_stop: Vec<ObjectId> = Vec::new();
        let mut dropped_tables: Vec<ObjectId> = Vec::new();
        {
            let catalog = self.catalog();
            for name in names {
                let Some(object) = catalog.get(name) else {
                    if if_exists {
                        continue;
                    }
                    return Err(match kind {
                        Kind::Table => crate::catalog::undefined_table(name),
                        other => Error::new(
                            ErrorKind::UndefinedTable,
                            format!("{} \"{name}\" does not exist", other.name()),
                        ),
                    });
                };
                let is_table = matches!(object, Object::Table(_));
                if object.kind() != kind {
                    return Err(Error::new(
                        ErrorKind::WrongObjectType,
                        format!("\"{name}\" is not a {}", kind.name()),
                    )
                    .with_hint(format!("Use DROP {}.", statement(object.kind()))));
                }
                let dependents = catalog.dependents(object.id());
                let outside: Vec<ObjectId> = dependents
                    .iter()
                    .copied()
                    .filter(|d| !to_stop.contains(d))
                    .collect();
                if !outside.is_empty() && !cascade {
                    let detail: Vec<String> = outside
                        .iter()
                        .filter_map(|d| catalog.by_id(*d))
                        .map(|d| {
                            format!(
                                "{} {} depends on {} {}",
                                d.kind_name(),
                                d.name(),
                                object.kind_name(),
                                name
                            )
                        })
                        .collect();
                    return Err(Error::new(
                        ErrorKind::DependentObjects,
                        format!(
                            "cannot drop {} {name} because other objects depend on it",
                            object.kind_name()
                        ),
                    )
                    .with_detail(detail.join("\n"))
                    .with_hint("Use DROP ... CASCADE to drop the dependent objects too."));
                }
                to_stop.push(object.id());
                to_stop.extend(outside);
                if is_table {
                    dropped_tables.push(object.id());
                }
            }
        }
        if to_stop.is_empty() {
            return Ok(Output::command(tag));
        }
        // A view's parallel workers stop with it.
        let mut actors: HashSet<ObjectId> = to_stop.iter().copied().collect();
        {
            let catalog = self.catalog();
            for id in &to_stop {
                if let Some(Object::View(v)) = catalog.by_id(*id) {
                    actors.extend(&v.workers);
                }
            }
        }
        // The catalog first: a DROP refused because the catalog cannot be saved changes
        // nothing. Once saved, the objects are gone (a restart finds none of them, and drops
        // their state); their actors stop at the next barrier.
        self.catalog_mut().remove(&to_stop)?;
        if let Err(e) = self.stop_actors(actors).await {
            // Only when the dataflow itself has stopped (the server is going down).
            tracing::warn!("cannot stop the actors of dropped objects: {e}");
        }
        self.forget(&to_stop, &dropped_tables);
        self.run_sources_read();
        Ok(Output::command(tag))
    }

    /// Stops actors at the next barrier; they drop their state.
    async fn stop_actors(&self, actors: HashSet<ActorId>) -> Result<()> {
        let mutation = Mutation {
            stop: actors,
            ..Default::default()
        };
        let epoch = self.barriers.inject(Some(mutation), vec![], vec![]).await?;
        self.barriers.wait_sealed(epoch).await
    }

    /// Forgets objects whose actors have stopped: their writers, change logs (of `tables`),
    /// source ledgers, sink counters and row errors.
    fn forget(&self, objects: &[ObjectId], tables: &[ObjectId]) {
        {
            let mut writers = self.tables.write().unwrap_or_else(|p| p.into_inner());
            for id in tables {
                writers.remove(id);
            }
        }
        for id in tables {
            if let Err(e) = crate::changelog::ChangeLog::remove(&self.tables_dir, *id) {
                tracing::warn!("cannot remove the change log of dropped table {id}: {e}");
            }
        }
        let mut errors = self.view_errors.lock().unwrap_or_else(|p| p.into_inner());
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        for id in objects {
            errors.remove(id);
            if sources.remove(id).is_some() {
                let ledgers = self.sources_dir();
                if let Err(e) = crate::source::file::FileLedger::remove(&ledgers, *id) {
                    tracing::warn!("cannot remove the ledger of dropped source {id}: {e}");
                }
            }
            sinks.remove(id);
        }
    }

    /// Adds an object whose actors already run to the catalog. When its entry cannot be
    /// saved, the statement is refused and what it started stops and leaves nothing behind
    /// (its actors drop their state; a table's log goes), as if it had never run.
    async fn add_started(&self, object: Object) -> Result<()> {
        let Err(e) = self.catalog_mut().add(object.clone()) else {
            return Ok(());
        };
        let mut actors: HashSet<ActorId> = HashSet::from([object.id()]);
        if let Object::View(v) = &object {
            actors.extend(&v.workers);
        }
        if let Err(stop) = self.stop_actors(actors).await {
            tracing::warn!("cannot stop the actors of \"{}\": {stop}", object.name());
        }
        let table = matches!(object, Object::Table(_)).then_some(object.id());
        self.forget(&[object.id()], table.as_slice());
        self.catalog_mut().forget_schema(object.id());
        Err(e)
    }

    // ---- SHOW ----

    // ---- DML ----

    fn writer(&self, table: &str) -> Result<(TableDef, Arc<tokio::sync::Mutex<TableWriter>>)> {
        let def = self.catalog().table(table)?.clone();
        let writer = self
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&def.id)
            .cloned()
            .ok_or_else(|| crate::catalog::undefined_table(table))?;
        Ok((def, writer))
    }

    /// Runs INSERT, UPDATE or DELETE against `table`.
    pub async fn dml(
        &self,
        table: &str,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &HashMap<String, String>,
    ) -> Result<Output> {
        let (def, writer) = self.writer(table)?;
        // Tables are read at their latest rows, as PostgreSQL reads every change committed
        // before the statement; views at the last sealed epoch. VALUES-only inserts read
        // nothing.
        let reads = !matches!(statement, ast::Statement::Insert(i)
            if i.source.as_ref().is_some_and(|q| matches!(q.body.as_ref(), ast::SetExpr::Values(_))));
        let mut latest: Vec<(ObjectId, Arc<dyn TableProvider>)> = Vec::new();
        if reads {
            // Other tables first, each locked alone: never while holding the target's lock,
            // so that two statements copying in opposite directions cannot deadlock.
            let references = self
                .context(settings, vec![])?
                .state()
                .resolve_table_references(&DFStatement::Statement(Box::new(statement.clone())))?;
            for reference in references {
                let Ok((other, other_writer)) = self.writer(reference.table()) else {
                    continue; // a view, or a name the planner reports
                };
                if other.id == def.id || latest.iter().any(|(id, _)| *id == other.id) {
                    continue;
                }
                let mut w = other_writer.lock().await;
                latest.push((other.id, latest_rows(&mut w)?));
            }
        }
        let mut w = writer.lock().await;
        let schema = w.schema().clone();
        if reads {
            latest.push((def.id, latest_rows(&mut w)?));
        } else {
            latest.push((
                def.id,
                Arc::new(datafusion::datasource::empty::EmptyTable::new(
                    schema.clone(),
                )),
            ));
        }
        // The statement's rows are gathered before they are written, and whatever read the
        // latest rows is gone by then.
        let (tag, deleted, inserted) = self
            .dml_rows(statement, params, settings, latest, &schema)
            .await?;
        let affected = w.write(deleted, inserted).await?;
        let tag = if tag == "INSERT" {
            "INSERT 0".to_string()
        } else {
            tag.to_string()
        };
        Ok(Output::Command {
            tag,
            rows: Some(affected),
        })
    }

    /// Plans and runs a DML statement's input over `latest` (the tables it reads, at their
    /// latest rows): its command tag, and the rows it deletes and inserts in `schema`.
    async fn dml_rows(
        &self,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &HashMap<String, String>,
        latest: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        schema: &SchemaRef,
    ) -> Result<DmlRows> {
        let ctx = self.context(settings, latest)?;
        let state = ctx.state();
        let plan = state
            .statement_to_plan(DFStatement::Statement(Box::new(statement.clone())))
            .await?;
        let mut plan = crate::sql::rules::type_integer_constants(plan)?;
        if let Some(p) = params {
            plan = plan.with_param_values(p.clone())?;
        }
        let LogicalPlan::Dml(dml) = plan else {
            return Err(Error::internal("DML statement did not plan as DML"));
        };
        let width = schema.fields().len();
        let (tag, deleted, inserted) = match &dml.op {
            WriteOp::Insert(InsertOp::Append) => {
                let rows = run(&ctx, dml.input.as_ref().clone()).await?;
                ("INSERT", None, Some(conform(schema, &rows, 0)?))
            }
            WriteOp::Insert(_) => {
                return Err(Error::not_supported(
                    "INSERT OVERWRITE and REPLACE are not supported",
                ))
            }
            WriteOp::Delete => {
                let rows = run(&ctx, dml.input.as_ref().clone()).await?;
                ("DELETE", Some(conform(schema, &rows, 0)?), None)
            }
            WriteOp::Update => {
                let LogicalPlan::Projection(p) = dml.input.as_ref() else {
                    return Err(Error::internal("UPDATE did not plan as a projection"));
                };
                let input_schema = p.input.schema().clone();
                if input_schema.fields().len() != width {
                    return Err(Error::not_supported("UPDATE ... FROM is not supported"));
                }
                // One pass computes each row's old and new values together.
                let mut exprs: Vec<Expr> = input_schema
                    .columns()
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| Expr::Column(c).alias(format!("__old_{i}")))
                    .collect();
                exprs.extend(p.expr.iter().cloned());
                let both = LogicalPlan::Projection(Projection::try_new(exprs, p.input.clone())?);
                let rows = run(&ctx, both).await?;
                (
                    "UPDATE",
                    Some(conform(schema, &rows, 0)?),
                    Some(conform(schema, &rows, width)?),
                )
            }
            other => return Err(Error::not_supported(format!("{other} is not supported"))),
        };
        Ok((tag, deleted, inserted))
    }

    // ---- queries ----

    /// Plans a query (for Describe, or before running it).
    pub async fn plan_query(
        &self,
        statement: &ast::Statement,
        settings: &HashMap<String, String>,
    ) -> Result<(SessionContext, LogicalPlan)> {
        let (ctx, plan) = self.plan_statement(statement, settings).await?;
        match &plan {
            LogicalPlan::Dml(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_) => Err(Error::not_supported(format!(
                "statement is not supported: {statement}"
            ))),
            _ => Ok((ctx, plan)),
        }
    }

    /// Plans any statement DataFusion can plan (DML included), without running it: for the
    /// parameter types of a prepared statement.
    pub async fn plan_statement(
        &self,
        statement: &ast::Statement,
        settings: &HashMap<String, String>,
    ) -> Result<(SessionContext, LogicalPlan)> {
        let ctx = self.context(settings, vec![])?;
        let plan = ctx
            .state()
            .statement_to_plan(DFStatement::Statement(Box::new(statement.clone())))
            .await?;
        let plan = crate::sql::rules::type_integer_constants(plan)?;
        Ok((ctx, plan))
    }

    pub async fn query(
        &self,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &HashMap<String, String>,
    ) -> Result<Output> {
        let (ctx, mut plan) = self.plan_query(statement, settings).await?;
        if let Some(p) = params {
            plan = plan.with_param_values(p.clone())?;
        }
        let schema = result_schema(&plan);
        let rows = ctx
            .execute_logical_plan(plan)
            .await?
            .execute_stream()
            .await?;
        // The rows go out as the plan's schema says (what a prepared statement's description
        // told the client), whatever types execution gave them.
        let same = rows.schema().fields().len() == schema.fields().len()
            && rows
                .schema()
                .fields()
                .iter()
                .zip(schema.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        let declared = schema.clone();
        Ok(Output::Stream {
            schema,
            rows: Box::pin(futures::StreamExt::map(rows, move |batch| {
                let batch = batch.map_err(Error::from)?;
                if same {
                    Ok(batch)
                } else {
                    conform(&declared, &batch, 0)
                }
            })),
        })
    }
}

/// Executes a DML statement's input to completion. Its rows become one change-log record,
/// which cannot exceed `RECORD_BYTES_MAX`; so the input is refused (54000) as soon as its
/// batches hold twice that in memory (which overstates what they encode to), instead of
/// being gathered whole first.
async fn run(ctx: &SessionContext, plan: LogicalPlan) -> Result<RecordBatch> {
    use futures::StreamExt;
    let mut rows = ctx
        .execute_logical_plan(plan)
        .await?
        .execute_stream()
        .await?;
    let schema = rows.schema();
    let limit = 2 * crate::changelog::RECORD_BYTES_MAX as usize;
    let (mut batches, mut bytes) = (Vec::new(), 0usize);
    while let Some(batch) = rows.next().await {
        let batch = batch?;
        bytes += batch.get_array_memory_size();
        if bytes > limit {
            return Err(Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!(
                    "a single statement's changes exceed {} bytes",
                    crate::changelog::RECORD_BYTES_MAX
                ),
            )
            .with_hint("Split the statement into smaller ones."));
        }
        batches.push(batch);
    }
    Ok(concat_batches(&schema, &batches)?)
}

/// Takes `schema.len()` columns of `rows` starting at `offset`, cast to the table's types.
fn conform(schema: &SchemaRef, rows: &RecordBatch, offset: usize) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let c = rows.column(offset + i);
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                let options = datafusion::arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                };
                Ok(datafusion::arrow::compute::cast_with_options(
                    c,
                    f.data_type(),
                    &options,
                )?)
            }
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.num_rows())),
    )?)
}

fn identity_exprs(schema: &SchemaRef) -> Vec<Arc<dyn datafusion::physical_plan::PhysicalExpr>> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            Arc::new(datafusion::physical_expr::expressions::Column::new(
                f.name(),
                i,
            )) as Arc<dyn datafusion::physical_plan::PhysicalExpr>
        })
        .collect()
}

/// The view's columns: the query's output types, named as PostgreSQL would name them.
fn view_schema(plan: &LogicalPlan, types: &SchemaRef) -> Result<SchemaRef> {
    let names: Vec<String> = pg_names(plan)
        .filter(|n| n.len() == types.fields().len())
        .unwrap_or_else(|| types.fields().iter().map(|f| f.name().clone()).collect());
    let fields: Vec<Field> = types
        .fields()
        .iter()
        .zip(names)
        .map(|(f, n)| Field::new(n, f.data_type().clone(), true))
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

/// A query's result columns as a client sees them: the plan's types under PostgreSQL's
/// column names (`count`, not DataFusion's `count(*)`).
pub fn result_schema(plan: &LogicalPlan) -> SchemaRef {
    let schema = plan.schema().as_arrow();
    let names = pg_names(plan).filter(|n| n.len() == schema.fields().len());
    match names {
        Some(names) => Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .zip(names)
                .map(|(f, n)| f.as_ref().clone().with_name(n))
                .collect::<Vec<_>>(),
        )),
        None => Arc::new(schema.clone()),
    }
}

fn pg_names(plan: &LogicalPlan) -> Option<Vec<String>> {
    match plan {
        LogicalPlan::Projection(p) => Some(
            p.expr
                .iter()
                .map(|e| {
                    // A column that names an aggregate's output, possibly under the alias
                    // DataFusion gives it (`count(Int64(1)) AS count(*)`): name it after the
                    // aggregate. An alias without parentheses is the user's own.
                    let column = match e {
                        Expr::Column(c) => Some(c),
                        Expr::Alias(a) if a.name.contains('(') => match a.expr.as_ref() {
                            Expr::Column(c) => Some(c),
                            _ => None,
                        },
                        _ => None,
                    };
                    match column.and_then(|c| produced_by(&p.input, &c.name)) {
                        Some(Expr::Alias(a)) => pg_column_name(&a.expr),
                        Some(produced) => pg_column_name(produced),
                        None => pg_column_name(e),
                    }
                })
                .collect(),
        ),
        LogicalPlan::Sort(s) => pg_names(&s.input),
        LogicalPlan::Limit(l) => pg_names(&l.input),
        _ => None,
    }
}

/// The expression of `plan` (looking through filters) whose output column is `name`.
fn produced_by<'a>(plan: &'a LogicalPlan, name: &str) -> Option<&'a Expr> {
    match plan {
        LogicalPlan::Aggregate(a) => a
            .group_expr
            .iter()
            .chain(&a.aggr_expr)
            .find(|e| e.schema_name().to_string() == name),
        LogicalPlan::Filter(f) => produced_by(&f.input, name),
        _ => None,
    }
}

/// PostgreSQL's name for an output column: the alias, the column name, the function name, or
/// `?column?`.
pub fn pg_column_name(e: &Expr) -> String {
    match e {
        Expr::Alias(a) => a.name.clone(),
        Expr::Column(c) => c.name.clone(),
        Expr::ScalarFunction(f) => f.func.name().to_string(),
        Expr::AggregateFunction(f) => f.func.name().to_string(),
        Expr::Cast(c) => match c.expr.as_ref() {
            inner @ (Expr::Column(_) | Expr::ScalarFunction(_) | Expr::AggregateFunction(_)) => {
                pg_column_name(inner)
            }
            _ => "?column?".to_string(),
        },
        Expr::Case(_) => "case".to_string(),
        _ => "?column?".to_string(),
    }
}

fn rename_columns(schema: &SchemaRef, columns: &[ast::ViewColumnDef]) -> Result<SchemaRef> {
    if columns.len() > schema.fields().len() {
        return Err(Error::plan(
            "CREATE MATERIALIZED VIEW specifies more column names than columns",
        ));
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match columns.get(i) {
            Some(c) => Field::new(ddl::ident_name(&c.name), f.data_type().clone(), true),
            None => f.as_ref().clone(),
        })
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

fn check_unique_names(schema: &SchemaRef) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for f in schema.fields() {
        if !seen.insert(f.name().as_str()) {
            return Err(Error::new(
                ErrorKind::DuplicateColumn,
                format!("column \"{}\" specified more than once", f.name()),
            )
            .with_hint("Give the view's columns distinct names with AS."));
        }
    }
    Ok(())
}

/// Rows of text under the given column names (the answers of SHOW statements).
/// The view's column names on the plan's top operator: a projection's output schema is
/// replaced, anything else gets an identity projection.
fn named(root: PlanNode, schema: &SchemaRef) -> PlanNode {
    match root {
        PlanNode::Project {
            input,
            exprs,
            input_schema,
            ..
        } => PlanNode::Project {
            input,
            exprs,
            input_schema,
            schema: schema.clone(),
        },
        other => PlanNode::Project {
            input: Box::new(other),
            exprs: identity_exprs(schema),
            input_schema: schema.clone(),
            schema: schema.clone(),
        },
    }
}

/// What CHECKPOINT answers: the checkpoint's id and epoch.
pub fn checkpoint_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("epoch", DataType::Int64, false),
    ]))
}

/// A view's plan cut into fragments, under the view's own column names.
fn cut(plan: StreamPlan, parallelism: usize) -> Result<Vec<Fragment>> {
    let root = named(plan.root, &plan.schema);
    StreamPlan { root, ..plan }.fragments(parallelism)
}

/// The sending end of an exchange to `actors` actors: split by `keys`, or all to the one.
fn partitioner(keys: Option<&Keys>, actors: usize) -> Option<Arc<Partitioner>> {
    keys.map(|k| Arc::new(Partitioner::new(k.exprs.clone(), k.types.clone(), actors)))
}

/// `streaming_parallelism`: a whole number of actors, 1 to the number of virtual nodes.
pub fn parse_parallelism(value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=crate::stream::dispatch::VNODE_COUNT).contains(&n) => Ok(n),
        _ => Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid value for parameter \"streaming_parallelism\": \"{value}\""),
        )
        .with_hint(format!(
            "Give a whole number from 1 to {}.",
            crate::stream::dispatch::VNODE_COUNT
        ))),
    }
}

/// A view's `WITH (...)` options: only `emit_on_window_close` (what `EMIT ON WINDOW CLOSE`
/// is read as).
fn view_options(options: &ast::CreateTableOptions) -> Result<bool> {
    let options = match options {
        ast::CreateTableOptions::None => return Ok(false),
        ast::CreateTableOptions::With(o) => o,
        other => {
            return Err(Error::not_supported(format!(
                "view options {other} are not supported"
            )))
        }
    };
    let mut emit_on_window_close = false;
    for option in options {
        match option {
            ast::SqlOption::KeyValue { key, value }
                if key.value.eq_ignore_ascii_case("emit_on_window_close") =>
            {
                emit_on_window_close = match value.to_string().to_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidParameter,
                            format!("emit_on_window_close must be true or false, not {other}"),
                        ))
                    }
                };
            }
            other => {
                return Err(Error::not_supported(format!(
                    "view option {other} is not supported"
                )))
            }
        }
    }
    Ok(emit_on_window_close)
}

/// A started table and the log records still to feed it.
struct Replay {
    id: ObjectId,
    feed: Feed,
    writer: TableWriter,
    history: Vec<crate::stream::chunk::StreamChunk>,
}
