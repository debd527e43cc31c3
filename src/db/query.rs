//! Queries and DML: a session's query context over the database's relations, batch queries
//! streamed to the client, and INSERT, UPDATE and DELETE through a table's writer.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::datasource::TableProvider;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, WriteOp};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;

use crate::catalog::{ObjectId, TableDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::context::query_context;
use crate::sql::provider::{RelationTable, Rows};
use crate::table::TableWriter;

use super::{Database, DmlRows, Output};

impl Database {
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

    pub(super) fn writer(
        &self,
        table: &str,
    ) -> Result<(TableDef, Arc<tokio::sync::Mutex<TableWriter>>)> {
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
    pub(super) async fn dml_rows(
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

/// A table's latest rows, for DataFusion to read.
pub(super) fn latest_rows(writer: &mut TableWriter) -> Result<Arc<dyn TableProvider>> {
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

/// Executes a DML statement's input to completion. Its rows become one change-log record,
/// which cannot exceed `RECORD_BYTES_MAX`; so the input is refused (54000) as soon as its
/// batches hold twice that in memory (which overstates what they encode to), instead of
/// being gathered whole first.
pub(super) async fn run(ctx: &SessionContext, plan: LogicalPlan) -> Result<RecordBatch> {
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
pub(super) fn conform(
    schema: &SchemaRef,
    rows: &RecordBatch,
    offset: usize,
) -> Result<RecordBatch> {
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

pub(super) fn pg_names(plan: &LogicalPlan) -> Option<Vec<String>> {
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
