//! The names PostgreSQL gives a query's result columns (`count`, not DataFusion's
//! `count(*)`; `?column?` for an expression), for query results and a view's columns.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::logical_expr::{Expr, LogicalPlan};

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

pub fn pg_names(plan: &LogicalPlan) -> Option<Vec<String>> {
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
