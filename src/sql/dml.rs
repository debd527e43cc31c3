//! DML planning: an INSERT, UPDATE or DELETE planned over a context whose tables are read at
//! their latest rows, and run into the rows it deletes and the rows it inserts, in the
//! table's types (spooled to disk when they are many: `changelog::Gather`). The database
//! locks the tables, builds the context and writes the rows.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ParamValues;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, WriteOp};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;

use crate::changelog::{Gather, PartSize, Rows, TempDisk};
use crate::error::{Error, Result};

/// A DML statement's command tag, and the rows it deletes and inserts.
pub type DmlRows = (&'static str, Option<Rows>, Option<Rows>);

/// Whether `statement` reads relations: every DML statement but an INSERT of VALUES only.
pub fn reads(statement: &ast::Statement) -> bool {
    !matches!(statement, ast::Statement::Insert(i)
        if i.source.as_ref().is_some_and(|q| matches!(q.body.as_ref(), ast::SetExpr::Values(_))))
}

/// Plans and runs a DML statement's input over `ctx` (whose tables the statement reads
/// at their latest rows): its command tag, and the rows it deletes and inserts in `schema`,
/// spooled into a temporary file of `temp` once they pass `size`.
pub async fn rows(
    ctx: &SessionContext,
    executor: &super::Executor,
    statement: &ast::Statement,
    params: Option<&ParamValues>,
    (schema, temp, size): (&SchemaRef, &Arc<TempDisk>, PartSize),
) -> Result<DmlRows> {
    let state = ctx.state();
    // The statement's query is read as a batch query is (`FROM generate_series(...) s` names
    // its column `s`, catalog spellings, subqueries), as its prepared form was described.
    let mut statement = statement.clone();
    let aggregates = state.aggregate_functions().clone();
    super::pg_compat::rewrite(&mut statement, &|name| aggregates.contains_key(name));
    let plan = state
        .statement_to_plan(DFStatement::Statement(Box::new(statement)))
        .await?;
    let mut plan = crate::sql::rules::type_integer_constants(plan)?;
    if let Some(p) = params {
        plan = plan.with_param_values(p.clone())?;
    }
    let LogicalPlan::Dml(dml) = plan else {
        return Err(Error::internal("DML statement did not plan as DML"));
    };
    let width = schema.fields().len();
    let gather = || Gather::new(schema.clone(), temp, size);
    let (tag, deleted, inserted) = match &dml.op {
        WriteOp::Insert(InsertOp::Append) => {
            let mut rows = [(gather(), 0)];
            run(ctx, executor, dml.input.as_ref().clone(), schema, &mut rows).await?;
            let [(inserted, _)] = rows;
            ("INSERT", None, Some(inserted.finish()?))
        }
        WriteOp::Insert(_) => {
            return Err(Error::not_supported(
                "INSERT OVERWRITE and REPLACE are not supported",
            ))
        }
        WriteOp::Delete => {
            let mut rows = [(gather(), 0)];
            run(ctx, executor, dml.input.as_ref().clone(), schema, &mut rows).await?;
            let [(deleted, _)] = rows;
            ("DELETE", Some(deleted.finish()?), None)
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
            let mut rows = [(gather(), 0), (gather(), width)];
            run(ctx, executor, both, schema, &mut rows).await?;
            let [(deleted, _), (inserted, _)] = rows;
            ("UPDATE", Some(deleted.finish()?), Some(inserted.finish()?))
        }
        other => return Err(Error::not_supported(format!("{other} is not supported"))),
    };
    Ok((tag, deleted, inserted))
}

/// Executes a DML statement's input to completion, each batch's columns from each offset of
/// `into` conformed to the table's types and gathered there (in memory while they are few,
/// in the spool after).
async fn run(
    ctx: &SessionContext,
    executor: &super::Executor,
    plan: LogicalPlan,
    schema: &SchemaRef,
    into: &mut [(Gather, usize)],
) -> Result<()> {
    use futures::StreamExt;
    let mut rows = executor.execute(ctx.clone(), plan).await?;
    while let Some(batch) = rows.next().await {
        let batch = batch?;
        for (gather, offset) in into.iter_mut() {
            gather.push(conform(schema, &batch, *offset)?)?;
        }
    }
    Ok(())
}

/// Takes `schema.len()` columns of `rows` starting at `offset`, cast to the table's types.
pub fn conform(schema: &SchemaRef, rows: &RecordBatch, offset: usize) -> Result<RecordBatch> {
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
