//! Views and sinks: planning a view's query, compiling it into the fragments the catalog
//! keeps (`stream::stored`), starting its actors in the running dataflow with its backfill,
//! and starting a view of the catalog again from its kept plan.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;

use crate::catalog::{Object, ObjectId, Scope, ViewDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{
    self, check_deterministic, pg_names, relation_name, CreateSink, CreateView, PlanFunctions,
    Planner, Settings,
};
use crate::stream::graph;
use crate::stream::{
    Compiled, ErrorSink, Fragment, PlanNode, SinkDriver, SinkLog, SinkStart, SinkStatus, StreamPlan,
};
use crate::table::Block;

use super::query::identity_exprs;
use super::{text_rows, Database, Output};

/// How a view starts.
#[derive(Debug, Clone, Copy)]
pub(super) enum ViewStart {
    /// New (or rebuilt): its inputs send their contents first.
    New,
    /// Restored from a checkpoint, whose state holds its inputs up to the checkpoint (and a
    /// sink's log as it was there).
    Restored,
    /// Built again at a start, like a new one (created after the checkpoint restored, or its
    /// state lost: its actors had failed): a sink's target may hold its earlier output.
    Rebuilt,
}

impl Database {
    /// Starts a view of the catalog (at start) from the plan it keeps. A view of a catalog
    /// written before plans were kept is planned from its query once more, and keeps that
    /// plan from then on.
    pub(super) async fn start_view_from_catalog(
        &self,
        v: &ViewDef,
        start: ViewStart,
    ) -> Result<()> {
        let compiled = match &v.plan {
            Some(stored) => {
                Compiled::decode(stored, &v.name, &PlanFunctions::new(&self.query_runtime))?
            }
            None => {
                let query = stored_query(&v.query)?;
                let (plan, _) = self
                    .plan_view(
                        &query,
                        &Settings::default(),
                        (v.emit_on_window_close, v.int4_literals),
                        None,
                    )
                    .await?;
                // Cut as the plan that wrote the view's state was.
                let compiled = compile(plan, v.parallelism(), false)?;
                let (stored, compiled) = self.kept(compiled, &v.name)?;
                self.catalog_mut().set_view_plan(v.id, stored)?;
                compiled
            }
        };
        let backfill = self.start_view(v, compiled, start).await?;
        self.backfill(backfill).await
    }

    /// `compiled` as the catalog keeps it, and the plan read back from that: what the view
    /// runs from its creation on, so that a plan that cannot be kept is refused then, and
    /// every restart runs the same one.
    fn kept(&self, compiled: Compiled, view: &str) -> Result<(serde_json::Value, Compiled)> {
        let relations = {
            let catalog = self.catalog();
            compiled
                .inputs
                .iter()
                .map(|id| {
                    catalog
                        .schema(*id)
                        .ok_or_else(|| Error::internal("a view reads a relation of no schema"))
                })
                .collect::<Result<Vec<_>>>()?
        };
        let stored = compiled.encode(&relations)?;
        let read = Compiled::decode(&stored, view, &PlanFunctions::new(&self.query_runtime))?;
        Ok((stored, read))
    }

    /// Plans a view's query: its stream plan (whose schema carries the view's column names) and
    /// the relations it reads.
    pub(super) async fn plan_view(
        &self,
        query: &ast::Query,
        settings: &Settings,
        (emit_on_window_close, int4_literals): (bool, bool),
        scope: Scope,
    ) -> Result<(StreamPlan, Vec<ObjectId>)> {
        let ctx = self.context(settings, vec![], scope)?;
        let state = ctx.state();
        let mut stmt = ast::Statement::Query(Box::new(query.clone()));
        crate::sql::mark_view_now(&mut stmt);
        let mut plan = state
            .statement_to_plan(DFStatement::Statement(Box::new(stmt)))
            .await?;
        if int4_literals {
            plan = crate::sql::type_integer_constants(plan)?;
        }
        check_deterministic(&plan)?;
        let optimized = state.optimize(&plan)?;
        let catalog = self.catalog();
        let planner = Planner {
            state: &state,
            catalog: &catalog,
            scope,
            emit_on_window_close,
        };
        let (mut stream_plan, deps) = planner.plan(&optimized)?;
        stream_plan.schema = view_schema(&plan, &stream_plan.schema)?;
        Ok((stream_plan, deps))
    }

    /// Starts a view's actors, fragment by fragment (`StreamPlan::fragments`): its own actor,
    /// which keeps its rows, and the parallel actors that compute them, connected by channels
    /// and hash exchanges. The relations the view reads start feeding it at the barrier that
    /// adds it: with their current contents first for a new view ([`Self::backfill`] waits
    /// for them), or not, for a view whose state was restored.
    pub(super) async fn start_view(
        &self,
        def: &ViewDef,
        compiled: Compiled,
        start: ViewStart,
    ) -> Result<Backfill> {
        let Compiled {
            inputs: relations,
            schema,
            fragments,
        } = compiled;
        let errors = ErrorSink::new(&def.name);
        self.view_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, errors.clone());
        let sealed = self.actors.store.sealed_epoch();
        let (mut backfill, sink_start) = match start {
            ViewStart::New => (true, SinkStart::Created),
            ViewStart::Restored => (false, SinkStart::Restored(sealed)),
            ViewStart::Rebuilt => (true, SinkStart::Rebuilt(sealed)),
        };
        let mut sink = None;
        let mut delivery = None;
        let status = def.sink.then(|| Arc::new(SinkStatus::default()));
        if let Some(status) = &status {
            let opened = crate::connector::sink::open(def, &schema)?;
            let log = match &opened.spec {
                Some(spec) => {
                    backfill &= spec.snapshot;
                    let log = SinkLog::open(
                        self.actors.store.clone(),
                        def.id,
                        spec.log_bytes_max,
                        self.barriers.durable(),
                    )?;
                    Some(log)
                }
                None => None,
            };
            sink = Some(SinkDriver::new(status.clone(), log));
            delivery = opened.writer;
        }
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
        match status {
            Some(status) => {
                if let Some(writer) = delivery {
                    tokio::spawn(crate::stream::deliver_sink(
                        self.actors.store.clone(),
                        def.id,
                        writer,
                        status.clone(),
                        self.barriers.durable(),
                        sink_start,
                    ));
                }
                self.sinks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(def.id, status);
            }
            None => self.catalog_mut().set_schema(def.id, schema),
        }
        let ids = graph.ids();
        let (mutation, backfills) = (graph.mutation, graph.backfills);
        for actor in graph.actors {
            actor.spawn();
        }
        let epoch = self
            .barriers
            .inject(Some(mutation), ids.clone(), vec![])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        Ok(Backfill {
            ids,
            relations,
            parts: backfills,
        })
    }

    /// Waits until a started view is whole, and readers see it. The inputs send their rows a
    /// part per barrier: barriers follow each other until the last part is in, and the view is
    /// whole at that epoch. A view that fails meanwhile shows why in its status, as one failing later does.
    pub(super) async fn backfill(&self, backfill: Backfill) -> Result<()> {
        let Backfill {
            ids,
            relations,
            parts,
        } = backfill;
        while parts.left() > 0 {
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
            let epoch = self.barriers.inject(None, vec![], vec![]).await?;
            self.barriers.wait_sealed(epoch).await?;
        }
        // Whole, the view is not yet seen by readers while a large write holds them back.
        let sealed = self.barriers.sealed_snapshot().epoch;
        self.barriers.wait_visible(sealed).await
    }

    /// The degree of parallelism for the session's next view: its own setting or the server's.
    pub(super) fn parallelism_for(&self, settings: &Settings) -> Result<usize> {
        match settings.get("streaming_parallelism") {
            Some(v) => parse_parallelism(v),
            None => Ok(self.config.streaming_parallelism.max(1)),
        }
    }

    /// EXPLAIN CREATE MATERIALIZED VIEW: the actors and operators the view would run.
    pub async fn explain_view(
        &self,
        cv: &ast::CreateView,
        settings: &Settings,
        scope: Scope,
    ) -> Result<Output> {
        let (plan, _) = self
            .plan_view(
                &cv.query,
                settings,
                (view_options(&cv.options)?, true),
                scope,
            )
            .await?;
        let fragments = cut(plan.clone(), self.parallelism_for(settings)?, true)?;
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
        cv: &CreateView,
        settings: &Settings,
        block: Option<&mut Block>,
        stop: impl std::future::Future<Output = Error> + Send,
    ) -> Result<Output> {
        let view = &cv.view;
        if !view.materialized {
            return Err(
                Error::not_supported("only materialized views are supported")
                    .with_hint("Use CREATE MATERIALIZED VIEW."),
            );
        }
        if view.or_replace || view.or_alter {
            return Err(Error::not_supported(
                "CREATE OR REPLACE MATERIALIZED VIEW is not supported",
            )
            .with_hint("Drop the view and create it again."));
        }
        let new = NewView {
            name: &view.name,
            if_not_exists: view.if_not_exists,
            columns: &view.columns,
            query: &view.query,
            emit_on_window_close: cv.emit_on_window_close || view_options(&view.options)?,
            sink: None,
        };
        self.create_view_or_sink(new, settings, block, stop).await
    }

    /// `CREATE SINK`: a view whose changes go to a connector instead of being kept. The one
    /// connector is `blackhole`, which counts them (`weir_catalog.sinks`) and drops them.
    pub async fn create_sink(
        &self,
        sink: &CreateSink,
        (settings, actor): (&Settings, &str),
        block: Option<&mut Block>,
        stop: impl std::future::Future<Output = Error> + Send,
    ) -> Result<Output> {
        let mut connector = None;
        let mut pairs = Vec::new();
        let mut emit_on_window_close = sink.emit_on_window_close;
        let role = self.acting(actor)?;
        let mut options = sink.options.clone();
        let secrets = self.open_secrets(&role, &mut options, |k| k.value.to_lowercase())?;
        for o in &options {
            let ast::SqlOption::KeyValue { key, value } = o else {
                return Err(Error::not_supported(format!("option {o} is not supported")));
            };
            let text = sql::option_text(value);
            match key.value.to_lowercase().as_str() {
                "connector" => connector = Some(text),
                // `WITH (emit_on_window_close = true)`, as views take it.
                "emit_on_window_close" => {
                    let options = ast::CreateTableOptions::With(vec![o.clone()]);
                    emit_on_window_close |= view_options(&options)?;
                }
                other => pairs.push((other.to_string(), text)),
            }
        }
        if let Some(f) = &sink.format {
            pairs.push(("format".into(), f.format.clone()));
            pairs.push(("encode".into(), f.encode.clone()));
        }
        let new = NewView {
            name: &sink.name,
            if_not_exists: sink.if_not_exists,
            columns: &[],
            query: &sink.query,
            emit_on_window_close,
            sink: Some(NewSink {
                connector,
                pairs,
                secrets,
                superuser: role.superuser,
            }),
        };
        self.create_view_or_sink(new, settings, block, stop).await
    }

    /// The connector of new sink `name` over `plan`: the server's files its options name are
    /// checked before the connector opens any, and again as it keeps them; its secrets are
    /// marked.
    fn sink_connector(
        &self,
        name: &str,
        new: &NewSink,
        plan: &StreamPlan,
    ) -> Result<crate::catalog::Connector> {
        if let Some(connector) = &new.connector {
            let pairs = new.pairs.iter().cloned().collect();
            let declared = crate::catalog::Connector::plain(connector.clone(), pairs);
            self.check_server_files(&declared, true, new.superuser)?;
        }
        let shape = crate::connector::sink::Shape {
            schema: &plan.schema,
            key: plan.key.as_deref(),
            append_only: plan.append_only,
        };
        let mut c = crate::connector::sink::create(
            name,
            new.connector.as_deref(),
            new.pairs.clone(),
            &shape,
        )?;
        super::secrets::mark_secrets(&mut c, new.secrets.clone())?;
        self.check_server_files(&c, true, new.superuser)?;
        Ok(c)
    }

    async fn create_view_or_sink(
        &self,
        cv: NewView<'_>,
        settings: &Settings,
        block: Option<&mut Block>,
        stop: impl std::future::Future<Output = Error> + Send,
    ) -> Result<Output> {
        let tag = if cv.sink.is_some() {
            "CREATE SINK"
        } else {
            "CREATE MATERIALIZED VIEW"
        };
        let _ddl = self.ddl.lock().await;
        let scope = block.as_ref().map(|b| b.number);
        let name = relation_name(cv.name)?;
        let role = self.acting_for(settings)?;
        if let Some(role) = &role {
            self.check_create(role)?;
        }
        if self.catalog().get(&name, scope).is_some() && cv.if_not_exists {
            return Ok(Output::command(tag));
        }
        self.catalog().check_free(&name, scope)?;
        let query = cv.query.to_string();
        let emit_on_window_close = cv.emit_on_window_close;
        let (mut plan, deps) = self
            .plan_view(cv.query, settings, (emit_on_window_close, true), scope)
            .await?;
        self.check_sources_read_again(&deps)?;
        self.check_inputs(&role, &deps)?;
        if !cv.columns.is_empty() {
            plan.schema = rename_columns(&plan.schema, cv.columns)?;
        }
        check_unique_names(&plan.schema)?;
        let sink_to = (cv.sink.as_ref())
            .map(|new| self.sink_connector(&name, new, &plan))
            .transpose()?;
        let key = plan.key.clone();
        // A view with nothing to partition by runs one actor per fragment, whatever the setting.
        let requested = self.parallelism_for(settings)?;
        let (stored, compiled) = self.kept(compile(plan, requested, true)?, &name)?;
        let fragments = &compiled.fragments;
        let parallelism = fragments.iter().map(|f| f.actors).max().unwrap_or(1);
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
            sink: cv.sink.is_some(),
            sink_to,
            key,
            int4_literals: true,
            plan: Some(stored),
        };
        let backfill = self.start_view(&def, compiled, ViewStart::New).await?;
        (self.filling.lock().unwrap_or_else(|p| p.into_inner())).insert(
            def.id,
            Filling {
                name: def.name.clone(),
                sink: def.sink,
                started_us: self.config.clock.now_us(),
                parts: backfill.parts.clone(),
            },
        );
        let filling = Filled {
            db: self,
            id: def.id,
        };
        let view = Object::View(def);
        // A statement stopped (cancelled, timed out, its session terminated) while the view
        // fills stops its actors and leaves nothing behind, as one that failed does.
        let filled = tokio::select! {
            filled = self.backfill(backfill) => filled,
            e = stop => Err(e),
        };
        if let Err(e) = filled {
            self.abandon(&view).await;
            return Err(e);
        }
        drop(filling);
        let owner = role.map_or(crate::catalog::BOOTSTRAP_OID, |r| r.oid);
        self.add_started(view, block, owner).await?;
        self.run_sources_read();
        Ok(Output::command(tag))
    }
}

impl Database {
    /// Refuses a view whose backfill a source it reads cannot give: one that has produced
    /// rows its connector cannot read again as they went by.
    fn check_sources_read_again(&self, inputs: &[ObjectId]) -> Result<()> {
        let catalog = self.catalog();
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        for id in inputs {
            if let (Some(Object::Source(def)), Some(handle)) = (catalog.by_id(*id), sources.get(id))
            {
                crate::connector::source::check_read_again(def, handle.rows())?;
            }
        }
        Ok(())
    }
}

/// A started view's wait for its inputs' rows: its actors, the relations it reads, and the
/// parts they have yet to send.
pub(super) struct Backfill {
    ids: Vec<crate::stream::ActorId>,
    relations: Vec<ObjectId>,
    parts: Arc<crate::stream::Backfills>,
}

/// A view or sink being created while its inputs' rows come in, as `weir_catalog.backfills`
/// shows it.
pub(super) struct Filling {
    pub(super) name: String,
    pub(super) sink: bool,
    /// When its backfill began, in microseconds since the epoch.
    pub(super) started_us: i64,
    pub(super) parts: Arc<crate::stream::Backfills>,
}

/// A view's place in `Database::filling`, which it leaves when this is dropped: when it is
/// whole, or stopped, or failed.
struct Filled<'a> {
    db: &'a Database,
    id: ObjectId,
}

impl Drop for Filled<'_> {
    fn drop(&mut self) {
        (self.db.filling.lock().unwrap_or_else(|p| p.into_inner())).remove(&self.id);
    }
}

/// A view or sink to create, as its statement gives it.
struct NewView<'a> {
    name: &'a ast::ObjectName,
    if_not_exists: bool,
    columns: &'a [ast::ViewColumnDef],
    query: &'a ast::Query,
    emit_on_window_close: bool,
    sink: Option<NewSink>,
}

/// A sink's connector name and options (the FORMAT clause's as `format` and `encode`), which
/// of them are secrets' values, and whether the role creating it is a superuser
/// (`connector::FileAccess`).
struct NewSink {
    connector: Option<String>,
    pairs: Vec<(String, String)>,
    secrets: super::secrets::SecretOptions,
    superuser: bool,
}

/// The query a catalog of format 2 or before keeps as a view's definition.
fn stored_query(text: &str) -> Result<ast::Query> {
    let parsed = crate::sql::parse(text)?;
    match parsed.as_slice() {
        [p] => match &p.statement {
            crate::sql::Statement::Sql(stmt) => match stmt.as_ref() {
                ast::Statement::Query(q) => Ok(q.as_ref().clone()),
                _ => Err(Error::syntax("a view is defined by a SELECT query")),
            },
            _ => Err(Error::syntax("a view is defined by a SELECT query")),
        },
        _ => Err(Error::syntax("a view is defined by exactly one query")),
    }
}

/// The view's columns: the query's output types, named as PostgreSQL would name them.
fn view_schema(plan: &LogicalPlan, types: &SchemaRef) -> Result<SchemaRef> {
    let names: Vec<String> = pg_names(plan)
        .filter(|n| n.len() == types.fields().len())
        .unwrap_or_else(|| types.fields().iter().map(|f| f.name().clone()).collect());
    // A column passed on unchanged keeps its declared type (`varchar(40)`), as in PostgreSQL.
    let declared = sql::result_schema(plan);
    let fields: Vec<Field> = (types.fields().iter().enumerate())
        .zip(names)
        .map(|((i, f), n)| {
            let field = Field::new(n, f.data_type().clone(), true);
            match declared.fields().get(i) {
                Some(d) if d.data_type() == f.data_type() => {
                    field.with_metadata(sql::declared_type_of(d))
                }
                _ => field,
            }
        })
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
            Some(c) => Field::new(sql::ident_name(&c.name), f.data_type().clone(), true),
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

/// A view's plan cut into fragments, under the view's own column names; `shared`: with its
/// reads shared and window aggregates sliced, as every view is cut since plan format 2.
fn cut(plan: StreamPlan, parallelism: usize, shared: bool) -> Result<Vec<Fragment>> {
    let plan = StreamPlan {
        root: named(plan.root, &plan.schema),
        ..plan
    };
    match shared {
        true => plan.fragments(parallelism),
        false => plan.fragments_unshared(parallelism),
    }
}

/// A view's plan cut into its fragments, ready to start and to keep.
fn compile(plan: StreamPlan, parallelism: usize, shared: bool) -> Result<Compiled> {
    Ok(Compiled {
        inputs: plan.inputs.clone(),
        schema: plan.schema.clone(),
        fragments: cut(plan, parallelism, shared)?,
    })
}

/// `streaming_parallelism`: a whole number of actors, 1 to the number of virtual nodes.
pub fn parse_parallelism(value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=crate::stream::VNODE_COUNT).contains(&n) => Ok(n),
        _ => Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid value for parameter \"streaming_parallelism\": \"{value}\""),
        )
        .with_hint(format!(
            "Give a whole number from 1 to {}.",
            crate::stream::VNODE_COUNT
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
