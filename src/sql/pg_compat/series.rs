//! Table functions over other relations' columns: `generate_series` and `range`, which
//! DataFusion plans only over constants, and a series of PostgreSQL's `integer`s.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::ScalarValue;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{Expr, ExprSchemable};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::ExecutionPlan;

/// A table function (`generate_series`) that DataFusion plans only over constants, also over
/// another relation's columns (psql's publication footer reads `generate_series(0,
/// array_upper(pr.prattrs, 1))` of a correlated row): such a call is planned as a table that
/// refuses to be read. Where it reads an empty relation's columns the plan drops it unread.
#[derive(Debug)]
pub(super) struct OverColumns {
    pub(super) name: &'static str,
    pub(super) builtin: Arc<dyn TableFunctionImpl>,
}

impl TableFunctionImpl for OverColumns {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let over_columns = (args.exprs().iter()).any(|e| e.contains_outer() || e.any_column_refs());
        // `generate_series(1, 32)`: integers that fit 32 bits are PostgreSQL's `integer`s, and
        // so is the series of them (pgJDBC reads a key's position from one as `int4`).
        let integers = !args.exprs().is_empty()
            && (args.exprs().iter()).all(|e| {
                matches!(e, Expr::Literal(ScalarValue::Int64(Some(v)), _) if i32::try_from(*v).is_ok())
            });
        // DataFusion's series take constant `bigint` bounds: constant expressions are
        // computed, and smaller integers widened (Grafana's `generate_series(array_lower(a,
        // 1), array_upper(a, 1))` over the `search_path`).
        let simplifier = ExprSimplifier::new(SimplifyContext::default());
        let empty = datafusion::common::DFSchema::empty();
        let widened: Vec<Expr> = (args.exprs().iter())
            .map(|e| {
                let e = match over_columns {
                    true => e.clone(),
                    false => simplifier.simplify(e.clone())?,
                };
                Ok(match e {
                    Expr::Literal(v, _)
                        if matches!(
                            v.data_type(),
                            DataType::Int8 | DataType::Int16 | DataType::Int32
                        ) =>
                    {
                        let v = v.cast_to(&DataType::Int64).unwrap_or(v);
                        Expr::Literal(v, None)
                    }
                    e => match e.get_type(&empty) {
                        Ok(DataType::Int8 | DataType::Int16 | DataType::Int32) => {
                            datafusion::logical_expr::cast(e, DataType::Int64)
                        }
                        _ => e,
                    },
                })
            })
            .collect::<DfResult<_>>()?;
        let args = TableFunctionArgs::new(&widened, args.session());
        match self.builtin.call_with_args(args) {
            Ok(series) if integers && self.name == "generate_series" => as_integers(series),
            Err(_) if over_columns => Ok(Arc::new(Unreadable {
                name: self.name,
                schema: Arc::new(Schema::new(vec![Field::new(
                    "value",
                    DataType::Int64,
                    true,
                )])),
            })),
            other => other,
        }
    }
}

/// A series of `bigint`s as one of `integer`s (its values fit: its bounds do).
fn as_integers(series: Arc<dyn TableProvider>) -> DfResult<Arc<dyn TableProvider>> {
    use datafusion::logical_expr::{cast, col, LogicalPlanBuilder};
    let column = series.schema().field(0).name().clone();
    let source = datafusion::datasource::provider_as_source(series);
    let plan = LogicalPlanBuilder::scan("generate_series", source, None)?
        .project(vec![cast(col(&column), DataType::Int32).alias(&column)])?
        .build()?;
    Ok(Arc::new(datafusion::datasource::ViewTable::new(plan, None)))
}

#[derive(Debug)]
struct Unreadable {
    name: &'static str,
    schema: SchemaRef,
}

#[async_trait::async_trait]
impl TableProvider for Unreadable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _: &dyn Session,
        _: Option<&Vec<usize>>,
        _: &[Expr],
        _: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::NotImplemented(format!(
            "{}() over the columns of another relation of the query",
            self.name
        )))
    }
}
