//! DDL: creating tables, sources, views and sinks (planning a view and starting its actors
//! in the running dataflow, with its backfill) and dropping them; the starting of each kind
//! of object, which recovery also uses.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;
use tokio::sync::mpsc;

use crate::catalog::{Kind, Object, ObjectId, SourceDef, TableDef, ViewDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::ddl::{self, relation_name};
use crate::sql::stream_plan::{check_deterministic, Planner};
use crate::stream::actor::SourceRows;
use crate::stream::expr::ErrorSink;
use crate::stream::graph;
use crate::stream::message::{ActorId, Feed, FeedPosition, Mutation};
use crate::stream::plan::{build_actor, Fragment, PlanNode, StreamPlan};
use crate::stream::sink::{SinkCounter, SinkDriver};
use crate::table::TableWriter;

use super::query::{identity_exprs, pg_names};
use super::{text_rows, Database, Output, SOURCES_DIR};

/// How a view starts.
#[derive(Debug, Clone, Copy)]
pub(super) enum ViewStart<'a> {
    /// New (or rebuilt): its inputs send their contents first.
    New,
    /// Restored from a checkpoint, whose state holds its inputs up to the checkpoint; a sink
    /// recovers from the handle its writer pre-committed there.
    Restored { sink: Option<&'a serde_json::Value> },
}

impl Database {
    /// Starts a view of the catalog (at start), planning its query again.
    pub(super) async fn start_view_from_catalog(
        &self,
        v: &ViewDef,
        start: ViewStart<'_>,
    ) -> Result<()> {
        let (plan, _) = self
            .plan_view(
                &v.query,
                &HashMap::new(),
                v.emit_on_window_close,
                v.int4_literals,
            )
            .await?;
        self.start_view(v, plan, start).await
    }

    /// Starts a table's actor and returns its writer with what to feed it: its whole change
    /// log, or with `restored` (a table restored from a checkpoint: its offset and watermark)
    /// the records from that offset on, the restored state holding those before.
    pub(super) async fn start_table(
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
    pub(super) async fn replay(&self, replay: Replay) -> Result<()> {
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

    /// Where sources keep what they read (a file source's ledger).
    pub(super) fn sources_dir(&self) -> PathBuf {
        self.config.data_dir.join(SOURCES_DIR)
    }

    /// Starts a source's actor and its task from `start` (paused until something reads it).
    pub(super) async fn start_source(&self, def: SourceDef, start: FeedPosition) -> Result<()> {
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let feed = Feed::starting_at(feed_tx, start.clone());
        let handle = crate::source::spawn(def.clone(), feed.clone(), &start, &self.sources_dir());
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
            seen: start.offset,
            history: Arc::new(crate::source::History::new(def.clone(), self.sources_dir())),
        });
        actor.spawn();
        let epoch = self
            .barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        // A restored source's watermark first, as a restored table's: the views restored with
        // it lost theirs with the process, and rows late for it must stay late.
        if let (Some(w), Some(value)) = (def.watermark, start.watermark) {
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
    pub(super) fn run_sources_read(&self) {
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
        self.start_source(def.clone(), FeedPosition::default())
            .await?;
        self.add_started(Object::Source(def)).await?;
        Ok(Output::command("CREATE SOURCE"))
    }

    /// Plans a view's query: its stream plan (whose schema carries the view's column names) and
    /// the relations it reads.
    pub(super) async fn plan_view(
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
    /// inputs' contents first for a new view, or not, for a view whose state was restored.
    pub(super) async fn start_view(
        &self,
        def: &ViewDef,
        plan: StreamPlan,
        start: ViewStart<'_>,
    ) -> Result<()> {
        let schema = plan.schema.clone();
        let relations = plan.inputs.clone();
        let fragments = cut(plan, def.parallelism())?;
        let errors = ErrorSink::new(&def.name);
        self.view_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, errors.clone());
        let (backfill, handle) = match start {
            ViewStart::New => (true, None),
            ViewStart::Restored { sink } => (false, sink),
        };
        let counter = def.sink.then(|| Arc::new(SinkCounter::default()));
        let sink = match &counter {
            Some(counter) => Some(SinkDriver::new(
                crate::sink::open(def, handle)?,
                counter.clone(),
                self.barriers.durable(),
            )),
            None => None,
        };
        let view = graph::Identity {
            name: &def.name,
            id: def.id,
            workers: &def.workers,
            state_tables: &def.state_tables,
            sink,
        };
        let wiring = graph::Wiring {
            relations: &relations,
            schema: schema.clone(),
            backfill,
            channel_messages_max: self.config.channel_messages_max,
            errors,
        };
        let graph = graph::wire(&self.actors, view, fragments, wiring)?;
        match counter {
            Some(counter) => {
                self.sinks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(def.id, counter);
            }
            None => self.catalog_mut().set_schema(def.id, schema),
        }
        let ids = graph.ids();
        let (mutation, backfills) = (graph.mutation, graph.backfills);
        for actor in graph.actors {
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
    pub(super) fn parallelism_for(&self, settings: &HashMap<String, String>) -> Result<usize> {
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
        if let Some(name) = connector {
            crate::sink::connector(&name)?;
        }
        self.create_view_or_sink(&cv, settings, true).await
    }

    pub(super) async fn create_view_or_sink(
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
        self.start_view(&def, plan, ViewStart::New).await?;
        self.add_started(Object::View(def)).await?;
        self.run_sources_read();
        Ok(Output::command(tag))
    }

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
    pub(super) async fn stop_actors(&self, actors: HashSet<ActorId>) -> Result<()> {
        let mutation = Mutation {
            stop: actors,
            ..Default::default()
        };
        let epoch = self.barriers.inject(Some(mutation), vec![], vec![]).await?;
        self.barriers.wait_sealed(epoch).await
    }

    /// Forgets objects whose actors have stopped: their writers, change logs (of `tables`),
    /// source ledgers, sink counters and row errors.
    pub(super) fn forget(&self, objects: &[ObjectId], tables: &[ObjectId]) {
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
            if let Some(source) = sources.remove(id) {
                if let Err(e) = source.forget(&self.sources_dir()) {
                    tracing::warn!("cannot remove what dropped source {id} kept: {e}");
                }
            }
            sinks.remove(id);
        }
    }

    /// Adds an object whose actors already run to the catalog. When its entry cannot be
    /// saved, the statement is refused and what it started stops and leaves nothing behind
    /// (its actors drop their state; a table's log goes), as if it had never run.
    pub(super) async fn add_started(&self, object: Object) -> Result<()> {
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

/// A view's plan cut into fragments, under the view's own column names.
fn cut(plan: StreamPlan, parallelism: usize) -> Result<Vec<Fragment>> {
    let root = named(plan.root, &plan.schema);
    StreamPlan { root, ..plan }.fragments(parallelism)
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
pub(super) struct Replay {
    id: ObjectId,
    feed: Feed,
    writer: TableWriter,
    pub(super) history: Vec<crate::stream::chunk::StreamChunk>,
}
