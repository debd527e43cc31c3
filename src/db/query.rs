//! Queries and DML: a session's query context over the database's relations, batch queries
//! streamed to the client, and INSERT, UPDATE and DELETE (planned and run by `sql::dml`)
//! through a table's writer.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ParamValues;
use datafusion::common::TableReference;
use datafusion::datasource::TableProvider;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::resolve::resolve_table_references;
use datafusion::sql::sqlparser::ast;

use crate::catalog::{Object, ObjectId, Scope, TableDef};
use crate::error::{Error, Result};
use crate::sql::dml::{self, conform};
use crate::sql::{query_context, result_schema, RelationRows, RelationTable, Settings};
use crate::table::{Block, PartSize, Rows, TableWriter};

use super::{Database, Output};

impl Database {
    /// A context reading every relation `scope` sees at the last sealed epoch, for planning
    /// a view (whose functions outlive the statement: they reserve from the shared pool).
    pub fn context(
        &self,
        settings: &Settings,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        scope: Scope,
    ) -> Result<SessionContext> {
        self.context_in(settings, overrides, scope, &self.query_runtime)
    }

    /// A context for one batch statement: as `context`, its working memory bounded by the
    /// session's `statement_mem` too, and its memory and CPU time counted as the session's.
    fn statement_context(
        &self,
        settings: &Settings,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        scope: Scope,
    ) -> Result<SessionContext> {
        let runtime = crate::sql::statement_runtime(&self.query_runtime, settings)?;
        let ctx = self.context_in(settings, overrides, scope, &runtime)?;
        crate::sql::own_statement(&ctx, settings);
        Ok(ctx)
    }

    fn context_in(
        &self,
        settings: &Settings,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        scope: Scope,
        runtime: &Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    ) -> Result<SessionContext> {
        let snapshot = self.store.snapshot();
        let ctx = query_context(
            &self.catalog(),
            scope,
            &snapshot,
            &self.barriers.failed,
            settings,
            overrides,
            runtime,
        )?;
        let role = self.acting_for(settings)?;
        let seen = super::system_tables::Seen {
            scope,
            role: role.as_ref(),
            backend: settings.backend.as_deref(),
        };
        crate::sql::register_system_tables(&ctx, self.system_tables(seen)?)?;
        Ok(ctx)
    }

    /// With the session's `read_after_write` on (the default), waits until every write
    /// acknowledged before the call, from any session, is in a sealed epoch, so that the
    /// context taken next reads it. Only a statement that reads what the sealed epoch holds
    /// waits: not one that reads no relation (`SELECT 1`, a driver's ping, the system
    /// tables, `generate_series`), nor DML that reads only tables (at their latest rows).
    async fn read_fence(
        &self,
        references: &[TableReference],
        dml: bool,
        settings: &Settings,
        scope: Scope,
    ) -> Result<()> {
        if settings.get("read_after_write").is_some_and(|v| v == "off")
            || !self.reads_sealed(references, dml, scope)
        {
            return Ok(());
        }
        self.barriers.read_fence().await
    }

    /// Whether a statement naming `references` reads a relation at the last sealed epoch:
    /// any of the catalog's for a query, a view for DML.
    fn reads_sealed(&self, references: &[TableReference], dml: bool, scope: Scope) -> bool {
        let catalog = self.catalog();
        references.iter().any(|r| {
            if r.schema().is_some_and(|s| s != "public") {
                return false; // the system tables
            }
            match catalog.get(r.table(), scope) {
                Some(Object::View(_)) => true,
                Some(_) => !dml,
                None => false,
            }
        })
    }

    pub(super) fn writer(
        &self,
        table: &str,
        scope: Scope,
    ) -> Result<(TableDef, Arc<tokio::sync::Mutex<TableWriter>>)> {
        let def = self.catalog().table(table, scope)?.clone();
        if let Some(c) = &def.connector {
            return Err(Error::not_supported(format!(
                "cannot change table \"{}\": its rows come from connector '{}'",
                def.name, c.name
            ))
            .with_hint("A table fed by a connector changes only as its upstream does."));
        }
        let writer = self
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&def.id)
            .cloned()
            .ok_or_else(|| crate::catalog::undefined_table(table))?;
        Ok((def, writer))
    }

    /// Runs INSERT, UPDATE or DELETE against `table`; in a transaction block, keeps its
    /// changes in the block (which the statement reads too) instead of writing them. Until its
    /// rows are computed (waiting for the tables' locks included), `stop` ends the statement
    /// with its error and nothing written; once they are, the write goes on to its end.
    pub async fn dml(
        &self,
        table: &str,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &Settings,
        block: Option<&mut Block>,
        stop: impl std::future::Future<Output = Error>,
    ) -> Result<Output> {
        let (mut w, (tag, deleted, inserted)) = tokio::select! {
            computed = self.dml_rows(table, statement, params, settings, block.as_deref()) => computed?,
            e = stop => return Err(e),
        };
        let affected = match block {
            Some(block) => w.stage(block, deleted, inserted, &self.temp).await?,
            None => w.write(deleted, inserted, &self.temp).await?,
        };
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

    /// A DML statement's rows, computed under the lock of its table's writer, which is
    /// returned with them.
    async fn dml_rows(
        &self,
        table: &str,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &Settings,
        block: Option<&Block>,
    ) -> Result<(tokio::sync::OwnedMutexGuard<TableWriter>, dml::DmlRows)> {
        let scope = block.map(|b| b.number);
        let (def, writer) = self.writer(table, scope)?;
        let role = self.acting_for(settings)?;
        let references = references(statement)?;
        self.check_dml(
            &role,
            &Object::Table(def.clone()),
            statement,
            &references,
            scope,
        )?;
        // Tables are read at their latest rows, as PostgreSQL reads every change committed
        // before the statement; views at the last sealed epoch. VALUES-only inserts read
        // nothing.
        let reads = dml::reads(statement);
        let mut latest: Vec<(ObjectId, Arc<dyn TableProvider>)> = Vec::new();
        if reads {
            // Views are read at the last sealed epoch: one that holds every earlier write.
            self.read_fence(&references, true, settings, scope).await?;
            // Other tables first, each locked alone: never while holding the target's lock,
            // so that two statements copying in opposite directions cannot deadlock.
            for reference in references {
                let Ok((other, other_writer)) = self.writer(reference.table(), scope) else {
                    continue; // a view, or a name the planner reports
                };
                if other.id == def.id || latest.iter().any(|(id, _)| *id == other.id) {
                    continue;
                }
                let mut w = other_writer.lock().await;
                latest.push((other.id, latest_rows(&mut w, block)?));
            }
        }
        let mut w = writer.lock_owned().await;
        let schema = w.schema().clone();
        if reads {
            latest.push((def.id, latest_rows(&mut w, block)?));
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
        let ctx = self.statement_context(settings, latest, scope)?;
        let into = (
            &schema,
            &self.temp,
            PartSize::within(settings.statement_mem()?),
        );
        let rows = dml::rows(&ctx, &self.executor, statement, params, into).await?;
        Ok((w, rows))
    }

    /// The table a `COPY ... FROM STDIN` fills, refused as INSERT refuses it (a view, a
    /// connector's table, a role without INSERT on it) before the client sends anything.
    pub fn copy_target(&self, table: &str, settings: &Settings, scope: Scope) -> Result<TableDef> {
        let (def, _) = self.writer(table, scope)?;
        let role = self.acting_for(settings)?;
        self.check_object(
            &role,
            &Object::Table(def.clone()),
            crate::catalog::Privilege::Insert,
        )?;
        Ok(def)
    }

    /// Writes the rows of a `COPY ... FROM STDIN` into `table` as one statement (into `block`
    /// when one is open); returns how many.
    pub async fn copy_rows(
        &self,
        table: &TableDef,
        rows: Rows,
        block: Option<&mut Block>,
    ) -> Result<usize> {
        let scope = block.as_ref().map(|b| b.number);
        let (def, writer) = self.writer(&table.name, scope)?;
        if def.id != table.id {
            return Err(Error::new(
                crate::error::ErrorKind::UndefinedTable,
                format!(
                    "table \"{}\" was dropped and created again while COPY read its rows",
                    table.name
                ),
            ));
        }
        let mut w = writer.lock().await;
        match block {
            Some(block) => w.stage(block, None, Some(rows), &self.temp).await,
            None => w.write(None, Some(rows), &self.temp).await,
        }
    }

    /// Begins a transaction block.
    pub fn begin(&self) -> Block {
        self.transactions.begin()
    }

    /// Commits a transaction block: through the writers of every table it wrote, taken in
    /// table-id order (so that two commits cannot deadlock; a statement holds one writer at a
    /// time). An error means nothing of it was applied, except 08007 (in doubt).
    pub async fn commit(&self, block: Block) -> Result<()> {
        if block.ddl {
            return self.commit_ddl(block).await;
        }
        self.commit_writes(block, None, || Ok(())).await
    }

    /// Commits a block's writes, with its catalog changes and what saves them when it ran
    /// DDL (`table::commit`).
    pub(super) async fn commit_writes(
        &self,
        block: Block,
        catalog: Option<crate::table::CatalogPart<'_>>,
        settle: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let ids: Vec<ObjectId> = block.tables().collect();
        if ids.is_empty() {
            return match catalog {
                Some(_) => settle(),
                None => Ok(()),
            };
        }
        let mut writers = Vec::with_capacity(ids.len());
        {
            let tables = self.tables.read().unwrap_or_else(|p| p.into_inner());
            for id in ids {
                let writer = tables.get(&id).cloned().ok_or_else(|| {
                    Error::new(
                        crate::error::ErrorKind::UndefinedTable,
                        "a table this transaction wrote was dropped before it committed",
                    )
                })?;
                writers.push(writer);
            }
        }
        let mut guards = Vec::with_capacity(writers.len());
        for w in &writers {
            guards.push(w.lock().await);
        }
        let mut held: Vec<&mut TableWriter> = guards.iter_mut().map(|g| &mut **g).collect();
        crate::table::commit(block, &mut held, catalog, settle, &self.temp).await
    }

    /// Plans a query (for Describe, or before running it) over a context with `overrides`
    /// for some relations.
    pub async fn plan_query(
        &self,
        statement: &ast::Statement,
        settings: &Settings,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        scope: Scope,
    ) -> Result<(SessionContext, LogicalPlan)> {
        let (ctx, plan) = self
            .plan_statement(statement, settings, overrides, scope)
            .await?;
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
        settings: &Settings,
        overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
        scope: Scope,
    ) -> Result<(SessionContext, LogicalPlan)> {
        let ctx = self.statement_context(settings, overrides, scope)?;
        let mut statement = statement.clone();
        let aggregates = ctx.state().aggregate_functions().clone();
        crate::sql::rewrite_catalog_spellings(&mut statement, &|name| {
            aggregates.contains_key(name)
        });
        let plan = ctx
            .state()
            .statement_to_plan(DFStatement::Statement(Box::new(statement)))
            .await?;
        let plan = crate::sql::type_integer_constants(plan)?;
        Ok((ctx, plan))
    }

    /// Runs a query. In a transaction block, the tables the block wrote are read at their
    /// latest rows with the block's changes; everything else as outside one.
    pub async fn query(
        &self,
        statement: &ast::Statement,
        params: Option<&ParamValues>,
        settings: &Settings,
        block: Option<&Block>,
    ) -> Result<Output> {
        let scope = block.map(|b| b.number);
        let references = references(statement)?;
        let role = self.acting_for(settings)?;
        self.check_references(&role, &references, crate::catalog::Privilege::Select, scope)?;
        self.read_fence(&references, false, settings, scope).await?;
        let mut overrides: Vec<(ObjectId, Arc<dyn TableProvider>)> = Vec::new();
        // Only when the block wrote a table: most blocks' reads (a driver's implicit BEGIN
        // before a SELECT) have nothing to lay over.
        if let Some(block) = block.filter(|b| b.tables().next().is_some()) {
            let written: Vec<ObjectId> = block.tables().collect();
            for reference in &references {
                let Ok((def, writer)) = self.writer(reference.table(), scope) else {
                    continue;
                };
                if !written.contains(&def.id) || overrides.iter().any(|(id, _)| *id == def.id) {
                    continue;
                }
                let mut w = writer.lock().await;
                overrides.push((def.id, latest_rows(&mut w, Some(block))?));
            }
        }
        let (ctx, mut plan) = self
            .plan_query(statement, settings, overrides, scope)
            .await?;
        if let Some(p) = params {
            plan = plan.with_param_values(p.clone())?;
        }
        let schema = result_schema(&plan);
        let rows = self.executor.execute(ctx, plan).await?;
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

/// A table's latest rows (in a transaction block, with its changes), for DataFusion to read.
pub(super) fn latest_rows(
    writer: &mut TableWriter,
    block: Option<&Block>,
) -> Result<Arc<dyn TableProvider>> {
    let latest = writer.latest(block)?;
    Ok(Arc::new(RelationTable {
        origin: None,
        schema: writer.schema().clone(),
        rows: RelationRows::Latest {
            table: writer.def.id,
            snapshot: latest.snapshot,
            order: latest.order,
            changes: latest.changes,
        },
    }))
}

pub(super) fn identity_exprs(
    schema: &SchemaRef,
) -> Vec<Arc<dyn datafusion::physical_plan::PhysicalExpr>> {
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

/// The relations `statement` names, resolved as DataFusion's planner resolves them.
fn references(statement: &ast::Statement) -> Result<Vec<TableReference>> {
    let statement = DFStatement::Statement(Box::new(statement.clone()));
    let (references, _) = resolve_table_references(&statement, true)?;
    Ok(references)
}
